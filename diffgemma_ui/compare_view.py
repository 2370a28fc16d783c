"""The Compare tab's views: two runs of one prompt and seed under two settings, as HTML, from their last frames.

Pure functions; each side's card reuses the speed meter (`meter.meter_html`), and the heatmaps are the playground's
(`plots.confidence_heatmap`). Every number is the engine's clock and counts, as in the meter.
"""

from __future__ import annotations

from engine import DiffusionSettings, Frame

from .meter import meter_html
from .text import escape_html

IDLE_NOTE = "engine clock \u00b7 press Compare A and B to start"
NOT_RUN = "not run"  # a side's state when Stop came before its turn
NOT_RUN_NOTE = "not run: Stop came before this side's turn \u00b7 press Compare A and B to run both"
SIDES = ("A", "B")


def settings_label(settings: DiffusionSettings, *, bound_and_t: bool = True) -> str:
    """A one-line summary of the settings that differ between presets (plain text); `bound_and_t` False leaves out
    the entropy bound and temperatures (for a sampler that does not read them)."""
    bound = f"entropy bound {settings.entropy_bound:g} \u00b7 " if bound_and_t else ""
    schedule = f"t {settings.t_max:g}\u2192{settings.t_min:g} \u00b7 " if bound_and_t else ""
    return (f"{bound}max {settings.max_denoising_steps} steps \u00b7 {schedule}adaptive stopping "
            f"{'on' if settings.adaptive_stopping else 'off'}")


def side_html(side: str, settings: DiffusionSettings | None, last: Frame | None, state: str,
              sampler: str = "", bound_and_t: bool = True) -> str:
    """One side's card: its name, settings (and `sampler`, when not the engine's; `bound_and_t` False: it does not
    read the entropy bound and temperatures, which are then not listed), state ("waiting", "running", "done",
    "stopped", or `NOT_RUN`) and meter (from its newest frame)."""
    label = settings_label(settings, bound_and_t=bound_and_t) if settings is not None else ""
    label = f"{sampler} \u00b7 {label}" if sampler else label
    return (f'<div class="dg-compare-side" data-side="{escape_html(side)}" data-state="{escape_html(state)}">'
            f'<h3>{escape_html(side)} \u00b7 {escape_html(state)}</h3><p class="dg-meter-note">{escape_html(label)}</p>'
            f"{meter_html(last, note=NOT_RUN_NOTE if state == NOT_RUN else IDLE_NOTE)}</div>")


def _ratio(a: float, b: float) -> str:
    return f"{b / a:.2f}\u00d7" if a > 0 else "\u2013"


def verdict_html(a: Frame | None, b: Frame | None, *, notice: str | None = None) -> str:
    """The comparison of two finished runs: forwards, tokens per forward, tokens/s and whether the texts agree
    (B against A). Empty until both are done. `notice`: a line above it (and `data-state="refused"`), saying why
    the cards below are not the latest request's (`meter.REFUSED_NOTICE`)."""
    banner = f'<div class="dg-meter-notice" role="status">{escape_html(notice)}</div>' if notice else ""
    if a is None or b is None or not (a.done and b.done):
        state = "refused" if notice else "pending"
        return f'<div class="dg-compare-verdict" data-state="{state}">{banner}</div>'
    forwards_a, forwards_b = a.forward_index + 1, b.forward_index + 1
    same = a.committed_ids == b.committed_ids
    first_difference = next((i for i, (x, y) in enumerate(zip(a.committed_ids, b.committed_ids)) if x != y),
                            min(len(a.committed_ids), len(b.committed_ids)))
    rows = [
        ("decoder forwards", f"{forwards_a:,}", f"{forwards_b:,}", _ratio(forwards_a, forwards_b)),
        ("tokens per forward", f"{a.tokens_per_forward:.2f}", f"{b.tokens_per_forward:.2f}",
         _ratio(a.tokens_per_forward, b.tokens_per_forward)),
        ("tokens/s (engine clock)", f"{a.tokens_per_second:.1f}", f"{b.tokens_per_second:.1f}",
         _ratio(a.tokens_per_second, b.tokens_per_second)),
        ("seconds", f"{a.elapsed_s:.2f}", f"{b.elapsed_s:.2f}", _ratio(a.elapsed_s, b.elapsed_s)),
        ("tokens", f"{a.committed_tokens:,}", f"{b.committed_tokens:,}", ""),
    ]
    body = "".join(f"<tr><th>{escape_html(name)}</th><td>{escape_html(x)}</td><td>{escape_html(y)}</td>"
                   f"<td>{escape_html(r)}</td></tr>" for name, x, y, r in rows)
    texts = ("the same tokens" if same else f"different tokens from token {first_difference + 1}")
    return (f'<div class="dg-compare-verdict" data-state="{"refused" if notice else "done"}" '
            f'data-same="{str(same).lower()}">{banner}'
            f"<table><thead><tr><th></th><th>A</th><th>B</th><th>B / A</th></tr></thead><tbody>{body}</tbody>"
            f"</table><p>Same prompt and seed ({escape_html(str(a.seed))}): {escape_html(texts)}.</p></div>")

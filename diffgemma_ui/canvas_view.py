"""The live canvas as HTML (a chip per position, finished blocks above the live one), the thought, the viridis scale."""

import functools
import math
from collections.abc import Sequence

from engine import Frame
from engine.frames import PAD

from .text import escape_html, plain_text, plural, prose
from .token_view import TokenCell, token_cells

# viridis sampled at 0, 0.1, ..., 1.0 (matplotlib's table)
VIRIDIS = ("#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c", "#22a884", "#44bf70", "#7ad151",
           "#bddf26", "#fde725")
PLOTLY_SCALE = "Viridis"
# Token styles drawn dimmed and labelled, without the confidence colour: control symbols, not text
_CONTROL_STYLES = ("special", "pad", "eos")
STOP_REASONS = {"eos": "ended at end-of-sequence", "max_new_tokens": "reached max new tokens", "cancelled": "stopped",
                "filled": "filled the blanks", "": ""}


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(bytes.fromhex(hex_colour[1:]))


def finite_number(value) -> float | None:
    """`value` as a finite float, else None (non-numbers too)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def viridis(value: float) -> str:
    """The viridis colour of `value` in [0, 1] as `#rrggbb` (clamped; non-numbers read as 0)."""
    scaled = min(1.0, max(0.0, finite_number(value) or 0.0)) * (len(VIRIDIS) - 1)
    low = min(int(scaled), len(VIRIDIS) - 2)
    frac = scaled - low
    a, b = _rgb(VIRIDIS[low]), _rgb(VIRIDIS[low + 1])
    return "#" + bytes(round(x + (y - x) * frac) for x, y in zip(a, b)).hex()


def empty_canvas_html(button: str = "Generate") -> str:
    return ('<div class="dg-canvas dg-empty" data-forward="-1" data-playing="false">'
            f"<p>Press <b>{escape_html(button)}</b> to watch a canvas of random tokens denoise into text.</p></div>")


EMPTY_CANVAS_HTML = empty_canvas_html()
CHAT_EMPTY_CANVAS_HTML = empty_canvas_html("Send")


def _number(value: float, digits: int = 3) -> str:
    try:
        return f"{float(value):.{digits}f}"
    except (TypeError, ValueError):
        return "?"


def chip_html(token: str, *, kind: str, position: int, confidence: float, entropy: float, first_accepted_step: int,
              draft: str | None = None, cell: TokenCell | None = None, draft_cell: TokenCell | None = None,
              fixed: bool = False, remelted: bool = False, alternatives: Sequence[tuple[str, float]] = ()) -> str:
    """A position's `<span>` chip and tooltip; `kind`: accepted, committed, noisy (`draft`: its guess) or pad
    (else ValueError); `fixed`: from a template; `alternatives`: (token, probability) for "why this token?"."""
    if kind not in ("accepted", "noisy", "committed", "pad"):
        raise ValueError(f"unknown chip kind {kind!r}")
    cell = cell or token_cells([token])[0]
    step = "not yet" if first_accepted_step is None or first_accepted_step < 0 else f"step {first_accepted_step + 1}"
    shown = _number(confidence)
    lines = [f"position {position}: {_quoted(cell.text)}",
             f"confidence {shown} \u00b7 entropy {_number(entropy)} nats", f"first accepted: {step}"]
    if kind == "noisy":
        lines[0] = f"position {position}: noise {_quoted(cell.text)} (renoised)"
        if draft is not None:
            guess = draft_cell or token_cells([draft])[0]
            detail = f" ({_escaped(guess.detail)})" if guess.detail else ""
            lines.append(f"current guess: {_quoted(guess.text)}{detail}")
    elif kind == "pad":
        lines.append("after end-of-sequence: dropped")
    if remelted:
        lines.insert(1, "re-melted: accepted at an earlier step, renoised in this one")
    if alternatives:
        lines.append("why this token? " + " \u00b7 ".join(
            f"{_alternative(token)} {probability:.0%}" for token, probability in alternatives))
    if cell.detail:
        lines.insert(1, _escaped(cell.detail))
    if fixed:
        lines.insert(1, "fixed by the template: given, never renoised")
    title = "&#10;".join(lines)
    style = ""
    if kind in ("accepted", "committed") and cell.style not in _CONTROL_STYLES and not fixed:
        style = _confidence_style(shown)
    classes = (f"dg-chip dg-{kind}" + ("" if cell.style == "text" else f" dg-tok-{cell.style}")
               + (" dg-fixed" if fixed else "") + (" dg-remelt" if remelted else ""))
    return f'<span class="{classes}" title="{title}"{style}>{cell.html}</span>'


# Escaped pieces of chip titles, cached (tokens and confidences repeat from step to step); escaping a line piece by
# piece gives what escaping it whole gives
_escaped = functools.lru_cache(maxsize=65536)(escape_html)


@functools.lru_cache(maxsize=65536)
def _quoted(text: str) -> str:
    return escape_html(f"\u201c{text}\u201d")


@functools.lru_cache(maxsize=65536)
def _alternative(token: str) -> str:
    return _quoted(token_cells([token])[0].text)


@functools.lru_cache(maxsize=4096)
def _confidence_style(shown: str) -> str:
    """The style of a confidence shown as `shown` (the colour of what it says), text black or white by WCAG contrast."""
    background = viridis(shown)
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in (x / 255 for x in _rgb(background)))
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    text = "#111111" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "#ffffff"
    return f' style="background:{background};color:{text}"'


def block_html(frame: Frame, *, live: bool, fixed: Sequence[bool] | None = None) -> str:
    """One block from its newest frame, `live` or finished; `fixed`: per position, given (infill)."""
    n = frame.canvas_length
    fixed = [False] * n if fixed is None else fixed
    bits = [f"Block {frame.block_index + 1}"]
    remelts = [f"{frame.block_remelts} re-melted"] if frame.block_remelts else []
    if live:
        flags = [bool(a) for a in frame.accepted]
        bits += [f"step {frame.step_index + 1}/{frame.max_denoising_steps}", f"T={_number(frame.temperature, 2)}",
                 f"{sum(flags)}/{n} accepted", *remelts, *(["stopped"] if frame.stop_reason == "cancelled" else [])]
        shown = [draft if flag else noise for draft, noise, flag in zip(frame.draft_tokens, frame.input_tokens, flags)]
        kinds = None
        if frame.draft_kinds and frame.input_kinds:
            kinds = [kind if flag else noise for kind, noise, flag in zip(frame.draft_kinds, frame.input_kinds, flags)]
        cells = token_cells(shown, kinds, groups=flags)
        drafts = token_cells(frame.draft_tokens, frame.draft_kinds or None)
        looks = ["accepted" if flag else "noisy" for flag in flags]
        melted = list(frame.remelted) or [False] * n
    else:
        kept = max(0, min(n, len(frame.committed_ids) - frame.block_index * n))
        pads = sum(1 for k in (frame.draft_kinds or [])[:kept] if k == PAD)
        bits += [plural(frame.step_index + 1, "forward"),
                 "stopped early (stable)" if frame.block_stopped_early else "all steps", *remelts]
        if kept < n:
            bits.append(f"{kept - pads} token{'s' if kept - pads != 1 else ''} kept, end-of-sequence")
        if pads:
            bits.append(f"{pads} pad{'s' if pads != 1 else ''} (not counted)")
        shown = frame.draft_tokens
        cells = drafts = token_cells(shown, frame.draft_kinds or None, groups=[pos < kept for pos in range(n)])
        looks = ["committed" if pos < kept else "pad" for pos in range(n)]
        flags, melted = [True] * n, [False] * n  # a finished block shows no guesses and no re-melts
    alternatives = [list(zip(*pair)) for pair in zip(frame.top_tokens, frame.top_probs)] or [()] * n
    chips = [chip_html(shown[pos], kind=looks[pos], position=pos, confidence=frame.confidence[pos],
                       entropy=frame.entropy[pos], first_accepted_step=frame.first_accepted_step[pos],
                       draft=None if flags[pos] else frame.draft_tokens[pos], cell=cells[pos],
                       draft_cell=None if flags[pos] else drafts[pos], fixed=fixed[pos], remelted=melted[pos],
                       alternatives=alternatives[pos]) for pos in range(n)]
    header = escape_html(" \u00b7 ".join(bits))
    return (f'<section class="dg-block dg-block-{"live" if live else "done"}" data-block="{frame.block_index}">'
            f'<header>{header}</header><div class="dg-chips">{"".join(chips)}</div></section>')


def legend_html() -> str:
    """The colour legend: the confidence scale and what each kind of chip looks like."""
    stops = ", ".join(viridis(i / 10) for i in range(11))
    return f'<div class="dg-legend" aria-hidden="true">{prose("canvas-legend").format(stops=stops)}</div>'


def stack_html(finished: Sequence[Frame], *, finished_html: Sequence[str] | None = None) -> str:
    """The finished blocks (each block's last frame) stacked, "" for none; `finished_html`: a cache of them."""
    if not finished:
        return ""
    if finished_html is None or len(finished_html) != len(finished):
        finished_html = [block_html(f, live=False) for f in finished]
    return f'<div class="dg-stack" data-blocks="{len(finished)}">{"".join(finished_html)}</div>'


def live_html(live: Frame | None, *, newest: Frame | None = None, status: str = "") -> str:
    """The `live` block (none once done) and a `status` line in a `<div data-forward>` (newest forward, -1); else the
    empty canvas."""
    newest = newest or live
    if newest is None and not status:
        return EMPTY_CANVAS_HTML
    block = block_html(live, live=True) if live is not None and not live.block_done else ""
    forward = newest.forward_index if newest is not None else -1
    status_html = f'<p class="dg-status">{escape_html(status)}</p>' if status else ""
    return f'<div class="dg-canvas" data-forward="{forward}">{block}{status_html}</div>'


def thought_html(thought: str) -> str:
    """The thought channel's text as a collapsed `<details>`, escaped; "" when there is none."""
    if not thought or not thought.strip():
        return ""
    return ('<details class="dg-thought"><summary>Thought \u00b7 '
            f"{plural(len(thought.split()), 'word')} (the model's reasoning before its answer; not part of the "
            f'answer)</summary><div class="dg-thought-text">{escape_html(plain_text(thought))}</div></details>')

"""The Race view: two panels (block diffusion, autoregressive) and the result, as HTML from frames and results.

Pure functions. A panel shows one side at a moment of its engine clock: its answer so far, its speed figures (the
meter's stat cards) and, for diffusion, the canvas being denoised (the playground's chips). The result card puts
the race's facts (`RaceResult.verdict()`) in words. Every model string is escaped (`diffgemma_ui.text`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from engine.race import REPEAT_N, RaceResult, SideResult

from .canvas_view import STOP_REASONS, block_html
from .meter import format_number, stat_cards_html
from .text import escape_html

TITLES = {"diffusion": "Block diffusion", "autoregressive": "Autoregressive"}
SUBTITLES = {"diffusion": "canvas by canvas", "autoregressive": "token by token"}
FIGURES = ("tokens/s", "tokens/forward", "forwards", "first token", "time", "tokens")
WAITING_TEXT = {1: "runs first", 2: "waits its turn: it runs after the other side"}


def frame_at(frames: Sequence, t: float):
    """The newest frame whose `elapsed_s` is at most `t` (engine seconds), or None before the first one.

    `frames` must be in order (as a side yields them)."""
    index = bisect_right([f.elapsed_s for f in frames], t)
    return frames[index - 1] if index else None


def side_figures(frame, *, t: float | None = None, first_token_s: float | None = None) -> dict[str, str]:
    """A side's figures as display strings, keyed by `FIGURES` label.

    Args:
        frame: the side's newest frame at this moment (a diffusion `Frame` or an autoregressive `TokenFrame`;
            None: nothing yet).
        t: the replay's engine time in seconds (None: the frame's own `elapsed_s`); a side that is done stops
            its clock at its last frame.
        first_token_s: engine seconds at which its first token was committed, if it was by then.

    Tokens count as everywhere: generated tokens up to and including EOS, pads never; until the first one is
    committed, the rates show "…".
    """
    if frame is None:
        return {label: "\u2013" for label in FIGURES}
    elapsed = frame.elapsed_s if t is None or frame.done else max(t, frame.elapsed_s)
    forwards = frame.forward_index + 1
    tokens = frame.committed_tokens
    counting = tokens == 0 and not frame.done
    none = tokens == 0 and frame.done  # stopped before its first token: no rate to show, not a rate of 0
    shown_first = first_token_s is not None and first_token_s <= elapsed
    return {
        "tokens/s": "\u2026" if counting else "\u2013" if none else format_number(tokens / elapsed if elapsed > 0 else 0.0, 1),
        "tokens/forward": "\u2026" if counting else "\u2013" if none else format_number(tokens / forwards, 2),
        "forwards": f"{forwards:,}",
        "first token": (format_number(first_token_s, 2, " s") if shown_first  # seconds, like "time" beside it
                        else "\u2013" if frame.done else "\u2026"),
        "time": format_number(elapsed, 2, " s"),
        "tokens": f"{tokens:,}",
    }


def panel_html(side: str, frame, *, text: str, model: str, position: int | None, state: str,
               t: float | None = None, first_token_s: float | None = None) -> str:
    """One side's panel.

    Args:
        side: "diffusion" or "autoregressive".
        frame: its newest frame at this moment (None: it has not started).
        text: its answer so far (raw model text, escaped here).
        model: where its weights come from (escaped here).
        position: 1 or 2, when it runs (None: not known yet).
        state: "idle" (no race yet), "waiting", "running", "replay" or "done".
        t, first_token_s: as in `side_figures`.

    Returns:
        HTML; the outer element carries `data-side`, `data-state` and `data-tokens` (tokens so far) for tests.
    """
    figures = side_figures(frame, t=t, first_token_s=first_token_s)
    if state == "idle":
        note = "press Race to start"
    elif state == "waiting":
        note = WAITING_TEXT.get(position or 2, "")
    elif frame is not None and frame.done and (t is None or t >= frame.elapsed_s):
        note = STOP_REASONS.get(frame.stop_reason, frame.stop_reason) or "done"
    else:
        note = {"running": "running now", "replay": "replay"}.get(state, "")
    order = f" \u00b7 ran {'first' if position == 1 else 'second'}" if position and state in ("replay", "done") else ""
    canvas = ""
    if side == "diffusion" and frame is not None and not frame.block_done and state in ("running", "replay"):
        canvas = f'<div class="dg-race-canvas">{block_html(frame, live=True)}</div>'
    answer = escape_html(text) if text else ""
    caret = '<span class="dg-race-caret"></span>' if state in ("running", "replay") and not (
        frame is not None and frame.done) else ""
    placeholder = "" if answer or caret else '<span class="dg-race-empty">The answer appears here.</span>'
    tokens = frame.committed_tokens if frame is not None else 0
    return (
        f'<div class="dg-race-panel" data-side="{side}" data-state="{escape_html(state)}" data-tokens="{tokens}">'
        f'<div class="dg-race-head"><h3>{TITLES[side]}</h3><span>{SUBTITLES[side]} \u00b7 '
        f'{escape_html(model)}{order}</span></div>'
        f'<div class="dg-meter dg-race-meter">{stat_cards_html(figures)}'
        f'<div class="dg-meter-note">{escape_html(note)} \u00b7 engine clock</div></div>'
        f'<div class="dg-race-answer">{answer}{caret}{placeholder}</div>{canvas}</div>'
    )


def _ms(seconds: float | None, digits: int = 2) -> str:
    return "\u2013" if seconds is None else format_number(seconds * 1000, digits, " ms")


def cost_table_html(result: RaceResult) -> str:
    """Cost per forward x tokens per forward on both sides (and the GPU bandwidth bound where measured)."""
    sides = [s for s in (result.diffusion, result.autoregressive) if s is not None]
    bound = any(s.bandwidth_bound_s_per_forward for s in sides)
    head = "<tr><th></th><th>cost per forward</th><th>tokens per forward</th><th>cost per token</th>"
    if bound:
        head += "<th>bandwidth bound per forward</th><th>bound tokens/s</th>"
    rows = []
    for side in sides:
        cells = [TITLES[side.name], _ms(side.seconds_per_forward),
                 format_number(side.tokens_per_forward, 2) if side.tokens else "\u2013", _ms(side.seconds_per_token)]
        if bound:
            cells += [_ms(side.bandwidth_bound_s_per_forward, 3),
                      format_number(side.bandwidth_bound_tokens_per_second, 0)]
        rows.append("<tr>" + "".join(f"<td>{escape_html(c)}</td>" for c in cells) + "</tr>")
    caption = "measured: engine seconds / forwards; cost per token = cost per forward / tokens per forward"
    if bound:
        caption += (f"; bound = weights' bytes per forward / {format_number(result.memory_bandwidth_gb_s, 0)} GB/s "
                    "measured memory bandwidth")
    return (f'<table class="dg-race-costs"><caption>{escape_html(caption)}</caption>{head}</tr>'
            f'{"".join(rows)}</table>')


def speedup_text(result: RaceResult) -> str:
    """The headline, e.g. "Diffusion: 3.2x the autoregressive speed" or "... 0.19x (5.3x slower)"; a stopped race
    names the side the Stop cut short and gives no speedup."""
    speedup = result.speedup
    if result.cancelled:
        side = result.stopped_side
        stopped = getattr(result, side) if side else None
        if stopped is None:
            return f"Stopped before the {side} side ran: no speedup."
        return f"Stopped: the {side} side was cut short after {stopped.tokens} tokens, so no speedup is given."
    if speedup is None:
        return "No speedup: a side made no tokens."
    text = f"Diffusion ran at {speedup:.2f}x the autoregressive speed"
    if speedup < 1:
        text += f" ({1 / speedup:.1f}x slower)"
    return text + " (tokens/s on both sides)"


FAULT_TEXT = {  # `SideResult.faults` in words, with the share that set each off
    "punctuation": "is mostly punctuation ({:.0%} of its visible tokens have no letter or digit)",
    "repetition": f"repeats itself ({{:.0%}} of its tokens repeat an earlier run of {REPEAT_N})",
}


def _fault_clauses(side: SideResult) -> list[str]:
    shares = {"punctuation": side.punctuation_share, "repetition": side.repeated_share}
    return [FAULT_TEXT[fault].format(shares[fault]) for fault in side.faults]


def caveat_text(result: RaceResult) -> str:
    """A warning for beside the speedup when a side's answer is mostly punctuation or repeats itself ("" when
    neither answer is), e.g. "The diffusion answer is mostly punctuation (78% of its visible tokens have no
    letter or digit). The speedup counts tokens per second, not readable text." """
    sentences = []
    for side in (result.diffusion, result.autoregressive):
        clauses = _fault_clauses(side) if side is not None else []
        if clauses:
            sentences.append(f"The {side.name} answer {' and '.join(clauses)}.")
    if not sentences:
        return ""
    return " ".join(sentences) + " The speedup counts tokens per second, not readable text."


def explanation(result: RaceResult) -> str:
    """Plain text (not HTML) saying why the race came out as it did, from `result.verdict()` and both sides'
    measured cost per forward and tokens per forward; "" when a side is missing or made no tokens."""
    d, a = result.diffusion, result.autoregressive
    if d is None or a is None or d.tokens == 0 or a.tokens == 0:
        return ""
    verdict = result.verdict()
    ms = 1000.0
    per_token = (
        f"Diffusion: {d.seconds_per_forward * ms:.2f} ms per canvas forward / {d.tokens_per_forward:.2f} tokens per "
        f"forward = {d.seconds_per_token * ms:.2f} ms per token. Autoregressive: {a.seconds_per_forward * ms:.2f} ms "
        f"per forward / {a.tokens_per_forward:.2f} tokens per forward = {a.seconds_per_token * ms:.2f} ms per token."
    )
    ratio = verdict["cost_ratio"]
    costs = (f"a canvas forward cost {'far more than' if ratio is None else f'{ratio:.1f}x'} an autoregressive "
             f"forward here, and each committed {d.tokens_per_forward:.2f} tokens against 1.")
    if verdict["winner"] is None:  # both sides ran, one of them cut short
        side = verdict["stopped_side"]
        why = (f"No winner: the race was stopped while the {side} side ran after {getattr(result, side).tokens} "
               f"tokens. So far {costs}")
    else:
        winner = "Diffusion wins" if verdict["winner"] == "diffusion" else "Autoregressive decoding wins"
        alone = " on speed alone" if any(verdict["faults"].values()) else ""  # the caveat beside the speedup says why
        why = f"{winner}{alone}: {costs}"
    if verdict["bound"] == "memory":
        device_note = ("On a GPU at batch size 1 both kinds of forward are bound by reading the weights from memory, "
                       "so a forward that commits several tokens should win; the bandwidth bound below is that floor.")
        if d.bandwidth_bound_s_per_forward and a.bandwidth_bound_s_per_forward:
            device_note += (f" Bandwidth bound: {d.bandwidth_bound_s_per_forward * ms:.3f} ms per canvas forward, "
                            f"{a.bandwidth_bound_s_per_forward * ms:.3f} ms per autoregressive forward.")
    else:
        device_note = (f"On a {result.device.split(':')[0].upper()} a forward's cost grows with the positions it "
                       f"computes (compute-bound): a canvas forward computes {result.canvas_length} positions, an "
                       "autoregressive forward one, so diffusion wins only when it commits more tokens per forward "
                       "than that cost ratio.")
    return f"{why} {per_token} {device_note}"


def lengths_text(result: RaceResult) -> str:
    """A warning when one side wrote at least twice the tokens of the other ("" otherwise): the speedup compares
    tokens/s, not two answers of one length."""
    d, a = result.diffusion, result.autoregressive
    if d is None or a is None or min(d.tokens, a.tokens) == 0 or max(d.tokens, a.tokens) < 2 * min(d.tokens, a.tokens):
        return ""
    return (f"The answers differ in length: diffusion wrote {d.tokens} tokens "
            f"({STOP_REASONS.get(d.stop_reason, d.stop_reason)}), autoregressive {a.tokens} "
            f"({STOP_REASONS.get(a.stop_reason, a.stop_reason)}). The speedup compares tokens per second, not the "
            "time to an answer of the same length.")


def result_html(result: RaceResult | None) -> str:
    """The result card under the panels: speedup (with `caveat_text` beside it), cost table, `explanation`, the
    length rule and fairness sentences.

    None: the card before any race (the rules only). The outer element carries `data-speedup` and `data-faults`
    (the sides whose answer is faulted, space-separated) for tests."""
    if result is None:
        return ('<div class="dg-race-result" data-state="idle"><p class="dg-race-rules">'
                f'{escape_html(RULES_BEFORE_A_RACE)}</p></div>')
    speedup = "" if result.speedup is None else f"{result.speedup:.6g}"
    lengths = lengths_text(result)
    lengths = f'<p class="dg-race-lengths">{escape_html(lengths)}</p>' if lengths else ""
    caveat = caveat_text(result)
    caveat = f'<span class="dg-race-caveat">{escape_html(caveat)}</span>' if caveat else ""
    faulted = " ".join(name for name, faults in result.verdict()["faults"].items() if faults)
    return (
        f'<div class="dg-race-result" data-state="done" data-speedup="{speedup}" data-faults="{faulted}">'
        f'<p class="dg-race-speedup">{escape_html(speedup_text(result))}{caveat}</p>'
        f"{lengths}"
        f"{cost_table_html(result)}"
        f'<p class="dg-race-explain">{escape_html(explanation(result))}</p>'
        f'<p class="dg-race-rules">{escape_html(result.fairness)} Length: {escape_html(result.length_rule)}. '
        f"Seed {escape_html(str(result.seed))}.</p></div>"
    )


RULES_BEFORE_A_RACE = (
    "The same prompt runs through block diffusion and through token-by-token autoregressive decoding, one after "
    "the other (never at once), each after a warm-up; then both are replayed side by side on the engine's clock. "
    "Both sides stop at their first end-of-sequence token within the same token budget."
)


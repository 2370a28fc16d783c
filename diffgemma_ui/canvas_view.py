"""The live canvas: one chip per canvas position, finished blocks stacked above the block being denoised.

Pure functions from frames to an HTML string. Every model string goes through `diffgemma_ui.text` (escaped and
with whitespace made visible), in element text and in attributes alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine import Frame
from engine.tokens import PAD

from .colors import text_on, viridis
from .text import escape_html
from .token_view import TokenCell, token_cells

# Token styles drawn dimmed and labelled, without the confidence colour: control symbols, not text
_CONTROL_STYLES = ("special", "pad", "eos")

def empty_canvas_html(button: str = "Generate") -> str:
    """The canvas before any run: press `button` (the tab's own run button, plain text) to watch one."""
    return ('<div class="dg-canvas dg-empty" data-forward="-1">'
            f"<p>Press <b>{escape_html(button)}</b> to watch a canvas of random tokens denoise into text.</p></div>")


EMPTY_CANVAS_HTML = empty_canvas_html()
CHAT_EMPTY_CANVAS_HTML = empty_canvas_html("Send")

STOP_REASONS = {
    "eos": "ended at end-of-sequence",
    "max_new_tokens": "reached max new tokens",
    "cancelled": "stopped",
    "filled": "filled the blanks",
    "": "",
}


def _number(value: float, digits: int = 3) -> str:
    try:
        return f"{float(value):.{digits}f}"
    except (TypeError, ValueError):
        return "?"


def chip_html(
    token: str,
    *,
    kind: str,
    position: int,
    confidence: float,
    entropy: float,
    first_accepted_step: int,
    draft: str | None = None,
    cell: TokenCell | None = None,
    draft_cell: TokenCell | None = None,
    fixed: bool = False,
    remelted: bool = False,
    alternatives: Sequence[tuple[str, float]] = (),
) -> str:
    """One canvas position as a `<span>` chip.

    Args:
        token: the raw token string to show (escaped here), read as text unless `cell` is given.
        kind: "accepted" (coloured by confidence), "noisy" (renoised position: dimmed and struck through),
            "committed" (finished block, coloured by confidence) or "pad" (after end-of-sequence, faded).
        position: 0-based position in the canvas.
        confidence: probability of the draft token, in [0, 1]; entropy: in nats.
        first_accepted_step: step the position was first accepted (-1: never).
        draft: for noisy chips, the decoder's current argmax guess (shown in the tooltip).
        cell, draft_cell: how the token and the draft look (`token_view.token_cells`: special tokens labelled,
            byte pieces grouped); default: plain text. A special-token cell (pad, EOS, markers) is drawn dimmed
            and labelled (class `dg-tok-<style>`), without the confidence colour.
        fixed: the position was given, not denoised (an infill template's text): class `dg-fixed`, said in the
            tooltip, drawn without the confidence colour (it was never sampled).
        remelted: the position was accepted earlier in the block and renoised in this forward: class `dg-remelt`.
        alternatives: (token string, probability) of the forward's likeliest tokens, the draft first: listed in the
            tooltip under "why this token?" (the page shows the tooltip as a popup on a tap).

    Returns:
        HTML text; the tooltip (`title`) lists token, what it is (special tokens, bytes), confidence, entropy and
        first accepted step.

    Raises:
        ValueError: unknown `kind`.
    """
    if kind not in ("accepted", "noisy", "committed", "pad"):
        raise ValueError(f"unknown chip kind {kind!r}")
    cell = cell or token_cells([token])[0]
    step = "not yet" if first_accepted_step is None or first_accepted_step < 0 else f"step {first_accepted_step}"
    lines = [
        f"position {position}: \u201c{cell.text}\u201d",
        f"confidence {_number(confidence)} \u00b7 entropy {_number(entropy)} nats",
        f"first accepted: {step}",
    ]
    if kind == "noisy":
        lines[0] = f"position {position}: noise \u201c{cell.text}\u201d (renoised)"
        if draft is not None:
            guess = draft_cell or token_cells([draft])[0]
            lines.append(f"current guess: \u201c{guess.text}\u201d" + (f" ({guess.detail})" if guess.detail else ""))
    elif kind == "pad":
        lines.append("after end-of-sequence: dropped")
    if remelted:
        lines.insert(1, "re-melted: accepted at an earlier step, renoised in this one")
    if alternatives:
        shown_alts = token_cells([token for token, _ in alternatives])
        lines.append("why this token? " + " \u00b7 ".join(
            f"\u201c{alt.text}\u201d {probability:.0%}" for alt, (_, probability) in zip(shown_alts, alternatives)))
    if cell.detail:
        lines.insert(1, cell.detail)
    if fixed:
        lines.insert(1, "fixed by the template: given, never renoised")
    title = "&#10;".join(escape_html(line) for line in lines)
    style = ""
    if kind in ("accepted", "committed") and cell.style not in _CONTROL_STYLES and not fixed:
        background = viridis(confidence)
        style = f' style="background:{background};color:{text_on(background)}"'
    classes = (f"dg-chip dg-{kind}" + ("" if cell.style == "text" else f" dg-tok-{cell.style}")
               + (" dg-fixed" if fixed else "") + (" dg-remelt" if remelted else ""))
    return f'<span class="{classes}" title="{title}"{style}>{cell.html}</span>'


def block_html(frame: Frame, *, live: bool, fixed: Sequence[bool] | None = None) -> str:
    """One block (canvas) as HTML, from its newest frame.

    A live block shows accepted positions as their draft token coloured by confidence and every other position
    as the noisy input token, dimmed and struck through. A finished block (`live=False`, `frame.block_done`)
    shows the committed argmax canvas; positions after end-of-sequence are faded. Special tokens are labelled and
    dimmed and byte pieces grouped (`token_view.token_cells`, from the frame's token kinds); a pad the model wrote
    before end-of-sequence is not counted as a token (as in `generate()`), and the header says how many there are.
    `fixed`: per position, whether it was given rather than denoised (infill; chips get class `dg-fixed`).
    """
    fixed = [bool(f) for f in fixed] if fixed is not None else [False] * frame.canvas_length
    n = frame.canvas_length
    header_bits = [f"Block {frame.block_index + 1}"]
    chips = []
    draft_kinds = frame.draft_kinds or None
    if live:
        accepted = sum(1 for a in frame.accepted if a)
        header_bits += [
            f"step {frame.step_index + 1}/{frame.max_denoising_steps}",
            f"T={_number(frame.temperature, 2)}",
            f"{accepted}/{n} accepted",
        ]
        if frame.block_remelts:
            header_bits.append(f"{frame.block_remelts} re-melted")
        if frame.stop_reason == "cancelled":
            header_bits.append("stopped")
        flags = [bool(a) for a in frame.accepted]
        shown = [frame.draft_tokens[p] if flags[p] else frame.input_tokens[p] for p in range(n)]
        kinds = None
        if frame.draft_kinds and frame.input_kinds:
            kinds = [frame.draft_kinds[p] if flags[p] else frame.input_kinds[p] for p in range(n)]
        cells = token_cells(shown, kinds, groups=flags)
        drafts = token_cells(frame.draft_tokens, draft_kinds)
        for pos in range(n):
            chips.append(chip_html(
                shown[pos],
                kind="accepted" if flags[pos] else "noisy",
                position=pos,
                confidence=frame.confidence[pos],
                entropy=frame.entropy[pos],
                first_accepted_step=frame.first_accepted_step[pos],
                draft=None if flags[pos] else frame.draft_tokens[pos],
                cell=cells[pos],
                draft_cell=None if flags[pos] else drafts[pos],
                fixed=fixed[pos],
                remelted=bool(frame.remelted) and frame.remelted[pos],
                alternatives=_alternatives(frame, pos),
            ))
    else:
        start = frame.block_index * n
        kept = max(0, min(n, len(frame.committed_ids) - start))
        forwards = frame.step_index + 1
        header_bits.append(f"{forwards} forward{'s' if forwards != 1 else ''}")
        header_bits.append("stopped early (stable)" if frame.block_stopped_early else "all steps")
        if frame.block_remelts:
            header_bits.append(f"{frame.block_remelts} re-melted")
        pads = sum(1 for k in (frame.draft_kinds or [])[:kept] if k == PAD)
        if kept < n:
            header_bits.append(f"{kept - pads} token{'s' if kept - pads != 1 else ''} kept, end-of-sequence")
        if pads:
            header_bits.append(f"{pads} pad{'s' if pads != 1 else ''} (not counted)")
        cells = token_cells(frame.draft_tokens, draft_kinds, groups=[pos < kept for pos in range(n)])
        for pos in range(n):
            chips.append(chip_html(
                frame.draft_tokens[pos],
                kind="committed" if pos < kept else "pad",
                position=pos,
                confidence=frame.confidence[pos],
                entropy=frame.entropy[pos],
                first_accepted_step=frame.first_accepted_step[pos],
                cell=cells[pos],
                fixed=fixed[pos],
                alternatives=_alternatives(frame, pos),
            ))
    state = "live" if live else "done"
    header = escape_html(" \u00b7 ".join(header_bits))
    return (
        f'<section class="dg-block dg-block-{state}" data-block="{frame.block_index}">'
        f'<header>{header}</header><div class="dg-chips">{"".join(chips)}</div></section>'
    )


def _alternatives(frame: Frame, position: int) -> list[tuple[str, float]]:
    """(token string, probability) of the frame's alternatives at `position` ([] when the frame has none)."""
    if not frame.top_tokens:
        return []
    return list(zip(frame.top_tokens[position], frame.top_probs[position]))


def legend_html() -> str:
    """The colour legend: confidence scale (viridis), what a noisy chip, a special token and a byte look like."""
    stops = ", ".join(viridis(i / 10) for i in range(11))
    return (
        '<div class="dg-legend" aria-hidden="true">'
        '<span class="dg-chip dg-noisy">noise</span><span>renoised</span>'
        '<span class="dg-chip dg-noisy dg-remelt">melt</span><span>re-melted (was accepted)</span>'
        f'<span class="dg-scale" style="background:linear-gradient(90deg, {stops})"></span>'
        "<span>confidence 0 \u2192 1</span>"
        '<span class="dg-chip dg-committed dg-tok-special">eos</span><span>special token (not text)</span>'
        '<span class="dg-chip dg-committed dg-tok-byte">0xE2</span><span>byte</span>'
        '<span class="dg-ws"><span class="dg-sp">\u00b7</span> space '
        '<span class="dg-sp">\u21b5</span> newline</span></div>'
    )


def stack_html(finished: Sequence[Frame], *, finished_html: Sequence[str] | None = None) -> str:
    """The finished blocks, stacked in block order ("" when there are none).

    Args:
        finished: the last frame of each finished block, in block order.
        finished_html: optional pre-rendered `block_html(f, live=False)` strings for `finished` (a cache: same
            result, less work for long runs); ignored unless it matches `finished` one to one.
    """
    if not finished:
        return ""
    if finished_html is None or len(finished_html) != len(finished):
        finished_html = [block_html(f, live=False) for f in finished]
    return f'<div class="dg-stack" data-blocks="{len(finished)}">{"".join(finished_html)}</div>'


def live_html(live: Frame | None, *, newest: Frame | None = None, status: str = "",
              fixed: Sequence[bool] | None = None) -> str:
    """The canvas being denoised, plus an optional status line (the colour legend is `legend_html`).

    Args:
        live: the newest frame of the block being denoised, or None (no block in progress). A frame with
            `block_done` is finished and not drawn here (it belongs to `stack_html`).
        newest: the run's newest frame (for `data-forward` when `live` is None).
        status: a short plain-text status line (escaped here), e.g. the stop reason.
        fixed: per position, whether it was given rather than denoised (see `block_html`).

    Returns:
        HTML text; the outer element carries `data-forward` (newest forward index, -1 if none) so tests and
        scripts can tell frames apart. `EMPTY_CANVAS_HTML` when there is nothing at all to show.
    """
    newest = newest if newest is not None else live
    if newest is None and not status:
        return EMPTY_CANVAS_HTML
    block = block_html(live, live=True, fixed=fixed) if live is not None and not live.block_done else ""
    forward = newest.forward_index if newest is not None else -1
    status_html = f'<p class="dg-status">{escape_html(status)}</p>' if status else ""
    return f'<div class="dg-canvas" data-forward="{forward}">{block}{status_html}</div>'


def canvas_html(
    finished: Sequence[Frame],
    live: Frame | None,
    *,
    finished_html: Sequence[str] | None = None,
    status: str = "",
) -> str:
    """The whole canvas view in one string: the legend, `stack_html` (finished blocks) above `live_html`.

    The app shows the three parts in three components, so a new frame only re-sends the live block; this function
    is the same view for other uses (tests, exports). Arguments as in `stack_html` and `live_html`.
    """
    newest = live if live is not None else (finished[-1] if finished else None)
    if newest is None and not status:
        return EMPTY_CANVAS_HTML
    return (legend_html() + stack_html(finished, finished_html=finished_html)
            + live_html(live, newest=newest, status=status))

"""The Infill tab's views (pure): the canvas with the template's fixed positions marked, the filled template, and
the plots restricted to the blank positions.

The canvas is `canvas_view.block_html` with its `fixed` mask (chips of class `dg-fixed`); the plots are
`plots`' own figures built from frames cut down to the blank positions (`blank_frames`), their x values put back
at the blanks' canvas positions. Template and model text are escaped (`text.escape_html`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from engine import Frame
from engine.infill import InfillLayout

from . import plots
from .canvas_view import block_html, legend_html
from .text import escape_html, plain_text

EMPTY_INFILL_HTML = ('<div class="dg-canvas dg-empty" data-forward="-1"><p>Write a template with blanks and press '
                     "<b>Fill</b>: the template's own text is placed in the canvas and stays fixed while the blanks "
                     "denoise.</p></div>")
FIXED_LEGEND_HTML = ('<div class="dg-legend dg-infill-legend" aria-hidden="true">'
                     '<span class="dg-chip dg-accepted dg-fixed">the</span><span>fixed by the template (given at '
                     "every step, never renoised)</span><span>other chips: the blanks being denoised</span></div>")
_PER_POSITION = ("input_ids", "draft_ids", "accepted", "confidence", "entropy", "first_accepted_step",
                 "input_tokens", "draft_tokens", "input_kinds", "draft_kinds")
_POSITION = re.compile(r"position (\d+)")


def infill_canvas_html(frame: Frame | None, layout: InfillLayout | None, status: str = "") -> str:
    """The infill canvas: the colour legend, the fixed-position legend, and the canvas of `frame` with every fixed
    position marked (a live block while it denoises, the committed canvas once done), plus a status line.

    The outer element carries `data-forward` (the frame's forward index) and `data-fixed` (fixed positions)."""
    if frame is None or layout is None:
        if not status:
            return EMPTY_INFILL_HTML
        return f'<div class="dg-canvas" data-forward="-1"><p class="dg-status">{escape_html(status)}</p></div>'
    block = block_html(frame, live=not frame.block_done, fixed=layout.fixed)
    status_html = f'<p class="dg-status">{escape_html(status)}</p>' if status else ""
    return (f'<div class="dg-canvas dg-infill-canvas" data-forward="{frame.forward_index}" '
            f'data-fixed="{sum(layout.fixed)}">{legend_html()}{FIXED_LEGEND_HTML}{block}{status_html}</div>')


def filled_html(tokenizer, layout: InfillLayout | None, canvas_ids: Sequence[int] | None, *, live: bool) -> str:
    """The template with each run of blank positions shown as what the canvas holds there now (`<mark>`), from a
    frame's draft (`live`) or its committed ids; fixed runs are the template's text. Special tokens are skipped,
    everything escaped. "" before a run."""
    if layout is None or canvas_ids is None:
        return ""
    ids = list(canvas_ids[:layout.template_positions])
    parts, start = [], 0
    for i in range(1, layout.template_positions + 1):
        if i == layout.template_positions or layout.fixed[i] != layout.fixed[start]:
            text = plain_text(tokenizer.decode(ids[start:i], skip_special_tokens=True))
            if layout.fixed[start]:
                parts.append(escape_html(text))
            else:
                parts.append(f'<mark class="dg-fill" title="positions {start}\u2013{i - 1}">'
                             f"{escape_html(text) or '&#8709;'}</mark>")
            start = i
    state = "live" if live else "done"
    label = "Current draft of the blanks" if live else "Filled template"
    return (f'<div class="dg-filled" data-state="{state}"><div class="dg-filled-label">{label}</div>'
            f'<div class="dg-filled-text">{"".join(parts)}</div></div>')


def blank_frames(frames: Sequence[Frame], blanks: Sequence[int]) -> list[Frame]:
    """`frames` with every per-position field cut down to the `blanks` positions, in order (`canvas_length` =
    number of blanks): what the plots draw."""
    index = list(blanks)
    cut = []
    for frame in frames:
        fields = {name: [getattr(frame, name)[i] for i in index] for name in _PER_POSITION
                  if len(getattr(frame, name)) == frame.canvas_length}
        cut.append(dataclasses.replace(frame, canvas_length=len(index), **fields))
    return cut


def _at_blanks(figure: plots.FigureSpec, blanks: Sequence[int], hover_keys=("hovertext",)) -> plots.FigureSpec:
    """Put a figure's position axis back on the blanks' canvas positions (a category axis: blanks need not be
    adjacent) and its hover texts' "position k" too."""
    def fix(text):
        return _POSITION.sub(lambda m: f"position {blanks[int(m.group(1))]}", text) if isinstance(text, str) else text

    for trace in figure.get("data", []):
        if "x" in trace and trace.get("type") in ("heatmap", "bar", "scatter") and trace.get("yaxis") != "y2":
            trace["x"] = [blanks[int(x)] for x in trace["x"]]
        for key in hover_keys:
            if key in trace:
                trace[key] = [[fix(t) for t in row] if isinstance(row, list) else fix(row) for row in trace[key]]
    axis = figure["layout"].get("xaxis", {})
    if axis.get("visible", True):
        axis.update(type="category", title={"text": "canvas position (blanks only)"})
    return figure


def blank_plots(frames: Sequence[Frame], blanks: Sequence[int], *, final: bool) -> tuple:
    """(confidence heatmap, unmasking order, entropy and acceptance) of the blank positions only (`final`: with
    hover text and the heatmap's step slider)."""
    cut = blank_frames(frames, blanks)
    heatmap = _at_blanks(plots.confidence_heatmap(cut, animate=final, hover=final), blanks)
    order = _at_blanks(plots.unmasking_order(cut[-1] if cut else None), blanks)
    entropy = plots.entropy_and_acceptance(cut)  # per step: the x axis is steps, not positions
    return heatmap, order, entropy

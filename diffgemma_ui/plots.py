"""Plotly views of a block as plain figure dicts: confidence heatmap, unmasking order, entropy and acceptance."""

import json
import math
from collections.abc import Sequence

from engine import Frame

from .canvas_view import PLOTLY_SCALE, viridis
from .text import escape_plotly, plural
from .token_view import draft_labels

HEIGHT = 330
NOT_ACCEPTED_COLOUR = "rgba(140,140,140,0.45)"
GRID = "rgba(128,128,128,0.22)"
ACCEPTED_COLOUR = "#E69F00"  # Okabe-Ito orange and sky blue: a colour-blind-safe pair, readable on light and dark
ENTROPY_COLOUR = "#56B4E9"
REMELT_COLOUR = "#f97316"  # the canvas's re-melt outline (assets/style.css .dg-remelt)
MODEBAR_REMOVE = ["select2d", "lasso2d"]  # no view reads a selection
GAP_CELLS = 96  # heatmap rows or columns with 1 px gaps between cells up to this many
SLIDER_STEPS = 32  # stops on the heatmap's slider at most (the play button shows every step)
HOVER_CELLS = 16384  # heatmap cells drawn with per-cell token text at most (256 positions x 64 steps)
TOOLBAR_PX = 28  # the hover mode bar's strip
# dark text on a light button: readable in both themes
BUTTON_STYLE = {"bgcolor": "#e2e8f0", "bordercolor": "#94a3b8", "font": {"color": "#0f172a", "size": 12}}


class FigureSpec(dict):
    """A Plotly figure as a plain dict that `gr.Plot` takes like a `Figure` (it only calls `to_json()`)."""

    def to_json(self) -> str:
        return json.dumps(self, separators=(",", ":"), allow_nan=False)


def _layout(title: str, *, below_toolbar: bool = False, **extra) -> dict:
    """The shared layout, `extra` on top; `below_toolbar` moves the title below the hover mode bar."""
    drop = TOOLBAR_PX if below_toolbar else 0
    height = HEIGHT + drop
    layout = {
        "title": {"text": escape_plotly(title), "x": 0.01, "xanchor": "left", "y": round(1 - (5 + drop) / height, 3),
                  "yanchor": "top", "font": {"size": 14}},
        "height": height, "margin": {"l": 48, "r": 16, "t": 40, "b": 40},
        "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)",
        "font": {"family": "Inter, system-ui, sans-serif", "size": 12, "color": "#7c8494"},
        "hoverlabel": {"font": {"family": "ui-monospace, SFMono-Regular, Menlo, monospace", "size": 12}},
        "showlegend": False, "modebar": {"remove": MODEBAR_REMOVE},
    }
    layout.update(extra)
    layout["margin"] = {**layout["margin"], "t": layout["margin"]["t"] + drop}
    return layout


def _axis(title: str, **extra) -> dict:
    return {"title": {"text": title}, "gridcolor": GRID, "zeroline": False, "ticklabeloverflow": "allow", **extra}


def _round(value: float) -> float:
    value = float(value)
    return round(value, 3) if value == value else 0.0  # NaN -> 0


def empty_figure(title: str, message: str = "Fills in as the canvas denoises", *,
                 below_toolbar: bool = False) -> FigureSpec:
    """A placeholder figure with `message` in the middle."""
    return FigureSpec(data=[], layout=_layout(
        title, below_toolbar=below_toolbar, xaxis={"visible": False}, yaxis={"visible": False},
        annotations=[{"text": escape_plotly(message), "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5,
                      "y": 0.5, "font": {"size": 13}}]))


def _block_title(frames: Sequence[Frame], what: str) -> str:
    """`what · block b · step k/N · live` (or `· k steps`, `· stopped at step k`)."""
    last = frames[-1]
    steps = last.step_index + 1
    if last.block_done:
        state = f" \u00b7 {plural(steps, 'step')}"
    elif last.done:
        state = f" \u00b7 stopped at step {steps}"
    else:
        state = f" \u00b7 step {steps}/{last.max_denoising_steps} \u00b7 live"
    return f"{what} \u00b7 block {last.block_index + 1}{state}"


def _legend_line(*lines: str) -> dict:
    """A legend under the title, a line each."""
    return {"text": "<br>".join(escape_plotly(line) for line in lines), "showarrow": False, "align": "left",
            "xref": "paper", "yref": "paper", "x": 0, "y": 1.0, "xanchor": "left", "yanchor": "bottom",
            "font": {"size": 11}}


def _markers(points: list[tuple[int, int]], name: str, **marker) -> dict:
    """A scatter of `marker`s at (position, step row) `points`, no hover."""
    return {"type": "scatter", "mode": "markers", "x": [x for x, _ in points], "y": [y for _, y in points],
            "hoverinfo": "skip", "name": name, "marker": marker}


def confidence_heatmap(frames: Sequence[Frame], *, animate: bool = True, hover: bool = True) -> FigureSpec:
    """Draft confidence per (step, position) of one block's `frames`, accepts and re-melts marked; `hover`: per-cell
    token text (up to `HOVER_CELLS`); `animate`: step slider, play button."""
    if not frames:
        return empty_figure("Confidence per step and position")
    n = frames[0].canvas_length
    steps = len(frames)
    hover = hover and n * steps <= HOVER_CELLS
    z, hover_text, dots, melts = [], [], [], []  # markers at (position, row)
    before = [False] * n
    for row, frame in enumerate(frames, start=1):
        z.append([_round(c) for c in frame.confidence])
        dots += [(pos, row) for pos in range(n) if frame.accepted[pos] and not before[pos]]
        melts += [(pos, row) for pos in range(n) if not frame.accepted[pos] and frame.remelted and frame.remelted[pos]]
        before = frame.accepted
        if hover:
            labels = draft_labels(frame)
            hover_text.append([f"step {row} \u00b7 position {pos}<br>\u201c{escape_plotly(labels[pos])}\u201d "
                               f"{'accepted' if frame.accepted[pos] else 'renoised'}<br>confidence "
                               f"{frame.confidence[pos]:.3f} \u00b7 entropy {frame.entropy[pos]:.3f} nats"
                               for pos in range(n)])
    y = list(range(1, steps + 1))
    # a live block reserves rows for its remaining steps
    rows = steps if frames[-1].block_done or frames[-1].done else max(steps, frames[-1].max_denoising_steps)
    data = [{
        "type": "heatmap", "z": z, "x": list(range(n)), "y": y, "hoverongaps": False,
        **({"hovertext": hover_text, "hovertemplate": "%{hovertext}<extra></extra>"} if hover
           else {"hovertemplate": "step %{y} \u00b7 position %{x}<br>confidence %{z:.3f}<extra></extra>"}),
        "colorscale": PLOTLY_SCALE, "zmin": 0, "zmax": 1,
        "xgap": int(n <= GAP_CELLS), "ygap": int(rows <= GAP_CELLS),
        **({"zsmooth": "fast"} if n > GAP_CELLS and rows > GAP_CELLS else {}),  # one image, crisp cells
        "colorbar": {"title": {"text": "conf."}, "thickness": 10, "len": 0.9, "outlinewidth": 0,
                     "ticklabeloverflow": "allow"},
    }, _markers(dots, "accepted at this step", symbol="circle", size=4 if n * rows <= 64 * 64 else 3,
                color="rgba(255,255,255,0.85)", line={"width": 0.5, "color": "rgba(0,0,0,0.6)"}),
        _markers(melts, "re-melted at this step", symbol="x", size=7, color=REMELT_COLOUR)]
    layout = _layout(
        _block_title(frames, "Confidence per step and position"),
        xaxis=_axis("position", range=[-0.5, n - 0.5], showgrid=False),
        yaxis=_axis("step", range=[rows + 0.5, 0.5], autorange=False, showgrid=False, dtick=math.ceil(rows / 8)),
        annotations=[_legend_line("colour: confidence of the draft token",
                                  "white dot: accepted \u00b7 orange \u00d7: re-melted (was accepted)")],
        margin={"l": 48, "r": 16, "t": 72, "b": 40},
    )
    if animate and steps > 1:
        def cover(k: int) -> list[dict]:
            # always one shape: an empty list would not replace the previous frame's cover
            return [{"type": "rect", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": k + 1.5,
                     "y1": steps + 0.5, "fillcolor": "rgba(128,128,128,0.88)", "line": {"width": 0},
                     "layer": "above", "visible": k < steps - 1}]

        frame_objects = [{"name": f"step {k + 1}", "layout": {"shapes": cover(k), "sliders[0].active": k}}
                         for k in range(steps)]

        def animation(duration: int, redraw: bool = True, **more) -> dict:
            return {"mode": "immediate", **more, "frame": {"duration": duration, "redraw": redraw},
                    "transition": {"duration": 0}}

        stride = math.ceil(steps / SLIDER_STEPS)
        stops = range((steps - 1) % stride, steps, stride)  # the last step always
        layout["sliders"] = [{
            "active": len(stops) - 1,
            "currentvalue": {"prefix": "step ", "font": {"size": 12}, "xanchor": "right"},
            "pad": {"t": 92, "b": 4}, "len": 1.0, "x": 0.0, "y": 0, "ticklen": 3, "minorticklen": 0,
            "font": {"size": 10},
            "steps": [{"label": str(k + 1), "method": "animate", "args": [[frame_objects[k]], animation(0)]}
                      for k in stops]}]  # Plotly shows every n-th label that fits
        layout["updatemenus"] = [{
            "type": "buttons", "direction": "left", "showactive": False, "x": 0.0, "y": 0, "xanchor": "left",
            "yanchor": "top", "pad": {"t": 58, "r": 8}, **BUTTON_STYLE,
            "buttons": [
                {"label": "\u25b6", "method": "animate", "args": [frame_objects, animation(220, fromcurrent=False)]},
                {"label": "\u275a\u275a", "method": "animate", "args": [[None], animation(0, redraw=False)]}]}]
        layout["height"] = HEIGHT + 110
        layout["margin"] = {**layout["margin"], "b": 150}
    return FigureSpec(data=data, layout=layout)


def unmasking_order(frame: Frame | None) -> FigureSpec:
    """Per position, the step it was first accepted at (a short grey bar: not yet), from a block's newest frame."""
    if frame is None:
        return empty_figure("Unmasking order", below_toolbar=True)
    n = frame.canvas_length
    last = max([s for s in frame.first_accepted_step if s >= 0], default=0) + 1  # at least 1
    top = min(max(1, frame.max_denoising_steps), last)
    y, colours, hover = [], [], []
    for pos, (step, label) in enumerate(zip(frame.first_accepted_step, draft_labels(frame))):
        accepted = step is not None and step >= 0
        y.append(step + 1 if accepted else 0.3)
        colours.append(viridis(step / (last - 1) if last > 1 else 0) if accepted else NOT_ACCEPTED_COLOUR)
        when = f"first accepted at step {step + 1}" if accepted else "not accepted yet"
        hover.append(f"position {pos}<br>\u201c{escape_plotly(label)}\u201d<br>{when}")
    data = [{
        "type": "bar", "x": list(range(n)), "y": y, "marker": {"color": colours, "line": {"width": 0}},
        "hovertext": hover, "hovertemplate": "%{hovertext}<extra></extra>",
    }]
    return FigureSpec(data=data, layout=_layout(
        _block_title([frame], "Unmasking order"), below_toolbar=True,
        xaxis=_axis("position", range=[-0.5, n - 0.5]),
        yaxis=_axis("first accepted at step", range=[0, top + 0.5], dtick=math.ceil(top / 6)),
        bargap=0.15,
        annotations=[_legend_line("bar height and colour: step first accepted", "short grey bar: not accepted yet")],
        margin={"l": 48, "r": 16, "t": 72, "b": 40},
    ))


def whole_step(span: int, most: int = 7) -> int:
    """The tick step (1, 2, 5, 10, ...) that puts at most `most` ticks on an axis 0..`span`."""
    return next(m * 10**e for e in range(20) for m in (1, 2, 5) if span <= most * m * 10**e)


def entropy_and_acceptance(frames: Sequence[Frame]) -> FigureSpec:
    """Mean entropy (nats, left axis) and positions accepted (bars, right axis) per step of one block."""
    if not frames:
        return empty_figure("Entropy and acceptance per step", below_toolbar=True)
    steps = list(range(1, len(frames) + 1))
    entropy = [_round(f.mean_entropy) for f in frames]
    accepted = [f.accepted_count for f in frames]
    n = frames[0].canvas_length
    data = [
        {"type": "bar", "x": steps, "y": accepted, "yaxis": "y2", "name": "accepted",
         "marker": {"color": ACCEPTED_COLOUR, "opacity": 0.6, "line": {"width": 0}},
         "hovertemplate": "step %{x}<br>%{y} accepted<extra></extra>"},
        {"type": "scatter", "mode": "lines+markers", "x": steps, "y": entropy, "name": "mean entropy",
         "line": {"color": ENTROPY_COLOUR, "width": 2.5}, "marker": {"size": 5},
         "hovertemplate": "step %{x}<br>mean entropy %{y:.3f} nats<extra></extra>"},
    ]
    return FigureSpec(data=data, layout=_layout(
        _block_title(frames, "Entropy & acceptance"), below_toolbar=True,
        xaxis=_axis("step", range=[0.5, len(frames) + 0.5], tick0=1, dtick=math.ceil(len(frames) / 8)),
        yaxis=_axis("mean entropy (nats)", rangemode="tozero"),
        yaxis2=_axis("accepted positions", overlaying="y", side="right", range=[0, n], showgrid=False,
                     tickmode="linear", tick0=0, dtick=whole_step(n)),
        margin={"l": 52, "r": 52, "t": 64, "b": 40},
        showlegend=True,
        legend={"orientation": "h", "x": 0, "xanchor": "left", "y": 1.0, "yanchor": "bottom",
                "font": {"size": 11}, "bgcolor": "rgba(0,0,0,0)"},
    ))


def block_plots(frames: Sequence[Frame], *, animate: bool = True, hover: bool = True) -> tuple[FigureSpec, ...]:
    """(confidence heatmap, unmasking order, entropy and acceptance) of one block's `frames` (none: placeholders)."""
    return (confidence_heatmap(frames, animate=animate, hover=hover), unmasking_order(frames[-1] if frames else None),
            entropy_and_acceptance(frames))

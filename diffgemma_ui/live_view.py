"""The live view as Gradio outputs, rendered on the server: the finished blocks, the canvas, the meter, the text
and the three plots of a run's snapshot (`render`), the Chat tab's view of a turn."""

from dataclasses import dataclass

import gradio as gr

from engine import Frame

from . import plots
from .canvas_view import STOP_REASONS, block_html, live_html, stack_html, thought_html
from .meter import REFUSED_NOTICE, meter_html, run_meter_html
from .runs import RunSnapshot
from .session import SessionState
from .tab import describe_error
from .text import plain_text


@dataclass(frozen=True)
class StreamOutputs:
    """One render of a run's live view (each a value for its component, or `gr.skip()`)."""

    stack: object
    canvas: object
    meter: object
    text: object
    heatmap: object
    order: object
    entropy: object
    thought: object = ""


def status_text(frame: Frame | None, error: BaseException | None = None) -> str:
    """The status line under the canvas when a run is over."""
    if error is not None:
        return f"The run failed: {describe_error(error)}"
    if frame is None:
        return "Stopped before the first forward."
    if not frame.done or frame.stop_reason == "cancelled":
        return "Stopped: the canvas in progress is not committed."
    return f"Done: {STOP_REASONS.get(frame.stop_reason, frame.stop_reason)}."


def render(engine, session: SessionState, snap: RunSnapshot, *, final: bool, plots_due: bool, first: bool = True,
       stagger: bool = False) -> StreamOutputs:
    """The view of `snap` (`engine` summarizes its text; blocks' HTML cached in `session`); hover text if `final`;
    `stagger`: due live plots go one per render, the heatmap first."""
    finished = snap.finished_blocks()
    for frame in finished[len(session.finished_html):]:
        session.finished_html.append(block_html(frame, live=False))
    latest = snap.latest
    status = status_text(latest, snap.error) if final else "Encoding the prompt\u2026" if latest is None else ""
    skip = gr.skip()
    stack = text = thought = heatmap = order = entropy = skip
    if len(finished) != session.stacked_blocks or final:
        stack = stack_html(finished, finished_html=session.finished_html)
        session.stacked_blocks = len(finished)
    if isinstance(stack, str) or first:  # text and thought change with a committed block
        text = thought = ""
        if latest is not None:
            result = engine.summarize(latest, snap.frames_seen)
            text, thought = plain_text(result.text), thought_html(result.thought)
    canvas = live_html(latest, status=status)
    if plots_due or final:
        heatmap, order, entropy = plots.block_plots(snap.block_frames(), animate=final, hover=final)
        session.pending_plots = [("order", order), ("entropy", entropy)] if stagger and not final else []
        if session.pending_plots:
            order = entropy = skip
    elif session.pending_plots:
        name, figure = session.pending_plots.pop(0)
        order, entropy = (figure, skip) if name == "order" else (skip, figure)
    meter = run_meter_html(latest, committed=finished[-1] if finished else None, final=final)
    return StreamOutputs(stack=stack, canvas=canvas, meter=meter, text=text, heatmap=heatmap, order=order,
                         entropy=entropy, thought=thought)


def refused_meter(session: SessionState | None):
    """After a refusal: the meter of the session's last run marked as refused (skipped: none, or running)."""
    snap = session.snapshot if session is not None else None
    if snap is None or snap.latest is None or session.run_in_progress:
        return gr.skip()
    finished = snap.finished_blocks()
    return meter_html(snap.latest, committed=finished[-1] if finished else None, state="refused",
                      notice=REFUSED_NOTICE)

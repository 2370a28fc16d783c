"""Layout and wiring of the "Keep or replay a run" and step-through controls (handlers: `keep`, `step_through`)."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from engine.trace import MAX_TRACE_BYTES

from .keep import KeepHandlers
from .tab import PRIVATE, guard_stream, shown_refusal

KEEP_HELP = (
    "After each run: its **trace** (JSON: settings, seed, prompt, every decoder forward; see `docs/trace.md`) and an "
    "**offline replay** (one HTML file that plays the run with no model and no network). Upload a trace to replay "
    "it here without running the model."
)


@dataclass
class KeepControls:
    trace_button: gr.DownloadButton
    html_button: gr.DownloadButton
    upload: gr.File
    replay_slider: gr.Slider
    play: gr.Button


def build_keep_controls() -> KeepControls:
    """The keep controls in an accordion, closed, in the current Blocks context."""
    with gr.Accordion("Keep or replay a run", open=False, elem_id="dg-keep"):
        gr.Markdown(KEEP_HELP)
        with gr.Row():
            trace_button = gr.DownloadButton("Download trace (JSON)", interactive=False, elem_id="dg-download-trace")
            html_button = gr.DownloadButton("Download offline replay (HTML)", interactive=False,
                                            elem_id="dg-download-html")
        upload = gr.File(label=f"Replay a trace (.json, up to {MAX_TRACE_BYTES // 2**20} MB)", file_types=[".json"],
                         type="filepath", file_count="single", elem_id="dg-upload-trace", height=110)
        with gr.Row(equal_height=True):
            replay_slider = gr.Slider(1, 2, value=1, step=1, label="Replay: decoder forward", visible=False,
                                      elem_id="dg-replay-step", scale=4)
            play = gr.Button("\u25b6 Play the replay", elem_id="dg-replay-play", scale=1, min_width=120)
    return KeepControls(trace_button, html_button, upload, replay_slider, play)


def wire_keep(controls: KeepControls, keep: KeepHandlers, session, stream_outputs: list, run_events,
              replay_button: gr.Button, box) -> None:
    """Wire downloads after each of `run_events`, the upload, the replay slider and play, and `replay_button`
    into `stream_outputs`; `box` (`tab.refusal_box`) says why not."""
    html, refusal = box
    shown = dict(fn=shown_refusal, inputs=[refusal], outputs=[html], concurrency_limit=None, **PRIVATE)
    for event in run_events:
        event.then(keep.export_files, inputs=[session],
                   outputs=[controls.trace_button, controls.html_button, controls.replay_slider, replay_button],
                   concurrency_limit=2, **PRIVATE)
    replay_button.click(guard_stream(keep.replay_run), inputs=[refusal, session],
                        outputs=[*stream_outputs, controls.replay_slider], concurrency_limit=None,
                        trigger_mode="once", **PRIVATE).then(**shown)
    uploaded = controls.upload.upload(guard_stream(keep.check_upload), inputs=[refusal, session, controls.upload],
                                      outputs=None, concurrency_limit=2, **PRIVATE)
    uploaded.then(**shown)
    uploaded.success(keep.load_upload, inputs=[session, controls.upload], outputs=[
        *stream_outputs, controls.replay_slider, controls.trace_button, controls.html_button], concurrency_limit=2,
                     api_visibility="private", show_progress="minimal")
    controls.replay_slider.input(keep.replay_step, inputs=[session, controls.replay_slider], outputs=stream_outputs,
                                 concurrency_limit=None, trigger_mode="always_last", **PRIVATE)
    controls.play.click(guard_stream(keep.replay_play), inputs=[refusal, session, controls.replay_slider],
                        outputs=[*stream_outputs, controls.replay_slider], concurrency_limit=None,
                        trigger_mode="once", **PRIVATE).then(**shown)


@dataclass
class StepControls:
    next_step: gr.Button
    run_to_end: gr.Button
    replay: gr.Button
    note: gr.Markdown


def build_step_controls() -> StepControls:
    """The step-through buttons and their note in the current Blocks context."""
    with gr.Row(elem_id="dg-step-buttons"):
        next_step = gr.Button("Next step", elem_id="dg-next-step", size="sm", scale=1)
        run_to_end = gr.Button("Run to end", elem_id="dg-run-to-end", size="sm", scale=1)
        replay = gr.Button("\u25b6 Replay", elem_id="dg-replay-run", size="sm", scale=1, interactive=False)
    note = gr.Markdown("Step through a run: **Next step** runs one decoder forward (from the prompt and settings "
                       "above), **Run to end** the rest. **Replay** plays the last run back slowly, one forward "
                       "at a time.", elem_id="dg-step-note")
    return StepControls(next_step, run_to_end, replay, note)


def wire_step_through(controls: StepControls, steps, session, run_inputs: list, stream_outputs: list,
                      stop_button: gr.Button | None = None, box=None) -> None:
    """Wire "Next step" and "Run to end" (in the engine's queue slot); `stop_button` also pauses a "Run to end";
    `box` says why a step was refused."""
    html, refusal = box
    common = dict(inputs=[refusal, session, *run_inputs], outputs=[*stream_outputs, controls.note],
                  api_visibility="private", concurrency_id="engine", show_progress="hidden")
    for button, handler in ((controls.next_step, steps.next_step), (controls.run_to_end, steps.run_to_end)):
        button.click(guard_stream(handler), trigger_mode="once", **common).then(
            shown_refusal, inputs=[refusal], outputs=[html], concurrency_limit=None, **PRIVATE)
    if stop_button is not None:
        stop_button.click(steps.pause, inputs=[session], outputs=[*stream_outputs, controls.note],
                          api_visibility="private", concurrency_limit=None, show_progress="hidden")

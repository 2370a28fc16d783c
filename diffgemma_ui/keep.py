"""Keeping runs: trace and offline-replay downloads, an uploaded trace to the page's player, `/export`."""

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import gradio as gr

from engine.trace import (MAX_TRACE_BYTES, PLAYER_SCRIPTS, Trace, TraceError, load_trace, player_script, trace_of_run,
                          write_replay)

from .feed import frames_message
from .hub import RUN_INPUT_NAMES, Job
from .session import SessionState
from .tab import PRIVATE, UNQUEUED, Tab, api_run, noted, user_error
from .text import plain_text, plural, prose
from .validation import RunRequest

MAX_TRACE_CELLS = MAX_TRACE_BYTES // 40  # bytes per canvas position per decoder forward
PRESENT_SCRIPTS = (*PLAYER_SCRIPTS, "present.js", "live.js")


def check_traceable(settings, canvas_length: int) -> None:
    """ValueError if a run of `settings` could need a trace over `MAX_TRACE_BYTES`."""
    canvases = -(-settings.max_new_tokens // canvas_length)
    cells = canvases * canvas_length * settings.max_denoising_steps
    if cells > MAX_TRACE_CELLS:
        raise ValueError(
            f"a trace keeps every decoder forward: {plural(canvases, 'canvas', 'canvases')} of {canvas_length} "
            f"positions x {plural(settings.max_denoising_steps, 'step')} could exceed the "
            f"{MAX_TRACE_BYTES // 2**20} MB trace limit; lower max_new_tokens or max_denoising_steps")


class KeepHandlers(Tab):
    """Handlers of a session's `request`, `snapshot`, `trace` (replayed or kept) and `keep_dir` (downloads)."""

    def export_files(self, session: SessionState) -> tuple:
        """After a run: write its trace and replay page; updates of both downloads and Replay."""
        hidden = (gr.update(value=None, interactive=False), gr.update(value=None, interactive=False),
                  gr.update(interactive=False))
        snap, request = session.snapshot, session.request
        if snap is None or request is None or snap.latest is None or snap.error is not None or not snap.finished:
            return hidden
        if snap.latest.max_denoising_steps != request.settings.max_denoising_steps:
            return hidden  # a newer run replaced it meanwhile
        try:
            trace = self.run_trace(snap.frames(), request)
        except (TraceError, ValueError) as error:
            gr.Warning(f"This run cannot be kept: {error}")
            return hidden
        session.trace = trace
        return (*self._files(session, trace), gr.update(interactive=True))

    def run_trace(self, frames, run: RunRequest) -> Trace:
        """The trace of `frames`, a run of `run`; ValueError (`check_traceable`), TraceError."""
        check_traceable(run.settings, self.engine.canvas_length)
        return trace_of_run(self.engine, frames, prompt=run.prompt, settings=run.settings, raw=run.raw,
                            thinking=run.thinking)

    def _files(self, session: SessionState, trace: Trace) -> tuple:
        if old := session.keep_dir:
            shutil.rmtree(old, ignore_errors=True)
        folder = Path(tempfile.mkdtemp(prefix="diffgemma-keep-"))
        session.keep_dir = str(folder)
        name = f"diffgemma-seed{trace.seed}"
        paths = trace.save(folder / f"{name}.trace.json"), write_replay(trace, folder / f"{name}.replay.html")
        return tuple(gr.update(value=str(path), interactive=True) for path in paths)

    def check_upload(self, session: SessionState, path) -> None:
        """The upload's check: load the trace (gr.Error: a run in progress, a bad trace)."""
        if path is None or session is None:
            return
        if session.run_in_progress:
            raise user_error("A run is in progress: stop it before replaying a trace.")
        try:
            session.checked_upload = (str(path), load_trace(Path(path)))
        except TraceError as error:
            raise user_error(f"This trace cannot be replayed: {error}") from None

    def load_upload(self, session: SessionState, path) -> tuple:
        """The upload: the trace to the page's player, its text and downloads; gr.Error as `check_upload`."""
        if path is None:
            return (gr.skip(),) * 4
        session = session or SessionState()
        checked = session.checked_upload
        if checked is None or checked[0] != str(path):
            self.check_upload(session, path)
        trace = session.checked_upload[1]
        session.checked_upload = None
        session.trace, session.request, session.step_run = trace, None, None
        session.clear_views()
        frames = list(trace.frames)
        message = frames_message(self.engine, None, frames, 0, final=True, trace=trace)
        session.sent = len(frames)
        return message, plain_text(trace.text), *self._files(session, trace)

    async def export_served(self, *inputs, request: gr.Request = None) -> dict:
        """`/export`: `/generate`'s run as a trace dict; gr.Error: bad input, too long, failed."""
        run = None

        def job() -> Job:
            nonlocal run
            run = self.hub.checked_request(dict(zip(RUN_INPUT_NAMES, inputs)), ui_limits=False)
            check_traceable(run.settings, self.engine.canvas_length)
            return Job("generate", run, run.settings)

        snap = await api_run(self.hub, job, request)
        self.hub.api_result(snap)
        return (await asyncio.to_thread(self.run_trace, snap.frames(), run)).to_dict()


class KeepControls(NamedTuple):
    trace_button: gr.DownloadButton
    html_button: gr.DownloadButton
    upload: gr.File


def build_keep_controls() -> KeepControls:
    with gr.Accordion("Keep or replay a run", open=False, elem_id="dg-keep"):
        gr.Markdown(prose("keep-help"))
        with gr.Row():
            trace_button = gr.DownloadButton("Download trace (JSON)", interactive=False, elem_id="dg-download-trace")
            html_button = gr.DownloadButton("Download offline replay (HTML)", interactive=False,
                                            elem_id="dg-download-html")
        upload = gr.File(label=f"Replay a trace (.json, up to {MAX_TRACE_BYTES // 2**20} MB)", file_types=[".json"],
                         type="filepath", file_count="single", elem_id="dg-upload-trace", height=110)
    return KeepControls(trace_button, html_button, upload)


def wire_keep(controls: KeepControls, keep: KeepHandlers, session, feed, text, run_events, replay_button: gr.Button,
              box) -> None:
    """Wire downloads after `run_events`, the upload (to the player's `feed` and `text`) and `replay_button` (the
    page's player plays its run again); refusals in `box`."""
    for event in run_events:
        event.then(keep.export_files, inputs=[session], concurrency_limit=2, **PRIVATE,
                   outputs=[controls.trace_button, controls.html_button, replay_button])
    replay_button.click(None, js="() => window.dgLive.replay()", **PRIVATE)
    uploaded = noted(controls.upload.upload, keep.check_upload, box, inputs=[session, controls.upload],
                     concurrency_limit=2, **PRIVATE)
    uploaded.failure(lambda: None, outputs=[controls.upload], **UNQUEUED)  # the refused file leaves the box
    uploaded.success(keep.load_upload, inputs=[session, controls.upload],
                     outputs=[feed, text, controls.trace_button, controls.html_button], concurrency_limit=2,
                     api_visibility="private", show_progress="minimal").then(
        lambda: gr.update(interactive=True), outputs=[replay_button], **UNQUEUED)


def present_head() -> str:
    """The page-head script of the player, the presenter overlay and the Playground's live player."""
    return f"<script>{player_script(names=PRESENT_SCRIPTS)}</script>"


def wire_presenter(present: gr.Button) -> None:
    """The `present` button opens the presenter overlay over the page's run."""
    present.click(None, js="() => window.dgPresenter.open()", **PRIVATE)

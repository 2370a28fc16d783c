"""Keeping runs: trace and offline-replay downloads, replaying an uploaded trace, `/export`, the presenter's data."""

import asyncio
import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import gradio as gr

from engine.trace import (MAX_TRACE_BYTES, PLAYER_SCRIPTS, ModelInfo, Trace, TraceError, frame_tokens, load_trace,
                          player_script, replay_data, script_json, trace_of_run, write_replay)

from . import plots
from .canvas_view import live_html, stack_html
from .handlers import STREAM_WIDTH, Job, StreamOutputs, status_text
from .meter import meter_html
from .runs import RunSnapshot
from .session import SessionState
from .tab import PRIVATE, UNQUEUED, Tab, api_run, noted, user_error
from .text import plain_text, plural, prose
from .validation import RunRequest

MAX_TRACE_CELLS = MAX_TRACE_BYTES // 40  # bytes per canvas position per decoder forward
PLAY_INTERVAL_S = 0.25
REPLAY_TOTAL_S, REPLAY_MIN_INTERVAL_S, REPLAY_MAX_INTERVAL_S = 8.0, 0.15, 0.6
PRESENT_SCRIPTS = (*PLAYER_SCRIPTS, "present.js")


def check_traceable(settings, canvas_length: int) -> None:
    """ValueError if a run of `settings` could need a trace over `MAX_TRACE_BYTES`."""
    canvases = -(-settings.max_new_tokens // canvas_length)
    cells = canvases * canvas_length * settings.max_denoising_steps
    if cells > MAX_TRACE_CELLS:
        raise ValueError(
            f"a trace keeps every decoder forward: {plural(canvases, 'canvas', 'canvases')} of {canvas_length} "
            f"positions x {plural(settings.max_denoising_steps, 'step')} could exceed the "
            f"{MAX_TRACE_BYTES // 2**20} MB trace limit; "
            "lower max_new_tokens or max_denoising_steps")


def snapshot_upto(trace: Trace, count: int) -> RunSnapshot:
    """A finished `RunSnapshot` of `trace`'s first `count` frames (clamped to 1..all)."""
    count = max(1, min(int(count), len(trace.frames)))
    blocks = tuple(dataclasses.replace(trace, frames=trace.frames[:count]).blocks)
    return RunSnapshot(frames_seen=count, latest=trace.frames[count - 1], blocks=blocks, finished=True)


def committed_text(trace: Trace, count: int) -> str:
    """The text after `count` frames (before the end: the committed tokens')."""
    if count >= len(trace.frames):
        return plain_text(trace.text)
    ids = trace.frames[max(0, count - 1)].committed_ids
    return plain_text("".join(trace.tokens.get(i, "") for i in ids))


def render_trace(trace: Trace, count: int, *, hover: bool = True, session: SessionState | None = None) -> StreamOutputs:
    """The live view of `trace` after `count` frames (its snapshot kept in `session`); `hover`: heatmap hover text."""
    snap = snapshot_upto(trace, count)
    if session is not None:
        session.snapshot = snap
    latest = snap.latest
    prompt = " ".join(trace.prompt.split())
    prompt = prompt if len(prompt) <= 60 else prompt[:59] + "\u2026"
    status = (f"Replay of a trace ({trace.model.name}, seed {trace.seed}, prompt \u201c{prompt}\u201d) \u00b7 "
              f"forward {snap.frames_seen}/{len(trace.frames)}")
    if snap.frames_seen == len(trace.frames):
        status = f"{status} \u00b7 {status_text(latest)}"
    heatmap, order, entropy = plots.block_plots(snap.block_frames(), hover=hover)
    blocks = snap.block_count
    return StreamOutputs(
        stack=stack_html(snap.finished_blocks()), canvas=live_html(latest, status=status),
        meter=meter_html(latest), text=committed_text(trace, count), heatmap=heatmap, order=order, entropy=entropy,
        block=gr.update(maximum=max(2, blocks), value=max(1, blocks), visible=blocks > 1),
        generate_button=gr.skip(), stop_button=gr.skip(),
    )


class KeepHandlers(Tab):
    """Handlers of a session's `request`, `snapshot`, `trace` (replayed or kept) and `keep_dir` (downloads)."""

    def export_files(self, session: SessionState) -> tuple:
        """After a run: write its trace and replay page; updates of both downloads, replay slider, Replay."""
        hidden = (gr.update(value=None, interactive=False), gr.update(value=None, interactive=False),
                  gr.update(visible=False), gr.update(interactive=False))
        snap, request = session.snapshot, getattr(session, "request", None)
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
        return (*self._files(session, trace), gr.update(visible=False), gr.update(interactive=True))

    def run_trace(self, frames, run: RunRequest) -> Trace:
        """The trace of `frames`, a run of `run`; ValueError (`check_traceable`), TraceError."""
        check_traceable(run.settings, self.engine.canvas_length)
        return trace_of_run(self.engine, frames, prompt=run.prompt, settings=run.settings, raw=run.raw,
                            thinking=run.thinking)

    def _files(self, session: SessionState, trace: Trace) -> tuple:
        if old := getattr(session, "keep_dir", None):
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
        """The upload: the stream outputs, replay slider and downloads; gr.Error as `check_upload`."""
        if path is None:
            return (gr.skip(),) * (STREAM_WIDTH + 3)
        session = session or SessionState()
        checked = getattr(session, "checked_upload", None)
        if checked is None or checked[0] != str(path):
            self.check_upload(session, path)
        trace = session.checked_upload[1]
        session.checked_upload = None
        session.trace, session.request = trace, None
        session.clear_views()
        count = len(trace.frames)
        slider = gr.update(minimum=1, maximum=max(2, count), value=count, visible=True, interactive=count > 1)
        return (*render_trace(trace, count, session=session).as_tuple(), slider, *self._files(session, trace))

    def replay_step(self, session: SessionState, count) -> tuple:
        """The replay slider: the view after `count` forwards."""
        trace = getattr(session, "trace", None)
        if trace is None:
            return (gr.skip(),) * STREAM_WIDTH
        try:
            count = int(count)
        except (TypeError, ValueError):
            count = len(trace.frames)
        return render_trace(trace, count, session=session).as_tuple()

    def replay_play(self, session: SessionState, count, interval_s: float = PLAY_INTERVAL_S) -> Iterator[tuple]:
        """Play from `count` (at the end: the start) to the last forward every `interval_s`; outputs and slider."""
        trace = getattr(session, "trace", None)
        if trace is None:
            raise user_error("Upload a trace first: there is nothing to replay.")
        start = 1 if int(count or 1) >= len(trace.frames) else int(count)
        for k in range(start, len(trace.frames) + 1):
            yield (*render_trace(trace, k, hover=k == len(trace.frames), session=session).as_tuple(), k)
            time.sleep(interval_s)

    def replay_run(self, session: SessionState) -> Iterator[tuple]:
        """Replay: the last run or trace played in about `REPLAY_TOTAL_S`; gr.Error: none."""
        if session is not None and session.run_in_progress:
            raise user_error("A run is in progress: replay it once it has finished.")
        trace = getattr(session, "trace", None)
        if trace is None:
            raise user_error("Nothing to replay yet: generate first.")
        interval = min(REPLAY_MAX_INTERVAL_S, max(REPLAY_MIN_INTERVAL_S, REPLAY_TOTAL_S / len(trace.frames)))
        yield from self.replay_play(session, 1, interval_s=interval)

    async def export_served(self, *inputs, request: gr.Request = None) -> dict:
        """`/export`: `/generate`'s run as a trace dict; gr.Error: bad input, too long, failed."""
        run = None

        def job() -> Job:
            nonlocal run
            run = self.playground.checked_request(*inputs, ui_limits=False)
            check_traceable(run.settings, self.engine.canvas_length)
            return Job("generate", run, run.settings)

        snap = await api_run(self.playground, job, request)
        self.playground.api_result(snap)
        return (await asyncio.to_thread(self.run_trace, snap.frames(), run)).to_dict()


class KeepControls(NamedTuple):
    trace_button: gr.DownloadButton
    html_button: gr.DownloadButton
    upload: gr.File
    replay_slider: gr.Slider
    play: gr.Button


def build_keep_controls() -> KeepControls:
    with gr.Accordion("Keep or replay a run", open=False, elem_id="dg-keep"):
        gr.Markdown(prose("keep-help"))
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
    """Wire downloads after `run_events`, the upload, slider, play and `replay_button`; refusals in `box`."""
    for event in run_events:
        event.then(keep.export_files, inputs=[session],
                   outputs=[controls.trace_button, controls.html_button, controls.replay_slider, replay_button],
                   concurrency_limit=2, **PRIVATE)
    played = dict(outputs=[*stream_outputs, controls.replay_slider], concurrency_limit=None, trigger_mode="once",
                  **PRIVATE)
    noted(replay_button.click, keep.replay_run, box, inputs=[session], **played)
    uploaded = noted(controls.upload.upload, keep.check_upload, box, inputs=[session, controls.upload],
                     concurrency_limit=2, **PRIVATE)
    uploaded.failure(lambda: None, outputs=[controls.upload], **UNQUEUED)  # the refused file leaves the box
    uploaded.success(keep.load_upload, inputs=[session, controls.upload], outputs=[
        *stream_outputs, controls.replay_slider, controls.trace_button, controls.html_button], concurrency_limit=2,
                     api_visibility="private", show_progress="minimal")
    controls.replay_slider.input(keep.replay_step, inputs=[session, controls.replay_slider], outputs=stream_outputs,
                                 concurrency_limit=None, trigger_mode="always_last", **PRIVATE)
    noted(controls.play.click, keep.replay_play, box, inputs=[session, controls.replay_slider], **played)


def present_head() -> str:
    """The page-head script of the player and presenter overlay."""
    return f"<script>{player_script(names=PRESENT_SCRIPTS)}</script>"


def present_chunk(engine, session, have) -> str:
    """JSON of the page's run's frames after `have` ("key:count"): `replay_data` and `key` (null: no run)."""
    snap, trace = getattr(session, "snapshot", None), getattr(session, "trace", None)
    if snap is not None and snap.blocks and not (trace is not None and snap.blocks[0][0] is trace.frames[0]):
        frames, trace = snap.frames(), None  # a run of this app
    else:
        frames = list(trace.frames) if trace is not None else []
    request = getattr(session, "request", None)
    if not frames or (trace is None and request is None):
        return json.dumps({"key": None})
    key = str(id(frames[0]))
    held, _, count = str(have or "").partition(":")
    start = int(count) if held == key and count.isdigit() else 0
    new = frames[start:]
    if not new:
        return json.dumps({"key": key, "frames": []})
    if trace is not None:
        part = dataclasses.replace(trace, frames=tuple(new))
    else:
        ids, kinds = frame_tokens(new)
        part = Trace(model=ModelInfo.of(engine), settings=request.settings, seed=new[-1].seed, prompt=request.prompt,
                     raw=request.raw, prompt_ids=(), tokens={i: engine.token_text(i) for i in ids}, text="",
                     frames=tuple(new), kinds=kinds)
    data = replay_data(part)
    data.update(key=key, prompt_tokens=new[-1].prompt_tokens if trace is None else data["prompt_tokens"])
    return script_json(data)


def wire_presenter(playground, session, present: gr.Button) -> None:
    """The `present` button and the hidden components the presenter polls."""
    present.click(None, js="() => window.dgPresenter.open()", **PRIVATE)
    have = gr.Textbox(visible="hidden", elem_id="dg-present-have")
    chunk = gr.Textbox(visible="hidden", elem_id="dg-present-data")
    poll = gr.Button(visible="hidden", elem_id="dg-present-poll")
    poll.click(lambda s, h: present_chunk(playground.engine, s, h), inputs=[session, have], outputs=[chunk],
               js="(s, h) => [s, window.dgPresenter.have()]", queue=False, **UNQUEUED).then(
        None, [chunk], js="(c) => window.dgPresenter.feed(c)", **PRIVATE)

"""Keeping runs (`KeepHandlers`, laid out by `keep_blocks`): trace and offline-replay downloads, replaying an upload
with the live view's builders from the trace's own token strings (never the loaded tokenizer), the `/export` API."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import gradio as gr

from engine.replay_page import write_replay
from engine.trace import MAX_TRACE_BYTES, Trace, TraceError, load_trace, trace_of_run

from . import plots
from .canvas_view import live_html, stack_html
from .handlers import StreamOutputs, status_text
from .meter import meter_html
from .record import RunSnapshot
from .session import SessionState
from .tab import user_error
from .text import plain_text

MAX_TRACE_CELLS = MAX_TRACE_BYTES // 40  # a trace takes ~40 bytes per canvas position per decoder forward
PLAY_INTERVAL_S = 0.25
REPLAY_TOTAL_S, REPLAY_MIN_INTERVAL_S, REPLAY_MAX_INTERVAL_S = 8.0, 0.15, 0.6
STREAM_WIDTH = len(dataclasses.fields(StreamOutputs))  # components of the live view


def check_traceable(settings, canvas_length: int) -> None:
    """Raise `ValueError` when a run of `settings` could need a trace over the load limit (`MAX_TRACE_BYTES`):
    at most `MAX_TRACE_CELLS` canvas positions x decoder forwards."""
    canvases = -(-settings.max_new_tokens // canvas_length)
    cells = canvases * canvas_length * settings.max_denoising_steps
    if cells > MAX_TRACE_CELLS:
        raise ValueError(
            f"a trace keeps every decoder forward: {canvases} canvas(es) of {canvas_length} positions x "
            f"{settings.max_denoising_steps} steps could exceed the {MAX_TRACE_BYTES // 2**20} MB trace limit; "
            "lower max_new_tokens or max_denoising_steps")


def snapshot_upto(trace: Trace, count: int) -> RunSnapshot:
    """A finished `RunSnapshot` of the first `count` frames of `trace` (at least 1, at most all)."""
    count = max(1, min(int(count), len(trace.frames)))
    blocks = tuple(dataclasses.replace(trace, frames=trace.frames[:count]).blocks)
    return RunSnapshot(frames_seen=count, latest=trace.frames[count - 1], blocks=blocks, finished=True)


def committed_text(trace: Trace, count: int) -> str:
    """The text of the first `count` frames: the run's decoded text once its last frame is reached, before that
    the committed tokens' display strings joined (special tokens included)."""
    if count >= len(trace.frames):
        return plain_text(trace.text)
    ids = trace.frames[max(0, count - 1)].committed_ids
    return plain_text("".join(trace.tokens.get(i, "") for i in ids))


def render_trace(trace: Trace, count: int, *, hover: bool = True) -> StreamOutputs:
    """The playground's view of `trace` after its first `count` frames (what the live view showed then), buttons
    untouched; the block slider points at the newest block; `hover`: the heatmap's per-cell text (off while
    playing, so the heatmap draws as fast as the canvas)."""
    snap = snapshot_upto(trace, count)
    latest = snap.latest
    finished = snap.finished_blocks()
    live = latest if not latest.block_done else None
    prompt = " ".join(trace.prompt.split())
    prompt = prompt if len(prompt) <= 60 else prompt[:59] + "\u2026"
    status = (f"Replay of a trace ({trace.model.name}, seed {trace.seed}, prompt \u201c{prompt}\u201d) \u00b7 "
              f"forward {snap.frames_seen}/{len(trace.frames)}")
    if snap.frames_seen == len(trace.frames):
        status = f"{status} \u00b7 {status_text(latest)}"
    frames = snap.block_frames()
    blocks = snap.block_count
    return StreamOutputs(
        stack=stack_html(finished), canvas=live_html(live, newest=latest, status=status),
        meter=meter_html(latest), text=committed_text(trace, count),
        heatmap=plots.confidence_heatmap(frames, animate=True, hover=hover),
        order=plots.unmasking_order(frames[-1]), entropy=plots.entropy_and_acceptance(frames),
        block=gr.update(maximum=max(2, blocks), value=max(1, blocks), visible=blocks > 1),
        generate_button=gr.skip(), stop_button=gr.skip(),
    )


class KeepHandlers:
    """Handlers bound to a `handlers.Playground`; they use `session.request` (the last run's), `snapshot`, `trace`
    (replayed, or the last run's once exported) and `keep_dir` (the session's download folder, replaced each time)."""

    def __init__(self, playground):
        self.playground = playground
        self.engine = playground.engine

    # -- downloads after a run -----------------------------------------------------------------------------------
    def export_files(self, session: SessionState) -> tuple:
        """After a run: write its trace and offline replay and keep the trace; returns the two download buttons'
        updates (emptied when there is nothing to keep), the replay slider's (hidden) and the Replay button's."""
        hidden = (gr.update(value=None, interactive=False), gr.update(value=None, interactive=False),
                  gr.update(visible=False), gr.update(interactive=False))
        snap = getattr(session, "snapshot", None)
        request = getattr(session, "request", None)
        if snap is None or request is None or snap.latest is None or snap.error is not None or not snap.finished:
            return hidden
        if snap.latest.max_denoising_steps != request.settings.max_denoising_steps:
            return hidden  # not this request's run (a newer one replaced it meanwhile)
        try:
            check_traceable(request.settings, self.engine.canvas_length)
            frames = [frame for block in snap.blocks for frame in block]
            trace = trace_of_run(self.engine, frames, prompt=request.prompt, settings=request.settings,
                                 raw=request.raw, thinking=getattr(request, "thinking", False))
        except (TraceError, ValueError) as error:
            gr.Warning(f"This run cannot be kept: {error}")
            return hidden
        session.trace = trace
        return (*self._files(session, trace), gr.update(visible=False), gr.update(interactive=True))

    def _files(self, session: SessionState, trace: Trace) -> tuple:
        old = getattr(session, "keep_dir", None)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        folder = Path(tempfile.mkdtemp(prefix="diffgemma-keep-"))
        session.keep_dir = str(folder)
        name = f"diffgemma-seed{trace.seed}"
        trace_path = trace.save(folder / f"{name}.trace.json")
        html_path = write_replay(trace, folder / f"{name}.replay.html")
        return (gr.update(value=str(trace_path), interactive=True), gr.update(value=str(html_path), interactive=True))

    # -- replaying an uploaded trace -----------------------------------------------------------------------------
    def check_upload(self, session: SessionState, path) -> None:
        """The upload's first step: check the trace, kept for `load_upload` (raises gr.Error: a run in progress, or
        `load_trace`'s message)."""
        if path is None or session is None:
            return
        if session.run_in_progress:
            raise user_error("A run is in progress: stop it before replaying a trace.")
        try:
            session.checked_upload = (str(path), load_trace(Path(path)))
        except TraceError as error:
            raise user_error(f"This trace cannot be replayed: {error}") from None

    def load_upload(self, session: SessionState, path) -> tuple:
        """The trace upload: show the whole run; returns the stream outputs, then the replay slider's and the two
        download buttons' updates. Raises gr.Error as `check_upload`."""
        if path is None:
            return tuple(gr.skip() for _ in range(STREAM_WIDTH + 3))
        if session is None:
            session = SessionState()
        checked = getattr(session, "checked_upload", None)
        if checked is not None and checked[0] == str(path):
            trace = checked[1]
        else:
            self.check_upload(session, path)
            trace = session.checked_upload[1]
        session.checked_upload = None
        session.trace, session.request = trace, None
        session.finished_html, session.stacked_blocks = [], -1  # the live view's caches belong to the last run
        count = len(trace.frames)
        session.snapshot = snapshot_upto(trace, count)
        slider = gr.update(minimum=1, maximum=max(2, count), value=count, visible=True, interactive=count > 1)
        return (*render_trace(trace, count).as_tuple(), slider, *self._files(session, trace))

    def replay_step(self, session: SessionState, count) -> tuple:
        """The replay slider: the view after `count` decoder forwards of the trace being replayed."""
        trace = getattr(session, "trace", None)
        if trace is None:
            return tuple(gr.skip() for _ in range(STREAM_WIDTH))
        try:
            count = int(count)
        except (TypeError, ValueError):
            count = len(trace.frames)
        session.snapshot = snapshot_upto(trace, count)
        return render_trace(trace, count).as_tuple()

    def replay_play(self, session: SessionState, count, interval_s: float = PLAY_INTERVAL_S) -> Iterator[tuple]:
        """The replay's play button: step from `count` (from the start when at the end) to the last forward, one
        render every `interval_s` seconds; yields the stream outputs then the slider's value."""
        trace = getattr(session, "trace", None)
        if trace is None:
            raise user_error("Upload a trace first: there is nothing to replay.")
        start = 1 if int(count or 1) >= len(trace.frames) else int(count)
        for k in range(start, len(trace.frames) + 1):
            session.snapshot = snapshot_upto(trace, k)
            yield (*render_trace(trace, k, hover=k == len(trace.frames)).as_tuple(), k)
            time.sleep(interval_s)

    def replay_run(self, session: SessionState) -> Iterator[tuple]:
        """The Replay button: play the last run (or the loaded trace) from its first forward, each forward shown
        `REPLAY_TOTAL_S` / forwards seconds (0.15-0.6 s); yields as `replay_play`. Raises gr.Error: nothing to
        replay."""
        if session is not None and session.run_in_progress:
            raise user_error("A run is in progress: replay it once it has finished.")
        trace = getattr(session, "trace", None)
        if trace is None:
            raise user_error("Nothing to replay yet: generate first.")
        interval = min(REPLAY_MAX_INTERVAL_S, max(REPLAY_MIN_INTERVAL_S, REPLAY_TOTAL_S / len(trace.frames)))
        yield from self.replay_play(session, 1, interval_s=interval)

    # -- /export -------------------------------------------------------------------------------------------------
    async def export_served(self, *inputs, request: gr.Request = None) -> dict:
        """`/export`: the `/generate` inputs run to the end (stopped as `/generate`'s), returned as a trace dict
        (`docs/trace.md`). Raises gr.Error: invalid input, a run too long for a trace, an engine failure."""
        kept = {}

        def start():
            kept["run"] = run = self.playground.checked_request(*inputs, ui_limits=False)
            try:
                check_traceable(run.settings, self.engine.canvas_length)
            except ValueError as error:
                raise user_error(str(error)) from None
            return self.playground.start_run(run, keep_history=True)

        snap = await self.playground.served(start, request)
        run = kept["run"]
        self.playground._api_result(snap)  # raises gr.Error for a failed run
        frames = [frame for block in snap.blocks for frame in block]
        trace = await asyncio.to_thread(trace_of_run, self.engine, frames, prompt=run.prompt, settings=run.settings,
                                        raw=run.raw, thinking=getattr(run, "thinking", False))
        return trace.to_dict()

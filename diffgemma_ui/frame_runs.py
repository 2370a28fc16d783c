"""Running a ready frame iterator (a chat turn, an infill) in a `worker.RunWorker` under the playground's limits
and `RunRegistry`, for the Chat and Infill tabs and their APIs."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import gradio as gr

from .handlers import describe_error
from .record import RunSnapshot
from .worker import RunWorker


def start_frames(playground, frames: Iterator, stop: threading.Event, key: str, *,
                 keep_history: bool = True) -> RunWorker:
    """Start a worker over `frames` (created with `stop` as its stop event), with the playground's abandon and time
    limits, registered as `key` in its registry (a key `<session>:...` is stopped when that tab closes). The caller
    unregisters it (`finish`)."""
    worker = RunWorker(lambda _stop: frames, stop_event=stop, keep_history=keep_history,
                       abandon_after_s=playground.abandon_after_s, time_limit_s=playground.max_run_s).start()
    playground.registry.register(key, worker)
    return worker


def finish(playground, key: str, worker: RunWorker) -> None:
    """Stop `worker` (if still running) and drop it from the registry."""
    worker.stop()
    playground.registry.unregister(key, worker)


def run_api_frames(playground, frames: Iterator, stop: threading.Event, request) -> RunSnapshot:
    """Run `frames` to the end for an API call, registered under the caller's session (`<session>:api:<n>`), and
    return the final snapshot.

    Raises:
        gr.Error: the run failed (the message of `handlers.describe_error`).
    """
    key = f"{getattr(request, 'session_hash', None) or 'anon'}:api:{id(frames)}"
    worker = start_frames(playground, frames, stop, key, keep_history=False)
    try:
        snap = worker.wait()
    finally:
        finish(playground, key, worker)
    if snap.error is not None:
        raise gr.Error(describe_error(snap.error), print_exception=False)
    return snap

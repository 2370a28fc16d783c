"""The one run mechanism: every tab's model work is a frame source iterated in a worker thread into a record.

`RunWorker` owns one run: a daemon thread pulls items from a frame source (`DiffusionEngine.frames`, a chat turn,
an infill, a race or a comparison) into a record; `updates()` yields coalesced snapshots. Stop, a closed tab (no
reader for `abandon_after_s`, or `Runner.unload`), an abandoned API call (`Runner.api_served`) and the server's time
limit all end a run here. `Runner` starts every run of an app (on ZeroGPU through its `place` hook, in the GPU
process) and keeps which session runs what.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator

import torch
from gradio.context import LocalContext

from engine import Frame

from .record import RunRecord, RunSnapshot

FrameSource = Callable[[threading.Event], Iterator[Frame]]
DEFAULT_MAX_FPS = 15.0
# Chips the browser redraws per second at most: headless Chromium with software raster on the 2-core CPU showed
# 6.6-9.1 of 15 updates/s at 256 positions and 14.2 at 64 (benchmarks/browser_canvas_cost.py), so the default live
# rate falls from 15 updates/s to 7 at the real checkpoint's 256-position canvas instead of letting updates queue
LIVE_POSITIONS_PER_SECOND = 1800.0
DEFAULT_READER_BUDGET = 0.05  # the UI may take at most 5% of wall time: the meter must show >= 95% of bare speed
STOP_GRACE_S = 2.0  # after Stop, frames already on their way (ZeroGPU pipes them across) are read this long
LOG = logging.getLogger(__name__)


def default_live_rate(canvas_length: int) -> float:
    """Live renders per second for a canvas of `canvas_length` positions: `DEFAULT_MAX_FPS` (15/s) up to 120
    positions, then `LIVE_POSITIONS_PER_SECOND / canvas_length` (256 positions: 7.0/s), never below 2/s.

    Raises:
        ValueError: `canvas_length` below 1.
    """
    if canvas_length < 1:
        raise ValueError(f"canvas_length must be at least 1, got {canvas_length}")
    return max(2.0, min(DEFAULT_MAX_FPS, LIVE_POSITIONS_PER_SECOND / canvas_length))


class RunTimeLimitExceeded(RuntimeError):
    """A run went past the server's time limit per run and was stopped; the blocks it committed are kept."""


def time_limit_error(limit_s: float, forwards: int, *, blocks_kept: bool = True) -> RunTimeLimitExceeded:
    """The error of a run stopped at the server's limit of `limit_s` seconds per run after `forwards` decoder
    forwards; `blocks_kept`: the message says its finished blocks are kept (they are shown)."""
    kept = " (finished blocks are kept)" if blocks_kept else ""
    return RunTimeLimitExceeded(f"the run reached this server's limit of {limit_s:g} s per run and was stopped after "
                                f"{forwards} decoder forwards{kept}: lower max_new_tokens or max_denoising_steps")


def is_out_of_memory(error: BaseException | None) -> bool:
    """Whether `error` is the device (`torch.OutOfMemoryError`) or the host (`MemoryError`) running out of memory."""
    return isinstance(error, (MemoryError, torch.OutOfMemoryError))


def release_memory() -> None:
    """Collect garbage and hand cached accelerator memory back (after an out-of-memory run)."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        torch.mps.empty_cache()


def _without_tracebacks(error: BaseException) -> BaseException:
    """`error` with the tracebacks of it and its causes dropped: a traceback keeps the failed run's frames, and with
    them its tensors (KV cache, logits), alive for as long as the error is kept (in the record, for the reader)."""
    seen = set()
    current = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = None
        current = current.__cause__ or current.__context__
    return error


class RunWorker:
    """One generation running in a background thread.

    Args:
        source: called once in the worker thread with the run's stop event; returns the frame iterator. Exceptions
            it raises (e.g. ValueError for a bad prompt) end the run and are reported in the final snapshot.
        keep_history: keep every frame (for the plots); False keeps only the newest (for the API).
        abandon_after_s: stop the run when no reader has polled for this many seconds (None: never).
        time_limit_s: stop the run once it has run this many seconds (None: never); it then ends with a
            `RunTimeLimitExceeded` error saying so, after the engine's final frame.
        stop_event: the run's stop signal (default: a new `threading.Event`); anything with `set()` and
            `is_set()`, e.g. `zerogpu.StopFlag`, which also reaches a run in another process.
        record: where the items go (default: a `RunRecord` of frames); anything with `add`, `finish`, `count`,
            `finished` and `snapshot`, e.g. a race's record of (side, frame) items.
    """

    def __init__(self, source: FrameSource, *, keep_history: bool = True, abandon_after_s: float | None = 30.0,
                 time_limit_s: float | None = None, stop_event: threading.Event | None = None, record=None):
        self.stop_event = threading.Event() if stop_event is None else stop_event
        self.record = RunRecord(keep_history=keep_history) if record is None else record
        self.abandon_after_s = abandon_after_s
        self.time_limit_s = time_limit_s
        self._source = source
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._last_poll = time.monotonic()

    # -- control -------------------------------------------------------------------------------------------------
    def start(self) -> "RunWorker":
        """Start the worker thread (once); returns self."""
        if self._thread is not None:
            raise RuntimeError("this run was already started")
        self._last_poll = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="diffgemma-run", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the run to stop: sets `stop_event` (the engine yields a final "cancelled" frame within a forward)."""
        self.stop_event.set()
        with self._changed:
            self._changed.notify_all()

    @property
    def running(self) -> bool:
        """The worker thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the worker thread to end; returns whether it has."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running

    # -- worker thread -------------------------------------------------------------------------------------------
    def _run(self) -> None:
        error: BaseException | None = None
        iterator = None
        self._started = time.monotonic()
        self._after_stop, self._stopped_at, self._timed_out = 0, None, False
        try:
            iterator = self._source(self.stop_event)
            for frame in iterator:
                if self.take(frame):
                    break
        except BaseException as exc:  # noqa: BLE001 - reported to the reader, never lost in a thread
            if not isinstance(exc, ValueError):  # the operator gets the traceback; the user only the message
                # As text: a log record holding the traceback object would keep the failed run's tensors alive
                LOG.error("run failed: %s", "".join(traceback.format_exception(exc)).rstrip())
            error = _without_tracebacks(exc)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001
                    pass
            iterator = close = None
            if self._timed_out and error is None:
                error = time_limit_error(self.time_limit_s, self.record.count)
            if is_out_of_memory(error):
                release_memory()
            self.record.finish(error)
            with self._changed:
                self._changed.notify_all()

    def take(self, frame) -> bool:
        """Record one item of the run (in the worker thread); returns whether the run is over: its final frame, or
        a source that went on for `STOP_GRACE_S` after Stop."""
        self.record.add(frame)
        with self._changed:
            self._changed.notify_all()
        if getattr(frame, "done", False):
            return True
        now = time.monotonic()
        if self.abandon_after_s is not None and now - self._last_poll > self.abandon_after_s:
            self.stop_event.set()
        if self.time_limit_s is not None and now - self._started > self.time_limit_s:
            self._timed_out = True
            self.stop_event.set()
        if self.stop_event.is_set():
            # The engine yields one more frame (cancelled) at most one forward later, after the frames it had
            # already sent; a source that ignores the event is closed instead.
            self._after_stop += 1
            self._stopped_at = self._stopped_at or now
            return self._after_stop >= 2 and now - self._stopped_at > STOP_GRACE_S
        return False

    # -- readers -------------------------------------------------------------------------------------------------
    def snapshot(self) -> RunSnapshot:
        """The run right now (counts as a poll)."""
        self._last_poll = time.monotonic()
        return self.record.snapshot()

    def updates(self, max_fps: float = DEFAULT_MAX_FPS, poll_s: float = 0.2,
                reader_budget: float | None = DEFAULT_READER_BUDGET) -> Iterator[RunSnapshot]:
        """Coalesced snapshots: at most `max_fps` per second, each with the newest frame, the final one always.

        Frames that arrive between two snapshots are not lost (they are in the record), only not rendered one by
        one. `reader_budget` caps the share of wall time the reader spends on snapshots (rendering, and in the app
        Gradio's postprocessing and sending, measured from each `yield` to the next request, smoothed): the gap
        between snapshots stretches to `reader_time / reader_budget`, so on a small CPU the UI's work cannot slow
        the engine, which shares the CPU, by more than that share (None: only `max_fps` limits). Ends after
        yielding the snapshot with `finished=True`; neither it nor the first frame is ever held back. Waiting here
        counts as polling, so a run is only abandoned when its reader stops iterating.
        """
        interval = 1.0 / max_fps if max_fps and max_fps > 0 else 0.0
        seen = -1
        next_allowed = 0.0
        reader_s = None  # smoothed seconds the reader spends per snapshot
        while True:
            with self._changed:
                while self.record.count == seen and not self.record.finished:
                    self._last_poll = time.monotonic()
                    self._changed.wait(poll_s)
                # Rate limit: wait out the interval unless the run finishes meanwhile
                while not self.record.finished:
                    delay = next_allowed - time.monotonic()
                    if delay <= 0:
                        break
                    self._last_poll = time.monotonic()
                    self._changed.wait(min(delay, poll_s))
            snap = self.snapshot()
            if snap.frames_seen == seen and not snap.finished:
                continue
            seen = snap.frames_seen
            yielded_at = time.monotonic()
            yield snap
            self._last_poll = now = time.monotonic()
            if snap.finished:
                return
            if snap.latest is None:  # the "encoding the prompt" view: never hold the first frame back
                continue
            spent = now - yielded_at
            reader_s = spent if reader_s is None else 0.7 * reader_s + 0.3 * spent
            gap = max(interval, reader_s / reader_budget) if reader_budget else interval
            next_allowed = yielded_at + gap

    def wait(self, timeout: float | None = None, poll_s: float = 0.5) -> RunSnapshot:
        """Block until the run is over (or `timeout` seconds pass) and return the snapshot."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self.record.finished:
                self._last_poll = time.monotonic()
                remaining = poll_s if deadline is None else min(poll_s, deadline - time.monotonic())
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
        return self.snapshot()


class RunRegistry:
    """Which worker each browser session is running (one registry per app, not module state).

    Used to stop a session's run when its tab closes (Gradio's unload event) and to count active runs.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._runs: dict[str, RunWorker] = {}

    def register(self, key: str, worker: RunWorker) -> None:
        """Record `worker` as session `key`'s run, stopping any run it had before."""
        with self._lock:
            previous = self._runs.get(key)
            self._runs[key] = worker
        if previous is not None and previous is not worker:
            previous.stop()

    def unregister(self, key: str, worker: RunWorker) -> None:
        """Forget `worker` if it is still session `key`'s run."""
        with self._lock:
            if self._runs.get(key) is worker:
                del self._runs[key]

    def stop(self, key: str) -> bool:
        """Stop session `key`'s runs: its live run and its API runs (registered as `key:...`); returns whether there
        were any."""
        with self._lock:
            keys = [k for k in self._runs if k == key or k.startswith(f"{key}:")]
            workers = [self._runs.pop(k) for k in keys]
        for worker in workers:
            worker.stop()
        return bool(workers)

    def active(self) -> int:
        """Runs whose thread is still alive."""
        with self._lock:
            return sum(1 for w in self._runs.values() if w.running)


DEFAULT_MAX_RUN_S = 300.0  # no single run (UI or API) holds the engine for longer
API_WAIT_S = 0.25  # how long a served API call waits on its run before checking that its client is still there
STOP_WAIT_S = 10.0  # Stop waits this long at most for the run's last frame (one decoder forward)
# How long after a tab closed Gradio's record of it is dropped: every unload handler of the app has run by then
DROP_DELAY_S = 5.0


def pushed(run: Callable[[Callable[[object], None]], object]) -> Iterator:
    """The items a callback-style mode hands to `emit` (`run(emit)`, run in a helper thread), as an iterator, then
    what `run` returns as the last item; an exception `run` raises is raised here."""
    items: queue.Queue = queue.Queue()

    def target() -> None:
        try:
            items.put((True, run(lambda item: items.put((False, item)))))
        except BaseException as error:  # noqa: BLE001 - raised again in the reader
            items.put((None, error))

    threading.Thread(target=target, name="diffgemma-pushed", daemon=True).start()
    while True:
        last, item = items.get()
        if last is None:
            raise item
        yield item
        if last:
            return


class ClientGone(RuntimeError):
    """The client of a served API call went away; its run was stopped."""


def job_alive_check() -> Callable[[], bool]:
    """A function answering whether the current Gradio job's client is still there (call it in the handler's own
    context, where Gradio set the job's event id; the returned function may be called from anywhere).

    Gradio marks a job `alive = False` when its client goes away (a dropped result stream, a closed client) but
    only checks it between two outputs of a generator; outside a queued job this always answers True.
    """
    blocks = LocalContext.blocks.get(None)
    event_id = LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    if queue is None or event_id is None:
        return lambda: True

    def alive() -> bool:
        event = queue.event_ids_to_events.get(event_id)
        return event is None or bool(getattr(event, "alive", True))

    return alive


def session_key(request, fallback: object, suffix: str = "") -> str:
    """The registry key of a session's run: its session hash (or `anon-<id of fallback>`) and `suffix`."""
    return f"{getattr(request, 'session_hash', None) or f'anon-{id(fallback)}'}{suffix}"


class Runner:
    """Starts every run of one app and keeps which session runs what (one per app, not module state).

    Args:
        max_fps: most live renders per second; reader_budget: most share of wall time the live view may take
            (see `RunWorker.updates`); abandon_after_s: a run without a reader for this long stops itself;
        max_run_s: a run (UI or API) that lasts longer is stopped with a clear error (None: no limit).
    """

    def __init__(self, *, max_fps: float, reader_budget: float | None = DEFAULT_READER_BUDGET,
                 abandon_after_s: float = 30.0, max_run_s: float | None = DEFAULT_MAX_RUN_S):
        self.max_fps = max_fps
        self.reader_budget = reader_budget
        self.abandon_after_s = abandon_after_s
        self.max_run_s = max_run_s
        self.registry = RunRegistry()
        self.closed_sessions = None  # set by build_app: a `ClosedSessionDropper`

    def start(self, source: FrameSource, key: str | None = None, *, keep_history: bool = True, stop_event=None,
              record=None, limit_s: float | None = None) -> RunWorker:
        """Start `source` in a `RunWorker` under the app's limits, registered as `key` (None: not registered; a key
        `<session>...` is stopped when that tab closes); `record`: as `RunWorker`'s; `limit_s`: a tighter
        time limit for this run (ZeroGPU's granted time). The caller ends it with `finish`."""
        limits = [limit for limit in (self.max_run_s, limit_s) if limit is not None]
        worker = RunWorker(source, keep_history=keep_history, abandon_after_s=self.abandon_after_s,
                           time_limit_s=min(limits) if limits else None, stop_event=stop_event,
                           record=record).start()
        if key is not None:
            self.registry.register(key, worker)
        return worker

    def finish(self, key: str | None, worker: RunWorker) -> None:
        """Stop `worker` (if still running) and drop it from the registry."""
        worker.stop()
        if key is not None:
            self.registry.unregister(key, worker)

    def updates(self, worker: RunWorker) -> Iterator[RunSnapshot]:
        """`worker`'s coalesced snapshots at the app's live rate and reader budget."""
        return worker.updates(self.max_fps, reader_budget=self.reader_budget)

    async def served(self, start: Callable[[], RunWorker], request) -> RunSnapshot:
        """An API call's run to its end: `start()` (in a thread: it validates and may block) starts it; it is
        registered under the caller's session (`<session>:api:<n>`, stopped through `unload` when the client
        disconnects) and waited on in a thread, so its end is seen at once and a cancelled job or a dropped result
        stream stops it within `API_WAIT_S`. Returns the final snapshot.

        Raises:
            ClientGone: the client went away (the run is stopped).
        """
        client_alive = job_alive_check()
        worker = await asyncio.to_thread(start)
        key = f"{getattr(request, 'session_hash', None) or 'anon'}:api:{id(worker)}"
        self.registry.register(key, worker)
        try:
            snap = worker.snapshot()
            while not snap.finished:  # woken by the run's own end, not by a timer
                snap = await asyncio.to_thread(worker.wait, API_WAIT_S)
                if not snap.finished and not client_alive():
                    raise ClientGone("the client went away: run stopped")
        finally:
            self.finish(key, worker)
        return snap

    def unload(self, session_hash: str | None) -> None:
        """A tab closed: stop its session's runs and have Gradio's record of it dropped a few seconds later."""
        if session_hash:
            self.registry.stop(session_hash)
            if self.closed_sessions is not None:
                self.closed_sessions.closed(session_hash)


class ClosedSessionDropper:
    """Drops Gradio's own record of each closed session `delay_s` seconds after its tab closed.

    Gradio keeps one record per session hash in `blocks.state_holder.session_data` (every component's last value)
    until 10,000 later sessions have come; this drops a closed tab's at once. A queued event of a closed session
    that starts after the drop makes a fresh, empty record.
    """

    def __init__(self, blocks, delay_s: float = DROP_DELAY_S):
        self.blocks = blocks
        self.delay_s = delay_s

    def closed(self, session_hash: str) -> None:
        """The tab of `session_hash` closed: drop its record after the delay (in a daemon timer thread)."""
        timer = threading.Timer(self.delay_s, self.drop, args=(session_hash,))
        timer.daemon = True
        timer.start()

    def drop(self, session_hash: str) -> bool:
        """Drop the record of `session_hash` now; returns whether there was one."""
        holder = getattr(self.blocks, "state_holder", None)
        if holder is None:
            return False
        with holder.lock:
            record = holder.session_data.pop(session_hash, None)
            holder.time_last_used.pop(session_hash, None)
        return record is not None

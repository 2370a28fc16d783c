"""The one run mechanism: `RunWorker` threads read frame sources into records; `Runner` starts and ends them."""

import asyncio
import contextlib
import gc
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import gradio as gr
import torch
from gradio.context import LocalContext

from engine import Frame

FrameSource = Callable[[threading.Event], Iterator[Frame]]
DEFAULT_MAX_FPS = 15.0
LIVE_POSITIONS_PER_SECOND = 3840.0  # chips a browser redraws per second at most (docs/design.md)
DEFAULT_READER_BUDGET = 0.05  # the live view's largest share of wall time
MAX_LIVE_GAP_S = 2.0  # a slow reader still renders at least this often
STOP_GRACE_S = 2.0  # after Stop, frames already on their way are read this long
DEFAULT_MAX_RUN_S = 300.0
API_WAIT_S = 0.25  # a served API call checks its client this often
STOP_WAIT_S = 10.0  # the most Stop waits, in all, for the run and its stream to end
DROP_DELAY_S = 5.0  # a closed tab's Gradio record is dropped this long after
LOG = logging.getLogger(__name__)


def default_live_rate(canvas_length: int) -> float:
    """Live renders a second for `canvas_length`: 15 up to 256, then 3840 / length, at least 2; ValueError below 1."""
    if canvas_length < 1:
        raise ValueError(f"canvas_length must be at least 1, got {canvas_length}")
    return max(2.0, min(DEFAULT_MAX_FPS, LIVE_POSITIONS_PER_SECOND / canvas_length))


@dataclass(frozen=True)
class RunSnapshot:
    """A run at one moment: frames seen, the latest frame, each block's frames, finished, its error."""

    frames_seen: int = 0
    latest: Frame | None = None
    blocks: tuple[tuple[Frame, ...], ...] = ()
    finished: bool = False
    error: BaseException | None = None

    @property
    def block_count(self) -> int:
        return len(self.blocks)

    def block_frames(self, block: int | None = None) -> tuple[Frame, ...]:
        """Frames of block `block` (default: the newest; clamped); () if none."""
        if not self.blocks:
            return ()
        return self.blocks[-1 if block is None else max(0, min(int(block), len(self.blocks) - 1))]

    def finished_blocks(self) -> list[Frame]:
        """The last frame of every finished block, in order."""
        return [frames[-1] for frames in self.blocks if frames and frames[-1].block_done]

    def frames(self) -> list[Frame]:
        return [frame for block in self.blocks for frame in block]


@dataclass
class RunRecord:
    """A run's frames, appended by one writer, read by any readers; `count` frames so far."""

    keep_history: bool = True
    count: int = 0
    finished: bool = False
    _frozen: tuple[tuple[Frame, ...], ...] = ()  # blocks before the newest (no longer changing)
    _current: list[Frame] = field(default_factory=list)
    _latest: Frame | None = None
    _error: BaseException | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, frame: Frame) -> None:
        """Append a frame; a new `block_index` opens a block, a repeated forward marked cancelled replaces the last."""
        with self._lock:
            if self.keep_history:
                if (frame.stop_reason == "cancelled" and self._current
                        and self._current[-1].forward_index == frame.forward_index):
                    self._current[-1] = frame
                elif self._current and frame.block_index != self._current[-1].block_index:
                    self._frozen = self._frozen + (tuple(self._current),)
                    self._current = [frame]
                else:
                    self._current.append(frame)
            self._latest = frame
            self.count += 1

    def finish(self, error: BaseException | None = None) -> None:
        with self._lock:
            self.finished = True
            self._error = error

    def snapshot(self) -> RunSnapshot:
        with self._lock:
            return RunSnapshot(frames_seen=self.count, latest=self._latest,
                               blocks=self._frozen + ((tuple(self._current),) if self._current else ()),
                               finished=self.finished, error=self._error)


class RunTimeLimitExceeded(RuntimeError):
    """A run went past the server's time limit and was stopped (its committed blocks kept)."""


def is_out_of_memory(error: BaseException | None) -> bool:
    return isinstance(error, (MemoryError, torch.OutOfMemoryError))


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    elif torch.backends.mps.is_available():
        torch.mps.empty_cache()


class RunWorker:
    """`source(stop_event)` read into `record` in a thread, stopped unread `abandon_after_s` or past `time_limit_s`
    (`stop_event`: any object with `set` and `is_set`)."""

    def __init__(self, source: FrameSource, *, keep_history: bool = True, abandon_after_s: float | None = 30.0,
                 time_limit_s: float | None = None, stop_event: threading.Event | None = None, record=None):
        self.stop_event = threading.Event() if stop_event is None else stop_event
        self.record = RunRecord(keep_history=keep_history) if record is None else record
        self.abandon_after_s, self.time_limit_s = abandon_after_s, time_limit_s
        self._source = source
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._last_poll = time.monotonic()

    def start(self) -> "RunWorker":
        self._last_poll = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="diffgemma-run", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the run to stop (within a forward, with a final "cancelled" frame)."""
        self.stop_event.set()
        self._notify()

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        """Whether the worker thread ended, after waiting up to `timeout` s."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running

    def _run(self) -> None:
        """Record the source's items to its final frame, or `STOP_GRACE_S` and two items past Stop."""
        error: BaseException | None = None
        iterator = None
        started, after_stop, stopped_at, timed_out = time.monotonic(), 0, None, False
        try:
            iterator = self._source(self.stop_event)
            for frame in iterator:
                self.record.add(frame)
                self._notify()
                if getattr(frame, "done", False):
                    break
                now = time.monotonic()
                if self.abandon_after_s is not None and now - self._last_poll > self.abandon_after_s:
                    self.stop_event.set()
                if self.time_limit_s is not None and now - started > self.time_limit_s:
                    timed_out = True
                    self.stop_event.set()
                if self.stop_event.is_set():
                    after_stop += 1
                    stopped_at = stopped_at or now
                    if after_stop >= 2 and now - stopped_at > STOP_GRACE_S:
                        break
        except BaseException as exc:  # noqa: BLE001 - reported to the reader, never lost in a thread
            if not isinstance(exc, ValueError):
                LOG.error("run failed: %s", "".join(traceback.format_exception(exc)).rstrip())
            error, seen = exc, set()
            while exc is not None and id(exc) not in seen:  # its tracebacks would keep the run's tensors alive
                seen.add(id(exc))
                exc.__traceback__ = None
                exc = exc.__cause__ or exc.__context__
        finally:
            with contextlib.suppress(Exception):
                getattr(iterator, "close", lambda: None)()
            iterator = None
            if timed_out and error is None:
                error = RunTimeLimitExceeded(
                    f"the run reached this server's limit of {self.time_limit_s:g} s per run and was stopped after "
                    f"{self.record.count} decoder forwards (finished blocks are kept): lower max_new_tokens or "
                    "max_denoising_steps")
            if is_out_of_memory(error):
                release_memory()
            self.record.finish(error)
            self._notify()

    def snapshot(self) -> RunSnapshot:
        """The run right now (counts as a poll)."""
        self._last_poll = time.monotonic()
        return self.record.snapshot()

    def updates(self, max_fps: float = DEFAULT_MAX_FPS, poll_s: float = 0.2,
                reader_budget: float | None = DEFAULT_READER_BUDGET) -> Iterator[RunSnapshot]:
        """Coalesced snapshots, `max_fps` at most, reader time / `reader_budget` apart (`MAX_LIVE_GAP_S` at most)."""
        interval = 1.0 / max_fps if max_fps and max_fps > 0 else 0.0
        seen, next_allowed = -1, 0.0
        reader_s = None  # smoothed seconds the reader spends per snapshot
        while True:
            with self._changed:  # a new frame, then the time for it
                while not self.record.finished and (self.record.count == seen or time.monotonic() < next_allowed):
                    self._last_poll = time.monotonic()
                    waiting = self.record.count == seen
                    self._changed.wait(poll_s if waiting else min(next_allowed - time.monotonic(), poll_s))
            snap = self.snapshot()
            if snap.frames_seen == seen and not snap.finished:
                continue
            seen = snap.frames_seen
            yielded_at = time.monotonic()
            yield snap
            self._last_poll = now = time.monotonic()
            if snap.finished:
                return
            if snap.latest is None:  # never hold the first frame back
                continue
            spent = now - yielded_at
            reader_s = spent if reader_s is None else 0.7 * reader_s + 0.3 * spent
            gap = min(MAX_LIVE_GAP_S, max(interval, reader_s / reader_budget)) if reader_budget else interval
            next_allowed = yielded_at + gap

    def wait(self, timeout: float | None = None, poll_s: float = 0.5) -> RunSnapshot:
        """The snapshot once the run is over or `timeout` seconds passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self.record.finished:
                self._last_poll = time.monotonic()
                remaining = poll_s if deadline is None else min(poll_s, deadline - time.monotonic())
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
        return self.snapshot()


def wait_all(timeout_s: float, *waits: Callable[[float], object]) -> None:
    """Call each `wait(seconds)` in turn with what is left of one deadline `timeout_s` seconds away."""
    deadline = time.monotonic() + timeout_s
    for wait in waits:
        wait(max(0.0, deadline - time.monotonic()))


def pushed(run: Callable[[Callable[[object], None]], object]) -> Iterator:
    """What `run(emit)` (in a thread) emits, then returns, as an iterator; its errors raised."""
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


def session_key(request, fallback: object, suffix: str = "") -> str:
    """The registry key of a session's run: its hash (or `anon-<id of fallback>`) and `suffix`."""
    return f"{getattr(request, 'session_hash', None) or f'anon-{id(fallback)}'}{suffix}"


class Runner:
    """Starts every run of one app and keeps which session runs what; `max_run_s`: each run's time limit."""

    def __init__(self, *, max_fps: float, reader_budget: float | None = DEFAULT_READER_BUDGET,
                 abandon_after_s: float = 30.0, max_run_s: float | None = DEFAULT_MAX_RUN_S):
        self.max_fps, self.reader_budget = max_fps, reader_budget
        self.abandon_after_s, self.max_run_s = abandon_after_s, max_run_s
        self.blocks = None  # the app's gr.Blocks, for `drop_closed`
        self._lock = threading.Lock()
        self._runs: dict[str, RunWorker] = {}  # each session's run by registry key

    def start(self, source: FrameSource, key: str | None = None, *, keep_history: bool = True, stop_event=None,
              record=None, limit_s: float | None = None) -> RunWorker:
        """Start `source` in a `RunWorker` under the app's limits (or a tighter `limit_s`), registered as `key`."""
        limit = min((s for s in (self.max_run_s, limit_s) if s is not None), default=None)
        worker = RunWorker(source, keep_history=keep_history, abandon_after_s=self.abandon_after_s, time_limit_s=limit,
                           stop_event=stop_event, record=record).start()
        if key is not None:
            self.register(key, worker)
        return worker

    def register(self, key: str, worker: RunWorker) -> None:
        """Record `worker` as session `key`'s run, stopping any previous one."""
        with self._lock:
            previous = self._runs.get(key)
            self._runs[key] = worker
        if previous is not None and previous is not worker:
            previous.stop()

    def finish(self, key: str | None, worker: RunWorker) -> None:
        """Stop `worker` and forget it if it is still session `key`'s run."""
        worker.stop()
        with self._lock:
            if key is not None and self._runs.get(key) is worker:
                del self._runs[key]

    def stop(self, key: str) -> bool:
        """Stop session `key`'s runs (also those registered as `key:...`); whether there were any."""
        with self._lock:
            workers = [self._runs.pop(k) for k in list(self._runs) if k == key or k.startswith(f"{key}:")]
        for worker in workers:
            worker.stop()
        return bool(workers)

    def active(self) -> int:
        with self._lock:
            return sum(1 for w in self._runs.values() if w.running)

    def updates(self, worker: RunWorker) -> Iterator[RunSnapshot]:
        return worker.updates(self.max_fps, reader_budget=self.reader_budget)

    async def served(self, start: Callable[[], RunWorker], request) -> RunSnapshot:
        """An API call's run to its final snapshot, stopped within `API_WAIT_S` once its client left (gr.Error)."""
        events = getattr(getattr(LocalContext.blocks.get(None), "_queue", None), "event_ids_to_events", {})
        event_id = LocalContext.event_id.get(None)  # outside a queued job: none, never gone
        worker = await asyncio.to_thread(start)
        key = f"{getattr(request, 'session_hash', None) or 'anon'}:api:{id(worker)}"
        self.register(key, worker)
        try:
            snap = worker.snapshot()
            while not snap.finished:
                snap = await asyncio.to_thread(worker.wait, API_WAIT_S)
                if not snap.finished and not getattr(events.get(event_id), "alive", True):
                    raise gr.Error("the client went away: run stopped", print_exception=False)
        finally:
            self.finish(key, worker)
        return snap

    def unload(self, session_hash: str | None) -> None:
        """A tab closed: stop its session's runs, drop Gradio's record of it `DROP_DELAY_S` later."""
        if not session_hash:
            return
        self.stop(session_hash)
        if self.blocks is not None:
            timer = threading.Timer(DROP_DELAY_S, self.drop_closed, args=(session_hash,))
            timer.daemon = True
            timer.start()

    def drop_closed(self, session_hash: str) -> bool:
        """Drop `blocks.state_holder`'s record of `session_hash`; whether there was one."""
        holder = getattr(self.blocks, "state_holder", None)
        if holder is None:
            return False
        with holder.lock:
            record = holder.session_data.pop(session_hash, None)
            holder.time_last_used.pop(session_hash, None)
        return record is not None

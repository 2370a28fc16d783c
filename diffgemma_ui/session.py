"""A visitor's state in a tab (a `gr.State`): one run at a time, started only for the newest ticket."""

import threading

from .runs import STOP_WAIT_S, RunSnapshot, RunWorker

PREVIOUS_STREAM_WAIT_S = 10.0  # a new run waits this long for the previous stream


class SessionState:
    """A visitor's `worker`, tickets, `stopped` (Stop), last `snapshot` and what the page shows of it; copied fresh.

    The Playground's fields: `pending` (ticket, checked request) until its run step takes it, `request` of the run
    on the page, or `trace` (a loaded one when `request` is None), `step_run` (a stepped run), `sent` (frames of the
    run already fed to the page's player), `checked_upload` (path, trace) between an upload's check and its load,
    `keep_dir` (the folder of the downloads)."""

    def __init__(self):
        self.worker: RunWorker | None = None
        self.ticket = self.running_ticket = 0
        self.stopped = threading.Event()
        self.pending: tuple[int, object] | None = None
        self.request = self.trace = self.step_run = self.checked_upload = None
        self.keep_dir: str | None = None
        self.clear_views()
        self._lock = threading.Lock()
        self._stream_done = threading.Event()
        self._stream_done.set()

    def __deepcopy__(self, memo) -> "SessionState":
        return type(self)()

    def clear_views(self) -> None:
        self.snapshot: RunSnapshot | None = None
        self.finished_html: list[str] = []
        self.stacked_blocks = -1  # blocks in the stack component (-1: none this run)
        self.pending_plots: list[tuple[str, object]] = []  # (output name, figure) due, not yet sent
        self.sent = 0

    def claim(self) -> int:
        """A new ticket: stops the current run, makes every older ticket stale."""
        with self._lock:
            self.ticket += 1
            ticket = self.ticket
        self.stop()
        return ticket

    def is_current(self, ticket: int) -> bool:
        return ticket == self.ticket

    def begin(self, worker: RunWorker, ticket: int | None = None) -> bool:
        """Make `worker` the run for `ticket` (None: claim one) once the previous stream ended; False (`worker`
        stopped): the ticket went stale."""
        if ticket is None:
            ticket = self.claim()
        self.stop()
        self._stream_done.wait(PREVIOUS_STREAM_WAIT_S)
        with self._lock:
            if not self.is_current(ticket):
                worker.stop()
                return False
            self.worker = worker
            self.running_ticket = ticket
            self.clear_views()
            self._stream_done.clear()
        return True

    def end_stream(self, worker: RunWorker) -> None:
        """`worker`'s stream has ended: a waiting `begin` or `wait_for_stream` goes on."""
        if self.worker is worker:
            self._stream_done.set()

    def wait_for_stream(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the session's stream to end; whether it has."""
        return self._stream_done.wait(timeout)

    @property
    def run_in_progress(self) -> bool:
        worker = self.worker
        return worker is not None and worker.running

    def stop(self) -> bool:
        """Stop the session's run; whether one was running."""
        self.stopped.set()
        worker = self.worker
        if worker is not None and worker.running:
            worker.stop()
            return True
        return False

    def halt(self) -> None:
        """Stop the session's run and wait for it to end."""
        if self.stop():
            self.worker.join(STOP_WAIT_S)

    def withdraw(self) -> RunWorker | None:
        """Stop: stale every ticket and stop the run; the newest ticket's worker, or None."""
        with self._lock:
            worker = self.worker if self.running_ticket == self.ticket else None
            self.ticket += 1
        self.stop()
        return worker

    def release(self) -> None:
        """Drop all the session holds (its tab closed)."""
        self.claim()
        self.worker = None
        self.clear_views()
        self._stream_done.set()

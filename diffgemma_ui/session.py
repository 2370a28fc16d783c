"""Per-browser-session state, held in a `gr.State`: the session's one run, its tickets, and its last snapshot.

One run per session, whatever starts it. Every trigger (Generate, Shift+Enter, any future one) first takes a
ticket (`claim`), which stops the session's current run and makes every older ticket stale; the run step then
starts only if its ticket is still the newest (`begin`), after the previous run's stream has ended, and a stream
whose ticket went stale stops yielding (`is_current`). So the page only ever receives views of the newest run,
and its buttons are set by that run alone.
"""

from __future__ import annotations

import threading

from .record import RunSnapshot
from .runs import RunWorker

# How long a new run waits for the previous run's stream to end (it ends within one decoder forward once stopped).
PREVIOUS_STREAM_WAIT_S = 10.0


class SessionState:
    """What one browser session remembers between events.

    Attributes:
        worker: the session's current (or last) run, or None.
        ticket: the newest ticket handed out (0: none yet); `running_ticket`: the ticket `worker` runs for.
        snapshot: the last rendered snapshot (for re-rendering the plots of another block after the run).
        finished_html: rendered HTML of the current run's finished blocks (a cache; blocks never change once done).
        stacked_blocks: how many finished blocks the page's stack component shows (-1: none sent this run).

    Gradio deep-copies a `gr.State`'s initial value for each new session; a copy is always a fresh, empty state
    (a run's thread and events cannot and must not be shared between sessions).
    """

    def __init__(self):
        self.worker: RunWorker | None = None
        self.ticket = 0
        self.running_ticket = 0
        self.snapshot: RunSnapshot | None = None
        self.finished_html: list[str] = []
        self.stacked_blocks = -1  # finished blocks shown in the stack component (-1: not rendered this run)
        self._lock = threading.Lock()
        self._stream_done = threading.Event()
        self._stream_done.set()

    def __deepcopy__(self, memo) -> "SessionState":
        return SessionState()

    # -- tickets -------------------------------------------------------------------------------------------------
    def claim(self) -> int:
        """A new ticket for a run about to start: stops the current run and makes every older ticket stale."""
        with self._lock:
            self.ticket += 1
            ticket = self.ticket
        self.stop()
        return ticket

    def is_current(self, ticket: int) -> bool:
        """Whether `ticket` is still the session's newest (no later trigger, no Stop since)."""
        return ticket == self.ticket

    def begin(self, worker: RunWorker, ticket: int | None = None) -> bool:
        """Make `worker` the session's run for `ticket` (None: claim one now) and reset the caches.

        Waits (at most `PREVIOUS_STREAM_WAIT_S`) for the previous run's stream to end first, so its last view
        reaches the page before this run's first. Returns False, and stops `worker`, when `ticket` went stale
        meanwhile.
        """
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
            self.snapshot = None
            self.finished_html = []
            self.stacked_blocks = -1
            self._stream_done.clear()
        return True

    def end_stream(self, worker: RunWorker) -> None:
        """The stream of `worker` has ended (normally, stopped or superseded): a waiting `begin` may go on."""
        if self.worker is worker:
            self._stream_done.set()

    @property
    def run_in_progress(self) -> bool:
        """Whether the session's run is going on (its worker has not ended)."""
        worker = self.worker
        return worker is not None and worker.running

    # -- stopping and releasing ----------------------------------------------------------------------------------
    def stop(self) -> bool:
        """Stop the session's run if it is running; returns whether there was one."""
        worker = self.worker
        if worker is not None and worker.running:
            worker.stop()
            return True
        return False

    def withdraw(self) -> tuple[int, RunWorker | None]:
        """Stop: stale every ticket and stop the run. Returns (the ticket that was newest, the worker of that ticket,
        or None when that ticket's run had not started: it was still waiting in the queue)."""
        with self._lock:
            ticket = self.ticket
            self.ticket += 1
            worker = self.worker if self.running_ticket == ticket else None
        self.stop()
        return ticket, worker

    def release(self) -> None:
        """Drop everything the session holds (the tab closed): stops the run, frees its frames and HTML."""
        with self._lock:
            self.ticket += 1
        self.stop()
        self.worker = None
        self.snapshot = None
        self.finished_html = []
        self.stacked_blocks = -1
        self._stream_done.set()

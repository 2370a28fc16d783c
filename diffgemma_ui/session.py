"""Per-browser-session state, held in a `gr.State`: the session's current run and its last snapshot."""

from __future__ import annotations

from .record import RunSnapshot
from .worker import RunWorker


class SessionState:
    """What one browser session remembers between events.

    Attributes:
        worker: the session's current (or last) run, or None.
        snapshot: the last rendered snapshot (for re-rendering the plots of another block after the run).
        finished_html: rendered HTML of the current run's finished blocks (a cache; blocks never change once done).
        stacked_blocks: how many finished blocks the page's stack component shows (-1: none sent this run).

    Gradio deep-copies a `gr.State`'s initial value for each new session; a copy is always a fresh, empty state
    (a run's thread and events cannot and must not be shared between sessions).
    """

    def __init__(self):
        self.worker: RunWorker | None = None
        self.snapshot: RunSnapshot | None = None
        self.finished_html: list[str] = []
        self.stacked_blocks = -1  # finished blocks shown in the stack component (-1: not rendered this run)

    def __deepcopy__(self, memo) -> "SessionState":
        return SessionState()

    def begin(self, worker: RunWorker) -> None:
        """Make `worker` the session's run (stopping the previous one) and reset the caches."""
        self.stop()
        self.worker = worker
        self.snapshot = None
        self.finished_html = []
        self.stacked_blocks = -1

    def stop(self) -> bool:
        """Stop the session's run if it is running; returns whether there was one."""
        if self.worker is not None and self.worker.running:
            self.worker.stop()
            return True
        return False

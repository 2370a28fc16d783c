"""Per-run random state for torch's global RNG, so concurrent runs neither disturb nor depend on each other."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch

from .settings import draw_seed

_GLOBAL_RNG_LOCK = threading.RLock()


class RunRandomState:
    """The random state of one run, seeded like `torch.manual_seed(seed)` (which also seeds every CUDA device).

    Args:
        seed: integer seed; None draws a fresh one (kept in `self.seed` so the run can be replayed).
    """

    def __init__(self, seed: int | None):
        self.seed = draw_seed() if seed is None else seed
        with _GLOBAL_RNG_LOCK:
            saved = self._capture()
            torch.manual_seed(self.seed)
            self._state = self._capture()
            self._restore(saved)

    @staticmethod
    def _capture():
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return torch.get_rng_state(), cuda

    @staticmethod
    def _restore(state):
        cpu, cuda = state
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)

    @contextmanager
    def active(self):
        """Run the body with this run's random state installed, under the process-wide lock."""
        with _GLOBAL_RNG_LOCK:
            saved = self._capture()
            self._restore(self._state)
            try:
                yield
            finally:
                self._state = self._capture()
                self._restore(saved)

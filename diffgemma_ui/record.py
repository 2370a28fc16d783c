"""What the UI remembers of one run: its frames grouped by block, and read-only snapshots of them."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from engine import Frame


@dataclass(frozen=True)
class RunSnapshot:
    """A run at one moment: `frames_seen`, the `latest` frame, `blocks` (each block's frames), `finished`,
    and the `error` it raised."""

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
        if block is None:
            return self.blocks[-1]
        return self.blocks[max(0, min(int(block), len(self.blocks) - 1))]

    def finished_blocks(self) -> list[Frame]:
        """The last frame of every finished block, in order."""
        return [frames[-1] for frames in self.blocks if frames and frames[-1].block_done]


@dataclass
class RunRecord:
    """A run's frames, appended by one writer and read by any number of readers."""

    keep_history: bool = True
    _frozen: tuple[tuple[Frame, ...], ...] = ()  # blocks before the newest (no longer changing)
    _current: list[Frame] = field(default_factory=list)
    _latest: Frame | None = None
    _count: int = 0
    _finished: bool = False
    _error: BaseException | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, frame: Frame) -> None:
        """Append a frame; a new `block_index` opens a block, a repeated forward marked cancelled replaces the last."""
        with self._lock:
            if self.keep_history:
                if (frame.stop_reason == "cancelled" and self._current
                        and self._current[-1].forward_index == frame.forward_index):
                    # the engine repeats the last forward, marked cancelled
                    self._current[-1] = frame
                elif self._current and frame.block_index != self._current[-1].block_index:
                    self._frozen = self._frozen + (tuple(self._current),)
                    self._current = [frame]
                else:
                    self._current.append(frame)
            self._latest = frame
            self._count += 1

    def finish(self, error: BaseException | None = None) -> None:
        """Mark the run over, with the exception that ended it."""
        with self._lock:
            self._finished = True
            self._error = error

    @property
    def count(self) -> int:
        return self._count

    @property
    def finished(self) -> bool:
        return self._finished

    def snapshot(self) -> RunSnapshot:
        """A consistent copy of the record right now."""
        with self._lock:
            return RunSnapshot(frames_seen=self._count, latest=self._latest,
                               blocks=self._frozen + ((tuple(self._current),) if self._current else ()),
                               finished=self._finished, error=self._error)

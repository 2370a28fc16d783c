"""Branch a run at one of its forwards: redone up to there, then tokens pinned, the draws on its seed or a new one."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Mapping, Sequence

import torch
from transformers import LogitsProcessor

from .engine import DiffusionEngine
from .frames import Frame
from .generator import RunRandomState, denoise
from .infill import FixedPositionsLogitsProcessor
from .settings import DiffusionSettings, draw_seed, parse_seed


def changed_share(original: Sequence[int], branch: Sequence[int]) -> float:
    """The share of positions whose token differs between two canvases; `ValueError` for unequal or 0 lengths."""
    if len(original) != len(branch) or not original:
        raise ValueError(f"canvases to compare must have the same positive length, got {len(original)} and "
                         f"{len(branch)}")
    return sum(a != b for a, b in zip(original, branch)) / len(original)


class HeldPins(LogitsProcessor):
    """`pins` (position -> id) fixed while `active`, else the scores unchanged."""

    def __init__(self, pins: Mapping[int, int], canvas_length: int, device: torch.device):
        self.active = False
        self.fixed = FixedPositionsLogitsProcessor([pins.get(p, -1) for p in range(canvas_length)], [], device)

    def __call__(self, input_ids, scores):
        return self.fixed(input_ids, scores) if self.active else scores


class Fork:
    """The `denoise` fork of a branch at `frame`'s forward (see `branch_frames`)."""

    def __init__(self, frame: Frame, pins: Mapping[int, int], seed: int, device: torch.device):
        self.frame, self.pins, self.seed = frame, dict(pins), seed
        self.held = HeldPins(pins, frame.canvas_length, device) if pins else None

    def __call__(self, block: int, forward: int, canvas: torch.LongTensor) -> torch.LongTensor:
        at = self.frame.forward_index
        if forward == at:
            if canvas[0].tolist() != list(self.frame.input_ids):
                raise ValueError(f"forward {at + 1} of this run does not replay here (another device or library "
                                 f"version made it): branch it where it was made")
            if self.seed != self.frame.seed:
                torch.manual_seed(self.seed)
            if self.pins:
                canvas = canvas.clone()
                canvas[0, list(self.pins)] = torch.tensor(list(self.pins.values()), dtype=canvas.dtype,
                                                          device=canvas.device)
        if self.held is not None:
            self.held.active = forward >= at and block == self.frame.block_index
        return canvas


def branch_frames(engine: DiffusionEngine, prompt_ids: Sequence[int], frame: Frame, pins: Mapping[int, int],
                  settings: DiffusionSettings, *, seed: int | None = None,
                  stop_event: threading.Event | None = None) -> Iterator[Frame]:
    """The run of `prompt_ids` from `frame`'s forward on, `pins` (position -> id) held for its block, the draws
    from there `seed`'s (None: the run's); `ValueError` for bad arguments."""
    canvas_length, vocab = engine.canvas_length, engine.model.config.text_config.vocab_size
    for position, token in pins.items():
        if not (isinstance(position, int) and 0 <= position < canvas_length):
            raise ValueError(f"a pinned position must be in [0, {canvas_length - 1}], got {position!r}")
        if not (isinstance(token, int) and 0 <= token < vocab):
            raise ValueError(f"a pinned token must be an id in [0, {vocab - 1}], got {token!r}")
    seed = frame.seed if seed is None else parse_seed(seed)
    if seed is None:
        seed = draw_seed()
    engine.check_settings(settings)
    input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=engine.device)
    engine.check_budget(input_ids.shape[1], settings)
    fork = Fork(frame, pins, seed, engine.device)
    frames = denoise(engine.model, input_ids, settings, token_text=engine.token_text, stop_event=stop_event,
                     random_state=RunRandomState(frame.seed), fork=fork,
                     logits_processors=[fork.held] if fork.held is not None else None)
    at = frame.forward_index
    return (f if f.seed == seed else dataclasses.replace(f, seed=seed) for f in frames if f.forward_index >= at)

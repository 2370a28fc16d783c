"""Branch a run from one of its forwards: keep its accepted tokens, pin chosen ones, denoise on with a new seed."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence

import torch

from .engine import DiffusionEngine
from .frames import Frame
from .generator import RunRandomState, denoise
from .infill import FixedPositionsLogitsProcessor, noised_canvas
from .settings import DiffusionSettings, parse_seed


def branch_canvas(frame: Frame, pins: Mapping[int, int]) -> list[int]:
    """The branch's first canvas ids (-1 where noise goes): `frame`'s accepted drafts, then `pins` (position -> id)."""
    canvas = [draft if accepted else -1 for draft, accepted in zip(frame.draft_ids, frame.accepted)]
    for position, token in pins.items():
        canvas[position] = token
    return canvas


def changed_share(original: Sequence[int], branch: Sequence[int]) -> float:
    """The share of positions whose token differs between two canvases; `ValueError` for unequal or 0 lengths."""
    if len(original) != len(branch) or not original:
        raise ValueError(f"canvases to compare must have the same positive length, got {len(original)} and "
                         f"{len(branch)}")
    return sum(a != b for a, b in zip(original, branch)) / len(original)


def branch_frames(engine: DiffusionEngine, prompt_ids: Sequence[int], frame: Frame, pins: Mapping[int, int],
                  settings: DiffusionSettings, *, seed: int | None = None,
                  stop_event: threading.Event | None = None) -> Iterator[Frame]:
    """Denoise on from `frame` of a run of `prompt_ids` within the run's remaining budget, `pins` (position -> id) fixed
    in the first block; `ValueError` for bad pins, seed, settings or no budget.
    """
    canvas_length, vocab = engine.canvas_length, engine.model.config.text_config.vocab_size
    for position, token in pins.items():
        if not (isinstance(position, int) and 0 <= position < canvas_length):
            raise ValueError(f"a pinned position must be in [0, {canvas_length - 1}], got {position!r}")
        if not (isinstance(token, int) and 0 <= token < vocab):
            raise ValueError(f"a pinned token must be an id in [0, {vocab - 1}], got {token!r}")
    committed = list(frame.committed_ids[:frame.block_index * canvas_length])
    left = settings.max_new_tokens - len(committed)
    if left < 1:
        raise ValueError("the run had no token budget left after this block: raise max_new_tokens to branch")
    settings = settings.replace(max_new_tokens=left)
    engine.check_settings(settings)
    random_state = RunRandomState(parse_seed(seed))
    input_ids = torch.tensor([list(prompt_ids) + committed], dtype=torch.long, device=engine.device)
    engine.check_budget(input_ids.shape[1], settings)
    pinned = [pins.get(p, -1) for p in range(canvas_length)]
    processors = [FixedPositionsLogitsProcessor(pinned, [], engine.device)] if pins else None
    return denoise(engine.model, input_ids, settings, token_text=engine.token_text, stop_event=stop_event,
                   random_state=random_state, logits_processors=processors,
                   initial_canvas=noised_canvas(engine, branch_canvas(frame, pins), random_state))

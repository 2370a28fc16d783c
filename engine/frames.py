"""The frame: the one type that crosses from `engine/` to the UI, one per decoder forward (plain lists, no tensors)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Frame:
    """The canvas right after one decoder forward; per-position lists have length `canvas_length`.

    input_ids/draft_ids: the noisy canvas the decoder read and its argmax draft; accepted: the entropy-bound sampler
    kept the position this forward; confidence: draft probability in [0, 1]; entropy: nats; first_accepted_step: the
    step a position was first accepted (-1: not yet); remelted: accepted earlier in the block, renoised now
    (block_remelts counts them); top_ids/top_probs/top_tokens: the k likeliest tokens, draft first (empty if not
    recorded); *_tokens: display strings; *_kinds: `engine.tokens.TOKEN_KINDS` (empty if not classified).
    block_done/block_stopped_early/done: the block or the run ended here; committed_ids: generated ids of finished
    blocks (EOS kept, pads after it dropped); committed_tokens: non-pad ones among them.
    Times are the engine clock (seconds inside the generator only). stop_reason: "eos", "max_new_tokens",
    "cancelled" or "filled" (infill) on the last frame, else "".
    """

    block_index: int
    step_index: int
    forward_index: int
    canvas_length: int
    max_denoising_steps: int
    temperature: float
    input_ids: list[int]
    draft_ids: list[int]
    accepted: list[bool]
    confidence: list[float]
    entropy: list[float]
    first_accepted_step: list[int]
    input_tokens: list[str]
    draft_tokens: list[str]
    block_done: bool
    block_stopped_early: bool
    done: bool
    committed_ids: list[int]
    committed_tokens: int
    forwards_per_block: list[int]
    elapsed_s: float
    time_to_first_frame_s: float
    tokens_per_second: float
    tokens_per_forward: float
    prompt_tokens: int = 0
    seed: int = 0
    stop_reason: str = ""
    input_kinds: list[str] = dataclasses.field(default_factory=list)
    draft_kinds: list[str] = dataclasses.field(default_factory=list)
    remelted: list[bool] = dataclasses.field(default_factory=list)
    block_remelts: int = 0
    top_ids: list[list[int]] = dataclasses.field(default_factory=list)
    top_probs: list[list[float]] = dataclasses.field(default_factory=list)
    top_tokens: list[list[str]] = dataclasses.field(default_factory=list)

    @property
    def accepted_count(self) -> int:
        """Positions accepted in this forward."""
        return sum(self.accepted)

    @property
    def remelted_count(self) -> int:
        """Positions renoised in this forward after being accepted earlier in the block."""
        return sum(self.remelted)

    @property
    def mean_entropy(self) -> float:
        """Mean per-position entropy of this forward, in nats."""
        return sum(self.entropy) / max(1, len(self.entropy))

    def to_dict(self) -> dict:
        """A JSON-serializable dict of every field."""
        return asdict(self)

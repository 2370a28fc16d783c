"""The frame: the one type that crosses from `engine/` to the UI, one per decoder forward (plain lists, no tensors)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
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
        return sum(self.accepted)

    @property
    def remelted_count(self) -> int:
        return sum(self.remelted)

    @property
    def mean_entropy(self) -> float:
        """Mean per-position entropy of this forward, in nats."""
        return sum(self.entropy) / max(1, len(self.entropy))

    def to_dict(self) -> dict:
        return asdict(self)


class FrameBuilder:
    """Rebuilds a run's frames from per-forward records, deriving first-accepted steps, re-melts, times and rates."""

    def __init__(self, canvas_length: int, max_denoising_steps: int, *, prompt_tokens: int, seed: int,
                 token_text: Callable[[int], str], token_kind: Callable[[int], str] | None = None,
                 remelts: bool = True):
        self.canvas_length, self.max_denoising_steps = canvas_length, max_denoising_steps
        self.prompt_tokens, self.seed, self.remelts = prompt_tokens, seed, remelts
        self.token_text, self.token_kind = token_text, token_kind or getattr(token_text, "kind", None)
        self.forwards = self.block_remelts = 0
        self.forwards_per_block: list[int] = []
        self.first_accepted: list[int] = []
        self.first_frame_s: float | None = None

    def add(self, *, step_index: int, input_ids: list[int], draft_ids: list[int], accepted: list[bool],
            block_done: bool, elapsed_s: float, committed_tokens: int, top_ids=(), build: bool = True,
            **fields) -> Frame | None:
        """The next forward's `Frame` (`fields`: the rest of its fields); with `build` False only count it."""
        if step_index == 0:
            self.first_accepted, self.block_remelts = [-1] * self.canvas_length, 0
        remelted = [s >= 0 and not a for a, s in zip(accepted, self.first_accepted)] if self.remelts else []
        self.block_remelts += sum(remelted)
        self.first_accepted = [step_index if a and s < 0 else s for a, s in zip(accepted, self.first_accepted)]
        self.forwards += 1
        self.first_frame_s = elapsed_s if self.first_frame_s is None else self.first_frame_s
        if block_done:
            self.forwards_per_block = self.forwards_per_block + [step_index + 1]
        if not build:
            return None
        ids = [*input_ids, *draft_ids, *(i for row in top_ids for i in row)]
        strings, kinds = self._describe(ids)
        n, k = len(input_ids), len(top_ids[0]) if top_ids else 0
        return Frame(
            step_index=step_index, forward_index=self.forwards - 1, canvas_length=self.canvas_length,
            max_denoising_steps=self.max_denoising_steps, input_ids=list(input_ids), draft_ids=list(draft_ids),
            accepted=list(accepted), first_accepted_step=list(self.first_accepted), remelted=remelted,
            block_remelts=self.block_remelts, input_tokens=strings[:n], draft_tokens=strings[n:2 * n],
            input_kinds=kinds[:n], draft_kinds=kinds[n:2 * n], top_ids=list(top_ids),
            top_tokens=[strings[2 * n + p * k:2 * n + (p + 1) * k] for p in range(len(top_ids))], block_done=block_done,
            committed_tokens=committed_tokens, forwards_per_block=list(self.forwards_per_block), elapsed_s=elapsed_s,
            time_to_first_frame_s=self.first_frame_s,
            tokens_per_second=committed_tokens / elapsed_s if elapsed_s > 0 else 0.0,
            tokens_per_forward=committed_tokens / self.forwards, prompt_tokens=self.prompt_tokens, seed=self.seed,
            **fields)

    def _describe(self, ids: list[int]) -> tuple[list[str], list[str]]:
        many = getattr(self.token_text, "describe_many", None)
        if many is not None:
            strings, kinds = zip(*many(ids)) if ids else ((), ())
            return list(strings), list(kinds)
        kind = self.token_kind
        return [self.token_text(i) for i in ids], [kind(i) for i in ids] if kind else []

"""The frame: the one type that crosses from `engine/` to the UI. One frame per decoder forward.

A frame holds plain Python lists and numbers (no tensors, nothing vocabulary-sized), so it is cheap to queue,
serialize (`Frame.to_dict`) and render. Per-position fields all have length `canvas_length`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Frame:
    """The state of the canvas right after one decoder forward.

    Canvas fields (lists of length `canvas_length`, position 0 = the canvas's first token):
        input_ids: the noisy canvas the decoder read in this forward (accepted tokens plus fresh random ones).
        draft_ids: the argmax canvas after this forward: the draft that becomes the committed block.
        accepted: whether the entropy-bound sampler accepted this position in this forward (else it is renoised).
        confidence: probability of the draft token under the temperature-scaled distribution, in [0, 1].
        entropy: entropy of the temperature-scaled distribution, in nats.
        first_accepted_step: the 0-based step at which the position was first accepted (-1: not yet): the
            unmasking order.
        remelted: the position was accepted at an earlier forward of this block and renoised in this one (there is
            no mask token: an accepted token can melt back into noise). block_remelts: how many re-melts this block
            has had so far, this forward's included.
        top_ids, top_probs: per position, the k likeliest tokens of this forward's temperature-scaled distribution
            and their probabilities (k = `engine.sampling.ALTERNATIVES`), the draft token first, probabilities
            non-increasing: "why this token?"; top_tokens: their display strings. Empty lists where the producer did
            not record them.
        input_tokens, draft_tokens: the same ids as display strings (one token each, see `engine.tokens.TokenText`:
            decoded text, a special token's own piece such as `<pad>`, a byte piece's bytes as `<0xE2>`).
        input_kinds, draft_kinds: each token's kind ("text", "byte", "pad", "eos", "special"; see
            `engine.tokens.TokenText.kind`), or empty lists where the producer did not classify tokens.

    Progress fields:
        block_index: 0-based canvas (block) number; step_index: 0-based decoder forward within the block;
        forward_index: 0-based decoder forward over the whole generation.
        temperature: the schedule's temperature at this step.
        block_done: this is the block's last forward; block_stopped_early: it ended by adaptive stopping before its
        last step (a block whose criteria are met only at its last step ran all its steps). done: the generation
        is over (EOS, token budget, or cancellation).
        committed_ids: generated tokens of finished blocks (EOS kept, pads after EOS dropped); on the last frame of
        a block it includes that block. committed_tokens: how many of them are not pad. As in `generate()`
        (`_finalize_canvas`, `_compute_tokens_per_forward`), a pad the model draws mid-canvas does not end the
        sequence (only EOS ids do) and is never counted; EOS and other special tokens count.
        forwards_per_block: decoder forwards used by each finished block.

    Speed fields (engine clock: time spent inside the generator only, so a slow consumer does not change it):
        elapsed_s (seconds since generation start, prefill included), time_to_first_frame_s,
        tokens_per_second = committed_tokens / elapsed_s, tokens_per_forward = committed_tokens / forwards so far.

    Run fields: prompt_tokens (prompt length in tokens), seed (the seed in force, drawn when none was given),
    stop_reason ("eos", "max_new_tokens" or "cancelled" on the last frame, "filled" for a completed infill
    (`engine.infill`), else "").
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

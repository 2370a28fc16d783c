"""The per-position statistics a frame shows, taken from the sampler's own computation (no second pass over the
[canvas x vocabulary] logits).
"""

from __future__ import annotations

import torch
from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSampler


class RecordingEntropyBoundSampler(EntropyBoundSampler):
    """`EntropyBoundSampler` that also records, at every acceptance, what it computed the acceptance from.

    After `accept_canvas(..., logits, ...)` (logits `[batch, canvas_length, vocab]`, temperature-scaled):
        token_entropy: `[batch, canvas_length]`, each position's entropy in nats (the sampler's own numbers).
        log_probs: `[batch, canvas_length, vocab]`, the normalized logits (log-probabilities) the entropy came from:
            a reference to the sampler's own tensor, not a copy. `frame_statistics` reads it and lets it go, so it
            lives only until the frame is built (one [canvas x vocab] buffer longer than the library keeps it).
    Both in the logits' dtype (float32: the model returns float32 logits), on their device.

    Acceptance is transformers 5.23's `EntropyBoundSampler.accept_canvas` line for line (the entropy bound of
    https://arxiv.org/abs/2505.24857: accept the k lowest-entropy positions whose entropy sum minus its maximum stays
    within the bound); renoising and canvas initialization are inherited unchanged.
    """

    token_entropy: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None

    @classmethod
    def of(cls, sampler: EntropyBoundSampler) -> "RecordingEntropyBoundSampler":
        """A recording sampler with exactly the state of `sampler` (as `model._prepare_sampler` built it).

        Raises:
            TypeError: `sampler` is not an `EntropyBoundSampler` (another sampler needs its own recording twin).
        """
        if type(sampler) is not EntropyBoundSampler:
            raise TypeError(f"cannot record statistics of a {type(sampler).__name__}; expected EntropyBoundSampler")
        recording = cls.__new__(cls)
        recording.__dict__.update(sampler.__dict__)
        return recording

    def accept_canvas(self, current_canvas, denoiser_canvas, logits, cur_step):
        """Accept denoiser tokens within the entropy bound (see the class docstring); returns the accepted canvas
        `[batch, canvas_length]` and sets `accepted_token_mask`, `token_entropy` and `log_probs`."""
        dist = torch.distributions.Categorical(logits=logits)
        token_entropy = dist.entropy()  # (batch_size, canvas_length)
        self.token_entropy, self.log_probs = token_entropy, dist.logits
        sorted_token_entropy, sorted_indices = torch.sort(token_entropy, dim=-1, descending=False)
        cumulative_entropy = torch.cumsum(sorted_token_entropy, dim=-1)
        sorted_selection_mask = cumulative_entropy - sorted_token_entropy <= self.entropy_bound
        self.accepted_token_mask = torch.scatter(
            input=torch.zeros_like(sorted_selection_mask), dim=-1, index=sorted_indices, src=sorted_selection_mask
        )
        return torch.where(self.accepted_token_mask, denoiser_canvas, current_canvas)


def with_recording(sampler):
    """`RecordingEntropyBoundSampler.of(sampler)` for transformers' entropy-bound sampler; any other sampler as it is
    (its frames then take their statistics from the logits: `frame_statistics`)."""
    return RecordingEntropyBoundSampler.of(sampler) if type(sampler) is EntropyBoundSampler else sampler


def sampler_state(sampler):
    """The object the sampler's last `accept_canvas` wrote to.

    With a static cache, `generate()` swaps in a `torch.compile`d `accept_canvas`, compiled once per model from the
    first sampler's bound method; that method then writes onto the first sampler, so its state is read from there.
    """
    accept = getattr(sampler.accept_canvas, "_torchdynamo_orig_callable", sampler.accept_canvas)
    return getattr(accept, "__self__", sampler)


ALTERNATIVES = 5


def canvas_statistics(processed_logits: torch.Tensor, draft_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position confidence and entropy of one canvas, computed from the logits (when no recording is at hand).

    Args:
        processed_logits: temperature-scaled logits `[canvas_length, vocab]`.
        draft_ids: argmax canvas `[canvas_length]`.
    Returns:
        (confidence `[canvas_length]`: probability of the draft token, entropy `[canvas_length]` in nats), float32.
    """
    log_probs, entropy = _log_probs_and_entropy(processed_logits)
    confidence = log_probs.gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1).exp()
    return confidence, entropy


def _log_probs_and_entropy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probabilities `[..., vocab]`, entropy `[...]` in nats) of `logits`, float32."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs, -(log_probs.exp() * log_probs).sum(dim=-1)


def top_alternatives(log_probs: torch.Tensor, draft_ids: torch.Tensor, k: int = ALTERNATIVES
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each position's `k` likeliest tokens, the draft token first.

    Args:
        log_probs: normalized log-probabilities `[canvas_length, vocab]` (the sampler's own).
        draft_ids: argmax canvas `[canvas_length]`.
    Returns:
        (ids `[canvas_length, k]` int64, probabilities `[canvas_length, k]` float32), probabilities non-increasing
        along each row; where tokens tie with the draft, the draft still comes first.
    """
    k = min(k, log_probs.shape[-1])
    values, ids = log_probs.topk(k, dim=-1)
    draft = draft_ids.unsqueeze(-1)
    missing = ~(ids == draft).any(dim=-1)
    if bool(missing.any()):
        ids[missing, -1] = draft_ids[missing]
        values[missing, -1] = log_probs.gather(-1, draft).squeeze(-1)[missing]
    order = torch.where(ids == draft, torch.inf, values).argsort(dim=-1, descending=True, stable=True)
    return ids.gather(-1, order), values.gather(-1, order).float().exp()


def frame_statistics(sampler, processed_logits: torch.Tensor, draft_ids: torch.Tensor, k: int = ALTERNATIVES
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(confidence, entropy, alternative ids, alternative probabilities) of the last step (batch item 0).

    Args:
        sampler: the run's sampler; a `RecordingEntropyBoundSampler` gives its own numbers (and drops its reference
            to the log-probabilities), any other falls back to a pass over `processed_logits`.
        processed_logits: temperature-scaled logits `[1, canvas_length, vocab]` (read only by the fallback).
        draft_ids: the argmax canvas `[1, canvas_length]`.
        k: alternatives per position (`top_alternatives`); 0 for none.
    Returns:
        confidence and entropy `[canvas_length]` float32; ids `[canvas_length, k]` and probabilities
        `[canvas_length, k]` (`top_alternatives`), all on the logits' device.
    """
    state = sampler_state(sampler)
    entropy, log_probs = getattr(state, "token_entropy", None), getattr(state, "log_probs", None)
    if entropy is None or log_probs is None:
        log_probs, entropy = _log_probs_and_entropy(processed_logits[0])
    else:
        state.log_probs = None
        log_probs, entropy = log_probs[0], entropy[0].float()
    confidence = log_probs.gather(-1, draft_ids[0].unsqueeze(-1)).squeeze(-1).float().exp()
    if k > 0:
        top_ids, top_probs = top_alternatives(log_probs, draft_ids[0], k)
    else:
        top_ids = torch.empty((log_probs.shape[0], 0), dtype=torch.long, device=log_probs.device)
        top_probs = torch.empty((log_probs.shape[0], 0), dtype=torch.float32, device=log_probs.device)
    return confidence, entropy, top_ids, top_probs

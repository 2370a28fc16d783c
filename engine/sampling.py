"""The engine's sampler: per-position statistics of a frame, taken from the sampler's own computation (no second
pass over the logits), and its methods compiled for each run on the compiled path."""

import threading

import torch
from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSampler

ALTERNATIVES = 5  # candidates kept per position
# What transformers' `_compile_functions` compiles once per model from one run's objects (`_compiled_<name>`)
RUN_COMPILED = ("_compiled_accept_canvas", "_compiled_renoise_canvas", "_compiled_diffusion_stopping_criteria")
_COMPILE_LOCK = threading.Lock()


class RecordingEntropyBoundSampler(EntropyBoundSampler):
    """`EntropyBoundSampler` keeping, of its last step, `token_entropy` `[batch, canvas_length]` and the `ALTERNATIVES`
    largest log-probabilities, in float32 whatever the logits' dtype, with their ids (`top_log_probs`, `top_ids`:
    `[batch, canvas_length, k]`)."""

    token_entropy: torch.Tensor | None = None
    top_log_probs: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    _workspace: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def of(cls, sampler: EntropyBoundSampler) -> "RecordingEntropyBoundSampler":
        """A recording sampler with exactly the state of `sampler`; `TypeError` for another sampler class."""
        if type(sampler) is not EntropyBoundSampler:
            raise TypeError(f"cannot record statistics of a {type(sampler).__name__}; expected EntropyBoundSampler")
        recording = cls.__new__(cls)
        recording.__dict__.update(sampler.__dict__)
        return recording

    def accept_canvas(self, current_canvas, denoiser_canvas, logits, cur_step):
        """The canvas `[batch, canvas_length]` with denoiser tokens accepted within the entropy bound."""
        token_entropy, normalizer = entropy_and_normalizer(logits, self._buffers(logits))
        values, ids = top_k(logits.reshape(-1, logits.shape[-1]), min(ALTERNATIVES, logits.shape[-1]))
        self.token_entropy = token_entropy
        values = values.float() - normalizer.reshape(-1, 1)
        self.top_log_probs, self.top_ids = values.view(*logits.shape[:-1], -1), ids.view(*logits.shape[:-1], -1)
        sorted_token_entropy, sorted_indices = torch.sort(token_entropy, dim=-1, descending=False)
        cumulative_entropy = torch.cumsum(sorted_token_entropy, dim=-1)
        sorted_selection_mask = cumulative_entropy - sorted_token_entropy <= self.entropy_bound
        self.accepted_token_mask = torch.scatter(
            input=torch.zeros_like(sorted_selection_mask), dim=-1, index=sorted_indices, src=sorted_selection_mask
        )
        return torch.where(self.accepted_token_mask, denoiser_canvas, current_canvas)

    def _buffers(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Two buffers shaped like `logits`, kept from step to step on the CPU (None elsewhere: the device's caching
        allocator already reuses its memory)."""
        if logits.device.type != "cpu":
            return None
        workspace = self._workspace
        if workspace is None or workspace[0].shape != logits.shape or workspace[0].dtype != logits.dtype:
            workspace = self._workspace = (torch.empty_like(logits), torch.empty_like(logits))
        return workspace


def entropy_and_normalizer(logits: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """`Categorical(logits=logits)`'s entropy `[..]` (bitwise: `logsumexp`'s own steps) and `logsumexp(logits)`
    `[.., 1]` in float32 (its sum taken before a half-precision dtype rounds it), from two vocabulary-sized buffers
    instead of four and without its argument check; `out`: those two buffers, shaped like `logits` (overwritten)."""
    log_probs, p_log_p = out if out is not None else (None, None)
    maxes = logits.amax(dim=-1, keepdim=True)
    maxes.masked_fill_(maxes.abs() == torch.inf, 0)
    total = torch.sub(logits, maxes, out=p_log_p).exp_().sum(dim=-1, keepdim=True, dtype=torch.float32)
    normalizer = total.to(logits.dtype, copy=True).log_().add_(maxes)
    log_probs = torch.sub(logits, normalizer, out=log_probs)
    p_log_p = torch.softmax(log_probs, dim=-1, out=p_log_p)
    log_probs.clamp_(min=torch.finfo(log_probs.dtype).min)
    return -p_log_p.mul_(log_probs).sum(-1), total.log_().add_(maxes.float())


def with_recording(sampler):
    """`RecordingEntropyBoundSampler.of(sampler)` for the entropy-bound sampler; any other sampler as it is."""
    return RecordingEntropyBoundSampler.of(sampler) if type(sampler) is EntropyBoundSampler else sampler


def compile_for_run(model, sampler, stopping_criteria) -> tuple:
    """`model._compile_functions(sampler, stopping_criteria)` (encoder, decoder forward, sampler, stopping criteria)
    with this run's own sampler and stopping criteria compiled; the model's compiled forwards are shared, and what it
    kept of other runs' objects is left as it was."""
    with _COMPILE_LOCK:
        state = vars(model)
        kept = {name: state.pop(name) for name in RUN_COMPILED if name in state}
        try:
            return model._compile_functions(sampler, stopping_criteria)
        finally:
            for name in RUN_COMPILED:
                state.pop(name, None)
            state.update(kept)


def sampler_state(sampler):
    """The object the sampler's last `accept_canvas` wrote to (a compiled method: the sampler it was compiled for)."""
    accept = getattr(sampler.accept_canvas, "_torchdynamo_orig_callable", sampler.accept_canvas)
    return getattr(accept, "__self__", sampler)


def canvas_statistics(processed_logits: torch.Tensor, draft_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(confidence, entropy) `[canvas_length]` of logits `[canvas_length, vocab]` and their argmax `draft_ids`."""
    log_probs, entropy = _log_probs_and_entropy(processed_logits)
    return log_probs.gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1).exp(), entropy


def _log_probs_and_entropy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # one fused pass: cheaper where no bitwise match is due
    return log_probs, -(log_probs.exp() * log_probs).sum(dim=-1)


def top_k(values: torch.Tensor, k: int, chunk: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """`values.topk(k, dim=-1)` of `[rows, vocab]` (ids may differ among ties), searched only in the `k` chunks of
    `chunk` columns with the largest maxima, which hold the top `k`; plain `topk` where chunks do not pay."""
    rows, vocab = values.shape
    if vocab % chunk or vocab // chunk <= k:
        return values.topk(k, dim=-1)
    chunks = values.reshape(rows, vocab // chunk, chunk)
    best = chunks.amax(dim=-1).topk(k, dim=-1).indices
    candidates = chunks.gather(1, best.unsqueeze(-1).expand(rows, k, chunk)).reshape(rows, k * chunk)
    top, where = candidates.topk(k, dim=-1)
    return top, best.gather(1, where // chunk) * chunk + where % chunk


def top_alternatives(log_probs: torch.Tensor, draft_ids: torch.Tensor, k: int = ALTERNATIVES
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, probabilities) `[canvas_length, k]` of log-probabilities `[canvas_length, vocab]`, draft first."""
    values, ids = top_k(log_probs, min(k, log_probs.shape[-1]))
    return draft_first(values, ids, draft_ids, log_probs.gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1))


def draft_first(values: torch.Tensor, ids: torch.Tensor, draft_ids: torch.Tensor, draft_values: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, probabilities) `[canvas_length, k]` of top `values` (largest first) and their `ids`, each draft
    (`draft_values`) moved first, or written over the last (in place) when a tie kept it out."""
    if bool((ids[:, 0] == draft_ids).all()):
        return ids, values.float().exp()
    draft = draft_ids.unsqueeze(-1)
    missing = ~(ids == draft).any(dim=-1)
    ids[:, -1] = torch.where(missing, draft_ids, ids[:, -1])
    values[:, -1] = torch.where(missing, draft_values, values[:, -1])
    order = torch.where(ids == draft, torch.inf, values).argsort(dim=-1, descending=True, stable=True)
    return ids.gather(-1, order), values.gather(-1, order).float().exp()


def frame_statistics(sampler, processed_logits: torch.Tensor, draft_ids: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(confidence, entropy `[canvas_length]`, top ids, top probabilities) of the last step's argmax `draft_ids`
    `[1, canvas_length]`: from the recording sampler's record, else `processed_logits` `[1, canvas_length, vocab]`."""
    state = sampler_state(sampler)
    entropy, values, ids = (getattr(state, name, None) for name in ("token_entropy", "top_log_probs", "top_ids"))
    if entropy is None or values is None:
        log_probs, entropy = _log_probs_and_entropy(processed_logits[0])
        top_ids, top_probs = top_alternatives(log_probs, draft_ids[0])
    else:  # the draft is the argmax: its log-probability is the largest one
        state.top_log_probs = state.top_ids = None
        top_ids, top_probs = draft_first(values[0], ids[0], draft_ids[0], values[0, :, 0])
        entropy = entropy[0].float()
    return top_probs[:, 0], torch.where(entropy > 0, entropy, 0.0), top_ids, top_probs  # not -0.0 or -1e-8

"""Autoregressive decoding with DiffusionGemma's own weights: the baseline diffusion is raced against.

DiffusionGemma's encoder is a causal language model that shares every weight with the diffusion decoder; with the
tied `lm_head` and the final logit softcap it predicts the next token. Decoding it greedily token by token, with a
KV cache, is the "same-size AR model" of the field's speed claims, on the very same weights:

    prefill the prompt -> logits of the last position -> argmax -> feed that one token -> ...

Only speed is compared here; the embedded model's encoder is trained with a next-token loss at half weight, so its
text is no better than the diffusion decoder's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass(frozen=True)
class ARResult:
    """One greedy AR run: `token_ids` generated (exactly the number asked for, EOS not treated specially),
    `seconds` (prefill included; CUDA synchronized), `forwards` (one per token) and `tokens_per_second`."""

    token_ids: list[int]
    seconds: float
    forwards: int

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0


def next_token_logits(model, hidden_states: torch.Tensor) -> torch.Tensor:
    """Softcapped float32 logits `[batch, vocab]` of the last position: `tanh(lm_head(h) / cap) * cap`, exactly as
    `DiffusionGemmaForBlockDiffusion.forward` turns hidden states into logits."""
    logits = model.lm_head(hidden_states[:, -1]).float()
    cap = model.final_logit_softcapping
    return torch.tanh(logits / cap) * cap if cap else logits


@torch.no_grad()
def ar_generate(model, input_ids: torch.LongTensor, new_tokens: int) -> ARResult:
    """Greedy next-token decoding of `new_tokens` tokens after `input_ids` `[1, prompt_length]` through
    `model.model.encoder` with a `DynamicCache`; one encoder forward per token (the first one is the prefill).

    Raises:
        ValueError: batch size other than 1, or `new_tokens` < 1.
    """
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must have shape [1, prompt_length], got {tuple(input_ids.shape)}")
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be at least 1, got {new_tokens}")
    encoder = model.model.encoder
    sync = torch.cuda.synchronize if input_ids.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    generated: list[torch.Tensor] = []
    step_ids, position = input_ids, 0
    for _ in range(new_tokens):
        positions = torch.arange(position, position + step_ids.shape[1], device=input_ids.device).unsqueeze(0)
        hidden = encoder(input_ids=step_ids, past_key_values=cache, position_ids=positions).last_hidden_state
        step_ids = next_token_logits(model, hidden).argmax(dim=-1, keepdim=True)
        generated.append(step_ids)
        position += positions.shape[1]
    token_ids = torch.cat(generated, dim=-1)[0].tolist()
    sync()
    return ARResult(token_ids=token_ids, seconds=time.perf_counter() - start, forwards=new_tokens)

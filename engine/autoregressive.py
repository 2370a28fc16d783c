"""Autoregressive decoding, one token per forward: the side block diffusion races against."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from .engine import encode_text, last_and_count
from .generator import EngineClock, RunRandomState
from .loading import ModelLoadError, model_location
from .settings import SettingSpec, parse_seed, parse_setting
from .tokens import TokenText, eos_id_list

AR_TEMPERATURE = SettingSpec("ar_temperature", "Autoregressive temperature", float, 0.0, 10.0, True,
                             "0: greedy (default); above: sampled", "--ar-temperature", ui_step=0.05)


def check_temperature(value) -> float:
    """`value` as the autoregressive sampling temperature in [0, 10] (0: greedy); `ValueError`."""
    return AR_TEMPERATURE.parse(value)


@dataclass(frozen=True)
class TokenFrame:
    """One autoregressive forward (0: the prefill); `token` is raw text (escape it)."""

    forward_index: int
    token_id: int
    token: str
    committed_ids: list[int]
    committed_tokens: int
    temperature: float
    done: bool
    stop_reason: str
    elapsed_s: float
    time_to_first_token_s: float
    tokens_per_second: float
    tokens_per_forward: float
    prompt_tokens: int
    seed: int

    @property
    def forwards(self) -> int:
        return self.forward_index + 1

    def to_dict(self) -> dict:
        return asdict(self)


def eos_ids(generation_config) -> set[int]:
    return set(eos_id_list(getattr(generation_config, "eos_token_id", None)))


class AutoregressiveDecoder:
    """Token-by-token decoding with a KV cache on a DiffusionGemma encoder or a causal LM (`load`)."""

    def __init__(self, model, tokenizer, *, source: str, device: torch.device, shared_weights: bool):
        self.model = model
        self.tokenizer = tokenizer
        self.source = source
        self.device = device
        self.shared_weights = shared_weights
        self.token_text = TokenText(tokenizer)
        self.eos_token_ids = eos_ids(model.generation_config)
        self.pad_token_id = getattr(model.generation_config, "pad_token_id", None)
        config = model.config.get_text_config(decoder=True)
        self.context_limit = getattr(config, "max_position_embeddings", None)

    @classmethod
    def from_diffusion(cls, engine) -> "AutoregressiveDecoder":
        """The decoder on a `DiffusionEngine`'s own encoder, `lm_head` and tokenizer."""
        return cls(engine.model, engine.tokenizer, source=f"{engine.source} (its causal encoder)",
                   device=engine.device, shared_weights=True)

    @classmethod
    def load(cls, model_id: str, device: torch.device, dtype: torch.dtype) -> "AutoregressiveDecoder":
        """A separate causal LM (no remote code) and its tokenizer on `device`; `ModelLoadError`."""
        where, common = model_location(model_id, strict=False)
        kwargs = {"dtype": dtype, **common}
        if device.type == "cuda":
            kwargs["device_map"] = {"": device.index or 0}
        try:
            model = AutoModelForCausalLM.from_pretrained(where, **kwargs)
            tokenizer = AutoTokenizer.from_pretrained(where, **common)
        except Exception as error:  # noqa: BLE001 - one clear message
            raise ModelLoadError(f"cannot load the autoregressive model {model_id!r}: {type(error).__name__}: "
                                 f"{error}") from error
        if device.type != "cuda":
            model = model.to(device)
        model.eval()
        return cls(model, tokenizer, source=str(model_id), device=device, shared_weights=False)

    def next_token_logits(self, step_ids: torch.LongTensor, cache: DynamicCache, position: int) -> torch.Tensor:
        """One forward over `step_ids` `[1, n]` from `position`, extending `cache`; float32 logits `[1, vocab]`."""
        positions = torch.arange(position, position + step_ids.shape[1], device=step_ids.device).unsqueeze(0)
        if self.shared_weights:
            hidden = self.model.model.encoder(input_ids=step_ids, past_key_values=cache,
                                              position_ids=positions).last_hidden_state
            logits = self.model.lm_head(hidden[:, -1]).float()  # softcapped as in the model's forward
            cap = self.model.final_logit_softcapping
            return torch.tanh(logits / cap) * cap if cap else logits
        output = self.model(input_ids=step_ids, past_key_values=cache, position_ids=positions, use_cache=True,
                            logits_to_keep=1)
        return output.logits[:, -1].float()

    def encode_prompt(self, prompt: str, raw: bool = False) -> torch.LongTensor:
        return encode_text(self.tokenizer, prompt, raw, self.device)

    def check_budget(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """`ValueError` when the prompt plus `max_new_tokens` exceed the model's context window."""
        if self.context_limit and prompt_tokens + max_new_tokens > self.context_limit:
            raise ValueError(
                f"prompt is {prompt_tokens:,} tokens and {max_new_tokens:,} new tokens are asked for; together over "
                f"the autoregressive model's context of {self.context_limit:,} tokens: shorten the prompt or lower "
                "max_new_tokens")

    def frames(self, prompt: str, max_new_tokens: int, *, raw: bool = False, temperature: float = 0.0,
               seed: int | None = None, stop_event: threading.Event | None = None) -> Iterator[TokenFrame]:
        """`decode` of `prompt`; `ValueError` (before any work) for a bad argument."""
        max_new_tokens = parse_setting("max_new_tokens", max_new_tokens)
        temperature = check_temperature(temperature)
        seed = parse_seed(seed)
        input_ids = self.encode_prompt(prompt, raw=raw)
        self.check_budget(input_ids.shape[1], max_new_tokens)
        return self.decode(input_ids, max_new_tokens, temperature=temperature, random_state=RunRandomState(seed),
                           stop_event=stop_event)

    @torch.no_grad()
    def decode(self, input_ids: torch.LongTensor, max_new_tokens: int, *, temperature: float = 0.0,
               random_state: RunRandomState | None = None,
               stop_event: threading.Event | None = None) -> Iterator[TokenFrame]:
        """One `TokenFrame` per forward after `input_ids` `[1, n]` until EOS or the budget; `ValueError`."""
        if input_ids.ndim != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must have shape [1, prompt_length], got {tuple(input_ids.shape)}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        rng = random_state or RunRandomState(None)
        clock = EngineClock(input_ids.device)
        prompt_tokens = int(input_ids.shape[1])
        committed: list[int] = []
        counted, first_token_s = 0, 0.0
        cache = DynamicCache(config=self.model.config.get_text_config(decoder=True))
        step_ids, position = input_ids, 0
        frame = None
        for forward in range(max_new_tokens):
            if stop_event is not None and stop_event.is_set():
                if frame is not None:
                    yield dataclasses.replace(frame, done=True, stop_reason="cancelled")
                return
            with clock:
                logits = self.next_token_logits(step_ids, cache, position)
                position += step_ids.shape[1]
                if temperature > 0:
                    with rng.active():
                        step_ids = torch.multinomial(torch.softmax(logits / temperature, dim=-1), num_samples=1)
                else:
                    step_ids = logits.argmax(dim=-1, keepdim=True)
                token_id = int(step_ids)
                committed = [*committed, token_id]
                counted += token_id != self.pad_token_id
                stop_reason = ("eos" if token_id in self.eos_token_ids
                               else "max_new_tokens" if forward == max_new_tokens - 1 else "")
                elapsed = clock.now()
                first_token_s = elapsed if forward == 0 else first_token_s
                frame = TokenFrame(
                    forward_index=forward, token_id=token_id, token=self.token_text(token_id), committed_ids=committed,
                    committed_tokens=counted, temperature=temperature, done=bool(stop_reason),
                    stop_reason=stop_reason, elapsed_s=elapsed, time_to_first_token_s=first_token_s,
                    tokens_per_second=counted / elapsed if elapsed > 0 else 0.0,
                    tokens_per_forward=counted / (forward + 1), prompt_tokens=prompt_tokens, seed=rng.seed,
                )
            yield frame
            if frame.done:
                return

    def text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def warm_up(self) -> float:
        """Pay first-run costs with a short greedy run; returns its seconds."""
        last, _ = last_and_count(self.frames("Warm-up.", 4, raw=True, seed=0))
        return last.elapsed_s if last is not None else 0.0

"""The engine's public face: prompt in, frames out. `DiffusionEngine` wraps a loaded model and its tokenizer."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .frames import Frame
from .generator import RunRandomState, denoise
from .loading import LoadedModel
from .conversation import chat_prompt_ids, split_thought, supports_thinking
from .settings import DiffusionSettings, check_prompt, parse_seed
from .tokens import token_text_for

SAFETY = 2.0  # headroom for rounding on the overflow limits
UNCAPPED_LOGIT_BOUND = 1.0e4  # assumed logit bound of a model without a softcap


def lowest_safe_temperature(logit_cap: float, dtype: torch.dtype) -> float:
    """The smallest temperature `T` for which `logit_cap / T` (times `SAFETY`) is finite in `dtype`."""
    return SAFETY * logit_cap / float(torch.finfo(dtype).max)


def check_temperature_schedule(settings: DiffusionSettings, *, logit_cap: float | None,
                               feedback_dtype: torch.dtype) -> None:
    """Refuse (`ValueError` naming t_min and t_max) a schedule whose softcapped logits over the temperature overflow
    float32, or, for logits fed back to the next step, `feedback_dtype`; logit_cap None: no softcap.
    """
    cap = float(logit_cap) if logit_cap else UNCAPPED_LOGIT_BOUND
    n = settings.max_denoising_steps
    lowest = settings.temperature_at(1)
    sampler_floor = lowest_safe_temperature(2 * cap, torch.float32)
    if lowest < sampler_floor:
        raise ValueError(
            f"t_min and t_max: the temperature schedule falls to {lowest:.3g} at the last of {n} steps "
            f"(t_min + (t_max - t_min) / max_denoising_steps), below {sampler_floor:.3g}, where the scaled logits "
            "overflow float32: raise t_min or t_max")
    if n < 2:
        return
    fed_back = settings.temperature_at(2)  # the lowest temperature of a step whose logits are fed back
    feedback_floor = lowest_safe_temperature(cap, feedback_dtype)
    if fed_back < feedback_floor:
        name = str(feedback_dtype).removeprefix("torch.")
        raise ValueError(
            f"t_min and t_max: the temperature schedule falls to {fed_back:.3g} at step {n - 1} of {n}, below "
            f"{feedback_floor:.3g}, where the logits fed back to the next step overflow this model's {name}: "
            "raise t_min or t_max")


def encode_text(tokenizer, prompt: str, raw: bool, device: torch.device, thinking: bool = False) -> torch.LongTensor:
    """Token ids `[1, prompt_length]` of `prompt` on `device`: as is (`raw`, `<bos>` prepended where missing) or as a
    chat user turn (`chat_prompt_ids`, `thinking`: `enable_thinking`); `ValueError` for a bad prompt or thinking with
    a raw prompt or a template without it.
    """
    prompt = check_prompt(prompt)
    prompt = prompt.encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates become U+FFFD
    if thinking and (raw or not supports_thinking(tokenizer)):
        raise ValueError("thinking needs a chat prompt and a chat template with a thinking mode (enable_thinking); "
                         + ("this prompt is raw" if raw else "this model's template has none"))
    if raw:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        bos = tokenizer.bos_token_id
        if bos is not None and (ids.shape[1] == 0 or ids[0, 0].item() != bos):
            ids = torch.cat([torch.tensor([[bos]], dtype=ids.dtype), ids], dim=1)
    else:
        template_kwargs = {"enable_thinking": thinking} if supports_thinking(tokenizer) else {}
        ids = torch.tensor([chat_prompt_ids(tokenizer, prompt, **template_kwargs)], dtype=torch.long)
    return ids.to(device)


@dataclass(frozen=True)
class GenerationResult:
    """Summary of one finished run: ids (EOS kept), answer `text` and `thought` (`split_thought`), forwards,
    engine seconds and rates; `tokens` counts non-pad generated tokens, as `generate()` does.
    """

    token_ids: list[int]
    text: str
    frames: int
    forwards_per_block: list[int]
    seconds: float
    tokens_per_second: float
    tokens_per_forward: float
    time_to_first_frame_s: float
    prompt_tokens: int
    seed: int
    stop_reason: str
    tokens: int = 0
    thought: str = ""

    @property
    def forwards(self) -> int:
        """Decoder forwards in all."""
        return self.frames

    def to_dict(self) -> dict:
        """JSON-ready dict, `forwards` included."""
        return {**self.__dict__, "forwards": self.forwards}


class DiffusionEngine:
    """Runs block diffusion on text prompts, one `Frame` per decoder forward. Runs may be iterated from several
    threads at once; each keeps its own `RunRandomState`.
    """

    def __init__(self, loaded: LoadedModel):
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.source = loaded.source
        self.device = loaded.device
        self.token_text = token_text_for(self.tokenizer, self.model)
        self.recommended = DiffusionSettings.from_generation_config(self.model.generation_config)
        self.canvas_length = self.model.config.canvas_length
        self.context_limit = self.model.config.text_config.max_position_embeddings

    @property
    def supports_thinking(self) -> bool:
        """Whether this checkpoint's chat template has a thinking mode (`enable_thinking`, Gemma 4)."""
        return supports_thinking(self.tokenizer)

    def encode_prompt(self, prompt: str, raw: bool = False, thinking: bool = False) -> torch.LongTensor:
        """Token ids `[1, prompt_length]` on the model's device: `encode_text` (and its errors)."""
        return encode_text(self.tokenizer, prompt, raw, self.device, thinking=thinking)

    def check_budget(self, prompt_tokens: int, settings: DiffusionSettings) -> None:
        """Raise `ValueError` when the prompt plus whole canvases for `max_new_tokens` exceed the context window."""
        generated = math.ceil(settings.max_new_tokens / self.canvas_length) * self.canvas_length
        if prompt_tokens + generated > self.context_limit:
            raise ValueError(
                f"prompt is {prompt_tokens:,} tokens and {settings.max_new_tokens} new tokens take {generated:,} "
                f"(whole canvases of {self.canvas_length}); together over the model's context of "
                f"{self.context_limit:,} tokens: shorten the prompt or lower max_new_tokens")

    def check_settings(self, settings: DiffusionSettings) -> None:
        """Raise `ValueError` (one line naming the setting) for settings whose temperature schedule overflows
        this model's logits (`check_temperature_schedule`).
        """
        check_temperature_schedule(
            settings, logit_cap=getattr(self.model.config.get_text_config(), "final_logit_softcapping", None),
            feedback_dtype=self.model.model.decoder.embed_tokens.weight.dtype)

    def frames(self, prompt: str, settings: DiffusionSettings | None = None, *, raw: bool = False,
               seed: int | None = None, stop_event: threading.Event | None = None,
               thinking: bool = False) -> Iterator[Frame]:
        """Validate, encode and denoise `prompt`, one `Frame` per decoder forward (`denoise`); `ValueError` (before
        any work) for a bad prompt, seed, budget, settings or thinking request.
        """
        settings = settings or self.recommended
        seed = parse_seed(seed)
        self.check_settings(settings)
        input_ids = self.encode_prompt(prompt, raw=raw, thinking=thinking)
        self.check_budget(input_ids.shape[1], settings)
        return denoise(self.model, input_ids, settings, token_text=self.token_text, stop_event=stop_event,
                       random_state=RunRandomState(seed))

    def summarize(self, last: Frame, frames: int) -> GenerationResult:
        """The `GenerationResult` of a run whose last frame is `last`."""
        thought, answer = split_thought(list(last.committed_ids), self.tokenizer)
        return GenerationResult(
            token_ids=list(last.committed_ids), text=answer, thought=thought, frames=frames,
            forwards_per_block=list(last.forwards_per_block), seconds=last.elapsed_s,
            tokens_per_second=last.tokens_per_second, tokens_per_forward=last.tokens_per_forward,
            time_to_first_frame_s=last.time_to_first_frame_s, prompt_tokens=last.prompt_tokens, seed=last.seed,
            stop_reason=last.stop_reason, tokens=last.committed_tokens)

    def warm_up(self) -> float:
        """Pay a process's one-time first-run costs (one short chat and one raw run, seed 0); returns the seconds."""
        start = time.perf_counter()
        settings = self.recommended.replace(
            max_new_tokens=2 * self.canvas_length, max_denoising_steps=2, adaptive_stopping=False)
        for raw in (False, True):
            self.generate("Warm-up.", settings, raw=raw, seed=0)
        return time.perf_counter() - start

    def generate(self, prompt: str, settings: DiffusionSettings | None = None, **kwargs) -> GenerationResult:
        """Run to the end and return the summary (same arguments as `frames`)."""
        count, last = 0, None
        for last in self.frames(prompt, settings, **kwargs):
            count += 1
        return self.summarize(last, count)

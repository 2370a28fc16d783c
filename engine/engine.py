"""The engine's public face: prompt in, frames out. `DiffusionEngine` wraps a loaded model and its tokenizer."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .frames import Frame
from .generator import denoise
from .loading import LoadedModel
from .numerics import check_temperature_schedule
from .prompts import chat_prompt_ids, split_thought, supports_thinking
from .random_state import RunRandomState
from .settings import DiffusionSettings, check_prompt, parse_seed
from .tokens import token_text_for


def encode_text(tokenizer, prompt: str, raw: bool, device: torch.device, thinking: bool = False) -> torch.LongTensor:
    """Token ids `[1, prompt_length]` of `prompt` on `device`: as is (`raw`) or as one chat user turn with the
    generation prompt (the tokenizer's chat template). In a chat prompt the user's text is text: special-token
    strings typed in it (`<end_of_turn>`) are tokenized as plain pieces (`engine.prompts.chat_prompt_ids`); a raw
    prompt is tokenized as is, so special tokens may be typed there on purpose.

    A raw prompt starts with `<bos>`: Gemma 4's instruction-tuned tokenizer adds none (its chat template writes it),
    and Gemma output degrades without it, so it is prepended where the tokenizer left it out. `thinking` passes
    `enable_thinking=True` to a chat template that takes it (Gemma 4: the model may think in a thought channel first).

    Raises:
        ValueError: a bad prompt (`check_prompt`); `thinking` with a raw prompt or a template without thinking.
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
    """Summary of one finished run.

    token_ids: generated ids (EOS kept, pads after it dropped); text: their decoded text, special tokens skipped
    (the answer only when the model wrote a thought channel: see `thought`);
    frames: frames yielded (= decoder forwards); forwards_per_block: forwards each canvas used;
    seconds: engine time (prefill included); tokens_per_second: non-pad generated tokens / seconds;
    tokens_per_forward: non-pad generated tokens / forwards (as `generate()` computes it);
    time_to_first_frame_s; prompt_tokens; seed; stop_reason ("eos", "max_new_tokens", "cancelled");
    tokens: non-pad generated tokens, the count both rates use (EOS and other special tokens count, pads never:
    `generate()`'s `_compute_tokens_per_forward`; a pad mid-canvas does not stop generation, only EOS ids do);
    thought: the thought channel's text when the model wrote one (`engine.prompts.split_thought`), else "".
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
    """Runs DiffusionGemma block diffusion on text prompts, one frame per decoder forward.

    Args:
        loaded: a `LoadedModel` from `engine.loading.load_model`.

    Thread safety: several runs may be iterated from different threads at once; each keeps its own random state
    (`RunRandomState`), so its tokens do not depend on the others.
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
                f"{self.context_limit:,} tokens: shorten the prompt or lower max_new_tokens"
            )

    def check_settings(self, settings: DiffusionSettings) -> None:
        """Raise `ValueError` (one line naming the setting) for settings this model's arithmetic cannot run, such as
        a temperature schedule low enough to overflow its logits in its dtype (`engine.numerics`)."""
        check_temperature_schedule(
            settings, logit_cap=getattr(self.model.config.get_text_config(), "final_logit_softcapping", None),
            feedback_dtype=self.model.model.decoder.embed_tokens.weight.dtype)

    def frames(
        self,
        prompt: str,
        settings: DiffusionSettings | None = None,
        *,
        raw: bool = False,
        seed: int | None = None,
        stop_event: threading.Event | None = None,
        thinking: bool = False,
    ) -> Iterator[Frame]:
        """Validate, encode and denoise `prompt`, yielding one `Frame` per decoder forward (see `engine.generator`).
        `thinking`: let a Gemma 4 checkpoint think first (see `encode_prompt`).

        Raises:
            ValueError: bad prompt, seed, budget, settings or thinking request (before any work is done).
        """
        settings = settings or self.recommended
        seed = parse_seed(seed)
        self.check_settings(settings)
        input_ids = self.encode_prompt(prompt, raw=raw, thinking=thinking)
        self.check_budget(input_ids.shape[1], settings)
        return denoise(
            self.model, input_ids, settings, token_text=self.token_text, stop_event=stop_event,
            random_state=RunRandomState(seed),
        )

    def summarize(self, last: Frame, frames: int) -> GenerationResult:
        """The `GenerationResult` of a run whose last frame is `last`."""
        thought, answer = split_thought(list(last.committed_ids), self.tokenizer)
        return GenerationResult(
            token_ids=list(last.committed_ids),
            text=answer,
            thought=thought,
            frames=frames,
            forwards_per_block=list(last.forwards_per_block),
            seconds=last.elapsed_s,
            tokens_per_second=last.tokens_per_second,
            tokens_per_forward=last.tokens_per_forward,
            time_to_first_frame_s=last.time_to_first_frame_s,
            prompt_tokens=last.prompt_tokens,
            seed=last.seed,
            stop_reason=last.stop_reason,
            tokens=last.committed_tokens,
        )

    def warm_up(self) -> float:
        """Pay the one-time costs of a process's first run before a user does, and return the seconds it took.

        Runs one short generation through the chat template and one raw (two canvases of two decoder forwards each,
        adaptive stopping off) and discards them; other runs' random states are not touched.
        """
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

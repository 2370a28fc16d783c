"""The engine's public face: prompt in, frames out. `DiffusionEngine` wraps a loaded model and its tokenizer. Chat
prompts go through the chat template, message text kept as plain text (no typed control tokens); thoughts."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .frames import Frame, token_text_for
from .generator import RunRandomState, denoise
from .loading import LoadedModel
from .settings import DiffusionSettings, check_prompt, parse_seed

SAFETY = 2.0  # headroom for rounding on the overflow limits
UNCAPPED_LOGIT_BOUND = 1.0e4  # assumed logit bound of a model without a softcap
CHANNEL_OPEN, CHANNEL_CLOSE = "<|channel>", "<channel|>"
ROLES = ("system", "user", "assistant")


def _encode(tokenizer, text: str, **kwargs) -> list[int]:
    return tokenizer(text, add_special_tokens=False, **kwargs)["input_ids"] if text else []


def chat_template_text(tokenizer) -> str:
    """The tokenizer's chat template ("" for none; of several named ones, the default)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = template.get("default", next(iter(template.values()), ""))
    return template if isinstance(template, str) else ""


def supports_thinking(tokenizer) -> bool:
    """Whether the tokenizer's chat template takes `enable_thinking` (Gemma 4 checkpoints)."""
    return "enable_thinking" in chat_template_text(tokenizer)


def check_thinking(tokenizer, thinking: bool, raw: bool = False) -> None:
    """`ValueError` for thinking with a raw prompt or a chat template without a thinking mode."""
    if thinking and (raw or not supports_thinking(tokenizer)):
        raise ValueError("thinking needs a chat prompt and a chat template with a thinking mode (enable_thinking); "
                         + ("this prompt is raw" if raw else "this model's template has none"))


def chat_prompt_ids(tokenizer, content: str, **template_kwargs) -> list[int]:
    """Ids of `content` as one user turn plus the generation prompt (`conversation_ids`)."""
    return conversation_ids(tokenizer, [{"role": "user", "content": content}], **template_kwargs)


def split_thought(token_ids: list[int], tokenizer) -> tuple[str, str]:
    """(thought, answer) of generated ids: the thought is the `<|channel>`...`<channel|>` span, name line dropped."""
    vocab = tokenizer.get_vocab()
    open_id, close_id = vocab.get(CHANNEL_OPEN), vocab.get(CHANNEL_CLOSE)

    def text(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    if open_id not in token_ids:
        return "", text(token_ids)
    start = token_ids.index(open_id)
    end = token_ids.index(close_id, start) if close_id in token_ids[start:] else None
    _, newline, thought = text(token_ids[start + 1:end]).partition("\n")
    answer = token_ids[:start] + (token_ids[end + 1:] if end is not None else [])
    return thought.strip() if newline else "", text(answer)


def _placeholder(index: int) -> str:
    """A marker of private-use characters, which no template or tokenizer gives a meaning."""
    return f"\ue000diffgemma-text-{index}\ue001"


def check_messages(messages) -> list[dict]:
    """`messages` as {"role", "content"} dicts, lone surrogates replaced; `ValueError` for anything else."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("a conversation is a non-empty list of messages")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) - {"role", "content"}:
            raise ValueError(f"message {i} must be a dict with 'role' and 'content' only")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ValueError(f"message {i} has role {role!r}; allowed: {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"message {i} content must be text, got {type(content).__name__}")
        if "\ue000" in content and "\ue001" in content:
            raise ValueError(f"message {i} contains a reserved private-use sequence (U+E000 ... U+E001)")
        checked.append({"role": role, "content": content.encode("utf-8", errors="replace").decode("utf-8")})
    return checked


def conversation_ids(tokenizer, messages, **template_kwargs) -> list[int]:
    """Ids of `messages` through the chat template, texts as plain text; `ValueError` for bad messages or template."""
    messages = check_messages(messages)
    if not chat_template_text(tokenizer):
        raise ValueError("this model has no chat template: a conversation needs one")
    render = dict(add_generation_prompt=True, tokenize=False, **template_kwargs)
    rendered = tokenizer.apply_chat_template(messages, **render)
    skeleton = tokenizer.apply_chat_template(
        [{"role": m["role"], "content": _placeholder(i)} for i, m in enumerate(messages)], **render)
    parts, rest = [], skeleton
    for i in range(len(messages)):
        before, found, rest = rest.partition(_placeholder(i))
        if not found:
            raise ValueError("this model's chat template drops or repeats message text; the playground cannot keep "
                             "it apart from its markers")
        parts.append(before)
    parts.append(rest)
    for texts in ([m["content"] for m in messages], [m["content"].strip() for m in messages]):
        if "".join(p + t for p, t in zip(parts, texts)) + parts[-1] == rendered:
            break
    else:
        raise ValueError("this model's chat template changes message text in a way the playground cannot keep "
                         "apart from its markers")
    ids: list[int] = []
    for part, text in zip(parts, texts):
        ids += _encode(tokenizer, part) + _encode(tokenizer, text, split_special_tokens=True)
    return ids + _encode(tokenizer, parts[-1])


def check_temperature_schedule(settings: DiffusionSettings, *, logit_cap: float | None,
                               feedback_dtype: torch.dtype) -> None:
    """Refuse (`ValueError`) a t_min/t_max schedule whose scaled logits overflow float32 or `feedback_dtype`."""
    cap = float(logit_cap) if logit_cap else UNCAPPED_LOGIT_BOUND
    n, fed = settings.max_denoising_steps, str(feedback_dtype).removeprefix("torch.")
    for steps_left, dtype, scale, place, overflow in (  # the last step; the last step whose logits are fed back
            (1, torch.float32, 2, f"the last of {n} steps (t_min + (t_max - t_min) / max_denoising_steps)",
             "the scaled logits overflow float32"),
            (2, feedback_dtype, 1, f"step {n - 1} of {n}",
             f"the logits fed back to the next step overflow this model's {fed}")):
        temperature, floor = settings.temperature_at(steps_left), SAFETY * scale * cap / float(torch.finfo(dtype).max)
        if steps_left <= n and temperature < floor:
            raise ValueError(f"t_min and t_max: the temperature schedule falls to {temperature:.3g} at {place}, "
                             f"below {floor:.3g}, where {overflow}: raise t_min or t_max")


def encode_text(tokenizer, prompt: str, raw: bool, device: torch.device, thinking: bool = False) -> torch.LongTensor:
    """Ids `[1, n]` of `prompt` on `device`, raw (`<bos>` first) or as a chat turn; `ValueError` for bad input."""
    prompt = check_prompt(prompt)
    prompt = prompt.encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates become U+FFFD
    check_thinking(tokenizer, thinking, raw)
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
    """Summary of a finished run: ids (EOS kept), `text`, `thought`, forwards, engine seconds, rates, `tokens`."""

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
        return self.frames

    def to_dict(self) -> dict:
        return {**self.__dict__, "forwards": self.forwards}


class DiffusionEngine:
    """Runs block diffusion on text prompts, one `Frame` per decoder forward; runs are thread-safe."""

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
        return supports_thinking(self.tokenizer)

    def encode_prompt(self, prompt: str, raw: bool = False, thinking: bool = False) -> torch.LongTensor:
        return encode_text(self.tokenizer, prompt, raw, self.device, thinking=thinking)

    def budget(self, settings: DiffusionSettings) -> int:
        """Tokens a run may make: `max_new_tokens` rounded up to whole canvases."""
        return math.ceil(settings.max_new_tokens / self.canvas_length) * self.canvas_length

    def check_budget(self, prompt_tokens: int, settings: DiffusionSettings) -> None:
        """Raise `ValueError` when the prompt plus `budget(settings)` exceed the context window."""
        generated = self.budget(settings)
        if prompt_tokens + generated > self.context_limit:
            raise ValueError(
                f"prompt is {prompt_tokens:,} tokens and {settings.max_new_tokens} new tokens take {generated:,} "
                f"(whole canvases of {self.canvas_length}); together over the model's context of "
                f"{self.context_limit:,} tokens: shorten the prompt or lower max_new_tokens")

    def check_settings(self, settings: DiffusionSettings) -> None:
        check_temperature_schedule(
            settings, logit_cap=getattr(self.model.config.get_text_config(), "final_logit_softcapping", None),
            feedback_dtype=self.model.model.decoder.embed_tokens.weight.dtype)

    def frames(self, prompt: str, settings: DiffusionSettings | None = None, *, raw: bool = False,
               seed: int | None = None, stop_event: threading.Event | None = None,
               thinking: bool = False) -> Iterator[Frame]:
        """Check, encode and `denoise` `prompt`; `ValueError` (before any work) for bad input."""
        settings = settings or self.recommended
        seed = parse_seed(seed)
        self.check_settings(settings)
        input_ids = self.encode_prompt(prompt, raw=raw, thinking=thinking)
        self.check_budget(input_ids.shape[1], settings)
        return denoise(self.model, input_ids, settings, token_text=self.token_text, stop_event=stop_event,
                       random_state=RunRandomState(seed))

    def summarize(self, last: Frame, frames: int) -> GenerationResult:
        thought, answer = split_thought(list(last.committed_ids), self.tokenizer)
        return GenerationResult(
            token_ids=list(last.committed_ids), text=answer, thought=thought, frames=frames,
            forwards_per_block=list(last.forwards_per_block), seconds=last.elapsed_s,
            tokens_per_second=last.tokens_per_second, tokens_per_forward=last.tokens_per_forward,
            time_to_first_frame_s=last.time_to_first_frame_s, prompt_tokens=last.prompt_tokens, seed=last.seed,
            stop_reason=last.stop_reason, tokens=last.committed_tokens)

    def warm_up(self) -> float:
        """Pay a process's one-time costs (the token strings of the vocabulary, one short chat and one raw run,
        seed 0); returns the seconds."""
        start = time.perf_counter()
        self.token_text.describe_vocabulary()
        settings = self.recommended.replace(
            max_new_tokens=2 * self.canvas_length, max_denoising_steps=2, adaptive_stopping=False)
        for raw in (False, True):
            self.generate("Warm-up.", settings, raw=raw, seed=0)
        return time.perf_counter() - start

    def generate(self, prompt: str, settings: DiffusionSettings | None = None, **kwargs) -> GenerationResult:
        """Run to the end and return the summary (same arguments as `frames`)."""
        return self.summarize(*last_and_count(self.frames(prompt, settings, **kwargs)))


def last_and_count(frames) -> tuple:
    """(the last of `frames`, how many there were); (None, 0) for none."""
    count, last = 0, None
    for last in frames:
        count += 1
    return last, count

"""Prompt in, frames out: `DiffusionEngine`, chat templates, and `ChatSession` reusing the last turn's cache."""

import copy
import dataclasses
import itertools
import math
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from .frames import Frame, token_text_for
from .generator import denoise
from .randomness import RunRandomState
from .loading import LoadedModel
from .settings import DiffusionSettings, check_prompt, parse_seed
from .wording import plural

SAFETY = 2.0  # headroom on the overflow limits
UNCAPPED_LOGIT_BOUND = 1.0e4  # logit bound assumed without a softcap
CHANNEL_OPEN, CHANNEL_CLOSE = "<|channel>", "<channel|>"
ROLES = ("system", "user", "assistant")
PREFILL_POINTS = 16  # newest prefills the saving estimate is fitted to
_PROBE_ANSWER = "x"  # any text: only where the next turn's rendering differs matters


def _encode(tokenizer, text: str, **kwargs) -> list[int]:
    return tokenizer(text, add_special_tokens=False, **kwargs)["input_ids"] if text else []


def chat_template_text(tokenizer) -> str:
    """The tokenizer's (default) chat template, "" for none."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = template.get("default", next(iter(template.values()), ""))
    return template if isinstance(template, str) else ""


def supports_thinking(tokenizer) -> bool:
    """Whether the chat template takes `enable_thinking` (Gemma 4)."""
    return "enable_thinking" in chat_template_text(tokenizer)


def check_thinking(tokenizer, thinking: bool, raw: bool = False) -> None:
    """`ValueError` for thinking with a raw prompt or a template without a thinking mode."""
    if thinking and (raw or not supports_thinking(tokenizer)):
        raise ValueError("thinking needs a chat prompt and a template with a thinking mode (enable_thinking): "
                         + ("this prompt is raw" if raw else "this model's template has none"))


def chat_prompt_ids(tokenizer, content: str, **template_kwargs) -> list[int]:
    """Ids of `content` as one user turn plus the generation prompt."""
    return conversation_ids(tokenizer, [{"role": "user", "content": content}], **template_kwargs)


def split_thought(token_ids: list[int], tokenizer) -> tuple[str, str]:
    """(thought, answer) of generated ids; the thought is the `<|channel>` span, name line dropped."""
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
    """A private-use marker, meaningless to templates and tokenizers."""
    return f"\ue000diffgemma-text-{index}\ue001"


def check_messages(messages) -> list[dict]:
    """`messages` as {"role", "content"} dicts, lone surrogates replaced; `ValueError`."""
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
    """Ids of `messages` through the chat template, texts as plain text; `ValueError`."""
    messages = check_messages(messages)
    if not chat_template_text(tokenizer):
        raise ValueError("this model has no chat template: a conversation needs one")
    render = {"add_generation_prompt": True, "tokenize": False, **template_kwargs}
    rendered = tokenizer.apply_chat_template(messages, **render)
    skeleton = tokenizer.apply_chat_template(
        [{"role": m["role"], "content": _placeholder(i)} for i, m in enumerate(messages)], **render)
    parts, rest = [], skeleton
    for i in range(len(messages)):
        before, found, rest = rest.partition(_placeholder(i))
        if not found:
            raise ValueError("this model's chat template drops or repeats message text, so it cannot be told from "
                             "its markers")
        parts.append(before)
    parts.append(rest)
    for texts in ([m["content"] for m in messages], [m["content"].strip() for m in messages]):
        if "".join(p + t for p, t in zip(parts, texts)) + parts[-1] == rendered:
            break
    else:
        raise ValueError("this model's chat template changes message text, so it cannot be told from its markers")
    ids: list[int] = []
    for part, text in zip(parts, texts):
        ids += _encode(tokenizer, part) + _encode(tokenizer, text, split_special_tokens=True)
    return ids + _encode(tokenizer, parts[-1])


def encode_text(tokenizer, prompt: str, raw: bool, device: torch.device, thinking: bool = False) -> torch.LongTensor:
    """Ids `[1, n]` of `prompt` on `device`, raw (`<bos>` first) or as a chat turn; `ValueError`."""
    prompt = check_prompt(prompt).encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates: U+FFFD
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
    """A finished run; `token_ids` keep EOS, times are the engine clock."""

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
    """Block diffusion on text prompts, one `Frame` per decoder forward; thread-safe."""

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
        """`ValueError` when the prompt plus `budget(settings)` exceed the context window."""
        generated = self.budget(settings)
        if prompt_tokens + generated > self.context_limit:
            raise ValueError(f"prompt of {prompt_tokens:,} tokens plus {settings.max_new_tokens} new ones (whole "
                             f"canvases: {generated:,}) exceeds the model's context of {self.context_limit:,} tokens: "
                             "shorten the prompt or lower max_new_tokens")

    def check_settings(self, settings: DiffusionSettings) -> None:
        """`ValueError` for a t_min/t_max schedule whose scaled logits overflow float32 or the decoder's dtype."""
        cap = getattr(self.model.config.get_text_config(), "final_logit_softcapping", None) or UNCAPPED_LOGIT_BOUND
        feedback_dtype = self.model.model.decoder.embed_tokens.weight.dtype
        n, fed = settings.max_denoising_steps, str(feedback_dtype).removeprefix("torch.")
        for steps_left, dtype, scale, place, overflow in (  # the last step; the last whose logits are fed back
                (1, torch.float32, 2, f"the last of {n} steps", "the scaled logits overflow float32"),
                (2, feedback_dtype, 1, f"step {n - 1} of {n}",
                 f"the logits fed back to the next step overflow this model's {fed}")):
            temperature, floor = settings.temperature_at(steps_left), SAFETY * scale * cap / torch.finfo(dtype).max
            if steps_left <= n and temperature < floor:
                raise ValueError(f"t_min and t_max: the temperature schedule falls to {temperature:.3g} at {place}, "
                                 f"below {floor:.3g}, where {overflow}: raise t_min or t_max")

    def frames(self, prompt: str, settings: DiffusionSettings | None = None, *, raw: bool = False,
               seed: int | None = None, stop_event: threading.Event | None = None,
               thinking: bool = False, prompt_ids: Sequence[int] | None = None) -> Iterator[Frame]:
        """Check, encode and `denoise` `prompt` (`prompt_ids`: its ids, encoded at the door already);
        `ValueError` before any work."""
        settings = settings or self.recommended
        seed = parse_seed(seed)
        self.check_settings(settings)
        if prompt_ids is None:
            input_ids = self.encode_prompt(prompt, raw=raw, thinking=thinking)
        else:
            input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
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
        """Pay one-time costs (the vocabulary's strings, a short chat and raw run); the seconds."""
        start = time.perf_counter()
        self.token_text.describe_vocabulary()
        settings = self.recommended.replace(
            max_new_tokens=2 * self.canvas_length, max_denoising_steps=2, adaptive_stopping=False)
        for raw in (False, True):
            self.generate("Warm-up.", settings, raw=raw, seed=0)
        return time.perf_counter() - start

    def generate(self, prompt: str, settings: DiffusionSettings | None = None, **kwargs) -> GenerationResult:
        """Run to the end and return the summary (arguments as `frames`)."""
        return self.summarize(*last_and_count(self.frames(prompt, settings, **kwargs)))


def last_and_count(frames) -> tuple:
    """(the last of `frames`, their count); (None, 0) for none."""
    count, last = 0, None
    for last in frames:
        count += 1
    return last, count


@dataclass(frozen=True)
class TurnReport:
    """What a chat turn encoded and reused; `prefill_saved_s` is an estimate."""

    prompt_tokens: int
    reused_tokens: int
    encoded_tokens: int
    prefill_s: float
    prefill_saved_s: float | None
    dropped_turns: int = 0
    note: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def encode_into_cache(model, cache, ids: torch.LongTensor):
    """`generate()`'s prefill of `ids` `[1, n]` after what `cache` holds; the extended `cache`."""
    start, n = cache.get_seq_length(), ids.shape[1]
    position_ids = torch.arange(start, start + n, dtype=torch.int32, device=ids.device).unsqueeze(0)
    attention_mask = torch.ones((1, start + n), dtype=torch.bool, device=ids.device)
    unprocessed, masks = model._prepare_encoder_inputs(
        input_ids=ids, attention_mask=attention_mask, encoder_position_ids=position_ids, past_key_values=cache,
        is_prefill=True, canvas_length=model.config.canvas_length, batch_size=1)
    return model.model.encoder(input_ids=unprocessed, attention_mask=masks, past_key_values=cache,
                               position_ids=position_ids).past_key_values


def marginal_seconds_per_token(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of (tokens, seconds) `points`; None unless positive and fitted."""
    if len({n for n, _ in points}) < 2:
        return None
    slope = statistics.linear_regression(*zip(*points)).slope
    return slope if slope > 0 else None


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class ChatSession:
    """One visitor's conversation and its previous turn's KV cache; `system` survives cuts."""

    def __init__(self, engine: DiffusionEngine, system: str | None = None):
        self.engine = engine
        self.messages: list[dict] = check_messages([{"role": "system", "content": system}]) if system else []
        self.thoughts: list[str] = []  # of each answer, never fed back
        self.last_report: TurnReport | None = None
        self.last_result: GenerationResult | None = None
        self._cache = None  # holds exactly self._cache_ids
        self._cache_ids: list[int] = []
        self._prefills: list[tuple[int, float]] = []  # (tokens, seconds) of the latest encoder calls
        self._cache_prefill_s = 0.0  # prefill seconds that encoded what the cache holds
        self._cache_answered = False  # whether the turn that filled the cache ended in an answer

    def clear(self) -> None:
        """Forget the conversation and its cache, not the system message."""
        self.messages = [m for m in self.messages if m["role"] == "system"]
        self.thoughts, self.last_report, self.last_result = [], None, None
        self._cache, self._cache_ids, self._cache_prefill_s, self._cache_answered = None, [], 0.0, False

    def _ids(self, messages, thinking: bool) -> list[int]:
        extra = {"enable_thinking": thinking} if self.engine.supports_thinking else {}
        return conversation_ids(self.engine.tokenizer, messages, **extra)

    def _fit(self, messages: list[dict], thinking: bool, settings: DiffusionSettings) -> tuple[list, list[int], int]:
        for dropped in itertools.count():
            ids = self._ids(messages, thinking)
            try:
                self.engine.check_budget(len(ids), settings)
                return messages, ids, dropped
            except ValueError:
                first = next((i for i, m in enumerate(messages) if m["role"] != "system"), None)
                if first is None or first == len(messages) - 1:
                    raise  # the new user turn alone does not fit
                end = first + 1
                while end < len(messages) - 1 and messages[end]["role"] != "user":
                    end += 1
                messages = messages[:first] + messages[end:]

    def turn(self, text: str, settings: DiffusionSettings | None = None, *, seed: int | None = None,
             thinking: bool = False, stop_event: threading.Event | None = None) -> Iterator[Frame]:
        """The answer to `text`, one `Frame` per forward (a completed turn joins `messages`); `ValueError`."""
        text = check_prompt(text)
        settings = settings or self.engine.recommended
        random_state = RunRandomState(parse_seed(seed))
        self.engine.check_settings(settings)
        check_thinking(self.engine.tokenizer, thinking)
        messages, ids, dropped = self._fit(self.messages + [{"role": "user", "content": text}], thinking, settings)
        probe = self._ids(messages + [{"role": "assistant", "content": _PROBE_ANSWER},
                                      {"role": "user", "content": _PROBE_ANSWER}], thinking)
        stable = min(_common_prefix(ids, probe), len(ids) - 1)  # denoise needs a token of its own
        self.last_result = self.last_report = None
        return self._run(messages, ids, stable, dropped, settings, random_state, stop_event)

    def regenerate(self, settings: DiffusionSettings | None = None, *, seed: int | None = None,
                   thinking: bool = False, stop_event: threading.Event | None = None) -> Iterator[Frame]:
        """The last user message answered again, replacing the answer; `ValueError`."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            raise ValueError("nothing to regenerate: the conversation has no answer yet")
        text = self.messages[-2]["content"]
        kept_messages, kept_thoughts = self.messages, self.thoughts
        self.messages, self.thoughts = self.messages[:-2], self.thoughts[:-1]
        try:
            frames = self.turn(text, settings, seed=seed, thinking=thinking, stop_event=stop_event)
        except ValueError:
            self.messages, self.thoughts = kept_messages, kept_thoughts
            raise
        return self._restore_on_cancel(frames, kept_messages, kept_thoughts)

    def _restore_on_cancel(self, frames, kept_messages, kept_thoughts):
        done = False
        for frame in frames:
            done = frame.done and frame.stop_reason != "cancelled"
            yield frame
        if not done:
            self.messages, self.thoughts = kept_messages, kept_thoughts

    def _run(self, messages, ids, stable, dropped, settings, random_state, stop_event):
        model, device = self.engine.model, self.engine.device
        reused = _common_prefix(self._cache_ids, ids)
        restarted = self._cache is not None and not (reused == len(self._cache_ids) and reused <= stable)
        changed = restarted and self._cache_answered  # not merely a stopped turn's message typed anew
        if self._cache is not None and not restarted:
            base = self._cache  # extended in place
        else:  # no cache, or the history changed before its end (a cut, a thinking switch): encode it all
            reused = 0
            generation_config, _ = model._prepare_generation_config(None, **settings.generate_kwargs())
            base = model._prepare_cache_for_generation(generation_config, 1, len(ids) + settings.max_new_tokens)
        tensor = torch.tensor([ids], dtype=torch.long, device=device)
        start = time.perf_counter()
        with torch.no_grad():
            if stable > reused:
                base = encode_into_cache(model, base, tensor[:, reused:stable])
            if device.type == "cuda":
                torch.cuda.synchronize()
        prefill_s = time.perf_counter() - start
        reused_cost_s = self._cache_prefill_s if reused else 0.0
        # Keep the prefix for the next turn whatever happens; denoise extends a copy
        self._cache, self._cache_ids, self._cache_prefill_s = base, ids[:stable], reused_cost_s + prefill_s
        self._cache_answered = False
        cache = copy.deepcopy(base)
        count, last = 0, None
        for frame in denoise(model, tensor[:, stable:], settings, token_text=self.engine.token_text,
                             stop_event=stop_event, random_state=random_state, past_key_values=cache):
            count, last = count + 1, dataclasses.replace(frame, prompt_tokens=len(ids))
            yield last
        if last is None or not last.done or last.stop_reason == "cancelled":
            return
        result = self.engine.summarize(last, count)
        if stable > reused:
            self._prefills = [*self._prefills, (stable - reused, prefill_s)][-PREFILL_POINTS:]
        rate = marginal_seconds_per_token(self._prefills)
        notes = [f"{plural(dropped, 'oldest turn')} cut to fit the model's context of "
                 f"{self.engine.context_limit:,} tokens" if dropped else "",
                 "the conversation's start changed (a cut or a thinking switch): encoded in full"
                 if changed else ""]
        self.last_report = TurnReport(
            prompt_tokens=len(ids), reused_tokens=reused, encoded_tokens=len(ids) - reused, prefill_s=prefill_s,
            prefill_saved_s=None if rate is None or not reused else min(reused * rate, reused_cost_s),
            dropped_turns=dropped, note="; ".join(filter(None, notes)))
        self.last_result, self._cache_answered = result, True
        answers = sum(m["role"] == "assistant" for m in messages)  # the newest, kept by the cut
        self.messages = messages + [{"role": "assistant", "content": result.text}]
        self.thoughts = self.thoughts[len(self.thoughts) - answers:] + [result.thought]

    def reply(self, text: str, settings: DiffusionSettings | None = None,
              **kwargs) -> tuple[GenerationResult, TurnReport]:
        """Run a turn to the end: (result, report); `ValueError`, `RuntimeError` if cancelled."""
        last_and_count(self.turn(text, settings, **kwargs))
        if self.last_result is None:
            raise RuntimeError("the turn was cancelled")
        return self.last_result, self.last_report

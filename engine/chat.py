"""Multi-turn chat reusing the previous turn's encoder cache for the shared prefix; old turns cut to fit."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .engine import DiffusionEngine, GenerationResult, check_messages, check_thinking, conversation_ids
from .frames import Frame
from .generator import RunRandomState, denoise
from .settings import DiffusionSettings, check_prompt, parse_seed

PREFILL_POINTS = 16  # the prefills (newest) the saving estimate's slope is fitted to
_PROBE_ANSWER = "x"  # any text: only where the next turn's rendering starts to differ matters


@dataclass(frozen=True)
class TurnReport:
    """What one chat turn encoded and reused, its prefill seconds (measured, saved estimate) and turns cut."""

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
    """`generate()`'s prefill of `ids` `[1, n]` after the tokens `cache` holds, extending and returning `cache`."""
    start, n = cache.get_seq_length(), ids.shape[1]
    position_ids = torch.arange(start, start + n, dtype=torch.int32, device=ids.device).unsqueeze(0)
    attention_mask = torch.ones((1, start + n), dtype=torch.bool, device=ids.device)
    unprocessed, masks = model._prepare_encoder_inputs(
        input_ids=ids, attention_mask=attention_mask, encoder_position_ids=position_ids, past_key_values=cache,
        is_prefill=True, canvas_length=model.config.canvas_length, batch_size=1)
    return model.model.encoder(input_ids=unprocessed, attention_mask=masks, past_key_values=cache,
                               position_ids=position_ids).past_key_values


def marginal_seconds_per_token(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of seconds over tokens of (tokens, seconds) `points`; None unless positive and fitted."""
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
        self.thoughts: list[str] = []  # thought text of each answer, shown apart, never fed back
        self.last_report: TurnReport | None = None
        self.last_result: GenerationResult | None = None
        self._cache = None  # KV cache holding exactly self._cache_ids
        self._cache_ids: list[int] = []
        self._prefills: list[tuple[int, float]] = []  # (tokens, seconds) of the latest encoder calls
        self._cache_prefill_s = 0.0  # measured prefill seconds that encoded what the cache holds

    def clear(self) -> None:
        """Forget the conversation and its cache (the system message stays)."""
        self.messages = [m for m in self.messages if m["role"] == "system"]
        self.thoughts, self.last_report, self.last_result = [], None, None
        self._cache, self._cache_ids, self._cache_prefill_s = None, [], 0.0

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
                    raise  # only the new user turn is left: it alone does not fit
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
        stable = min(_common_prefix(ids, probe), len(ids) - 1)  # denoise needs at least one token of its own
        self.last_result = self.last_report = None
        return self._run(messages, ids, stable, dropped, settings, random_state, stop_event)

    def regenerate(self, settings: DiffusionSettings | None = None, *, seed: int | None = None,
                   thinking: bool = False, stop_event: threading.Event | None = None) -> Iterator[Frame]:
        """The last user message answered again, replacing the last answer; `ValueError` as `turn`."""
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
        reused = _common_prefix(self._cache_ids, ids) if self._cache is not None else 0
        restarted = self._cache is not None and not (reused == len(self._cache_ids) and reused <= stable)
        if self._cache is not None and not restarted:
            base = self._cache  # extended in place: it keeps holding exactly self._cache_ids
        else:  # no cache yet, or the history changed before its end (a cut, a thinking switch): encode it all
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
        # Keep the prefix for the next turn whatever happens to this answer; denoise extends a copy
        self._cache, self._cache_ids, self._cache_prefill_s = base, ids[:stable], reused_cost_s + prefill_s
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
        notes = [f"{dropped} oldest turn{'s' if dropped != 1 else ''} cut to fit the model's context of "
                 f"{self.engine.context_limit:,} tokens" if dropped else "",
                 "the conversation's start changed (turns cut or thinking switched): encoded in full"
                 if restarted else ""]
        cut_note = "; ".join(n for n in notes if n)
        self.last_report = TurnReport(
            prompt_tokens=len(ids), reused_tokens=reused, encoded_tokens=len(ids) - reused, prefill_s=prefill_s,
            prefill_saved_s=None if rate is None or not reused else min(reused * rate, reused_cost_s),
            dropped_turns=dropped, note=cut_note)
        self.last_result = result
        answers = sum(m["role"] == "assistant" for m in messages)  # those the cut kept, the newest
        self.messages = messages + [{"role": "assistant", "content": result.text}]
        self.thoughts = self.thoughts[len(self.thoughts) - answers:] + [result.thought]

    def reply(self, text: str, settings: DiffusionSettings | None = None,
              **kwargs) -> tuple[GenerationResult, TurnReport]:
        """Run a turn to the end: (result, report); errors as `turn`, `RuntimeError` if cancelled."""
        for _ in self.turn(text, settings, **kwargs):
            pass
        if self.last_result is None:
            raise RuntimeError("the turn was cancelled")
        return self.last_result, self.last_report

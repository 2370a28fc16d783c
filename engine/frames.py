"""The frame, one per decoder forward (plain lists), the type the UI reads; token strings and kinds, cached."""

import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from transformers.convert_slow_tokenizer import bytes_to_unicode

TEXT, BYTE, PAD, EOS, SPECIAL = "text", "byte", "pad", "eos", "special"
TOKEN_KINDS = (TEXT, BYTE, PAD, EOS, SPECIAL)
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# Gemma 4 markers: <|turn>, <turn|>, <|think|>, <|channel> ... (never ordinary text, special flag or not)
_PIPE_MARKER = re.compile(r"<\|[^<>\s]*>|<[^<>\s]*\|>")


@dataclass(frozen=True)
class Frame:
    """The canvas after one decoder forward; per-position lists have length `canvas_length`.

    input_ids/draft_ids: the noisy canvas read and its argmax draft; accepted: kept by the sampler this forward;
    confidence: draft probability; entropy: nats; first_accepted_step: -1 until accepted; remelted: accepted earlier
    in the block, renoised now; top_*: the k likeliest tokens, draft first (empty if not recorded); *_tokens: display
    strings; *_kinds: `TOKEN_KINDS` (empty if not classified). committed_ids: ids of finished blocks (EOS kept, pads
    after it dropped); committed_tokens: the non-pad ones. Times: the engine clock. stop_reason: "eos",
    "max_new_tokens", "cancelled" or "filled" (infill) on the last frame, else "".
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
        return sum(self.accepted)

    @property
    def remelted_count(self) -> int:
        return sum(self.remelted)

    @property
    def mean_entropy(self) -> float:
        """Mean per-position entropy, nats."""
        return sum(self.entropy) / max(1, len(self.entropy))

    def to_dict(self) -> dict:
        return asdict(self)


class FrameBuilder:
    """Builds a run's frames from per-forward records, deriving first-accepted steps, re-melts and rates."""

    def __init__(self, canvas_length: int, max_denoising_steps: int, *, prompt_tokens: int, seed: int,
                 token_text: Callable[[int], str], token_kind: Callable[[int], str] | None = None,
                 remelts: bool = True):
        self.canvas_length, self.max_denoising_steps = canvas_length, max_denoising_steps
        self.prompt_tokens, self.seed, self.remelts = prompt_tokens, seed, remelts
        self.token_text, self.token_kind = token_text, token_kind or getattr(token_text, "kind", None)
        self.forwards = self.block_remelts = 0
        self.forwards_per_block: list[int] = []
        self.first_accepted: list[int] = []
        self.first_frame_s: float | None = None

    def add(self, *, step_index: int, input_ids: list[int], draft_ids: list[int], accepted: list[bool],
            block_done: bool, elapsed_s: float, committed_tokens: int, top_ids=(), build: bool = True,
            **fields) -> Frame | None:
        """The next forward's `Frame` (`fields`: its other fields); with `build` False only count it."""
        if step_index == 0:
            self.first_accepted, self.block_remelts = [-1] * self.canvas_length, 0
        remelted = [s >= 0 and not a for a, s in zip(accepted, self.first_accepted)] if self.remelts else []
        self.block_remelts += sum(remelted)
        self.first_accepted = [step_index if a and s < 0 else s for a, s in zip(accepted, self.first_accepted)]
        self.forwards += 1
        if self.first_frame_s is None:
            self.first_frame_s = elapsed_s
        if block_done:
            self.forwards_per_block.append(step_index + 1)
        if not build:
            return None
        ids = [*input_ids, *draft_ids, *(i for row in top_ids for i in row)]
        strings, kinds = self._describe(ids)
        n, k = len(input_ids), len(top_ids[0]) if top_ids else 0
        return Frame(
            step_index=step_index, forward_index=self.forwards - 1, canvas_length=self.canvas_length,
            max_denoising_steps=self.max_denoising_steps, input_ids=list(input_ids), draft_ids=list(draft_ids),
            accepted=list(accepted), first_accepted_step=list(self.first_accepted), remelted=remelted,
            block_remelts=self.block_remelts, input_tokens=strings[:n], draft_tokens=strings[n:2 * n],
            input_kinds=kinds[:n], draft_kinds=kinds[n:2 * n], top_ids=list(top_ids),
            top_tokens=[strings[2 * n + p * k:2 * n + (p + 1) * k] for p in range(len(top_ids))], block_done=block_done,
            committed_tokens=committed_tokens, forwards_per_block=list(self.forwards_per_block), elapsed_s=elapsed_s,
            time_to_first_frame_s=self.first_frame_s,
            tokens_per_second=committed_tokens / elapsed_s if elapsed_s > 0 else 0.0,
            tokens_per_forward=committed_tokens / self.forwards, prompt_tokens=self.prompt_tokens, seed=self.seed,
            **fields)

    def _describe(self, ids: list[int]) -> tuple[list[str], list[str]]:
        many = getattr(self.token_text, "describe_many", None)
        if many is not None:
            strings, kinds = zip(*many(ids)) if ids else ((), ())
            return list(strings), list(kinds)
        kind = self.token_kind
        return [self.token_text(i) for i in ids], [kind(i) for i in ids] if kind else []


def byte_display(data: bytes) -> str:
    """Bytes as byte-piece text, `<0xE2><0x80>`: a `byte` token's display string."""
    return "".join(f"<0x{b:02X}>" for b in data)


def parse_byte_display(text: str) -> bytes:
    """The bytes of a `byte` token's display string; b"" if it is not one."""
    pieces = _BYTE_PIECE.findall(text)
    if not pieces or "".join(f"<0x{p}>" for p in pieces) != text:
        return b""
    return bytes(int(p, 16) for p in pieces)


class TokenText:
    """Display string and kind (`TOKEN_KINDS`) of a token id, cached; strings are raw: escape them."""

    def __init__(self, tokenizer, *, eos_token_ids: int | Iterable[int] | None = None,
                 pad_token_id: int | None = None, special_ids: Iterable[int] = ()):
        self._tokenizer = tokenizer
        self._size = len(tokenizer)
        self._cache: dict[int, tuple[str, str]] = {}
        self.eos_ids = frozenset(eos_id_list(tokenizer.eos_token_id if eos_token_ids is None else eos_token_ids))
        self.pad_id = tokenizer.pad_token_id if pad_token_id is None else pad_token_id
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self._added = frozenset(added)
        self.special_ids = frozenset({int(i) for i in tokenizer.all_special_ids}
                                     | {int(i) for i, token in added.items()
                                        if getattr(token, "special", False) or _PIPE_MARKER.fullmatch(str(token))}
                                     | {int(i) for i in special_ids if i is not None})
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend = backend if hasattr(backend, "decode_batch") and hasattr(backend, "id_to_token") else None
        decoder = getattr(backend, "decoder", None)
        byte_level = type(decoder).__name__ == "ByteLevel"  # GPT-2's printable-character alphabet
        self._byte_level = {char: byte for byte, char in bytes_to_unicode().items()} if byte_level else None

    def __call__(self, token_id: int) -> str:
        return self.describe(token_id)[0]

    def kind(self, token_id: int) -> str:
        return self.describe(token_id)[1]

    def describe(self, token_id: int) -> tuple[str, str]:
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self._cache[token_id] = self._describe(token_id)
        return cached

    def describe_many(self, token_ids: list[int]) -> list[tuple[str, str]]:
        """`describe` of each id, the uncached decoded in one backend batch."""
        cache = self._cache
        missing = sorted(i for i in set(token_ids).difference(cache) if 0 <= i < self._size)
        if missing and self._backend is not None:
            texts = self._backend.decode_batch([[i] for i in missing], skip_special_tokens=False)
            for token_id, text in zip(missing, texts):
                cache[token_id] = self._describe(token_id, text, self._backend.id_to_token(token_id))
        describe = self.describe
        return [cache.get(i) or describe(i) for i in token_ids]

    def describe_vocabulary(self) -> None:
        """Cache every id of the vocabulary now (seconds at 262,144 ids)."""
        self.describe_many(list(range(self._size)))

    @property
    def described(self) -> int:
        """How many ids are cached."""
        return len(self._cache)

    def _describe(self, token_id: int, text: str | None = None, piece: str | None = None) -> tuple[str, str]:
        if not 0 <= token_id < self._size:
            return f"<id:{token_id}>", SPECIAL
        piece = self._tokenizer.convert_ids_to_tokens(token_id) if piece is None else piece
        if token_id == self.pad_id or token_id in self.eos_ids or token_id in self.special_ids:
            return str(piece), PAD if token_id == self.pad_id else EOS if token_id in self.eos_ids else SPECIAL
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if token_id in self._added:
            return text, TEXT
        match = _BYTE_PIECE.fullmatch(piece or "")
        if match:
            return byte_display(bytes([int(match.group(1), 16)])), BYTE
        if "\ufffd" in text and self._byte_level is not None and piece and all(c in self._byte_level for c in piece):
            return byte_display(bytes(self._byte_level[c] for c in piece)), BYTE
        return text, TEXT


def eos_id_list(eos_token_id: int | Iterable[int] | None) -> list[int]:
    """A generation config's `eos_token_id` (int, list or None) as a list of ints."""
    if eos_token_id is None:
        return []
    return [eos_token_id] if isinstance(eos_token_id, int) else [int(i) for i in eos_token_id]


def token_text_for(tokenizer, model) -> TokenText:
    """The `TokenText` of a model: EOS and pad from its generation config, its `*_token_id`s special."""
    generation, config = getattr(model, "generation_config", None), getattr(model, "config", None)
    marker_ids = [value for name, value in (config.to_dict() if config is not None else {}).items()
                  if name.endswith("_token_id") and isinstance(value, int)]
    return TokenText(tokenizer, eos_token_ids=getattr(generation, "eos_token_id", None),
                     pad_token_id=getattr(generation, "pad_token_id", None), special_ids=marker_ids)

"""Display strings and kinds (text, byte piece, pad, EOS, special) of single tokens, cached per id."""

from __future__ import annotations

import re
from collections.abc import Iterable

from transformers.convert_slow_tokenizer import bytes_to_unicode

TEXT, BYTE, PAD, EOS, SPECIAL = "text", "byte", "pad", "eos", "special"
TOKEN_KINDS = (TEXT, BYTE, PAD, EOS, SPECIAL)
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# Gemma 4 markers: <|turn>, <turn|>, <|think|>, <|channel>, <|image> ... (never ordinary text, special flag or not)
_PIPE_MARKER = re.compile(r"<\|[^<>\s]*>|<[^<>\s]*\|>")


def byte_display(data: bytes) -> str:
    """Bytes as byte-piece text, `<0xE2><0x80>`: a `byte` token's display string (`parse_byte_display` reverses it)."""
    return "".join(f"<0x{b:02X}>" for b in data)


def parse_byte_display(text: str) -> bytes:
    """The bytes of a `byte` token's display string (`<0xE2><0x80>` -> b"\\xe2\\x80"); b"" if it is not one."""
    pieces = _BYTE_PIECE.findall(text)
    if not pieces or "".join(f"<0x{p}>" for p in pieces) != text:
        return b""
    return bytes(int(p, 16) for p in pieces)


class TokenText:
    """Display string and kind (`TOKEN_KINDS`) of a token id, cached. Strings are raw model output: escape them."""

    def __init__(self, tokenizer, *, eos_token_ids: int | Iterable[int] | None = None,
                 pad_token_id: int | None = None, special_ids: Iterable[int] = ()):
        self._tokenizer = tokenizer
        self._size = len(tokenizer)
        self._cache: dict[int, tuple[str, str]] = {}
        if eos_token_ids is None:
            eos_token_ids = tokenizer.eos_token_id
        self.eos_ids = frozenset(eos_id_list(eos_token_ids))
        self.pad_id = tokenizer.pad_token_id if pad_token_id is None else pad_token_id
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self._added = frozenset(added)
        self.special_ids = frozenset(
            {int(i) for i in tokenizer.all_special_ids}
            | {int(i) for i, token in added.items() if getattr(token, "special", False)
               or _PIPE_MARKER.fullmatch(str(token))}
            | {int(i) for i in special_ids if i is not None}
        )
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend = backend if hasattr(backend, "decode_batch") and hasattr(backend, "id_to_token") else None
        decoder = getattr(backend, "decoder", None)
        byte_level = type(decoder).__name__ == "ByteLevel"  # GPT-2's alphabet: printable character -> byte
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
        """`describe` of each id, the uncached ones decoded in one batch by the tokenizer's backend."""
        cache = self._cache
        missing = sorted(i for i in set(token_ids).difference(cache) if 0 <= i < self._size)
        if missing and self._backend is not None:
            texts = self._backend.decode_batch([[i] for i in missing], skip_special_tokens=False)
            for token_id, text in zip(missing, texts):
                cache[token_id] = self._describe(token_id, text, self._backend.id_to_token(token_id))
        describe = self.describe
        return [cache.get(i) or describe(i) for i in token_ids]

    def describe_vocabulary(self) -> None:
        """Cache every id of the vocabulary now (seconds at 262,144 ids), so that frames only look strings up."""
        self.describe_many(list(range(self._size)))

    @property
    def described(self) -> int:
        """How many ids are cached."""
        return len(self._cache)

    def _describe(self, token_id: int, text: str | None = None, piece: str | None = None) -> tuple[str, str]:
        if not 0 <= token_id < self._size:
            return f"<id:{token_id}>", SPECIAL
        if token_id == self.pad_id or token_id in self.eos_ids or token_id in self.special_ids:
            piece = self._tokenizer.convert_ids_to_tokens(token_id) if piece is None else piece
            kind = PAD if token_id == self.pad_id else EOS if token_id in self.eos_ids else SPECIAL
            return str(piece), kind
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if token_id in self._added:
            return text, TEXT
        piece = self._tokenizer.convert_ids_to_tokens(token_id) if piece is None else piece
        match = _BYTE_PIECE.fullmatch(piece or "")
        if match:
            return byte_display(bytes([int(match.group(1), 16)])), BYTE
        if "\ufffd" in text and self._byte_level is not None and piece and all(c in self._byte_level for c in piece):
            return byte_display(bytes(self._byte_level[c] for c in piece)), BYTE
        return text, TEXT


def eos_id_list(eos_token_id: int | Iterable[int] | None) -> list[int]:
    """A generation config's `eos_token_id` (int, list or None) as a list of ints, in its order."""
    if eos_token_id is None:
        return []
    return [eos_token_id] if isinstance(eos_token_id, int) else [int(i) for i in eos_token_id]


def token_text_for(tokenizer, model) -> TokenText:
    """The `TokenText` of a loaded model: EOS and pad from its generation config, its config's `*_token_id`s special."""
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    pad = getattr(generation, "pad_token_id", None)
    config = getattr(model, "config", None)
    marker_ids = [value for name, value in (config.to_dict() if config is not None else {}).items()
                  if name.endswith("_token_id") and isinstance(value, int)]
    return TokenText(tokenizer, eos_token_ids=eos, pad_token_id=pad, special_ids=marker_ids)

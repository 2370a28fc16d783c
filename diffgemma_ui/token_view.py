"""What one canvas position shows by token kind: text with whitespace visible, special tokens as a label, byte
pieces read together as UTF-8 (a character on its first byte, the rest "+80 94", a lone byte "0xE2")."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from engine.frames import BYTE, EOS, PAD, SPECIAL, TEXT, parse_byte_display

from .text import escape_html, marked_token_html, visible_token

_MARKER = re.compile(r"<(\|?)([^<>|]*)(\|?)>")
_ID = re.compile(r"<id:(-?\d+)>")
_CONTROL_NAMES = {PAD: "pad", EOS: "end-of-sequence", SPECIAL: "special token"}


@dataclass(frozen=True)
class TokenCell:
    """One position's look: `text` (unescaped), `html` (escaped), `style` (a `dg-tok-*` class: a token kind,
    "bytes", "bytecont"), `detail` (tooltip line)."""

    text: str
    html: str
    style: str
    detail: str = ""


def _cell(text: str, style: str, detail: str = "") -> TokenCell:
    return TokenCell(text, escape_html(text), style, detail)


def special_label(piece: str) -> str:
    """A special token's label: `<pad>` "pad", `<|turn>` "turn start", `<turn|>` "turn end", `<id:N>` "id N"."""
    piece = str(piece)
    match = _ID.fullmatch(piece)
    if match:
        return f"id {match.group(1)}"
    match = _MARKER.fullmatch(piece)
    if match:
        opens, name, closes = match.groups()
        name = name.replace("_", " ").strip() or "marker"
        if opens and not closes:
            return f"{name} start"
        if closes and not opens:
            return f"{name} end"
        return name
    return piece.strip("<>[]|") or "special"


def _utf8_units(data: bytes) -> list[tuple[int, int, str | None]]:
    """`data` as UTF-8 characters (start, end, char), (i, i + 1, None) for a byte that starts none."""
    units, i = [], 0
    while i < len(data):
        lead = data[i]
        size = 1 if lead < 0x80 else 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else (
            4 if 0xF0 <= lead <= 0xF4 else 0)
        if size and i + size <= len(data):
            try:
                units.append((i, i + size, data[i:i + size].decode("utf-8")))
                i += size
                continue
            except UnicodeDecodeError:
                pass
        units.append((i, i + 1, None))
        i += 1
    return units


def _hex(data: bytes) -> str:
    return " ".join(f"{b:02X}" for b in data)


def _byte_run(pieces: list[bytes]) -> list[TokenCell]:
    """The cells of consecutive byte positions, read as one UTF-8 string."""
    data = b"".join(pieces)
    owner = []  # owner[byte offset] = index of the position holding that byte
    for index, piece in enumerate(pieces):
        owner.extend([index] * len(piece))
    shown: list[list[str]] = [[] for _ in pieces]
    notes: list[list[str]] = [[] for _ in pieces]
    for begin, end, char in _utf8_units(data):
        first, last = owner[begin], owner[end - 1]
        if char is None:
            shown[first].append(f"0x{data[begin]:02X}")
            notes[first].append(f"byte 0x{data[begin]:02X}: not a whole UTF-8 character here")
            continue
        visible = visible_token(char)
        shown[first].append(visible)
        spread = f" over {last - first + 1} positions" if last > first else ""
        notes[first].append(f"bytes {_hex(data[begin:end])}{spread} = \u201c{visible}\u201d")
        for index in range(first + 1, last + 1):
            notes[index].append(f"continues \u201c{visible}\u201d from {index - first} "
                                f"position{'s' if index - first != 1 else ''} before")
    cells = []
    for piece, texts, lines in zip(pieces, shown, notes):
        if texts and all(t.startswith("0x") and len(t) == 4 for t in texts):
            cells.append(_cell(" ".join(texts), "byte", "; ".join(lines)))
        elif texts:
            cells.append(_cell("".join(texts), "bytes", "; ".join(lines)))
        else:
            cells.append(_cell(f"+{_hex(piece)}", "bytecont", "; ".join(lines)))
    return cells


def token_cells(tokens: Sequence[str], kinds: Sequence[str] | None = None,
                groups: Sequence[object] | None = None) -> list[TokenCell]:
    """A `TokenCell` per token (`kinds` None: all text); bytes read together within runs of equal `groups` keys."""
    n = len(tokens)
    kinds = list(kinds) if kinds else [TEXT] * n
    groups = list(groups) if groups is not None else [None] * n
    cells: list[TokenCell] = []
    pos = 0
    while pos < n:
        kind, token = kinds[pos], tokens[pos]
        if kind == BYTE and parse_byte_display(token):
            end = pos + 1
            while end < n and kinds[end] == BYTE and groups[end] == groups[pos] and parse_byte_display(tokens[end]):
                end += 1
            cells.extend(_byte_run([parse_byte_display(t) for t in tokens[pos:end]]))
            pos = end
        else:
            cells.append(_single_cell(token, kind))
            pos += 1
    return cells


@functools.lru_cache(maxsize=65536)
def _single_cell(token: str, kind: str) -> TokenCell:
    if kind in _CONTROL_NAMES:
        return _cell(special_label(token), kind, f"{_CONTROL_NAMES[kind]} {token}: a control symbol, not text")
    return TokenCell(visible_token(token), marked_token_html(token), "text")


def draft_labels(frame) -> list[str]:
    """Each position's draft token as one plain line for hover labels, special tokens with their kind."""
    cells = token_cells(frame.draft_tokens, frame.draft_kinds or None)
    return [f"{cell.text} ({_CONTROL_NAMES[cell.style]})" if cell.style in _CONTROL_NAMES else cell.text
            for cell in cells]

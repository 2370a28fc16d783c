"""What one canvas position shows by token kind: visible whitespace, special tokens' labels, bytes read as UTF-8."""

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from engine.frames import BYTE, EOS, PAD, SPECIAL, TEXT, parse_byte_display

from .text import escape_html, marked_token_html, plural, visible_token

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
    if match := _ID.fullmatch(piece):
        return f"id {match.group(1)}"
    if match := _MARKER.fullmatch(piece):
        opens, name, closes = match.groups()
        name = name.replace("_", " ").strip() or "marker"
        if opens and not closes:
            return f"{name} start"
        if closes and not opens:
            return f"{name} end"
        return name
    return piece.strip("<>[]|") or "special"


def _hex(data: bytes) -> str:
    return " ".join(f"{b:02X}" for b in data)


def _byte_run(pieces: list[bytes]) -> list[TokenCell]:
    """The cells of consecutive byte positions, read as one UTF-8 string (a byte of no character on its own)."""
    data = b"".join(pieces)
    owner = [index for index, piece in enumerate(pieces) for _ in piece]  # byte offset -> its position's index
    shown: list[list[str]] = [[] for _ in pieces]
    notes: list[list[str]] = [[] for _ in pieces]
    end = 0
    for char in data.decode("utf-8", errors="surrogateescape"):  # a byte of no character: a lone surrogate
        begin, lone = end, "\udc80" <= char <= "\udcff"
        end += 1 if lone else len(char.encode("utf-8"))
        first, last = owner[begin], owner[end - 1]
        if lone:
            shown[first].append(f"0x{data[begin]:02X}")
            notes[first].append(f"byte 0x{data[begin]:02X}: not a whole UTF-8 character here")
            continue
        visible = visible_token(char)
        shown[first].append(visible)
        spread = f" over {last - first + 1} positions" if last > first else ""
        notes[first].append(f"bytes {_hex(data[begin:end])}{spread} = \u201c{visible}\u201d")
        for index in range(first + 1, last + 1):
            notes[index].append(f"continues \u201c{visible}\u201d from {plural(index - first, 'position')} before")
    cells = []
    for piece, texts, lines in zip(pieces, shown, notes):
        if texts and all(t.startswith("0x") and len(t) == 4 for t in texts):
            text, style = " ".join(texts), "byte"
        else:
            text, style = ("".join(texts), "bytes") if texts else (f"+{_hex(piece)}", "bytecont")
        cells.append(_cell(text, style, "; ".join(lines)))
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
    """Each position's draft token as a plain line for hover labels, special tokens with their kind."""
    cells = token_cells(frame.draft_tokens, frame.draft_kinds or None)
    return [f"{cell.text} ({_CONTROL_NAMES[cell.style]})" if cell.style in _CONTROL_NAMES else cell.text
            for cell in cells]

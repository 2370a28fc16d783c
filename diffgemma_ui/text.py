"""Making raw model strings safe and visible (the one place token text is escaped for HTML and Plotly), and the
page's own prose, read from `assets/text/page.md`."""

from __future__ import annotations

import functools
import html
import re
import unicodedata
from pathlib import Path

# Whitespace shown as visible marks (the chip keeps the token's shape without invisible characters).
_VISIBLE = {
    " ": "\u00b7",  # middle dot
    "\n": "\u21b5",  # downwards arrow with corner leftwards
    "\r": "\\r",  # carriage return, as C writes it
    "\t": "\u21e5",  # rightwards arrow to bar
}
# Format characters that reorder or hide text (bidi embeddings/overrides/isolates, zero-width, BOM).
_SHOW_AS_CODE = {0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029, 0x2060, 0xFEFF}
_SHOW_AS_CODE.update(range(0x202A, 0x202F))
_SHOW_AS_CODE.update(range(0x2066, 0x206A))
EMPTY_TOKEN = "\u2205"  # empty set: a token that decodes to nothing
PROSE_PATH = Path(__file__).resolve().parent.parent / "assets" / "text" / "page.md"


@functools.cache
def _prose_sections() -> dict[str, str]:
    sections, name = {}, None
    for line in PROSE_PATH.read_text(encoding="utf-8").splitlines():
        marker = re.fullmatch(r"<!-- (\S+) -->", line)
        if marker:
            name = marker.group(1)
            sections[name] = []
        elif line.startswith("#"):
            name = None
        elif name is not None:
            sections[name].append(line)
    return {key: "\n\n".join(" ".join(part.split("\n")) for part in "\n".join(lines).strip().split("\n\n"))
            for key, lines in sections.items()}


def prose(name: str) -> str:
    """The page text `name` of `PROSE_PATH` (from its `<!-- name -->` line to the next marker or heading; wrapped
    lines joined by spaces, paragraphs by a blank line), `{fields}` left to the caller. KeyError: no such section."""
    return _prose_sections()[name]


@functools.lru_cache(maxsize=65536)
def _visible(token: str) -> str:
    out = []
    for char in token:
        code = ord(char)
        if char in _VISIBLE:
            out.append(_VISIBLE[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code in _SHOW_AS_CODE or unicodedata.category(char) in ("Cc", "Cs", "Co", "Cn") and code > 0x7F:
            out.append(f"\u27e8U+{code:04X}\u27e9")
        else:
            out.append(char)
    return "".join(out)


def visible_token(token: str) -> str:
    """`token` with whitespace and invisible characters as visible marks, unescaped: "·" space, "↵" newline,
    "⇥" tab, "\\r" and `\\xNN` for ASCII controls (plain ASCII: every font has it), `⟨U+XXXX⟩` for other controls,
    bidi and zero-width characters; "" as "∅"."""
    if not isinstance(token, str):
        token = str(token)
    if token == "":
        return EMPTY_TOKEN
    return _visible(token)


def escape_html(text: str) -> str:
    """`text` escaped for HTML content and quoted attributes, also `$ { }` and the backtick (Gradio templates)."""
    if not isinstance(text, str):
        text = str(text)
    return (html.escape(text, quote=True).replace("$", "&#36;").replace("{", "&#123;").replace("}", "&#125;")
            .replace("`", "&#96;"))


@functools.lru_cache(maxsize=65536)
def token_html(token: str) -> str:
    """A raw token as safe HTML text (cached)."""
    return escape_html(visible_token(token))


@functools.lru_cache(maxsize=65536)
def marked_token_html(token: str) -> str:
    """`token_html`, each whitespace mark in a `<span class="dg-sp">`."""
    if not isinstance(token, str):
        token = str(token)
    if not any(char in _VISIBLE for char in token):
        return token_html(token)
    return "".join(f'<span class="dg-sp">{_VISIBLE[char]}</span>' if char in _VISIBLE else token_html(char)
                   for char in token)


def escape_plotly(text: str) -> str:
    """`text` escaped for Plotly labels, titles and ticks."""
    if not isinstance(text, str):
        text = str(text)
    return html.escape(text, quote=True)


def plain_text(text: str) -> str:
    """Text for a plain-text widget: lone surrogates replaced, all else verbatim."""
    if not isinstance(text, str):
        text = str(text)
    return text.encode("utf-8", errors="replace").decode("utf-8")

"""The one place raw model strings are made visible and escaped (HTML, Plotly), and the page's prose."""

import functools
import html
import re
import unicodedata
from pathlib import Path

from engine.wording import plural  # noqa: F401 - the views' plural rule, with the rest of their text helpers

_VISIBLE = {" ": "\u00b7", "\n": "\u21b5", "\r": "\\r", "\t": "\u21e5"}  # whitespace as visible marks
# Format characters that reorder or hide text (bidi embeddings/overrides/isolates, zero-width, BOM)
_SHOW_AS_CODE = {*range(0x200B, 0x2010), *range(0x2028, 0x202F), 0x2060, *range(0x2066, 0x206A), 0xFEFF}
EMPTY_TOKEN = "\u2205"  # empty set: a token that decodes to nothing
PROSE_PATH = Path(__file__).resolve().parent.parent / "assets" / "text" / "page.md"


@functools.cache
def _prose_sections() -> dict[str, str]:
    sections, name = {}, None
    for line in PROSE_PATH.read_text(encoding="utf-8").splitlines():
        if marker := re.fullmatch(r"<!-- (\S+) -->", line):
            name = marker.group(1)
            sections[name] = []
        elif line.startswith("#"):
            name = None
        elif name is not None:
            sections[name].append(line)
    return {key: "\n\n".join(" ".join(part.split("\n")) for part in "\n".join(lines).strip().split("\n\n"))
            for key, lines in sections.items()}


def prose(name: str) -> str:
    """The `<!-- name -->` section of `PROSE_PATH` (to the next marker or heading), lines joined; KeyError: none."""
    return _prose_sections()[name]


@functools.lru_cache(maxsize=65536)
def visible_token(token: str) -> str:
    """`token` unescaped: whitespace as marks, ASCII controls as `\\xNN`, invisibles as `⟨U+XXXX⟩`, "" as "∅"."""
    out = []
    for char in str(token):
        code = ord(char)
        if char in _VISIBLE:
            out.append(_VISIBLE[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif code in _SHOW_AS_CODE or unicodedata.category(char) in ("Cc", "Cs", "Co", "Cn") and code > 0x7F:
            out.append(f"\u27e8U+{code:04X}\u27e9")
        else:
            out.append(char)
    return "".join(out) or EMPTY_TOKEN


def escape_html(text: str) -> str:
    """`text` escaped for HTML content and quoted attributes, also `$ { }` and the backtick (Gradio templates)."""
    return (html.escape(str(text), quote=True).replace("$", "&#36;").replace("{", "&#123;").replace("}", "&#125;")
            .replace("`", "&#96;"))


@functools.lru_cache(maxsize=65536)
def token_html(token: str) -> str:
    """A raw token as safe HTML text (cached)."""
    return escape_html(visible_token(token))


@functools.lru_cache(maxsize=65536)
def marked_token_html(token: str) -> str:
    """`token_html`, each whitespace mark in a `<span class="dg-sp">`."""
    token = str(token)
    if not any(char in _VISIBLE for char in token):
        return token_html(token)
    return "".join(f'<span class="dg-sp">{_VISIBLE[char]}</span>' if char in _VISIBLE else token_html(char)
                   for char in token)


def escape_plotly(text: str) -> str:
    """`text` escaped for Plotly labels, titles and ticks."""
    return html.escape(str(text), quote=True)


def plain_text(text: str) -> str:
    """Text for a plain-text widget: lone surrogates replaced, all else verbatim."""
    return str(text).encode("utf-8", errors="replace").decode("utf-8")

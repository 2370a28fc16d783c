"""Making raw model strings safe and visible: the only place token text is escaped.

Token strings come straight from the model and the tokenizer: they may hold markup (`<script>`), quotes,
whitespace, newlines, control characters, bidirectional overrides, emoji or right-to-left text. Every view goes
through these helpers before a string reaches HTML or a Plotly label.
"""

from __future__ import annotations

import functools
import html
import unicodedata

# Whitespace shown as visible marks (the chip keeps the token's shape without invisible characters).
_VISIBLE = {
    " ": "\u00b7",  # middle dot
    "\n": "\u21b5",  # downwards arrow with corner leftwards
    "\r": "\u240d",  # symbol for carriage return
    "\t": "\u21e5",  # rightwards arrow to bar
}
# Format characters that reorder or hide text (bidi embeddings/overrides/isolates, zero-width, BOM).
_SHOW_AS_CODE = {0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029, 0x2060, 0xFEFF}
_SHOW_AS_CODE.update(range(0x202A, 0x202F))
_SHOW_AS_CODE.update(range(0x2066, 0x206A))
EMPTY_TOKEN = "\u2205"  # empty set: a token that decodes to nothing


@functools.lru_cache(maxsize=65536)
def _visible(token: str) -> str:
    out = []
    for char in token:
        code = ord(char)
        if char in _VISIBLE:
            out.append(_VISIBLE[char])
        elif code < 0x20:
            out.append(chr(0x2400 + code))  # control pictures block: ␀..␟
        elif code == 0x7F:
            out.append("\u2421")  # ␡
        elif code in _SHOW_AS_CODE or unicodedata.category(char) in ("Cc", "Cs", "Co", "Cn") and code > 0x7F:
            out.append(f"\u27e8U+{code:04X}\u27e9")
        else:
            out.append(char)
    return "".join(out)


def visible_token(token: str) -> str:
    """Return `token` with whitespace and invisible characters replaced by visible marks (still unescaped).

    Spaces become "·", newlines "↵", tabs "⇥", C0/C1 control characters their Unicode control picture or
    `⟨U+XXXX⟩`, bidi overrides/isolates and zero-width characters `⟨U+XXXX⟩`. Emoji and right-to-left letters are
    kept as they are. An empty string becomes "∅". Non-strings are converted with `str()` first.
    """
    if not isinstance(token, str):
        token = str(token)
    if token == "":
        return EMPTY_TOKEN
    return _visible(token)


def escape_html(text: str) -> str:
    """Escape `text` for HTML element content *and* quoted attribute values.

    Besides `& < > " '` (html.escape with quote=True) it also encodes `$`, `{`, `}` and the backtick, so a token
    can never form a template placeholder in Gradio's HTML component templates.
    """
    if not isinstance(text, str):
        text = str(text)
    return (
        html.escape(text, quote=True)
        .replace("$", "&#36;")
        .replace("{", "&#123;")
        .replace("}", "&#125;")
        .replace("`", "&#96;")
    )


@functools.lru_cache(maxsize=65536)
def token_html(token: str) -> str:
    """A raw token as safe HTML text: `visible_token` then `escape_html` (cached: vocabularies repeat)."""
    return escape_html(visible_token(token))


@functools.lru_cache(maxsize=65536)
def marked_token_html(token: str) -> str:
    """`token_html`, with each whitespace mark ("·" for a space, as a "▁" piece decodes; "↵", "⇥", "␍") wrapped
    in `<span class="dg-sp">` so that CSS can show it as a subtle marker apart from the token's own characters."""
    if not isinstance(token, str):
        token = str(token)
    if not any(char in _VISIBLE for char in token):
        return token_html(token)
    return "".join(
        f'<span class="dg-sp">{_VISIBLE[char]}</span>' if char in _VISIBLE else token_html(char) for char in token
    )


def escape_plotly(text: str) -> str:
    """Escape `text` for Plotly hover labels, titles and tick labels (whitespace kept as is).

    Plotly renders a subset of HTML (`<br>`, `<b>`, `<a href>`...) in these strings and decodes entities, so
    `html.escape` shows markup as literal text.
    """
    if not isinstance(text, str):
        text = str(text)
    return html.escape(text, quote=True)


@functools.lru_cache(maxsize=65536)
def token_plotly(token: str) -> str:
    """A raw token for a Plotly label: `visible_token` then `escape_plotly` (cached: vocabularies repeat)."""
    return escape_plotly(visible_token(token))


def plain_text(text: str) -> str:
    """Text for a plain-text widget (e.g. a Textbox): lone surrogates replaced, everything else kept verbatim."""
    if not isinstance(text, str):
        text = str(text)
    return text.encode("utf-8", errors="replace").decode("utf-8")

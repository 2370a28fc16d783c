"""The thought channel, shown apart from the answer."""

from __future__ import annotations

from .text import escape_html, plain_text


def thought_html(thought: str) -> str:
    """The thought channel's text (`GenerationResult.thought`) as a collapsed `<details>` labelled "Thought",
    escaped; "" when there is none.
    """
    if not thought or not thought.strip():
        return ""
    words = len(thought.split())
    return ('<details class="dg-thought"><summary>Thought \u00b7 '
            f"{words:,} word{'s' if words != 1 else ''} (the model's reasoning before its answer; not part of the "
            f'answer)</summary><div class="dg-thought-text">{escape_html(plain_text(thought))}</div></details>')

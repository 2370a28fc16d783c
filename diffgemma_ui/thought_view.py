"""The thought channel, shown apart from the answer: a collapsed, labelled `<details>` (pure function, escaped)."""

from __future__ import annotations

from .text import escape_html, plain_text


def thought_html(thought: str) -> str:
    """The model's thought channel as a collapsed `<details>` labelled "Thought", or "" when there is none.

    Args:
        thought: the thought channel's text (`GenerationResult.thought`: markers and the channel name removed).

    Returns:
        HTML text; the thought is escaped and kept apart from the answer (which the generated-text box shows).
    """
    if not thought or not thought.strip():
        return ""
    words = len(thought.split())
    return (
        '<details class="dg-thought"><summary>Thought \u00b7 '
        f"{words:,} word{'s' if words != 1 else ''} (the model's reasoning before its answer; "
        "not part of the answer)</summary>"
        f'<div class="dg-thought-text">{escape_html(plain_text(thought))}</div></details>'
    )

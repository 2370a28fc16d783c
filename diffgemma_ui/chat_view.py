"""The Chat tab's views: the conversation transcript and the note on what the encoder cache saved (pure, escaped).

Every message text (the visitor's and the model's) is untrusted: it goes through `text.escape_html` and is shown
as plain text (CSS keeps its line breaks), never as Markdown or HTML. The thought channel of an answer is shown
apart, collapsed and labelled (`thought_view.thought_html`).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.chat import TurnReport

from .text import escape_html, plain_text
from .thought_view import thought_html

EMPTY_CHAT_HTML = ('<div class="dg-chat-history dg-empty" data-turns="0"><p>Write a message and press <b>Send</b>: '
                   "each answer is denoised on the canvas beside the conversation (below it on a phone), and later "
                   "turns reuse the encoder cache of earlier ones.</p></div>")
IDLE_REUSE_HTML = ('<div class="dg-chat-reuse" data-state="idle">Cache reuse: the first turn encodes its whole '
                   "prompt; each later turn encodes only what is new.</div>")
ROLE_LABELS = {"system": "System", "user": "You", "assistant": "Model"}


def _bubble(role: str, text: str, *, extra: str = "", state: str = "") -> str:
    label = ROLE_LABELS.get(role, role)
    body = escape_html(plain_text(text)) if text else '<span class="dg-chat-empty">(empty answer)</span>'
    state_attr = f' data-state="{escape_html(state)}"' if state else ""
    return (f'<div class="dg-chat-msg dg-chat-{escape_html(role)}"{state_attr}>'
            f'<div class="dg-chat-role">{escape_html(label)}</div>{extra}'
            f'<div class="dg-chat-text">{body}</div></div>')


def history_html(messages: Sequence[dict], thoughts: Sequence[str] = (), *, pending_user: str | None = None,
                 pending_answer: str = "", pending_state: str = "writing", cut_turns: int = 0) -> str:
    """The conversation as HTML: one bubble per message, the answer being denoised last.

    Args:
        messages: [{"role": "system" | "user" | "assistant", "content": str}, ...] as the model sees them
            (`ChatSession.messages`: answers without their thought channel).
        thoughts: the thought text of each assistant message, in order (`ChatSession.thoughts`); "" for none.
        pending_user: the user message of the turn in progress (None: no turn in progress).
        pending_answer: the answer so far (committed blocks); pending_state: "writing" or "stopped".
        cut_turns: oldest turns cut from this conversation so far to fit the context (a note says so).

    Returns:
        HTML text; the outer element has `data-turns` (user messages shown) for tests.
    """
    if not messages and pending_user is None and not cut_turns:
        return EMPTY_CHAT_HTML
    parts = []
    if cut_turns:
        parts.append(f'<p class="dg-chat-cut">{cut_turns} oldest turn{"s" if cut_turns != 1 else ""} cut to fit '
                     "the model's context: the model no longer sees them.</p>")
    answers = 0
    for message in messages:
        extra = ""
        if message["role"] == "assistant":
            thought = thoughts[answers] if answers < len(thoughts) else ""
            extra = thought_html(thought)
            answers += 1
        parts.append(_bubble(message["role"], message["content"], extra=extra))
    turns = sum(1 for m in messages if m["role"] == "user")
    if pending_user is not None:
        turns += 1
        parts.append(_bubble("user", pending_user))
        tag = ("writing\u2026" if pending_state == "writing"
               else "stopped: this turn is not kept in the conversation")
        parts.append(_bubble("assistant", pending_answer, state=pending_state,
                             extra=f'<div class="dg-chat-tag">{escape_html(tag)}</div>')
                     .replace('<span class="dg-chat-empty">(empty answer)</span>', ""))
    # the log sits in a column-reverse scroller (assets/chat_infill.css), which keeps its newest end in view
    return f'<div class="dg-chat-history" data-turns="{turns}"><div class="dg-chat-log">{"".join(parts)}</div></div>'


def reuse_html(report: TurnReport | None, turn: int = 0, *, regenerated: bool = False) -> str:
    """What the turn's encoder cache saved: prompt tokens reused (not re-encoded), encoded, prefill seconds, the
    estimated saving, and the history-cut note ("" in `report.note`: none). `IDLE_REUSE_HTML` for None. `turn`: the
    turn's number (0: none shown); `regenerated`: its answer was regenerated.

    The outer element carries `data-reused`, `data-prompt` and `data-encoded` (tokens) for tests.
    """
    if report is None:
        return IDLE_REUSE_HTML
    saved = (f" \u00b7 about {report.prefill_saved_s * 1000:,.1f} ms of prefill saved (estimate: reused tokens "
             "\u00d7 the extra prefill time per token measured in this conversation, at most what encoding them "
             "took)"
             if report.reused_tokens and report.prefill_saved_s is not None else "")
    head = f"Turn {turn}{' (regenerated)' if regenerated else ''} \u00b7 " if turn else ""
    text = (f"{head}prompt {report.prompt_tokens:,} tokens: {report.reused_tokens:,} reused from the previous "
            f"turn's cache (not re-encoded), {report.encoded_tokens:,} encoded \u00b7 prefill "
            f"{report.prefill_s * 1000:,.1f} ms{saved}")
    note = f'<div class="dg-chat-cut">{escape_html(report.note)}</div>' if report.note else ""
    return (f'<div class="dg-chat-reuse" data-state="done" data-reused="{report.reused_tokens}" '
            f'data-prompt="{report.prompt_tokens}" data-encoded="{report.encoded_tokens}">'
            f"{escape_html(text)}{note}</div>")

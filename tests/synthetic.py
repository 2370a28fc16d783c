"""Synthetic frames, the Playground canvas of them, stand-ins for an engine's token texts and model, and an HTML tag
collector, shared by the view and security tests (no model needed)."""

from __future__ import annotations

from collections.abc import Sequence
from html.parser import HTMLParser

from diffgemma_ui.canvas_view import EMPTY_CANVAS_HTML, legend_html, live_html, stack_html
from engine import Frame
from engine.frames import TEXT


def synthetic_frame(n: int, tokens: list[str], *, step: int = 0, block: int = 0, accepted: list[bool] | None = None,
                    input_tokens: list[str] | None = None, committed: list[int] | None = None, **changes) -> Frame:
    """A `Frame` of an `n`-position canvas whose draft shows `tokens` (the noisy input: `input_tokens`, default
    `noise<i>`); every third position accepted unless `accepted` is given. `changes` override any other field."""
    accepted = accepted if accepted is not None else [i % 3 == 0 for i in range(n)]
    fields = dict(
        block_index=block, step_index=step, forward_index=block * 10 + step, canvas_length=n,
        max_denoising_steps=8, temperature=0.8 - 0.05 * step,
        input_ids=list(range(100, 100 + n)), draft_ids=list(range(n)), accepted=accepted,
        confidence=[(i + 1) / n for i in range(n)], entropy=[0.1 * i for i in range(n)],
        first_accepted_step=[(step if a else -1) for a in accepted],
        input_tokens=input_tokens if input_tokens is not None else [f"noise<{i}>" for i in range(n)],
        draft_tokens=tokens, block_done=False, block_stopped_early=False, done=False,
        committed_ids=committed if committed is not None else [], committed_tokens=len(committed or []),
        forwards_per_block=[], elapsed_s=1.5 + step, time_to_first_frame_s=0.25,
        tokens_per_second=12.5, tokens_per_forward=2.0, prompt_tokens=5, seed=42, stop_reason="",
    )
    fields.update(changes)
    return Frame(**fields)


class ListTokenText:
    """A `DiffusionEngine.token_text` stand-in: id -> `tokens[id % len(tokens)]`; `kind(id)` classifies ids (default:
    every one is text)."""

    def __init__(self, tokens: Sequence[str], kind=lambda token_id: TEXT):
        self.tokens, self.kind = list(tokens), kind

    def __call__(self, token_id: int) -> str:
        return self.tokens[token_id % len(self.tokens)]


class StubModel:
    """What a fake engine's `model` must have for `engine.trace.ModelInfo.of` (the feed's model line)."""

    config = None
    dtype = "float32"


class TagCollector(HTMLParser):
    """The start tags of an HTML fragment with their attributes, its decoded text, and its attribute values."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.attribute_values: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.attribute_values.extend(value or "" for _, value in attrs)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)

    def handle_data(self, data):
        self.text.append(data)


def parse_html(fragment: str) -> TagCollector:
    """`fragment` fed through a `TagCollector`."""
    collector = TagCollector()
    collector.feed(fragment)
    collector.close()
    return collector


def canvas_html(finished: Sequence[Frame], live: Frame | None, *, finished_html: Sequence[str] | None = None,
                status: str = "") -> str:
    """The legend, `stack_html` and `live_html` in one string, as the Playground shows them."""
    newest = live if live is not None else (finished[-1] if finished else None)
    if newest is None and not status:
        return EMPTY_CANVAS_HTML
    return (legend_html() + stack_html(finished, finished_html=finished_html)
            + live_html(live, newest=newest, status=status))

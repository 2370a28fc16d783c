"""Driving the Playground tab's handlers without a browser, as the page triggers them: the check step, then the run
step that streams the run's frames to the page's player as feed messages."""

from __future__ import annotations

import json

STREAM_FIELDS = ("feed", "text", "thought", "generate_button", "stop_button")


def page_run(tab, session, *inputs) -> list[tuple]:
    """`request_run` then the whole `generate_stream` of `inputs` (prompt, raw, the table's settings, seed and
    optionally thinking): the stream's outputs."""
    ticket, *_ = tab.request_run(session, *inputs)
    return list(tab.generate_stream(session, ticket))


def messages(outputs) -> list[dict]:
    """The feed messages among stream `outputs` (tuples whose first item is the feed), decoded."""
    return [json.loads(out[0]) for out in outputs if isinstance(out[0], str) and out[0]]


def fed_frames(outputs) -> list[dict]:
    """Every frame (replay data) the feed carried, in order, each once."""
    frames: list[dict] = []
    for message in messages(outputs):
        if "frames" in message:
            frames[message["start"]:] = message["frames"]
    return frames

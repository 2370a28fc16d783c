"""The live presenter's data: the session's run (live, last, or a replayed trace) as the replay player's JSON, in
chunks of the frames the page (`assets/replay/present.js`) lacks."""

from __future__ import annotations

import dataclasses
import json

import gradio as gr

from engine.trace import ModelInfo, Trace, player_script, replay_data, script_json

from .tab import PRIVATE, UNQUEUED

PRESENT_SCRIPTS = ("format.js", "tokens.js", "views.js", "player.js", "present.js")


def present_head() -> str:
    """The page-head script of the player and its presenter overlay."""
    return f"<script>{player_script(names=PRESENT_SCRIPTS)}</script>"


def run_frames(session) -> tuple[list, Trace | None]:
    """The frames of the session's run on the page and their trace (None: a run of this app)."""
    snap, trace = getattr(session, "snapshot", None), getattr(session, "trace", None)
    if snap is not None and snap.blocks:
        if trace is not None and snap.blocks[0][0] is trace.frames[0]:
            return list(trace.frames), trace
        return snap.frames(), None
    return (list(trace.frames), trace) if trace is not None else ([], None)


def present_chunk(engine, session, have) -> str:
    """JSON of the session's run's frames after `have` ("key:count"): `replay_data` and `key` (null: no run)."""
    frames, trace = run_frames(session)
    request = getattr(session, "request", None)
    if not frames or (trace is None and request is None):
        return json.dumps({"key": None})
    key = str(id(frames[0]))
    held, _, count = str(have or "").partition(":")
    start = int(count) if held == key and count.isdigit() else 0
    new = frames[start:]
    if not new:
        return json.dumps({"key": key, "frames": []})
    if trace is not None:
        part = dataclasses.replace(trace, frames=tuple(new))
    else:
        ids = {i for f in new for row in (f.input_ids, f.draft_ids, *f.top_ids) for i in row}
        kinds = {i: k for f in new for row, ks in ((f.input_ids, f.input_kinds), (f.draft_ids, f.draft_kinds))
                 for i, k in zip(row, ks) if k != "text"} if all(f.input_kinds for f in new) else None
        part = Trace(model=ModelInfo.of(engine), settings=request.settings, seed=new[-1].seed, prompt=request.prompt,
                     raw=request.raw, prompt_ids=(), tokens={i: engine.token_text(i) for i in ids}, text="",
                     frames=tuple(new), kinds=kinds)
    data = replay_data(part)
    data.update(key=key, prompt_tokens=new[-1].prompt_tokens if trace is None else data["prompt_tokens"])
    return script_json(data)


def wire_presenter(playground, session, present: gr.Button) -> None:
    """The `present` button and the hidden components the presenter polls through."""
    present.click(None, js="() => window.dgPresenter.open()", **PRIVATE)
    have = gr.Textbox(visible="hidden", elem_id="dg-present-have")
    chunk = gr.Textbox(visible="hidden", elem_id="dg-present-data")
    poll = gr.Button(visible="hidden", elem_id="dg-present-poll")
    poll.click(lambda s, h: present_chunk(playground.engine, s, h), inputs=[session, have], outputs=[chunk],
               js="(s, h) => [s, window.dgPresenter.have()]", queue=False, **UNQUEUED).then(
        None, [chunk], None, js="(c) => window.dgPresenter.feed(c)", **PRIVATE)

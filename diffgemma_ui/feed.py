"""The Playground player's feed: a run's frames as JSON chunks of the browser player's data, and the meter of a
state that has no frame (queued, refused, left the queue). The page's `dgLive.feed` reads each message."""

import dataclasses
import itertools
import json

from engine import DiffusionEngine, Frame
from engine.trace import ModelInfo, Trace, frame_tokens, replay_data, script_json

from .validation import RunRequest

_SEQUENCE = itertools.count(1)  # each message's `seq`: the page applies each once, in order (next() is atomic)


def meter_message(meter_html: str, *, error: str = "") -> str:
    """A feed message that sets the meter to `meter_html` (escaped by its maker); `error`: why the run failed."""
    return json.dumps({"seq": next(_SEQUENCE), "meter": meter_html, "error": error})


def run_key(frames: list[Frame]) -> str:
    """The key of the run whose first frame is `frames[0]`: the page starts a new run when it changes (the first
    frame's seed and engine time beside its id, which Python reuses once a run's frames are freed)."""
    first = frames[0]
    return f"run-{id(first):x}-{first.seed}-{first.elapsed_s!r}"


def frames_message(engine: DiffusionEngine, request: RunRequest | None, frames: list[Frame], start: int, *,
                   final: bool, trace: Trace | None = None, autoplay: bool = True, error: str = "") -> str | None:
    """A feed message with `frames[start:]` of a run (`trace`: a loaded one instead of `request`'s) as replay data
    with its `key`, `start`, `final`, `error` (why the run failed, in the visitor's words) and `stopped` (the run
    ended without a done frame: stopped between two forwards); None when there is nothing new to say. A final
    message sends the last frame again (it may have become the run's cancelled end)."""
    if not frames or (start >= len(frames) and not final):
        return None
    new = frames[start:] or frames[-1:]
    start = len(frames) - len(new)
    if trace is not None:
        part = dataclasses.replace(trace, frames=tuple(new))
    else:
        ids, kinds = frame_tokens(new, engine.token_text.kind)
        part = Trace(model=ModelInfo.of(engine), settings=request.settings, seed=new[-1].seed, prompt=request.prompt,
                     raw=request.raw, prompt_ids=(), tokens={i: engine.token_text(i) for i in ids}, text="",
                     frames=tuple(new), kinds=kinds)
    data = replay_data(part)
    data.update(seq=next(_SEQUENCE), key=run_key(frames), start=start, final=bool(final), autoplay=autoplay, error=error,
                prompt_tokens=new[-1].prompt_tokens if trace is None else data["prompt_tokens"])
    if final and not frames[-1].done:
        data["stopped"] = True
    return script_json(data)

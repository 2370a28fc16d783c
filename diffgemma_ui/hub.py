"""The app's hub beside the run mechanism: `Job`, the frame-source registry, the door's checks, sessions.

Every tab hands its model work to one `Hub` as a `Job`; the hub checks it once, starts its frame source in the
app's `Runner` and keeps each visitor's session for the page's unload.
"""

import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gradio as gr

from engine import DiffusionEngine, DiffusionSettings, Frame
from engine.settings import SETTING_NAMES

from .runs import Runner, RunSnapshot, RunWorker, default_live_rate
from .tab import refusing, user_error
from .text import plain_text
from .validation import RunRequest, parse_run

RUN_INPUT_NAMES = ("prompt", "raw", *SETTING_NAMES, "seed", "thinking")  # a run's inputs, in the order wired
API_SUMMARY_KEYS = ("frames", "forwards", "tokens_per_second", "tokens_per_forward", "seconds", "seed", "token_ids",
                    "stop_reason", "forwards_per_block", "time_to_first_frame_s", "prompt_tokens", "tokens", "thought")


@dataclass(frozen=True)
class Job:
    """Model work: a `Hub.sources` `kind`, a picklable `payload`, `settings`, GPU-budget `extra_forwards`."""

    kind: str
    payload: object
    settings: DiffusionSettings
    extra_forwards: int = 0


def generation_frames(engine: DiffusionEngine, request: RunRequest, stop) -> Iterator[Frame]:
    """The "generate" source: the engine's frames for a checked `RunRequest`."""
    return engine.frames(request.prompt, request.settings, raw=request.raw, seed=request.seed, stop_event=stop,
                         thinking=request.thinking, prompt_ids=request.prompt_ids)


@dataclass(frozen=True)
class Outcome:
    """What a frame source leaves beside its frames (a chat's session fields, diffusers' exact frames): it travels
    in the same stream, so that it crosses ZeroGPU's process boundary with them, and `received` takes it out."""

    value: object


def received(items: Iterator, receive: Callable | None) -> Iterator:
    """A source's `items` without its `Outcome`s, whose values go to `receive` (after a done frame: all of the
    rest first, so a reader that stops at the done frame has them); without `receive`, outcomes are dropped."""
    receive = receive or (lambda value: None)
    for item in items:
        if isinstance(item, Outcome):
            receive(item.value)
            continue
        if isinstance(item, Frame) and item.done:
            for rest in items:
                if isinstance(rest, Outcome):
                    receive(rest.value)
        yield item


def api_summary(result) -> tuple[str, dict]:
    """(text, summary of `API_SUMMARY_KEYS`) of a `GenerationResult`."""
    values = result.to_dict()
    return plain_text(values["text"]), {key: values[key] for key in API_SUMMARY_KEYS}


class Hub:
    """The app's model work on one loaded `engine`; `limits` as `runs.Runner`'s keywords (`max_fps` None: by canvas)."""

    def __init__(self, engine: DiffusionEngine, *, max_fps: float | None = None, **limits):
        self.engine = engine
        self.runs = Runner(max_fps=default_live_rate(engine.canvas_length) if max_fps is None else max_fps, **limits)
        self.sources: dict[str, Callable] = {"generate": generation_frames}  # kind -> source(engine, payload, stop)
        self.sessions = weakref.WeakValueDictionary()  # session key -> SessionState, for `unload`

    def request(self, values: dict, *, ui_limits: bool) -> RunRequest:
        """The door: a `RunRequest` of raw inputs by name (`RUN_INPUT_NAMES`; "thinking" may be missing), its
        prompt encoded once, checked against the context budget, the engine and `check_job` (ValueError)."""
        run = parse_run(values, ui_limits=ui_limits)
        prompt_ids = self.engine.encode_prompt(run.prompt, raw=run.raw, thinking=run.thinking)
        self.engine.check_budget(prompt_ids.shape[1], run.settings)
        self.engine.check_settings(run.settings)
        run = run.with_prompt_ids(prompt_ids)
        self.check_job(Job("generate", run, run.settings))
        return run

    def checked_request(self, values: dict, *, ui_limits: bool) -> RunRequest:
        """`request`, its errors as the visitor's `gr.Error`."""
        with refusing():
            return self.request(values, ui_limits=ui_limits)

    def check_job(self, job: Job) -> None:
        """Checks of `job` beyond its tab's own (ZeroGPU's budget; ValueError)."""

    def start_job(self, job: Job, key: str | None = None, *, keep_history: bool = True, record=None,
                  receive=None) -> RunWorker:
        """Start `job` in the app's `Runner` as `key`; `record` as `RunWorker`'s, `receive` as `received`'s."""
        source = self.sources[job.kind]
        return self.runs.start(lambda stop: received(source(self.engine, job.payload, stop), receive), key,
                               keep_history=keep_history, record=record)

    def step_frames(self, request: RunRequest) -> Iterator[Frame]:
        """A stepped run's frames, one per `next()`."""
        return generation_frames(self.engine, request, None)

    def unload(self, request: gr.Request) -> None:
        """A tab closed: stop its runs and release its session."""
        key = getattr(request, "session_hash", None)
        self.runs.unload(key)
        session = self.sessions.pop(key, None) if key else None
        if session is not None:
            session.release()

    def api_result(self, snap: RunSnapshot) -> tuple[str, dict]:
        """(text, summary) of an `api_run` snapshot; gr.Error for a run without a forward."""
        if snap.latest is None:
            raise user_error("the run ended before the first decoder forward")
        return api_summary(self.engine.summarize(snap.latest, snap.frames_seen))

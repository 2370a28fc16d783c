"""The Playground tab's handlers (`Playground`, which starts every tab's jobs) and `/generate`."""

import dataclasses
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import gradio as gr
from gradio.context import LocalContext

from engine import DiffusionEngine, DiffusionSettings, Frame
from engine.settings import SETTING_NAMES, parse_number

from . import plots
from .canvas_view import EMPTY_CANVAS_HTML, STOP_REASONS, block_html, live_html, stack_html, thought_html
from .meter import REFUSED_NOTICE, meter_html, run_meter_html, waiting_meter_html
from .runs import STOP_WAIT_S, Runner, RunSnapshot, RunWorker, default_live_rate, session_key, wait_all
from .session import SessionState
from .tab import PlotClock, api_run, buttons, describe_error, refusing, user_error
from .text import plain_text
from .validation import CUSTOM_PRESET, PRESET_FIELDS, RunRequest, build_request, preset_values

API_SUMMARY_KEYS = ("frames", "forwards", "tokens_per_second", "tokens_per_forward", "seconds", "seed", "token_ids",
                    "stop_reason", "forwards_per_block", "time_to_first_frame_s", "prompt_tokens", "tokens", "thought")


@dataclass(frozen=True)
class StreamOutputs:
    """One render of the live view, in the order `blocks.build_app` wires its outputs."""

    stack: object
    canvas: object
    meter: object
    text: object
    heatmap: object
    order: object
    entropy: object
    block: object
    generate_button: object
    stop_button: object
    thought: object = ""

    def as_tuple(self) -> tuple:
        return tuple(getattr(self, field.name) for field in dataclasses.fields(self))


STREAM_WIDTH = len(dataclasses.fields(StreamOutputs))
RUN_INPUTS = len(SETTING_NAMES) + 3  # a page run's inputs: prompt, raw, the table's settings, seed
STOP_FLUSH_S = 0.1  # Stop's final view waits this long after the stream's end
PLOT_SPACING_S = 0.03  # between the updates of a final view


@dataclass(frozen=True)
class Job:
    """Model work: a `Playground.sources` `kind`, a picklable `payload`, `settings`, GPU-budget `extra_forwards`."""

    kind: str
    payload: object
    settings: DiffusionSettings
    extra_forwards: int = 0


def generation_frames(engine: DiffusionEngine, request: RunRequest, stop) -> Iterator[Frame]:
    """The "generate" source: the engine's frames for a `RunRequest`."""
    return engine.frames(request.prompt, request.settings, raw=request.raw, seed=request.seed, stop_event=stop,
                         thinking=request.thinking)


def received(frames: Iterator, receive) -> Iterator:
    """`frames`, non-frame items handed to `receive` (after a done frame: all of the rest first)."""
    if receive is None:
        yield from frames
        return
    for item in frames:
        if not isinstance(item, Frame):
            receive(item)
            continue
        if item.done:
            for rest in frames:
                if not isinstance(rest, Frame):
                    receive(rest)
        yield item


def api_summary(result) -> tuple[str, dict]:
    """(text, summary of `API_SUMMARY_KEYS`) of a `GenerationResult`."""
    values = result.to_dict()
    return plain_text(values["text"]), {key: values[key] for key in API_SUMMARY_KEYS}


def status_text(frame: Frame | None, error: BaseException | None = None) -> str:
    """The status line under the canvas when a run is over."""
    if error is not None:
        return f"The run failed: {describe_error(error)}"
    if frame is None:
        return "Stopped before the first forward."
    if not frame.done or frame.stop_reason == "cancelled":
        return "Stopped: the canvas in progress is not committed."
    return f"Done: {STOP_REASONS.get(frame.stop_reason, frame.stop_reason)}."


class Playground:
    """Handlers bound to one loaded `engine`; `limits` as `runs.Runner`'s keywords (`max_fps` None: by canvas)."""

    def __init__(self, engine: DiffusionEngine, *, max_fps: float | None = None, **limits):
        self.engine = engine
        self.runs = Runner(max_fps=default_live_rate(engine.canvas_length) if max_fps is None else max_fps, **limits)
        self.sources = {"generate": generation_frames}  # kind -> source(engine, payload, stop)
        self.sessions = weakref.WeakValueDictionary()  # session key -> SessionState, for `unload`

    def check_request(self, request: RunRequest) -> None:
        """The checks before any work: prompt encoding, context budget, settings, `check_job` (ValueError)."""
        prompt_ids = self.engine.encode_prompt(request.prompt, raw=request.raw, thinking=request.thinking)
        self.engine.check_budget(prompt_ids.shape[1], request.settings)
        self.engine.check_settings(request.settings)
        self.check_job(Job("generate", request, request.settings))

    def checked_request(self, *inputs, ui_limits: bool, thinking=False) -> RunRequest:
        """`parse` then `check_request`; gr.Error."""
        with refusing():
            run = self.parse(*inputs, ui_limits=ui_limits, thinking=thinking)
            self.check_request(run)
        return run

    def start_job(self, job: Job, key: str | None = None, *, keep_history: bool = True, record=None,
                  receive=None) -> RunWorker:
        """Start `job` in the app's `Runner` as `key`; `record` as `RunWorker`'s, `receive` as `received`'s."""
        source = self.sources[job.kind]
        return self.runs.start(lambda stop: received(source(self.engine, job.payload, stop), receive), key,
                               keep_history=keep_history, record=record)

    def step_frames(self, request: RunRequest) -> Iterator[Frame]:
        """A stepped run's frames, one per `next()`."""
        return generation_frames(self.engine, request, None)

    def check_job(self, job: Job) -> None:
        """Checks of `job` beyond its tab's own (ZeroGPU's budget; ValueError)."""

    @staticmethod
    def parse(prompt, raw, *values, ui_limits: bool, thinking=False) -> RunRequest:
        """A `RunRequest` of prompt, raw, the table's settings and seed (ValueError)."""
        *settings, seed = values
        return build_request(prompt, raw, dict(zip(SETTING_NAMES, settings)), seed, ui_limits=ui_limits,
                             thinking=thinking)

    def render(self, session: SessionState, snap: RunSnapshot, *, final: bool, plots_due: bool,
               first: bool = True, stagger: bool = False) -> StreamOutputs:
        """The view of `snap` (blocks' HTML cached in `session`); hover text if `final`, buttons if `first`/`final`;
        `stagger`: due live plots go one per render, the heatmap first."""
        finished = snap.finished_blocks()
        for frame in finished[len(session.finished_html):]:
            session.finished_html.append(block_html(frame, live=False))
        latest = snap.latest
        status = status_text(latest, snap.error) if final else "Encoding the prompt\u2026" if latest is None else ""
        skip = gr.skip()
        stack = text = thought = heatmap = order = entropy = skip
        if len(finished) != session.stacked_blocks or final:
            stack = stack_html(finished, finished_html=session.finished_html)
            session.stacked_blocks = len(finished)
        if isinstance(stack, str) or first:  # text and thought change with a committed block
            text = thought = ""
            if latest is not None:
                result = self.engine.summarize(latest, snap.frames_seen)
                text, thought = plain_text(result.text), thought_html(result.thought)
        canvas = live_html(latest, status=status)
        if plots_due or final:
            heatmap, order, entropy = plots.block_plots(snap.block_frames(), animate=final, hover=final)
            session.pending_plots = [("order", order), ("entropy", entropy)] if stagger and not final else []
            if session.pending_plots:
                order = entropy = skip
        elif session.pending_plots:
            name, figure = session.pending_plots.pop(0)
            order, entropy = (figure, skip) if name == "order" else (skip, figure)
        blocks = snap.block_count
        block = gr.update(maximum=max(2, blocks), value=max(1, blocks), visible=blocks > 1) if final else skip
        if first and not final:  # the previous run's slider is stale
            block = gr.update(visible=False)
        meter = run_meter_html(latest, committed=finished[-1] if finished else None, final=final)
        run_button, stop_button = buttons(not final) if first or final else (skip, skip)
        return StreamOutputs(
            stack=stack, canvas=canvas, meter=meter, text=text, heatmap=heatmap, order=order, entropy=entropy,
            block=block, generate_button=run_button, stop_button=stop_button, thought=thought,
        )

    def page_request(self, inputs: tuple, *defaults) -> tuple[RunRequest, tuple]:
        """A page trigger's checked `RUN_INPUTS` (gr.Error) and the inputs after them (`defaults` where missing)."""
        extras = (*inputs[RUN_INPUTS:], *defaults[len(inputs) - RUN_INPUTS:])
        return self.checked_request(*inputs[:RUN_INPUTS], ui_limits=True, thinking=extras[-1]), extras

    def request_run(self, session: SessionState, *inputs) -> tuple:
        """A run trigger's check (gr.Error) and ticket (stopping the session's run): (ticket, meter, buttons)."""
        self.page_request(inputs, False)
        if session is None:
            return 0, gr.skip(), gr.skip(), gr.skip()
        replacing = session.run_in_progress
        return str(session.claim()), waiting_meter_html(replacing=replacing), *buttons(True)

    def refused(self, session: SessionState):
        """After a refusal: the session's meter marked as the previous run's (skipped: none, or running)."""
        snap = getattr(session, "snapshot", None)
        if snap is None or snap.latest is None or session.run_in_progress:
            return gr.skip()
        finished = snap.finished_blocks()
        return meter_html(snap.latest, committed=finished[-1] if finished else None, state="refused",
                          notice=REFUSED_NOTICE)

    def generate_stream(self, session: SessionState, *inputs, request: gr.Request = None) -> Iterator[tuple]:
        """The run step on `RUN_INPUTS`, ticket, `thinking`: `StreamOutputs` tuples to the end (none if stale);
        gr.Error."""
        run, (ticket, _) = self.page_request(inputs, None, False)
        ticket = parse_number(ticket)  # the hidden ticket box: None if empty
        request = request or LocalContext.request.get(None)
        session = session or SessionState()
        if ticket is not None and not session.is_current(ticket):
            return
        key = session_key(request, session)
        clock = PlotClock(wait_first=session.snapshot is None,
                          cells=self.engine.canvas_length * run.settings.max_denoising_steps)
        worker = self.start_job(Job("generate", run, run.settings))
        if not session.begin(worker, ticket):
            return
        session.request, session.trace = run, None  # what `keep` exports as this run's trace
        ticket = session.running_ticket
        self.sessions[key] = session
        self.runs.register(key, worker)
        try:
            for index, snap in enumerate(self.runs.updates(worker)):
                if not session.is_current(ticket):
                    return  # a newer run or Stop owns the page now
                session.snapshot = snap
                outputs = self.render(session, snap, final=snap.finished, plots_due=clock.due(snap.block_count),
                                      first=index == 0, stagger=True)
                for part, outputs in enumerate(plots_apart(outputs) if snap.finished else [outputs]):
                    if part:
                        time.sleep(PLOT_SPACING_S)
                    if not session.is_current(ticket):
                        return  # Stop came meanwhile: its final view stays the last
                    yield outputs.as_tuple()
                if snap.finished and snap.error is not None:
                    raise user_error(snap.error)
        finally:  # also when Gradio closes or cancels this generator
            self.runs.finish(key, worker)
            session.end_stream(worker)

    def stop(self, session: SessionState) -> tuple:
        """The Stop button: stop the session's run, render its final view once it and its stream ended or
        `STOP_WAIT_S` passed (a queued run left the queue)."""
        if session is None:
            return initial_outputs().as_tuple()
        worker = session.withdraw()
        stepped = getattr(session, "step_run", None)
        if worker is None and stepped is not None and not stepped.done:  # a "Run to end": StepThroughHandlers.pause
            return (gr.skip(),) * STREAM_WIDTH
        if worker is None:
            skips = dict.fromkeys(("stack", "canvas", "text", "heatmap", "order", "entropy", "block"), gr.skip())
            return dataclasses.replace(initial_outputs(), meter=meter_html(None, note="left the queue: nothing ran"),
                                       **skips).as_tuple()
        # nothing the stream sent may arrive after this final view
        wait_all(STOP_WAIT_S, worker.join, session.wait_for_stream)
        time.sleep(STOP_FLUSH_S)
        session.snapshot = snap = worker.snapshot()
        return self.render(session, snap, final=True, plots_due=True).as_tuple()  # Generate on, Stop off

    def unload(self, request: gr.Request) -> None:
        """A tab closed: stop its runs and release its session."""
        key = getattr(request, "session_hash", None)
        self.runs.unload(key)
        session = self.sessions.pop(key, None) if key else None
        if session is not None:
            session.release()

    def select_block(self, session: SessionState, block) -> tuple:
        """The three plots of block `block` (1-based) of the session's last run."""
        snap = getattr(session, "snapshot", None)
        if snap is None or not snap.blocks:
            return plots.block_plots([])
        try:
            index = int(block) - 1
        except (TypeError, ValueError):
            index = snap.block_count - 1
        return plots.block_plots(snap.block_frames(index), animate=snap.finished or index < snap.block_count - 1)

    def apply_preset(self, name) -> tuple:
        """Preset `name`'s `PRESET_FIELDS` values (skips for "custom"; gr.Warning: unknown)."""
        try:
            if name != CUSTOM_PRESET:
                return tuple(preset_values(name, self.engine.recommended).values())
        except ValueError as error:
            gr.Warning(str(error))
        return (gr.skip(),) * len(PRESET_FIELDS)

    async def generate_api_served(self, *inputs, request: gr.Request = None) -> tuple[str, dict]:
        """`/generate` as served: stopped once its client goes away."""
        def job() -> Job:
            run = self.checked_request(*inputs, ui_limits=False)
            return Job("generate", run, run.settings)

        return self.api_result(await api_run(self, job, request, keep_history=False))

    def api_result(self, snap: RunSnapshot) -> tuple[str, dict]:
        """(text, summary) of an `api_run` snapshot; gr.Error for a run without a forward."""
        if snap.latest is None:
            raise user_error("the run ended before the first decoder forward")
        return api_summary(self.engine.summarize(snap.latest, snap.frames_seen))


def plots_apart(outputs: StreamOutputs) -> list[StreamOutputs]:
    """`outputs` as three updates, each adding to the one before: the heatmap, the unmasking order, then the rest.
    A plot once sent is sent again, never skipped: Gradio streams it as an empty diff, which the page keeps."""
    heatmap = dataclasses.replace(StreamOutputs(*(gr.skip(),) * STREAM_WIDTH), heatmap=outputs.heatmap)
    return [heatmap, dataclasses.replace(heatmap, order=outputs.order), outputs]


def initial_outputs() -> StreamOutputs:
    """What the live view shows before any run."""
    heatmap, order, entropy = plots.block_plots([])
    return StreamOutputs(stack="", canvas=EMPTY_CANVAS_HTML, meter=meter_html(None), text="", heatmap=heatmap,
                         order=order, entropy=entropy, block=gr.update(visible=False),
                         generate_button=gr.update(interactive=True), stop_button=gr.update(interactive=False))

"""The playground's event handlers (`Playground`, wired by `blocks.build_app`): validation, runs in workers,
coalesced rendering, the API; only the engine's public API is used."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import gradio as gr

from engine import DiffusionEngine, DiffusionSettings, Frame
from engine.settings import draw_seed

from . import plots
from .canvas_view import EMPTY_CANVAS_HTML, STOP_REASONS, block_html, live_html, stack_html
from .meter import meter_html, refused_meter_html, run_meter_html, waiting_meter_html
from .record import RunSnapshot
from .session import SessionState
from .text import plain_text
from .thought_view import thought_html
from .validation import CUSTOM_PRESET, PRESET_FIELDS, SETTING_NAMES, RunRequest, build_request, preset_values
from .runs import (
    DEFAULT_MAX_RUN_S,
    DEFAULT_READER_BUDGET,
    STOP_WAIT_S,
    Runner,
    RunWorker,
    default_live_rate,
    session_key,
)
from .tab import PlotClock, describe_error, served, user_error

API_SUMMARY_KEYS = (
    "frames", "forwards", "tokens_per_second", "tokens_per_forward", "seconds", "seed", "token_ids", "stop_reason",
    "forwards_per_block", "time_to_first_frame_s", "prompt_tokens", "tokens", "thought",
)


@dataclass(frozen=True)
class StreamOutputs:
    """One render of the live view, in the order of the outputs `blocks.build_app` wires (see `as_tuple`)."""

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
    thought: object = ""  # the thought channel (`thought_view.thought_html`); "" hides it

    def as_tuple(self) -> tuple:
        return tuple(getattr(self, field.name) for field in dataclasses.fields(self))


@dataclass(frozen=True)
class Job:
    """One piece of model work for `Playground.start_job`: `kind` (a key of `Playground.sources`), `payload` (plain
    values: pickled to the GPU process on ZeroGPU), the `settings` its GPU time follows, and `extra_forwards` beyond
    its canvases x steps (a race's autoregressive side)."""

    kind: str
    payload: object
    settings: DiffusionSettings
    extra_forwards: int = 0


def generation_frames(engine: DiffusionEngine, request: RunRequest, stop) -> Iterator[Frame]:
    """The "generate" source: the engine's frames for a `RunRequest`."""
    return engine.frames(request.prompt, request.settings, raw=request.raw, seed=request.seed, stop_event=stop,
                         thinking=request.thinking)


def received(frames: Iterator, receive) -> Iterator:
    """`frames`, its non-frame items handed to `receive(item)` (None: none are), the source run to its end after a
    done frame before that frame is passed on (a chat turn records itself after its final frame)."""
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


def parse_ticket(ticket) -> int | None:
    """A run ticket from the page (a hidden textbox: text, exact), or None when there is none."""
    try:
        return int(str(ticket).strip()) if ticket not in (None, "") else None
    except ValueError:
        return None


def status_text(frame: Frame | None, error: BaseException | None = None) -> str:
    """The one-line status under the canvas when a run is over."""
    if error is not None:
        return f"The run failed: {describe_error(error)}"
    if frame is None:
        return "Stopped before the first forward."
    if not frame.done or frame.stop_reason == "cancelled":  # a run closed before its final frame stopped too
        return "Stopped: the canvas in progress is not committed."
    return f"Done: {STOP_REASONS.get(frame.stop_reason, frame.stop_reason)}."


def previous_run_meter(snap: RunSnapshot | None, running: bool):
    """The meter of the run on the page (`snap`) marked as the previous run's, after a refused request; `gr.skip()`
    when there is none or it is still `running`."""
    if snap is None or snap.latest is None or running:
        return gr.skip()
    finished = snap.finished_blocks()
    return refused_meter_html(snap.latest, committed=finished[-1] if finished else None)


class Playground:
    """Event handlers bound to one loaded `engine`; `max_fps` (None: `runs.default_live_rate`), `reader_budget`,
    `abandon_after_s` and `max_run_s` (None: no limit) as `runs.Runner`'s."""

    def __init__(self, engine: DiffusionEngine, *, max_fps: float | None = None,
                 reader_budget: float | None = DEFAULT_READER_BUDGET, abandon_after_s: float = 30.0,
                 max_run_s: float | None = DEFAULT_MAX_RUN_S):
        self.engine = engine
        self.runs = Runner(max_fps=default_live_rate(engine.canvas_length) if max_fps is None else max_fps,
                           reader_budget=reader_budget, abandon_after_s=abandon_after_s, max_run_s=max_run_s)
        # Every tab's model work, by kind: source(engine, payload, stop) -> frames (`start_job`)
        self.sources = {"generate": generation_frames}
        # Live sessions by session hash, to release their state when their tab closes (Gradio itself keeps a
        # closed session's gr.State for an hour); weak: a session Gradio dropped is not kept alive here
        self.sessions: weakref.WeakValueDictionary[str, SessionState] = weakref.WeakValueDictionary()

    @property
    def registry(self):
        """Which run each session has (`runs.RunRegistry`)."""
        return self.runs.registry

    @property
    def max_run_s(self) -> float | None:
        return self.runs.max_run_s

    @property
    def max_fps(self) -> float:
        return self.runs.max_fps

    @property
    def closed_sessions(self):
        return self.runs.closed_sessions

    @closed_sessions.setter
    def closed_sessions(self, dropper) -> None:
        self.runs.closed_sessions = dropper

    # -- running -------------------------------------------------------------------------------------------------

    def check_request(self, request: RunRequest) -> None:
        """Engine-side checks before any work: prompt encoding and context budget (raises ValueError)."""
        prompt_ids = self.engine.encode_prompt(request.prompt, raw=request.raw, thinking=request.thinking)
        self.engine.check_budget(int(prompt_ids.shape[1]), request.settings)
        self.engine.check_settings(request.settings)

    def check_inputs(self, prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max,
                     stability_threshold, confidence_threshold, adaptive_stopping, seed, thinking=False) -> None:
        """The Generate button's first step: the UI's checks of the eleven inputs and `thinking` (raises gr.Error)."""
        self.checked_request(prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max,
                             stability_threshold, confidence_threshold, adaptive_stopping, seed, ui_limits=True,
                             thinking=thinking)

    def checked_request(self, *inputs, ui_limits: bool, thinking=False) -> RunRequest:
        """`parse` then `check_request` of the eleven inputs (the API's order); raises gr.Error."""
        try:
            run = self.parse(*inputs, ui_limits=ui_limits, thinking=thinking)
            self.check_request(run)
        except Exception as error:  # noqa: BLE001 - bad input, or a failing tokenizer: a clear message either way
            raise user_error(error) from None
        return run

    def start_run(self, request: RunRequest, *, keep_history: bool = True) -> RunWorker:
        """Start `request` in a background `RunWorker` and return it."""
        return self.start_job(Job("generate", request, request.settings), keep_history=keep_history)

    def start_job(self, job: Job, key: str | None = None, *, keep_history: bool = True, record=None,
                  receive=None) -> RunWorker:
        """Start `job` as a run of the app's `Runner`, registered as `key`; `record` as `RunWorker`'s; `receive`
        as in `received`. On ZeroGPU the source runs in the GPU process (`zerogpu.ZeroGpuPlayground`)."""
        source = self.sources[job.kind]
        return self.runs.start(lambda stop: received(source(self.engine, job.payload, stop), receive), key,
                               keep_history=keep_history, record=record)

    def step_frames(self, request: RunRequest) -> Iterator[Frame]:
        """The frames of a stepped run, one per `next()` (step-through): the engine's generator, kept between
        clicks with its KV cache and random state (on ZeroGPU each step is a GPU call of its own)."""
        return generation_frames(self.engine, request, None)

    def check_job(self, job: Job) -> None:
        """Checks of `job` beyond its tab's own (on ZeroGPU: the GPU budget; raises ValueError)."""

    @staticmethod
    def parse(prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold,
              confidence_threshold, adaptive_stopping, seed, *, ui_limits: bool, thinking=False) -> RunRequest:
        """Validate the eleven inputs (the API's order) and `thinking` into a `RunRequest` (raises ValueError)."""
        values = dict(zip(SETTING_NAMES, (max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max,
                                          stability_threshold, confidence_threshold)))
        values["adaptive_stopping"] = adaptive_stopping
        return build_request(prompt, raw, values, seed, ui_limits=ui_limits, thinking=thinking)

    # -- rendering -----------------------------------------------------------------------------------------------
    def render(self, session: SessionState, snap: RunSnapshot, *, final: bool, plots_due: bool,
               first: bool = True) -> StreamOutputs:
        """The view of `snap` (`first`: the run's first render, `final`: its last): finished blocks' HTML cached in
        `session` and re-sent only when one finishes; hover text and the heatmap's animation only in the final
        render; the buttons updated only in the first and final ones."""
        finished = snap.finished_blocks()
        for frame in finished[len(session.finished_html):]:
            session.finished_html.append(block_html(frame, live=False))
        latest = snap.latest
        live = latest if latest is not None and not latest.block_done else None
        status = status_text(latest, snap.error) if final else ""
        if latest is None and not final:
            status = "Encoding the prompt\u2026"
        stack = gr.skip()
        if len(finished) != session.stacked_blocks or final:
            stack = stack_html(finished, finished_html=session.finished_html)
            session.stacked_blocks = len(finished)
        canvas = live_html(live, newest=latest, status=status)
        # The text and the thought only change when a block is committed: made and re-sent only then, with the stack
        committed = isinstance(stack, str) or first
        result = self.engine.summarize(latest, snap.frames_seen) if latest is not None and committed else None
        text = (plain_text(result.text) if result is not None else "") if committed else gr.skip()
        thought = thought_html(result.thought if result is not None else "") if committed else gr.skip()
        skip = gr.skip()
        heatmap = order = entropy = skip
        if plots_due or final:
            frames = snap.block_frames()
            heatmap = plots.confidence_heatmap(frames, animate=final, hover=final)
            order = plots.unmasking_order(frames[-1] if frames else None)
            entropy = plots.entropy_and_acceptance(frames)
        blocks = snap.block_count
        # A slider needs minimum < maximum: with one block it stays hidden
        block = gr.update(maximum=max(2, blocks), value=max(1, blocks), visible=blocks > 1) if final else skip
        if first and not final:  # a new run: the previous run's block slider would plot this run's blocks
            block = gr.update(visible=False)
        meter = run_meter_html(latest, committed=finished[-1] if finished else None, final=final)
        return StreamOutputs(
            stack=stack, canvas=canvas, meter=meter, text=text, heatmap=heatmap, order=order, entropy=entropy,
            block=block,
            generate_button=gr.update(interactive=final) if first or final else skip,
            stop_button=gr.update(interactive=not final) if first or final else skip, thought=thought,
        )

    # -- events --------------------------------------------------------------------------------------------------
    def request_run(self, session: SessionState, *inputs) -> tuple:
        """Every run trigger's first step: check the inputs (raises gr.Error; a current run goes on), take the
        session's next ticket (stopping its run), return (ticket, waiting meter, Generate and Stop updates)."""
        self.check_inputs(*inputs)
        if session is None:
            return 0, gr.skip(), gr.skip(), gr.skip()
        replacing = session.run_in_progress
        return (str(session.claim()), waiting_meter_html(replacing=replacing), gr.update(interactive=False),
                gr.update(interactive=True))

    def refused(self, session: SessionState):
        """After a refused request: the meter marking the results on the page as the previous run's (`gr.skip()`
        when there are none or the run still goes on)."""
        return previous_run_meter(getattr(session, "snapshot", None), session is not None and session.run_in_progress)

    def generate_stream(self, session: SessionState, prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound,
                        t_min, t_max, stability_threshold, confidence_threshold, adaptive_stopping, seed, ticket=None,
                        thinking=False, request: gr.Request = None) -> Iterator[tuple]:
        """The run step: validate, start a worker, yield coalesced renders until the final frame. A stale `ticket`
        (from `request_run`; a later trigger or Stop) yields nothing more. Raises gr.Error: bad input, engine failure.
        """
        run = self.checked_request(prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max,
                                   stability_threshold, confidence_threshold, adaptive_stopping, seed, ui_limits=True,
                                   thinking=thinking)
        if session is None:
            session = SessionState()
        ticket = parse_ticket(ticket)
        if ticket is not None and not session.is_current(ticket):
            return
        key = session_key(request, session)
        clock = PlotClock(wait_first=session.snapshot is None,
                          cells=self.engine.canvas_length * run.settings.max_denoising_steps)
        worker = self.start_run(run)
        if not session.begin(worker, ticket):
            return
        session.request, session.trace = run, None  # what `keep` exports as this run's trace; no replay shown
        ticket = session.running_ticket
        self.sessions[key] = session
        self.registry.register(key, worker)
        try:
            for index, snap in enumerate(self.runs.updates(worker)):
                if not session.is_current(ticket):
                    return  # a newer run or Stop owns the page now
                session.snapshot = snap
                outputs = self.render(session, snap, final=snap.finished, plots_due=clock.due(snap.block_count),
                                      first=index == 0)
                yield outputs.as_tuple()
                if snap.finished and snap.error is not None:
                    raise user_error(snap.error)
        finally:
            # Runs on normal end, on Stop, and when Gradio closes or cancels this generator (tab closed)
            self.runs.finish(key, worker)
            session.end_stream(worker)

    def stop(self, session: SessionState) -> tuple:
        """The Stop button (wired to also cancel the run step, so a run still waiting in the queue leaves it): stop
        the session's run, wait for its last frame (within one decoder forward) and render the final view; a run
        that had not started yet shows that it left the queue."""
        if session is None:
            return initial_outputs().as_tuple()
        _, worker = session.withdraw()
        stepped = getattr(session, "step_run", None)
        if worker is None and stepped is not None and not stepped.done:  # a "Run to end": StepThroughHandlers.pause
            return tuple(gr.skip() for _ in initial_outputs().as_tuple())
        if worker is None:
            left = initial_outputs()
            return dataclasses.replace(
                left, stack=gr.skip(), canvas=gr.skip(), text=gr.skip(), heatmap=gr.skip(), order=gr.skip(),
                entropy=gr.skip(), block=gr.skip(), meter=meter_html(None, note="left the queue: nothing ran"),
            ).as_tuple()
        worker.join(STOP_WAIT_S)
        snap = worker.snapshot()
        session.snapshot = snap
        final = self.render(session, snap, final=True, plots_due=True)
        return dataclasses.replace(final, generate_button=gr.update(interactive=True),
                                   stop_button=gr.update(interactive=False)).as_tuple()

    def unload(self, request: gr.Request) -> None:
        """A browser tab closed: stop its runs and release the session's state (Gradio's own record soon after)."""
        key = getattr(request, "session_hash", None)
        self.runs.unload(key)
        session = self.sessions.pop(key, None) if key else None
        if session is not None:
            session.release()

    def select_block(self, session: SessionState, block) -> tuple:
        """Re-render the three plots for block number `block` (1-based) of the session's last run."""
        snap = session.snapshot if session is not None else None
        if snap is None or not snap.blocks:
            return plots.confidence_heatmap([]), plots.unmasking_order(None), plots.entropy_and_acceptance([])
        try:
            index = int(block) - 1
        except (TypeError, ValueError):
            index = snap.block_count - 1
        frames = snap.block_frames(index)
        animate = snap.finished or index < snap.block_count - 1
        return (plots.confidence_heatmap(frames, animate=animate), plots.unmasking_order(frames[-1]),
                plots.entropy_and_acceptance(frames))

    def apply_preset(self, name) -> tuple:
        """The preset dropdown: the `PRESET_FIELDS` values of preset `name` (no change for "custom"; a gr.Warning for
        an unknown name)."""
        if name == CUSTOM_PRESET:
            return tuple(gr.skip() for _ in PRESET_FIELDS)
        try:
            values = preset_values(name, self.engine.recommended)
        except ValueError as error:
            gr.Warning(str(error))
            return tuple(gr.skip() for _ in PRESET_FIELDS)
        return tuple(values[field] for field in PRESET_FIELDS)

    @staticmethod
    def random_seed() -> str:
        """The random-seed button: a fresh seed (`engine.settings.draw_seed`), as text."""
        return str(draw_seed())

    def generate_api(self, prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max,
                     stability_threshold, confidence_threshold, adaptive_stopping, seed,
                     thinking=False) -> tuple[str, dict]:
        """`/generate`: run to the end and return (text, summary): the summary's keys are `API_SUMMARY_KEYS`
        (seconds on the engine clock; tokens: non-pad generated ones, what both rates count). `thinking`: think
        first where the chat template can (the text is the answer alone). Raises gr.Error on invalid input."""
        worker = self._start_api_run(prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max,
                                     stability_threshold, confidence_threshold, adaptive_stopping, seed,
                                     thinking=thinking)
        try:
            snap = worker.wait()
        finally:
            worker.stop()
        return self._api_result(snap)

    async def generate_api_served(self, prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min,
                                  t_max, stability_threshold, confidence_threshold, adaptive_stopping, seed,
                                  thinking=False, request: gr.Request = None) -> tuple[str, dict]:
        """`/generate` as the server runs it: `generate_api`, but a cancelled job, a disconnected client or a dropped
        result stream stops its run within one decoder forward (`tab.served`)."""
        inputs = (prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold,
                  confidence_threshold, adaptive_stopping, seed)
        snap = await self.served(lambda: self._start_api_run(*inputs, thinking=thinking), request)
        return self._api_result(snap)

    async def served(self, start, request):
        """`tab.served` on this app's runs: an API call's run, stopped when its client goes away."""
        return await served(self.runs, start, request)

    def _start_api_run(self, *inputs, thinking=False) -> RunWorker:
        """Validate the eleven API inputs and `thinking` (API limits) and start the run; raises gr.Error."""
        return self.start_run(self.checked_request(*inputs, ui_limits=False, thinking=thinking), keep_history=False)

    def _api_result(self, snap: RunSnapshot) -> tuple[str, dict]:
        """(text, summary) of a finished API run; raises gr.Error with a clear message if it failed."""
        if snap.error is not None:
            raise user_error(snap.error)
        if snap.latest is None:
            raise user_error("the run ended before the first decoder forward")
        result = self.engine.summarize(snap.latest, snap.frames_seen).to_dict()
        return plain_text(result["text"]), {key: result[key] for key in API_SUMMARY_KEYS}


def initial_outputs() -> StreamOutputs:
    """What the live view shows before any run."""
    return StreamOutputs(
        stack="", canvas=EMPTY_CANVAS_HTML, meter=meter_html(None), text="",
        heatmap=plots.confidence_heatmap([]), order=plots.unmasking_order(None),
        entropy=plots.entropy_and_acceptance([]), block=gr.update(visible=False),
        generate_button=gr.update(interactive=True), stop_button=gr.update(interactive=False),
    )

"""The playground's event handlers: validation, starting runs in workers, coalesced rendering, the API.

`Playground` ties one `DiffusionEngine` to the views. Its methods are what `blocks.build_app` wires to Gradio
events; they only use the engine's public API (`frames`, `summarize`, `encode_prompt`, `check_budget`,
`recommended`, `canvas_length`, `device`).
"""

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
        return (self.stack, self.canvas, self.meter, self.text, self.heatmap, self.order, self.entropy, self.block,
                self.generate_button, self.stop_button, self.thought)


@dataclass(frozen=True)
class Job:
    """One piece of model work for the run mechanism (`Playground.start_job`).

    Attributes:
        kind: the source that does it (a key of `Playground.sources`: "generate", "race", "infill", ...).
        payload: its inputs, plain values (on ZeroGPU they are pickled to the GPU process).
        settings: the denoising settings its GPU time follows; extra_forwards: forwards beyond their canvases x
            steps (a race's autoregressive side).
    """

    kind: str
    payload: object
    settings: DiffusionSettings
    extra_forwards: int = 0


def generation_frames(engine: DiffusionEngine, request: RunRequest, stop) -> Iterator[Frame]:
    """The "generate" source: the engine's frames for a `RunRequest`."""
    return engine.frames(request.prompt, request.settings, raw=request.raw, seed=request.seed, stop_event=stop,
                         thinking=request.thinking)


def received(frames: Iterator, receive) -> Iterator:
    """`frames`, its items that are not frames handed to `receive(item)` instead; after a done frame the source
    is run to its end (a chat turn records itself, and says so, after its final frame) before that frame is passed
    on. `receive` None: `frames` as they are."""
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
    """The meter of the run still on the page (`snap`), marked as the previous run's (`meter.refused_meter_html`),
    for a request that was refused after it; `gr.skip()` when no run was shown or it is still `running` (its next
    frame would hide the mark)."""
    if snap is None or snap.latest is None or running:
        return gr.skip()
    finished = snap.finished_blocks()
    return refused_meter_html(snap.latest, committed=finished[-1] if finished else None)


class Playground:
    """Event handlers bound to one engine.

    Args:
        engine: a loaded `DiffusionEngine`.
        max_fps: most live renders per second (the newest frame each time; the final frame always); None: the
            default for the engine's canvas (`worker.default_live_rate`: 15/s at 64 positions, 7/s at 256).
        reader_budget: most share of wall time the live view's rendering and sending may take (see
            `RunWorker.updates`); None: only `max_fps` limits.
        abandon_after_s: a run whose reader stops polling for this long stops itself (closed tab).
        max_run_s: a run (UI or API) that lasts longer is stopped with a clear error (None: no limit).
    """

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
        """The Generate button's first step: the UI's checks of the eleven inputs (and `thinking`), nothing run.

        Raises:
            gr.Error: the message of the first check that fails (the run step repeats the checks).
        """
        self.checked_request(prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max,
                             stability_threshold, confidence_threshold, adaptive_stopping, seed, ui_limits=True,
                             thinking=thinking)

    def checked_request(self, *inputs, ui_limits: bool, thinking=False) -> RunRequest:
        """`parse` then `check_request` of the eleven inputs (the API's order), before anything runs.

        Raises:
            gr.Error: the first failing check's message (unexpected failures are logged with their traceback).
        """
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
        """The view of `snap`; `first` is the run's first render, `final` its last.

        Finished blocks never change: their HTML is cached in `session` and the stack component is only re-sent
        when a block finishes, so a new frame re-sends just the live block. Live plots have no hover text (cheaper
        to draw many times); the final render has full hover text and the heatmap's step slider and play button.
        The buttons are only updated on the first and final renders (each `gr.update` of a component costs the
        server a config rebuild, on the same CPU as the engine).
        """
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
        result = self.engine.summarize(latest, snap.frames_seen) if latest is not None else None
        text = plain_text(result.text) if result is not None else ""
        # The thought only changes when a block is committed: re-sent only then, with the stack
        thought = thought_html(result.thought if result is not None else "") if isinstance(stack, str) else gr.skip()
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
        """The first step of every trigger that starts a run (Generate, Shift+Enter): check the eleven inputs, then
        take the session's next ticket, which stops its current run (see `session`), and show the run as waiting.

        Returns:
            (ticket, meter, Generate update, Stop update); the ticket travels with the run step's request.

        Raises:
            gr.Error: a refused request (the current run, if any, goes on).
        """
        self.check_inputs(*inputs)
        if session is None:
            return 0, gr.skip(), gr.skip(), gr.skip()
        replacing = session.run_in_progress
        return (str(session.claim()), waiting_meter_html(replacing=replacing), gr.update(interactive=False),
                gr.update(interactive=True))

    def refused(self, session: SessionState):
        """After `request_run` refused a request: mark the previous run's results, still on the page, as the previous
        run's (the meter says so above its figures). Nothing changes when there is no previous run, or when the
        session's run is still going (a refused request leaves it running; its next frame would hide the mark).

        Returns:
            the meter's HTML, or `gr.skip()`.
        """
        return previous_run_meter(getattr(session, "snapshot", None), session is not None and session.run_in_progress)

    def generate_stream(self, session: SessionState, prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound,
                        t_min, t_max, stability_threshold, confidence_threshold, adaptive_stopping, seed, ticket=None,
                        thinking=False, request: gr.Request = None) -> Iterator[tuple]:
        """The run step: validate, start a worker, yield coalesced renders until the final frame.

        `ticket` comes from `request_run` (None: claim one here). A request whose ticket went stale while it waited in
        the queue (a later trigger, or Stop) yields nothing; a run whose ticket goes stale stops yielding, so only the
        newest run of a session ever reaches the page.

        Raises:
            gr.Error: invalid input (before anything runs) or an engine failure during the run.
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
        # The plots still show placeholders on a session's first run: leave them until there is a block to draw, so
        # the browser is not busy redrawing empty figures while the first decoder forward runs; a new block is
        # plotted at once
        clock = PlotClock(wait_first=session.snapshot is None)
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
        """A browser tab closed: stop its session's runs, release what the session held (frames, HTML), and have
        Gradio's own record of the session (last values of every component) dropped a few seconds later."""
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
        """The preset dropdown: the values of `PRESET_FIELDS` for preset `name`; no change for "custom" (a setting
        was edited by hand), and a gr.Warning and no change for an unknown name."""
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
        """`/generate`: run to the end and return (text, summary dict). `thinking`: let a checkpoint whose chat
        template has a thinking mode think first (chat prompts only); the text is then the answer alone.

        The summary has frames, forwards, tokens_per_second, tokens_per_forward, seconds (engine clock), seed,
        token_ids, stop_reason, forwards_per_block, time_to_first_frame_s, prompt_tokens, tokens (non-pad generated
        tokens: what both rates count) and thought (the thought channel's text, "" if none). `seed` -1 draws one.

        Raises:
            gr.Error: invalid input, with the validation message.
        """
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
        """`/generate` as the server runs it: `generate_api`, but a job that goes away stops its run.

        The run is watched from the event loop, so a cancelled job (gradio_client's `Job.cancel()`, Gradio's
        `/cancel`) stops it at once, and it is registered under the caller's session (`<session_hash>:api:<n>`), so
        a client that disconnects (its heartbeat closes: `Client.close()`, a dead process) stops it through `unload`;
        a job whose result stream was dropped (a REST caller gone) is noticed at the next poll
        (`runs.job_alive_check`). Either way the engine ends within one decoder forward and the concurrency slot is
        free for the next job.
        """
        inputs = (prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold,
                  confidence_threshold, adaptive_stopping, seed)
        snap = await self.served(lambda: self._start_api_run(*inputs, thinking=thinking), request)
        return self._api_result(snap)

    async def served(self, start, request):
        """`tab.served` on this app's runs: an API call's run, stopped when its client goes away."""
        return await served(self.runs, start, request)

    def _start_api_run(self, *inputs, thinking=False) -> RunWorker:
        """Validate the eleven API inputs and `thinking` (API limits, not the UI's) and start the run; raises
        gr.Error."""
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

"""The Race tab's event handlers: validation, running a race in a background thread, live view, replay, the API.

A race runs in a thread (`engine.race.RaceRunner.run`: one side, then the other, each after a warm-up). While it
runs, the panel of the side that is running follows it live; once both are done the handler replays both traces
side by side on the engine clock (time 0 = each side's start), then shows the result card.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from engine.autoregressive import check_temperature
from engine.race import SIDES, RaceResult, RaceRunner

from .deployment import zero_gpu
from .handlers import DEFAULT_MAX_RUN_S, Playground, describe_error
from .race_view import frame_at, panel_html, result_html
from .text import plain_text
from .validation import RunRequest, build_request, preset_values
from .worker import RunTimeLimitExceeded

LOG = logging.getLogger(__name__)
# The race runs the model in this process, outside `spaces.GPU`, where ZeroGPU lends no GPU: refused, not failed
ZERO_GPU_MESSAGE = ("the race is not available on ZeroGPU Spaces yet (it runs outside the GPU slot the platform "
                    "lends per request); run the playground on a dedicated GPU or CPU Space, or locally")
IDLE_BUTTONS = (gr.update(interactive=True), gr.update(interactive=False))  # Race on, Stop off
LIVE_INTERVAL_S = 0.25  # live panels re-render at most 4 times a second: the engine shares the CPU
REPLAY_FPS = 12.0


def model_name(source) -> str:
    """A model's name for the page: the folder name of a local path, a hub id (org/name) unchanged."""
    text = str(source)
    return Path(text).name if Path(text).expanduser().exists() else text


@dataclass
class RaceProgress:
    """What the race thread has produced so far (written by that thread, read by the handler).

    frames: per side, every frame in order; first_token_s: per side, engine seconds of its first committed token;
    result / error: set when the race is over; done: the thread has ended; texts: decoded answers, cached.
    """

    frames: dict = field(default_factory=lambda: {side: [] for side in SIDES})
    first_token_s: dict = field(default_factory=dict)
    order: list = field(default_factory=list)
    result: RaceResult | None = None
    error: BaseException | None = None
    done: bool = False
    texts: dict = field(default_factory=dict)

    def add(self, side: str, frame) -> None:
        """The race's `on_frame` callback."""
        if side not in self.order:
            self.order.append(side)
        if side not in self.first_token_s and frame.committed_tokens > 0:
            self.first_token_s[side] = frame.elapsed_s
        self.frames[side].append(frame)

    def running_side(self) -> str | None:
        """The side whose frames arrive now (None before the first frame or once the race is over)."""
        return None if self.done or not self.order else self.order[-1]


class RaceSession:
    """One browser session's race state (a `gr.State` value): the stop event of its race in progress, and the
    finished race's progress for the replay."""

    def __init__(self):
        self.stop_event: threading.Event | None = None
        self.progress: RaceProgress | None = None

    def stop(self) -> None:
        if self.stop_event is not None:
            self.stop_event.set()


@dataclass(frozen=True)
class RaceRequest:
    """A validated race: the run request (prompt, raw, diffusion settings, seed) plus the AR side's temperature and
    the order."""

    run: RunRequest
    ar_temperature: float
    order: str


class RaceTab:
    """Handlers of the Race tab and the `/race` API around one `RaceRunner`.

    Args:
        runner: the race runner (the playground's engine and its autoregressive side).
        max_run_s: a race (both sides) still going after this many seconds is stopped with a message.
    """

    def __init__(self, runner: RaceRunner, *, max_run_s: float | None = DEFAULT_MAX_RUN_S):
        self.runner = runner
        self.max_run_s = max_run_s

    @property
    def models(self) -> dict[str, str]:
        """Each side's model as the page names it: a local folder by its name, a hub id as it is."""
        ar = self.runner.ar
        diffusion = model_name(self.runner.engine.source)
        return {"diffusion": diffusion,
                "autoregressive": f"{diffusion}'s causal encoder" if ar.shared_weights else model_name(ar.source)}

    # -- validation ------------------------------------------------------------------------------------------------
    def check(self, run: RunRequest, ar_temperature, order) -> RaceRequest:
        """Race-level checks of a validated run request (budgets of both models, temperature, order).

        Raises:
            gr.Error: the first problem, in words.
        """
        if zero_gpu():
            raise gr.Error(ZERO_GPU_MESSAGE, print_exception=False)
        try:
            self.runner.check(run.prompt, run.settings, raw=run.raw, ar_temperature=ar_temperature, order=order,
                              seed=run.seed)
            return RaceRequest(run=run, ar_temperature=check_temperature(ar_temperature), order=order)
        except Exception as error:  # noqa: BLE001 - bad input, or a failing tokenizer: a clear message either way
            raise gr.Error(describe_error(error), print_exception=False) from None

    def ui_request(self, prompt, raw, preset_name, max_new_tokens, seed, ar_temperature, order) -> RaceRequest:
        """The tab's inputs (a preset for the denoising settings) validated with the UI's limits; raises gr.Error."""
        try:
            values = dict(preset_values(preset_name, self.runner.engine.recommended), max_new_tokens=max_new_tokens)
            run = build_request(prompt, raw, values, seed, ui_limits=True)
        except Exception as error:  # noqa: BLE001
            raise gr.Error(describe_error(error), print_exception=False) from None
        return self.check(run, ar_temperature, order)

    def check_inputs(self, prompt, raw, preset_name, max_new_tokens, seed, ar_temperature, order) -> None:
        """The Race button's first step: every check, nothing run (raises gr.Error)."""
        self.ui_request(prompt, raw, preset_name, max_new_tokens, seed, ar_temperature, order)

    # -- running ---------------------------------------------------------------------------------------------------
    def start(self, request: RaceRequest) -> tuple[RaceProgress, threading.Event, threading.Thread]:
        """Start the race in a daemon thread; returns (progress, stop event, thread). Past `max_run_s` the stop
        event is set and the race ends with an error saying so."""
        progress, stop = RaceProgress(), threading.Event()
        run = request.run

        def target():
            timer = threading.Timer(self.max_run_s, stop.set) if self.max_run_s else None
            if timer is not None:
                timer.daemon = True
                timer.start()
            try:
                progress.result = self.runner.run(
                    run.prompt, run.settings, raw=run.raw, seed=run.seed, ar_temperature=request.ar_temperature,
                    order=request.order, on_frame=progress.add, stop_event=stop)
                if progress.result.cancelled and timer is not None and not timer.is_alive():
                    progress.error = RunTimeLimitExceeded(
                        f"the race reached this server's limit of {self.max_run_s:g} s and was stopped: lower "
                        "max_new_tokens")
            except BaseException as error:  # noqa: BLE001 - reported to the reader
                if not isinstance(error, ValueError):  # the operator gets the traceback; the visitor the message
                    LOG.error("race failed: %s", "".join(traceback.format_exception(error)).rstrip())
                progress.error = error
            finally:
                if timer is not None:
                    timer.cancel()
                progress.done = True

        thread = threading.Thread(target=target, name="diffgemma-race", daemon=True)
        thread.start()
        return progress, stop, thread

    # -- rendering -------------------------------------------------------------------------------------------------
    def side_text(self, progress: RaceProgress, side: str, frame) -> str:
        """The decoded answer of `frame` (special tokens skipped), cached in the race's `progress` by side and
        length (a side's committed ids only grow)."""
        if frame is None:
            return ""
        ids = frame.committed_ids
        key = (side, len(ids))
        text = progress.texts.get(key)
        if text is None:
            if side == "diffusion":
                text = self.runner.engine.tokenizer.decode(ids, skip_special_tokens=True)
            else:
                text = self.runner.ar.text(ids)
            progress.texts[key] = text
        return text

    def panel(self, progress: RaceProgress, side: str, state: str, t: float | None = None) -> str:
        """One side's panel: `state` as in `race_view.panel_html`; `t`: replay time (None: its newest frame)."""
        frames = progress.frames[side]
        frame = frame_at(frames, t) if t is not None else (frames[-1] if frames else None)
        position = progress.order.index(side) + 1 if side in progress.order else None
        return panel_html(side, frame, text=self.side_text(progress, side, frame), model=self.models[side], position=position,
                          state=state, t=t, first_token_s=progress.first_token_s.get(side))

    def live_panels(self, progress: RaceProgress) -> tuple[str, str]:
        running = progress.running_side()
        states = {side: ("running" if side == running else "done" if progress.frames[side] else "waiting")
                  for side in SIDES}
        return tuple(self.panel(progress, side, states[side]) for side in SIDES)

    def replay_panels(self, progress: RaceProgress, t: float) -> tuple[str, str]:
        return tuple(self.panel(progress, side, "replay", t) for side in SIDES)

    # -- events ----------------------------------------------------------------------------------------------------
    def race_stream(self, session: RaceSession, prompt, raw, preset_name, max_new_tokens, seed, ar_temperature,
                    order) -> Iterator[tuple]:
        """The Race button: validate and run the race; the panel of the running side follows it live. Yields
        (diffusion panel, autoregressive panel, result, Race button, Stop button). The finished race is kept in
        `session` for `replay_stream`, which runs next without holding the engine's queue slot.

        Raises:
            gr.Error: bad input (before anything runs) or a failure during the race (the buttons are reset first).
        """
        request = self.ui_request(prompt, raw, preset_name, max_new_tokens, seed, ar_temperature, order)
        progress, stop, thread = self.start(request)
        if session is not None:
            session.stop()  # one race per session
            session.stop_event, session.progress = stop, None
        try:
            yield (*self.live_panels(progress), result_html(None), gr.update(interactive=False),
                   gr.update(interactive=True))
            while thread.is_alive():
                thread.join(LIVE_INTERVAL_S)
                yield (*self.live_panels(progress), gr.skip(), gr.skip(), gr.skip())
            if progress.error is not None:
                yield (*self.live_panels(progress), gr.skip(), *IDLE_BUTTONS)
                raise gr.Error(describe_error(progress.error), print_exception=False)
            if session is not None:
                session.progress = progress
        finally:
            if progress.error is not None or session is None or session.progress is not progress:
                stop.set()  # stopped, failed, or Gradio closed this generator (tab closed)

    def replay_stream(self, session: RaceSession) -> Iterator[tuple]:
        """After the race: replay both sides together on the engine clock (time 0 = each side's start), at most
        `REPLAY_FPS` renders a second, then show the result card. Stop ends the replay at once. Same outputs as
        `race_stream`."""
        progress = session.progress if session is not None else None
        if progress is None or progress.result is None:
            yield (gr.skip(), gr.skip(), gr.skip(), *IDLE_BUTTONS)
            return
        result, stop = progress.result, session.stop_event
        if not result.cancelled:
            total = max(side.seconds for side in (result.diffusion, result.autoregressive))
            start = time.monotonic()
            while (t := time.monotonic() - start) < total and not (stop is not None and stop.is_set()):
                yield (*self.replay_panels(progress, t), gr.skip(), gr.skip(), gr.skip())
                time.sleep(1.0 / REPLAY_FPS)
        final = tuple(self.panel(progress, side, "done", float("inf")) for side in SIDES)  # no caret, no "replay"
        yield (*final, result_html(result), *IDLE_BUTTONS)

    @staticmethod
    def stop(session: RaceSession) -> None:
        """The Stop button: stop this session's race (the running side ends within one forward; the other side
        does not start)."""
        if session is not None:
            session.stop()

    def race_api(self, prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max,
                 stability_threshold, confidence_threshold, adaptive_stopping, seed, ar_temperature,
                 order) -> tuple[str, str, dict]:
        """`/race`: the eleven `/generate` inputs (same checks, the API's limits), the AR temperature and the
        order; runs the race and returns (diffusion text, autoregressive text, summary).

        Raises:
            gr.Error: invalid input (the same messages as `/generate`) or a failure during the race.
        """
        try:
            run = Playground.parse(prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max,
                                   stability_threshold, confidence_threshold, adaptive_stopping, seed,
                                   ui_limits=False)
        except Exception as error:  # noqa: BLE001
            raise gr.Error(describe_error(error), print_exception=False) from None
        progress, stop, thread = self.start(self.check(run, ar_temperature, order))
        try:
            thread.join()
        finally:
            stop.set()
        if progress.error is not None:
            raise gr.Error(describe_error(progress.error), print_exception=False)
        result = progress.result
        texts = [plain_text(side.text) if side is not None else "" for side in (result.diffusion,
                                                                                  result.autoregressive)]
        return texts[0], texts[1], result.summary()

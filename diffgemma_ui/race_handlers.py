"""The Race tab's event handlers: validation, running a race as a run (`runs.Runner`), live view, replay, the API.

A race (`engine.race.RaceRunner.run`: one side, then the other, each after a warm-up) is the "race" job of the run
mechanism (`Playground.start_job`, in the GPU process on ZeroGPU): its (side, frame) items, then its result, are
recorded in a `RaceProgress`. While it runs, the panel of the side that is running follows it live;
once both are done the handler replays both traces side by side on the engine clock (time 0 = each side's start),
then shows the result card.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from engine.autoregressive import check_temperature
from engine.race import SIDES, RaceResult, RaceRunner

from .handlers import Job, Playground
from .race_view import frame_at, panel_html, result_html
from .runs import RunWorker, pushed, session_key
from .tab import served, user_error
from .text import plain_text
from .validation import RunRequest, build_request, preset_values

IDLE_BUTTONS = (gr.update(interactive=True), gr.update(interactive=False))  # Race on, Stop off
LIVE_INTERVAL_S = 0.25  # live panels re-render at most 4 times a second: the engine shares the CPU
REPLAY_FPS = 12.0


def model_name(source) -> str:
    """A model's name for the page: the folder name of a local path, a hub id (org/name) unchanged."""
    text = str(source)
    return Path(text).name if Path(text).expanduser().exists() else text


@dataclass
class RaceProgress:
    """A race's record (the `RunWorker` writes it, the handler reads it; it is its own snapshot).

    frames: per side, every frame in order; first_token_s: per side, engine seconds of its first committed token;
    result: set by the race's source when it is over; error: what ended it; finished: the run is over; texts:
    decoded answers, cached.
    """

    frames: dict = field(default_factory=lambda: {side: [] for side in SIDES})
    first_token_s: dict = field(default_factory=dict)
    order: list = field(default_factory=list)
    result: RaceResult | None = None
    error: BaseException | None = None
    finished: bool = False
    texts: dict = field(default_factory=dict)
    count: int = 0
    latest: object = None

    def add(self, item) -> None:
        """One `(side, frame)` item of the race (its `on_frame` callback's arguments), or its `RaceResult`."""
        if isinstance(item, RaceResult):
            self.result = item
            return
        side, frame = item
        if side not in self.order:
            self.order.append(side)
        if side not in self.first_token_s and frame.committed_tokens > 0:
            self.first_token_s[side] = frame.elapsed_s
        self.frames[side].append(frame)
        self.count, self.latest = self.count + 1, frame

    def finish(self, error: BaseException | None = None) -> None:
        self.error, self.finished = error, True

    @property
    def frames_seen(self) -> int:
        return self.count

    def snapshot(self) -> "RaceProgress":
        return self

    def running_side(self) -> str | None:
        """The side whose frames arrive now (None before the first frame or once the race is over)."""
        return None if self.finished or not self.order else self.order[-1]


class RaceSession:
    """One browser session's race state (a `gr.State` value): its race in progress, and the finished race's
    progress for the replay."""

    def __init__(self):
        self.worker: RunWorker | None = None
        self.progress: RaceProgress | None = None

    @property
    def stop_event(self):
        return self.worker.stop_event if self.worker is not None else None

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()


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
        playground: the app's `handlers.Playground` (default: one of its own), whose run mechanism runs races (its
            time limit covers both sides) and whose engine checks them (on ZeroGPU a CPU view).
    """

    def __init__(self, runner: RaceRunner, playground: Playground | None = None):
        self.runner = runner
        self.playground = playground or Playground(runner.engine)
        self.runs = self.playground.runs
        # checks run in this process: on ZeroGPU through the CPU view of the engine, never the GPU one
        same = self.playground.engine is runner.engine
        self.checker = runner if same else RaceRunner(self.playground.engine)
        self.playground.sources["race"] = self.race_items

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
        try:
            self.checker.check(run.prompt, run.settings, raw=run.raw, ar_temperature=ar_temperature, order=order,
                              seed=run.seed)
            race = RaceRequest(run=run, ar_temperature=check_temperature(ar_temperature), order=order)
            self.playground.check_job(self.job(race))
            return race
        except Exception as error:  # noqa: BLE001 - bad input, or a failing tokenizer: a clear message either way
            raise user_error(error) from None

    def ui_request(self, prompt, raw, preset_name, max_new_tokens, seed, ar_temperature, order) -> RaceRequest:
        """The tab's inputs (a preset for the denoising settings) validated with the UI's limits; raises gr.Error."""
        try:
            values = dict(preset_values(preset_name, self.runner.engine.recommended), max_new_tokens=max_new_tokens)
            run = build_request(prompt, raw, values, seed, ui_limits=True)
        except Exception as error:  # noqa: BLE001
            raise user_error(error) from None
        return self.check(run, ar_temperature, order)

    def check_inputs(self, prompt, raw, preset_name, max_new_tokens, seed, ar_temperature, order) -> None:
        """The Race button's first step: every check, nothing run (raises gr.Error)."""
        self.ui_request(prompt, raw, preset_name, max_new_tokens, seed, ar_temperature, order)

    # -- running ---------------------------------------------------------------------------------------------------
    def job(self, race: RaceRequest) -> Job:
        """The race as a job: both sides' forwards (the autoregressive side one per token of the budget)."""
        return Job("race", race, race.run.settings, extra_forwards=self.checker.budget(race.run.settings))

    def race_items(self, engine, race: RaceRequest, stop: threading.Event) -> Iterator:
        """The "race" source: each side's (side, frame) as it runs, then the `RaceResult`."""
        run = race.run
        return pushed(lambda emit: self.runner.run(
            run.prompt, run.settings, raw=run.raw, seed=run.seed, ar_temperature=race.ar_temperature,
            order=race.order, on_frame=lambda side, frame: emit((side, frame)), stop_event=stop))

    def start(self, race: RaceRequest, key: str | None = None) -> RunWorker:
        """Start the race as a run (registered as `key`); its `RaceProgress` is `worker.record`, its result set
        when both sides are done. Past the server's time limit it is stopped and ends with an error saying so."""
        return self.playground.start_job(self.job(race), key, record=RaceProgress())

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
        return panel_html(side, frame, text=self.side_text(progress, side, frame), model=self.models[side],
                          position=position, state=state, t=t, first_token_s=progress.first_token_s.get(side))

    def live_panels(self, progress: RaceProgress) -> tuple[str, str]:
        running = progress.running_side()
        states = {side: ("running" if side == running else "done" if progress.frames[side] else "waiting")
                  for side in SIDES}
        return tuple(self.panel(progress, side, states[side]) for side in SIDES)

    def replay_panels(self, progress: RaceProgress, t: float) -> tuple[str, str]:
        return tuple(self.panel(progress, side, "replay", t) for side in SIDES)

    # -- events ----------------------------------------------------------------------------------------------------
    def race_stream(self, session: RaceSession, prompt, raw, preset_name, max_new_tokens, seed, ar_temperature,
                    order, request: gr.Request = None) -> Iterator[tuple]:
        """The Race button: validate and run the race; the panel of the running side follows it live. Yields
        (diffusion panel, autoregressive panel, result, Race button, Stop button). The finished race is kept in
        `session` for `replay_stream`, which runs next without holding the engine's queue slot.

        Raises:
            gr.Error: bad input (before anything runs) or a failure during the race (the buttons are reset first).
        """
        race = self.ui_request(prompt, raw, preset_name, max_new_tokens, seed, ar_temperature, order)
        if session is not None:
            session.stop()  # one race per session
        key = session_key(request, session, ":race")
        worker = self.start(race, key)
        progress = worker.record
        if session is not None:
            session.worker, session.progress = worker, None
        try:
            yield (*self.live_panels(progress), result_html(None), gr.update(interactive=False),
                   gr.update(interactive=True))
            for snap in worker.updates(1.0 / LIVE_INTERVAL_S, reader_budget=None):
                if not snap.finished:
                    yield (*self.live_panels(progress), gr.skip(), gr.skip(), gr.skip())
            if progress.error is not None:
                yield (*self.live_panels(progress), gr.skip(), *IDLE_BUTTONS)
                raise user_error(progress.error)
            if session is not None:
                session.progress = progress
        finally:
            if progress.error is not None or session is None or session.progress is not progress:
                worker.stop()  # stopped, failed, or Gradio closed this generator (tab closed)
            self.runs.registry.unregister(key, worker)

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

    async def race_api(self, prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max,
                       stability_threshold, confidence_threshold, adaptive_stopping, seed, ar_temperature, order,
                       request: gr.Request = None) -> tuple[str, str, dict]:
        """`/race`: the eleven `/generate` inputs (same checks, the API's limits), the AR temperature and the
        order; runs the race and returns (diffusion text, autoregressive text, summary).

        Raises:
            gr.Error: invalid input (the same messages as `/generate`) or a failure during the race.
        """
        def start() -> RunWorker:
            try:
                run = Playground.parse(prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min,
                                       t_max, stability_threshold, confidence_threshold, adaptive_stopping, seed,
                                       ui_limits=False)
            except Exception as error:  # noqa: BLE001
                raise user_error(error) from None
            return self.start(self.check(run, ar_temperature, order))

        progress = await served(self.runs, start, request)
        if progress.error is not None:
            raise user_error(progress.error)
        result = progress.result
        texts = [plain_text(side.text) if side is not None else "" for side in (result.diffusion,
                                                                                  result.autoregressive)]
        return texts[0], texts[1], result.summary()

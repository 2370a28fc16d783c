"""The Compare tab's handler: one prompt and seed, run under settings A, then under settings B, side by side.

The two runs never share the device: B starts only once A has finished (they are one queued event, in the engine's
concurrency slot). Runs go through the playground's checks and workers (`handlers.Playground`), so limits, time
limits and ZeroGPU behave as for Generate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import gradio as gr

from engine import Frame
from engine.diffusers_sampler import SCHEDULERS, PipelineRun, diffusers_available
from engine.settings import draw_seed

from . import plots
from .compare_view import NOT_RUN, side_html, verdict_html
from .meter import REFUSED_NOTICE
from .runs import STOP_WAIT_S, time_limit_error
from .tab import describe_error, user_error
from .text import plain_text

POLL_S = 0.5  # how often the tab redraws a running side
ENGINE_SAMPLER = "engine: entropy bound (transformers)"
DIFFUSERS_PREFIX = "diffusers: "


def sampler_choices() -> list[str]:
    """The samplers side B offers: the engine's, and diffusers' schedulers when diffusers is installed."""
    return [ENGINE_SAMPLER, *([DIFFUSERS_PREFIX + name for name in SCHEDULERS] if diffusers_available() else [])]


class CompareState:
    """One visitor's Compare runs (a `gr.State` value): Stop sets `stop` (cleared when a request is accepted, so a
    Stop pressed while the request waits in the queue still counts); `running` while a comparison runs; `shown`: the
    last frames (A, B) of the last comparison that ended, which stay on the page. A copy is always fresh (nothing
    crosses sessions)."""

    def __init__(self):
        self.stop = threading.Event()
        self.worker = None  # the engine side's run in progress
        self.running = False
        self.shown: tuple[Frame | None, Frame | None] | None = None

    def __deepcopy__(self, memo) -> "CompareState":
        return CompareState()


class CompareHandlers:
    """Event handlers of the Compare tab, bound to a `handlers.Playground`."""

    def __init__(self, playground):
        self.playground = playground
        self.engine = playground.engine

    def _request(self, prompt, raw, seed, max_new_tokens, entropy_bound, max_denoising_steps, adaptive_stopping):
        rec = self.engine.recommended
        return self.playground.checked_request(
            prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, rec.t_min, rec.t_max,
            rec.stability_threshold, rec.confidence_threshold, adaptive_stopping, seed, ui_limits=True)

    def _checked(self, prompt, raw, seed, max_new_tokens, a_entropy_bound, a_steps, a_adaptive, b_entropy_bound,
                 b_steps, b_adaptive, b_sampler) -> tuple[list, str | None]:
        """Both sides' checked requests (one seed: -1 or empty draws it) and B's diffusers scheduler (None: the
        engine's sampler).

        Raises:
            gr.Error: an invalid input on either side, an unknown sampler, or a raw prompt for diffusers' pipeline.
        """
        if seed is None or (isinstance(seed, (int, float)) and seed < 0) or str(seed).strip() == "":
            seed = draw_seed()
        requests = [self._request(prompt, raw, seed, max_new_tokens, eb, steps, adaptive)
                    for eb, steps, adaptive in ((a_entropy_bound, a_steps, a_adaptive),
                                                (b_entropy_bound, b_steps, b_adaptive))]
        if b_sampler not in sampler_choices():
            raise user_error(f"unknown sampler {str(b_sampler)[:60]!r}")
        scheduler = b_sampler[len(DIFFUSERS_PREFIX):] if b_sampler.startswith(DIFFUSERS_PREFIX) else None
        if scheduler is not None and requests[1].raw:
            raise user_error("diffusers' pipeline always applies the chat template: untick raw prompt to use it")
        return requests, scheduler

    def request(self, prompt, raw, seed, max_new_tokens, a_entropy_bound, a_steps, a_adaptive, b_entropy_bound,
                b_steps, b_adaptive, b_sampler=ENGINE_SAMPLER, state: CompareState | None = None) -> None:
        """The first step of Compare A and B (no queue, no output): check both sides' inputs as `compare` will, and
        clear the visitor's Stop, so a Stop pressed from now on (even while the comparison waits in the queue) stops it.

        Raises:
            gr.Error: a refused request (`refused` then marks the previous comparison, if any).
        """
        self._checked(prompt, raw, seed, max_new_tokens, a_entropy_bound, a_steps, a_adaptive, b_entropy_bound,
                      b_steps, b_adaptive, b_sampler)
        if state is not None:
            state.stop.clear()

    @staticmethod
    def refused(state: CompareState | None):
        """After `request` refused a request: the verdict of the comparison still on the page, marked as the previous
        run's (`meter.REFUSED_NOTICE` above it); `gr.skip()` when none ended yet or one is still running.

        Returns:
            the verdict's HTML, or `gr.skip()`.
        """
        if state is None or state.running or state.shown is None:
            return gr.skip()
        return verdict_html(*state.shown, notice=REFUSED_NOTICE)

    def compare(self, prompt, raw, seed, max_new_tokens, a_entropy_bound, a_steps, a_adaptive, b_entropy_bound,
                b_steps, b_adaptive, b_sampler=ENGINE_SAMPLER, state: CompareState | None = None) -> Iterator[tuple]:
        """Run A then B (same prompt, raw flag, seed and max_new_tokens; each side its entropy bound, max denoising
        steps and adaptive stopping; t_min, t_max and the stopping thresholds are the checkpoint's).

        `b_sampler` (`sampler_choices`): B may run diffusers' `DiffusionGemmaPipeline` with one of its schedulers
        instead of the engine (`engine.diffusers_sampler`: chat prompts only, shown live as it runs and stopped at the
        server's time limit per run; its random stream is the pipeline's generator seeded with the same seed, not
        the engine's).

        `state`: the visitor's `CompareState`; its Stop ends the running side within one decoder forward (its card
        says "stopped") and B does not start after a stopped A; a Stop set before this starts (pressed while the
        request waited in the queue, after `request` cleared it) runs neither side.

        Seed -1 (or empty) draws one seed for both. Yields (A card, B card, verdict, A text, B text, A heatmap,
        B heatmap) while A runs, while B runs, and at the end.

        Raises:
            gr.Error: an invalid input on either side (before anything runs), or a run that failed.
        """
        requests, scheduler = self._checked(prompt, raw, seed, max_new_tokens, a_entropy_bound, a_steps,
                                            a_adaptive, b_entropy_bound, b_steps, b_adaptive, b_sampler)
        sampler_note = "" if scheduler is None else scheduler
        # only the entropy-bound scheduler reads the entropy bound and temperatures
        b_reads_bound = scheduler is None or scheduler == "EntropyBoundScheduler"
        if not b_reads_bound:
            sampler_note += " (its own defaults for what it samples with)"
        state = state if state is not None else CompareState()
        lasts = [None, None]
        heatmaps = [plots.confidence_heatmap([]), plots.confidence_heatmap([])]
        texts = ["", ""]
        states = ["waiting", "waiting"]

        def view():
            return (side_html("A", requests[0].settings, lasts[0], states[0]),
                    side_html("B", requests[1].settings, lasts[1], states[1], sampler=sampler_note,
                              bound_and_t=b_reads_bound),
                    verdict_html(*lasts), texts[0], texts[1], heatmaps[0], heatmaps[1])

        state.running = True
        try:
            yield from self._run_sides(requests, scheduler, state, lasts, texts, heatmaps, states, view)
        finally:
            state.running = False
            state.shown = (lasts[0], lasts[1])

    def _run_sides(self, requests, scheduler, state, lasts, texts, heatmaps, states, view) -> Iterator[tuple]:
        """`compare`'s loop: A then B, filling `lasts`, `texts`, `heatmaps` and `states` in place and yielding
        `view()`."""
        if state.stop.is_set():  # stopped while it waited in the queue
            states[:] = ["stopped", NOT_RUN]
            yield view()
            return
        for side, request in enumerate(requests):
            states[side] = "running"
            if side == 1 and scheduler is not None:
                frames = yield from self._pipeline_side(request, scheduler, lasts, view, state.stop)
                if not frames:  # stopped before its first decoder forward
                    states[side] = "stopped"
                    break
                lasts[side] = frames[-1]
                texts[side] = plain_text(self.engine.summarize(frames[-1], len(frames)).text)
                heatmaps[side] = plots.confidence_heatmap([f for f in frames if f.block_index == 0], animate=True,
                                                          hover=True)
                states[side] = "stopped" if state.stop.is_set() else "done"
                continue
            worker = state.worker = self.playground.start_run(request, keep_history=True)
            if state.stop.is_set():  # Stop came while this side started
                worker.stop()
            try:
                for snap in worker.updates(1.0 / POLL_S, reader_budget=None):
                    if not snap.finished:
                        lasts[side] = snap.latest
                        yield view()
            finally:
                worker.stop()
                worker.join(STOP_WAIT_S)  # B must not start while A still holds the device
            if state.stop.is_set() and snap.error is None and snap.latest is None:
                states[side] = "stopped"  # stopped before its first decoder forward
                break
            if snap.error is not None or snap.latest is None:
                raise user_error(f"Run {'AB'[side]} failed: {snap.error or 'no decoder forward'}")
            lasts[side] = snap.latest
            texts[side] = plain_text(self.engine.summarize(snap.latest, snap.frames_seen).text)
            heatmaps[side] = plots.confidence_heatmap(snap.block_frames(0), animate=True, hover=True)
            states[side] = "done"
            if state.stop.is_set():
                states[side] = "stopped"
                break
        states[:] = [NOT_RUN if s == "waiting" else s for s in states]  # B after a stopped A
        yield view()

    @staticmethod
    def stop(state: CompareState | None) -> None:
        """Stop: the running side ends within one decoder forward and the other does not start."""
        if state is not None:
            state.stop.set()
            if state.worker is not None:
                state.worker.stop()

    def _pipeline_side(self, request, scheduler: str, lasts: list, view,
                       stop: threading.Event | None = None) -> Iterator[tuple]:
        """Side B through diffusers' pipeline (`engine.diffusers_sampler.PipelineRun`): yields `view()` every
        `POLL_S` with the newest frame in `lasts[1]`, stops the call at the server's time limit per run, and returns
        the run's frames ([] when `stop` ended it before its first forward). The call is stopped when `stop` is set
        (Stop) and when this generator is closed (tab closed).

        Raises:
            gr.Error: the call failed, made no decoder forward, or reached the time limit.
        """
        stopped = (lambda: False) if stop is None else stop.is_set
        run = PipelineRun(self.engine, request.prompt, request.settings, scheduler, request.seed)
        if stopped():  # Stop came before the call started: nothing runs
            return []
        run.start()
        limit = self.playground.max_run_s
        started = time.monotonic()
        try:
            yield view()
            while True:
                if stopped():
                    run.stop()  # checked before each wait, so a Stop during a yield never waits a poll
                if run.wait(POLL_S):
                    break
                lasts[1] = run.latest()
                yield view()
                if limit is not None and time.monotonic() - started > limit:
                    run.stop()
                    run.wait()
                    error = time_limit_error(limit, run.forwards, blocks_kept=False)
                    raise user_error(error, prefix="Run B failed: ")
        finally:
            run.stop()
            run.wait(10.0)  # the next request must not start while the pipeline still holds the device
        frames = run.frames()
        if stopped() and run.error is None and not frames:
            return []
        if run.error is not None or not frames:
            reason = describe_error(run.error) if run.error is not None else "no decoder forward"
            raise user_error(f"Run B failed: {reason}")
        return frames

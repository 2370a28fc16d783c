"""The Compare tab: one prompt and seed under settings A, then B (after A, in one queued event), side by side;
each side a "generate" job, or B through diffusers' schedulers the "pipeline" job."""

from collections.abc import Iterator
from typing import NamedTuple

import gradio as gr

from engine import PRESET_NAMES, DiffusionSettings, Frame, preset
from engine.diffusers_sampler import (SCHEDULERS, PipelineRun, check_pipeline_settings, diffusers_available,
                                      ignored_settings)
from engine.settings import SETTING_NAMES, draw_seed, parse_seed, spec

from . import plots
from .hub import Job, Outcome
from .meter import REFUSED_NOTICE, meter_html
from .runs import STOP_WAIT_S
from .session import SessionState
from .tab import (UNQUEUED, Tab, buttons, checked, live_run, refusal_box, refusing, run_buttons, seed_box,
                  setting_control, user_error, wire_stop)
from .text import escape_html, plain_text, plural, prose
from .validation import RunRequest

POLL_S = 0.5  # how often a running side redraws
PIPELINE_POLL_S = 0.05
ENGINE_SAMPLER = "engine: entropy bound (transformers)"
DIFFUSERS_PREFIX = "diffusers: "
SIDES = ("A", "B")
DOT = " \u00b7 "
DEFAULT_SIDES = {"A": "recommended", "B": "fast"}
NOT_RUN = "not run"  # a side's state when Stop came before its turn
SIDE_SETTINGS = {"entropy_bound": "nats", "max_denoising_steps": None,  # each side's own settings: their info
                 "adaptive_stopping": spec("adaptive_stopping").help}


def sampler_choices() -> list[str]:
    """Side B's samplers: the engine's, and diffusers' schedulers if installed."""
    return [ENGINE_SAMPLER, *([DIFFUSERS_PREFIX + name for name in SCHEDULERS] if diffusers_available() else [])]


def scheduler_of(sampler: str) -> str | None:
    """The diffusers scheduler of a B sampler choice; None for the engine's."""
    return sampler[len(DIFFUSERS_PREFIX):] if str(sampler).startswith(DIFFUSERS_PREFIX) else None


def b_controls(sampler: str) -> list:
    """Updates of B's `SIDE_SETTINGS` controls for `sampler`: what its scheduler ignores disabled, saying so."""
    scheduler = scheduler_of(sampler)
    ignored = ignored_settings(scheduler) if scheduler in SCHEDULERS else ()
    return [gr.update(interactive=name not in ignored,
                      info=f"ignored: {scheduler} samples with its own defaults" if name in ignored else info)
            for name, info in SIDE_SETTINGS.items()]


class PipelineJob(NamedTuple):
    """A "pipeline" job's payload: the checked request and the diffusers scheduler's name."""

    request: RunRequest
    scheduler: str


def pipeline_source(engine, payload: PipelineJob, stop) -> Iterator:
    """The "pipeline" source of `payload`: its newest frame per forward, then the exact frames (an `Outcome`) and
    the last frame; raises what diffusers raised."""
    request, scheduler = payload.request, payload.scheduler
    run = PipelineRun(engine, request.prompt, request.settings, scheduler, request.seed)
    if stop.is_set():
        return
    run.start()
    shown = 0
    try:
        while not run.wait(PIPELINE_POLL_S):
            if stop.is_set():
                run.stop()
            elif run.forwards > shown:
                shown = run.forwards
                yield run.latest()
    finally:
        run.stop()
        run.wait(10.0)  # the pipeline frees the device for the next run
    if run.error is not None:
        raise run.error
    if frames := run.frames():
        yield Outcome(frames)
        yield frames[-1]


class CompareState(SessionState):
    """A visitor's comparison: `running`, and `shown`, the last frames (A, B) of the last one to end."""

    running = False
    shown: tuple[Frame | None, Frame | None] | None = None


class CompareHandlers(Tab):
    """Handlers of the Compare tab."""

    title = "Compare"

    def build(self, page) -> None:
        build_compare_tab(self, page.default_prompt)

    sources = {"pipeline": pipeline_source}

    def _checked(self, inputs: tuple) -> tuple[list, str | None]:
        """(both sides' requests, B's diffusers scheduler or None) of `compare`'s inputs; gr.Error."""
        prompt, raw, seed, max_new_tokens, *sides = inputs
        rec, count = self.engine.recommended, len(SIDE_SETTINGS)
        b_sampler = sides.pop() if len(sides) > 2 * count else ENGINE_SAMPLER
        with refusing():
            seed = parse_seed(seed)
        seed = draw_seed() if seed is None else seed

        def values(side) -> dict:
            chosen = {"max_new_tokens": max_new_tokens, **dict(zip(SIDE_SETTINGS, side))}
            return {**{name: chosen.get(name, getattr(rec, name)) for name in SETTING_NAMES}, "prompt": prompt,
                    "raw": raw, "seed": seed}

        requests = [self.hub.checked_request(values(side), ui_limits=True) for side in (sides[:count], sides[count:])]
        if b_sampler not in sampler_choices():
            raise user_error(f"unknown sampler {str(b_sampler)[:60]!r}")
        scheduler = scheduler_of(b_sampler)
        if scheduler is not None and requests[1].raw:
            raise user_error("diffusers' pipeline always applies the chat template: untick raw prompt to use it")
        if scheduler is not None:
            with refusing():
                check_pipeline_settings(requests[1].settings)
        return requests, scheduler

    def request(self, state: CompareState | None, *inputs) -> None:
        """Compare A and B's first step: check `compare`'s inputs, clear the visitor's Stop; gr.Error."""
        self._checked(inputs)
        if state is not None:
            state.stopped.clear()

    @staticmethod
    def refused(state: CompareState | None):
        """After a refusal: the verdict marked as the previous run's (`gr.skip()`: none, or running)."""
        if state is None or state.running or state.shown is None:
            return gr.skip()
        return verdict_html(*state.shown, notice=REFUSED_NOTICE)

    def compare(self, state: CompareState | None, request: gr.Request, *inputs) -> Iterator[tuple]:
        """Run A then B (not after a stopped A) of prompt, raw, seed, max_new_tokens, A's and B's `SIDE_SETTINGS`, B's
        sampler: (cards, verdict, texts, heatmaps); gr.Error: bad input on either side, a failed run."""
        requests, scheduler = self._checked(inputs)
        b_reads_bound = scheduler is None or "entropy_bound" not in ignored_settings(scheduler)
        sampler_note = (scheduler or "") + ("" if b_reads_bound else " (its own defaults for what it samples with)")
        state = state or CompareState()
        lasts, texts, states = [None, None], ["", ""], ["waiting", "waiting"]
        heatmaps = [plots.confidence_heatmap([])] * 2

        def view():
            return (side_html("A", requests[0].settings, lasts[0], states[0]),
                    side_html("B", requests[1].settings, lasts[1], states[1], sampler=sampler_note,
                              bound_and_t=b_reads_bound), verdict_html(*lasts), *texts, *heatmaps)

        state.running = True
        try:
            for side, run in enumerate(requests):
                if state.stopped.is_set():
                    break
                states[side] = "running"
                exact: list[Frame] = []  # the pipeline's exact frames
                piped = side == 1 and scheduler is not None
                job = (Job("pipeline", PipelineJob(run, scheduler), run.settings) if piped
                       else Job("generate", run, run.settings))
                options = dict(keep_history=False, receive=exact.extend) if piped else {}
                with live_run(self.hub, job, request, state, ":compare", **options) as worker:
                    if state.stopped.is_set():
                        worker.stop()
                    for snap in worker.updates(1.0 / POLL_S, reader_budget=None):
                        if not snap.finished:
                            lasts[side] = snap.latest
                            yield view()
                worker.join(STOP_WAIT_S)
                if state.stopped.is_set() and snap.error is None and snap.latest is None:
                    states[side] = "stopped"
                    break
                if snap.error is not None or snap.latest is None:
                    raise user_error(snap.error or "no decoder forward", prefix=f"Run {SIDES[side]} failed: ")
                lasts[side] = snap.latest
                texts[side] = plain_text(self.engine.summarize(snap.latest, len(exact) or snap.frames_seen).text)
                block = [f for f in exact if f.block_index == 0] if exact else snap.block_frames(0)
                heatmaps[side] = plots.confidence_heatmap(block)
                states[side] = "stopped" if state.stopped.is_set() else "done"
            # A stopped before its run, B after a stopped A
            states[:] = [("stopped", NOT_RUN)[i] if s == "waiting" else s for i, s in enumerate(states)]
            yield view()
        finally:
            state.running = False
            state.shown = tuple(lasts)


def build_compare_tab(compare: CompareHandlers, default_prompt: str) -> None:
    """The Compare tab's components and events in the current `gr.Tab`."""
    rec = compare.engine.recommended
    gr.Markdown(prose("compare-intro"))
    with gr.Row():
        prompt = gr.Textbox(label="Prompt", value=default_prompt, lines=2, max_lines=6, scale=3,
                            elem_id="dg-compare-prompt")
        with gr.Column(scale=2, min_width=240):
            raw = gr.Checkbox(label="Raw prompt (no chat template)", elem_id="dg-compare-raw")
            with gr.Row():
                seed = seed_box("dg-compare-seed", info="-1 = random, one for both", min_width=100)
                max_new_tokens = setting_control("max_new_tokens", rec.max_new_tokens, info=None,
                                                 elem_id="dg-compare-max-new")

    def apply(choice) -> list:
        return [getattr(preset(choice, rec), setting) for setting in SIDE_SETTINGS]

    side_inputs = []
    with gr.Row():
        for side in SIDES:
            settings = preset(DEFAULT_SIDES[side], rec)
            with gr.Column(min_width=260, elem_id=f"dg-compare-settings-{side}"):
                name = gr.Dropdown(list(PRESET_NAMES), value=DEFAULT_SIDES[side], label=f"Settings {side}: preset",
                                   elem_id=f"dg-compare-preset-{side}")
                controls = [setting_control(setting, getattr(settings, setting), info=info,
                                            label=f"{side}: {spec(setting).label.lower()}",
                                            elem_id=f"dg-compare-{setting.replace('_', '-')}-{side}")
                            for setting, info in SIDE_SETTINGS.items()]
                if side == "B":
                    sampler = gr.Dropdown(sampler_choices(), value=ENGINE_SAMPLER, label="B: sampler",
                                          info=prose("compare-sampler-info"), elem_id="dg-compare-sampler")
                    sampler.change(b_controls, inputs=[sampler], outputs=controls, **UNQUEUED)
            name.change(apply, inputs=[name], outputs=controls, **UNQUEUED)
            side_inputs += controls
    with gr.Row():
        run, stop = run_buttons("Compare A and B", "dg-compare-run", "dg-compare-stop")
    refusal = refusal_box("compare")
    state = gr.State(CompareState())
    verdict = gr.HTML(verdict_html(None, None), elem_id="dg-compare-verdict")
    cards, texts, heatmaps = [], [], []
    with gr.Row():
        for side in SIDES:
            with gr.Column(min_width=300, elem_id=f"dg-compare-{side}"):
                cards.append(gr.HTML(side_html(side, None, None, "waiting"), elem_id=f"dg-compare-card-{side}"))
                texts.append(gr.Textbox(label=f"Text {side}", lines=3, max_lines=10, interactive=False,
                                        elem_id=f"dg-compare-text-{side}"))
                heatmaps.append(gr.Plot(plots.confidence_heatmap([]), show_label=False,
                                        elem_id=f"dg-compare-heatmap-{side}"))

    inputs = [state, prompt, raw, seed, max_new_tokens, *side_inputs, sampler]
    requested = checked([run.click], compare.request, inputs=inputs, box=refusal, refused=compare.refused,
                        refused_inputs=[state], refused_outputs=[verdict], trigger_mode="once")
    requested.success(lambda: buttons(True), outputs=[run, stop], **UNQUEUED)
    compared = requested.success(compare.compare, inputs=inputs, outputs=[*cards, verdict, *texts, *heatmaps],
                                 api_visibility="private", concurrency_id="engine", show_progress="minimal",
                                 trigger_mode="once")
    compared.then(lambda: buttons(False), outputs=[run, stop], **UNQUEUED)
    wire_stop(stop, state)


# Views (pure)
def side_html(side: str, settings: DiffusionSettings | None, last: Frame | None, state: str,
              sampler: str = "", bound_and_t: bool = True) -> str:
    """One side's card: name, `sampler`, the settings presets differ in (`bound_and_t` False: not the bound and
    temperatures), `state` and the meter of its newest frame."""
    parts = [sampler] * bool(sampler)
    if settings is not None:
        parts += [f"entropy bound {settings.entropy_bound:g}"] * bound_and_t
        parts += [f"max {plural(settings.max_denoising_steps, 'step')}"]
        parts += [f"t {settings.t_max:g}\u2192{settings.t_min:g}"] * bound_and_t
        parts += [f"adaptive stopping {'on' if settings.adaptive_stopping else 'off'}"]
    return (f'<div class="dg-compare-side" data-side="{escape_html(side)}" data-state="{escape_html(state)}">'
            f'<h3>{escape_html(side)} \u00b7 {escape_html(state)}</h3>'
            f'<p class="dg-meter-note">{escape_html(DOT.join(parts))}</p>'
            f'{meter_html(last, note=prose("compare-not-run" if state == NOT_RUN else "compare-idle"))}</div>')


VERDICT_ROWS = (  # (name, figure of a finished frame, its format, whether B / A is shown)
    ("decoder forwards", lambda frame: frame.forward_index + 1, "{:,}", True),
    ("tokens per forward", lambda frame: frame.tokens_per_forward, "{:.2f}", True),
    ("tokens/s (engine clock)", lambda frame: frame.tokens_per_second, "{:.1f}", True),
    ("seconds", lambda frame: frame.elapsed_s, "{:.2f}", True),
    ("tokens", lambda frame: frame.committed_tokens, "{:,}", False),
)


def verdict_html(a: Frame | None, b: Frame | None, *, notice: str | None = None) -> str:
    """Two finished runs, B against A (empty until both are done); `notice`: a line above it."""
    banner = f'<div class="dg-meter-notice" role="status">{escape_html(notice)}</div>' if notice else ""
    if a is None or b is None or not (a.done and b.done):
        return f'<div class="dg-compare-verdict" data-state="{"refused" if notice else "pending"}">{banner}</div>'
    body = ""
    for name, figure, shape, ratio in VERDICT_ROWS:
        x, y = figure(a), figure(b)
        cells = (shape.format(x), shape.format(y), (f"{y / x:.2f}\u00d7" if x > 0 else "\u2013") if ratio else "")
        body += f"<tr><th>{escape_html(name)}</th>" + "".join(f"<td>{escape_html(c)}</td>" for c in cells) + "</tr>"
    ids = a.committed_ids, b.committed_ids
    same = ids[0] == ids[1]
    first_difference = next((i for i, (x, y) in enumerate(zip(*ids)) if x != y), min(map(len, ids)))
    texts = "the same tokens" if same else f"different tokens from token {first_difference + 1}"
    return (f'<div class="dg-compare-verdict" data-state="{"refused" if notice else "done"}" '
            f'data-same="{str(same).lower()}">{banner}'
            f"<table><thead><tr><th></th><th>A</th><th>B</th><th>B / A</th></tr></thead><tbody>{body}</tbody>"
            f"</table><p>Same prompt and seed ({escape_html(str(a.seed))}): {escape_html(texts)}.</p></div>")

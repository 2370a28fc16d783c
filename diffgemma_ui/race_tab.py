"""The Race tab and `/race`: block diffusion against autoregressive decoding on one prompt (the "race" job, one
side after the other), then both replayed side by side on the engine clock, with a result card saying why."""

import threading
import time
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import gradio as gr

from engine.loading import model_name
from engine.race import FAIRNESS, ORDERS, REPEAT_N, SIDES, RaceResult, RaceRunner, check_temperature

from .canvas_view import STOP_REASONS, block_html
from .hub import RUN_INPUT_NAMES, Hub, Job
from .meter import format_number, stat_cards_html
from .runs import pushed
from .session import SessionState
from .tab import (UNQUEUED, Tab, api_run, buttons, live_run, preset_dropdown, refusal_box, refusing, run_buttons,
                  seed_box, setting_control, setting_params, user_error, wire_run)
from .text import escape_html, plain_text, plural, prose
from .validation import MAX_PROMPT_CHARS, RunRequest, build_request, parse_run, preset_values

DEFAULT_RACE_PROMPT = "Tell me what happened after the flood."
LIVE_INTERVAL_S = 0.25
REPLAY_FPS = 12.0
SKIP3 = (gr.skip(),) * 3
TITLES = {"diffusion": "Block diffusion", "autoregressive": "Autoregressive"}
SUBTITLES = {"diffusion": "canvas by canvas", "autoregressive": "token by token"}
FIGURES = ("tokens/s", "tokens/forward", "forwards", "first token", "time", "tokens")
WAITING_TEXT = {1: "runs first", 2: "waits its turn: it runs after the other side"}
STATE_NOTES = {"idle": "press Race to start", "running": "running now", "replay": "replay"}
NOT_RUN_TEXT = "Stop came before its turn"
FAULT_TEXT = {"punctuation": prose("race-punctuation"), "repetition": prose("race-repetition")}  # `faults` in words


@dataclass
class RaceProgress:
    """A race's record and own snapshot: each side's frames and first-token time, the order run, result."""

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

    frames_seen = property(lambda self: self.count)

    def snapshot(self) -> "RaceProgress":
        return self


class RaceSession(SessionState):
    """A visitor's race: its run and the finished race's `progress` (for the replay)."""

    progress: RaceProgress | None = None


class RaceTab(Tab):
    """Handlers of the Race tab and `/race` around one `RaceRunner`, run through `hub` (default: its own)."""

    title = "Race"

    def __init__(self, runner: RaceRunner, hub: Hub | None = None):
        super().__init__(hub or Hub(runner.engine))
        self.runner = runner
        # on ZeroGPU the checks run on the hub's CPU view of the engine
        self.checker = runner if self.hub.engine is runner.engine else RaceRunner(self.hub.engine)
        self.hub.sources["race"] = self.race_items
        ar, diffusion = runner.ar, model_name(runner.engine.source)
        shared = f"{diffusion}'s causal encoder"
        self.models = {"diffusion": diffusion, "autoregressive": shared if ar.shared_weights else model_name(ar.source)}

    def build(self, page) -> None:
        build_race_tab(self)

    def endpoints(self, page) -> Sequence[tuple]:
        params = [("prompt", str, page.required), ("raw", bool, False), *setting_params(self.engine.recommended),
                  ("seed", int, -1), ("ar_temperature", float, 0.0), ("order", str, "alternate")]
        return [("race", self.race_api, params, tuple[str, str, dict], prose("api-race"))]

    def check(self, run: RunRequest, ar_temperature, order) -> tuple:
        """`run` checked as a race (both budgets, temperature, order): the "race" payload; gr.Error."""
        with refusing():
            self.checker.check(run.prompt, run.settings, raw=run.raw, ar_temperature=ar_temperature, order=order,
                               seed=run.seed)
            race = (run, check_temperature(ar_temperature), order)
            self.hub.check_job(self.job(race))
            return race

    def ui_request(self, prompt, raw, preset_name, max_new_tokens, seed, ar_temperature, order) -> tuple:
        with refusing():
            values = preset_values(preset_name, self.runner.engine.recommended, max_new_tokens=max_new_tokens)
            run = build_request(prompt, raw, values, seed, ui_limits=True)
        return self.check(run, ar_temperature, order)

    def job(self, race: tuple) -> Job:
        """The "race" job of (request, AR temperature, order), a forward per autoregressive token."""
        return Job("race", race, race[0].settings, extra_forwards=self.checker.engine.budget(race[0].settings))

    def race_items(self, engine, race: tuple, stop: threading.Event) -> Iterator:
        """The "race" source: each side's (side, frame) as it runs, then the `RaceResult`."""
        run, temperature, order = race
        return pushed(lambda emit: self.runner.run(
            run.prompt, run.settings, raw=run.raw, seed=run.seed, ar_temperature=temperature, order=order,
            on_frame=lambda side, frame: emit((side, frame)), stop_event=stop))

    def side_text(self, progress: RaceProgress, side: str, frame) -> str:
        """`frame`'s decoded answer, cached by side and length."""
        if frame is None:
            return ""
        ids = frame.committed_ids
        key = side, len(ids)
        if key not in progress.texts:
            progress.texts[key] = (self.runner.engine.tokenizer.decode(ids, skip_special_tokens=True)
                                   if side == "diffusion" else self.runner.ar.text(ids))
        return progress.texts[key]

    def panels(self, progress: RaceProgress, state: str | None = None, t: float | None = None) -> tuple[str, ...]:
        """Both sides' `panel_html` in `state` (None: as the race runs); `t`: replay time (None: newest frames)."""
        running = None if progress.finished or not progress.order else progress.order[-1]
        panels = []
        for side in SIDES:
            frames = progress.frames[side]
            frame = frame_at(frames, t) if t is not None else (frames[-1] if frames else None)
            shown = state or ("running" if side == running else "done" if frames else "waiting")
            if not frames and progress.finished:
                shown = "unrun"
            panels.append(panel_html(
                side, frame, text=self.side_text(progress, side, frame), model=self.models[side], state=shown, t=t,
                position=progress.order.index(side) + 1 if side in progress.order else None,
                first_token_s=progress.first_token_s.get(side)))
        return tuple(panels)

    def race_stream(self, session: RaceSession, request: gr.Request, *inputs) -> Iterator[tuple]:
        """Race (`inputs` as `ui_request`'s): (panels, result, Race, Stop) live, kept for `replay_stream`; gr.Error."""
        race = self.ui_request(*inputs)
        session.stop()
        session.progress = None
        session.stopped.clear()
        with live_run(self.hub, self.job(race), request, session, ":race", record=RaceProgress()) as worker:
            progress = worker.record
            yield (*self.panels(progress), result_html(None), *buttons(True))
            for snap in worker.updates(1.0 / LIVE_INTERVAL_S, reader_budget=None):
                if not snap.finished:
                    yield (*self.panels(progress), *SKIP3)
            if progress.error is not None:
                yield (*self.panels(progress), gr.skip(), *buttons(False))
                raise user_error(progress.error)
            session.progress = progress

    def replay_stream(self, session: RaceSession) -> Iterator[tuple]:
        """After the race: both sides replayed on the engine clock, then the result card, as `race_stream`'s."""
        progress = session.progress
        if progress is None or progress.result is None:
            yield (*SKIP3, *buttons(False))
            return
        result = progress.result
        if not result.cancelled:
            total = max(side.seconds for side in (result.diffusion, result.autoregressive))
            start = time.monotonic()
            while (t := time.monotonic() - start) < total and not session.stopped.is_set():
                yield (*self.panels(progress, "replay", t), *SKIP3)
                time.sleep(1.0 / REPLAY_FPS)
        yield (*self.panels(progress, "done", float("inf")), result_html(result), *buttons(False))

    async def race_api(self, *inputs, request: gr.Request = None) -> tuple[str, str, dict]:
        """`/race`: `/generate`'s inputs, AR temperature, order -> (diffusion text, AR text, summary); gr.Error."""
        *inputs, ar_temperature, order = inputs

        def job() -> Job:
            return self.job(self.check(parse_run(dict(zip(RUN_INPUT_NAMES, inputs)), ui_limits=False), ar_temperature,
                                       order))

        result = (await api_run(self.hub, job, request, record=RaceProgress())).result
        sides = (result.diffusion, result.autoregressive)
        return *(plain_text(side.text) if side is not None else "" for side in sides), result.summary()


def build_race_tab(race: RaceTab) -> None:
    """The Race tab's components and events in the current `gr.Tab`."""
    rec = race.runner.engine.recommended
    session = gr.State(RaceSession())
    with gr.Row(elem_id="dg-race-controls"):
        with gr.Column(scale=3, min_width=0):
            prompt = gr.Textbox(label="Prompt", lines=2, max_lines=6, value=DEFAULT_RACE_PROMPT,
                                info=f"at most {MAX_PROMPT_CHARS:,} characters", elem_id="dg-race-prompt")
            raw = gr.Checkbox(label="Raw prompt (no chat template)", elem_id="dg-race-raw")
        with gr.Column(scale=2, min_width=0):
            with gr.Row():
                preset_box = preset_dropdown("dg-race-preset", "Diffusion preset", min_width=120)
                max_new_tokens = setting_control("max_new_tokens", rec.max_new_tokens, label="Token budget",
                                                 info="both sides; whole canvases", elem_id="dg-race-budget")
            with gr.Row():
                temperature = gr.Number(value=0.0, label="AR temperature", info="0 = greedy, at most 10",
                                        elem_id="dg-race-temperature", min_width=140)
                seed = seed_box("dg-race-seed", min_width=110)
                order = gr.Dropdown(list(ORDERS), value="alternate", label="Who runs first", elem_id="dg-race-order",
                                    min_width=180, scale=2)
            with gr.Row():
                start, stop = run_buttons("Race", "dg-race-start", "dg-race-stop")
            refusal = refusal_box("race")
    with gr.Row(elem_id="dg-race-panels"):
        panels = [gr.HTML(html, elem_id=f"dg-race-{side}", min_width=0)
                  for side, html in zip(SIDES, race.panels(RaceProgress(), "idle"))]
    result = gr.HTML(result_html(None), elem_id="dg-race-result")

    outputs = [*panels, result, start, stop]
    ran = wire_run([start.click], race.ui_request, race.race_stream, state=session, box=refusal, stop=stop,
                   inputs=[prompt, raw, preset_box, max_new_tokens, seed, temperature, order], outputs=outputs)
    ran.success(race.replay_stream, inputs=[session], outputs=outputs, **UNQUEUED)  # outside the engine's slot


def frame_at(frames: Sequence, t: float):
    """The newest of `frames` whose `elapsed_s` is at most `t` (engine seconds), or None."""
    index = bisect_right(frames, t, key=lambda frame: frame.elapsed_s)
    return frames[index - 1] if index else None


def side_figures(frame, *, t: float | None = None, first_token_s: float | None = None) -> dict[str, str]:
    """A side's figures by `FIGURES` label for its newest `frame` at replay time `t` (None: the frame's)."""
    if frame is None:
        return dict.fromkeys(FIGURES, "\u2013")
    elapsed = frame.elapsed_s if t is None or frame.done else max(t, frame.elapsed_s)
    forwards, tokens = frame.forward_index + 1, frame.committed_tokens
    unknown = "\u2013" if frame.done else "\u2026"  # none came, or none yet
    shown_first = first_token_s is not None and first_token_s <= elapsed
    return {
        "tokens/s": format_number(tokens / elapsed if elapsed > 0 else 0.0, 1) if tokens else unknown,
        "tokens/forward": format_number(tokens / forwards, 2) if tokens else unknown,
        "forwards": f"{forwards:,}",
        "first token": format_number(first_token_s, 2, " s") if shown_first else unknown,
        "time": format_number(elapsed, 2, " s"),
        "tokens": f"{tokens:,}",
    }


def _tag(tag: str, css: str, text: str) -> str:
    return f'<{tag} class="{css}">{escape_html(text)}</{tag}>' if text else ""


def panel_html(side: str, frame, *, text: str, model: str, position: int | None, state: str,
               t: float | None = None, first_token_s: float | None = None) -> str:
    """One side's panel (answer, figures, diffusion's live canvas); `position`: 1 or 2; `state`: idle, waiting,
    running, replay, done or unrun (the race ended before this side ran); carries `data-side`, `data-state`,
    `data-tokens`."""
    moving, done = state in ("running", "replay"), frame is not None and frame.done
    if state == "waiting":
        note = WAITING_TEXT.get(position or 2, "")
    elif state == "unrun":
        note = f"not run: {NOT_RUN_TEXT}"
    elif state != "idle" and done and (t is None or t >= frame.elapsed_s):
        note = STOP_REASONS.get(frame.stop_reason, frame.stop_reason) or "done"
    else:
        note = STATE_NOTES.get(state, "")
    order = f" \u00b7 ran {'first' if position == 1 else 'second'}" if position and state in ("replay", "done") else ""
    canvas = ""
    if side == "diffusion" and frame is not None and not frame.block_done and moving:
        canvas = f'<div class="dg-race-canvas">{block_html(frame, live=True)}</div>'
    caret = '<span class="dg-race-caret"></span>' if moving and not done else ""
    empty = "Not run." if state == "unrun" else "The answer appears here."
    answer = escape_html(text) + caret or _tag("span", "dg-race-empty", empty)
    return (
        f'<div class="dg-race-panel" data-side="{side}" data-state="{escape_html(state)}" '
        f'data-tokens="{frame.committed_tokens if frame is not None else 0}"><div class="dg-race-head">'
        f'<h3>{TITLES[side]}</h3><span>{SUBTITLES[side]} \u00b7 {escape_html(model)}{order}</span></div>'
        f'<div class="dg-meter dg-race-meter">{stat_cards_html(side_figures(frame, t=t, first_token_s=first_token_s))}'
        f'<div class="dg-meter-note">{escape_html(note + " · " if note else "")}engine clock</div></div>'
        f'<div class="dg-race-answer">{answer}</div>{canvas}</div>'
    )


def _ms(seconds: float | None, digits: int = 2) -> str:
    return "\u2013" if seconds is None else format_number(seconds * 1000, digits, " ms")


COST_COLUMNS = (  # (heading, a side's cell); the last two only where the bandwidth bound was measured
    ("cost per forward", lambda side: _ms(side.seconds_per_forward)),
    ("tokens per forward", lambda side: format_number(side.tokens_per_forward, 2) if side.tokens else "\u2013"),
    ("cost per token", lambda side: _ms(side.seconds_per_token)),
    ("bandwidth bound per forward", lambda side: _ms(side.bandwidth_bound_s_per_forward, 3)),
    ("bound tokens/s", lambda side: format_number(side.bandwidth_bound_tokens_per_second, 0)),
)


def cost_table_html(result: RaceResult) -> str:
    """Both sides' cost and tokens per forward (and the bandwidth bound where measured)."""
    sides = [s for s in (result.diffusion, result.autoregressive) if s is not None]
    bound = any(s.bandwidth_bound_s_per_forward for s in sides)
    columns = COST_COLUMNS if bound else COST_COLUMNS[:3]
    rows = "".join(f"<tr><td>{TITLES[s.name]}</td>{''.join(f'<td>{escape_html(cell(s))}</td>' for _, cell in columns)}"
                   "</tr>" for s in sides)
    caption = prose("race-costs")
    if bound:
        caption += "; " + prose("race-costs-bound").format(bandwidth=format_number(result.memory_bandwidth_gb_s, 0))
    return (f'<table class="dg-race-costs"><caption>{escape_html(caption)}</caption><tr><th></th>'
            f'{"".join(f"<th>{name}</th>" for name, _ in columns)}</tr>{rows}</table>')


def speedup_text(result: RaceResult) -> str:
    """The headline speedup (none for a stopped race)."""
    speedup, side = result.speedup, result.stopped_side
    if result.cancelled:
        stopped = getattr(result, side) if side else None
        if stopped is None:
            return f"Stopped before the {side} side ran: no speedup."
        other = next(name for name in SIDES if name != side)
        unrun = f" {TITLES[other]} never ran: {NOT_RUN_TEXT}." if getattr(result, other) is None else ""
        return prose("race-cut-short").format(side=side, tokens=plural(stopped.tokens, "token")) + unrun
    if speedup is None:
        return "No speedup: a side made no tokens."
    slower = f": {1 / speedup:.1f}x slower" if speedup < 1 else ""
    return prose("race-speedup").format(speedup=speedup, slower=slower)


def caveat_text(result: RaceResult) -> str:
    """A warning when a side's answer is mostly punctuation or repetition, else ""."""
    sentences = []
    for side in (result.diffusion, result.autoregressive):
        if side is not None and side.faults:
            shares = {"punctuation": side.punctuation_share, "repetition": side.repeated_share}
            clauses = " and ".join(FAULT_TEXT[fault].format(share=shares[fault], run=REPEAT_N) for fault in side.faults)
            sentences.append(f"The {side.name} answer {clauses}.")
    return " ".join([*sentences, prose("race-caveat")]) if sentences else ""


def explanation(result: RaceResult) -> str:
    """Why the race came out so (`result.verdict()`, both sides' costs); "" without two answers."""
    d, a = result.diffusion, result.autoregressive
    if d is None or a is None or d.tokens == 0 or a.tokens == 0:
        return ""
    verdict = result.verdict()
    ratio = verdict["cost_ratio"]
    costs = prose("race-costs-why").format(ratio="far more than" if ratio is None else f"{ratio:.1f}x",
                                           tokens=d.tokens_per_forward)
    if verdict["winner"] is None:  # one side cut short
        side = verdict["stopped_side"]
        why = prose("race-no-winner").format(side=side, tokens=plural(getattr(result, side).tokens, "token"),
                                            costs=costs)
    else:
        winner = "Diffusion wins" if verdict["winner"] == "diffusion" else "Autoregressive decoding wins"
        why = f"{winner}{' on speed alone' if any(verdict['faults'].values()) else ''}: {costs}"
    per_token = " ".join(prose("race-side-cost").format(
        name=name, forward=forward, ms=side.seconds_per_forward * 1000, tokens=side.tokens_per_forward,
        token_ms=side.seconds_per_token * 1000) for name, forward, side in (
        ("Diffusion", "canvas forward", d), ("Autoregressive", "forward", a)))
    device_note = prose("race-memory-bound")
    if verdict["bound"] != "memory":
        device_note = prose("race-compute-bound").format(device=result.device.split(":")[0].upper(),
                                                          canvas=result.canvas_length)
    elif d.bandwidth_bound_s_per_forward and a.bandwidth_bound_s_per_forward:
        device_note += " " + prose("race-bandwidth-bound").format(
            canvas=d.bandwidth_bound_s_per_forward * 1000, autoregressive=a.bandwidth_bound_s_per_forward * 1000)
    return f"{why} {per_token} {device_note}"


def lengths_text(result: RaceResult) -> str:
    """A warning when a side wrote at least twice the other's tokens, else ""."""
    d, a = result.diffusion, result.autoregressive
    if d is None or a is None or min(d.tokens, a.tokens) == 0 or max(d.tokens, a.tokens) < 2 * min(d.tokens, a.tokens):
        return ""
    return prose("race-lengths").format(
        diffusion_tokens=plural(d.tokens, "token"), diffusion_stop=STOP_REASONS.get(d.stop_reason, d.stop_reason),
        autoregressive_tokens=plural(a.tokens, "token"),
        autoregressive_stop=STOP_REASONS.get(a.stop_reason, a.stop_reason))


def result_html(result: RaceResult | None) -> str:
    """The result card (None: the rules only); carries `data-speedup` and `data-faults` (faulted sides)."""
    if result is None:
        return f'<div class="dg-race-result" data-state="idle">{_tag("p", "dg-race-rules", prose("race-rules"))}</div>'
    speedup = "" if result.speedup is None else f"{result.speedup:.6g}"
    faulted = " ".join(name for name, faults in result.verdict()["faults"].items() if faults)
    rules = f"{FAIRNESS} Length: {result.length_rule}. Seed {result.seed}."
    caveat = _tag("span", "dg-race-caveat", caveat_text(result))
    return (f'<div class="dg-race-result" data-state="done" data-speedup="{speedup}" data-faults="{faulted}">'
            f'<p class="dg-race-speedup">{escape_html(speedup_text(result))}{caveat}</p>'
            f'{_tag("p", "dg-race-lengths", lengths_text(result))}'
            f'{cost_table_html(result)}<p class="dg-race-explain">{escape_html(explanation(result))}</p>'
            f'{_tag("p", "dg-race-rules", rules)}</div>')

"""The Infill tab and `/infill`: a template's blanks denoised inside one canvas (the "infill" job) while its fixed
text stays put; the canvas marks the fixed positions and the plots show the blanks only."""

import dataclasses
import itertools
import re
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import gradio as gr

from engine import DiffusionSettings, Frame
from engine.infill import InfillLayout, filled_text, infill_frames, layout_template
from engine.settings import parse_seed

from . import plots
from .canvas_view import block_html, legend_html
from .hub import Job, api_summary
from .live_view import refused_meter, status_text
from .meter import meter_html, run_meter_html
from .session import SessionState
from .tab import (PlotClock, setting_params, Tab, api_run, buttons, live_plots, live_run, preset_dropdown, refusal_box,
                  refusing, run_buttons, seed_box, setting_control, user_error, wire_run)
from .text import escape_html, plain_text, prose
from .validation import DENOISING_SETTINGS, MAX_PROMPT_CHARS, build_settings, check_prompt, preset_values

EMBEDDED_TEMPLATE = "In the beginning God created the [___ 2] and the [___ 3]. And the earth was without [___ 2]."
INSTRUCTION_TEMPLATE = "The capital of France is [___ 2], and the capital of Italy is [___ 2]."
EMPTY_INFILL_HTML = f'<div class="dg-canvas dg-empty" data-forward="-1"><p>{prose("infill-empty")}</p></div>'
FIXED_LEGEND_HTML = f'<div class="dg-legend dg-infill-legend" aria-hidden="true">{prose("infill-legend")}</div>'
_PER_POSITION = ("input_ids", "draft_ids", "accepted", "confidence", "entropy", "first_accepted_step",
                 "input_tokens", "draft_tokens", "input_kinds", "draft_kinds")
_POSITION = re.compile(r"position (\d+)")


class InfillJob(NamedTuple):
    """An "infill" job's payload: the template, its settings, the raw context before the canvas (None: none),
    the seed (None: draw one)."""

    template: str
    settings: DiffusionSettings
    context: str | None
    seed: int | None


def infill_source(engine, payload: InfillJob, stop) -> Iterator:
    """The "infill" source: the frames of `payload`."""
    return infill_frames(engine, payload.template, payload.settings, prompt=payload.context, seed=payload.seed,
                         stop_event=stop)[1]


class InfillTab(Tab):
    """Handlers of the Infill tab and `/infill`."""

    title = "Infill"

    def build(self, page) -> None:
        build_infill_tab(self, EMBEDDED_TEMPLATE if page.embedded else INSTRUCTION_TEMPLATE)

    def endpoints(self, page) -> Sequence[tuple]:
        params = [("template", str, page.required), ("context", str, ""),
                  *setting_params(self.engine.recommended, DENOISING_SETTINGS), ("seed", int, -1)]
        return [("infill", self.infill_api, params, tuple[str, dict], prose("api-infill"))]

    sources = {"infill": infill_source}

    def layout(self, template) -> InfillLayout:
        """The template's layout (ValueError: bad syntax, or too long for one canvas)."""
        pad = self.engine.model.generation_config.pad_token_id or 0
        return layout_template(self.engine.tokenizer, template, self.engine.canvas_length, pad)

    def job(self, template, context, values: dict, seed, *, ui_limits: bool) -> tuple[InfillLayout, Job]:
        """The template's layout and "infill" job, after an optional raw `context`, one canvas (ValueError)."""
        if not isinstance(context, str):
            raise ValueError("context must be text (\"\" for none)")
        layout = self.layout(template)
        settings = build_settings({**values, "max_new_tokens": self.engine.canvas_length}, ui_limits=ui_limits)
        self.engine.check_settings(settings)
        payload = InfillJob(template, settings, check_prompt(context) if context.strip() else None, parse_seed(seed))
        return layout, Job("infill", payload, settings)

    def request(self, template, context, preset_name, max_denoising_steps, seed) -> tuple[InfillLayout, Job]:
        """`job` of the tab's inputs, UI limits, checked (gr.Error)."""
        with refusing():
            values = preset_values(preset_name, self.engine.recommended, max_denoising_steps=max_denoising_steps)
            layout, job = self.job(template, context, values, seed, ui_limits=True)
            self.hub.check_job(job)
            return layout, job

    def fill_stream(self, state: SessionState, request: gr.Request, *inputs) -> Iterator[tuple]:
        """Fill (`inputs` as `request`'s): (canvas, meter, filled template and text, plots, Fill, Stop); gr.Error."""
        layout, job = self.request(*inputs)
        state.stop()
        clock, skip, tokenizer = PlotClock(wait_first=True), gr.skip(), self.engine.tokenizer
        with live_run(self.hub, job, request, state, ":infill") as worker:
            for index, snap in enumerate(self.hub.runs.updates(worker)):
                state.snapshot, latest, final = snap, snap.latest, snap.finished
                status = status_text(latest, snap.error) if final else ("" if latest else "Encoding\u2026")
                committed = latest if latest is not None and latest.block_done else None
                ids = None if latest is None else (latest.committed_ids if committed else latest.draft_ids)
                filled = "done" if committed else "unfilled" if final else "live"
                text = (plain_text(filled_text(tokenizer, layout, ids)[0]) if committed else "") if final else skip
                due = clock.due() or final
                yield (infill_canvas_html(latest, layout, status),
                       run_meter_html(latest, committed=committed, final=final),
                       filled_html(tokenizer, layout, ids, state=filled), text,
                       *(blank_plots(snap.block_frames(0), layout.blanks, final=final) if due else (skip,) * 3),
                       *(buttons(not final) if index == 0 or final else (skip, skip)))
                if final and snap.error is not None:
                    raise user_error(snap.error)

    async def infill_api(self, template, context, *values, request: gr.Request = None) -> tuple[str, dict]:
        """`/infill`: `template` filled after a raw `context`, settings and seed as `/generate`'s (one canvas) -> (text,
        summary plus `fills` and blank, fixed and template positions); gr.Error."""
        *given, seed = values
        layout = None

        def job() -> Job:
            nonlocal layout
            layout, made = self.job(template, context, dict(zip(DENOISING_SETTINGS, given)), seed, ui_limits=False)
            return made

        snap = await api_run(self.hub, job, request, keep_history=False)
        if snap.latest is None or snap.latest.stop_reason == "cancelled":
            raise user_error("the fill was stopped before it was complete")
        _, summary = api_summary(self.engine.summarize(snap.latest, snap.frames_seen))
        text, fills = filled_text(self.engine.tokenizer, layout, snap.latest.committed_ids)
        summary.update(fills=[plain_text(f) for f in fills], blank_positions=layout.blanks,
                       fixed_positions=[i for i, f in enumerate(layout.fixed[:layout.template_positions]) if f],
                       template_positions=layout.template_positions)
        return plain_text(text), summary


def build_infill_tab(infill: InfillTab, default_template: str) -> None:
    """The Infill tab's components and events in the current `gr.Tab`."""
    engine = infill.engine
    state = gr.State(SessionState())
    gr.Markdown(prose("infill-syntax").format(canvas=engine.canvas_length), elem_id="dg-infill-syntax")
    with gr.Row(elem_id="dg-infill-main"):
        with gr.Column(min_width=0, elem_id="dg-infill-left"):
            template = gr.Textbox(label="Template", value=default_template, lines=4, max_lines=10,
                                  elem_id="dg-infill-template",
                                  info=prose("infill-template-info").format(limit=MAX_PROMPT_CHARS))
            context = gr.Textbox(label="Context (optional)", max_lines=4,
                                 placeholder="raw text the encoder reads before the canvas",
                                 elem_id="dg-infill-context")
            with gr.Row(elem_id="dg-infill-settings"):
                preset_box = preset_dropdown("dg-infill-preset")
                steps = setting_control("max_denoising_steps", engine.recommended.max_denoising_steps, info=None,
                                        label="Denoising steps (at most)", elem_id="dg-infill-steps", min_width=180)
                seed = seed_box("dg-infill-seed", min_width=120)
            with gr.Row(elem_id="dg-infill-buttons"):
                fill, stop = run_buttons("Fill", "dg-infill-run", "dg-infill-stop")
            refusal = refusal_box("infill")
            filled = gr.HTML("", elem_id="dg-infill-filled")
            text = gr.Textbox(label="Filled text", lines=2, max_lines=8, interactive=False, buttons=["copy"],
                              elem_id="dg-infill-text")
        with gr.Column(min_width=0, elem_id="dg-infill-output"):
            meter = gr.HTML(meter_html(None, note=prose("infill-idle-meter")), elem_id="dg-infill-meter")
            canvas = gr.HTML(EMPTY_INFILL_HTML, elem_id="dg-infill-canvas", elem_classes=["dg-canvas-card"])
            with gr.Accordion("Plots of the blank positions", elem_id="dg-infill-plots"):
                heatmap, order, entropy = live_plots("dg-infill-")

    wire_run([fill.click, template.submit], infill.request, infill.fill_stream, state=state, box=refusal,
             stop=stop, inputs=[template, context, preset_box, steps, seed],
             outputs=[canvas, meter, filled, text, heatmap, order, entropy, fill, stop],
             refused=refused_meter, refused_inputs=[state], refused_outputs=[meter])


def infill_canvas_html(frame: Frame | None, layout: InfillLayout | None, status: str = "") -> str:
    """The canvas of `frame`, its fixed positions marked, and a status line; carries `data-forward`, `data-fixed`."""
    status_html = f'<p class="dg-status">{escape_html(status)}</p>' if status else ""
    if frame is None or layout is None:
        return f'<div class="dg-canvas" data-forward="-1">{status_html}</div>' if status else EMPTY_INFILL_HTML
    block = block_html(frame, live=not frame.block_done, fixed=layout.fixed)
    return (f'<div class="dg-canvas dg-infill-canvas" data-forward="{frame.forward_index}" '
            f'data-fixed="{sum(layout.fixed)}">{legend_html()}{FIXED_LEGEND_HTML}{block}{status_html}</div>')


FILLED_LABELS = {"live": "Current draft of the blanks", "done": "Filled template",
                 "unfilled": "Not filled: the run ended before the canvas was committed; its last draft"}


def filled_html(tokenizer, layout: InfillLayout | None, canvas_ids: Sequence[int] | None, *,
                state: str) -> str:
    """The template, each run of blanks `<mark>`ed with `canvas_ids`: a run's draft (`state` "live"), its committed
    ids ("done"), or the last draft of a run stopped before its commit ("unfilled"); "" before a frame."""
    if layout is None or canvas_ids is None:
        return ""
    ids, parts = list(canvas_ids[:layout.template_positions]), []
    for fixed, run in itertools.groupby(range(layout.template_positions), key=layout.fixed.__getitem__):
        span = list(run)
        text = escape_html(plain_text(tokenizer.decode(ids[span[0]:span[-1] + 1], skip_special_tokens=True)))
        parts.append(text if fixed else f'<mark class="dg-fill" title="positions {span[0]}\u2013{span[-1]}">'
                     f'{text or "&#8709;"}</mark>')
    return (f'<div class="dg-filled" data-state="{state}"><div class="dg-filled-label">{FILLED_LABELS[state]}'
            f'</div><div class="dg-filled-text">{"".join(parts)}</div></div>')


def blank_frames(frames: Sequence[Frame], blanks: Sequence[int]) -> list[Frame]:
    """`frames` with every per-position field cut to the `blanks` positions (`canvas_length` = blanks)."""
    index = list(blanks)
    cut = []
    for frame in frames:
        fields = {name: [getattr(frame, name)[i] for i in index] for name in _PER_POSITION
                  if len(getattr(frame, name)) == frame.canvas_length}
        cut.append(dataclasses.replace(frame, canvas_length=len(index), **fields))
    return cut


def _at_blanks(figure: plots.FigureSpec, blanks: Sequence[int]) -> plots.FigureSpec:
    """A figure's position axis and hover texts back on the blanks' canvas positions."""
    def fix(text):
        return _POSITION.sub(lambda m: f"position {blanks[int(m.group(1))]}", text) if isinstance(text, str) else text

    for trace in figure.get("data", []):
        if "x" in trace and trace.get("type") in ("heatmap", "bar", "scatter") and trace.get("yaxis") != "y2":
            trace["x"] = [blanks[int(x)] for x in trace["x"]]
        if "hovertext" in trace:
            trace["hovertext"] = [[fix(t) for t in row] if isinstance(row, list) else fix(row)
                                  for row in trace["hovertext"]]
    axis = figure["layout"].get("xaxis", {})
    if axis.get("visible", True):
        axis.update(type="category", title={"text": "canvas position (blanks only)"})
    return figure


def blank_plots(frames: Sequence[Frame], blanks: Sequence[int], *, final: bool) -> tuple:
    """The three plots of the blank positions (`final`: with hover text and the step slider)."""
    heatmap, order, entropy = plots.block_plots(blank_frames(frames, blanks), animate=final, hover=final)
    return _at_blanks(heatmap, blanks), _at_blanks(order, blanks), entropy  # the entropy plot's x axis is steps

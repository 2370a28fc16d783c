"""The Infill tab's handlers and the `/infill` API: a template's blanks denoised inside one canvas while its fixed
text stays put (`engine.infill`).

A fill is the "infill" job of the run mechanism (`Playground.start_job`, in the GPU process on ZeroGPU), registered
under `<session>:infill`, so a closed tab stops it; Stop ends it within one decoder forward.
"""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from engine.infill import filled_text, infill_frames, layout_template

from .handlers import API_SUMMARY_KEYS, Job, previous_run_meter, status_text
from .infill_view import blank_plots, filled_html, infill_canvas_html
from .meter import run_meter_html
from .runs import RunWorker, session_key
from .tab import PlotClock, user_error
from .text import plain_text
from .validation import build_settings, check_prompt, check_ui_seed, preset_values

IDLE_METER_NOTE = ("engine clock \u00b7 press Fill to start \u00b7 tokens, tokens/s and tokens/forward count the "
                   "blanks the model filled, not the fixed text")


def infill_source(engine, payload: tuple, stop) -> Iterator:
    """The "infill" source: the frames of (template, settings, context or None, seed) filled by `engine`."""
    template, settings, context, seed = payload
    return infill_frames(engine, template, settings, prompt=context, seed=seed, stop_event=stop)[1]


class InfillState:
    """One visitor's infill run (a `gr.State` value); a copy is always fresh (nothing crosses sessions)."""

    def __init__(self):
        self.worker: RunWorker | None = None

    def __deepcopy__(self, memo) -> "InfillState":
        return InfillState()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()


class InfillTab:
    """Handlers of the Infill tab and the `/infill` API, bound to a `handlers.Playground` (engine, limits,
    registry)."""

    def __init__(self, playground):
        self.playground = playground
        self.engine = playground.engine
        playground.sources["infill"] = infill_source

    # -- validation ------------------------------------------------------------------------------------------------
    def layout(self, template):
        """The template's `InfillLayout` (raises ValueError: bad syntax, or a template that does not fit one
        canvas, with both counts)."""
        pad = self.engine.model.generation_config.pad_token_id
        return layout_template(self.engine.tokenizer, template, self.engine.canvas_length, pad if pad is not None
                               else 0)

    def request(self, template, context, preset_name, max_denoising_steps, seed):
        """(layout, context or None, settings, seed) from the tab's inputs, within the UI's limits (ValueError)."""
        layout = self.layout(template)
        context = check_prompt(context) if isinstance(context, str) and context.strip() else None
        values = dict(preset_values(preset_name, self.engine.recommended), max_new_tokens=self.engine.canvas_length,
                      max_denoising_steps=max_denoising_steps)
        settings = build_settings(values, ui_limits=True)
        self.engine.check_settings(settings)
        self.playground.check_job(Job("infill", None, settings))
        return layout, context, settings, check_ui_seed(seed)

    def check_inputs(self, template, context, preset_name, max_denoising_steps, seed) -> None:
        """Fill's first step: every check, nothing run (raises gr.Error with the message, e.g. that the template
        does not fit the canvas)."""
        try:
            self.request(template, context, preset_name, max_denoising_steps, seed)
        except Exception as error:  # noqa: BLE001 - bad input, or a failing tokenizer: a clear message either way
            raise user_error(error) from None

    # -- events ----------------------------------------------------------------------------------------------------
    def fill_stream(self, state: InfillState, template, context, preset_name, max_denoising_steps, seed,
                    request: gr.Request = None) -> Iterator[tuple]:
        """Fill: denoise the template's blanks, the canvas marking fixed positions. Yields (canvas, meter, filled
        template, filled text, heatmap, order, entropy, Fill button, Stop button); the plots cover the blank
        positions only.

        Raises:
            gr.Error: a bad template or input (before anything runs) or a failed run.
        """
        try:
            layout, context, settings, seed = self.request(template, context, preset_name, max_denoising_steps, seed)
        except Exception as error:  # noqa: BLE001
            raise user_error(error) from None
        playground = self.playground
        if state is None:
            state = InfillState()
        state.stop()
        key = session_key(request, state, ":infill")
        job = Job("infill", (template, settings, context, seed), settings)
        worker = state.worker = playground.start_job(job, key)
        clock = PlotClock(wait_first=True)
        skip = gr.skip()
        try:
            for index, snap in enumerate(playground.runs.updates(worker)):
                latest, final = snap.latest, snap.finished
                status = status_text(latest, snap.error) if final else ("" if latest else "Encoding\u2026")
                canvas = infill_canvas_html(latest, layout, status)
                meter = run_meter_html(latest, committed=latest if latest is not None and latest.block_done else None,
                                       final=final)
                ids = None if latest is None else (latest.committed_ids if latest.block_done else latest.draft_ids)
                filled = filled_html(self.engine.tokenizer, layout, ids, live=not final)
                text = skip
                if final:
                    text = plain_text(filled_text(self.engine.tokenizer, layout, ids)[0]) if ids else ""
                heatmap = order = entropy = skip
                if clock.due() or final:
                    heatmap, order, entropy = blank_plots(snap.block_frames(0), layout.blanks, final=final)
                buttons = (skip, skip)
                if index == 0 or final:
                    buttons = (gr.update(interactive=final), gr.update(interactive=not final))
                yield canvas, meter, filled, text, heatmap, order, entropy, *buttons
                if final and snap.error is not None:
                    raise user_error(snap.error)
        finally:
            playground.runs.finish(key, worker)  # on normal end, and when Gradio closes this generator (tab closed)

    @staticmethod
    def refused(state: InfillState):
        """After Fill's checks refused a request: the previous fill's meter, marked as the previous run's
        (`meter.refused_meter_html`); `gr.skip()` when there was none or it is still running."""
        worker = getattr(state, "worker", None)
        return previous_run_meter(None if worker is None else worker.snapshot(), worker is not None and worker.running)

    @staticmethod
    def stop(state: InfillState) -> None:
        """Stop: the fill ends within one decoder forward; its stream shows the final view."""
        if state is not None:
            state.stop()

    # -- API -------------------------------------------------------------------------------------------------------
    async def infill_api(self, template, context, max_denoising_steps, entropy_bound, t_min, t_max,
                         stability_threshold, confidence_threshold, adaptive_stopping, seed,
                         request: gr.Request = None) -> tuple[str, dict]:
        """`/infill`: fill `template`'s blanks (`[___]` one token, `[___ 12]` twelve) after an optional raw
        `context`; settings and seed as `/generate`'s (the API's limits; the token budget is one canvas).

        Returns (filled text, summary): `/generate`'s summary keys plus `fills` (the text of each run of blanks),
        `blank_positions`, `fixed_positions` (canvas positions) and `template_positions`.

        Raises:
            gr.Error: a bad template or input, a template that does not fit one canvas, or a failed run.
        """
        layout = None

        def start() -> RunWorker:
            nonlocal layout
            try:
                if not isinstance(context, str):
                    raise ValueError("context must be text (\"\" for none)")
                values = dict(max_new_tokens=self.engine.canvas_length, max_denoising_steps=max_denoising_steps,
                              entropy_bound=entropy_bound, t_min=t_min, t_max=t_max,
                              stability_threshold=stability_threshold, confidence_threshold=confidence_threshold,
                              adaptive_stopping=adaptive_stopping)
                settings = build_settings(values, ui_limits=False)
                payload = (template, settings, check_prompt(context) if context.strip() else None,
                           check_ui_seed(seed))
                layout = self.layout(template)
                job = Job("infill", payload, settings)
                self.playground.check_job(job)
            except Exception as error:  # noqa: BLE001
                raise user_error(error) from None
            return self.playground.start_job(job, keep_history=False)

        snap = await self.playground.served(start, request)
        if snap.error is not None:
            raise user_error(snap.error)
        if snap.latest is None or snap.latest.stop_reason == "cancelled":
            raise user_error("the fill was stopped before it was complete")
        result = self.engine.summarize(snap.latest, snap.frames_seen).to_dict()
        text, fills = filled_text(self.engine.tokenizer, layout, snap.latest.committed_ids)
        summary = {key: result[key] for key in API_SUMMARY_KEYS}
        summary.update(fills=[plain_text(f) for f in fills], blank_positions=layout.blanks,
                       fixed_positions=[i for i, f in enumerate(layout.fixed[:layout.template_positions]) if f],
                       template_positions=layout.template_positions)
        return plain_text(text), summary

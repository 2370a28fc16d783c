"""Wiring only: the Infill tab's layout, its events and the `/infill` API. Logic lives in
`infill_handlers.InfillTab`."""

import gradio as gr

from engine import PRESET_NAMES

from . import plots
from .infill_handlers import IDLE_METER_NOTE, InfillState, InfillTab
from .infill_view import EMPTY_INFILL_HTML
from .meter import meter_html
from .tab import checked, refusal_box, setting_control
from .validation import MAX_PROMPT_CHARS

SYNTAX = ("Write a text with **blanks**: `[___]` is one token, `[___ 12]` twelve (1 to the canvas length). Everything "
          "else is fixed text: it is placed in the canvas from the first step and never renoised (marked on the "
          "canvas), while the decoder denoises only the blanks. The whole template must fit one canvas "
          "({canvas} tokens); special-token text you type stays plain text.")
EMBEDDED_TEMPLATE = "In the beginning God created the [___ 2] and the [___ 3]. And the earth was without [___ 2]."
INSTRUCTION_TEMPLATE = "The capital of France is [___ 2], and the capital of Italy is [___ 2]."


def build_infill_tab(infill: InfillTab, default_template: str) -> None:
    """The Infill tab's components and events, inside the caller's `gr.Tab` (and `gr.Blocks`) context."""
    engine = infill.engine
    rec = engine.recommended
    state = gr.State(InfillState())
    gr.Markdown(SYNTAX.format(canvas=engine.canvas_length), elem_id="dg-infill-syntax")
    with gr.Row(equal_height=False, elem_id="dg-infill-main"):
        with gr.Column(min_width=0, elem_id="dg-infill-left"):
            template = gr.Textbox(label="Template", value=default_template, lines=4, max_lines=10,
                                  elem_id="dg-infill-template",
                                  info="blanks as described above \u00b7 Shift+Enter fills \u00b7 at most "
                                       f"{MAX_PROMPT_CHARS:,} characters")
            context = gr.Textbox(label="Context (optional)", lines=1, max_lines=4,
                                 placeholder="raw text the encoder reads before the canvas",
                                 elem_id="dg-infill-context")
            with gr.Row(elem_id="dg-infill-settings"):
                preset_box = gr.Dropdown(list(PRESET_NAMES), value="recommended", label="Preset",
                                         elem_id="dg-infill-preset", min_width=140)
                steps = setting_control("max_denoising_steps", rec.max_denoising_steps, info=None,
                                        label="Denoising steps (at most)", elem_id="dg-infill-steps", min_width=180)
                seed = gr.Textbox(value="0", label="Seed", info="-1 = random", max_lines=1, max_length=24,
                                  elem_id="dg-infill-seed", min_width=120)
            with gr.Row(elem_id="dg-infill-buttons"):
                fill = gr.Button("Fill", variant="primary", elem_id="dg-infill-run", scale=3)
                stop = gr.Button("Stop", variant="stop", interactive=False, elem_id="dg-infill-stop", scale=1)
            refusal = refusal_box("infill")
            filled = gr.HTML("", elem_id="dg-infill-filled")
            text = gr.Textbox(label="Filled text", lines=2, max_lines=8, interactive=False, buttons=["copy"],
                              elem_id="dg-infill-text")
        with gr.Column(min_width=0, elem_id="dg-infill-output"):
            meter = gr.HTML(meter_html(None, note=IDLE_METER_NOTE), elem_id="dg-infill-meter")
            canvas = gr.HTML(EMPTY_INFILL_HTML, elem_id="dg-infill-canvas", elem_classes=["dg-canvas-card"])
            with gr.Accordion("Plots of the blank positions", open=True, elem_id="dg-infill-plots"):
                heatmap = gr.Plot(plots.confidence_heatmap([]), show_label=False, elem_id="dg-infill-heatmap")
                with gr.Row():
                    order = gr.Plot(plots.unmasking_order(None), show_label=False, elem_id="dg-infill-order",
                                    min_width=260)
                    entropy = gr.Plot(plots.entropy_and_acceptance([]), show_label=False,
                                      elem_id="dg-infill-entropy", min_width=260)

    inputs = [template, context, preset_box, steps, seed]
    private = dict(api_visibility="private", show_progress="hidden", trigger_mode="once")
    accepted = checked([fill.click, template.submit], infill.check_inputs, inputs=inputs, box=refusal,
                       refused=infill.refused, refused_inputs=[state], refused_outputs=[meter], trigger_mode="once")
    accepted.success(
        infill.fill_stream, inputs=[state, *inputs],
        outputs=[canvas, meter, filled, text, heatmap, order, entropy, fill, stop], concurrency_id="engine",
        **private)
    stop.click(infill.stop, inputs=[state], outputs=None, concurrency_limit=None, api_visibility="private",
               show_progress="hidden")

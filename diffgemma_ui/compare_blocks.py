"""Layout and wiring of the Compare tab (handlers: `compare_handlers.CompareHandlers`)."""

from __future__ import annotations

import gradio as gr

from engine import PRESET_NAMES, preset

from . import plots
from .compare_handlers import ENGINE_SAMPLER, CompareHandlers, CompareState, sampler_choices
from .compare_view import SIDES, side_html, verdict_html
from .tab import checked, refusal_box, setting_control

INTRO = (
    "One prompt, one seed, two settings: **A** runs to the end, then **B** (never both at once, so neither slows the "
    "other). Compare the decoder forwards each needed, tokens per forward, tokens/s, the texts and the confidence "
    "heatmaps of their first canvas."
)
DEFAULT_SIDES = {"A": "recommended", "B": "fast"}


def build_compare_tab(compare: CompareHandlers, default_prompt: str) -> None:
    """Create the Compare tab's components in the current Blocks context (inside a `gr.Tab`) and wire them."""
    rec = compare.engine.recommended
    gr.Markdown(INTRO)
    with gr.Row(equal_height=False):
        prompt = gr.Textbox(label="Prompt", value=default_prompt, lines=2, max_lines=6, scale=3,
                            elem_id="dg-compare-prompt")
        with gr.Column(scale=2, min_width=240):
            raw = gr.Checkbox(label="Raw prompt (no chat template)", value=False, elem_id="dg-compare-raw")
            with gr.Row():
                seed = gr.Number(value=0, precision=0, label="Seed", info="-1 = random, one for both",
                                 elem_id="dg-compare-seed", min_width=100)
                max_new_tokens = setting_control("max_new_tokens", rec.max_new_tokens, info=None,
                                                 elem_id="dg-compare-max-new", min_width=160)
    sides = {}
    with gr.Row(equal_height=False):
        for side in SIDES:
            settings = preset(DEFAULT_SIDES[side], rec)
            with gr.Column(min_width=260, elem_id=f"dg-compare-settings-{side}"):
                name = gr.Dropdown(list(PRESET_NAMES), value=DEFAULT_SIDES[side], label=f"Settings {side}: preset",
                                   elem_id=f"dg-compare-preset-{side}")
                entropy_bound = setting_control("entropy_bound", settings.entropy_bound,
                                                label=f"{side}: entropy bound", info="nats")
                steps = setting_control("max_denoising_steps", settings.max_denoising_steps,
                                        label=f"{side}: max denoising steps", info=None)
                adaptive = setting_control("adaptive_stopping", settings.adaptive_stopping,
                                           label=f"{side}: adaptive stopping")
                if side == "B":
                    sampler = gr.Dropdown(sampler_choices(), value=ENGINE_SAMPLER, label="B: sampler",
                                          info="diffusers' schedulers run its DiffusionGemmaPipeline (chat prompts)",
                                          elem_id="dg-compare-sampler")
            sides[side] = (name, entropy_bound, steps, adaptive)
    with gr.Row():
        run = gr.Button("Compare A and B", variant="primary", elem_id="dg-compare-run", scale=3)
        stop = gr.Button("Stop", variant="stop", interactive=False, elem_id="dg-compare-stop", scale=1)
    refusal = refusal_box("compare")
    state = gr.State(CompareState())
    verdict = gr.HTML(verdict_html(None, None), elem_id="dg-compare-verdict")
    outputs = {}
    with gr.Row(equal_height=False):
        for side in SIDES:
            with gr.Column(min_width=300, elem_id=f"dg-compare-{side}"):
                card = gr.HTML(side_html(side, None, None, "waiting"), elem_id=f"dg-compare-card-{side}")
                text = gr.Textbox(label=f"Text {side}", lines=3, max_lines=10, interactive=False,
                                  elem_id=f"dg-compare-text-{side}")
                heatmap = gr.Plot(plots.confidence_heatmap([]), show_label=False, elem_id=f"dg-compare-heatmap-{side}")
            outputs[side] = (card, text, heatmap)

    private = dict(api_visibility="private", show_progress="hidden", concurrency_limit=None)
    for side in SIDES:
        name, entropy_bound, steps, adaptive = sides[side]

        def apply(choice):
            settings = preset(choice, rec)
            return settings.entropy_bound, settings.max_denoising_steps, settings.adaptive_stopping

        name.change(apply, inputs=[name], outputs=[entropy_bound, steps, adaptive], **private)
    inputs = [prompt, raw, seed, max_new_tokens, *sides["A"][1:], *sides["B"][1:], sampler, state]
    # As Generate's chain: the inputs are checked in a step of their own (a refused request shows its message
    # without error badges on the previous comparison's cards, which `refused` marks as the previous run's)
    requested = checked([run.click], compare.request, inputs=inputs, box=refusal, refused=compare.refused,
                        refused_inputs=[state], refused_outputs=[verdict], trigger_mode="once")
    # As on the other tabs, Stop is on only while a comparison waits or runs, and "Compare A and B" only while none does
    requested.success(lambda: (gr.update(interactive=False), gr.update(interactive=True)), inputs=None,
                      outputs=[run, stop], **private)
    compared = requested.success(
        compare.compare, inputs=inputs,
        outputs=[outputs["A"][0], outputs["B"][0], verdict, outputs["A"][1], outputs["B"][1], outputs["A"][2],
                 outputs["B"][2]],
        api_visibility="private", concurrency_id="engine", show_progress="minimal", trigger_mode="once",
    )
    compared.then(lambda: (gr.update(interactive=True), gr.update(interactive=False)), inputs=None,
                  outputs=[run, stop], **private)
    stop.click(compare.stop, inputs=[state], outputs=None, concurrency_limit=None, api_visibility="private",
               show_progress="hidden")

"""Wiring only: the Race tab's layout, its events and the `/race` API. Logic lives in `race_handlers.RaceTab`."""

import gradio as gr

from engine import PRESET_NAMES
from engine.race import ORDERS, SIDES

from .race_handlers import RaceSession, RaceTab
from .race_view import panel_html, result_html
from .tab import checked, refusal_box, setting_control
from .validation import MAX_PROMPT_CHARS

DEFAULT_RACE_PROMPT = "Tell me what happened after the flood."


def build_race_tab(race: RaceTab) -> None:
    """The Race tab's components and events, inside the caller's `gr.Tab` (and `gr.Blocks`) context."""
    rec = race.runner.engine.recommended
    session = gr.State(RaceSession())
    with gr.Row(equal_height=False, elem_id="dg-race-controls"):
        with gr.Column(scale=3, min_width=0):
            prompt = gr.Textbox(label="Prompt", lines=2, max_lines=6, value=DEFAULT_RACE_PROMPT,
                                info=f"at most {MAX_PROMPT_CHARS:,} characters", elem_id="dg-race-prompt")
            raw = gr.Checkbox(label="Raw prompt (no chat template)", value=False, elem_id="dg-race-raw")
        with gr.Column(scale=2, min_width=0):
            with gr.Row():
                preset_box = gr.Dropdown(list(PRESET_NAMES), value="recommended", label="Diffusion preset",
                                         elem_id="dg-race-preset", min_width=120)
                max_new_tokens = setting_control("max_new_tokens", rec.max_new_tokens, label="Token budget",
                                                 info="both sides; whole canvases", elem_id="dg-race-budget",
                                                 min_width=160)
            with gr.Row():
                temperature = gr.Number(value=0.0, minimum=0.0, label="AR temperature", info="0 = greedy",
                                        elem_id="dg-race-temperature", min_width=120)
                seed = gr.Number(value=0, precision=0, label="Seed", info="-1 = random", elem_id="dg-race-seed",
                                 min_width=120)  # 120: "AR temperature" fits; on a phone the order wraps below
                order = gr.Dropdown(list(ORDERS), value="alternate", label="Who runs first",
                                    elem_id="dg-race-order", min_width=140)
            with gr.Row():
                start = gr.Button("Race", variant="primary", elem_id="dg-race-start", scale=3)
                stop = gr.Button("Stop", variant="stop", interactive=False, elem_id="dg-race-stop", scale=1)
            refusal = refusal_box("race")
    with gr.Row(equal_height=False, elem_id="dg-race-panels"):
        panels = [gr.HTML(panel_html(side, None, text="", model=race.models[side], position=None, state="idle"),
                          elem_id=f"dg-race-{side}", min_width=0) for side in SIDES]
    result = gr.HTML(result_html(None), elem_id="dg-race-result")

    inputs = [prompt, raw, preset_box, max_new_tokens, seed, temperature, order]
    run = dict(fn=race.race_stream, inputs=[session, *inputs], outputs=[*panels, result, start, stop],
               api_visibility="private", concurrency_id="engine", show_progress="hidden", trigger_mode="once")
    # The replay needs no engine: it runs outside the engine's queue slot, so the next visitor's run can start
    replay = dict(fn=race.replay_stream, inputs=[session], outputs=[*panels, result, start, stop],
                  api_visibility="private", concurrency_limit=None, show_progress="hidden")
    checked([start.click], race.check_inputs, inputs=inputs, box=refusal, trigger_mode="once").success(
        **run).success(**replay)
    stop.click(race.stop, inputs=[session], outputs=None, api_visibility="private", concurrency_limit=None,
               show_progress="hidden")

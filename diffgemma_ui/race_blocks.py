"""Wiring only: the Race tab's layout, its events and the `/race` API. Logic lives in `race_handlers.RaceTab`."""

# No `from __future__ import annotations` here: gr.api reads race_api's type hints at runtime.
import gradio as gr

from engine import PRESET_NAMES
from engine.race import ORDERS, SIDES

from .race_handlers import RaceSession, RaceTab
from .race_view import panel_html, result_html
from .validation import MAX_PROMPT_CHARS, UI_MAX_NEW_TOKENS

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
                max_new_tokens = gr.Slider(1, UI_MAX_NEW_TOKENS, value=rec.max_new_tokens, step=1,
                                           label="Token budget", info="both sides; whole canvases",
                                           elem_id="dg-race-budget", min_width=160)
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
    with gr.Row(equal_height=False, elem_id="dg-race-panels"):
        panels = [gr.HTML(panel_html(side, None, text="", model=race.models[side], position=None, state="idle"),
                          elem_id=f"dg-race-{side}", min_width=0) for side in SIDES]
    result = gr.HTML(result_html(None), elem_id="dg-race-result")

    inputs = [prompt, raw, preset_box, max_new_tokens, seed, temperature, order]
    check = dict(fn=race.check_inputs, inputs=inputs, outputs=None, api_visibility="private",
                 concurrency_limit=None, show_progress="hidden", trigger_mode="once")
    run = dict(fn=race.race_stream, inputs=[session, *inputs], outputs=[*panels, result, start, stop],
               api_visibility="private", concurrency_id="engine", show_progress="hidden", trigger_mode="once")
    # The replay needs no engine: it runs outside the engine's queue slot, so the next visitor's run can start
    replay = dict(fn=race.replay_stream, inputs=[session], outputs=[*panels, result, start, stop],
                  api_visibility="private", concurrency_limit=None, show_progress="hidden")
    start.click(**check).success(**run).success(**replay)
    stop.click(race.stop, inputs=[session], outputs=None, api_visibility="private", concurrency_limit=None,
               show_progress="hidden")


def register_race_api(race: RaceTab) -> None:
    """The `/race` endpoint, inside the caller's `gr.Blocks` context."""
    rec = race.runner.engine.recommended

    def race_api(
        prompt: str,
        raw: bool = False,
        max_new_tokens: int = rec.max_new_tokens,
        max_denoising_steps: int = rec.max_denoising_steps,
        entropy_bound: float = rec.entropy_bound,
        t_min: float = rec.t_min,
        t_max: float = rec.t_max,
        stability_threshold: int = rec.stability_threshold,
        confidence_threshold: float = rec.confidence_threshold,
        adaptive_stopping: bool = rec.adaptive_stopping,
        seed: int = -1,
        ar_temperature: float = 0.0,
        order: str = "alternate",
    ) -> tuple[str, str, dict]:
        """Race block diffusion against autoregressive decoding; returns (diffusion text, autoregressive text,
        summary). seed -1 draws a random seed; ar_temperature 0 is greedy; order: alternate, diffusion first or
        autoregressive first."""
        return race.race_api(prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max,
                             stability_threshold, confidence_threshold, adaptive_stopping, seed, ar_temperature,
                             order)

    gr.api(race_api, api_name="race", concurrency_id="engine")

"""The app: the page's layout and which handler each Playground event calls (logic lives in the handlers)."""

import contextlib
import inspect
import json
from pathlib import Path

import gradio as gr

from engine import PRESET_NAMES, DiffusionEngine
from engine.loading import DEFAULT_MODEL
from engine.quantization import model_bytes
from engine.race import RaceRunner
from engine.settings import draw_seed

from .branch_tab import BranchTab
from .canvas_view import EMPTY_CANVAS_HTML, legend_html
from .chat_tab import ChatTab, build_chat_tab
from .compare_tab import CompareHandlers, build_compare_tab
from .deployment import make_playground, queue_plan, slow_idle_queue_polling
from .infill_tab import EMBEDDED_TEMPLATE, INSTRUCTION_TEMPLATE, InfillTab, build_infill_tab
from .keep import KeepHandlers, build_keep_controls, present_head, wire_keep, wire_presenter
from .meter import meter_html
from .race_tab import RaceTab, build_race_tab
from .session import SessionState
from .step_through import StepThroughHandlers, build_step_controls, reset_note_on, wire_step_through
from .tab import (API_SETTINGS, PRIVATE, UNQUEUED, checked, live_plots, refusal_box, register_api, run_buttons,
                  seed_box, setting_control, setting_params)
from .text import escape_html, prose
from .validation import CUSTOM_PRESET, MAX_PROMPT_CHARS

DEFAULT_PROMPT = "Tell me what happened after the flood."
INSTRUCTION_DEFAULT_PROMPT = "Explain in three sentences how a diffusion language model writes text."
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
EXAMPLES_PATH = ASSETS_DIR / "examples.json"
EXPLAINER_PATH = ASSETS_DIR / "text" / "explainer.md"


class PlaygroundBlocks(gr.Blocks):
    """`gr.Blocks` whose `launch()` defaults to the playground's theme, CSS and head (as Gradio 6 wants)."""

    def launch(self, *args, **kwargs):
        kwargs.setdefault("theme", gr.themes.Soft(
            primary_hue="violet", secondary_hue="teal", neutral_hue="slate",
            font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif"],
            font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"],
        ).set(checkbox_border_color="*neutral_400", checkbox_border_color_dark="*neutral_500"))
        kwargs.setdefault("css_paths", [ASSETS_DIR / "style.css", ASSETS_DIR / "chat_infill.css"])
        kwargs.setdefault("head_paths", [ASSETS_DIR / "head.html"])
        kwargs.setdefault("head", present_head())
        return super().launch(*args, **kwargs)


def load_examples(path: Path = EXAMPLES_PATH, *, embedded: bool = True) -> list[list]:
    """`[[prompt, raw], ...]`: the JSON's "examples" for the embedded model, else its "instruction_examples"."""
    data = json.loads(path.read_text(encoding="utf-8"))
    chosen = data["examples"] if embedded else data.get("instruction_examples") or data["examples"]
    return [[str(e["prompt"]), bool(e.get("raw", False))] for e in chosen]


def header_html(engine: DiffusionEngine) -> str:
    """The page header: title, model, device, canvas, the weights' memory as stored (escaped)."""
    model = escape_html(Path(str(engine.source)).name or str(engine.source))
    nbytes = model_bytes(engine.model)
    size = f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"
    vision = getattr(getattr(engine.model, "config", None), "vision_config", None) is not None
    text_only = prose("text-only-badge") if vision else ""
    return (
        f'<div class="dg-header">{prose("header")}<div class="dg-badges"><span class="dg-badge">model: {model}</span>'
        f'<span class="dg-badge">device: {escape_html(str(engine.device))}</span>'
        f'<span class="dg-badge">canvas: {int(engine.canvas_length)} tokens</span>'
        f'<span class="dg-badge" title="memory the weights take on the device, as stored (quantized or not)">'
        f"weights: {size}</span>{text_only}</div></div>"
    )


def build_app(engine: DiffusionEngine, *, race: RaceRunner | None = None, **limits) -> gr.Blocks:
    """The app of `engine`, handlers in `app.playground`; `limits` as `Playground`'s, `race` the Race tab's runner."""
    playground = make_playground(engine, **limits)
    race_tab = RaceTab(race or RaceRunner(engine), playground)
    chat_tab, infill_tab = ChatTab(playground), InfillTab(playground)
    rec = engine.recommended
    try:
        embedded = Path(str(engine.source)).resolve() == DEFAULT_MODEL.resolve()
    except (OSError, RuntimeError):
        embedded = False
    default_prompt = DEFAULT_PROMPT if embedded else INSTRUCTION_DEFAULT_PROMPT

    with PlaygroundBlocks(title="DiffGemma Playground", analytics_enabled=False) as app:
        session = gr.State(SessionState())
        gr.HTML(header_html(engine), elem_id="dg-header-block")
        with gr.Tabs(elem_id="dg-tabs"):
            with gr.Tab("Playground", id="playground", elem_id="dg-tab-playground"):
                with gr.Row(elem_id="dg-main"):
                    with gr.Column(min_width=0, elem_id="dg-controls"):
                        prompt = gr.Textbox(
                            label="Prompt", lines=3, max_lines=8, elem_id="dg-prompt", value=default_prompt,
                            info=f"Shift+Enter generates; Enter adds a line; at most {MAX_PROMPT_CHARS:,} characters",
                            placeholder="Type a prompt, or pick an example")
                        raw = gr.Checkbox(label="Raw prompt (no chat template: continue the text as is)",
                                          elem_id="dg-raw", info=prose("raw-info"))
                        thinking = gr.Checkbox(label="Think first (the answer follows a thought, shown apart)",
                                               visible=engine.supports_thinking, elem_id="dg-thinking")
                        with gr.Row(elem_id="dg-buttons"):
                            generate, stop = run_buttons("Generate", "dg-generate", "dg-stop")
                        refusal = refusal_box("playground")
                        step_controls = build_step_controls()
                        with gr.Row(elem_id="dg-preset-row", equal_height=True):
                            preset_box = gr.Dropdown([*PRESET_NAMES, CUSTOM_PRESET], value="recommended",
                                                     label="Preset", elem_id="dg-preset", scale=2, min_width=150)
                        with gr.Row(elem_id="dg-seed-row", equal_height=True):
                            seed = seed_box("dg-seed", scale=2, min_width=200)
                            dice = gr.Button("Random", elem_id="dg-dice", scale=0, min_width=76)
                    with gr.Column(min_width=0, elem_id="dg-settings-col"):
                        with gr.Accordion("Denoising settings", elem_id="dg-settings"):
                            controls = {}  # by setting name; a pair goes side by side
                            for names in (("max_new_tokens",), ("max_denoising_steps",), ("entropy_bound",),
                                          ("t_min", "t_max"), ("adaptive_stopping",),
                                          ("stability_threshold", "confidence_threshold")):
                                pair = {"min_width": 120} if len(names) > 1 else {}
                                with gr.Row() if pair else contextlib.nullcontext():
                                    for name in names:
                                        controls[name] = setting_control(name, getattr(rec, name), **pair)
                        examples = load_examples(embedded=embedded)
                        gr.Examples(examples, inputs=[prompt, raw], label="Examples: click one to fill the prompt",
                                    examples_per_page=len(examples),
                                    example_labels=[f"{p}  \u00b7  {'raw' if r else 'chat'}" for p, r in examples])
                    with gr.Column(min_width=0, elem_id="dg-output"):
                        meter = gr.HTML(meter_html(None), elem_id="dg-meter")
                        with gr.Column(min_width=0, elem_id="dg-canvas-wrap"):
                            gr.HTML(legend_html(), elem_id="dg-legend")
                            stack = gr.HTML("", elem_id="dg-stack")  # finished blocks
                            canvas = gr.HTML(EMPTY_CANVAS_HTML, elem_id="dg-canvas")  # the block being denoised
                        thought = gr.HTML("", elem_id="dg-thought")
                        text = gr.Textbox(label="Generated text", lines=3, max_lines=12, interactive=False,
                                          buttons=["copy"], elem_id="dg-text", placeholder=prose("text-placeholder"))
                        block = gr.Slider(1, 2, value=1, step=1, label="Block to plot", visible=False,
                                          elem_id="dg-block")
                        heatmap, order, entropy = live_plots("dg-", min_width=280, row_id="dg-plot-row")
                        present = gr.Button("Present: full screen, for a class", elem_id="dg-present", size="sm")
                        keep_controls = build_keep_controls()
                        BranchTab(playground).build(session)
                with gr.Accordion("How it works", open=False, elem_id="dg-explainer"):
                    gr.Markdown(EXPLAINER_PATH.read_text(encoding="utf-8"))
            for name, build, *args in (
                ("Race", build_race_tab, race_tab),
                ("Compare", build_compare_tab, CompareHandlers(playground), default_prompt),
                ("Chat", build_chat_tab, chat_tab, [p for p, is_raw in examples if not is_raw]),
                ("Infill", build_infill_tab, infill_tab, EMBEDDED_TEMPLATE if embedded else INSTRUCTION_TEMPLATE),
            ):
                with gr.Tab(name, id=name.lower(), elem_id=f"dg-tab-{name.lower()}"):
                    build(*args)

        settings_inputs = [controls[name] for name in API_SETTINGS]
        run_inputs = [prompt, raw, *settings_inputs, seed]
        stream_outputs = [stack, canvas, meter, text, heatmap, order, entropy, block, generate, stop, thought]
        ticket = gr.Textbox(visible=False, elem_id="dg-ticket")  # which request of the session a run step serves
        # "multiple": a trigger during a run restarts it (only the newest ticket's step runs)
        requested = checked([generate.click, prompt.submit], playground.request_run, box=refusal,
                            inputs=[session, *run_inputs, thinking], outputs=[ticket, meter, generate, stop],
                            refused=playground.refused, refused_inputs=[session], refused_outputs=[meter],
                            trigger_mode="multiple")
        run_step = requested.success(playground.generate_stream, inputs=[session, *run_inputs, ticket, thinking],
                                     outputs=stream_outputs, api_visibility="private", concurrency_id="engine",
                                     show_progress="full", show_progress_on=[canvas], trigger_mode="multiple")
        # Stop also cancels the run step, so a queued run leaves the queue
        stopped = stop.click(playground.stop, inputs=[session], outputs=stream_outputs, cancels=[run_step], **UNQUEUED)
        stepped = wire_step_through(step_controls, StepThroughHandlers(playground), session, run_inputs,
                                    stream_outputs, stop_button=stop, box=refusal)
        keep = KeepHandlers(playground)  # a run is kept however it ended
        wire_keep(keep_controls, keep, session, stream_outputs, [run_step, stopped, *stepped],
                  replay_button=step_controls.replay, box=refusal)
        reset_note_on(step_controls, [requested.success, step_controls.replay.click, keep_controls.upload.upload,
                                      keep_controls.play.click])
        wire_presenter(playground, session, present)
        dice.click(lambda: str(draw_seed()), outputs=[seed], **UNQUEUED)
        preset_box.change(playground.apply_preset, inputs=[preset_box], outputs=settings_inputs[1:], **UNQUEUED)
        for setting in settings_inputs[1:]:  # edited by hand: no longer a named preset
            setting.input(None, None, preset_box, js=f"() => {json.dumps(CUSTOM_PRESET)}", **PRIVATE)
        block.input(playground.select_block, inputs=[session, block], outputs=[heatmap, order, entropy],
                    trigger_mode="always_last", **UNQUEUED)
        app.unload(playground.unload)
        app.unload(chat_tab.unload)
        if engine.supports_thinking:  # thinking needs the chat template: Raw and Think first exclude each other
            raw.input(None, [raw, thinking], [thinking], js="(r, t) => (r ? false : t)", **PRIVATE)
            thinking.input(None, [raw, thinking], [raw], js="(r, t) => (t ? false : r)", **PRIVATE)

        register_apis(playground, race_tab, chat_tab, infill_tab, keep)

    app.queue_plan = queue_plan(engine.device.type)  # set on every path: Gradio's ZeroGPU default is max_size=1
    app.queue(default_concurrency_limit=app.queue_plan.concurrency, max_size=app.queue_plan.max_size)
    slow_idle_queue_polling(app)
    app.playground = playground
    playground.runs.blocks = app
    app.race, app.chat, app.infill, app.keep = race_tab, chat_tab, infill_tab, keep
    return app


def register_apis(playground, race: RaceTab, chat: ChatTab, infill: InfillTab, keep: KeepHandlers) -> None:
    """`/generate`, `/race`, `/chat`, `/infill`, `/export`, each with the table's settings (default: recommended)."""
    rec = playground.engine.recommended
    required = inspect.Parameter.empty
    seed = ("seed", int, -1)
    run = [("prompt", str, required), ("raw", bool, False), *setting_params(rec), seed]
    chat_params = [("message", str, required), ("history", str, "[]"), ("system", str, ""), ("thinking", bool, False),
                   *setting_params(rec), seed]
    infill_params = [("template", str, required), ("context", str, ""), *setting_params(rec, API_SETTINGS[1:]), seed]
    for name, handler, params, returns, doc in (
        ("generate", playground.generate_api_served, run, tuple[str, dict], prose("api-generate")),
        ("race", race.race_api, [*run, ("ar_temperature", float, 0.0), ("order", str, "alternate")],
         tuple[str, str, dict], prose("api-race")),
        ("chat", chat.chat_api, chat_params, tuple[str, dict], prose("api-chat")),
        ("infill", infill.infill_api, infill_params, tuple[str, dict], prose("api-infill")),
        ("export", keep.export_served, run, dict, prose("api-export")),
    ):
        register_api(name, handler, params, returns, doc)

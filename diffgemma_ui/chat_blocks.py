"""Wiring only: the Chat tab's layout, its events and the `/chat` API. Logic lives in `chat_handlers.ChatTab`."""

from collections.abc import Sequence

import gradio as gr

from engine import PRESET_NAMES

from . import plots
from .canvas_view import CHAT_EMPTY_CANVAS_HTML, legend_html
from .chat_handlers import IDLE_METER_NOTE, ChatState, ChatTab
from .chat_view import EMPTY_CHAT_HTML, IDLE_REUSE_HTML
from .meter import meter_html
from .tab import checked, refusal_box, setting_control
from .validation import MAX_PROMPT_CHARS

INTRO = ("A conversation through the checkpoint's chat template. Each answer is denoised on the canvas; from the "
         "second turn on, the encoder reuses the cache of the earlier turns and only encodes what is new (the note "
         "above the meter says how much). The conversation stays in this browser tab's session.")
CHAT_MAX_NEW_TOKENS = 128  # default answer budget: two canvases of the embedded model, half of one of the real one


def build_chat_tab(chat: ChatTab, example_messages: Sequence[str] = ()) -> None:
    """The Chat tab's components and events, inside the caller's `gr.Tab` (and `gr.Blocks`) context;
    `example_messages` are offered under the message box (a click fills it)."""
    engine = chat.engine
    state = gr.State(ChatState())
    gr.Markdown(INTRO, elem_id="dg-chat-intro")
    with gr.Row(equal_height=False, elem_id="dg-chat-main"):
        with gr.Column(min_width=0, elem_id="dg-chat-left"):
            history = gr.HTML(EMPTY_CHAT_HTML, elem_id="dg-chat-history")
            message = gr.Textbox(label="Message", lines=2, max_lines=6, elem_id="dg-chat-message",
                                 placeholder=f"Write a message (at most {MAX_PROMPT_CHARS:,} characters); "
                                             "Shift+Enter sends")
            if example_messages:
                gr.Examples([[m] for m in example_messages], inputs=[message], elem_id="dg-chat-examples",
                            label="Example messages: click one to fill the box",
                            examples_per_page=len(example_messages))
            # Only for checkpoints whose chat template has a thinking mode (Gemma 4: enable_thinking)
            thinking = gr.Checkbox(label="Think first (the thought is shown apart, collapsed, and not fed back)",
                                   value=False, visible=engine.supports_thinking, elem_id="dg-chat-thinking")
            with gr.Row(elem_id="dg-chat-buttons"):
                send = gr.Button("Send", variant="primary", elem_id="dg-chat-send", scale=2, min_width=80)
                stop = gr.Button("Stop", variant="stop", interactive=False, elem_id="dg-chat-stop", scale=1,
                                 min_width=64)
                regenerate = gr.Button("Regenerate", interactive=False, elem_id="dg-chat-regenerate", scale=1,
                                       min_width=100)
                clear = gr.Button("Clear", elem_id="dg-chat-clear", scale=1, min_width=64)
            refusal = refusal_box("chat")
            with gr.Row(elem_id="dg-chat-settings"):
                preset_box = gr.Dropdown(list(PRESET_NAMES), value="recommended", label="Preset",
                                         elem_id="dg-chat-preset", min_width=140)
                max_new_tokens = setting_control("max_new_tokens", label="Max new tokens per answer", info=None,
                                                 value=min(CHAT_MAX_NEW_TOKENS, engine.recommended.max_new_tokens),
                                                 elem_id="dg-chat-max-new", min_width=180)
                seed = gr.Textbox(value="-1", label="Seed", info="-1 = random; Regenerate always draws a new one",
                                  max_lines=1, max_length=24, elem_id="dg-chat-seed", min_width=140)
        with gr.Column(min_width=0, elem_id="dg-chat-output"):
            reuse = gr.HTML(IDLE_REUSE_HTML, elem_id="dg-chat-reuse")
            meter = gr.HTML(meter_html(None, note=IDLE_METER_NOTE), elem_id="dg-chat-meter")
            with gr.Column(min_width=0, elem_id="dg-chat-canvas-wrap", elem_classes=["dg-canvas-card"]):
                gr.HTML(legend_html())
                stack = gr.HTML("", elem_id="dg-chat-stack")
                canvas = gr.HTML(CHAT_EMPTY_CANVAS_HTML, elem_id="dg-chat-canvas")
            with gr.Accordion("Plots of this answer's block", open=False, elem_id="dg-chat-plots"):
                heatmap = gr.Plot(plots.confidence_heatmap([]), show_label=False, elem_id="dg-chat-heatmap")
                with gr.Row():
                    order = gr.Plot(plots.unmasking_order(None), show_label=False, elem_id="dg-chat-order",
                                    min_width=260)
                    entropy = gr.Plot(plots.entropy_and_acceptance([]), show_label=False, elem_id="dg-chat-entropy",
                                      min_width=260)

    outputs = [history, reuse, stack, canvas, meter, heatmap, order, entropy, message, send, stop, regenerate, clear]
    private = dict(api_visibility="private", show_progress="hidden")
    run = dict(outputs=outputs, concurrency_id="engine", trigger_mode="once", **private)
    turn_inputs = [message, preset_box, max_new_tokens, seed, thinking]
    checked([send.click, message.submit], chat.check_turn, inputs=turn_inputs, box=refusal,
            trigger_mode="once").success(chat.send_stream, inputs=[state, *turn_inputs], **run)
    regen_inputs = [preset_box, max_new_tokens, thinking]
    checked([regenerate.click], chat.check_regenerate, inputs=[state, *regen_inputs], box=refusal,
            trigger_mode="once").success(chat.regenerate_stream, inputs=[state, *regen_inputs], **run)
    stop.click(chat.stop, inputs=[state], outputs=None, concurrency_limit=None, **private)
    clear.click(chat.clear, inputs=[state], outputs=outputs, concurrency_limit=None, **private)

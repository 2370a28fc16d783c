"""The Chat tab and `/chat`: a multi-turn conversation per visitor (an `engine.engine.ChatSession`), each turn the
"chat" job; `/chat` is stateless: the client sends the history as JSON and gets it back with the new turn."""

import dataclasses
import json
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import gradio as gr

from engine.engine import ChatSession, TurnReport, check_messages, check_thinking

from .canvas_view import CHAT_EMPTY_CANVAS_HTML, legend_html, thought_html
from .hub import RUN_INPUT_NAMES, Job, Outcome, api_summary
from .live_view import render
from .meter import meter_html
from .plots import block_plots
from .session import SessionState
from .tab import (UNQUEUED, PlotClock, Tab, api_run, buttons, live_plots, live_run, preset_dropdown, refusal_box,
                  refusing, run_buttons, seed_box, setting_control, setting_params, user_error, wire_run)
from .text import escape_html, plain_text, plural, prose
from .validation import MAX_PROMPT_CHARS, RunRequest, build_request, parse_run, preset_values

MAX_HISTORY_CHARS = 400_000  # the /chat history's JSON text
CHAT_MAX_NEW_TOKENS = 128  # the default answer budget
IDLE_METER_NOTE = "engine clock \u00b7 press Send to start"
EMPTY_CHAT_HTML = f'<div class="dg-chat-history dg-empty" data-turns="0"><p>{prose("chat-empty")}</p></div>'
ROLE_LABELS = {"system": "System", "user": "You", "assistant": "Model"}
OUTCOME = ("messages", "thoughts", "last_report", "last_result")  # a turn's `ChatSession` fields, sent after it


def _note(state: str, html: str, data: str = "") -> str:
    """The cache reuse note in `state` (a `data-state`), `data` its other attributes."""
    return f'<div class="dg-chat-reuse" data-state="{state}"{data}>{html}</div>'


STOPPED_NOTE, IDLE_REUSE_HTML = _note("stopped", prose("chat-stopped")), _note("idle", prose("chat-reuse-idle"))


@dataclass
class ChatTurn:
    """A "chat" job's payload: `run`'s prompt answered after `messages` (or regenerated); `session` never pickled."""

    run: RunRequest
    messages: list
    thoughts: list
    regenerate: bool = False
    session: ChatSession | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "session": None}


def chat_source(engine, turn: ChatTurn, stop) -> Iterator:
    """The "chat" source: the turn's frames, then what it left in its `ChatSession` (`OUTCOME` by name)."""
    run, chat = turn.run, turn.session
    if chat is None:
        chat = ChatSession(engine)
        chat.messages, chat.thoughts = list(turn.messages), list(turn.thoughts)
    options = dict(seed=run.seed, thinking=run.thinking, stop_event=stop)
    yield from (chat.regenerate(run.settings, **options) if turn.regenerate
                else chat.turn(run.prompt, run.settings, **options))
    yield Outcome({name: getattr(chat, name) for name in OUTCOME})


def parse_history(history) -> list[dict]:
    """The `/chat` history: JSON text ("" for none) of alternating user and assistant messages; ValueError."""
    if history is None or (isinstance(history, str) and not history.strip()):
        return []
    if not isinstance(history, str):
        raise ValueError("history must be JSON text: a list of {\"role\", \"content\"} messages")
    if len(history) > MAX_HISTORY_CHARS:
        raise ValueError(f"history is {len(history):,} characters; the limit is {MAX_HISTORY_CHARS:,}")
    try:
        messages = json.loads(history)
    except json.JSONDecodeError as error:
        raise ValueError(f"history is not valid JSON ({error.msg} at character {error.pos})") from None
    if messages == []:
        return []
    messages = check_messages(messages)
    for i, message in enumerate(messages):
        expected = "user" if i % 2 == 0 else "assistant"
        if message["role"] == "system":
            raise ValueError(f"history message {i} is a system message: pass it as `system` instead")
        if message["role"] != expected:
            raise ValueError(f"history message {i} has role {message['role']!r} where {expected!r} was expected: "
                             "turns alternate user, assistant, starting with user")
    if len(messages) % 2:
        raise ValueError("history ends with a user message: it must end with the model's answer (the new message "
                         "goes in `message`)")
    return messages


class ChatState(SessionState):
    """A visitor's chat: the conversation, its turn, the renderer's caches, the turn counts."""

    chat: ChatSession | None = None
    turns = 0
    cut_turns = 0  # oldest turns cut to fit the context


def has_answer(chat: ChatSession | None) -> bool:
    return chat is not None and bool(chat.messages) and chat.messages[-1]["role"] == "assistant"


class ChatTab(Tab):
    """Handlers of the Chat tab and `/chat`."""

    title = "Chat"

    def build(self, page) -> None:
        build_chat_tab(self, [prompt for prompt, raw in page.examples if not raw])

    def endpoints(self, page) -> Sequence[tuple]:
        params = [("message", str, page.required), ("history", str, "[]"), ("system", str, ""),
                  ("thinking", bool, False), *setting_params(self.engine.recommended), ("seed", int, -1)]
        return [("chat", self.chat_api, params, tuple[str, dict], prose("api-chat"))]

    sources = {"chat": chat_source}

    def __init__(self, hub):
        super().__init__(hub)
        self.sessions = weakref.WeakValueDictionary()  # session hash -> `ChatState`

    def turn(self, message, preset_name, max_new_tokens, seed, thinking) -> ChatTurn:
        """The tab's inputs as a checked turn (gr.Error)."""
        with refusing():
            values = preset_values(preset_name, self.engine.recommended, max_new_tokens=max_new_tokens)
            run = build_request(message, False, values, seed, thinking=thinking)
            self.engine.check_settings(run.settings)
            self.hub.check_job(Job("chat", None, run.settings))
            check_thinking(self.engine.tokenizer, run.thinking)
            return ChatTurn(run, [], [])

    def regeneration(self, state: ChatState, preset_name, max_new_tokens, thinking) -> ChatTurn:
        """The turn replacing the last answer, with a new seed; gr.Error (also without an answer)."""
        if not has_answer(state.chat):
            raise user_error("nothing to regenerate: the conversation has no answer yet")
        return dataclasses.replace(self.turn("x", preset_name, max_new_tokens, -1, thinking), regenerate=True)

    def send_stream(self, state: ChatState, request: gr.Request, *inputs) -> Iterator[tuple]:
        """Send (`inputs` as `turn`'s): the tab's outputs as it is answered (a stopped turn not kept); gr.Error."""
        yield from self._stream(state, self.turn(*inputs), request)

    def regenerate_stream(self, state: ChatState, request: gr.Request, *inputs) -> Iterator[tuple]:
        """Regenerate (`inputs` as `regeneration`'s): the last answer replaced (new seed), as `send_stream`."""
        yield from self._stream(state, self.regeneration(state, *inputs), request)

    def _stream(self, state: ChatState, turn: ChatTurn, request) -> Iterator[tuple]:
        hub, regenerating = self.hub, turn.regenerate
        state.halt()
        chat = state.chat = state.chat or ChatSession(self.engine)
        user_text = chat.messages[-2]["content"] if regenerating else turn.run.prompt
        turn.messages, turn.thoughts, turn.session = list(chat.messages), list(chat.thoughts), chat
        shown, shown_thoughts = turn.messages, turn.thoughts
        if regenerating:  # shown while it runs: without the answer it replaces
            shown, shown_thoughts = shown[:-2], shown_thoughts[:-1]
        state.clear_views()
        if getattr(request, "session_hash", None):
            self.sessions[request.session_hash] = state
        chat.last_report = chat.last_result = None
        clock = PlotClock(wait_first=True)
        number = state.turns + (0 if regenerating else 1)  # the turn being generated
        job = Job("chat", turn, turn.run.settings)
        with live_run(hub, job, request, state, ":chat", receive=vars(chat).update) as worker:
            for index, snap in enumerate(hub.runs.updates(worker)):
                state.snapshot = snap
                out = render(self.engine, state, snap, final=snap.finished, plots_due=clock.due(snap.block_count),
                             first=index == 0, stagger=True)
                if snap.finished:
                    yield self._final(state, snap, out, regenerating)
                    if snap.error is not None:
                        raise user_error(snap.error)
                    continue
                history = gr.skip()
                if index == 0 or isinstance(out.stack, str):  # a block was committed: the answer grew
                    history = history_html(shown, shown_thoughts, pending_user=user_text, pending_answer=out.text,
                                           cut_turns=state.cut_turns)
                note = running_note(number, regenerating) if index == 0 else gr.skip()
                yield self._view(state, history, note, out, running=index == 0 or None)

    def _view(self, state: ChatState, history, note, out, message=None, *, running: bool | None) -> tuple:
        """The tab's outputs, `out`'s canvas, meter and plots between `note` and `message` (None: left alone)."""
        plots = (out.stack, out.canvas, out.meter, out.heatmap, out.order, out.entropy) if out else (gr.skip(),) * 6
        return (history, note, *plots, gr.skip() if message is None else message, *self._buttons(state, running))

    def _final(self, state: ChatState, snap, out, regenerating: bool) -> tuple:
        """The turn's last view (the message box emptied if answered, unless regenerated)."""
        chat = state.chat
        if chat is None:  # the tab closed meanwhile
            return self._view(state, EMPTY_CHAT_HTML, STOPPED_NOTE, None, running=False)
        answered = (snap.error is None and snap.latest is not None and snap.latest.done
                    and snap.latest.stop_reason != "cancelled" and chat.last_report is not None)
        reuse = STOPPED_NOTE
        if answered:
            state.turns += 0 if regenerating else 1
            state.cut_turns += chat.last_report.dropped_turns
            reuse = reuse_html(chat.last_report, state.turns, regenerated=regenerating)
        history = history_html(chat.messages, chat.thoughts, cut_turns=state.cut_turns)
        message = gr.update(value="") if answered and not regenerating else None
        return self._view(state, history, reuse, out, message, running=False)

    @staticmethod
    def _buttons(state: ChatState, running: bool | None) -> tuple:
        """(Send, Stop, Regenerate, Clear) updates; None leaves them as they are."""
        if running is None:
            return (gr.skip(),) * 4
        answer = has_answer(state.chat) and not running
        return *buttons(running), gr.update(interactive=answer), gr.update(interactive=not running)

    def unload(self, request: gr.Request) -> None:
        """A tab closed: stop its turn, drop its conversation and encoder cache."""
        state = self.sessions.pop(getattr(request, "session_hash", None) or "", None)
        if state is not None:
            state.halt()
            state.chat = None
            state.release()

    def clear(self, state: ChatState) -> tuple:
        """Clear: forget the conversation; the tab's outputs as before any turn."""
        if state is not None:
            state.halt()
            if state.chat is not None:
                state.chat.clear()
            state.turns = state.cut_turns = 0
            state.snapshot = None
        return (EMPTY_CHAT_HTML, IDLE_REUSE_HTML, "", CHAT_EMPTY_CANVAS_HTML, meter_html(None, note=IDLE_METER_NOTE),
                *block_plots([]), gr.skip(), *self._buttons(state or ChatState(), running=False))

    async def chat_api(self, message, history, system, thinking, *values,
                       request: gr.Request = None) -> tuple[str, dict]:
        """`/chat`: `message` answered after `history` and `system` (settings, seed as `/generate`'s) -> (answer,
        `/generate`'s summary with `report` and `history` with this turn); gr.Error."""
        chat = None

        def job() -> Job:
            nonlocal chat
            run = parse_run({**dict(zip(RUN_INPUT_NAMES[2:-1], values)), "prompt": message, "raw": False,
                             "thinking": thinking}, ui_limits=False)
            check_thinking(self.engine.tokenizer, run.thinking)
            if system is not None and not isinstance(system, str):
                raise ValueError("system must be text")
            chat = ChatSession(self.engine, system=system if system and system.strip() else None)
            earlier = parse_history(history)
            chat.messages = chat.messages + earlier
            chat.thoughts = ["" for m in earlier if m["role"] == "assistant"]
            return Job("chat", ChatTurn(run, chat.messages, chat.thoughts), run.settings)

        await api_run(self.hub, job, request, keep_history=False,
                      receive=lambda fields: vars(chat).update(fields))
        if chat.last_result is None:
            raise user_error("the turn was stopped before its answer was complete")
        text, summary = api_summary(chat.last_result)
        summary.update(report=chat.last_report.to_dict(), history=[m for m in chat.messages if m["role"] != "system"])
        return text, summary


def build_chat_tab(chat: ChatTab, example_messages: Sequence[str] = ()) -> None:
    """The Chat tab's components and events in the current `gr.Tab`, `example_messages` under the message box."""
    engine = chat.engine
    state = gr.State(ChatState())
    gr.Markdown(prose("chat-intro"), elem_id="dg-chat-intro")
    with gr.Row(elem_id="dg-chat-main"):
        with gr.Column(min_width=0, elem_id="dg-chat-left"):
            history = gr.HTML(EMPTY_CHAT_HTML, elem_id="dg-chat-history")
            message = gr.Textbox(label="Message", lines=1, max_lines=6, elem_id="dg-chat-message",
                                 placeholder="Write a message",
                                 info=prose("chat-keys").format(limit=MAX_PROMPT_CHARS))
            if example_messages:
                gr.Examples([[m] for m in example_messages], inputs=[message], elem_id="dg-chat-examples",
                            label="Example messages: click one to fill the box",
                            examples_per_page=len(example_messages))
            thinking = gr.Checkbox(label=prose("chat-thinking"), visible=engine.supports_thinking,
                                   elem_id="dg-chat-thinking")
            with gr.Row(elem_id="dg-chat-buttons"):
                send, stop = run_buttons("Send", "dg-chat-send", "dg-chat-stop", scale=2, min_widths=(80, 64))
                regenerate = gr.Button("Regenerate", interactive=False, elem_id="dg-chat-regenerate", scale=1,
                                       min_width=100)
                clear = gr.Button("Clear", elem_id="dg-chat-clear", scale=1, min_width=64)
            refusal = refusal_box("chat")
            with gr.Row(elem_id="dg-chat-settings"):
                preset_box = preset_dropdown("dg-chat-preset")
                max_new_tokens = setting_control("max_new_tokens", label="Max new tokens per answer", info=None,
                                                 value=min(CHAT_MAX_NEW_TOKENS, engine.recommended.max_new_tokens),
                                                 elem_id="dg-chat-max-new", min_width=180)
                seed = seed_box("dg-chat-seed", "-1", info="-1 = random; Regenerate always draws a new one",
                                min_width=140)
        with gr.Column(min_width=0, elem_id="dg-chat-output"):
            reuse = gr.HTML(IDLE_REUSE_HTML, elem_id="dg-chat-reuse")
            meter = gr.HTML(meter_html(None, note=IDLE_METER_NOTE), elem_id="dg-chat-meter")
            with gr.Column(min_width=0, elem_id="dg-chat-canvas-wrap", elem_classes=["dg-canvas-card"]):
                gr.HTML(legend_html())
                stack = gr.HTML("", elem_id="dg-chat-stack")
                canvas = gr.HTML(CHAT_EMPTY_CANVAS_HTML, elem_id="dg-chat-canvas")
            with gr.Accordion("Plots of this answer's block", open=False, elem_id="dg-chat-plots"):
                heatmap, order, entropy = live_plots("dg-chat-")

    outputs = [history, reuse, stack, canvas, meter, heatmap, order, entropy, message, send, stop, regenerate, clear]
    run = dict(state=state, outputs=outputs, box=refusal, stop=stop)
    wire_run([send.click, message.submit], chat.turn, chat.send_stream,
             inputs=[message, preset_box, max_new_tokens, seed, thinking], **run)
    regen_inputs = [preset_box, max_new_tokens, thinking]
    wire_run([regenerate.click], chat.regeneration, chat.regenerate_stream, inputs=regen_inputs,
             check_inputs=[state, *regen_inputs], **run)
    clear.click(chat.clear, inputs=[state], outputs=outputs, **UNQUEUED)


# Views (pure; every message is untrusted: escaped plain text, never Markdown or HTML)
def _bubble(role: str, text: str, *, extra: str = "", state: str = "") -> str:
    body = escape_html(plain_text(text)) if text or state else '<span class="dg-chat-empty">(empty answer)</span>'
    state_attr = f' data-state="{escape_html(state)}"' if state else ""
    return (f'<div class="dg-chat-msg dg-chat-{escape_html(role)}"{state_attr}>'
            f'<div class="dg-chat-role">{escape_html(ROLE_LABELS.get(role, role))}</div>{extra}'
            f'<div class="dg-chat-text">{body}</div></div>')


def history_html(messages: Sequence[dict], thoughts: Sequence[str] = (), *, pending_user: str | None = None,
                 pending_answer: str = "", cut_turns: int = 0) -> str:
    """A bubble per message (answers with their thought), the turn being written (`pending_user`), `cut_turns`."""
    if not messages and pending_user is None and not cut_turns:
        return EMPTY_CHAT_HTML
    parts = []
    if cut_turns:
        cut = prose("chat-cut").format(turns=plural(cut_turns, "oldest turn"))
        parts.append(f'<p class="dg-chat-cut">{cut}</p>')
    answer_thoughts = iter(thoughts)
    for message in messages:
        extra = thought_html(next(answer_thoughts, "")) if message["role"] == "assistant" else ""
        parts.append(_bubble(message["role"], message["content"], extra=extra))
    turns = sum(1 for m in messages if m["role"] == "user")
    if pending_user is not None:
        turns += 1
        parts += [_bubble("user", pending_user), _bubble("assistant", pending_answer, state="writing",
                                                         extra='<div class="dg-chat-tag">writing\u2026</div>')]
    return f'<div class="dg-chat-history" data-turns="{turns}"><div class="dg-chat-log">{"".join(parts)}</div></div>'


def running_note(turn: int, regenerating: bool) -> str:
    """The reuse note while turn `turn` is generated."""
    head = f"Turn {turn}{' (regenerating)' if regenerating else ''}"
    return _note("running", f'{escape_html(head)} \u00b7 {prose("chat-reuse-running")}')


def reuse_html(report: TurnReport | None, turn: int = 0, *, regenerated: bool = False) -> str:
    """What the turn's encoder cache saved (`IDLE_REUSE_HTML` for None); `turn`: its number (0: not shown)."""
    if report is None:
        return IDLE_REUSE_HTML
    tokens = dict(reused=report.reused_tokens, prompt=report.prompt_tokens, encoded=report.encoded_tokens)
    text = prose("chat-reuse-done" if report.reused_tokens else "chat-reuse-none").format(
        **tokens, ms=report.prefill_s * 1000)
    if report.reused_tokens and report.prefill_saved_s is not None:
        text += " \u00b7 " + prose("chat-reuse-saved").format(ms=report.prefill_saved_s * 1000)
    if turn:
        text = f"Turn {turn}{' (regenerated)' if regenerated else ''} \u00b7 {text}"
    note = f'<div class="dg-chat-cut">{escape_html(report.note)}</div>' if report.note else ""
    return _note("done", escape_html(text) + note, "".join(f' data-{k}="{v}"' for k, v in tokens.items()))

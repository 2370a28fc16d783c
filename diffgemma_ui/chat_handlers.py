"""The Chat tab's handlers: one multi-turn conversation per visitor, each answer streamed like the main view.

The conversation is an `engine.chat.ChatSession` held in the visitor's `gr.State` (`ChatState`): its messages and
its encoder cache never leave that session. Each turn is the "chat" job of the run mechanism (`Playground.start_job`;
on ZeroGPU in the GPU process, from the conversation's messages), registered under `<session>:chat`, so a closed tab
stops it, and is rendered with the main view's own renderer (`Playground.render`). The `/chat` API is stateless: the
client sends the history (JSON) and gets it back with the new turn.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import gradio as gr

from engine import DiffusionSettings
from engine.chat import ChatSession
from engine.conversation import check_messages

from . import plots
from .canvas_view import CHAT_EMPTY_CANVAS_HTML
from .chat_view import EMPTY_CHAT_HTML, IDLE_REUSE_HTML, history_html, reuse_html
from .handlers import API_SUMMARY_KEYS, Job, Playground
from .meter import meter_html
from .runs import STOP_WAIT_S, RunWorker, session_key
from .session import SessionState
from .tab import PlotClock, user_error
from .text import plain_text
from .validation import build_settings, check_flag, check_prompt, check_ui_seed, preset_values

MAX_HISTORY_CHARS = 400_000  # the /chat history's JSON text; longer conversations are cut by the engine anyway
STOPPED_NOTE = ('<div class="dg-chat-reuse" data-state="stopped">Stopped: this turn was not added to the '
                "conversation.</div>")


@dataclass
class ChatTurn:
    """A chat turn as a job's payload: what to answer (`text`; None: regenerate the last answer), its settings, the
    conversation so far as plain values, and off ZeroGPU the visitor's `ChatSession` itself (its encoder cache is
    reused; never pickled: the GPU process rebuilds the session from the messages)."""

    text: str | None
    settings: DiffusionSettings
    seed: int | None
    thinking: bool
    messages: list
    thoughts: list
    session: ChatSession | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "session": None}


@dataclass(frozen=True)
class ChatOutcome:
    """What a turn left, sent after its final frame: the conversation and the turn's report and result."""

    messages: list
    thoughts: list
    report: object
    result: object

    def apply(self, chat: ChatSession) -> None:
        chat.messages, chat.thoughts, chat.last_report, chat.last_result = (
            self.messages, self.thoughts, self.report, self.result)


def chat_source(engine, turn: ChatTurn, stop) -> Iterator:
    """The "chat" source: the turn's frames, then its `ChatOutcome`."""
    chat = turn.session
    if chat is None:
        chat = ChatSession(engine)
        chat.messages, chat.thoughts = list(turn.messages), list(turn.thoughts)
    if turn.text is None:
        yield from chat.regenerate(turn.settings, seed=turn.seed, thinking=turn.thinking, stop_event=stop)
    else:
        yield from chat.turn(turn.text, turn.settings, seed=turn.seed, thinking=turn.thinking, stop_event=stop)
    yield ChatOutcome(chat.messages, chat.thoughts, chat.last_report, chat.last_result)


def parse_history(history) -> list[dict]:
    """The `/chat` history: JSON text (or "" for none) of a list of {"role": "user" | "assistant", "content": str}
    messages, alternating, starting with a user message and ending with an answer.

    Raises:
        ValueError: not text, longer than `MAX_HISTORY_CHARS`, not JSON, malformed messages (`check_messages`), a
            system message (use the `system` input) or roles out of order; the message names the problem.
    """
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


class ChatState:
    """One visitor's chat (a `gr.State` value): the conversation, its run in progress and what the page shows.

    Gradio deep-copies a state's initial value per session; a copy is always a fresh, empty conversation, so no
    history or cache ever crosses sessions.
    """

    def __init__(self):
        self.chat: ChatSession | None = None
        self.worker: RunWorker | None = None
        self.view = SessionState()  # the renderer's caches (finished blocks' HTML)
        self.turns = 0  # turns answered so far (for the note)
        self.cut_turns = 0  # oldest turns cut to fit the context, all turns together

    def __deepcopy__(self, memo) -> "ChatState":
        return ChatState()

    def session(self, engine) -> ChatSession:
        """The conversation, created on first use."""
        if self.chat is None:
            self.chat = ChatSession(engine)
        return self.chat

    def stop(self) -> None:
        """Ask the turn in progress to stop (it ends within one decoder forward)."""
        if self.worker is not None:
            self.worker.stop()

    def halt(self) -> None:
        """Stop the turn in progress and wait for it to end (the conversation is not thread-safe)."""
        if self.worker is not None:
            self.worker.stop()
            self.worker.join(STOP_WAIT_S)


class ChatTab:
    """Handlers of the Chat tab and the `/chat` API, bound to a `handlers.Playground` (its engine, limits, registry
    and renderer)."""

    def __init__(self, playground: Playground):
        self.playground = playground
        self.engine = playground.engine
        playground.sources["chat"] = chat_source
        # Conversations by session hash, to drop their encoder cache when their tab closes (`unload`); weak: a
        # session Gradio dropped is not kept alive here
        self.sessions: weakref.WeakValueDictionary[str, ChatState] = weakref.WeakValueDictionary()

    # -- validation ------------------------------------------------------------------------------------------------
    def settings(self, preset_name, max_new_tokens):
        """The preset's denoising settings with the visitor's token budget, within the UI's limits (ValueError)."""
        values = dict(preset_values(preset_name, self.engine.recommended), max_new_tokens=max_new_tokens)
        return build_settings(values, ui_limits=True)

    def check_thinking(self, thinking) -> bool:
        thinking = check_flag("thinking", thinking)
        if thinking and not self.engine.supports_thinking:
            raise ValueError("thinking needs a chat template with a thinking mode (enable_thinking); this model's "
                             "template has none")
        return thinking

    def check_turn(self, message, preset_name, max_new_tokens, seed, thinking) -> None:
        """Send's first step: every check of the inputs, nothing run (raises gr.Error)."""
        try:
            check_prompt(message)
            settings = self.settings(preset_name, max_new_tokens)
            self.engine.check_settings(settings)
            self.playground.check_job(Job("chat", None, settings))
            check_ui_seed(seed)
            self.check_thinking(thinking)
        except Exception as error:  # noqa: BLE001 - bad input, or a failing tokenizer: a clear message either way
            raise user_error(error) from None

    def check_regenerate(self, state: ChatState, preset_name, max_new_tokens, thinking) -> None:
        """Regenerate's first step (raises gr.Error): there must be an answer to replace."""
        chat = state.chat if state is not None else None
        if chat is None or not chat.messages or chat.messages[-1]["role"] != "assistant":
            raise user_error("nothing to regenerate: the conversation has no answer yet")
        self.check_turn("x", preset_name, max_new_tokens, -1, thinking)

    # -- events ----------------------------------------------------------------------------------------------------
    def send_stream(self, state: ChatState, message, preset_name, max_new_tokens, seed, thinking,
                    request: gr.Request = None) -> Iterator[tuple]:
        """Send: add `message` and stream the answer's denoising. Yields the tab's outputs (`build_chat_tab`:
        history, reuse note, stack, canvas, meter, heatmap, order, entropy, message box, Send, Stop, Regenerate,
        Clear). The message box is emptied once the turn is answered; a stopped turn leaves it (and the
        conversation) as they were.

        Raises:
            gr.Error: bad input or a turn that does not fit the context (before anything runs), or a failed run.
        """
        self.check_turn(message, preset_name, max_new_tokens, seed, thinking)
        settings, seed, thinking = self.settings(preset_name, max_new_tokens), check_ui_seed(seed), bool(thinking)
        text = check_prompt(message)
        yield from self._stream(state, ChatTurn(text, settings, seed, thinking, [], []), text, request)

    def regenerate_stream(self, state: ChatState, preset_name, max_new_tokens, thinking,
                          request: gr.Request = None) -> Iterator[tuple]:
        """Regenerate: answer the last message again with a new random seed, replacing the last answer (the
        prompt's encoder cache is reused). Same outputs and errors as `send_stream`."""
        self.check_regenerate(state, preset_name, max_new_tokens, thinking)
        settings, thinking = self.settings(preset_name, max_new_tokens), bool(thinking)
        text = state.chat.messages[-2]["content"]
        yield from self._stream(state, ChatTurn(None, settings, None, thinking, [], []), text, request)

    def _stream(self, state: ChatState, turn: ChatTurn, user_text: str, request) -> Iterator[tuple]:
        playground = self.playground
        regenerating = turn.text is None
        if state is None:
            state = ChatState()
        state.halt()
        chat = state.session(self.engine)
        turn.messages, turn.thoughts, turn.session = list(chat.messages), list(chat.thoughts), chat
        # the conversation before the turn (Regenerate: without its last answer), shown while the turn runs
        shown, shown_thoughts = turn.messages, turn.thoughts
        if regenerating:
            shown, shown_thoughts = shown[:-2], shown_thoughts[:-1]
        view = state.view
        view.snapshot, view.finished_html, view.stacked_blocks = None, [], -1
        session_hash = getattr(request, "session_hash", None)
        if session_hash:
            self.sessions[session_hash] = state
        key = session_key(request, state, ":chat")
        chat.last_report = chat.last_result = None
        job = Job("chat", turn, turn.settings)
        worker = state.worker = playground.start_job(job, key, receive=lambda outcome: outcome.apply(chat))
        clock = PlotClock(wait_first=True)
        try:
            for index, snap in enumerate(playground.runs.updates(worker)):
                view.snapshot = snap
                out = playground.render(view, snap, final=snap.finished, plots_due=clock.due(snap.block_count),
                                        first=index == 0)
                if not snap.finished:
                    history = gr.skip()
                    if index == 0 or isinstance(out.stack, str):  # a block was committed: the answer grew
                        history = history_html(shown, shown_thoughts, pending_user=user_text,
                                               pending_answer=out.text, cut_turns=state.cut_turns)
                    yield (history, gr.skip(), out.stack, out.canvas, out.meter, out.heatmap, out.order,
                           out.entropy, gr.skip(), *self._buttons(state, running=index == 0 or None))
                    continue
                yield self._final(state, snap, out, regenerating)
                if snap.error is not None:
                    raise user_error(snap.error)
        finally:
            playground.runs.finish(key, worker)  # on normal end, on Stop, and when Gradio closes this generator

    def _final(self, state: ChatState, snap, out, regenerating: bool) -> tuple:
        """The turn's last view. `regenerating`: Regenerate's turn, which replaces the last answer (same turn number)
        and leaves the message box alone; Send's empties it once the turn is answered."""
        chat = state.chat
        if chat is None:  # the tab closed meanwhile (`unload`): nothing to show to anyone
            return (EMPTY_CHAT_HTML, STOPPED_NOTE, *(gr.skip(),) * 7, *self._buttons(state, running=False))
        answered = (snap.error is None and snap.latest is not None and snap.latest.done
                    and snap.latest.stop_reason != "cancelled" and chat.last_report is not None)
        if answered:
            state.turns += 0 if regenerating else 1  # a regenerated answer replaces the last turn's
            state.cut_turns += chat.last_report.dropped_turns
            reuse = reuse_html(chat.last_report, state.turns, regenerated=regenerating)
        else:
            reuse = STOPPED_NOTE
        history = history_html(chat.messages, chat.thoughts, cut_turns=state.cut_turns)
        message = gr.update(value="") if answered and not regenerating else gr.skip()
        return (history, reuse, out.stack, out.canvas, out.meter, out.heatmap, out.order, out.entropy, message,
                *self._buttons(state, running=False))

    @staticmethod
    def _buttons(state: ChatState, running: bool | None) -> tuple:
        """(Send, Stop, Regenerate, Clear) updates: None leaves them as they are (each update costs a config
        rebuild on the server)."""
        if running is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        if running:
            return (gr.update(interactive=False), gr.update(interactive=True), gr.update(interactive=False),
                    gr.update(interactive=False))
        chat = state.chat
        answer = chat is not None and bool(chat.messages) and chat.messages[-1]["role"] == "assistant"
        return (gr.update(interactive=True), gr.update(interactive=False), gr.update(interactive=answer),
                gr.update(interactive=True))

    def unload(self, request: gr.Request) -> None:
        """A browser tab closed: stop its turn (the playground's registry does too) and drop its conversation and
        encoder cache at once, rather than when Gradio drops the session's state."""
        state = self.sessions.pop(getattr(request, "session_hash", None) or "", None)
        if state is not None:
            state.halt()
            state.chat = None
            state.view.release()

    @staticmethod
    def stop(state: ChatState) -> None:
        """Stop: the turn in progress ends within one decoder forward; its stream shows the final view (the
        conversation stays as it was before the turn)."""
        if state is not None:
            state.stop()

    def clear(self, state: ChatState) -> tuple:
        """Clear: forget the conversation and its encoder cache; the tab's outputs as before the first turn."""
        if state is not None:
            state.halt()
            if state.chat is not None:
                state.chat.clear()
            state.turns = state.cut_turns = 0
            state.view.snapshot = None
        return (EMPTY_CHAT_HTML, IDLE_REUSE_HTML, "", CHAT_EMPTY_CANVAS_HTML, meter_html(None, note=IDLE_METER_NOTE),
                plots.confidence_heatmap([]), plots.unmasking_order(None), plots.entropy_and_acceptance([]),
                gr.skip(), *self._buttons(state or ChatState(), running=False))

    # -- API -------------------------------------------------------------------------------------------------------
    async def chat_api(self, message, history, system, thinking, max_new_tokens, max_denoising_steps, entropy_bound,
                       t_min, t_max, stability_threshold, confidence_threshold, adaptive_stopping, seed,
                       request: gr.Request = None) -> tuple[str, dict]:
        """`/chat`: answer `message` after `history` (JSON text, `parse_history`) with an optional `system` message.

        The settings and seed are `/generate`'s (same checks, the API's limits). Returns (answer, summary): the
        summary has `/generate`'s keys (`API_SUMMARY_KEYS`, `thought` the thought channel shown apart), `report`
        (`TurnReport.to_dict()`: within one call the whole history is encoded; history cut to fit the context is
        said in `note`) and `history`, the conversation with this turn (send it back as JSON for the next one).

        Raises:
            gr.Error: invalid input (named), a turn that does not fit the context, or a failed run.
        """
        chat = None

        def start() -> RunWorker:
            nonlocal chat
            try:
                run = Playground.parse(message, False, max_new_tokens, max_denoising_steps, entropy_bound, t_min,
                                       t_max, stability_threshold, confidence_threshold, adaptive_stopping, seed,
                                       ui_limits=False, thinking=thinking)
                self.check_thinking(run.thinking)
                if system is not None and not isinstance(system, str):
                    raise ValueError("system must be text")
                chat = ChatSession(self.engine, system=system if system and system.strip() else None)
                earlier = parse_history(history)
                chat.messages = chat.messages + earlier
                chat.thoughts = ["" for m in earlier if m["role"] == "assistant"]
                turn = ChatTurn(run.prompt, run.settings, run.seed, run.thinking, chat.messages, chat.thoughts)
                job = Job("chat", turn, run.settings)
                self.playground.check_job(job)
            except Exception as error:  # noqa: BLE001
                raise user_error(error) from None
            return self.playground.start_job(job, keep_history=False, receive=lambda outcome: outcome.apply(chat))

        snap = await self.playground.served(start, request)
        if snap.error is not None:
            raise user_error(snap.error)
        if chat.last_result is None:
            raise user_error("the turn was stopped before its answer was complete")
        result = chat.last_result.to_dict()
        summary = {key: result[key] for key in API_SUMMARY_KEYS}
        summary["report"] = chat.last_report.to_dict()
        summary["history"] = [m for m in chat.messages if m["role"] != "system"]
        return plain_text(result["text"]), summary


IDLE_METER_NOTE = "engine clock \u00b7 press Send to start"

"""The Playground tab: prompt and settings, Generate and Stop, the presets and `/generate`.

Its run step streams the run's frames to the page's player (`feed.py`, `assets/replay/live.js`), which draws the
canvas, meter and plots in the browser. Its panels (step-through, keep and replay, branch, the presenter) have
modules of their own and are wired here.
"""

import contextlib
import time
from pathlib import Path
from collections.abc import Iterator, Sequence

import gradio as gr
from gradio.context import LocalContext

from engine import PRESET_NAMES
from engine.settings import SETTING_NAMES, draw_seed, parse_number
from engine.trace import PLOTLY_GZ

from .branch_tab import BranchTab
from .canvas_view import EMPTY_CANVAS_HTML, legend_html, thought_html
from .feed import frames_message, meter_message, run_key
from .hub import RUN_INPUT_NAMES, Job
from .live_view import refused_meter
from .keep import KeepHandlers, build_keep_controls, wire_keep, wire_presenter
from .meter import meter_html, run_meter_html, waiting_meter_html
from .runs import STOP_WAIT_S, RunSnapshot, session_key, wait_all
from .session import SessionState
from .step_through import StepThroughHandlers, build_step_controls, reset_note_on, wire_step_through
from .tab import (PRIVATE, UNQUEUED, Tab, api_run, buttons, checked, describe_error, refusal_box, run_buttons,
                  seed_box, setting_control, setting_params, user_error)
from .text import plain_text, prose
from .validation import CUSTOM_PRESET, MAX_PROMPT_CHARS, PRESET_FIELDS, RunRequest, preset_values

SETTING_ROWS = (("max_new_tokens",), ("max_denoising_steps",), ("entropy_bound",), ("t_min", "t_max"),
                ("adaptive_stopping",), ("stability_threshold", "confidence_threshold"))  # side by side in a row
STOP_FLUSH_S = 0.1  # Stop's final view waits this long after the stream's end
PLAYER_HTML = Path(__file__).resolve().parent.parent / "assets" / "replay" / "live.html"


def player_html(plotly_url: str) -> str:
    """The player's static skeleton (the browser draws into it): meter, controls, legend, stack and canvas."""
    return PLAYER_HTML.read_text(encoding="utf-8").split("-->", 1)[1].format(
        plotly=plotly_url, meter=meter_html(None), legend=legend_html(), canvas=EMPTY_CANVAS_HTML)


def setting_rows() -> tuple[tuple[str, ...], ...]:
    """`SETTING_ROWS`, then a row of its own for each setting it leaves out, in the settings table's order."""
    placed = {name for row in SETTING_ROWS for name in row}
    return (*SETTING_ROWS, *((name,) for name in SETTING_NAMES if name not in placed))


PLOTS_HTML = ('<div id="dg-plots"><div id="dg-heatmap" class="dg-plot"></div><div class="dg-plot-row">'
              '<div id="dg-order" class="dg-plot"></div><div id="dg-entropy" class="dg-plot"></div></div></div>')


class PlaygroundTab(Tab):
    """The Playground tab on the app's `hub`."""

    title = "Playground"

    def request_run(self, session: SessionState, *inputs) -> tuple:
        """A run trigger: its inputs checked once (gr.Error), a ticket that carries the checked request to the run
        step (stopping the session's run), the queued meter and the buttons."""
        run = self.hub.checked_request(dict(zip(RUN_INPUT_NAMES, inputs)), ui_limits=True)
        if session is None:
            return "", gr.skip(), gr.skip(), gr.skip()
        replacing = session.run_in_progress
        ticket = session.claim()
        session.pending = (ticket, run)
        return str(ticket), meter_message(waiting_meter_html(replacing=replacing)), *buttons(True)

    @staticmethod
    def refused(session: SessionState):
        """After a refusal: the meter of the session's last run marked as refused (skipped: none, or running)."""
        meter = refused_meter(session)
        return meter if not isinstance(meter, str) else meter_message(meter)

    def outputs(self, session: SessionState, snap: RunSnapshot, *, final: bool, text: bool) -> tuple:
        """(feed, text, thought, Generate, Stop) for `snap`: its frames not yet sent; the text if `text`."""
        frames = snap.frames()
        error = f"The run failed: {describe_error(snap.error)}" if final and snap.error is not None else ""
        message = frames_message(self.engine, session.request, frames, session.sent, final=final, error=error)
        session.sent = len(frames)
        skip = gr.skip()
        words = thought = skip
        if text or final:
            words = thought = ""
            if snap.latest is not None:
                result = self.engine.summarize(snap.latest, snap.frames_seen)
                words, thought = plain_text(result.text), thought_html(result.thought)
        if message is None and final:
            message = meter_message(meter_html(None, note=prose("no-forward")), error=error)
        elif message is None and snap.latest is None:  # out of the queue, before the first forward
            message = meter_message(run_meter_html(None, final=False))
        feed = skip if message is None else message
        run_button, stop_button = buttons(False) if final else (skip, skip)
        return feed, words, thought, run_button, stop_button

    def generate_stream(self, session: SessionState, ticket, request: gr.Request = None) -> Iterator[tuple]:
        """The run step of the request `ticket` carries: the run's frames to the feed as they come, the text with
        each committed block; nothing if the ticket went stale; gr.Error when the run fails."""
        request = request or LocalContext.request.get(None)
        ticket = parse_number(ticket)
        pending = session.pending if session is not None else None
        if pending is None or ticket is None or pending[0] != ticket or not session.is_current(ticket):
            return
        run = pending[1]
        key = session_key(request, session)
        worker = self.hub.start_job(Job("generate", run, run.settings))
        if not session.begin(worker, ticket):
            return
        session.request, session.trace, session.pending = run, None, None  # what `keep` exports as the trace
        ticket = session.running_ticket
        self.hub.sessions[key] = session
        self.hub.runs.register(key, worker)
        blocks = -1
        try:
            for snap in self.hub.runs.updates(worker):
                if not session.is_current(ticket):
                    return  # a newer run or Stop owns the page now
                session.snapshot = snap
                yield self.outputs(session, snap, final=snap.finished, text=snap.block_count != blocks)
                blocks = snap.block_count
                if snap.finished and snap.error is not None:
                    raise user_error(snap.error)
        finally:  # also when Gradio closes or cancels this generator
            self.hub.runs.finish(key, worker)
            session.end_stream(worker)

    def stop(self, session: SessionState) -> tuple:
        """The Stop button: stop the session's run and send what the stream had not, once the run and its stream
        ended or `STOP_WAIT_S` passed (a queued run left the queue)."""
        skip = gr.skip()
        if session is None:
            return skip, skip, skip, *buttons(False)
        worker = session.withdraw()
        stepped = session.step_run
        if worker is None and stepped is not None and not stepped.done:  # a "Run to end": StepThroughHandlers.pause
            return (skip,) * 5
        if worker is None:
            return meter_message(meter_html(None, note="left the queue: nothing ran")), skip, skip, *buttons(False)
        wait_all(STOP_WAIT_S, worker.join, session.wait_for_stream)  # nothing the stream sent may come after this
        time.sleep(STOP_FLUSH_S)
        session.snapshot = snap = worker.snapshot()
        return self.outputs(session, snap, final=True, text=True)

    def catch_up(self, session: SessionState, have) -> str:
        """The feed message a page that holds `have` ("key:count") lacks of the session's run or trace (a stepped
        run's as its steps send it: shown at once, final once done)."""
        frames, trace = self.shown_frames(session)
        if not frames:
            return gr.skip()
        held, _, count = str(have or "").partition(":")
        start = int(count) if held == run_key(frames) and count.isdigit() else 0
        stepped = session.step_run is not None and session.step_run.request is session.request
        final = trace is not None or (session.step_run.done if stepped else not session.run_in_progress)
        return frames_message(self.engine, session.request, frames, start, final=final, trace=trace,
                              autoplay=not stepped) or gr.skip()

    @staticmethod
    def shown_frames(session: SessionState | None) -> tuple[list, object]:
        """The frames the page's player shows: the session's stepped or streamed run, or its loaded trace."""
        if session is None:
            return [], None
        if session.trace is not None and session.request is None:
            return list(session.trace.frames), session.trace
        snap = session.snapshot
        return (snap.frames() if snap is not None else []), None

    def apply_preset(self, name) -> tuple:
        """Preset `name`'s `PRESET_FIELDS` values (skips for "custom"; gr.Warning: unknown)."""
        try:
            if name != CUSTOM_PRESET:
                return tuple(preset_values(name, self.engine.recommended).values())
        except ValueError as error:
            gr.Warning(str(error))
        return (gr.skip(),) * len(PRESET_FIELDS)

    async def generate_api_served(self, *inputs, request: gr.Request = None) -> tuple[str, dict]:
        """`/generate` as served (inputs as `RUN_INPUT_NAMES` without `thinking`): stopped once its client goes
        away."""
        def job() -> Job:
            run = self.hub.checked_request(dict(zip(RUN_INPUT_NAMES, inputs)), ui_limits=False)
            return Job("generate", run, run.settings)

        return self.hub.api_result(await api_run(self.hub, job, request, keep_history=False))

    def build(self, page) -> None:
        """The tab's components and events inside its `gr.Tab`; `page` as `blocks.Page`."""
        engine, session = self.engine, page.session
        with gr.Row(elem_id="dg-main"):
            with gr.Column(min_width=0, elem_id="dg-controls"):
                prompt = gr.Textbox(
                    label="Prompt", lines=3, max_lines=8, elem_id="dg-prompt", value=page.default_prompt,
                    info=f"Shift+Enter generates; Enter adds a line; at most {MAX_PROMPT_CHARS:,} characters",
                    placeholder="Type a prompt, or pick an example")
                raw = gr.Checkbox(label="Raw prompt (no chat template: continue the text as is)", elem_id="dg-raw",
                                  info=prose("raw-info"))
                thinking = gr.Checkbox(label="Think first (the answer follows a thought, shown apart)",
                                       visible=engine.supports_thinking, elem_id="dg-thinking")
                with gr.Row(elem_id="dg-buttons"):
                    generate, stop = run_buttons("Generate", "dg-generate", "dg-stop")
                refusal = refusal_box("playground")
                step_controls = build_step_controls()
                with gr.Row(elem_id="dg-preset-row", equal_height=True):
                    preset_box = gr.Dropdown([*PRESET_NAMES, CUSTOM_PRESET], value="recommended", label="Preset",
                                             elem_id="dg-preset", scale=2, min_width=150)
                with gr.Row(elem_id="dg-seed-row", equal_height=True):
                    seed = seed_box("dg-seed", scale=2, min_width=200)
                    dice = gr.Button("Random", elem_id="dg-dice", scale=0, min_width=76)
            with gr.Column(min_width=0, elem_id="dg-settings-col"):
                with gr.Accordion("Denoising settings", elem_id="dg-settings"):
                    controls = {}
                    for names in setting_rows():
                        pair = {"min_width": 120} if len(names) > 1 else {}
                        with gr.Row() if pair else contextlib.nullcontext():
                            for name in names:
                                controls[name] = setting_control(name, getattr(engine.recommended, name), **pair)
                gr.Examples(page.examples, inputs=[prompt, raw], label="Examples: click one to fill the prompt",
                            examples_per_page=len(page.examples),
                            example_labels=[f"{p}  \u00b7  {'raw' if r else 'chat'}" for p, r in page.examples])
            with gr.Column(min_width=0, elem_id="dg-output"):
                live = gr.HTML(player_html(page.file_url(PLOTLY_GZ)), elem_id="dg-live")
                thought = gr.HTML("", elem_id="dg-thought")
                text = gr.Textbox(label="Generated text", lines=3, max_lines=12, interactive=False,
                                  buttons=["copy"], elem_id="dg-text", placeholder=prose("text-placeholder"))
                gr.HTML(PLOTS_HTML, elem_id="dg-plots-block")
                present = gr.Button("Present: full screen, for a class", elem_id="dg-present", size="sm")
                keep_controls = build_keep_controls()
                BranchTab(self.hub).build(session)
        with gr.Accordion("How it works", open=False, elem_id="dg-explainer"):
            gr.Markdown(page.explainer)

        feed = gr.Textbox(visible="hidden", elem_id="dg-feed")
        feed.change(None, [feed], js="(message) => window.dgLive.feed(message)", **PRIVATE)
        have = gr.Textbox(visible="hidden", elem_id="dg-feed-have")
        poll = gr.Button(visible="hidden", elem_id="dg-feed-poll")
        poll.click(self.catch_up, inputs=[session, have], outputs=[feed], js="(s, h) => [s, window.dgLive.have()]",
                   queue=False, **UNQUEUED)
        run_inputs = [prompt, raw, *(controls[name] for name in SETTING_NAMES), seed, thinking]
        stream_outputs = [feed, text, thought, generate, stop]
        ticket = gr.Textbox(visible=False, elem_id="dg-ticket")  # which checked request of the session runs
        # "multiple": a trigger during a run restarts it (only the newest ticket's step runs)
        requested = checked([generate.click, prompt.submit], self.request_run, box=refusal,
                            inputs=[session, *run_inputs], outputs=[ticket, feed, generate, stop],
                            refused=self.refused, refused_inputs=[session], refused_outputs=[feed],
                            trigger_mode="multiple")
        run_step = requested.success(self.generate_stream, inputs=[session, ticket], outputs=stream_outputs,
                                     api_visibility="private", concurrency_id="engine", show_progress="full",
                                     show_progress_on=[live], trigger_mode="multiple")
        # Stop also cancels the run step, so a queued run leaves the queue
        stop.click(None, js="() => window.dgLive.pause()", **PRIVATE)
        stopped = stop.click(self.stop, inputs=[session], outputs=stream_outputs, cancels=[run_step], **UNQUEUED)
        stepped = wire_step_through(step_controls, StepThroughHandlers(self.hub), session, run_inputs,
                                    stream_outputs, stop_button=stop, box=refusal)
        keep = KeepHandlers(self.hub)  # a run is kept however it ended
        wire_keep(keep_controls, keep, session, feed, text, [run_step, stopped, *stepped],
                  replay_button=step_controls.replay, box=refusal)
        reset_note_on(step_controls, [requested.success, keep_controls.upload.upload])
        wire_presenter(present)
        dice.click(lambda: str(draw_seed()), outputs=[seed], **UNQUEUED)
        presets = [controls[name] for name in PRESET_FIELDS]
        preset_box.change(self.apply_preset, inputs=[preset_box], outputs=presets, **UNQUEUED)
        for setting in presets:  # edited by hand: no longer a named preset
            setting.input(None, None, preset_box, js=f"() => {CUSTOM_PRESET!r}", **PRIVATE)
        if engine.supports_thinking:  # thinking needs the chat template: Raw and Think first exclude each other
            raw.input(None, [raw, thinking], [thinking], js="(r, t) => (r ? false : t)", **PRIVATE)
            thinking.input(None, [raw, thinking], [raw], js="(r, t) => (t ? false : r)", **PRIVATE)
        self.keep = keep

    def endpoints(self, page) -> Sequence[tuple]:
        """`/generate` and `/export`: (name, handler, parameters, returns, doc) rows for `tab.register_api`."""
        run = [("prompt", str, page.required), ("raw", bool, False), *setting_params(self.engine.recommended),
               ("seed", int, -1)]
        return [("generate", self.generate_api_served, run, tuple[str, dict], prose("api-generate")),
                ("export", self.keep.export_served, run, dict, prose("api-export"))]

    def unload(self, request: gr.Request) -> None:
        self.hub.unload(request)


"""Step-through: one decoder forward per "Next step", the rest with "Run to end", from the engine's frame generator
kept between clicks; new acceptances are outlined."""

import threading
from collections import namedtuple
from collections.abc import Iterator
from dataclasses import dataclass, field

import gradio as gr

from engine import Frame

from .feed import frames_message
from .hub import RUN_INPUT_NAMES
from .runs import RunRecord
from .session import SessionState
from .tab import PRIVATE, UNQUEUED, Tab, noted, user_error
from .text import plain_text, plural, prose


@dataclass
class StepRun:
    """One stepped run: request, frame generator, frames so far and a lock (one forward at a time)."""

    request: object
    frames: Iterator[Frame]
    record: RunRecord = field(default_factory=RunRecord)
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False
    pause: threading.Event = field(default_factory=threading.Event)  # set by Stop during "Run to end"

    def close(self) -> None:
        """Stop the run and free its KV cache."""
        self.done = True
        getattr(self.frames, "close", lambda: None)()


def step_note(frame: Frame) -> str:
    """One line on what `frame`'s forward did (plain text)."""
    return prose("step-forward").format(forward=frame.forward_index + 1, block=frame.block_index + 1,
                                        step=frame.step_index + 1, accepted=plural(frame.accepted_count, "position"),
                                        new=frame.first_accepted_step.count(frame.step_index))


class StepThroughHandlers(Tab):
    """"Next step" and "Run to end", the run kept in `session.step_run`."""

    def _step_run(self, session: SessionState, inputs) -> StepRun:
        """The session's stepped run, or a new one for `inputs` if it has none (or it was superseded)."""
        run = session.step_run
        if run is not None and not run.done and session.request is run.request:
            return run
        if session.run_in_progress:
            raise user_error("A run is in progress: stop it before stepping through one.")
        if run is not None:
            run.close()
        request = self.hub.checked_request(dict(zip(RUN_INPUT_NAMES, inputs)), ui_limits=True)
        session.step_run = StepRun(request=request, frames=self.hub.step_frames(request))
        session.request, session.trace = request, None
        session.clear_views()
        return session.step_run

    def _advance(self, session: SessionState, run: StepRun, stop_button=None) -> tuple:
        with run.lock:
            try:
                frame = None if run.done else next(run.frames, None)
            except Exception as error:  # noqa: BLE001 - one clear message, the run is over
                run.close()
                raise user_error(f"The run failed: {type(error).__name__}: {error}") from None
            if frame is None:
                run.done = True
            else:
                run.record.add(frame)
                if frame.done:
                    run.done = True
                    run.record.finish()
            return self._render(session, run, stop_button)

    def _render(self, session: SessionState, run: StepRun, stop_button=None) -> tuple:
        """The stream outputs (the new frames to the page's player, which shows the newest; Generate skipped,
        Stop unless `stop_button` given) and the note."""
        session.snapshot = snap = run.record.snapshot()
        frames = snap.frames()
        message = frames_message(self.engine, run.request, frames, session.sent, final=run.done, autoplay=False)
        session.sent = len(frames)
        skip = gr.skip()
        text = thought = skip
        latest = snap.latest
        if run.done and latest is not None:
            text = plain_text(self.engine.summarize(latest, snap.frames_seen).text)
        note = step_note(latest) if latest is not None else ""
        return (skip if message is None else message, text, thought, skip,
                skip if stop_button is None else stop_button, note)

    def next_step(self, session: SessionState, *inputs) -> tuple:
        """"Next step": one forward (a new run from `inputs` if none); gr.Error: bad input, a run going, failed."""
        return self._advance(session, self._step_run(session, inputs))

    def run_to_end(self, session: SessionState, *inputs) -> Iterator[tuple]:
        """"Run to end": the remaining forwards, each sent as it comes."""
        run = self._step_run(session, inputs)
        run.pause.clear()
        while not run.done and not run.pause.is_set():
            yield self._advance(session, run, gr.update(interactive=True))
        with run.lock:
            yield self._render(session, run, stop_button=gr.update(interactive=False))

    def pause(self, session: SessionState) -> tuple:
        """Stop during "Run to end": pause after the forward in progress (skips without one)."""
        run = session.step_run if session is not None else None
        if run is None or run.done:
            return (gr.skip(),) * 6  # the stream outputs and the note
        run.pause.set()
        with run.lock:
            rendered = self._render(session, run, stop_button=gr.update(interactive=False))
        latest = session.snapshot.latest
        note = rendered[-1] if latest is None else prose("step-paused").format(latest.forward_index + 1)
        return (*rendered[:-1], note)


StepControls = namedtuple("StepControls", "next_step run_to_end replay note")  # buttons and the step note


def build_step_controls() -> StepControls:
    with gr.Row(elem_id="dg-step-buttons"):
        next_step = gr.Button("Next step", elem_id="dg-next-step", size="sm", scale=1)
        run_to_end = gr.Button("Run to end", elem_id="dg-run-to-end", size="sm", scale=1)
        replay = gr.Button("\u25b6 Replay", elem_id="dg-replay-run", size="sm", scale=1, interactive=False)
    note = gr.Markdown(prose("step-note"), elem_id="dg-step-note")
    return StepControls(next_step, run_to_end, replay, note)


def wire_step_through(controls: StepControls, steps, session, run_inputs: list, stream_outputs: list,
                      stop_button: gr.Button, box) -> list:
    """Wire "Next step" and "Run to end" in the engine's slot, refusals in `box`; `stop_button` pauses "Run to end".
    Their events."""
    stepped = [noted(button.click, handler, box, inputs=[session, *run_inputs],
                     outputs=[*stream_outputs, controls.note], concurrency_id="engine", trigger_mode="once", **PRIVATE)
               for button, handler in ((controls.next_step, steps.next_step), (controls.run_to_end, steps.run_to_end))]
    stop_button.click(steps.pause, inputs=[session], outputs=[*stream_outputs, controls.note], **UNQUEUED)
    return stepped


def reset_note_on(controls: StepControls, listeners) -> None:
    """Put the step note back to its help text on each of `listeners` (another run took the canvas)."""
    for listener in listeners:
        listener(lambda: prose("step-note"), outputs=[controls.note], **UNQUEUED)

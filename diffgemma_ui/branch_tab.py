"""Branch from a step: pick a forward of the last run or an uploaded trace, pin tokens, redo the run from that
forward and show the branch beside the original with the share of positions changed."""

from typing import NamedTuple

import gradio as gr

from engine import DiffusionSettings, Frame
from engine.infill import branch_frames, changed_share
from engine.settings import draw_seed, parse_seed
from engine.trace import ModelInfo

from .canvas_view import block_html
from .hub import Job
from .runs import session_key
from .tab import PRIVATE, Tab, describe_error, refusal_html
from .text import escape_html, prose


class BranchJob(NamedTuple):
    """A "branch" job's payload: the run's prompt ids, the forward's frame it branches from, pins (position ->
    token id), the run's settings and the seed."""

    prompt_ids: tuple[int, ...]
    frame: Frame
    pins: dict[int, int]
    settings: DiffusionSettings
    seed: int


def branch_source(engine, payload: BranchJob, stop):
    """The "branch" frame source of `payload`."""
    return branch_frames(engine, payload.prompt_ids, payload.frame, payload.pins, payload.settings,
                         seed=payload.seed, stop_event=stop)


def parse_pins(text, frame: Frame, tokenizer) -> dict[int, int]:
    """Pins as position -> token id from `;`-separated `position` (keep `frame`'s draft token) or `position=word`
    (the word's tokens from there); ValueError: a malformed pin, one off the canvas, or two on one position."""
    n, pinned = frame.canvas_length, {}  # position -> (token id, the pin that set it)
    for item in filter(None, (part.strip() for part in str(text or "").split(";"))):
        where, typed, word = item.partition("=")
        if not where.strip().isdigit():
            raise ValueError(f"a pin is `position` or `position=word`, got {item!r}")
        position = int(where)
        ids = tokenizer(word, add_special_tokens=False).input_ids if typed else [frame.draft_ids[min(position, n - 1)]]
        if position >= n or not ids or position + len(ids) > n:
            raise ValueError(f"pin {item!r} must hold at least one token and fit the canvas (positions 0-{n - 1})")
        for at, token in enumerate(ids, start=position):
            if at in pinned:
                raise ValueError(f"position {at} is pinned twice: {pinned[at][1]!r} and {item!r}")
            pinned[at] = token, item
    return {at: token for at, (token, _) in pinned.items()}


class BranchTab(Tab):
    """The "Branch from a step" controls and handlers."""

    sources = {"branch": branch_source}

    def build(self, session) -> None:
        """Create and wire the controls (a closed accordion) in the current Blocks."""
        with gr.Accordion("Branch from a step", open=False, elem_id="dg-branch") as accordion:
            gr.Markdown(prose("branch-help"))
            forward = gr.Slider(1, 2, value=1, step=1, label="Branch from decoder forward", elem_id="dg-branch-step")
            start = gr.HTML("", elem_id="dg-branch-from")
            with gr.Row():
                pins = gr.Textbox(label="Pins", placeholder="12; 30= the", max_lines=1, elem_id="dg-branch-pins",
                                  scale=3)
                seed = gr.Textbox(label="Seed", placeholder="the run's", max_lines=1, max_length=24, scale=1,
                                  elem_id="dg-branch-seed")
                run = gr.Button("Branch", variant="primary", elem_id="dg-branch-run", scale=1)
            box = gr.HTML("", elem_id="dg-branch-refusal", elem_classes=["dg-refusal-box"])
            result = gr.HTML("", elem_id="dg-branch-result")
        picked = [forward, start, pins]
        accordion.expand(lambda s: self.pick(s, None), inputs=[session], outputs=picked, **PRIVATE)
        forward.input(self.pick, inputs=[session, forward], outputs=picked, trigger_mode="always_last", **PRIVATE)
        run.click(self.branch, inputs=[session, forward, pins, seed], outputs=[result, box], concurrency_id="engine",
                  trigger_mode="once", **PRIVATE)

    def pick(self, session, forward) -> tuple:
        """The forward slider (None: the last forward): its range, that forward's block, no pins."""
        trace = session.trace if session is not None else None
        if trace is None:
            return gr.update(), f'<p class="dg-status">{prose("branch-none")}</p>', ""
        count = len(trace.frames)
        k = max(1, min(count, int(forward or count)))
        frame = trace.frames[k - 1]
        return gr.update(maximum=max(2, count), value=k), block_html(frame, live=not frame.block_done), ""

    def branch(self, session, forward, pins_text, seed, request: gr.Request = None):
        """The Branch button: yields (the original and the branch side by side, the refusal box)."""
        trace = session.trace if session is not None else None
        try:
            if trace is None or session.run_in_progress:
                raise ValueError("Nothing to branch from: generate (and let the run finish), or upload one.")
            if (trace.model.name, trace.model.canvas_length) != (ModelInfo.of(self.engine).name,
                                                                 self.engine.canvas_length):
                raise ValueError(f"this trace is of {trace.model.name}: branch it where that model is loaded")
            frame = trace.frames[max(1, min(len(trace.frames), int(forward or len(trace.frames)))) - 1]
            pins = parse_pins(pins_text, frame, self.engine.tokenizer)
            typed = str(seed or "").strip()
            seed = frame.seed if not typed else parse_seed(typed)
            job = Job("branch", BranchJob(tuple(trace.prompt_ids), frame, pins, trace.settings,
                                          draw_seed() if seed is None else seed), trace.settings)
            self.hub.check_job(job)
        except ValueError as error:
            yield gr.skip(), refusal_html(str(error))
            return
        original = [f for f in trace.frames if f.block_index == frame.block_index][-1]
        key = session_key(request, session, ":branch")
        worker = self.hub.start_job(job, key)
        try:
            for snap in self.hub.runs.updates(worker):
                if snap.error is not None:
                    yield gr.skip(), refusal_html(describe_error(snap.error))
                elif snap.latest is not None:
                    yield self.view(original, snap, frame, pins), ""
        finally:
            self.hub.runs.finish(key, worker)

    def view(self, original: Frame, snap, start: Frame, pins: dict[int, int]) -> str:
        """The original block and the branch's first block side by side, the share changed, the branch's text."""
        end = snap.blocks[0][-1]
        share = changed_share(original.draft_ids, end.draft_ids)
        fixed = [p in pins for p in range(end.canvas_length)]
        text = escape_html(self.engine.summarize(snap.latest, snap.frames_seen).text)
        own = " (the run's own draws)" if end.seed == start.seed else " (new draws from there on)"
        return (f'<div class="dg-branch" data-changed="{share:.4f}" data-done="{str(snap.finished).lower()}"><p>'
                f"Branch from forward {start.forward_index + 1} (block {start.block_index + 1}, step "
                f"{start.step_index + 1}) \u00b7 seed {end.seed}{own} \u00b7 {len(pins)} pinned \u00b7 "
                f"<b>{share:.0%} of the block's positions changed</b>{'' if end.block_done else ' so far'}</p>"
                f'<div class="dg-branch-pair"><section><h4>Original</h4>{block_html(original, live=False)}</section>'
                f"<section><h4>Branch</h4>{block_html(end, live=not end.block_done, fixed=fixed)}</section></div>"
                f'<p class="dg-branch-text">Branch text: {text}</p></div>')

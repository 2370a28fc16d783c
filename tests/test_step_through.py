"""Step-through mode: stepped runs give a normal run's tokens, the newly accepted positions are outlined, and the
page's Next step / Run to end buttons work. Screenshots go to artifacts/step/."""

from __future__ import annotations

import re
from pathlib import Path

import gradio as gr
import pytest

from diffgemma_ui.handlers import Playground
from diffgemma_ui.keep import KeepHandlers
from diffgemma_ui.session import SessionState
from diffgemma_ui.step_through import StepThroughHandlers, newly_accepted_style
from pages import open_page, record_states, recorded_states, set_number
from synthetic import synthetic_frame

pytestmark = pytest.mark.slow
SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "step"
# prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold,
# confidence_threshold, adaptive_stopping, seed
INPUTS = ("In the beginning", True, 128, 3, 0.5, 0.4, 0.8, 1, 0.05, True, 5)


@pytest.fixture(scope="module")
def steps(engine):
    return StepThroughHandlers(Playground(engine))


def test_newly_accepted_style_outlines_by_position_only():
    frame = synthetic_frame(8, [f"<b>{i}" for i in range(8)], step=2,
                            first_accepted_step=[2, -1, 0, 2, -1, -1, 1, 2])
    style = newly_accepted_style(frame)
    assert re.findall(r"nth-child\((\d+)\)", style) == ["1", "4", "8"]
    assert "<b>" not in style
    assert newly_accepted_style(synthetic_frame(8, ["x"] * 8, block_done=True)) == ""


def test_stepping_gives_the_tokens_of_a_normal_run(steps, engine):
    session = SessionState()
    outputs = steps.next_step(session, *INPUTS)
    assert 'data-forward="0"' in outputs[1] and "forward 1:" in outputs[-1]
    assert outputs[7].get("visible") is False  # the block slider, hidden until the run ends
    outputs = steps.next_step(session, *INPUTS)
    assert 'data-forward="1"' in outputs[1]
    assert session.snapshot.frames_seen == 2 and session.request.seed == 5
    renders = list(steps.run_to_end(session, *INPUTS))
    last = session.snapshot.latest
    assert last.done and session.snapshot.frames_seen == 2 + len(renders) - 1  # one render a forward, then Stop off
    assert renders[-1][9]["interactive"] is False and all(r[9]["interactive"] for r in renders[:-1])
    direct = engine.generate("In the beginning", session.request.settings, raw=True, seed=5)
    assert last.committed_ids == direct.token_ids
    assert session.snapshot.frames_seen == direct.forwards
    assert renders[-1][7].get("visible") is True  # two blocks: the slider shows
    again = steps.next_step(session, *INPUTS)  # a finished stepped run: the next click starts a new one
    assert 'data-forward="0"' in again[1] and again[7].get("visible") is False
    assert again[8] == outputs[8] and again[9] == outputs[9]  # Generate and Stop left as they are


def test_stepping_is_not_refused_on_zero_gpu(steps, monkeypatch):
    """On ZeroGPU each step is a GPU call (tests/test_spaces.py runs it in the emulated GPU process): the tab is
    no longer refused there."""
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    session = SessionState()
    outputs = steps.next_step(session, *INPUTS)
    assert session.step_run is not None and "forward 1:" in outputs[-1]


def set_up_two_blocks_of_six_forwards(page):
    """Raw "The", 128 tokens, 6 steps, adaptive stopping off: with seed 0 the embedded model (v2) writes two blocks."""
    page.fill("#dg-prompt textarea", "The")
    page.check("#dg-raw input[type=checkbox]")
    set_number(page, "Max new tokens", 128)
    set_number(page, "Max denoising steps", 6)
    page.get_by_label("Adaptive stopping").uncheck()


def test_step_buttons_on_the_page(browser, served_app):
    page, problems = open_page(browser, served_app[1])
    try:
        set_up_two_blocks_of_six_forwards(page)
        page.click("#dg-next-step")
        page.wait_for_selector("#dg-canvas .dg-canvas[data-forward='0']", timeout=60_000)
        page.click("#dg-next-step")
        page.wait_for_selector("#dg-canvas .dg-canvas[data-forward='1']", timeout=60_000)
        assert "forward 2: block 1, step 2" in page.inner_text("#dg-step-note")
        outlined = page.evaluate("""Array.from(document.querySelectorAll('#dg-canvas .dg-chip'))
            .filter(c => getComputedStyle(c).outlineStyle === 'solid').length""")
        note = page.inner_text("#dg-step-note")
        assert outlined == int(re.search(r"(\d+) for the first time", note).group(1))
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "step2.png"), full_page=True)
        page.click("#dg-run-to-end")
        page.wait_for_selector("#dg-meter .dg-meter[data-state=done]", timeout=120_000)
        assert page.locator("#dg-stack .dg-block").count() == 2
        page.wait_for_function("!document.querySelector('#dg-replay-run').disabled", timeout=30_000)  # kept too
        page.screenshot(path=str(SHOTS / "end.png"), full_page=True)
        stepped = page.inner_text("#dg-step-note")
        page.click("#dg-generate")  # a normal run takes over: the note no longer speaks of the stepped run
        page.wait_for_function(f"!document.querySelector('#dg-step-note').innerText.includes({stepped!r})",
                               timeout=30_000)
        assert page.inner_text("#dg-step-note").startswith("Step through a run")
        page.wait_for_selector("#dg-meter .dg-meter[data-state=done]", timeout=120_000)
        assert page.inner_text("#dg-step-note").startswith("Step through a run")
        page.screenshot(path=str(SHOTS / "generate-after-steps.png"), full_page=True)
        assert problems == []
    finally:
        page.close()


# [the canvas's forward, finished blocks in the stack, the meter's state]
PLAYGROUND_STATE = """() => [Number(document.querySelector('#dg-canvas .dg-canvas')?.dataset.forward ?? -1),
    document.querySelectorAll('#dg-stack .dg-block-done').length,
    document.querySelector('#dg-meter .dg-meter')?.dataset.state ?? '']"""
# whether the recorded states went back to forward 0 with no finished block and from there on to `last`, done
REPLAYED_TO = """(last) => {
    const states = window.__states.map(JSON.parse);
    const start = states.findIndex(([forward, done]) => forward === 0 && done === 0);
    return start >= 0 && states.slice(start).some(([forward, , meter]) => forward === last && meter === 'done');
}"""


def test_replay_plays_the_last_run_back_from_its_first_forward(browser, served_app):
    page, problems = open_page(browser, served_app[1])
    try:
        assert page.locator("#dg-replay-run").is_disabled()  # nothing to replay before a run
        set_up_two_blocks_of_six_forwards(page)
        page.click("#dg-generate")
        page.wait_for_selector("#dg-meter .dg-meter[data-state=done]", timeout=120_000)
        page.wait_for_function("!document.querySelector('#dg-replay-run').disabled", timeout=30_000)
        last = int(page.get_attribute("#dg-canvas .dg-canvas", "data-forward"))
        text = page.locator("#dg-text textarea").input_value()
        assert last == 11
        record_states(page, PLAYGROUND_STATE)  # every state the replay shows, however briefly
        page.click("#dg-replay-run")
        page.wait_for_function(REPLAYED_TO, arg=last, timeout=120_000)
        states = recorded_states(page)
        played = states[next(i for i, (forward, done, _) in enumerate(states) if forward == 0 and done == 0):]
        forwards = [forward for forward, _, _ in played]
        assert forwards == sorted(forwards) and forwards[-1] == last, states  # from forward 0, forward by forward
        assert [6, 1] in [[forward, done] for forward, done, _ in played], states  # block 1 done at forward 6
        assert page.locator("#dg-text textarea").input_value() == text  # the run, as it ended
        assert problems == []
    finally:
        page.close()


def test_replay_refuses_when_there_is_no_run_to_replay(engine):
    with pytest.raises(gr.Error, match="Nothing to replay yet"):
        next(KeepHandlers(Playground(engine)).replay_run(SessionState()))


def test_stop_pauses_run_to_end_and_the_run_goes_on_from_there(steps, engine):
    session = SessionState()
    renders = steps.run_to_end(session, *INPUTS)
    first = next(renders)
    assert first[9]["interactive"] is True  # Stop is live while "Run to end" runs
    paused = steps.pause(session)
    assert "Paused after forward" in paused[-1] and paused[9]["interactive"] is False
    assert all(isinstance(v, dict) and v.get("__type__") == "update" for v in steps.playground.stop(session)[:10])
    rest = list(renders)  # the loop ends after the forward in progress
    assert len(rest) <= 2 and not session.step_run.done
    seen = session.snapshot.frames_seen
    steps.next_step(session, *INPUTS)  # goes on from the paused forward
    assert session.snapshot.frames_seen == seen + 1
    list(steps.run_to_end(session, *INPUTS))
    direct = engine.generate("In the beginning", session.request.settings, raw=True, seed=5)
    assert session.snapshot.latest.committed_ids == direct.token_ids
    assert steps.pause(session) == tuple(steps.pause(session))  # nothing to pause: skips

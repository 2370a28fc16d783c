"""Step-through mode: stepped runs give a normal run's tokens and reach the page's player forward by forward, the
positions first accepted in the forward on screen are outlined (by the player: class dg-new), and the page's Next
step / Run to end / Replay buttons work. Screenshots go to artifacts/step/."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.browser import synthetic_trace
from diffgemma_ui.hub import Hub
from diffgemma_ui.playground_tab import PlaygroundTab
from diffgemma_ui.session import SessionState
from diffgemma_ui.step_through import StepThroughHandlers
from engine.trace import write_replay
from pages import open_page, record_states, recorded_states, run_key, set_number, wait_for_played, wait_for_state
from playground import fed_frames

pytestmark = pytest.mark.slow
SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "step"
# prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold,
# confidence_threshold, adaptive_stopping, seed
INPUTS = ("In the beginning", True, 128, 3, 0.5, 0.4, 0.8, 1, 0.05, True, 5)
FEED, TEXT, THOUGHT, GENERATE, STOP, NOTE = range(6)  # what a step handler returns


@pytest.fixture(scope="module")
def steps(engine):
    return StepThroughHandlers(Hub(engine))


def fed(outputs) -> dict:
    """The feed message of one step handler's `outputs`, decoded."""
    return json.loads(outputs[FEED])


def newest(message: dict) -> int:
    """The run-wide index of the newest forward a feed message carries."""
    return message["start"] + len(message["frames"]) - 1


# For each forward of the offline replay: the positions of the live canvas's chips marked new, those whose mark
# shows (a box shadow), every class and style on the chips
NEW_CHIPS = """() => window.dgReplay.frames.map((_, k) => {
  window.dgReplay.show(k);
  const chips = [...document.querySelectorAll('#dg-canvas .dg-chip')];
  const positions = (keep) => chips.map((c, p) => (keep(c) ? p : -1)).filter((p) => p >= 0);
  return {marked: positions((c) => c.classList.contains('dg-new')),
          shown: positions((c) => getComputedStyle(c).boxShadow !== 'none'),
          attributes: chips.map((c) => (c.getAttribute('class') || '') + (c.getAttribute('style') || '')).join(' ')};
})"""


def test_the_player_outlines_the_positions_first_accepted_in_the_forward_on_screen_by_position_only(browser,
                                                                                                    tmp_path):
    trace = synthetic_trace(canvas=8, steps=4, blocks=2, vocab=40, token_text=lambda i: f"<b>{i}")
    path = write_replay(trace, tmp_path / "new.html")
    context = browser.new_context(offline=True)
    page = context.new_page()
    try:
        page.goto(path.as_uri())
        page.wait_for_function("document.body.dataset.ready === 'true'")
        shown = page.evaluate(NEW_CHIPS)
        for frame, chips in zip(trace.frames, shown):
            want = [] if frame.block_done else [p for p, step in enumerate(frame.first_accepted_step)
                                                if step == frame.step_index]
            assert chips["marked"] == chips["shown"] == want, (frame.forward_index, chips)
            assert "<b>" not in chips["attributes"] and "dg-new" in chips["attributes"] or not want
        assert any(chips["marked"] for chips in shown)  # some forward outlined something
        assert shown[trace.frames.index(next(f for f in trace.frames if f.block_done))]["marked"] == []
    finally:
        context.close()


def test_stepping_gives_the_tokens_of_a_normal_run(steps, engine):
    session = SessionState()
    stepped = [steps.next_step(session, *INPUTS)]
    first = fed(stepped[0])
    assert newest(first) == 0 and "forward 1:" in stepped[0][NOTE]
    assert first["final"] is False and first["autoplay"] is False  # not ended: the page shows each forward at once
    outputs = steps.next_step(session, *INPUTS)
    stepped.append(outputs)
    assert newest(fed(outputs)) == 1 and fed(outputs)["key"] == first["key"]
    assert session.snapshot.frames_seen == 2 and session.request.seed == 5
    renders = list(steps.run_to_end(session, *INPUTS))
    last = session.snapshot.latest
    assert last.done and session.snapshot.frames_seen == 2 + len(renders) - 1  # one render a forward, then Stop off
    assert renders[-1][STOP]["interactive"] is False and all(r[STOP]["interactive"] for r in renders[:-1])
    direct = engine.generate("In the beginning", session.request.settings, raw=True, seed=5)
    assert last.committed_ids == direct.token_ids
    assert session.snapshot.frames_seen == direct.forwards
    assert fed(renders[-1])["final"] is True and last.block_index == 1  # two blocks, ended: the page has it all
    frames = fed_frames([*stepped, *renders])
    assert [(f["block"], f["step"]) for f in frames] == [(f.block_index, f.step_index)
                                                         for f in session.snapshot.frames()]  # each forward, once
    again = steps.next_step(session, *INPUTS)  # a finished stepped run: the next click starts a new one
    assert newest(fed(again)) == 0 and fed(again)["final"] is False and fed(again)["key"] != first["key"]
    assert again[GENERATE] == outputs[GENERATE] and again[STOP] == outputs[STOP]  # Generate and Stop left as they are


def test_a_page_that_lost_a_step_gets_it_back_as_a_stepped_run(steps):
    session, tab = SessionState(), PlaygroundTab(steps.hub)
    first = fed(steps.next_step(session, *INPUTS))
    steps.next_step(session, *INPUTS)
    again = json.loads(tab.catch_up(session, f"{first['key']}:1"))  # the page's ask: it holds forward 0 only
    assert again["start"] == 1 and len(again["frames"]) == 1
    assert again["autoplay"] is False and again["final"] is False  # shown at once; the run goes on
    list(steps.run_to_end(session, *INPUTS))
    done = json.loads(tab.catch_up(session, f"{first['key']}:1"))
    assert done["autoplay"] is False and done["final"] is True
    assert len(done["frames"]) == session.snapshot.frames_seen - 1


def test_stepping_is_not_refused_on_zero_gpu(steps, monkeypatch):
    """On ZeroGPU each step is a GPU call (tests/test_spaces.py runs it in the emulated GPU process): the tab is
    no longer refused there."""
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    session = SessionState()
    outputs = steps.next_step(session, *INPUTS)
    assert session.step_run is not None and "forward 1:" in outputs[NOTE]


def set_up_two_blocks_of_six_forwards(page):
    """Raw "The", 128 tokens, 6 steps, adaptive stopping off: with seed 0 the embedded model (v2) writes two blocks."""
    page.fill("#dg-prompt textarea", "The")
    page.check("#dg-raw input[type=checkbox]")
    set_number(page, "Max new tokens", 128)
    set_number(page, "Max denoising steps", 6)
    page.get_by_label("Adaptive stopping").uncheck()


# The live canvas's chips marked first accepted in the forward on screen, and those whose mark shows
OUTLINED = """() => { const chips = [...document.querySelectorAll('#dg-canvas .dg-chip')];
  return [chips.filter((c) => c.classList.contains('dg-new')).length,
          chips.filter((c) => getComputedStyle(c).boxShadow !== 'none').length]; }"""


def test_step_buttons_on_the_page(browser, served_app):
    page, problems = open_page(browser, served_app[1])
    try:
        set_up_two_blocks_of_six_forwards(page)
        page.click("#dg-next-step")
        page.wait_for_selector("#dg-canvas .dg-canvas[data-forward='0']", timeout=60_000)
        page.click("#dg-next-step")
        page.wait_for_selector("#dg-canvas .dg-canvas[data-forward='1']", timeout=60_000)
        page.wait_for_function("document.querySelector('#dg-step-note').innerText.includes('forward 2:')")
        assert "forward 2: block 1, step 2" in page.inner_text("#dg-step-note")
        marked, outlined = page.evaluate(OUTLINED)
        note = page.inner_text("#dg-step-note")
        assert marked == outlined == int(re.search(r"(\d+) for the first time", note).group(1)), (marked, note)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "step2.png"), full_page=True)
        page.click("#dg-run-to-end")
        page.wait_for_selector("#dg-meter .dg-meter[data-state=done]", timeout=120_000)
        wait_for_state(page, "window.dgLive.done() && document.querySelector('#dg-canvas [data-forward]')"
                             ".dataset.forward === String(window.dgLive.player().last())")
        assert page.locator("#dg-stack .dg-block").count() == 2
        page.wait_for_function("!document.querySelector('#dg-replay-run').disabled", timeout=30_000)  # kept too
        page.screenshot(path=str(SHOTS / "end.png"), full_page=True)
        stepped, stepped_run = page.inner_text("#dg-step-note"), run_key(page)
        page.click("#dg-generate")  # a normal run takes over: the note no longer speaks of the stepped run
        page.wait_for_function(f"!document.querySelector('#dg-step-note').innerText.includes({stepped!r})",
                               timeout=30_000)
        assert page.inner_text("#dg-step-note").startswith("Step through a run")
        wait_for_played(page, stepped_run, timeout_ms=120_000)
        assert page.inner_text("#dg-step-note").startswith("Step through a run")
        page.screenshot(path=str(SHOTS / "generate-after-steps.png"), full_page=True)
        assert problems == []
    finally:
        page.close()


# [the canvas's forward, finished blocks in the stack, the meter's state]
PLAYGROUND_STATE = """() => [Number(document.querySelector('#dg-canvas .dg-canvas').dataset.forward),
    document.querySelectorAll('#dg-stack .dg-block-done').length,
    document.querySelector('#dg-meter .dg-meter').dataset.state]"""
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
        wait_for_played(page, timeout_ms=120_000)
        page.wait_for_function("!document.querySelector('#dg-replay-run').disabled", timeout=30_000)
        last = int(page.get_attribute("#dg-canvas .dg-canvas", "data-forward"))
        text = page.locator("#dg-text textarea").input_value()
        assert last == 11
        record_states(page, PLAYGROUND_STATE)  # every state the replay shows, however briefly
        page.click("#dg-replay-run")
        page.wait_for_function(REPLAYED_TO, arg=last, timeout=120_000)
        states = recorded_states(page)
        start = next(i for i, (forward, done, _) in enumerate(states) if forward == 0 and done == 0)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "replay-end.png"), full_page=True)
        forwards = [forward for forward, _, _ in states[start:]]
        assert forwards == list(range(last + 1)), states  # from forward 0, forward by forward
        assert [6, 1] in [[forward, done] for forward, done, _ in states[start:]], states  # block 1 done at forward 6
        assert all(meter == "done" for _, _, meter in states[start:]), states  # the meter keeps the engine's run
        assert page.locator("#dg-text textarea").input_value() == text  # the run, as it ended
        assert problems == []
    finally:
        page.close()


def test_replay_does_nothing_when_there_is_no_run_to_replay(browser, served_app):
    page, problems = open_page(browser, served_app[1])
    try:
        assert page.locator("#dg-replay-run").is_disabled()  # nothing to replay yet
        page.evaluate("window.dgLive.replay()")  # (the button's own action) shows and plays nothing
        assert page.get_attribute("#dg-canvas [data-forward]", "data-forward") == "-1"
        assert page.get_attribute("#dg-canvas [data-forward]", "data-playing") == "false"
        assert problems == []
    finally:
        page.close()


def test_stop_pauses_run_to_end_and_the_run_goes_on_from_there(steps, engine):
    session = SessionState()
    renders = steps.run_to_end(session, *INPUTS)
    first = next(renders)
    assert first[STOP]["interactive"] is True  # Stop is live while "Run to end" runs
    paused = steps.pause(session)
    assert "Paused after forward" in paused[NOTE] and paused[STOP]["interactive"] is False
    assert all(isinstance(v, dict) and v.get("__type__") == "update"
               for v in PlaygroundTab(steps.hub).stop(session))  # the Playground's Stop leaves it all to the pause
    rest = list(renders)  # the loop ends after the forward in progress
    assert len(rest) <= 2 and not session.step_run.done
    seen = session.snapshot.frames_seen
    steps.next_step(session, *INPUTS)  # goes on from the paused forward
    assert session.snapshot.frames_seen == seen + 1
    list(steps.run_to_end(session, *INPUTS))
    direct = engine.generate("In the beginning", session.request.settings, raw=True, seed=5)
    assert session.snapshot.latest.committed_ids == direct.token_ids
    assert steps.pause(session) == tuple(steps.pause(session))  # nothing to pause: skips

"""End to end in headless Chromium: type a prompt, press Generate, watch the page's player paint the canvas denoise,
Stop, close the tab."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from diffgemma_ui.validation import MAX_PROMPT_CHARS
from engine import preset
from pages import (PLAYER_BUTTONS, open_page, record_states, recorded_states, set_number, set_up_a_long_run,
                   wait_for_played, wait_for_plots)

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "artifacts"
# Records every distinct canvas state (its newest forward index) the page shows
WATCH_CANVAS = """() => {
  window.__forwards = [];
  const root = document.querySelector('#dg-canvas');
  const note = () => {
    const el = root.querySelector('.dg-canvas');
    const f = el ? el.getAttribute('data-forward') : null;
    if (f !== null && window.__forwards[window.__forwards.length - 1] !== f) window.__forwards.push(f);
  };
  new MutationObserver(note).observe(root, {subtree: true, childList: true, attributes: true});
}"""

# Records each meter state the page shows, with milliseconds since it was installed
WATCH_METER_STATES = """() => {
  const t0 = performance.now();
  window.__meterStates = [];
  const note = () => {
    const meter = document.querySelector('#dg-meter .dg-meter');
    const state = meter ? meter.dataset.state : 'absent';
    const seen = window.__meterStates;
    if (!seen.length || seen[seen.length - 1][0] !== state) seen.push([state, Math.round(performance.now() - t0)]);
  };
  note();
  new MutationObserver(note).observe(document.body, {subtree: true, childList: true, attributes: true,
                                                     attributeFilter: ['data-state']});
}"""

def test_generate_shows_live_canvas_final_text_and_speed(browser, served_app, engine):
    _, url = served_app
    prompt = "The Lord is my shepherd <img src=x onerror=alert(1)> \U0001f600"
    # What the engine itself makes of the same request (same seed): the page must show exactly this text
    settings = engine.recommended.replace(max_new_tokens=128, max_denoising_steps=4, adaptive_stopping=False)
    expected = engine.generate(prompt, settings, raw=True, seed=0)
    page, problems = open_page(browser, url)
    page.fill("#dg-prompt textarea", prompt)
    page.check("#dg-raw input[type=checkbox]")
    page.uncheck("#dg-settings input[type=checkbox]")  # adaptive stopping off: every block runs all 4 steps
    set_number(page, "Max new tokens", 128)
    set_number(page, "Max denoising steps", 4)
    assert page.locator("#dg-seed input").input_value() == "0"
    page.evaluate(WATCH_CANVAS)
    page.click("#dg-generate")
    wait_for_played(page, timeout_ms=120_000)  # the engine's run ended and the player put its last forward on screen
    page.wait_for_function(
        "(text) => document.querySelector('#dg-text textarea').value === text", arg=expected.text, timeout=10_000)
    forwards = page.evaluate("window.__forwards")
    assert len(forwards) >= 3, forwards  # the canvas changed at least twice while the run went on
    # the default pace paints every forward, from the first (the canvas before the run: -1)
    assert [f for f in forwards if f != "-1"] == [str(k) for k in range(expected.forwards)], forwards
    blocks = len(expected.forwards_per_block)
    assert page.locator(".dg-block-done").count() == blocks
    assert page.locator("#dg-stack .dg-chip[title]").count() == 64 * blocks
    assert page.locator("#dg-canvas .dg-block").count() == 0  # nothing live after the run
    tps = float(page.get_attribute(".dg-meter", "data-tps"))
    assert tps > 0
    wait_for_plots(page, problems)  # drawn in the page by the player (Plotly loads after the page)
    assert page.locator("#dg-heatmap.js-plotly-plot").count() == 1
    assert page.locator("#dg-stop").is_disabled() and page.locator("#dg-generate").is_enabled()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser_generate.png"), full_page=True)
    assert not problems, problems
    page.close()


SCROLL_SETTLED = "() => new Promise((done) => { const y = scrollY; setTimeout(() => done(scrollY === y), 250); })"
SCROLLED = "() => scrollY > 0"


def test_stop_button_and_phone_width(browser, served_app):
    _, url = served_app
    page, problems = open_page(browser, url, width=390, height=844)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # no sideways scrolling on a phone
    tabs = page.locator("#dg-tabs button[role=tab]")  # every tab in the bar, none behind Gradio's "..." menu
    assert [tabs.nth(i).inner_text() for i in range(tabs.count()) if tabs.nth(i).is_visible()] == [
        "Playground", "Race", "Compare", "Chat", "Infill"]
    set_up_a_long_run(page)
    page.click("#dg-generate")
    page.wait_for_selector(".dg-meter[data-state='running']", timeout=60_000)
    # on a phone the page scrolls the meter into view as the run starts (smoothly): a tap while it scrolls can land
    # on the button beside Stop, for a person as for Playwright, so tap once it has scrolled and settled
    page.wait_for_function(SCROLLED, timeout=10_000)
    page.wait_for_function(SCROLL_SETTLED, timeout=10_000)
    page.evaluate(WATCH_METER_STATES)
    started = time.monotonic()
    page.click("#dg-stop")
    # the meter answers the click within a moment (the page marks it), before the server's final view replaces it
    try:
        page.wait_for_function("['stopping', 'done'].includes("
                               "document.querySelector('#dg-meter .dg-meter').dataset.state)", timeout=4_000)
    except Exception:  # noqa: BLE001 - report what the page went through
        pytest.fail(f"the meter did not answer Stop: states seen {page.evaluate('window.__meterStates')}, "
                    f"Stop enabled: {page.locator('#dg-stop').is_enabled()}, scrollY {page.evaluate('window.scrollY')}")
    page.wait_for_selector(".dg-meter[data-state='done']", timeout=30_000)
    assert time.monotonic() - started < 20
    assert "stopped" in page.inner_text(".dg-meter").lower()
    page.wait_for_function("!document.querySelector('#dg-replay-run').disabled", timeout=30_000)  # kept, replayable
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser_phone.png"), full_page=True)
    assert not problems, problems
    page.close()


# Gradio blocks (label, box, info) whose content is wider than the block: the block hides the overflow, so a label
# like "AR temperature" lost its last letters at 390 px
CLIPPED_BLOCKS = """() => [...document.querySelectorAll('.block')]
  .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
  .map(e => `${e.id || e.className}: ${e.scrollWidth} px of content in ${e.clientWidth} px`)"""


# True once the page's size held still over two painted frames (Gradio lays a tab out over a few frames)
LAYOUT_SETTLED = """() => new Promise((done) => {
  const size = () => `${document.body.scrollWidth}x${document.body.scrollHeight}`;
  const before = size(); requestAnimationFrame(() => requestAnimationFrame(() => done(size() === before))); })"""


@pytest.mark.parametrize("width", [360, 390, 1280])
def test_no_control_on_any_tab_clips_its_content(browser, served_app, width):
    _, url = served_app
    page, problems = open_page(browser, url, width=width, height=844)
    clipped = {}
    for tab in ("playground", "race", "compare", "chat", "infill"):
        page.click(f"#dg-tab-{tab}-button")
        page.wait_for_selector(f"#dg-tab-{tab}", state="visible")
        page.wait_for_function(LAYOUT_SETTLED, timeout=10_000)  # the tab's layout settles
        clipped[tab] = page.evaluate(CLIPPED_BLOCKS)
    assert not any(clipped.values()), clipped
    assert not problems, problems
    page.close()


def test_closing_the_tab_frees_the_worker(browser, served_app):
    app, url = served_app
    page, _ = open_page(browser, url)
    set_up_a_long_run(page)
    page.click("#dg-generate")
    page.wait_for_selector(".dg-meter[data-state='running']", timeout=60_000)
    assert app.hub.runs.active() == 1
    closed = time.monotonic()
    page.close()
    deadline = closed + 45
    while (app.hub.runs.active() or run_threads()) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert app.hub.runs.active() == 0 and not run_threads()
    print(f"worker freed {time.monotonic() - closed:.1f} s after the tab closed")


def run_threads():
    return [t for t in threading.enumerate() if t.name == "diffgemma-run" and t.is_alive()]


def test_preset_fills_the_sliders_and_dice_draws_a_seed(browser, served_app, engine):
    _, url = served_app
    page, problems = open_page(browser, url)
    steps = page.locator("input[aria-label='number input for Max denoising steps']")
    assert int(steps.input_value()) == engine.recommended.max_denoising_steps
    page.click("#dg-preset input")
    page.locator("ul[role=listbox] li", has_text="fast").first.click()
    fast = preset("fast", engine.recommended)
    page.wait_for_function(
        f"document.querySelector(\"input[aria-label='number input for Max denoising steps']\").value == "
        f"'{fast.max_denoising_steps}'", timeout=10_000)
    bound = page.locator("input[aria-label='number input for Entropy bound']").input_value()
    assert float(bound) == pytest.approx(fast.entropy_bound)
    seed = page.locator("#dg-seed input")
    before = seed.input_value()
    page.click("#dg-dice")
    page.wait_for_function(f"document.querySelector('#dg-seed input').value !== '{before}'", timeout=10_000)
    assert int(seed.input_value()) >= 0
    assert not problems, problems
    page.close()


def test_refused_prompt_leaves_the_canvas_clean_and_hand_edits_make_the_preset_custom(browser, served_app, engine):
    careful_bound = format(preset("careful", engine.recommended).entropy_bound, "g")
    _, url = served_app
    page, problems = open_page(browser, url)
    page.fill("#dg-prompt textarea", "   ")
    page.click("#dg-generate")
    page.wait_for_selector("text=prompt is empty", timeout=10_000)  # the message, as a toast
    time.sleep(0.5)
    assert "Error" not in page.locator("#dg-canvas").inner_text()  # no error badge on the canvas
    assert page.locator("#dg-generate").is_enabled()
    # A prompt over the limit reaches the server whole and is refused with the limit, not cut short in the box
    page.fill("#dg-prompt textarea", "And " * (MAX_PROMPT_CHARS // 4 + 1))
    assert len(page.locator("#dg-prompt textarea").input_value()) == MAX_PROMPT_CHARS + 4
    page.click("#dg-generate")
    page.wait_for_selector(f"text=the limit here is {MAX_PROMPT_CHARS:,}", timeout=10_000)
    assert page.locator("#dg-generate").is_enabled()

    preset_box = page.locator("#dg-preset input")
    set_number(page, "Entropy bound", 1.5)
    page.wait_for_function("document.querySelector('#dg-preset input').value === 'custom'", timeout=10_000)
    set_number(page, "Max new tokens", 64)
    preset_box.click()
    page.locator("ul[role=listbox] li", has_text="careful").first.click()
    page.wait_for_function(
        f"document.querySelector(\"input[aria-label='number input for Entropy bound']\").value === '{careful_bound}'",
        timeout=10_000)
    assert page.locator("input[aria-label='number input for Max new tokens']").input_value() == "64"
    assert preset_box.input_value() == "careful"
    assert not problems, problems
    page.close()


# The forward on screen (-1 before a run)
FORWARD = "() => Number(document.querySelector('#dg-canvas [data-forward]').dataset.forward)"


def test_a_refused_request_after_a_run_marks_the_results_as_the_previous_runs(browser, served_app):
    _, url = served_app
    page, problems = open_page(browser, url)
    page.fill("#dg-prompt textarea", "And")
    page.check("#dg-raw input[type=checkbox]")
    set_number(page, "Max denoising steps", 3)
    page.click("#dg-generate")
    wait_for_played(page)
    answer = page.locator("#dg-text textarea").input_value()
    assert answer.strip()
    # the playback plays the run again, slowly, while the next request is refused: the refusal stays in the meter
    page.select_option("#dg-replay-pace", "teach")
    page.click("#dg-replay-run")
    page.wait_for_function(f"({FORWARD})() === 0")
    page.fill("#dg-prompt textarea", "")
    page.click("#dg-generate")
    page.wait_for_selector("text=prompt is empty", timeout=10_000)
    page.wait_for_selector(".dg-meter[data-state='refused']", timeout=10_000)
    refused_at = page.evaluate(FORWARD)
    page.wait_for_function(f"({FORWARD})() >= {refused_at + 2} || "
                           "document.querySelector('#dg-canvas [data-playing]').dataset.playing === 'false'")
    assert page.get_attribute("#dg-meter .dg-meter", "data-state") == "refused"  # the playback did not redraw it
    notice = page.locator("#dg-meter .dg-meter-notice").inner_text()
    assert "refused" in notice.lower() and "previous run" in notice
    assert page.locator("#dg-text textarea").input_value() == answer  # nothing lost
    assert page.locator("#dg-generate").is_enabled()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser_refused_after_a_run.png"))
    assert not problems, problems
    page.close()


HEATMAP_TITLE = "() => document.querySelector('#dg-heatmap .gtitle').textContent"


def test_shift_enter_runs_and_the_player_slider_follows_the_keyboard(browser, served_app):
    _, url = served_app
    page, problems = open_page(browser, url)
    page.fill("#dg-prompt textarea", "The")  # seed 0, 6 steps: the embedded model (v2) writes two blocks
    page.check("#dg-raw input[type=checkbox]")
    set_number(page, "Max new tokens", 128)
    set_number(page, "Max denoising steps", 6)
    page.get_by_label("Adaptive stopping").uncheck()
    page.fill("#dg-seed input", "0")
    page.press("#dg-prompt textarea", "Shift+Enter")
    wait_for_played(page)
    wait_for_plots(page, problems)
    assert page.evaluate(FORWARD) == 11
    title = page.locator("#dg-heatmap .gtitle")
    assert "block 2" in title.text_content()  # the last block is plotted after the run
    # the player's slider walks every forward of every block: block 2's first forward is 6
    page.locator("#dg-replay-slider").focus()
    for forward in range(10, 5, -1):
        page.keyboard.press("ArrowLeft")
        page.wait_for_function(f"({FORWARD})() === {forward}")
        assert "block 2" in page.evaluate(HEATMAP_TITLE)
        assert page.locator("#dg-replay-slider").input_value() == str(forward)
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(f"({HEATMAP_TITLE})().includes('block 1')", timeout=10_000)
    assert page.evaluate(FORWARD) == 5 and "forward 6/12" in page.inner_text("#dg-replay-label")
    assert not problems, problems
    page.close()


PLAYER_STATE = """() => [document.querySelector('#dg-replay-play').getAttribute('aria-label'),
  Number(document.querySelector('#dg-canvas [data-forward]').dataset.forward)]"""


def test_interrupting_the_playback_is_not_a_page_error(browser, served_app):
    _, url = served_app
    page, problems = open_page(browser, url)
    set_number(page, "Max new tokens", 64)
    page.click("#dg-generate")
    wait_for_played(page)
    wait_for_plots(page, problems)
    # the heatmap has no animation buttons of its own: the player's controls play and pause it with the canvas
    assert page.locator("#dg-heatmap .updatemenu-button").count() == 0
    assert all(page.locator(button).is_visible() for button in PLAYER_BUTTONS)
    last = page.evaluate("window.dgLive.player().last()")
    page.select_option("#dg-replay-pace", "teach")  # each forward long on screen: every state below is waited for
    record_states(page, PLAYER_STATE)
    play = page.locator("#dg-replay-play")
    for want in ("pause", "play", "pause"):  # each click interrupts the playback (and the plots it redraws)
        play.click()
        page.wait_for_function(f"document.querySelector('#dg-replay-play').getAttribute('aria-label') === '{want}'")
    page.click("#dg-replay-next")  # a step pauses it
    page.wait_for_function("document.querySelector('#dg-replay-play').getAttribute('aria-label') === 'play'")
    play.click()
    page.select_option("#dg-replay-pace", "fast")
    page.wait_for_function(f"({FORWARD})() === {last} && "
                           "document.querySelector('#dg-replay-play').getAttribute('aria-label') === 'play'",
                           timeout=60_000)  # played on to the end, and stopped there
    labels = [label for label, _ in recorded_states(page)]
    assert labels[0] == "play" and "pause" in labels, labels
    assert not problems, problems
    page.close()

"""The live view in headless Chromium. The block being denoised stays in view: at 1280x900 with many finished
blocks, and on a 390 px phone right after pressing Generate; a finished block taller than the stack shows its header,
and no Plotly toolbar covers the plot titles at phone width. The page's player plays every forward of a run while
the engine runs ahead (the `#dg-canvas` contract: `data-forward`, `data-playing`), at a pace the visitor picks; it
says when the playback is behind the engine, Stop leaves what was played, reduced motion starts no playback, the
canvas is one Tab stop with a keyboard cursor and a "why this token?" popup, and the presenter steps by swipe.
Screenshots go to artifacts/."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest

from benchmarks.browser import synthetic_trace
from diffgemma_ui.feed import frames_message

from pages import (PLAYER_BUTTONS, open_page, set_number, set_pace, set_up_a_long_run, wait_for_played,
                   wait_for_plots)

pytestmark = pytest.mark.slow
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
LIVE = "#dg-canvas .dg-block-live"
# true once six blocks are finished and the live block's top is inside the viewport (the page is not scrolled by
# the test; on a phone the page itself scrolls the meter into view when the run starts)
# (between two blocks a render may have no live block: the canvas, where the next one appears, is checked then)
SIX_BLOCKS_AND_LIVE_IN_VIEW = """() => { const s = document.querySelector('#dg-stack .dg-stack');
  const live = document.querySelector('#dg-canvas .dg-block-live') || document.querySelector('#dg-canvas .dg-canvas');
  if (!s || +s.dataset.blocks < 6 || !live) return false;
  const r = live.getBoundingClientRect(); return r.top >= 0 && r.top < window.innerHeight - 40; }"""

# the newest finished block's header is inside the stack's visible box (at the stack's end, or at its top when the
# block is taller than the stack)
STACK = "document.querySelector('#dg-stack .dg-stack')"
NEWEST_HEADER_IN_VIEW = """s => { const box = s.getBoundingClientRect();
  const head = s.lastElementChild.querySelector('header').getBoundingClientRect();
  return head.top >= box.top - 1 && head.bottom <= box.bottom + 1; }"""


@pytest.mark.parametrize("width,height", [(1280, 900), (390, 844)])
def test_the_live_block_stays_in_view(browser, served_app, width, height):
    _, url = served_app
    page, problems = open_page(browser, url, width=width, height=height)
    set_up_a_long_run(page)
    set_number(page, "Max denoising steps", 3)  # a block every 3 forwards
    page.evaluate("window.scrollTo(0, 0)")
    page.click("#dg-generate")
    try:
        page.wait_for_function(SIX_BLOCKS_AND_LIVE_IN_VIEW, timeout=120_000, polling=100)
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"browser_live_in_view_{width}_check.png"))
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"browser_live_in_view_{width}.png"))
    # (read in one evaluation: the player draws the stack anew with each forward it shows)
    assert page.evaluate(f"({NEWEST_HEADER_IN_VIEW})({STACK})"), "the newest finished block's header is not in view"
    assert page.evaluate(f"{STACK}.clientHeight") <= 0.4 * height  # bounded
    page.evaluate("() => { const stop = document.querySelector('#dg-stop'); if (!stop.disabled) stop.click(); }")
    try:
        page.wait_for_selector(".dg-meter[data-state='done']", timeout=30_000)
    except Exception as error:  # say where the page stood
        raise AssertionError(f"no final view 30 s after Stop: meter {page.inner_html('#dg-meter')[:2000]!r}; "
                             f"problems {problems}") from error
    assert not problems, problems
    page.close()


def test_a_block_taller_than_the_stack_shows_its_header_on_a_phone_and_no_plot_toolbar(browser, served_app):
    # the default chat prompt ends at EOS inside its first block: 41 tokens and rows of end-of-turn pads, taller
    # than the stack's 24vh at 390x844, so scrolling to the stack's end would hide the block's header
    page, problems = open_page(browser, served_app[1], width=390, height=844)
    page.click("#dg-generate")
    wait_for_played(page, timeout_ms=120_000)
    assert page.evaluate(f"(s => s.lastElementChild.offsetHeight > s.clientHeight)({STACK})")  # this test's case
    page.wait_for_function(f"() => ({NEWEST_HEADER_IN_VIEW})({STACK})", timeout=5_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#dg-player").screenshot(path=str(ARTIFACTS / "browser_tall_block_390.png"))
    # and Plotly's toolbar, which would cover the plot titles at this width, is hidden
    wait_for_plots(page, problems)
    toolbars = page.locator("#dg-heatmap .modebar-container, #dg-order .modebar-container")
    assert toolbars.count() == 2 and all(t.evaluate("m => getComputedStyle(m).display") == "none"
                                         for t in toolbars.all())
    assert not problems, problems
    page.close()


# (text colour, the colour behind it) of each of the player's buttons: the first opaque background from the button up
BUTTON_COLOURS = """(ids) => ids.map((id) => {
  const button = document.querySelector(id);
  let node = button, behind = 'rgb(255, 255, 255)';
  while (node) {
    const fill = getComputedStyle(node).backgroundColor, alpha = fill.match(/rgba\\(.*,\\s*([\\d.]+)\\)$/);
    if (fill && fill !== 'transparent' && !(alpha && Number(alpha[1]) === 0)) { behind = fill; break; }
    node = node.parentElement;
  }
  return [getComputedStyle(button).color, behind];
})"""
TITLE_AND_BAR = """id => { const root = document.querySelector(id), box = e => e.getBoundingClientRect();
  const t = box(root.querySelector('.gtitle')), m = box(root.querySelector('.modebar'));
  return {title: [t.left, t.top, t.right, t.bottom], bar: [m.left, m.top, m.right, m.bottom]}; }"""


def _luminance(css_rgb: str) -> float:
    """WCAG relative luminance of "rgb(r, g, b)"."""
    channels = [float(c) / 255 for c in css_rgb[css_rgb.index("(") + 1:css_rgb.index(")")].split(",")[:3]]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _contrast(a: str, b: str) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_play_buttons_read_and_the_mode_bar_leaves_the_plot_titles_clear(browser, served_app, theme):
    url = served_app[1] + ("?__theme=dark" if theme == "dark" else "")
    page, problems = open_page(browser, url, width=1400, height=1000)
    set_number(page, "Max new tokens", 64)
    set_number(page, "Max denoising steps", 4)
    page.get_by_label("Adaptive stopping").uncheck()  # a block of several steps: the player has forwards to play
    page.fill("#dg-seed input", "0")
    page.click("#dg-generate")
    wait_for_played(page, timeout_ms=120_000)
    wait_for_plots(page, problems)
    # the player's play, pause and step buttons (the heatmap has none of its own now) read against their background
    colours = page.evaluate(BUTTON_COLOURS, list(PLAYER_BUTTONS))
    assert len(colours) == 4 and all(_contrast(text, button) >= 4.5 for text, button in colours), colours
    for plot in ("#dg-heatmap", "#dg-order", "#dg-entropy"):
        page.locator(plot).hover()
        page.wait_for_function(f"getComputedStyle(document.querySelector('{plot} .modebar')).opacity === '1'")
        boxes = page.evaluate(TITLE_AND_BAR, plot)
        title, bar = boxes["title"], boxes["bar"]
        overlap = min(title[2], bar[2]) > max(title[0], bar[0]) and min(title[3], bar[3]) > max(title[1], bar[1])
        assert not overlap, (plot, boxes)
    page.locator("#dg-plots").screenshot(path=str(ARTIFACTS / f"plots_hover_{theme}.png"))
    assert not problems, problems
    page.close()


# page-coordinate boxes of Generate, the meter, the live canvas and the first sampler setting
BOXED = "['#dg-generate', '#dg-meter', '#dg-canvas', '#dg-step-buttons', '#dg-settings']"
BOXES = "() => Object.fromEntries(" + BOXED + """
  .map(s => { const r = document.querySelector(s).getBoundingClientRect();
              return [s, {top: r.top + scrollY, bottom: r.bottom + scrollY, left: r.left, right: r.right}]; }))"""


@pytest.mark.parametrize("width,height", [(1280, 900), (390, 844)])
def test_the_meter_and_live_canvas_sit_right_under_generate_on_a_phone(browser, served_app, width, height):
    page, problems = open_page(browser, served_app[1], width=width, height=height)
    page.wait_for_function(f"{BOXED}.every(s => document.querySelector(s))")  # Gradio mounts them one by one
    boxes = page.evaluate(BOXES)
    generate, meter, canvas = boxes["#dg-generate"], boxes["#dg-meter"], boxes["#dg-canvas"]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"browser_generate_and_canvas_{width}.png"))
    if width < 900:
        assert 0 <= meter["top"] - generate["bottom"] <= 100, boxes  # the meter next, under the buttons
        assert canvas["bottom"] <= generate["top"] + height, boxes  # the live canvas on the same screen
        assert boxes["#dg-step-buttons"]["top"] > canvas["bottom"] < boxes["#dg-settings"]["top"], boxes
    else:
        assert meter["left"] > generate["right"] and meter["top"] < generate["top"], boxes  # output beside controls
    assert not problems, problems
    page.close()


# -- the player's contract and features --------------------------------------------------------------------------

# Notes each change of the forward on screen or of its data-playing, with the time (ms), the meter's state, the
# status line and the play button's label, from now on (a MutationObserver on #dg-canvas: a forward shown for one
# update is noted too)
WATCH_FORWARDS = """() => {
  const root = document.querySelector('#dg-canvas'), seen = window.__painted = [];
  const note = () => {
    const canvas = root.querySelector('[data-forward]');
    if (!canvas) return;
    const forward = Number(canvas.dataset.forward), playing = canvas.dataset.playing, last = seen[seen.length - 1];
    if (last && last.forward === forward && last.playing === playing) return;
    const meter = document.querySelector('#dg-meter .dg-meter');
    seen.push({forward, playing, at: performance.now(), meter: meter ? meter.dataset.state : '',
               status: document.querySelector('#dg-replay-status').textContent,
               button: document.querySelector('#dg-replay-play').getAttribute('aria-label')});
  };
  new MutationObserver(note).observe(root, {subtree: true, childList: true, attributes: true,
                                            attributeFilter: ['data-forward', 'data-playing']});
}"""
FORWARD = "() => Number(document.querySelector('#dg-canvas [data-forward]').dataset.forward)"
LAST = "() => window.dgLive.player().last()"
ENGINE_STATUS = re.compile(r"the engine finished in (\d+\.\d+) s \(engine clock\); "
                           r"(?:playing|paused at) forward (\d+) of (\d+)")


def painted(page) -> list[dict]:
    """What `WATCH_FORWARDS` noted (the empty canvas before a run, forward -1, left out)."""
    return [p for p in page.evaluate("window.__painted") if p["forward"] >= 0]


def test_the_default_pace_paints_every_forward_of_a_default_run(browser, served_app):
    page, problems = open_page(browser, served_app[1])
    try:
        assert page.get_attribute("#dg-canvas [data-forward]", "data-forward") == "-1"  # before a run
        assert page.get_attribute("#dg-canvas [data-forward]", "data-playing") == "false"
        assert page.locator("#dg-replay-pace").input_value() == "default"
        page.evaluate(WATCH_FORWARDS)
        page.click("#dg-generate")
        wait_for_played(page, timeout_ms=120_000)
        last = page.evaluate(LAST)
        seen = painted(page)
        forwards = [p["forward"] for p in seen]
        assert [f for i, f in enumerate(forwards) if i == 0 or f != forwards[i - 1]] == list(range(last + 1)), seen
        firsts = {}
        for p in seen:
            firsts.setdefault(p["forward"], p["at"])
        shown_ms = [firsts[k + 1] - firsts[k] for k in range(last)]
        assert min(shown_ms) >= 100, shown_ms  # each forward stays on screen at least 100 ms
        if last >= 10:  # a default run of 11 forwards plays over at least 1.5 s
            assert firsts[last] - firsts[0] >= 1500, shown_ms
        # data-playing is "true" until the engine's last forward is on screen, then "false"
        assert all(p["playing"] == "true" for p in seen if p["forward"] < last), seen
        assert (seen[-1]["forward"], seen[-1]["playing"], seen[-1]["button"]) == (last, "false", "play"), seen
        assert page.get_attribute("#dg-player", "data-playing") == "false"
        assert page.inner_text("#dg-replay-status") == ""  # caught up: nothing to say
        assert "forward" in page.inner_text("#dg-replay-label") and "Done" in page.inner_text("#dg-replay-announce")
        assert not problems, problems
    finally:
        page.close()


def test_the_status_line_says_the_engine_finished_while_the_playback_is_behind(browser, served_app):
    page, problems = open_page(browser, served_app[1])
    try:
        page.click("#dg-generate")
        page.wait_for_selector("#dg-canvas [data-forward='0']", timeout=120_000)
        page.click("#dg-replay-play")  # pause at the first forward: the engine runs ahead
        page.wait_for_function("document.querySelector('#dg-replay-play').getAttribute('aria-label') === 'play'")
        page.wait_for_selector("#dg-meter .dg-meter[data-state='done']", timeout=120_000)
        page.wait_for_function("window.dgLive.done()")
        forward, last = page.evaluate(FORWARD), page.evaluate(LAST)
        assert forward < last
        status = page.inner_text("#dg-replay-status")
        match = ENGINE_STATUS.fullmatch(status)
        assert match and int(match[2]) == forward + 1 and int(match[3]) == last + 1, status
        # the meter keeps the engine's clock: its elapsed time is the engine's, not the playback's
        assert f"{match[1]} s" in page.inner_text("#dg-meter")
        assert page.get_attribute("#dg-canvas [data-forward]", "data-playing") == "true"
        page.click("#dg-replay-play")  # on from there
        page.wait_for_function(f"({FORWARD})() > {forward}")
        assert f"of {last + 1}" in page.inner_text("#dg-replay-status")
        page.click("#dg-replay-end")  # jump to the end
        page.wait_for_function(f"({FORWARD})() === {last}")
        assert page.get_attribute("#dg-canvas [data-forward]", "data-playing") == "false"
        assert page.inner_text("#dg-replay-status") == ""
        assert not problems, problems
    finally:
        page.close()


def test_stop_leaves_what_was_played(browser, served_app):
    app, url = served_app
    page, problems = open_page(browser, url)
    try:
        set_up_a_long_run(page)
        set_pace(page, "teach")
        page.click("#dg-generate")
        page.wait_for_selector("#dg-canvas [data-forward='0']", timeout=120_000)
        page.click("#dg-replay-play")  # hold the playback until the engine is three forwards ahead
        page.wait_for_function(f"Number(window.dgLive.have().split(':')[1]) >= 4", timeout=120_000)
        page.click("#dg-replay-play")
        page.wait_for_function(f"({FORWARD})() >= 1")  # playing, behind the engine
        assert page.get_attribute("#dg-replay-play", "aria-label") == "pause"
        at_stop = page.evaluate(f"() => {{ const f = ({FORWARD})(); document.querySelector('#dg-stop').click(); "
                                "return f; }")
        page.wait_for_selector("#dg-meter .dg-meter[data-state='done']", timeout=30_000)
        page.wait_for_function("window.dgLive.done()")
        assert "stopped" in page.inner_text("#dg-meter").lower()
        forward, last = page.evaluate(FORWARD), page.evaluate(LAST)
        assert forward in (at_stop, at_stop + 1) and forward < last, (at_stop, forward, last)  # not the engine's end
        assert page.get_attribute("#dg-replay-play", "aria-label") == "play"  # paused there
        assert not page.evaluate("window.dgLive.player().playing()")
        assert ENGINE_STATUS.fullmatch(page.inner_text("#dg-replay-status"))
        deadline = time.monotonic() + 30
        while app.hub.runs.active() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert app.hub.runs.active() == 0  # the engine's run ended
        assert page.evaluate(FORWARD) == forward
        assert not problems, problems
    finally:
        page.close()


def test_as_it_computes_paints_forwards_as_they_arrive(browser, served_app):
    page, problems = open_page(browser, served_app[1])
    try:
        set_pace(page, "live")
        page.evaluate(WATCH_FORWARDS)
        page.click("#dg-generate")
        wait_for_played(page, timeout_ms=120_000)
        last = page.evaluate(LAST)
        forwards = [p["forward"] for p in painted(page)]
        distinct = [f for i, f in enumerate(forwards) if i == 0 or f != forwards[i - 1]]
        assert distinct == sorted(set(distinct)) and distinct[-1] == last, forwards  # in order, to the engine's end
        assert page.evaluate("localStorage.getItem('dg-pace')") == "live"  # the pace is kept for the next visit
        assert not problems, problems
    finally:
        page.close()


def fed_run(page, messages: list[str], pace: str) -> list[int]:
    """Feed `messages` (feed.py's, of one run) to the page's player at `pace` each once the one before is applied,
    and wait until the run is played; the distinct forwards painted, in order."""
    set_pace(page, pace)
    page.evaluate(WATCH_FORWARDS)
    for message in messages:
        page.evaluate("(m) => window.dgLive.feed(m)", message)
    page.wait_for_function("window.dgLive.done() && document.querySelector('#dg-canvas [data-forward]')"
                           ".dataset.playing === 'false'", timeout=30_000)
    forwards = [p["forward"] for p in painted(page)]
    return [f for i, f in enumerate(forwards) if i == 0 or f != forwards[i - 1]]


def synthetic_messages(chunks: list[int], **trace) -> tuple[object, list[str]]:
    """A synthetic trace (`benchmarks.browser.synthetic_trace(**trace)`) as feed messages ending after each of
    `chunks` forwards, as the run step sends a run."""
    run = synthetic_trace(**trace)
    frames = list(run.frames)
    ends = [*chunks, len(frames)]
    starts = [0, *ends[:-1]]
    return run, [frames_message(None, None, frames[:end], start, final=end == len(frames), trace=run)
                 for start, end in zip(starts, ends)]


def test_a_burst_of_forwards_plays_each_at_the_default_pace_and_skips_at_as_it_computes(browser, served_app):
    trace, messages = synthetic_messages([], canvas=16, steps=12, blocks=1, vocab=400)
    page, problems = open_page(browser, served_app[1])
    try:
        assert fed_run(page, messages, "default") == list(range(12))  # the whole run at once: every forward
        trace, messages = synthetic_messages([], canvas=16, steps=12, blocks=1, vocab=400, seed=1)
        shown = fed_run(page, messages, "live")
        assert shown[-1] == 11 and len(shown) < 12 and shown == sorted(shown), shown  # only what it can paint
        assert not problems, problems
    finally:
        page.close()


def test_a_run_whose_first_chunk_was_lost_is_played_from_its_first_forward(browser, served_app):
    run = synthetic_trace(canvas=16, steps=4, blocks=2, vocab=400)
    frames = list(run.frames)

    def chunk(start, end, seq):  # feed.py's message of frames[start:end], the page's seq-th
        message = json.loads(frames_message(None, None, frames[:end], start, final=end == len(frames), trace=run))
        return {**message, "seq": 10**9 + seq}

    page, problems = open_page(browser, served_app[1])
    try:
        set_pace(page, "live")
        page.evaluate("""() => { window.__asked = 0; document.addEventListener('click', (e) => {
            if (e.target.closest('#dg-feed-poll')) window.__asked += 1; }, true); }""")
        feed = "(m) => window.dgLive.feed(JSON.stringify(m))"
        page.evaluate(feed, chunk(3, 6, 0))  # forwards 3-5 first: forwards 0-2 were lost on their way
        assert page.evaluate("window.dgLive.have()").endswith(":0")  # the page holds none of the run yet...
        assert page.evaluate("window.__asked") == 1  # ...and asks the server for what it lacks
        assert page.evaluate(FORWARD) == -1
        page.evaluate(feed, chunk(0, 6, 1))  # the answer: the run from its start
        page.evaluate(feed, chunk(6, 8, 2))
        page.wait_for_function("window.dgLive.done() && document.querySelector('#dg-canvas [data-forward]')"
                               ".dataset.playing === 'false'", timeout=30_000)
        steps = page.evaluate("window.dgLive.data().frames.map((f) => [f.block, f.step])")
        assert steps == [[f.block_index, f.step_index] for f in frames], steps
        assert page.locator("#dg-stack .dg-block-done").count() == 2 and page.evaluate(FORWARD) == len(frames) - 1
        assert page.evaluate("window.__asked") == 1
        assert not problems, problems
    finally:
        page.close()


def test_a_playback_waiting_for_the_engine_stops_when_the_run_ends(browser, served_app):
    run = synthetic_trace(canvas=16, steps=4, blocks=1, vocab=400)
    frames = list(run.frames)
    page, problems = open_page(browser, served_app[1])
    try:
        set_pace(page, "live")
        page.evaluate("(m) => window.dgLive.feed(m)", frames_message(None, None, frames, 0, final=False, trace=run))
        page.wait_for_function(f"({FORWARD})() === 3")  # caught up with the engine: it waits for the next forward
        assert page.get_attribute("#dg-replay-play", "aria-label") == "pause"
        # the run's end brings no new forward (the last one again): the playback is over
        page.evaluate("(m) => window.dgLive.feed(m)", frames_message(None, None, frames, 4, final=True, trace=run))
        page.wait_for_function("window.dgLive.done()")
        assert page.get_attribute("#dg-replay-play", "aria-label") == "play"
        assert not page.evaluate("window.dgLive.player().playing()")
        assert page.get_attribute("#dg-canvas [data-forward]", "data-playing") == "false"
        page.click("#dg-replay-play")  # and Play plays it again from its first forward
        page.wait_for_function(f"({FORWARD})() === 3 && !window.dgLive.player().playing()")
        assert not problems, problems
    finally:
        page.close()


@pytest.mark.parametrize("repeat", [False, True], ids=["between-forwards", "cancelled-repeat"])
def test_a_stopped_run_ends_stopped_at_its_last_forward(browser, served_app, repeat):
    run = synthetic_trace(canvas=16, steps=4, blocks=2, vocab=400)
    frames = list(run.frames)[:4]  # Stop came right after block 1 was committed
    messages = [frames_message(None, None, frames, 0, final=not repeat, trace=run)]
    if repeat:  # the engine's repeat of the last forward, done and "cancelled", replaced it after it was sent
        frames[-1] = dataclasses.replace(frames[-1], done=True, stop_reason="cancelled")
        messages.append(frames_message(None, None, frames, len(frames), final=True, trace=run))
        assert json.loads(messages[-1])["start"] == 3 and "stopped" not in json.loads(messages[-1])
    else:  # or the run had no done frame at all
        assert json.loads(messages[0])["stopped"] is True
    page, problems = open_page(browser, served_app[1])
    try:
        assert fed_run(page, messages, "live")[-1] == 3  # the last forward, once
        assert page.get_attribute("#dg-meter .dg-meter", "data-state") == "done"
        assert "stopped" in page.inner_text("#dg-meter") and "stopped" in page.inner_text("#dg-canvas").lower()
        assert "4 forwards" in page.inner_text("#dg-meter")  # the engine's count, no repeat
        assert page.inner_text("#dg-replay-announce").startswith("Done: stopped")
        assert not problems, problems
    finally:
        page.close()


def test_reduced_motion_starts_no_playback_and_shows_the_final_canvas(browser, served_app):
    page, problems = open_page(browser, served_app[1], reduced_motion="reduce")
    try:
        page.evaluate(WATCH_FORWARDS)
        page.click("#dg-generate")
        page.wait_for_selector("#dg-meter .dg-meter[data-state='done']", timeout=120_000)
        page.wait_for_function(f"window.dgLive.done() && ({FORWARD})() === ({LAST})()")
        last = page.evaluate(LAST)
        forwards = {p["forward"] for p in painted(page)}
        assert forwards <= {0, last} and last in forwards, forwards  # the first forward, then the final canvas
        assert page.get_attribute("#dg-replay-play", "aria-label") == "play"  # nothing played by itself
        assert page.get_attribute("#dg-canvas [data-forward]", "data-playing") == "false"
        assert page.locator("#dg-stack .dg-block-done").count() >= 1
        page.click("#dg-replay-prev")  # the step controls walk through it
        assert page.evaluate(FORWARD) == last - 1
        page.click("#dg-replay-next")
        assert page.evaluate(FORWARD) == last
        page.click("#dg-present")  # the presenter plays nothing by itself either: it shows the final canvas
        page.wait_for_selector("#dgp-overlay", state="visible")
        assert page.get_attribute("#dgp-overlay", "data-forward") == str(last)
        assert page.get_attribute("#dgp-replay-play", "aria-label") == "play"
        assert page.get_attribute("#dgp-overlay", "data-playing") == "false"
        assert not problems, problems
    finally:
        page.close()


# Each chip of the board (finished blocks and live canvas): has the cursor; the board's active descendant
CURSOR = """() => ({chips: [...document.querySelectorAll('#dg-board .dg-chip')].map((c) =>
  c.classList.contains('dg-cursor')),
  active: document.querySelector('#dg-board').getAttribute('aria-activedescendant'),
  focus: document.activeElement && document.activeElement.id})"""


def test_the_canvas_is_one_tab_stop_with_a_keyboard_cursor_and_a_popup(browser, served_app):
    page, problems = open_page(browser, served_app[1])
    try:
        set_pace(page, "live")
        page.click("#dg-generate")
        wait_for_played(page, timeout_ms=120_000)
        page.click("#dg-replay-prev")  # the last forward before the block was committed: a live block
        forward = page.evaluate(FORWARD)
        chips = page.locator("#dg-canvas .dg-chip")
        assert chips.count() == 64
        page.focus("#dg-replay-end")
        for _ in range(4):  # through the slider and the pace menu to the canvas
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.id") == "dg-board":
                break
        assert page.evaluate("document.activeElement.id") == "dg-board"
        assert page.evaluate("getComputedStyle(document.querySelector('#dg-board')).outlineStyle") != "none"
        page.keyboard.press("ArrowRight")
        state = page.evaluate(CURSOR)
        assert state["chips"].index(True) == 0 and state["chips"].count(True) == 1, state
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowLeft")
        state = page.evaluate(CURSOR)
        assert state["chips"].index(True) == 1 and state["active"] == "dg-board-cursor", state
        assert page.evaluate(FORWARD) == forward  # the arrows moved the cursor, not the playback
        page.keyboard.press("Enter")
        popup = page.locator(".dg-popup")
        assert popup.count() == 1 and popup.is_visible()
        assert popup.inner_text() == chips.nth(1).get_attribute("title")
        assert popup.inner_text().startswith("position 1:") and "first accepted: step" in popup.inner_text()
        page.keyboard.press("Escape")
        assert page.locator(".dg-popup").count() == 0
        page.keyboard.press(" ")  # Space opens it too
        assert page.locator(".dg-popup").count() == 1
        page.keyboard.press("Escape")
        page.keyboard.press("Tab")  # one Tab stop: the next Tab leaves the canvas, not into its chips
        assert not page.evaluate("document.querySelector('#dg-canvas').contains(document.activeElement)")
        assert not problems, problems
    finally:
        page.close()


# For chip `position` of finished block `block`: the 1-based step at which the run first accepted it, from the
# player's data (the frames the page holds)
FIRST_ACCEPTED = """([block, position]) => {
  const frames = window.dgLive.data().frames.filter((f) => f.block === block);
  const first = frames.find((f) => f.accepted[position] === '1');
  return first ? first.step + 1 : -1;
}"""
RAW_MARKER = re.compile(r"<[^<>\s]*>")


def test_the_popup_of_a_committed_token_names_the_step_it_was_first_accepted_and_no_raw_marker(browser, served_app):
    page, problems = open_page(browser, served_app[1])
    try:
        set_pace(page, "live")
        page.click("#dg-generate")  # the default chat prompt: text, then end-of-turn pads
        wait_for_played(page, timeout_ms=120_000)
        chips = page.locator("#dg-stack .dg-block-done .dg-chip")
        n = chips.count()
        assert n == 64
        for position in range(n):
            chips.nth(position).click()
            popup = page.locator(".dg-popup")
            assert popup.count() == 1
            text = popup.inner_text()
            step = page.evaluate(FIRST_ACCEPTED, [0, position])
            assert step >= 1 and f"first accepted: step {step}\n" in text + "\n", (position, step, text)
            why = [line for line in text.splitlines() if line.startswith("why this token?")]
            assert why and (why[0].startswith(f"why this token? at step {step}, where it was first accepted: ")
                            or "now:" not in text), (position, text)
            for line in text.splitlines():  # a control token is named by its label; only its kind line quotes it
                if not line.endswith(": a control symbol, not text"):
                    assert not RAW_MARKER.search(line), (position, line)
            page.keyboard.press("Escape")
        assert page.locator("#dg-stack .dg-tok-eos, #dg-stack .dg-tok-pad, #dg-stack .dg-tok-special").count() > 0
        assert not problems, problems
    finally:
        page.close()


def swipe(cdp, x0: float, x1: float, y: float) -> None:
    """A one-finger horizontal swipe from x0 to x1 at height y, through the DevTools protocol's touch events."""
    cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [{"x": x0, "y": y}]})
    for k in range(1, 6):
        cdp.send("Input.dispatchTouchEvent",
                 {"type": "touchMove", "touchPoints": [{"x": x0 + (x1 - x0) * k / 5, "y": y}]})
    cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})


def test_a_swipe_steps_the_presenter_and_never_navigates_away(browser, served_app):
    page, problems = open_page(browser, served_app[1], width=390, height=844, has_touch=True, is_mobile=True)
    try:
        set_pace(page, "live")
        page.click("#dg-generate")
        wait_for_played(page, timeout_ms=120_000)
        page.click("#dg-present")
        page.wait_for_selector("#dgp-overlay", state="visible")
        page.evaluate("""() => { window.__moves = [];
            document.addEventListener('touchmove', (e) => window.__moves.push(e.defaultPrevented)); }""")
        url, history = page.url, page.evaluate("history.length")
        page.keyboard.press("Home")
        overlay = "Number(document.querySelector('#dgp-overlay').dataset.forward)"
        assert page.evaluate(overlay) == 0
        cdp = page.context.new_cdp_session(page)
        swipe(cdp, 300, 100, 500)  # leftward: the next forward
        page.wait_for_function(f"{overlay} === 1")
        assert page.get_attribute("#dgp-overlay", "data-playing") == "true"  # (the engine's end is not on screen)
        assert page.get_attribute("#dgp-replay-play", "aria-label") == "play"  # a swipe pauses, as a step does
        swipe(cdp, 300, 320, 500)  # too short to be a swipe
        assert page.evaluate(overlay) == 1
        page.evaluate("window.__moves = []")
        swipe(cdp, 2, 380, 500)  # rightward from the screen's edge (the browser's "back" gesture): the previous one
        page.wait_for_function(f"{overlay} === 0")
        assert page.evaluate("window.__moves.length") > 0 and all(page.evaluate("window.__moves"))
        assert page.url == url and page.evaluate("history.length") == history  # still here, nothing navigated
        assert page.locator("#dgp-overlay").is_visible()
        assert not problems, problems
    finally:
        page.close()

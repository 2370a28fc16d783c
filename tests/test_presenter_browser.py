"""The live app's presenter in headless Chromium: ?present=1 opens it, a live run is buffered and played one forward
per 1.4 s while the engine runs ahead, the replay player's keys and captions work, an uploaded trace plays the same
way, hostile trace strings show as text. Screenshots go to artifacts/presenter/ (looked at by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pages import open_page, set_number
from test_trace import hostile_trace

pytestmark = pytest.mark.slow
SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "presenter"
OVERLAY = "document.querySelector('#dgp-overlay')"


def set_up_a_short_run(page, tokens: int) -> None:
    """A raw prompt, `tokens` tokens, 8 steps a block, adaptive stopping off (every block takes 8 forwards)."""
    page.fill("#dg-prompt textarea", "And he said")
    page.check("#dg-raw input[type=checkbox]")
    page.get_by_label("Adaptive stopping").uncheck()
    set_number(page, "Max new tokens", tokens)
    set_number(page, "Max denoising steps", 8)


def state(page) -> dict:
    """The overlay's data-forward, data-playing ("true" until the engine's last forward is on screen) and buffered."""
    return page.evaluate(f"({{...{OVERLAY}.dataset}})")


def paused(page) -> bool:
    """Whether the overlay's player is paused (its play button offers to play)."""
    return page.get_attribute("#dgp-replay-play", "aria-label") == "play"


def test_presenter_buffers_a_live_run_and_answers_the_keys(browser, served_app):
    page, problems = open_page(browser, served_app[1] + "?present=1", height=720)
    try:
        page.wait_for_selector("#dgp-overlay", state="visible")
        box = page.locator("#dgp-overlay").bounding_box()
        assert box["width"] == 1280 and box["height"] == 720  # over the header and the settings
        assert "Nothing to present yet" in page.inner_text("#dgp-replay-caption")
        page.keyboard.press("Escape")
        assert page.locator("#dgp-overlay").is_hidden()
        assert "present" not in page.url  # a reload stays on the page
        set_up_a_short_run(page, 128)
        page.click("#dg-present")
        page.click("#dgp-generate")
        page.wait_for_function(f"{OVERLAY}.dataset.forward === '0'", timeout=60_000)
        assert "block 1 starts as 64 random tokens" in page.inner_text("#dgp-replay-caption")
        assert state(page)["playing"] == "true"
        # the engine runs ahead: the page holds more forwards than it has shown
        page.wait_for_function(f"Number({OVERLAY}.dataset.buffered) >= 4", timeout=60_000)
        assert int(state(page)["forward"]) <= 2
        page.wait_for_function(f"{OVERLAY}.dataset.forward === '1'", timeout=5_000)
        assert "positions accepted" in page.inner_text("#dgp-replay-caption")
        page.keyboard.press(" ")
        assert paused(page) and state(page)["playing"] == "true"  # paused, before the engine's end
        page.wait_for_selector("#dg-meter .dg-meter[data-state=done]", timeout=120_000)
        page.wait_for_function(f"Number({OVERLAY}.dataset.buffered) === 16", timeout=10_000)  # 2 blocks x 8 steps
        page.keyboard.press("End")
        assert state(page)["forward"] == "15"
        assert "Block 2 is committed after 8 forwards" in page.inner_text("#dgp-replay-caption")
        page.keyboard.press("Home")
        assert state(page)["forward"] == "0"
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        assert state(page)["forward"] == "2"
        page.keyboard.press("ArrowLeft")
        assert state(page)["forward"] == "1"
        page.keyboard.press("b")
        assert state(page)["forward"] == "8"  # the next block's first forward
        assert "block 2 starts" in page.inner_text("#dgp-replay-caption")
        page.keyboard.press(" ")
        assert not paused(page) and state(page)["playing"] == "true"
        page.keyboard.press(" ")
        assert paused(page)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "live-1280x720.png"))
        page.keyboard.press("Escape")
        assert page.locator("#dgp-overlay").is_hidden()
        assert not problems, problems
    finally:
        page.close()


def test_presenter_plays_an_uploaded_trace(browser, served_app, tmp_path):
    page, problems = open_page(browser, served_app[1], height=720)
    try:
        page.click("#dg-keep .label-wrap")
        page.set_input_files("#dg-upload-trace input[type=file]", str(hostile_trace().save(tmp_path / "h.json")))
        page.wait_for_function("window.dgLive.done() && window.dgLive.have().endsWith(':6')", timeout=60_000)
        page.click("#dg-present")
        page.wait_for_function(f"{OVERLAY}.dataset.buffered === '6'", timeout=30_000)
        assert state(page)["forward"] == "0" and state(page)["playing"] == "true" and not paused(page)
        page.keyboard.press("End")
        assert state(page)["forward"] == "5"
        assert page.evaluate("window.__pwned") is None
        assert "<script>" in page.inner_text("#dgp-stack")  # a hostile token shows as its text
        assert not problems, problems
    finally:
        page.close()

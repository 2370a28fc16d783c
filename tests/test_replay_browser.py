"""The offline HTML replay in headless Chromium with networking off: no request but the file itself, no page
error, plays to the last step, keyboard and slider work, hostile strings never run. Screenshots go to
artifacts/replay/ (looked at by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.replay_size import synthetic_trace
from diffgemma_ui.replay_html import write_replay
from test_trace import hostile_trace

pytestmark = pytest.mark.slow
SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "replay"


def open_offline(browser, path: Path):
    """The page at `path` in a fresh offline context; returns (page, requests, problems)."""
    context = browser.new_context(offline=True, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    requests, problems = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    page.goto(path.as_uri())
    page.wait_for_function("document.body.dataset.ready !== 'false'", timeout=60_000)
    return page, requests, problems


def forward(page) -> int:
    return int(page.evaluate("document.body.dataset.forward"))


def test_replay_plays_offline_to_the_last_step(browser, tmp_path):
    trace = synthetic_trace(canvas=64, steps=8, blocks=2, vocab=262_144)
    path = write_replay(trace, tmp_path / "replay.html")
    page, requests, problems = open_offline(browser, path)
    try:
        assert page.evaluate("document.body.dataset.ready") == "true", page.inner_text("#dg-replay-error")
        last = len(trace.frames) - 1
        assert forward(page) == last  # opens on the finished run
        page.keyboard.press("Home")
        assert forward(page) == 0
        assert page.locator("#dg-canvas .dg-block-live .dg-chip").count() == 64
        assert page.locator("#dg-stack .dg-block:not([hidden])").count() == 0
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        assert forward(page) == 2
        page.keyboard.press("ArrowLeft")
        assert forward(page) == 1
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "step2.png"), full_page=True)
        page.click("#dg-replay-play")
        assert page.evaluate("document.body.dataset.playing") == "true"
        page.wait_for_function("document.body.dataset.playing === 'false'", timeout=60_000)
        assert forward(page) == last
        assert page.locator("#dg-stack .dg-block:not([hidden])").count() == 2  # both blocks committed
        assert "reached max new tokens" in page.inner_text("#dg-canvas")
        assert page.locator("#dg-heatmap .main-svg").count() > 0 and page.locator("#dg-order .main-svg").count() > 0
        page.locator("#dg-replay-slider").fill("9")
        assert forward(page) == 9
        assert page.inner_text("#dg-replay-label").startswith("forward 10/16 · block 2 · step 2")
        page.screenshot(path=str(SHOTS / "slider.png"), full_page=True)
        assert problems == []
        assert requests == [path.as_uri()], "the page made a network request"
    finally:
        page.context.close()


def test_replay_plots_keep_only_buttons_that_work_offline_and_count_in_whole_positions(browser, tmp_path):
    trace = synthetic_trace(canvas=64, steps=8, blocks=2, vocab=262_144)
    page, requests, problems = open_offline(browser, write_replay(trace, tmp_path / "replay.html"))
    try:
        for plot in ("#dg-heatmap", "#dg-order", "#dg-entropy"):
            titles = page.locator(f"{plot} .modebar-btn").evaluate_all("bs => bs.map(b => b.dataset.title)")
            assert "Download plot as a PNG" in titles and "Reset axes" in titles, titles
            assert not {"Box Select", "Lasso Select", "Share chart..."} & set(titles), (plot, titles)
        ticks = page.locator("#dg-entropy .y2tick text").all_text_contents()
        assert ticks == ["0", "10", "20", "30", "40", "50", "60"], ticks  # not the left axis's 17.3, 34.6, ...
        assert problems == [] and requests == [page.url]
    finally:
        page.context.close()


def test_hostile_trace_replays_without_running_its_strings(browser, tmp_path):
    path = write_replay(hostile_trace(), tmp_path / "hostile.html")
    page, requests, problems = open_offline(browser, path)
    try:
        assert page.evaluate("document.body.dataset.ready") == "true"
        page.keyboard.press("Home")
        page.click("#dg-replay-play")
        page.wait_for_function("document.body.dataset.playing === 'false'", timeout=60_000)
        assert page.evaluate("window.__pwned") is None
        assert page.locator("#dg-canvas img, #dg-stack img, #dg-replay-prompt img").count() == 0
        assert "<script>window.__pwned=1</script>" in page.inner_text("#dg-replay-prompt")
        page.screenshot(path=str(SHOTS / "hostile.png"), full_page=True)
        assert problems == [] and requests == [path.as_uri()]
    finally:
        page.context.close()

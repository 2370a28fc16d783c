"""One run per tab, whatever starts it, and a queue a visitor can see and leave (issue 13 items 1 and 10).

In headless Chromium against an app of its own whose engine runs one request at a time, so that a second tab waits
in the queue. Every frame is slowed by a few milliseconds so that a run lasts long enough to be interrupted on any
machine.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from diffgemma_ui import build_app
from pages import free_port, open_page, run_key, set_number, set_up_a_long_run, wait_for_played

pytestmark = pytest.mark.slow
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
FRAME_DELAY_S = 0.03


@pytest.fixture(scope="module")
def one_at_a_time(engine):
    """(app, url, calls): the playground on `engine` with one run at a time; `calls` lists each run's prompt."""
    calls = []
    original = engine.frames

    def slowed(prompt, *args, **kwargs):
        if threading.current_thread().name == "diffgemma-run":  # the app's runs, not the test's own generate()
            calls.append(prompt)
        for frame in original(prompt, *args, **kwargs):
            time.sleep(FRAME_DELAY_S)
            yield frame

    engine.frames = slowed
    app = build_app(engine)
    app.queue(default_concurrency_limit=1)
    _, url, _ = app.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True)
    try:
        yield app, url, calls
    finally:
        app.close()
        del engine.frames


def run_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "diffgemma-run" and t.is_alive())


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_restarting_with_shift_enter_leaves_one_run_its_buttons_and_its_views(browser, one_at_a_time, engine):
    app, url, calls = one_at_a_time
    page, problems = open_page(browser, url)
    set_up_a_long_run(page)
    set_number(page, "Max denoising steps", 4)  # a block every 4 forwards: the stack fills while it runs
    page.click("#dg-generate")
    page.wait_for_selector("#dg-stack .dg-block-done", timeout=120_000)  # the first run has finished blocks
    # Change the request and press Shift+Enter twice while the first run goes on: one run must remain, the last
    prompt = "The Lord is my shepherd"
    page.fill("#dg-prompt textarea", prompt)
    set_number(page, "Max new tokens", 128)
    set_number(page, "Max denoising steps", 2)
    before, first_run = len(calls), run_key(page)
    page.press("#dg-prompt textarea", "Shift+Enter")
    page.press("#dg-prompt textarea", "Shift+Enter")
    wait_for_played(page, first_run, timeout_ms=120_000)  # a newer run ended and its last forward is on screen
    settings = engine.recommended.replace(max_new_tokens=128, max_denoising_steps=2, adaptive_stopping=False)
    expected = engine.generate(prompt, settings, raw=True, seed=0)
    page.wait_for_function("(t) => document.querySelector('#dg-text textarea').value === t", arg=expected.text,
                           timeout=10_000)
    time.sleep(1.0)  # anything an older run still sent would arrive now
    assert page.locator("#dg-text textarea").input_value() == expected.text
    blocks = len(expected.forwards_per_block)
    assert page.locator("#dg-stack .dg-block-done").count() == blocks  # no block of the first run left
    assert page.get_attribute("#dg-stack .dg-stack", "data-blocks") == str(blocks)
    assert "ended at end-of-sequence" in page.inner_text(".dg-meter") or "max new tokens" in page.inner_text(
        ".dg-meter")
    assert page.locator("#dg-generate").is_enabled() and page.locator("#dg-stop").is_disabled()
    wait_until(lambda: app.hub.runs.active() == 0 and run_threads() == 0, 15, "every run to end")
    restarts = calls[before:]
    assert restarts in ([prompt], [prompt, prompt]), restarts  # at most one run per press, each of the new prompt
    assert not problems, problems
    page.close()


def test_a_queued_run_says_so_and_stop_leaves_the_queue(browser, one_at_a_time):
    app, url, calls = one_at_a_time
    first, problems_first = open_page(browser, url)
    set_up_a_long_run(first)
    first.click("#dg-generate")
    first.wait_for_selector(".dg-meter[data-state='running']", timeout=120_000)
    started = len(calls)

    second, problems = open_page(browser, url, width=390, height=844)
    second.fill("#dg-prompt textarea", "Queued prompt")
    second.click("#dg-generate")
    second.wait_for_selector(".dg-meter[data-state='queued']", timeout=10_000)
    assert "Queued" in second.inner_text("#dg-meter")
    second.wait_for_function("document.querySelector('#dg-meter').innerText.includes('1 of 1')", timeout=10_000)
    assert second.locator("#dg-stop").is_enabled() and second.locator("#dg-generate").is_disabled()
    ARTIFACTS.mkdir(exist_ok=True)
    second.screenshot(path=str(ARTIFACTS / "browser_queued.png"), full_page=False)
    second.click("#dg-stop")
    # the page marks the meter "stopping" at the click; the server's answer then replaces it
    second.wait_for_function(
        "!['queued', 'stopping'].includes(document.querySelector('#dg-meter .dg-meter').dataset.state)",
        timeout=10_000)
    assert second.get_attribute("#dg-meter .dg-meter", "data-state") == "idle", second.inner_text("#dg-meter")
    assert "left the queue" in second.inner_text("#dg-meter")
    assert second.locator("#dg-generate").is_enabled() and second.locator("#dg-stop").is_disabled()

    if first.locator("#dg-stop").is_enabled():  # (the first run may have ended at end-of-sequence by now)
        first.click("#dg-stop")
    first.wait_for_selector(".dg-meter[data-state='done']", timeout=30_000)
    # the engine is free again: the request that left the queue must not run now
    time.sleep(2.0)
    assert len(calls) == started and "Queued prompt" not in calls
    assert first.locator("#dg-generate").is_enabled() and first.locator("#dg-stop").is_disabled()
    wait_until(lambda: app.hub.runs.active() == 0, 15, "every run to end")
    assert not problems and not problems_first, (problems, problems_first)
    first.close()
    second.close()

"""The block being denoised stays in view (issue 13 item 9): at 1280x900 with many finished blocks, and on a
390 px phone right after pressing Generate. Screenshots go to artifacts/."""

from __future__ import annotations

from pathlib import Path

import pytest
from pages import open_page, set_number, set_up_a_long_run

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
    stack = page.locator("#dg-stack .dg-stack")
    at_bottom = stack.evaluate("s => s.scrollHeight <= s.clientHeight + 2 || s.scrollTop + s.clientHeight >= "
                               "s.scrollHeight - 40")
    assert at_bottom, "the newest finished block is not in view"
    assert stack.evaluate("s => s.clientHeight") <= 0.4 * height  # bounded
    page.evaluate("() => { const stop = document.querySelector('#dg-stop'); if (!stop.disabled) stop.click(); }")
    try:
        page.wait_for_selector(".dg-meter[data-state='done']", timeout=30_000)
    except Exception as error:  # say where the page stood (seen once in a full run, not reproduced alone)
        raise AssertionError(f"no final view 30 s after Stop: meter {page.inner_html('#dg-meter')[:2000]!r}; "
                             f"problems {problems}") from error
    assert not problems, problems
    page.close()

"""The block being denoised stays in view (issue 13 item 9): at 1280x900 with many finished blocks, and on a
390 px phone right after pressing Generate; a finished block taller than the stack shows its header, and no Plotly
toolbar covers the plot titles at phone width. Screenshots go to artifacts/."""

from __future__ import annotations

from pathlib import Path

import pytest

from pages import open_page, set_number, set_up_a_long_run, wait_for_play_buttons

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
    stack = page.locator("#dg-stack .dg-stack")
    assert stack.evaluate(NEWEST_HEADER_IN_VIEW), "the newest finished block's header is not in view"
    assert stack.evaluate("s => s.clientHeight") <= 0.4 * height  # bounded
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
    page.wait_for_selector(".dg-meter[data-state='done']", timeout=120_000)
    stack = page.locator("#dg-stack .dg-stack")
    stack.wait_for()
    assert stack.evaluate("s => s.lastElementChild.offsetHeight > s.clientHeight")  # the case this test is about
    page.wait_for_function(f"() => ({NEWEST_HEADER_IN_VIEW})(document.querySelector('#dg-stack .dg-stack'))",
                           timeout=5_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#dg-canvas-wrap").screenshot(path=str(ARTIFACTS / "browser_tall_block_390.png"))
    # and Plotly's toolbar, which would cover the plot titles at this width, is hidden
    toolbars = page.locator("#dg-heatmap .modebar-container, #dg-order .modebar-container")
    assert toolbars.count() == 2 and all(t.evaluate("m => getComputedStyle(m).display") == "none"
                                         for t in toolbars.all())
    assert not problems, problems
    page.close()


# (fill of each play/pause label, fill of its button) and, for one plot hovered, the boxes of its title and mode bar
BUTTON_FILLS = """() => [...document.querySelectorAll('#dg-heatmap .updatemenu-button')].map(b =>
  [getComputedStyle(b.querySelector('text')).fill, getComputedStyle(b.querySelector('rect')).fill])"""
TITLE_AND_BAR = """id => { const root = document.querySelector(id), box = e => e.getBoundingClientRect();
  const t = box(root.querySelector('.gtitle')), m = box(root.querySelector('.modebar'));
  return {title: [t.left, t.top, t.right, t.bottom], bar: [m.left, m.top, m.right, m.bottom]}; }"""


def _luminance(css_rgb: str) -> float:
    """WCAG relative luminance of "rgb(r, g, b)"."""
    channels = [int(c) / 255 for c in css_rgb[css_rgb.index("(") + 1:css_rgb.index(")")].split(",")[:3]]
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
    page.get_by_label("Adaptive stopping").uncheck()  # a block of several steps: the heatmap gets its buttons
    page.fill("#dg-seed input", "0")
    page.click("#dg-generate")
    page.wait_for_selector(".dg-meter[data-state='done']", timeout=120_000)
    wait_for_play_buttons(page, problems)
    fills = page.evaluate(BUTTON_FILLS)
    assert len(fills) == 2 and all(_contrast(text, button) >= 4.5 for text, button in fills), fills
    for plot in ("#dg-heatmap", "#dg-order", "#dg-entropy"):
        page.locator(plot).hover()
        page.wait_for_function(f"getComputedStyle(document.querySelector('{plot} .modebar')).opacity === '1'")
        boxes = page.evaluate(TITLE_AND_BAR, plot)
        title, bar = boxes["title"], boxes["bar"]
        overlap = min(title[2], bar[2]) > max(title[0], bar[0]) and min(title[3], bar[3]) > max(title[1], bar[1])
        assert not overlap, (plot, boxes)
    page.locator("#dg-plot-row").screenshot(path=str(ARTIFACTS / f"plots_hover_{theme}.png"))
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

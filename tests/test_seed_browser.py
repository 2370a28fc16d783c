"""Numbers that cross into the browser round-trip exactly (issue 13 item 2): a 63-bit seed typed in runs with that
seed, and a drawn seed (-1) is shown, fits its box, and typed back in reproduces the run."""

from __future__ import annotations

import re

import pytest

from engine.settings import DRAWN_SEED_BITS, draw_seed
from pages import open_page, run_key, set_number, wait_for_played

pytestmark = pytest.mark.slow
SEED_BOX = "#dg-seed input, #dg-seed textarea"
BIG_SEED = 8329200678117864925  # the reported seed: 2**53 < it < 2**63; a browser number would round it


def run_with_seed(page, seed: str) -> tuple[str, int]:
    """Type `seed`, generate, and return (the text, the seed the meter reports)."""
    page.fill(SEED_BOX, seed)
    before = run_key(page)  # the meter must read this click's run, not the last one's
    page.click("#dg-generate")
    wait_for_played(page, before, timeout_ms=120_000)
    reported = int(re.search(r"seed (\d+)", page.inner_text(".dg-meter")).group(1))
    return page.locator("#dg-text textarea").input_value(), reported


def test_seeds_round_trip_exactly_and_fit_their_box(browser, served_app, engine):
    _, url = served_app
    page, problems = open_page(browser, url)
    page.fill("#dg-prompt textarea", "In the beginning")
    page.check("#dg-raw input[type=checkbox]")
    page.get_by_label("Adaptive stopping").uncheck()
    set_number(page, "Max new tokens", 64)
    set_number(page, "Max denoising steps", 2)
    settings = engine.recommended.replace(max_new_tokens=64, max_denoising_steps=2, adaptive_stopping=False)

    text, reported = run_with_seed(page, str(BIG_SEED))
    assert reported == BIG_SEED
    assert text == engine.generate("In the beginning", settings, raw=True, seed=BIG_SEED).text
    assert page.get_by_role("button", name="Random seed").count() == 1  # a name, not an emoji
    box = page.locator(SEED_BOX)
    assert box.evaluate("el => el.scrollWidth <= el.clientWidth"), "a 19-digit seed does not fit its box"

    drawn_text, drawn = run_with_seed(page, "-1")
    assert 0 <= drawn < 2**DRAWN_SEED_BITS
    again, reported = run_with_seed(page, str(drawn))  # the reported seed, typed back in
    assert reported == drawn and again == drawn_text
    assert not problems, problems
    page.close()


def test_drawn_seeds_fit_a_javascript_number():
    assert all(0 <= draw_seed() < 2**53 for _ in range(1000))

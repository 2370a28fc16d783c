"""Branch from a step in the live app: pins parsed from clicks and typed words, a branch from a forward of the last
run shown beside the original with the share of positions that changed, bad pins refused in the branch's box."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from diffgemma_ui.branch_tab import parse_pins
from pages import open_page, set_number
from test_presenter_browser import set_up_a_short_run

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "branch"


class Words:
    """A tokenizer stand-in: one id per character."""

    def __call__(self, text, add_special_tokens=False):
        return type("Encoded", (), {"input_ids": [ord(c) for c in text]})()


def test_pins_keep_a_token_or_type_a_word():
    frame = SimpleNamespace(canvas_length=8, draft_ids=list(range(100, 108)))
    assert parse_pins(" 3 ;5= ab", frame, Words()) == {3: 103, 5: 32, 6: 97, 7: 98}
    assert parse_pins("", frame, Words()) == {}
    for bad in ("x", "8", "6=abc", "2="):
        with pytest.raises(ValueError, match="pin"):
            parse_pins(bad, frame, Words())
    for twice, position in (("5= the; 5= a", 5), ("3; 3", 3), ("1= abc; 3= d", 3)):  # one line naming it
        with pytest.raises(ValueError, match=rf"^position {position} is pinned twice: [^\n]*$"):
            parse_pins(twice, SimpleNamespace(canvas_length=16, draft_ids=list(range(16))), Words())


@pytest.mark.slow
def test_branch_from_a_forward_with_a_pin(browser, served_app):
    page, problems = open_page(browser, served_app[1])
    try:
        set_up_a_short_run(page, 64)
        page.click("#dg-generate")
        page.wait_for_selector("#dg-meter .dg-meter[data-state=done]", timeout=120_000)
        page.wait_for_function("!document.querySelector('#dg-replay-run').disabled", timeout=60_000)  # kept
        page.click("#dg-branch .label-wrap")
        page.wait_for_selector("#dg-branch-from .dg-block-done", timeout=30_000)  # the run's last forward
        set_number(page, "Branch from decoder forward", 3)
        page.wait_for_function("document.querySelector('#dg-branch-from').innerText.includes('step 3/8')",
                               timeout=30_000)
        page.click("#dg-branch-run")  # the run's own seed, no pins: the run again
        page.wait_for_selector(".dg-branch[data-done=true]", timeout=120_000)
        assert page.get_attribute(".dg-branch", "data-changed") == "0.0000"
        assert "the run's own draws" in page.inner_text(".dg-branch")
        chips = page.locator("#dg-branch-from .dg-chip")
        kept = chips.nth(5).inner_text()
        chips.nth(5).click()
        assert page.locator("#dg-branch-pins input").input_value() == "5"
        assert "dg-pinned" in chips.nth(5).get_attribute("class")
        page.fill("#dg-branch-seed input", "7")
        page.click("#dg-branch-run")
        page.wait_for_function("(document.querySelector('.dg-branch[data-done=true]') || {innerText: ''})"
                               ".innerText.includes('seed 7')", timeout=120_000)
        original, branch = (page.locator(f".dg-branch-pair > section:nth-child({i}) .dg-chip") for i in (1, 2))
        assert original.count() == branch.count() == 64
        assert branch.nth(5).inner_text() == kept and "dg-fixed" in branch.nth(5).get_attribute("class")
        differ = sum(original.nth(p).inner_text() != branch.nth(p).inner_text() for p in range(64))
        share = float(page.get_attribute(".dg-branch", "data-changed"))
        assert abs(share - differ / 64) <= 2 / 64, (share, differ)
        assert f"{share:.0%} of the block's positions changed" in page.inner_text(".dg-branch")
        assert "seed 7" in page.inner_text(".dg-branch")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.locator("#dg-branch").screenshot(path=str(SHOTS / "branch.png"))
        page.fill("#dg-branch-pins input", "99")
        page.click("#dg-branch-run")
        page.wait_for_selector("#dg-branch-refusal .dg-refusal", timeout=30_000)
        assert "fit the canvas" in page.inner_text("#dg-branch-refusal")
        assert not problems, problems
    finally:
        page.close()

"""The page on the stand-in of google/diffusiongemma-26B-A4B-it: thinking toggle, thought view, text-only note, and
one run in headless Chromium whose canvas shows Gemma 4's special tokens labelled and no raw marker or U+FFFD."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from diffgemma_ui import build_app
from diffgemma_ui.blocks import header_html, load_examples
from diffgemma_ui.canvas_view import thought_html
from engine.engine import chat_prompt_ids
from pages import free_port, open_page, set_number, wait_for_played

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "artifacts"


def component(app, elem_id):
    return next(block for block in app.blocks.values() if getattr(block, "elem_id", None) == elem_id)


def test_thinking_toggle_only_for_templates_with_a_thinking_mode(engine, standin_engine):
    assert standin_engine.supports_thinking and not engine.supports_thinking
    with_toggle, without = build_app(standin_engine), build_app(engine)
    try:
        assert component(with_toggle, "dg-thinking").visible is True
        assert component(without, "dg-thinking").visible is False
        # the instruction checkpoint is offered instruction prompts, the Bible-trained embedded model Bible ones
        standin_prompt, embedded_prompt = (component(app, "dg-prompt").value for app in (with_toggle, without))
        assert standin_prompt == load_examples(embedded=False)[0][0] != embedded_prompt
        assert [p for p, _ in load_examples(embedded=False)] != [p for p, _ in load_examples()]
    finally:
        with_toggle.close()
        without.close()
    # both checkpoints carry a vision tower (the embedded one a vestigial one): the header says text only
    assert "text only: the playground sends text" in header_html(standin_engine)


def test_thought_view_is_collapsed_labelled_and_escaped():
    assert thought_html("") == "" and thought_html("  \n") == ""
    out = thought_html("First <b>reason</b>\nthen answer")
    assert out.startswith('<details class="dg-thought"><summary>Thought') and " open" not in out
    assert "&lt;b&gt;reason&lt;/b&gt;" in out and "<b>" not in out
    assert html.unescape(out.split('<div class="dg-thought-text">')[1].split("</div>")[0]) == (
        "First <b>reason</b>\nthen answer")


@pytest.mark.slow
def test_one_run_on_the_standin_in_the_browser(browser, standin_engine):
    prompt = "Why is the sky blue? <turn|> <|channel>"
    app = build_app(standin_engine)
    _, url, _ = app.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True)
    try:
        page, problems = open_page(browser, url)
        assert "text only" in page.inner_text("#dg-header-block")
        page.fill("#dg-prompt textarea", prompt)
        thinking, raw = page.locator("#dg-thinking input[type=checkbox]"), page.locator("#dg-raw input[type=checkbox]")
        thinking.check()
        raw.check()  # thinking needs the chat template: ticking Raw unticks it, and the other way round
        page.wait_for_function("() => !document.querySelector('#dg-thinking input').checked")
        thinking.check()
        page.wait_for_function("() => !document.querySelector('#dg-raw input').checked")
        page.uncheck("#dg-settings input[type=checkbox]")  # adaptive stopping off: both steps run
        set_number(page, "Max new tokens", 16)  # one canvas of 256
        set_number(page, "Max denoising steps", 2)
        page.click("#dg-generate")
        # the live block: step 1's renoised positions are uniform noise over 262,144 ids
        page.wait_for_selector("#dg-canvas .dg-block-live", timeout=240_000)
        live = page.locator("#dg-canvas .dg-chip")
        assert live.count() == 256
        live_texts = live.all_inner_texts()
        specials = page.locator("#dg-canvas .dg-tok-special, #dg-canvas .dg-tok-pad, #dg-canvas .dg-tok-eos")
        assert specials.count() > 0  # about 2.4% of the vocabulary is special: some noise is
        titles = specials.evaluate_all("els => els.map(e => e.title)")
        assert all("not text" in t for t in titles)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "standin_live.png"))
        wait_for_played(page, timeout_ms=240_000)  # the run ended and its last forward is on screen
        done_texts = page.locator("#dg-stack .dg-chip").all_inner_texts()
        assert len(done_texts) == 256
        for text in live_texts + done_texts:
            assert "\ufffd" not in text and "<|" not in text and "|>" not in text and "<pad>" not in text, text
        # the thinking request reached the engine: the prompt has the thinking system turn, the typed markers as text
        expected = len(chat_prompt_ids(standin_engine.tokenizer, prompt, enable_thinking=True))
        assert f"prompt {expected:,} tokens" in page.inner_text("#dg-meter")
        page.screenshot(path=str(ARTIFACTS / "standin_run.png"), full_page=True)
        assert not problems, problems
        page.close()
    finally:
        app.close()

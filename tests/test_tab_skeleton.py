"""The tab skeleton (`diffgemma_ui.tab`): one error helper, the refusal box that keeps a refused request's reason on
the page until the next run (every tab), and API signatures derived from the settings table."""

from __future__ import annotations

import inspect
import time

import gradio as gr
import pytest

from diffgemma_ui import build_app
from diffgemma_ui.hub import Outcome, received
from diffgemma_ui.runs import pushed
from diffgemma_ui.tab import Refusal, guarded, refusal_html, setting_params, user_error
from engine.settings import SETTING_NAMES
from engine import DiffusionSettings
from engine.settings import SETTINGS
from pages import open_page

TABS = ("playground", "race", "compare", "chat", "infill")
PANELS = ("branch",)  # a Playground panel with its own refusal box


def test_user_error_words_every_error_once_without_a_traceback():
    assert user_error(ValueError("prompt is empty")).message == "prompt is empty"
    assert user_error("plain words").message == "plain words"
    assert "engine failed (RuntimeError: boom)" in user_error(RuntimeError("boom")).message
    assert user_error(ValueError("x"), prefix="Run B failed: ").message == "Run B failed: x"
    assert user_error(ValueError("x")).print_exception is False


def test_a_refusal_is_noted_and_cleared_by_the_next_request_that_passes():
    def check(prompt):
        if not prompt.strip():
            raise user_error(ValueError("prompt is empty"))
        return "ok"

    refusal, step = Refusal(), guarded(check, 1)
    with pytest.raises(gr.Error, match="prompt is empty"):
        step(refusal, "  ")
    assert refusal.reason == "prompt is empty"
    box = refusal_html(refusal.reason)
    assert "Not run" in box and "prompt is empty" in box and 'role="alert"' in box
    assert step(refusal, "Hello") == ("ok", "")  # the check's output, then the box emptied
    assert refusal.reason == "" and refusal_html(refusal.reason) == ""
    def broken():
        raise RuntimeError("tokenizer broke")

    with pytest.raises(RuntimeError):
        guarded(broken, 0)(refusal)
    assert "engine failed" in refusal.reason  # an unexpected failure is shown in words too


def test_the_refusal_box_escapes_the_reason():
    box = refusal_html('<img src=x onerror="alert(1)">')
    assert "<img" not in box and "&lt;img" in box


def test_settings_parameters_follow_the_settings_table():
    rec = DiffusionSettings()
    params = setting_params(rec)
    assert [name for name, _, _ in params] == [row.name for row in SETTINGS]
    assert SETTING_NAMES[0] == "max_new_tokens" and SETTING_NAMES[-1] == "adaptive_stopping"
    kinds = {name: kind for name, kind, _ in params}
    assert kinds["max_new_tokens"] is int and kinds["entropy_bound"] is float and kinds["adaptive_stopping"] is bool
    assert all(default == getattr(rec, name) for name, _, default in params)


def test_every_tab_has_a_refusal_box_wired_to_its_checks(engine):
    app = build_app(engine)
    boxes = {block._id: block.elem_id for block in app.blocks.values()
             if isinstance(block, gr.HTML) and (block.elem_id or "").endswith("-refusal")}
    assert sorted(boxes.values()) == sorted(f"dg-{tab}-refusal" for tab in TABS + PANELS)
    written = {boxes[out] for dep in app.fns.values() for out in
               [getattr(o, "_id", o) for o in dep.outputs] if out in boxes}
    assert written == set(boxes.values())
    signature = inspect.signature(next(d.fn for d in app.fns.values() if d.api_name == "generate"))
    assert list(signature.parameters) == ["prompt", "raw", *SETTING_NAMES, "seed", "request"]


@pytest.mark.slow
def test_a_refused_reason_stays_on_the_page_past_the_toast_in_every_tab(browser, served_app):
    _, url = served_app
    page, problems = open_page(browser, url)
    refuse = {
        "playground": ("#dg-prompt textarea", "   ", "#dg-generate", "prompt is empty"),
        "race": ("#dg-race-prompt textarea", "   ", "#dg-race-start", "prompt is empty"),
        "compare": ("#dg-compare-prompt textarea", "   ", "#dg-compare-run", "prompt is empty"),
        "chat": ("#dg-chat-message textarea", "   ", "#dg-chat-send", "empty"),
        "infill": ("#dg-infill-template textarea", "no blanks here", "#dg-infill-run", "has no blank"),
    }
    for tab, (box, text, button, _) in refuse.items():
        page.click(f"#dg-tab-{tab}-button")
        page.wait_for_selector(f"#dg-tab-{tab}", state="visible")
        page.fill(box, text)
        page.click(button)
        page.wait_for_selector(f"#dg-{tab}-refusal .dg-refusal", timeout=15_000)
    time.sleep(12)  # Gradio's toast closes after 10 s
    for tab, (_, _, _, reason) in refuse.items():
        page.click(f"#dg-tab-{tab}-button")
        shown = page.locator(f"#dg-{tab}-refusal .dg-refusal")
        assert shown.is_visible() and reason in shown.inner_text() and "Not run" in shown.inner_text(), tab
    # the next run that passes its checks empties the box
    page.click("#dg-tab-infill-button")
    page.fill("#dg-infill-template textarea", "In the [___] God")
    page.click("#dg-infill-run")
    page.wait_for_function("!document.querySelector('#dg-infill-refusal .dg-refusal')", timeout=30_000)
    assert not problems, problems
    page.close()


def test_a_callback_mode_becomes_a_frame_source():
    def run(emit):
        for item in ("a", "b"):
            emit(item)
        return "result"

    assert list(pushed(run)) == ["a", "b", "result"]

    def broken(emit):
        emit("a")
        raise ValueError("bad order")

    items = pushed(broken)
    assert next(items) == "a"
    with pytest.raises(ValueError, match="bad order"):
        next(items)


def test_what_a_source_sends_after_its_final_frame_is_received_before_that_frame(engine):
    frames = list(engine.frames("In the beginning", DiffusionSettings(max_new_tokens=8, max_denoising_steps=2),
                                raw=True, seed=0))
    got = []

    def source():
        yield from frames
        yield Outcome("outcome")

    out = []
    for frame in received(source(), got.append):
        out.append(frame)
        if frame.done:
            assert got == ["outcome"]  # already there when the final frame is passed on
            break
    assert out == frames
    assert list(received(iter(frames), None)) == frames

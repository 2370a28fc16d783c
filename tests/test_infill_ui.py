"""The Infill tab (diffgemma_ui/infill_tab.py): fixed positions marked on the canvas and never changing, plots over the
blank positions, escaped template text, a plain refusal when the template does not fit, `/infill`, and the tab in
Chromium. Screenshots go to artifacts/infill/."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pytest
from gradio_client.exceptions import AppError

from diffgemma_ui.hub import Hub
from diffgemma_ui.infill_tab import InfillTab, blank_frames, blank_plots, filled_html, infill_canvas_html
from diffgemma_ui.live_view import refused_meter
from diffgemma_ui.session import SessionState
from diffgemma_ui.tab import stop_run
from engine.infill import InfillLayout
from pages import open_page, record_states, recorded_states, set_number
from synthetic import parse_html, synthetic_frame

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "infill"
TEMPLATE = "In the beginning God created the [___ 2] and the [___ 3]. <end_of_turn> And [___]."


def small_layout():
    """Positions 0, 1, 4, 5 fixed, 2, 3 blank; 6 and 7 pads after the template."""
    fixed = [True, True, False, False, True, True, True, True]
    return InfillLayout(canvas_ids=[10, 11, -1, -1, 12, 13, 0, 0], fixed=fixed, blanks=[2, 3], template_positions=6)


def test_canvas_marks_exactly_the_fixed_positions():
    layout = small_layout()
    frame = synthetic_frame(8, ["a", "b", "<script>", "d", "e", "f", "g", "h"], accepted=[True] * 8)
    html = infill_canvas_html(frame, layout, status="<b>x</b>")
    block = html[html.index("<section"):]  # after the legends
    chips = [attrs for _, attrs in parse_html(block).tags if "dg-chip" in attrs.get("class", "").split()]
    assert ["dg-fixed" in attrs["class"] for attrs in chips] == layout.fixed
    # fixed chips are not coloured by a confidence they never had; the blanks are
    assert ["style" in attrs for attrs in chips] == [not f for f in layout.fixed]
    assert all("fixed by the template" in attrs["title"] for attrs in chips if "dg-fixed" in attrs["class"])
    assert "<script>" not in html and "<b>x</b>" not in html and 'data-fixed="6"' in html


def test_plots_cover_the_blank_positions_only():
    layout = small_layout()
    frames = [synthetic_frame(8, list("abcdefgh"), step=s, accepted=[True, True, s == 1, True, True, True, True, True])
              for s in range(2)]
    cut = blank_frames(frames, layout.blanks)
    assert [f.canvas_length for f in cut] == [2, 2] and cut[1].confidence == [frames[1].confidence[i] for i in (2, 3)]
    heatmap, order, entropy = blank_plots(frames, layout.blanks, final=True)
    assert heatmap["data"][0]["x"] == [2, 3] and order["data"][0]["x"] == [2, 3]
    assert heatmap["layout"]["xaxis"]["type"] == "category"
    assert all("position 2" in t or "position 3" in t for row in heatmap["data"][0]["hovertext"] for t in row)
    assert entropy["data"][0]["y"] == [1, 2]  # accepted blank positions per step, out of 2


def test_filled_template_escapes_text_and_marks_the_fills(engine):
    tokenizer = engine.tokenizer
    tab = InfillTab(Hub(engine))
    layout = tab.layout("<script>alert(1)</script> [___ 2] end")
    the = tokenizer(" the", add_special_tokens=False)["input_ids"][0]
    ids = [i if i >= 0 else the for i in layout.canvas_ids]
    html = filled_html(tokenizer, layout, ids, state="done")
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert html.count('<mark class="dg-fill"') == 1 and 'data-state="done"' in html and "Filled template" in html
    unfilled = filled_html(tokenizer, layout, ids, state="unfilled")
    assert 'data-state="unfilled"' in unfilled and "Not filled" in unfilled and "Filled template" not in unfilled


@pytest.fixture(scope="module")
def tab(engine):
    return InfillTab(Hub(engine))


def test_templates_that_cannot_run_are_refused_plainly(tab):
    for template, message in [("word " * 50 + "[___ 20]", r"takes \d+ canvas positions .* one canvas holds 64"),
                              ("no blanks", "no blank"), ("a [___ x]", "malformed blank"), ("", "empty")]:
        with pytest.raises(gr.Error, match=message):
            tab.request(template, "", "recommended", 4, 0)
        with pytest.raises(gr.Error, match=message):
            next(tab.fill_stream(SessionState(), None, template, "", "recommended", 4, 0))
    with pytest.raises(gr.Error, match="seed"):
        tab.request("a [___]", "", "recommended", 4, "x")


@pytest.mark.slow
def test_fixed_chips_hold_the_template_tokens_in_every_render(tab, engine):
    layout = tab.layout(TEMPLATE)
    renders = list(tab.fill_stream(SessionState(), None, TEMPLATE, "", "careful", 6, 4))
    assert len(renders) >= 2
    expected = None
    for canvas, meter, *_ in renders:
        if 'data-fixed="' not in canvas:  # the "encoding" view before the first frame: the meter says starting
            assert 'data-state="running"' in meter and "starting: encoding the prompt" in meter
            continue
        block = canvas[canvas.index("<section"):]
        chips = [attrs for tag, attrs in parse_html(block).tags if "dg-chip" in attrs.get("class", "").split()]
        fixed = [attrs["title"].split("\n")[0] for attrs in chips if "dg-fixed" in attrs["class"]]
        assert len(chips) == 64 and len(fixed) == sum(layout.fixed)
        expected = expected or fixed
        assert fixed == expected  # the fixed chips never change from render to render
    final_canvas, meter, filled, text, heatmap, order, entropy, run, stop = renders[-1]
    assert text.startswith("In the beginning God created the") and text.endswith(".")
    assert "<end_of_turn>" in text  # typed marker text stays text
    assert heatmap["data"][0]["x"] == layout.blanks and run["interactive"] is True and stop["interactive"] is False


@pytest.mark.slow
def test_a_stopped_fill_shows_its_draft_as_unfilled_and_no_filled_text(tab):
    state = SessionState()
    stream = tab.fill_stream(state, None, TEMPLATE, "", "careful", 128, 4)
    for canvas, *_ in stream:
        if 'data-fixed="' in canvas:  # the first frame: a draft exists, the canvas is not committed yet
            break
    stop_run(state)  # the Stop button
    canvas, meter, filled, text, *_, run, stop = list(stream)[-1]
    assert "Stopped" in canvas and 'data-state="unfilled"' in filled and "Not filled" in filled
    assert text == "" and run["interactive"] is True and stop["interactive"] is False


@pytest.mark.slow
def test_a_refused_fill_marks_the_previous_fill_as_the_previous_runs(tab):
    state = SessionState()
    assert isinstance(refused_meter(state), type(gr.skip()))  # no previous fill
    renders = list(tab.fill_stream(state, None, TEMPLATE, "", "recommended", 3, 4))
    meter = refused_meter(state)
    assert 'data-state="refused"' in meter and "Everything below is from the previous run" in meter
    assert renders[-1][1].split('data-tps="')[1][:8] == meter.split('data-tps="')[1][:8]  # the same figures


# -- /infill ---------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_infill_api_returns_the_filled_text_and_positions(client, engine):
    text, summary = client.predict("The [___ 2] is blue. <end_of_turn>", "", 3, 2.0, 0.05, 0.1, 1, 0.05, True, 7,
                                   api_name="/infill")
    assert text.startswith("The") and text.endswith("is blue. <end_of_turn>") and summary["seed"] == 7
    before = engine.tokenizer("The", add_special_tokens=False)["input_ids"]
    after = engine.tokenizer(" is blue. <end_of_turn>", add_special_tokens=False, split_special_tokens=True)
    assert summary["blank_positions"] == [len(before), len(before) + 1] and len(summary["fills"]) == 1
    assert [summary["token_ids"][i] for i in summary["fixed_positions"]] == before + after["input_ids"]
    with pytest.raises(AppError, match="one canvas holds 64"):
        client.predict("word " * 70 + "[___]", "", 3, 2.0, 0.05, 0.1, 1, 0.05, True, 7, api_name="/infill")


# -- the page --------------------------------------------------------------------------------------------------------
FIXED_TEXTS_JS = """() => Array.from(document.querySelectorAll('#dg-infill-canvas section .dg-chip.dg-fixed'))
                         .map(c => c.getAttribute('title').split('\\n')[0])"""


@pytest.mark.slow
def test_infill_tab_in_the_browser_keeps_fixed_positions(browser, served_app):
    page, problems = open_page(browser, served_app[1])
    try:
        page.click("button[role=tab]:has-text('Infill')")
        page.fill("#dg-infill-template textarea", TEMPLATE)
        set_number(page, "Denoising steps (at most)", 24)
        # every render of the canvas while it denoises: (forward shown, the fixed chips' first lines)
        record_states(page, "() => [document.querySelector('#dg-infill-canvas [data-forward]')?.dataset.forward, "
                            f"({FIXED_TEXTS_JS})()]")
        page.click("#dg-infill-run")
        page.wait_for_selector("#dg-infill-filled .dg-filled[data-state=done]", timeout=120_000)
        seen = [fixed for forward, fixed in recorded_states(page) if fixed]
        forwards = {forward for forward, fixed in recorded_states(page) if fixed}
        assert len(forwards) >= 2 and all(s == seen[-1] for s in seen), recorded_states(page)
        fixed_count = int(page.locator("#dg-infill-canvas .dg-infill-canvas").get_attribute("data-fixed"))
        assert len(seen[-1]) == fixed_count > 0
        assert page.input_value("#dg-infill-text textarea").startswith("In the beginning God created the")
        assert page.locator("#dg-infill-filled mark.dg-fill").count() == 3
        assert page.locator("#dg-infill-heatmap .main-svg").count() > 0
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "infill-1280.png"), full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_timeout(500)
        page.screenshot(path=str(SHOTS / "infill-390.png"), full_page=True)
        # a template that cannot fit: a plain message, nothing run
        page.fill("#dg-infill-template textarea", "word " * 70 + "[___]")
        page.click("#dg-infill-run")
        page.wait_for_selector("text=one canvas holds 64", timeout=20_000)
        assert [p for p in problems if "one canvas holds" not in p] == []
    finally:
        page.close()

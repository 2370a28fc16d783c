"""Keeping and replaying runs in the playground: an uploaded trace reaches the page's player (which draws every
forward of it), the upload's refusals, `/export`, and the page (downloads after a run, upload, the player's slider) in
Chromium. Screenshots go to artifacts/keep/."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
from gradio_client import Client

from benchmarks.browser import synthetic_trace
from diffgemma_ui.keep import KeepHandlers, check_traceable
from diffgemma_ui.playground_tab import PlaygroundTab
from diffgemma_ui.session import SessionState
from engine.settings import DiffusionSettings
from engine.trace import load_trace
from pages import open_page, record_states, recorded_states, run_raw
from test_gradio_api import SMALL
from test_trace import HOSTILE, hostile_trace

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "keep"
NO_ENGINE = SimpleNamespace(engine=None)  # a hub for the keep handlers that a trace needs no model for


def uploaded(tmp_path, trace, session=None) -> tuple:
    """`KeepHandlers.load_upload` of `trace` saved under `tmp_path`: (feed, text, trace download, html download)."""
    return KeepHandlers(NO_ENGINE).load_upload(session or SessionState(), str(trace.save(tmp_path / "upload.json")))


def fed_page(browser, served_app, message: str):
    """A Playground page whose player was fed `message` (as the upload's output feeds it), at the slow pace, paused
    at the first forward; (page, problems)."""
    page, problems = open_page(browser, served_app[1])
    page.select_option("#dg-replay-pace", "teach")
    page.evaluate("(m) => window.dgLive.feed(m)", message)
    page.wait_for_function("window.dgLive.done()")
    page.evaluate("window.dgLive.pause()")
    return page, problems


# What the page shows at a forward: canvas forward, label, finished blocks and their chips, the meter's tokens,
# the heatmap's title and its cover's first hidden row, hover text
SHOWN = """(k) => {
  if (k !== null) window.dgLive.player().step(k);
  const heat = document.querySelector('#dg-heatmap'), cover = heat.layout.shapes[0];
  const cards = [...document.querySelectorAll('#dg-meter .dg-stat')].map((c) => c.innerText.split('\\n'));
  return {forward: Number(document.querySelector('#dg-canvas .dg-canvas').dataset.forward),
          label: document.querySelector('#dg-replay-label').textContent,
          blocks: document.querySelectorAll('#dg-stack .dg-block-done').length,
          stackChips: document.querySelectorAll('#dg-stack .dg-chip').length,
          tokens: Object.fromEntries(cards.map(([value, label]) => [label.toLowerCase(), value])).tokens,
          title: heat.layout.title.text, hidden: cover.visible ? cover.y0 : null, hover: 'hovertext' in heat.data[0]};
}"""


@pytest.mark.slow
def test_an_uploaded_trace_reaches_the_player_and_each_forward_shows_its_step(browser, served_app, tmp_path):
    trace = synthetic_trace(canvas=16, steps=4, blocks=2, vocab=400)
    feed, text, *_ = uploaded(tmp_path, trace)
    assert text == trace.text  # the whole run's committed text
    page, problems = fed_page(browser, served_app, feed)
    try:
        page.wait_for_function("typeof Plotly !== 'undefined' && document.querySelector('#dg-heatmap').data")
        shown = page.evaluate(SHOWN, 5)
        assert shown["forward"] == 5 and shown["label"].startswith("forward 6/8")
        assert shown["blocks"] == 1 and shown["stackChips"] == 16  # the finished block's chips
        assert shown["title"].startswith("Confidence per step and position")
        assert page.evaluate(SHOWN, -3)["forward"] == 0 and page.evaluate(SHOWN, 99)["forward"] == 7  # clamped
        for k in (3, 7):  # the meter reads the run's newest forward (the engine's), whichever forward is shown
            assert page.evaluate(SHOWN, k)["tokens"] == str(trace.frames[-1].committed_tokens) == "32"
        assert not problems, problems
    finally:
        page.close()


@pytest.mark.slow
def test_a_playing_replay_draws_the_heatmap_of_the_canvas_forward_with_hover_text(browser, served_app, tmp_path):
    trace = synthetic_trace(canvas=16, steps=4, blocks=2, vocab=400)
    page, problems = fed_page(browser, served_app, uploaded(tmp_path, trace)[0])
    try:
        page.wait_for_function("typeof Plotly !== 'undefined' && document.querySelector('#dg-heatmap').data")
        page.select_option("#dg-replay-pace", "fast")
        record_states(page, SHOWN.replace("(k) => {", "() => { const k = null;"))  # every forward it shows
        page.evaluate("window.dgLive.replay()")
        page.wait_for_function("document.querySelector('#dg-canvas [data-forward]').dataset.playing === 'false' && "
                               "!window.dgLive.player().playing()", timeout=30_000)
        views = {view["forward"]: view for view in recorded_states(page)}
        assert sorted(views) == list(range(8))
        for k, view in views.items():
            frame = trace.frames[k]
            # the heatmap is of the canvas forward's block, its rows after the forward's step covered
            assert f"block {frame.block_index + 1} \u00b7 " in view["title"], (k, view)
            assert view["hidden"] == (frame.step_index + 1.5 if frame.step_index < 3 else None), (k, view)
            assert view["hover"], (k, view)  # hover text at every forward (a block of 16 x 4 cells)
        assert not problems, problems
    finally:
        page.close()


@pytest.mark.slow
def test_hostile_trace_renders_escaped(browser, served_app, tmp_path):
    feed, text, *_ = uploaded(tmp_path, hostile_trace())
    assert text.startswith(HOSTILE)  # plain text in a textbox, never HTML
    page, problems = fed_page(browser, served_app, feed)
    try:
        for k in range(6):
            page.evaluate(SHOWN, k)
            seen = page.evaluate("""() => [...document.querySelectorAll('#dg-canvas *, #dg-stack *, #dg-meter *')]
                .map((e) => [e.tagName, e.getAttributeNames()])""")
            assert not any(tag in ("SCRIPT", "IMG") for tag, _ in seen), k
            assert not any(name.startswith("on") for _, names in seen for name in names), k
        assert page.evaluate("window.__pwned") is None
        assert "<script>window.__pwned=1</script>" in page.inner_text("#dg-canvas") + page.inner_text("#dg-stack")
        assert not problems, problems
    finally:
        page.close()


def test_check_traceable_refuses_runs_too_long_to_keep():
    check_traceable(DiffusionSettings(max_new_tokens=1024, max_denoising_steps=128), 256)
    with pytest.raises(ValueError, match="could exceed the 20 MB trace limit"):
        check_traceable(DiffusionSettings(max_new_tokens=4096, max_denoising_steps=512), 256)


def test_upload_refuses_a_bad_trace_with_its_message(tmp_path):
    keep = KeepHandlers(NO_ENGINE)
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "diffgemma-trace", "version": 7}', encoding="utf-8")
    with pytest.raises(gr.Error, match="This trace cannot be replayed: trace version 7 is not supported"):
        keep.load_upload(SessionState(), str(bad))
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (20 * 2**20 + 1))
    with pytest.raises(gr.Error, match="the limit is 20 MB"):
        keep.load_upload(SessionState(), str(big))


def test_upload_then_step(tmp_path):
    trace = synthetic_trace(canvas=16, steps=4, blocks=2, vocab=400)
    session = SessionState()
    feed, text, trace_file, html_file = uploaded(tmp_path, trace, session)
    assert session.trace == trace and session.request is None and session.sent == 8
    message = json.loads(feed)  # the whole trace for the page's player, which steps through it
    assert message["start"] == 0 and message["final"] is True and len(message["frames"]) == 8
    assert [(f["block"], f["step"]) for f in message["frames"]] == [(f.block_index, f.step_index)
                                                                    for f in trace.frames]
    assert load_trace(Path(trace_file["value"])) == trace
    assert Path(html_file["value"]).read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    tab = PlaygroundTab(SimpleNamespace(engine=None))
    again = json.loads(tab.catch_up(session, ""))  # a page that lost it asks again: the trace from its start
    assert again["key"] == message["key"] and again["start"] == 0 and len(again["frames"]) == 8
    assert json.loads(tab.catch_up(session, f"{message['key']}:3"))["start"] == 3  # only what the page lacks


@pytest.mark.slow
def test_export_api_returns_a_trace_of_the_run(served_app):
    client = Client(served_app[1], verbose=False)
    document = client.predict(*SMALL, api_name="/export")
    trace = load_trace(json.dumps(document))
    _, summary = client.predict(*SMALL, api_name="/generate")
    assert trace.seed == 11 and trace.prompt == SMALL[0] and trace.raw is True
    assert trace.frames[-1].committed_ids == summary["token_ids"]
    assert len(trace.frames) == summary["forwards"]
    with pytest.raises(Exception, match="trace limit"):
        client.predict("In the beginning", True, 4096, 512, 0.5, 0.4, 0.8, 1, 0.05, True, 1, api_name="/export")


@pytest.mark.slow
def test_page_keeps_a_run_and_replays_an_upload(browser, served_app, tmp_path):
    page, problems = open_page(browser, served_app[1])
    try:
        run_raw(page, "In the beginning", tokens=128, steps=3, timeout_ms=120_000)
        page.click("#dg-keep .label-wrap")
        page.wait_for_function("(b => b !== null && !b.disabled)(document.querySelector('#dg-download-trace'))",
                               timeout=60_000)  # the accordion renders its buttons after it opens
        with page.expect_download() as download:
            page.click("#dg-download-trace")
        download.value.save_as(tmp_path / "run.json")
        trace = load_trace(tmp_path / "run.json")
        assert trace.settings.max_denoising_steps == 3 and trace.raw and trace.prompt == "In the beginning"
        with page.expect_download() as download:
            page.click("#dg-download-html")
        assert download.value.suggested_filename.endswith(".replay.html")

        page.set_input_files("#dg-upload-trace input[type=file]", str(hostile_trace().save(tmp_path / "h.json")))
        page.wait_for_function("window.dgLive.done() && window.dgLive.have().endsWith(':6')", timeout=60_000)
        page.wait_for_function("document.querySelector('#dg-text textarea').value.startsWith('<script>')",
                               timeout=30_000)  # the trace's text, as text
        page.locator("#dg-replay-slider").fill("1")  # the player's slider: decoder forward 2
        page.wait_for_function("document.querySelector('#dg-replay-label').innerText.startsWith('forward 2/6')",
                               timeout=30_000)
        assert page.get_attribute("#dg-canvas .dg-canvas", "data-forward") == "1"
        assert page.evaluate("window.__pwned") is None
        assert page.locator("#dg-canvas .dg-chip").count() == 16
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "replay_upload.png"), full_page=True)

        bad = tmp_path / "bad.json"
        bad.write_text('{"format": "diffgemma-trace", "version": 3}', encoding="utf-8")
        page.click("#dg-upload-trace button[aria-label='Clear']")
        page.set_input_files("#dg-upload-trace input[type=file]", str(bad))
        page.wait_for_selector("#dg-playground-refusal .dg-refusal", timeout=30_000)  # it stays, not only a toast
        assert "trace version 3 is not supported" in page.inner_text("#dg-playground-refusal")
        page.wait_for_function("!document.querySelector('#dg-upload-trace').innerText.includes('bad.json')")
        page.screenshot(path=str(SHOTS / "refused.png"), full_page=False)
        assert [p for p in problems if "trace version 3" not in p] == []
    finally:
        page.close()

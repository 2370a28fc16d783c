"""Keeping and replaying runs in the playground: the replay views, the upload's refusals, `/export`, and the page
(downloads after a run, upload, replay slider) in Chromium. Screenshots go to artifacts/keep/."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest
from gradio_client import Client

from benchmarks.browser import synthetic_trace
from diffgemma_ui.handlers import Playground
from diffgemma_ui.keep import KeepHandlers, check_traceable, committed_text, render_trace, snapshot_upto
from diffgemma_ui.session import SessionState
from engine.settings import DiffusionSettings
from engine.trace import load_trace
from pages import open_page, run_raw, set_number
from synthetic import parse_html
from test_gradio_api import SMALL
from test_trace import HOSTILE, hostile_trace
from test_ui_views import FakeEngine

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "keep"


def test_snapshot_and_render_of_a_trace_step():
    trace = synthetic_trace(canvas=16, steps=4, blocks=2, vocab=400)
    snap = snapshot_upto(trace, 6)
    assert snap.frames_seen == 6 and snap.block_count == 2 and len(snap.finished_blocks()) == 1
    assert snap.latest is trace.frames[5]
    assert snapshot_upto(trace, 0).frames_seen == 1 and snapshot_upto(trace, 99).frames_seen == 8
    view = render_trace(trace, 6)
    assert 'data-forward="5"' in view.canvas and "forward 6/8" in view.canvas
    assert len(parse_html(view.stack).tags) > 16  # the finished block's chips
    assert view.heatmap["layout"]["title"]["text"].startswith("Confidence per step and position")
    assert committed_text(trace, 8) == trace.text
    assert committed_text(trace, 4) == "".join(trace.tokens[i] for i in trace.frames[3].committed_ids)


def test_a_playing_replay_draws_the_heatmap_of_the_canvas_forward_with_hover_text_at_the_end():
    trace = synthetic_trace(canvas=16, steps=4, blocks=2, vocab=400)
    session = SessionState()
    session.trace = trace
    views = list(KeepHandlers(Playground(FakeEngine())).replay_play(session, 1, interval_s=0))
    assert [v[-1] for v in views] == list(range(1, 9))
    for k, view in enumerate(views, start=1):
        frame = trace.frames[k - 1]
        heat = view[4]
        assert f'data-forward="{frame.forward_index}"' in view[1]  # the canvas, and the heatmap at the same step
        assert f"block {frame.block_index + 1} \u00b7 " in heat["layout"]["title"]["text"]
        assert len(heat["data"][0]["z"]) == frame.step_index + 1
        assert ("hovertext" in heat["data"][0]) == (k == len(trace.frames))


def test_hostile_trace_renders_escaped():
    view = render_trace(hostile_trace(), 5)
    html = view.canvas + view.stack + view.meter
    collector = parse_html(html)
    assert not any(tag in ("script", "img") for tag, _ in collector.tags)
    assert not any(name.startswith("on") for _, attrs in collector.tags for name in attrs)
    assert view.text.startswith(HOSTILE)  # plain text in a textbox, never HTML


def test_check_traceable_refuses_runs_too_long_to_keep():
    check_traceable(DiffusionSettings(max_new_tokens=1024, max_denoising_steps=128), 256)
    with pytest.raises(ValueError, match="could exceed the 20 MB trace limit"):
        check_traceable(DiffusionSettings(max_new_tokens=4096, max_denoising_steps=512), 256)


def test_upload_refuses_a_bad_trace_with_its_message(tmp_path):
    keep = KeepHandlers(SimpleNamespace(engine=None))
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "diffgemma-trace", "version": 7}', encoding="utf-8")
    with pytest.raises(gr.Error, match="This trace cannot be replayed: trace version 7 is not supported"):
        keep.load_upload(SessionState(), str(bad))
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (20 * 2**20 + 1))
    with pytest.raises(gr.Error, match="the limit is 20 MB"):
        keep.load_upload(SessionState(), str(big))


def test_upload_then_step(tmp_path):
    keep = KeepHandlers(SimpleNamespace(engine=None))
    trace = synthetic_trace(canvas=16, steps=4, blocks=2, vocab=400)
    session = SessionState()
    outputs = keep.load_upload(session, str(trace.save(tmp_path / "t.json")))
    assert session.trace == trace and session.snapshot.frames_seen == 8
    slider, trace_file, html_file = outputs[-3:]
    assert slider["maximum"] == 8 and slider["value"] == 8 and slider["visible"]
    assert load_trace(Path(trace_file["value"])) == trace
    assert Path(html_file["value"]).read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    step = keep.replay_step(session, 3)
    assert 'data-forward="2"' in step[1] and session.snapshot.frames_seen == 3


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
        page.wait_for_selector("#dg-replay-step", state="visible", timeout=60_000)
        page.wait_for_function("document.querySelector('#dg-canvas').innerText.includes('Replay of a trace')",
                               timeout=30_000)
        set_number(page, "Replay: decoder forward", 2)
        page.wait_for_function("document.querySelector('#dg-canvas').innerText.includes('forward 2/6')",
                               timeout=30_000)
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

"""Unit tests of the UI's pure parts from synthetic frames (escaping, canvas, plots, meter, validation, worker) and
of the Playground tab's handlers on a fake engine (the feed of a run's frames to the page's player)."""

from __future__ import annotations

import asyncio
import copy
import html
import json
import math
import re
import threading
import time
from pathlib import Path

import gradio as gr
import plotly.graph_objects as go
import pytest
import torch

from diffgemma_ui import canvas_view, meter, playground_tab, plots, text
from diffgemma_ui.hub import Hub
from diffgemma_ui.live_view import status_text
from diffgemma_ui.playground_tab import PlaygroundTab
from diffgemma_ui.runs import MAX_LIVE_GAP_S, RunRecord, RunTimeLimitExceeded, RunWorker, default_live_rate
from diffgemma_ui.session import SessionState
from diffgemma_ui.tab import PLOT_INTERVAL_S, PlotClock
from diffgemma_ui.text import escape_html, escape_plotly, token_html, visible_token
from diffgemma_ui.validation import MAX_PROMPT_CHARS, build_request, build_settings, check_prompt, preset_values
from engine import PRESET_NAMES, DiffusionSettings, Frame, GenerationResult, preset
from engine.settings import parse_seed, spec
from playground import fed_frames, messages, page_run
from synthetic import ListTokenText, StubModel, canvas_html, parse_html, synthetic_frame

REPO = Path(__file__).resolve().parents[1]

HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    '" onmouseover="alert(1)',
    "' onclick='alert(2)",
    "${alert(3)}",
    "{{value}}",
    "`x`",
    "&amp;",
    "\U0001f600\U0001f3b2",
    "\u05e9\u05dc\u05d5\u05dd",  # Hebrew (RTL)
    "\u202eevil\u202c",  # right-to-left override
    "\n",
    " the",
    "\t",
    "",
    "\x00\x07\x1b",
    "a\u200bb",
    "<a href=javascript:alert(1)>x</a>",
    "<b>bold</b><br>",
]
N = 16  # canvas length of synthetic frames


def generate(tab: PlaygroundTab, *inputs) -> tuple[str, dict]:
    """`/generate`'s handler to its end (no client to go away)."""
    return asyncio.run(tab.generate_api_served(*inputs))


def make_frame(step=0, block=0, tokens=None, accepted=None, done=False, block_done=False, committed=None, **kw):
    """A synthetic `Frame` of an N-position canvas; tokens default to the hostile strings."""
    tokens = tokens or [HOSTILE[i % len(HOSTILE)] for i in range(N)]
    return synthetic_frame(N, tokens, step=step, block=block, accepted=accepted, committed=committed, done=done,
                           block_done=block_done, **kw)


ALLOWED_TAGS = {"div", "section", "header", "span", "p", "b", "wbr"}
ALLOWED_ATTRS = {"class", "title", "style", "data-forward", "data-block", "data-blocks", "data-state", "data-tps",
                 "data-ttff", "aria-hidden"}


def assert_safe_html(fragment: str):
    """Only the view's own tags and attributes; no markup from tokens survives."""
    collected = parse_html(fragment)
    for tag, attrs in collected.tags:
        assert tag in ALLOWED_TAGS, tag
        assert set(attrs) <= ALLOWED_ATTRS, attrs  # no on* handlers, no href/src
    for bad in ("<script", "<img", "<a ", "${", "{{"):
        assert bad not in fragment
    return collected


# -- text ------------------------------------------------------------------------------------------------------------
def test_visible_token_marks_whitespace_and_invisible_characters():
    assert visible_token(" the") == "\u00b7the"
    assert visible_token("\n") == "\u21b5"
    assert visible_token("\t") == "\u21e5"
    assert visible_token("") == "\u2205"
    assert visible_token("\x00\x1b\x7f") == "\\x00\\x1b\\x7f"
    assert visible_token("a\r\n") == "a\\r\u21b5"
    for code in range(0x80):  # ASCII only, or a mark in common fonts: no missing-glyph box for any byte
        assert set(visible_token(chr(code))) <= {chr(c) for c in range(0x20, 0x7F)} | {"\u00b7", "\u21b5", "\u21e5"}
    assert visible_token("\u202eevil") == "\u27e8U+202E\u27e9evil"
    assert visible_token("a\u200bb") == "a\u27e8U+200B\u27e9b"
    assert visible_token("\U0001f600") == "\U0001f600"
    assert visible_token("\u05e9\u05dc\u05d5\u05dd") == "\u05e9\u05dc\u05d5\u05dd"
    assert visible_token(42) == "42"


@pytest.mark.parametrize("token", HOSTILE)
def test_token_html_escapes_everything(token):
    out = token_html(token)
    assert "<" not in out and ">" not in out and '"' not in out and "'" not in out
    assert "$" not in out and "{" not in out and "`" not in out
    assert html.unescape(out) == visible_token(token)


def test_escape_helpers():
    assert escape_html('<a b="c">') == "&lt;a b=&quot;c&quot;&gt;"
    assert escape_plotly("<br>") == "&lt;br&gt;"
    assert escape_plotly("a b") == "a b"


# -- canvas ----------------------------------------------------------------------------------------------------------
def test_canvas_escapes_hostile_tokens_in_text_and_tooltips():
    live = make_frame(step=3)
    out = canvas_html([], live)
    collected = assert_safe_html(out)
    chips = [a for t, a in collected.tags if t == "span" and "dg-chip" in a.get("class", "") and "title" in a]
    assert len(chips) == N
    titles = "\n".join(a["title"] for a in chips)
    # tooltips carry token, confidence, entropy and first-accepted step, decoded back to the visible token
    assert "\u201c<script>alert(1)</script>\u201d" in titles
    assert "confidence" in titles and "entropy" in titles and "first accepted" in titles
    text = "".join(collected.text)
    assert "<script>alert(1)</script>" in text  # shown literally, as text


def test_canvas_accepted_vs_noisy_chips():
    live = make_frame(step=2)
    collected = parse_html(canvas_view.block_html(live, live=True))
    chips = [a for t, a in collected.tags if t == "span" and "dg-chip" in a.get("class", "")]
    accepted = [a for a in chips if "dg-accepted" in a["class"]]
    noisy = [a for a in chips if "dg-noisy" in a["class"]]
    assert len(accepted) == sum(live.accepted) and len(noisy) == N - sum(live.accepted)
    assert all("background:#" in a["style"] for a in accepted)
    assert all("style" not in a for a in noisy)
    assert all("noise" in a["title"] and "current guess" in a["title"] for a in noisy)
    # noisy chips show the noisy input token, accepted chips the draft token
    html_out = canvas_view.block_html(live, live=True)
    assert "noise&lt;1&gt;" in html_out and "noise&lt;0&gt;" not in html_out


def test_canvas_stacks_finished_blocks_above_live_and_fades_after_eos():
    first = make_frame(step=5, block=0, block_done=True, committed=list(range(N)))
    second = make_frame(step=4, block=1, block_done=True, committed=list(range(N + 5)))
    live = make_frame(step=1, block=2)
    out = canvas_html([first, second], live)
    assert_safe_html(out)
    blocks = [a["data-block"] for t, a in parse_html(out).tags if t == "section"]
    assert blocks == ["0", "1", "2"]
    assert out.index('data-block="1"') < out.index("dg-block-live")
    second_html = canvas_view.block_html(second, live=False)
    assert second_html.count("dg-committed") == 5 and second_html.count("dg-pad") == N - 5
    assert 'data-forward="' + str(live.forward_index) + '"' in out


def test_canvas_cache_matches_and_empty_state():
    finished = [make_frame(step=3, block_done=True, committed=list(range(N)))]
    cached = [canvas_view.block_html(f, live=False) for f in finished]
    assert canvas_html(finished, None) == canvas_html(finished, None, finished_html=cached)
    assert canvas_html([], None) == canvas_view.EMPTY_CANVAS_HTML
    status = canvas_html(finished, None, status="<b>done</b>")
    assert "&lt;b&gt;done&lt;/b&gt;" in status


def test_chip_rejects_unknown_kind():
    with pytest.raises(ValueError):
        canvas_view.chip_html("x", kind="bogus", position=0, confidence=0.5, entropy=0.1, first_accepted_step=-1)


# -- plots -----------------------------------------------------------------------------------------------------------
def _all_strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _all_strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _all_strings(v)


def _hostile_block(steps=4):
    return [make_frame(step=s, accepted=[(i + s) % 2 == 0 for i in range(N)]) for s in range(steps)]


@pytest.mark.parametrize("builder", ["heatmap", "heatmap_live", "order", "entropy"])
def test_plots_escape_hover_texts_and_titles(builder):
    frames = _hostile_block()
    fig = {
        "heatmap": lambda: plots.confidence_heatmap(frames, animate=True),
        "heatmap_live": lambda: plots.confidence_heatmap(frames, animate=False),
        "order": lambda: plots.unmasking_order(frames[-1]),
        "entropy": lambda: plots.entropy_and_acceptance(frames),
    }[builder]()
    go.Figure(fig)  # valid Plotly schema
    text = fig.to_json()
    json.loads(text)
    for s in _all_strings(fig):
        for bad in ("<script", "<img", "<a ", "<b>", "\u202e", "\n"):
            assert bad not in s, (bad, s)
    if builder != "entropy":
        hover = "".join(_all_strings(fig["data"][0].get("hovertext")))
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in hover
        assert "&lt;img\u00b7src=x\u00b7onerror=alert(1)&gt;" in hover  # spaces made visible
        assert "\U0001f600" in hover and "\u27e8U+202E\u27e9" in hover


def test_heatmap_animation_has_slider_play_button_and_one_frame_per_step():
    frames = _hostile_block(steps=5)
    fig = plots.confidence_heatmap(frames, animate=True)
    slider = fig["layout"]["sliders"][0]
    assert len(slider["steps"]) == 5
    for k, step in enumerate(slider["steps"]):
        (frame_obj,), options = step["args"]
        shape = frame_obj["layout"]["shapes"][0]
        assert shape["visible"] == (k < 4) and shape["y0"] == k + 1.5
        assert step["method"] == "animate" and options["mode"] == "immediate"
    play, pause = fig["layout"]["updatemenus"][0]["buttons"]
    assert play["method"] == "animate" and len(play["args"][0]) == 5
    assert pause["args"][0] == [None]
    assert len(fig["data"][0]["z"]) == 5 and len(fig["data"][0]["z"][0]) == N
    assert "sliders" not in plots.confidence_heatmap(frames, animate=False)["layout"]
    assert [step["label"] for step in slider["steps"]] == ["1", "2", "3", "4", "5"]
    long = plots.confidence_heatmap([make_frame(step=k) for k in range(128)], animate=True)["layout"]["sliders"][0]
    labels = [step["label"] for step in long["steps"]]  # 128 steps: 32 stops, each named (Plotly thins them by width)
    assert labels == [str(k) for k in range(4, 129, 4)]
    assert long["active"] == 31 and long["steps"][-1]["args"][0][0]["name"] == "step 128"  # the last step shown
    assert [step["args"][0][0]["name"] for step in long["steps"][:2]] == ["step 4", "step 8"]


def test_unmasking_order_and_entropy_values():
    frames = _hostile_block(steps=3)
    order = plots.unmasking_order(frames[-1])
    ys = order["data"][0]["y"]
    for pos, step in enumerate(frames[-1].first_accepted_step):
        assert ys[pos] == (step + 1 if step >= 0 else 0.3)
    entropy = plots.entropy_and_acceptance(frames)
    assert entropy["data"][0]["y"] == [f.accepted_count for f in frames]
    assert entropy["data"][1]["y"] == [round(f.mean_entropy, 3) for f in frames]
    ticks = entropy["layout"]["xaxis"]
    assert ticks["tick0"] == 1 and ticks["dtick"] == 1  # whole steps: no 1.5 tick on a short block
    assert plots.entropy_and_acceptance(_hostile_block(steps=3) * 10)["layout"]["xaxis"]["dtick"] == 4


def test_a_finished_heatmap_shows_its_own_steps_and_no_empty_rows():
    short = [make_frame(step=k, max_denoising_steps=16, block_done=k == 2) for k in range(3)]
    for animate in (False, True):
        layout = plots.confidence_heatmap(short, animate=animate)["layout"]
        assert sorted(layout["yaxis"]["range"]) == [0.5, 3.5]  # rows 1..3, none empty below them
    stopped = [make_frame(step=k, max_denoising_steps=16, done=k == 1, stop_reason="cancelled" if k else "")
               for k in range(2)]
    assert sorted(plots.confidence_heatmap(stopped)["layout"]["yaxis"]["range"]) == [0.5, 2.5]
    live = [make_frame(step=k, max_denoising_steps=16) for k in range(3)]
    assert sorted(plots.confidence_heatmap(live)["layout"]["yaxis"]["range"]) == [0.5, 16.5]  # rows kept steady


def test_entropy_plot_counts_positions_in_whole_numbers():
    for n, step in ((4, 1), (16, 5), (64, 10), (256, 50), (1000, 200)):
        assert plots.whole_step(n) == step
    frames = [make_frame(step=k, block_done=k == 2) for k in range(3)]
    right = plots.entropy_and_acceptance(frames)["layout"]["yaxis2"]
    assert right["range"] == [0, N] and right["tickmode"] == "linear"  # not "sync": the left axis's odd positions
    assert right["tick0"] == 0 and isinstance(right["dtick"], int) and right["dtick"] == plots.whole_step(N)
    assert go.Figure(plots.entropy_and_acceptance(frames)).layout.yaxis2.dtick == 5


def test_plots_drop_selection_buttons_and_keep_narrow_titles_clear_of_the_mode_bar():
    frames = [make_frame(step=k, block_done=k == 2) for k in range(3)]
    figures = {"heatmap": plots.confidence_heatmap(frames), "order": plots.unmasking_order(frames[-1]),
               "entropy": plots.entropy_and_acceptance(frames), "empty heatmap": plots.confidence_heatmap([]),
               "empty order": plots.unmasking_order(None), "empty entropy": plots.entropy_and_acceptance([])}
    for name, fig in figures.items():
        assert {"select2d", "lasso2d"} <= set(fig["layout"]["modebar"]["remove"]), name  # no view reads a selection
        axes = [axis for key, axis in fig["layout"].items() if key[:5] in ("xaxis", "yaxis") and axis.get("visible", 1)]
        axes += [trace["colorbar"] for trace in fig["data"] if "colorbar" in trace]
        assert len(axes) >= (0 if name.startswith("empty") else 2), name
        assert all(axis["ticklabeloverflow"] == "allow" for axis in axes), name  # no measure of each tick label
    for name in ("order", "entropy", "empty order", "empty entropy"):  # half-width plots: the bar spans the top
        layout = figures[name]["layout"]
        title_top_px = (1 - layout["title"]["y"]) * layout["height"]
        assert title_top_px >= plots.TOOLBAR_PX and layout["margin"]["t"] >= plots.TOOLBAR_PX + 40, name
        assert layout["height"] == plots.HEIGHT + plots.TOOLBAR_PX, name  # the plot area keeps its height
    assert figures["order"]["layout"]["height"] == figures["empty order"]["layout"]["height"]  # no jump on a run
    assert figures["entropy"]["layout"]["height"] == figures["empty entropy"]["layout"]["height"]


def test_empty_figures_and_gradio_accepts_figure_specs():
    for fig in (plots.confidence_heatmap([]), plots.unmasking_order(None), plots.entropy_and_acceptance([])):
        go.Figure(fig)
        data = gr.Plot().postprocess(fig)
        assert data.type == "plotly" and json.loads(data.plot)["layout"]


# -- meter -----------------------------------------------------------------------------------------------------------
def test_meter_uses_engine_clock_fields_only():
    frame = make_frame(step=2, forwards_per_block=[4, 6], committed_tokens=10, tokens_per_second=123.456,
                       tokens_per_forward=1.25, elapsed_s=2.5, time_to_first_frame_s=0.0312)
    values = meter.meter_values(frame)
    assert values["tokens/s"] == "123.5" and values["tokens/forward"] == "1.25"
    assert values["forwards/block"] == "5" and values["elapsed"] == "2.50 s"  # an integral mean as an integer
    assert values["first frame"] == "31 ms" and values["tokens"] == "10"
    out = meter.meter_html(frame)
    assert 'data-tps="123.456"' in out and 'data-state="running"' in out and 'data-ttff="0.0312"' in out
    assert_safe_html(out)
    time.sleep(0.01)
    assert meter.meter_html(frame) == out  # the wall clock plays no part


def test_meter_before_a_run_and_at_the_end():
    idle = meter.meter_html(None)
    assert 'data-tps="0"' in idle and 'data-state="idle"' in idle
    done = make_frame(done=True, stop_reason="eos", tokens_per_second=float("nan"))
    out = meter.meter_html(done)
    assert 'data-state="done"' in out and "end-of-sequence" in out and 'data-tps="0"' in out


# -- validation ------------------------------------------------------------------------------------------------------
GOOD = dict(max_new_tokens=64, max_denoising_steps=8, entropy_bound=0.5, t_min=0.4, t_max=0.8,
            stability_threshold=1, confidence_threshold=0.05, adaptive_stopping=True)


@pytest.mark.parametrize("prompt, message", [
    ("", "empty"), ("   \n\t", "empty"), (None, "empty"), (123, "must be text"),
    ("x" * (MAX_PROMPT_CHARS + 1), "limit"),
])
def test_bad_prompts(prompt, message):
    with pytest.raises(ValueError, match=message):
        check_prompt(prompt)


@pytest.mark.parametrize("prompt", ["\U0001f600 hello", "\u05e9\u05dc\u05d5\u05dd", "a\x00b\x1b[31m", "\u202eabc"])
def test_unusual_prompts_are_accepted(prompt):
    assert check_prompt(prompt) == prompt


@pytest.mark.parametrize("name, value, message", [
    ("entropy_bound", float("nan"), "finite"),
    ("t_max", float("inf"), "finite"),
    ("max_new_tokens", -5, "max_new_tokens"),
    ("max_denoising_steps", "abc", "must be a number"),
    ("max_denoising_steps", None, "missing"),
    ("confidence_threshold", 0, "confidence_threshold"),
    ("t_min", 0.9, "t_min must be below t_max"),
    ("max_new_tokens", 5000, "max_new_tokens"),
    ("max_denoising_steps", 500, "at most 128 here"),
    ("stability_threshold", 1.5, "integer"),
    ("adaptive_stopping", "maybe", "true or false"),
    ("entropy_bound", True, "must be a number"),
])
def test_bad_settings(name, value, message):
    with pytest.raises(ValueError, match=message):
        build_settings({**GOOD, name: value})


def test_settings_accept_numeric_strings_and_api_limits():
    settings = build_settings({**GOOD, "max_new_tokens": "128", "t_min": "0.2"})
    assert settings.max_new_tokens == 128 and settings.t_min == 0.2
    assert build_settings({**GOOD, "max_denoising_steps": 300}, ui_limits=False).max_denoising_steps == 300


@pytest.mark.parametrize("seed, expected", [(-1, None), (None, None), ("", None), ("-1", None), (0, 0),
                                            (7.0, 7), ("12", 12), (2**63 - 1, 2**63 - 1)])
def test_seeds(seed, expected):
    assert parse_seed(seed) == expected


@pytest.mark.parametrize("seed", [-2, 1.5, float("nan"), float("inf"), 2**63, "abc", True])
def test_bad_seeds(seed):
    with pytest.raises(ValueError, match="seed"):
        parse_seed(seed)


def test_presets():
    recommended = DiffusionSettings(max_denoising_steps=32, entropy_bound=0.5)
    assert preset_values("recommended", recommended)["max_denoising_steps"] == 32
    assert preset_values("fast", recommended)["entropy_bound"] == 2.5
    tidy = preset_values("fast", DiffusionSettings(entropy_bound=0.14))
    assert tidy["entropy_bound"] == 0.7  # not 0.7000000000000001
    with pytest.raises(ValueError, match="unknown preset"):
        preset_values("turbo", recommended)


def test_build_request_checks_prompt_first_and_raw_flag():
    with pytest.raises(ValueError, match="prompt is empty"):
        build_request(" ", "nope", {**GOOD, "t_min": 5}, "bad")
    with pytest.raises(ValueError, match="raw must be true or false"):
        build_request("hi", "nope", GOOD, 0)
    request = build_request("hi", False, GOOD, -1)
    assert request.seed is None and request.settings.max_new_tokens == 64


# -- worker, record, session -----------------------------------------------------------------------------------------
def fake_source(n_frames, delay=0.0, steps_per_block=4):
    """A frame source like `DiffusionEngine.frames`: honours the stop event with a final cancelled frame."""

    def source(stop_event):
        last = None
        for i in range(n_frames):
            if stop_event is not None and stop_event.is_set():
                yield Frame(**{**last.to_dict(), "done": True, "stop_reason": "cancelled"})
                return
            if delay:
                time.sleep(delay)
            block, step = divmod(i, steps_per_block)
            final = i == n_frames - 1
            last = make_frame(step=step, block=block, forward_index=i, block_done=step == steps_per_block - 1 or final,
                              done=final, stop_reason="max_new_tokens" if final else "")
            yield last

    return source


def test_worker_coalesces_to_max_fps_and_always_delivers_the_final_frame():
    worker = RunWorker(fake_source(400, delay=0.002)).start()
    start = time.monotonic()
    snaps = list(worker.updates(max_fps=15))
    elapsed = time.monotonic() - start
    assert snaps[-1].finished and snaps[-1].latest.done and snaps[-1].frames_seen == 400
    assert len(snaps) <= math.ceil(elapsed * 15) + 2
    counts = [s.frames_seen for s in snaps]
    assert counts == sorted(set(counts))  # each render newer than the last
    assert sum(len(b) for b in snaps[-1].blocks) == 400 and len(snaps[-1].blocks) == 100
    assert worker.join(2)


def test_the_default_live_rate_falls_for_large_canvases():
    assert default_live_rate(64) == 15.0  # the embedded model: the old cap
    assert default_live_rate(256) == 15.0  # the real checkpoint's canvas: the browser keeps up at 15/s
    assert default_live_rate(512) == pytest.approx(7.5)
    assert default_live_rate(100_000) == 2.0
    assert [default_live_rate(n) for n in (64, 128, 256, 512)] == sorted(
        [default_live_rate(n) for n in (64, 128, 256, 512)], reverse=True)
    with pytest.raises(ValueError, match="canvas_length"):
        default_live_rate(0)
    assert Hub(FakeEngine()).runs.max_fps == default_live_rate(FakeEngine.canvas_length)
    assert Hub(FakeEngine(), max_fps=3.0).runs.max_fps == 3.0  # an explicit rate is kept


def test_worker_stretches_the_gap_so_a_slow_reader_keeps_to_its_budget():
    def read(budget):
        worker = RunWorker(fake_source(200, delay=0.005)).start()
        start = time.monotonic()
        snaps, first_frame_at = [], None
        for snap in worker.updates(max_fps=1000, reader_budget=budget):
            if snap.latest is not None and first_frame_at is None:
                first_frame_at = time.monotonic() - start
            snaps.append(snap)
            time.sleep(0.01)  # a reader that spends 10 ms on each snapshot
        assert snaps[-1].finished and snaps[-1].frames_seen == 200
        return snaps, time.monotonic() - start, first_frame_at

    snaps, elapsed, first_frame_at = read(0.05)
    # 10 ms of reading per snapshot at a 5% budget: a gap of at least 0.2 s between snapshots
    assert len(snaps) <= math.ceil(elapsed / 0.2) + 3
    assert first_frame_at < 0.1  # the first frame is never held back
    unlimited, _, _ = read(None)
    assert len(unlimited) > 3 * len(snaps)


@pytest.mark.slow
def test_a_reader_slowed_by_a_busy_machine_still_renders_every_few_seconds():
    worker = RunWorker(fake_source(120, delay=0.05)).start()  # a 6 s run
    start, times = time.monotonic(), []
    for snap in worker.updates(max_fps=1000, reader_budget=0.05):
        times.append(time.monotonic() - start)
        time.sleep(0.5)  # 0.5 s per render: the budget alone would hold the next one 10 s
    assert snap.finished and snap.frames_seen == 120
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(times) >= 4 and max(gaps) < MAX_LIVE_GAP_S + 0.5 + 0.3, times


def test_worker_renders_every_frame_when_slow_and_reports_errors():
    snaps = list(RunWorker(fake_source(5, delay=0.1)).start().updates(max_fps=100))
    assert [s.latest.forward_index for s in snaps if s.latest] == [0, 1, 2, 3, 4]

    def failing(stop_event):
        raise ValueError("prompt is empty")
        yield  # pragma: no cover

    snap = RunWorker(failing).start().wait(5)
    assert snap.finished and isinstance(snap.error, ValueError) and snap.latest is None


def test_worker_stop_ends_within_a_frame_and_abandoned_runs_stop_themselves():
    worker = RunWorker(fake_source(10_000, delay=0.01)).start()
    time.sleep(0.1)
    worker.stop()
    snap = worker.wait(5)
    assert snap.finished and snap.latest.stop_reason == "cancelled" and snap.frames_seen < 100
    forwards = [f.forward_index for block in snap.blocks for f in block]
    assert len(forwards) == len(set(forwards)) == snap.frames_seen - 1  # the cancelled repeat replaces, not adds
    abandoned = RunWorker(fake_source(10_000, delay=0.01), abandon_after_s=0.2).start()
    assert abandoned.join(5) and abandoned.stop_event.is_set()


def test_worker_closes_a_source_that_ignores_stop():
    closed = threading.Event()

    def stubborn(stop_event):
        try:
            for i in range(10_000):
                time.sleep(0.005)
                yield make_frame(step=i % 4, forward_index=i)
        finally:
            closed.set()

    worker = RunWorker(stubborn).start()
    time.sleep(0.05)
    worker.stop()
    assert worker.join(5) and closed.is_set()


def test_worker_reads_frames_already_sent_before_the_cancelled_one():
    """ZeroGPU pipes frames from another process: those sent before the GPU process saw Stop still arrive first."""
    def piped(stop_event):
        for i in range(10_000):
            if stop_event.is_set():
                for j in range(i, i + 20):  # already in the pipe when the flag was seen
                    last = make_frame(step=j % 4, forward_index=j)
                    yield last
                yield Frame(**{**last.to_dict(), "done": True, "stop_reason": "cancelled"})
                return
            time.sleep(0.005)
            yield make_frame(step=i % 4, forward_index=i)

    worker = RunWorker(piped).start()
    time.sleep(0.05)
    worker.stop()
    snap = worker.wait(5)
    assert snap.latest.stop_reason == "cancelled"
    assert status_text(snap.latest) == "Stopped: the canvas in progress is not committed."
    assert status_text(make_frame(step=2)) == status_text(snap.latest)  # closed before its final frame: not "Done"


def test_record_snapshots_are_immutable_views():
    record = RunRecord()
    record.add(make_frame(step=0))
    snap = record.snapshot()
    record.add(make_frame(step=1))
    assert snap.frames_seen == 1 and len(snap.block_frames()) == 1
    assert record.snapshot().block_frames(99) == record.snapshot().block_frames(0)
    assert RunRecord(keep_history=False).snapshot().block_frames() == ()


def test_session_state_copies_are_fresh():
    session = SessionState()
    session.worker = RunWorker(fake_source(1))
    assert copy.deepcopy(session).worker is None


# -- the Playground tab's handlers (with a fake engine: no model) -----------------------------------------------------
class FakeEngine:
    """Duck-typed stand-in for `DiffusionEngine` (the public API the UI uses)."""

    canvas_length = N
    recommended = DiffusionSettings(max_new_tokens=64, max_denoising_steps=8, entropy_bound=0.5)
    source = "fake/<model>"
    token_text = ListTokenText(HOSTILE)
    model = StubModel()

    class device:  # noqa: N801
        type = "cpu"

    def __init__(self, frames=12, delay=0.01):
        self.n, self.delay = frames, delay

    def encode_prompt(self, prompt, raw=False, thinking=False):
        return torch.zeros((1, 3), dtype=torch.long)

    def check_budget(self, prompt_tokens, settings):
        if settings.max_new_tokens > 512:
            raise ValueError("over the model's context")

    def check_settings(self, settings):
        pass

    def frames(self, prompt, settings=None, *, raw=False, seed=None, stop_event=None, thinking=False, prompt_ids=None):
        return fake_source(self.n, self.delay)(stop_event)

    def summarize(self, last, frames):
        return GenerationResult(
            token_ids=list(last.committed_ids), text="<b>text</b>", frames=frames,
            forwards_per_block=list(last.forwards_per_block), seconds=last.elapsed_s,
            tokens_per_second=last.tokens_per_second, tokens_per_forward=last.tokens_per_forward,
            time_to_first_frame_s=last.time_to_first_frame_s, prompt_tokens=3, seed=last.seed,
            stop_reason=last.stop_reason,
        )


ARGS = ("In the beginning", True, 64, 8, 0.5, 0.4, 0.8, 1, 0.05, True, 3)


def make_tab(engine=None, **limits) -> PlaygroundTab:
    """The Playground tab on a `Hub` of `engine` (default: a `FakeEngine`); `limits` as `Hub`'s."""
    return PlaygroundTab(Hub(engine or FakeEngine(), **limits))


def started(tab: PlaygroundTab, session: SessionState, *inputs) -> tuple[tuple, object]:
    """A Generate: `request_run`'s outputs and the run step's stream of its ticket (not read yet)."""
    checked = tab.request_run(session, *inputs)
    return checked, tab.generate_stream(session, checked[0])


def meter_of(feed: str) -> str:
    """The meter HTML a feed message sets."""
    return json.loads(feed)["meter"]


def test_generate_stream_feeds_every_frame_then_the_final_view_and_frees_the_worker_when_closed():
    tab, session = make_tab(FakeEngine(frames=12), max_fps=1000), SessionState()
    (ticket, queued, generate_button, stop_button), stream = started(tab, session, *ARGS)
    assert generate_button["interactive"] is False and stop_button["interactive"] is True  # Generate off, Stop on
    assert 'data-state="queued"' in meter_of(queued)
    outputs = list(stream)
    last = outputs[-1]
    assert last[3]["interactive"] is True and last[4]["interactive"] is False
    assert all(o[3] == gr.skip() and o[4] == gr.skip() for o in outputs[:-1])  # buttons: at the end only
    assert last[1] == "<b>text</b>"  # plain text for a Textbox
    sent = messages(outputs)
    assert [m for m in sent if m.get("final")] == [sent[-1]]  # the player hears once that the engine ended
    frames = fed_frames(outputs)
    assert [(f["block"], f["step"]) for f in frames] == [divmod(i, 4) for i in range(12)]  # every forward, in order
    assert [f["block"] for f in frames if f["block_done"]] == [0, 1, 2]  # 12 frames of 4 steps: 3 blocks committed
    assert frames[-1]["stop_reason"] == "max_new_tokens"  # what the player's final status says
    runs = [m for m in sent if "frames" in m]
    assert len({m["key"] for m in runs}) == 1
    held = 0
    for message in runs:  # no frame sent twice (the final message may repeat the last to say the run ended)
        assert message["start"] == held or (message["final"] and message["start"] == held - 1
                                            and len(message["frames"]) == 1), (message["start"], held)
        held = message["start"] + len(message["frames"])
    assert not session.worker.running

    slow = make_tab(FakeEngine(frames=100_000, delay=0.01), max_fps=1000)
    session = SessionState()
    _, stream = started(slow, session, *ARGS)
    next(stream), next(stream)
    stream.close()  # what Gradio does when the tab closes or the event is cancelled
    assert session.worker.stop_event.is_set() and session.worker.join(5)
    assert slow.hub.runs.active() == 0


def test_before_its_first_frame_a_run_says_it_is_starting_not_queued_or_idle():
    tab = make_tab(FakeEngine(frames=4, delay=0.5), max_fps=1000)  # the first frame after 0.5 s
    session = SessionState()
    _, stream = started(tab, session, *ARGS)
    feed = next(stream)[0]
    assert session.snapshot.latest is None  # the view before the first frame
    assert isinstance(feed, str), "no meter before the first frame: the page still says the run is queued"
    meter = meter_of(feed)
    assert 'data-state="running"' in meter and "starting: encoding the prompt" in meter
    assert "press Generate" not in meter and "Queued" not in meter  # out of the queue
    stream.close()
    assert session.worker.join(5)


def stopped_while_read(tab: PlaygroundTab, session: SessionState, stream) -> tuple[tuple, list]:
    """Stop pressed while `stream` is read in a thread, as Gradio reads it: (Stop's view, what the stream sent);
    asserts the stream had ended by the time Stop's view came back."""
    sent: list = []
    reader = threading.Thread(target=lambda: sent.extend(stream), daemon=True)
    reader.start()
    final = tab.stop(session)
    assert not reader.is_alive(), "Stop's final view came back while the stream could still send"
    return final, sent


def assert_stopped(final: tuple) -> None:
    """`final` is Stop's view of a stopped run: the engine's end with its cancelled frame, Generate on, Stop off."""
    message = json.loads(final[0])
    assert message["final"] is True and message["frames"][-1]["stop_reason"] == "cancelled"  # "Stopped: ..."
    assert final[3]["interactive"] is True and final[4]["interactive"] is False


def test_generate_stream_stop_button_and_bad_input():
    tab = make_tab(FakeEngine(frames=100_000, delay=0.01), max_fps=1000)
    session = SessionState()
    _, stream = started(tab, session, *ARGS)
    next(stream)
    final, sent = stopped_while_read(tab, session, stream)  # Stop sends the final view itself
    assert_stopped(final)
    assert not any(m.get("final") for m in messages(sent))  # the stream itself never sends a final view
    assert all(o[3] == gr.skip() and o[4] == gr.skip() for o in sent)
    assert not session.worker.running
    with pytest.raises(gr.Error, match="t_min must be below t_max"):
        tab.request_run(SessionState(), "hi", True, 64, 8, 0.5, 0.9, 0.8, 1, 0.05, True, 3)
    with pytest.raises(gr.Error, match="context"):
        tab.request_run(SessionState(), "hi", True, 1000, 8, 0.5, 0.4, 0.8, 1, 0.05, True, 3)
    refused = SessionState()
    assert list(tab.generate_stream(refused, "1")) == [] and refused.worker is None  # no checked request: no run


def test_one_run_per_session_whatever_starts_it():
    """A second trigger's ticket stops the first run, whose stream then sends nothing; a request whose ticket went
    stale while queued never starts; Stop on a queued request says it left the queue."""
    tab = make_tab(FakeEngine(frames=100_000, delay=0.01), max_fps=1000)
    session = SessionState()
    (first_ticket, *_), first = started(tab, session, *ARGS)
    next(first), next(first)
    first_worker = session.worker
    second_ticket, meter, generate_button, stop_button = tab.request_run(session, *ARGS)  # Shift+Enter during the run
    meter = meter_of(meter)
    assert 'data-state="queued"' in meter and generate_button["interactive"] is False
    assert stop_button["interactive"] is True
    assert "Replaced the run in progress" in meter  # the visitor is told the first run was stopped
    assert first_worker.stop_event.is_set()
    assert list(first) == []  # the superseded stream ends without a view (no final view, no button change)
    stale = tab.generate_stream(session, first_ticket)  # a stale request that waited in the queue
    assert list(stale) == [] and session.worker is first_worker
    second = tab.generate_stream(session, second_ticket)
    view = next(second)
    assert session.worker is not first_worker and view[3] == gr.skip()  # Generate stays off while it runs
    final, _ = stopped_while_read(tab, session, second)
    assert_stopped(final)
    assert tab.hub.runs.active() == 0

    queued_ticket, queued_meter, *_ = tab.request_run(session, *ARGS)
    assert "Replaced" not in meter_of(queued_meter)  # nothing was running
    left = tab.stop(session)  # Stop while the request waits in the queue
    assert "left the queue" in meter_of(left[0]) and left[3]["interactive"] is True
    assert list(tab.generate_stream(session, queued_ticket)) == []  # it never starts


def test_stop_sends_its_final_view_after_a_live_view_the_stream_was_still_making():
    """A live view being made when Stop is pressed reaches the page before Stop's final view, never after it
    (the page would take the run for still running after it ended)."""
    tab = make_tab(FakeEngine(frames=100_000, delay=0.01), max_fps=1000)
    session = SessionState()
    outputs, making, order = tab.outputs, threading.Event(), []

    def slow_live_outputs(state, snap, **options):
        if not options["final"] and snap.frames_seen >= 3 and not making.is_set():
            making.set()
            time.sleep(0.5)  # a busy machine: Stop is pressed meanwhile
        return outputs(state, snap, **options)

    tab.outputs = slow_live_outputs
    _, stream = started(tab, session, *ARGS)

    def read():
        for view in stream:
            order.append(("stream", view[0]))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert making.wait(10)
    final = tab.stop(session)
    order.append(("stop", final[0]))
    reader.join(10)
    assert [who for who, _ in order][-1] == "stop" and json.loads(order[-1][1])["final"] is True
    assert order[-2][0] == "stream" and json.loads(order[-2][1])["final"] is False  # the view it was making


def test_stop_waits_for_the_run_and_its_stream_under_one_deadline(monkeypatch):
    """A run that will not end and a stream nobody reads: Stop gives up on both after `STOP_WAIT_S` in all."""
    monkeypatch.setattr(playground_tab, "STOP_WAIT_S", 0.6)
    tab = make_tab(FakeEngine(frames=100_000, delay=0.01), max_fps=1000)
    session = SessionState()
    _, stream = started(tab, session, *ARGS)
    next(stream)  # held open: its stream never ends by itself
    monkeypatch.setattr(session.worker, "join", lambda timeout=None: time.sleep(timeout) or False)
    begun = time.monotonic()
    final = tab.stop(session)
    assert time.monotonic() - begun < 1.0  # each wait on its own timeout would take 1.2 s
    assert final[4]["interactive"] is False
    stream.close()


def test_a_refused_request_marks_only_a_finished_previous_run():
    tab = make_tab(FakeEngine(frames=100_000, delay=0.01), max_fps=1000)
    session = SessionState()
    assert isinstance(tab.refused(session), type(gr.skip()))  # nothing on the page to mark
    _, stream = started(tab, session, *ARGS)
    next(stream), next(stream)
    assert isinstance(tab.refused(session), type(gr.skip()))  # the run goes on: its frames own the meter
    stopped_while_read(tab, session, stream)
    meter = meter_of(tab.refused(session))
    assert 'data-state="refused"' in meter and "Everything below is from the previous run" in meter
    assert f"seed {session.snapshot.latest.seed}" in meter  # the previous run's own figures stay


def test_runs_past_the_time_limit_stop_with_a_clear_message_and_keep_finished_blocks():
    worker = RunWorker(fake_source(100_000, delay=0.01), time_limit_s=0.3).start()
    snap = worker.wait(10)
    assert snap.finished and isinstance(snap.error, RunTimeLimitExceeded)
    assert "limit of 0.3 s per run" in str(snap.error) and snap.latest.stop_reason == "cancelled"
    assert 4 < snap.frames_seen < 100 and snap.finished_blocks()  # stopped within a forward, blocks kept

    tab = make_tab(FakeEngine(frames=100_000, delay=0.01), max_run_s=0.3)
    with pytest.raises(gr.Error, match="limit of 0.3 s per run"):
        generate(tab, *ARGS)
    outputs = []
    _, stream = started(tab, SessionState(), *ARGS)
    with pytest.raises(gr.Error, match="limit of 0.3 s per run"):
        for out in stream:
            outputs.append(out)
    frames = fed_frames(outputs)
    assert messages(outputs)[-1]["final"] is True and frames[-1]["stop_reason"] == "cancelled"
    assert any(f["block_done"] for f in frames)  # the finished blocks stay on the page
    assert outputs[-1][3]["interactive"] is True  # Generate on again
    assert tab.hub.runs.active() == 0


def test_api_handler():
    tab = make_tab(FakeEngine(frames=9))
    text, summary = generate(tab, *ARGS)
    assert text == "<b>text</b>" and summary["frames"] == summary["forwards"] == 9
    assert summary["stop_reason"] == "max_new_tokens" and summary["seed"] == 42
    for bad, message in [(("",), "empty"), ((" ", True), "empty")]:
        with pytest.raises(gr.Error, match=message):
            generate(tab, *bad, *ARGS[len(bad):])
    with pytest.raises(gr.Error, match="seed"):
        generate(tab, *ARGS[:-1], 2.5)


def test_meter_says_counting_until_the_first_block_is_committed():
    first_block = make_frame(step=15, tokens_per_second=0.0, tokens_per_forward=0.0, committed_tokens=0)
    values = meter.meter_values(first_block)
    assert values["tokens/s"] == values["tokens/forward"] == "\u2026"
    assert "tokens/s from the first committed block" in values["progress"]
    assert values["forwards/block"] == "\u2265 16"
    later = make_frame(step=3, forwards_per_block=[32], tokens_per_second=50.0, tokens_per_forward=2.0)
    assert meter.meter_values(later)["tokens/s"] == "50.0"
    ended = make_frame(done=True, stop_reason="cancelled", tokens_per_second=0.0)  # stopped in block 1: no rate
    assert meter.meter_values(ended)["tokens/s"] == "\u2013"


def test_meter_speed_is_the_committed_blocks_and_holds_still_while_a_block_runs():
    """Tokens/s is the committed blocks' tokens over the engine time up to their commit: frames of the block in
    progress (whose own whole-run figure falls as its forwards add time) and a Stop do not move it."""
    commit = make_frame(step=31, block_done=True, forwards_per_block=[32, 32], committed_tokens=128,
                        tokens_per_second=16.6, tokens_per_forward=2.0, elapsed_s=7.71)
    shown = set()
    for step, elapsed in ((0, 7.9), (10, 8.6), (20, 9.3), (30, 10.0)):
        running = make_frame(step=step, forwards_per_block=[32, 32], committed_tokens=128, elapsed_s=elapsed,
                             tokens_per_second=128 / elapsed, tokens_per_forward=128 / (64 + step + 1))
        values = meter.meter_values(running, committed=commit)
        shown.add((values["tokens/s"], values["tokens/forward"]))
        assert values["progress"].startswith(f"block 1 \u00b7 step {step + 1}/")  # the block in progress: progress
    assert shown == {("16.6", "2.00")}
    stopped = make_frame(step=12, done=True, stop_reason="cancelled", forwards_per_block=[32, 32],
                         committed_tokens=128, elapsed_s=9.6, tokens_per_second=13.3)
    assert meter.meter_values(stopped, committed=commit)["tokens/s"] == "16.6"
    out = meter.meter_html(stopped, committed=commit)
    assert 'data-tps="16.6"' in out and "committed blocks only" in out


# -- plots follow the live block and say what they show (issue 13 items 8 and 13) --------------------------------------
def test_the_feed_carries_every_forward_of_every_block_however_the_views_are_coalesced():
    """The page's player plays and plots every forward of every block (its plots, drawn in the browser, name the
    block and step): views coalesced at a slow live rate still feed each frame once, in order."""
    tab = make_tab(FakeEngine(frames=24, delay=0.02), max_fps=4)  # a view at most every 0.25 s: frames pile up
    outputs = page_run(tab, SessionState(), *ARGS)
    assert len([m for m in messages(outputs) if "frames" in m]) < 24
    assert [(f["block"], f["step"]) for f in fed_frames(outputs)] == [divmod(i, 4) for i in range(24)]


def test_plot_legends_short_heatmaps_and_a_readable_play_button():
    one_step = plots.confidence_heatmap([make_frame(step=0)], animate=False)
    low, high = sorted(one_step["layout"]["yaxis"]["range"])
    assert high - low == make_frame().max_denoising_steps  # a live block reserves its rows: not one tall stripe
    legend = one_step["layout"]["annotations"][0]["text"]
    assert "white dot" in legend and "accepted" in legend
    order = plots.unmasking_order(make_frame(step=1))
    assert "grey" in order["layout"]["annotations"][0]["text"]
    done = [make_frame(step=k, block_done=k == 2) for k in range(3)]
    menu = plots.confidence_heatmap(done, animate=True)["layout"]["updatemenus"][0]
    assert menu["font"]["color"] == "#0f172a"  # dark text: Plotly's hover fill is near-white in both themes
    assert "3 steps" in plots.confidence_heatmap(done)["layout"]["title"]["text"]


def test_every_preset_fits_the_page_sliders(engine):
    """A preset the page offers must be a value its sliders accept (Gradio refuses a run past a slider's maximum)."""
    for name in PRESET_NAMES:
        settings = preset(name, engine.recommended)
        assert 0.01 <= settings.entropy_bound <= spec("entropy_bound").ui_high, name
        assert settings.max_denoising_steps <= spec("max_denoising_steps").ui_high, name


def test_live_views_send_the_text_only_when_a_block_is_committed():
    """The text changes only with a committed block: a view sends it when a new block has begun or the run ended
    (and the first view empties it), and holds it otherwise."""
    outputs = page_run(make_tab(FakeEngine(frames=12, delay=0.05), max_fps=1000), SessionState(), *ARGS)
    blocks = [len({f["block"] for f in fed_frames(outputs[:i + 1])}) for i in range(len(outputs))]
    due = [i in (0, len(outputs) - 1) or blocks[i] != blocks[i - 1] for i in range(len(outputs))]
    assert not all(due)  # some views held the text
    assert [isinstance(o[1], str) for o in outputs] == due


def test_live_plots_of_a_large_heatmap_come_less_often():
    assert PlotClock(cells=64 * 16).interval == PLOT_INTERVAL_S  # the embedded model's blocks: every second
    big = PlotClock(cells=256 * 128)  # a real-checkpoint block of 128 steps
    assert big.interval == pytest.approx(4 * PLOT_INTERVAL_S)
    assert big.due(1) and not big.due(1) and big.due(2)  # a new block still plots at once


def test_prose_sections_join_wrapped_lines_and_end_at_a_heading(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("# Title\nintro\n\n<!-- one -->\nwrapped\nline {x}\n\nnext paragraph\n\n## Tab\n\nnot part\n"
                    "<!-- two -->\nlast\n", encoding="utf-8")
    monkeypatch.setattr(text, "PROSE_PATH", page)
    text._prose_sections.cache_clear()
    try:
        assert text.prose("one") == "wrapped line {x}\n\nnext paragraph"
        assert text.prose("two") == "last"
        with pytest.raises(KeyError):
            text.prose("Title")
    finally:
        text._prose_sections.cache_clear()


def test_every_prose_name_the_code_asks_for_is_in_the_page_text():
    names = set()
    for path in (REPO / "diffgemma_ui").glob("*.py"):
        names.update(re.findall(r'prose\("([^"]+)"\)', path.read_text(encoding="utf-8")))
    assert len(names) >= 20
    for name in sorted(names):
        assert text.prose(name).strip(), name


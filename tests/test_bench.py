"""The benchmark scripts' logic (`benchmarks/bench.py`, `browser.py`, `load.py`, `model.py`) on tiny settings (the
GPU kit's parts: tests/test_gpu_kit.py).

Fast and free of timing assertions: the numbers only have to be sane (positive, consistent with each other, the
same tokens on every path).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import httpx
import psutil
import pytest
import torch

from benchmarks import bench, browser, load, model, timing
from engine.loading import REPO_ROOT
from engine.sampling import canvas_statistics
from pages import CHROMIUM

TINY = bench.Mode(repeats=1, seeds=(0,), blocks=1, ui_repeats=1, ar_repeats=1, scaling_repeats=1,
                  output_blocks=(1, 2), prompt_lengths=(16, 64))
STEPS = 3
PROMPT = "In the beginning"


@pytest.fixture(scope="module")
def fixed(engine):
    """One canvas, three steps, adaptive stopping off."""
    return engine.recommended.replace(max_new_tokens=engine.canvas_length, max_denoising_steps=STEPS,
                                      adaptive_stopping=False)


@pytest.fixture(scope="module")
def results(engine, fixed):
    """The whole benchmark (UI part aside) once, on the tiny setting."""
    return bench.run_benchmark(engine, model="embedded", mode=TINY, prompt=PROMPT, threads=1, ui=False, base=fixed)


def test_counted_ids_stop_at_the_first_eos_and_drop_pads(engine):
    eos = engine.model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    pad = engine.model.generation_config.pad_token_id
    assert timing.counted_ids(engine, [10, pad, 11, eos, 12, pad, pad]) == [10, 11, eos]
    assert timing.counted_ids(engine, [10, 11]) == [10, 11]


def test_spread_and_ratio():
    assert timing.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    slow = [timing.Run(2.0, [1], cpu_seconds=1.0), timing.Run(3.0, [1], cpu_seconds=3.0)]
    fast = [timing.Run(1.0, [1], cpu_seconds=1.0), timing.Run(2.0, [1], cpu_seconds=1.0)]
    assert timing.ratio(slow, fast) == {"median": 1.75, "min": 1.5, "max": 2.0}
    assert timing.ratio(slow, fast, "cpu_seconds") == {"median": 2.0, "min": 1.0, "max": 3.0}


def test_stopwatch_counts_cpu_time_of_other_processes():
    with timing.Stopwatch(os.getpid()) as watch:  # this process twice: its CPU time counts twice
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass
    assert watch.seconds >= 0.05 * 0.5 and watch.cpu_seconds >= 2 * 0.05 * 0.9


def test_the_load_meter_counts_the_server_and_the_clients_cpu_apart():
    meter = load.CpuMeter(os.getpid())  # this process as the server too: its CPU time counts in both shares
    meter.start()
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    meter.stop()
    phase = load.Phase(clients=1)
    meter.into(phase)
    assert phase.wall_s > 0 and phase.cores == psutil.cpu_count()
    tick = 0.02  # the kernel counts a process's CPU time in clock ticks (10 ms), read at either end
    assert phase.server_cores * phase.wall_s >= 0.2 - tick and phase.client_cores * phase.wall_s >= 0.2 - tick
    alone = load.CpuMeter()
    alone.start()
    alone.stop()
    unseen = load.Phase(clients=1)
    alone.into(unseen)
    rows = dict(load.phase_rows("solo", unseen))
    assert unseen.server_cores is None and rows["solo: server CPU per run"] == "-"
    assert "solo: cores busy (server, clients, others)" in rows
    phase.completed = 4
    assert dict(load.phase_rows("solo", phase))["solo: server CPU per run"] == (
        f"{phase.server_cores * phase.wall_s / 4:.2f} s")


@pytest.mark.slow
def test_engine_overhead_on_a_tiny_setting(engine, results):
    result = results["engine"]
    assert result["same_tokens"] is True
    assert result["runs"] == 1
    assert result["engine_overhead_ratio"]["median"] > 0
    assert result["engine_overhead_ratio_cpu"]["median"] > 0
    for path in ("bare_generate", "engine_frames"):
        assert result[path]["tokens_per_second"]["median"] > 0
        assert 0 < result[path]["tokens"]["median"] <= engine.canvas_length
    assert result["forwards_per_block"] == [STEPS]
    tokens = result["engine_frames"]["tokens"]["median"]
    assert result["tokens_per_forward"]["median"] == pytest.approx(tokens / STEPS, abs=1e-3)
    assert 0 < result["time_to_first_frame_s"]["median"] <= result["engine_frames"]["seconds"]["median"]


@pytest.mark.slow
def test_ui_path_gives_the_same_tokens_as_bare_generate(engine, fixed, served_app):
    _, url = served_app
    result = bench.measure_ui_overhead(engine, url, PROMPT, fixed, TINY)
    assert result["same_tokens"] is True
    assert result["ui_overhead_ratio"]["median"] > 0
    assert result["ui_overhead_ratio_cpu"]["median"] > 0  # the app runs in this process: its CPU time counts here
    assert result["http_and_queue_s"]["median"] > 0  # the client waits longer than the engine computes
    assert result["gradio_client"]["tokens"] == result["rest_call"]["tokens"] == result["bare_generate"]["tokens"]
    assert result["gradio_client_ratio"]["median"] > 0 and result["gradio_client_http_and_queue_s"]["median"] > 0


def test_the_rest_call_reads_the_complete_event_and_reports_an_error_event():
    class Stream:
        def __init__(self, lines):
            self.lines = lines

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def raise_for_status(self):
            return self

        def iter_lines(self):
            return iter(self.lines)

    class Http:
        def __init__(self, lines):
            self.lines, self.posted = lines, None

        def post(self, address, json):
            self.posted = (address, json)
            return httpx.Response(200, json={"event_id": "e1"}, request=httpx.Request("POST", address))

        def stream(self, method, address):
            assert (method, address) == ("GET", "http://h/gradio_api/call/generate/e1")
            return Stream(self.lines)

    http = Http(["event: generating", 'data: ["partial"]', "", "event: complete", 'data: ["text", {"forwards": 3}]'])
    assert bench.rest_predict(http, "http://h/", [1, 2]) == ["text", {"forwards": 3}]
    assert http.posted == ("http://h/gradio_api/call/generate", {"data": [1, 2]})
    with pytest.raises(RuntimeError, match="failed: bad input"):
        bench.rest_predict(Http(["event: error", 'data: "bad input"']), "http://h/", [])
    with pytest.raises(RuntimeError, match="without a result"):
        bench.rest_predict(Http(["event: heartbeat", "data: null"]), "http://h/", [])


@pytest.mark.slow
def test_race_section_on_a_tiny_setting(engine, results):
    race = results["race"]
    assert list(race["presets"]) == ["recommended", "fast"]
    for row in race["presets"].values():
        assert row["races"] == 1 and row["speedup"]["median"] > 0
        diffusion, ar = row["diffusion"], row["autoregressive"]
        assert 0 < diffusion["tokens"]["median"] <= engine.canvas_length
        assert 0 < ar["tokens"]["median"] <= engine.canvas_length  # the same budget: one canvas
        assert ar["tokens_per_forward"]["median"] == pytest.approx(1.0)
        assert diffusion["ms_per_forward"]["median"] > 0 and ar["ms_per_forward"]["median"] > 0
        # the speedup is the ratio of the two sides' tokens/s, counted the same way
        ratio = diffusion["tokens_per_second"]["median"] / ar["tokens_per_second"]["median"]
        assert row["speedup"]["median"] == pytest.approx(ratio, rel=0.02)
    assert race["presets"]["fast"]["settings"]["max_denoising_steps"] < race["presets"]["recommended"]["settings"][
        "max_denoising_steps"]


@pytest.mark.slow
def test_scaling_rows(results):
    outputs = results["output_scaling"]
    assert [row["blocks"] for row in outputs] == [1, 2]
    assert [row["max_new_tokens"] for row in outputs] == [64, 128]
    for row in outputs:
        assert 0 < row["tokens"]["median"] <= row["max_new_tokens"]
        assert STEPS <= row["forwards"] <= row["blocks"] * STEPS
    prompts = results["prompt_scaling"]
    assert [row["prompt_tokens"] for row in prompts] == [16, 64]
    assert all(row["tokens_per_second"]["median"] > 0 for row in prompts)


@pytest.mark.slow
def test_whole_benchmark_table_and_json(results):
    json.dumps(results)  # one JSON object, as --json prints
    table = bench.format_table(results)
    for text in ("engine_overhead_ratio", "same on CPU time", "tokens counted", "never counted",
                 "(b) UI overhead: skipped",
                 "(c) the race", "diffusion speedup", "fast preset", "peak RSS", "output blocks", "prompt tokens"):
        assert text in table
    assert results["memory"]["peak_rss_mb"] > 0


def test_bad_thread_count_is_refused(capsys):
    assert bench.main(["--threads", "0"]) == 2
    assert "--threads must be at least 1" in capsys.readouterr().err
    assert bench.main(["--rounds", "0"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err


# -- (f) the ways to watch it denoise ----------------------------------------------------------------------------
def test_quartiles():
    assert bench.quartiles([4.0, 1.0, 3.0, 2.0, 5.0]) == {"median": 3.0, "q1": 2.0, "q3": 4.0, "min": 1.0, "max": 5.0}
    assert bench.quartiles([2.0]) == {"median": 2.0, "q1": 2.0, "q3": 2.0, "min": 2.0, "max": 2.0}


def test_rounds_warm_up_then_rotate_the_order_with_one_seed_per_round():
    calls = []

    def path(name):
        def run(seed):
            calls.append((name, seed))
            return bench.WayRun(1.0, 1.0, 1.0, [seed], 1)
        return run

    runs = bench.rounds({name: path(name) for name in "abc"}, 4)
    assert calls[:3] == [("a", 12345), ("b", 12345), ("c", 12345)]  # one warm-up each
    measured = calls[3:]
    assert [measured[i:i + 3] for i in range(0, 12, 3)] == [
        [("a", 0), ("b", 0), ("c", 0)], [("a", 1), ("c", 1), ("b", 1)],  # round 1 rotated by one, then reversed
        [("c", 2), ("a", 2), ("b", 2)], [("c", 3), ("b", 3), ("a", 3)]]
    assert {name: [r.token_ids[0] for r in way] for name, way in runs.items()} == {n: [0, 1, 2, 3] for n in "abc"}


def test_ways_summary_takes_ratios_round_by_round():
    def runs(*threads, tokens=(1,)):
        return [bench.WayRun(2 * t, t, t, list(tokens), 3) for t in threads]

    summary = bench.ways_summary({"bare": runs(1.0, 2.0, 4.0), "engine": runs(1.1, 2.0, 3.0),
                                  "diffusers": runs(1.0, 2.0, 4.0, tokens=(2,))})
    assert summary["bare"]["ratio_cpu"]["median"] == 1.0
    assert summary["engine"]["ratio_cpu"] == {"median": 1.0, "q1": 0.875, "q3": 1.05, "min": 0.75, "max": 1.1}
    assert summary["engine"]["ratio_wall"]["median"] == 1.0 and summary["engine"]["cpu_s"]["median"] == 2.0
    assert summary["engine"]["same_tokens_as_bare"] is True and summary["diffusers"]["same_tokens_as_bare"] is False
    assert summary["engine"]["forwards"] == [3]
    assert summary["engine"]["ratio_cpu_iqm"] == round((1.1 * 1.0 * 0.75) ** (1 / 3), 4)  # under 4 rounds: all of them


def test_the_interquartile_mean_ratio_ignores_the_outer_quarters():
    assert bench.interquartile_mean_ratio([0.5, 1.0, 1.0, 4.0]) == 1.0
    assert bench.interquartile_mean_ratio([1.02] * 6 + [0.6, 3.0]) == 1.02
    assert bench.interquartile_mean_ratio([1.0, 1.21, 3.0, 0.1]) == 1.1  # geometric mean of 1.0 and 1.21
    assert bench.interquartile_mean_ratio([1.5]) == 1.5


def test_logits_streamer_computes_what_the_playground_shows():
    streamer = bench.LogitsStreamer()
    assert streamer._takes_logits is True  # generate() then hands it the logits instead of the argmax canvas
    logits = torch.randn(1, 8, 50, generator=torch.Generator().manual_seed(0))
    streamer.put(torch.tensor([[1, 2]]))
    streamer.put_draft(logits=logits)
    streamer.end()
    (draft, confidence, entropy), = streamer.steps
    expected_confidence, expected_entropy = canvas_statistics(logits[0], logits[0].argmax(-1))
    assert draft == logits[0].argmax(-1).tolist()
    assert confidence == pytest.approx(expected_confidence.tolist()) and entropy == pytest.approx(
        expected_entropy.tolist())


def test_draft_streamer_keeps_drafts_and_text_without_printing(engine, capsys):
    streamer = bench.DraftStreamer(engine.tokenizer)
    ids = engine.encode_prompt("In the beginning", raw=True)
    streamer.put(ids)  # the prompt: skipped
    streamer.put_draft(ids)
    streamer.put(ids)
    streamer.end()
    text = engine.tokenizer.decode(ids[0])
    assert streamer.drafts == [text] and "beginning" in streamer.text
    assert capsys.readouterr().out == ""


def test_ways_need_adaptive_stopping_off(engine, fixed):
    with pytest.raises(ValueError, match="adaptive stopping off"):
        bench.Ways(engine, PROMPT, fixed.replace(adaptive_stopping=True))


@pytest.mark.slow
def test_ways_on_a_tiny_setting_give_bare_generates_tokens(engine, fixed):
    ways = bench.measure_ways(engine, PROMPT, fixed.replace(max_denoising_steps=2), count=1, readings=2)
    only = bench.measure_ways(engine, PROMPT, fixed.replace(max_denoising_steps=2), count=1, only=["engine"])
    assert list(only["readings"][0]["ways"]) == ["bare", "engine"]
    assert ways["forwards"] == 2 and ways["prompt_tokens"] == engine.encode_prompt(PROMPT).shape[1]
    assert len(ways["readings"]) == 2
    for reading in ways["readings"]:
        assert reading["rounds"] == 1 and len(reading["load_average_1min"]) == 2
        assert list(reading["ways"]) == list(bench.WAYS)
        for name, way in reading["ways"].items():
            assert way["forwards"] == [2], name  # every way saw every forward (streamer drafts, step callbacks)
            if name == "diffusers":  # its own generator's draws: the same tokens only where sampling is near-argmax
                assert isinstance(way["same_tokens_as_bare"], bool)
            else:  # the streamers draw nothing, the engine draws in generate()'s order
                assert way["same_tokens_as_bare"] is True, name
            assert way["cpu_s"]["median"] > 0 and way["ratio_cpu"]["median"] > 0
    table = bench.format_ways(ways)
    assert "(f) ways to watch it denoise" in table and "readings 1 and 2 differ by" in table
    for label in bench.WAY_LABELS.values():
        assert label in table


def test_command_scripts_need_a_known_command(capsys):
    assert browser.main([]) == 2 and model.main(["nope"]) == 2
    err = capsys.readouterr().err
    assert "python -m benchmarks.browser {canvas,latency,sessions,replay,render,live}" in err
    assert "python -m benchmarks.model {quantization,standin,chat-reuse,parallel}" in err


def test_replay_command_prints_sizes(capsys):
    assert browser.main(["replay", "--canvas", "16", "--steps", "3", "--vocab", "300"]) == 0
    out = capsys.readouterr().out
    assert "trace JSON:" in out and "HTML replay:" in out


@pytest.mark.slow
def test_the_app_run_canvas_benchmark_watches_a_served_run(capsys):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    argv = ["canvas", "--app-run", "--blocks", "2", "--steps", "6", "--positions", "32", "--runs", "1"]
    assert browser.main(argv) == 0
    out = capsys.readouterr().out
    assert "app run: 2 blocks x 6 steps of 32 positions" in out and re.search(r"painted of \d+ in ", out)
    assert "longest" in out


@pytest.mark.slow
def test_launched_app_serves_and_stops(engine):
    embedded = str(REPO_ROOT / "assets" / "models" / "diffgemma-tiny")
    with bench.launched_app(embedded, "cpu", "float32", 1) as (url, process):
        with urllib.request.urlopen(url, timeout=10) as page:
            assert page.status == 200
        assert bench.peak_rss_mb(process.pid) is None or bench.peak_rss_mb(process.pid) > 0
    assert process.poll() is not None


def test_thread_seconds_count_this_threads_cpu_time():
    wall0, cpu0, waiting0 = model.thread_seconds()
    end = time.thread_time() + 0.05
    while time.thread_time() < end:
        pass
    wall1, cpu1, waiting1 = model.thread_seconds()
    assert cpu1 - cpu0 >= 0.05 * 0.9 and wall1 - wall0 >= cpu1 - cpu0 - 0.01
    assert waiting0 is None or waiting1 >= waiting0


def test_parallel_runs_give_solo_tokens_and_account_for_the_threads_time(engine):
    settings = engine.recommended.replace(max_new_tokens=engine.canvas_length, max_denoising_steps=2)
    solo = model.parallel_runs(engine, "In the beginning", settings, [0, 1, 2], 1)
    together = model.parallel_runs(engine, "In the beginning", settings, [0, 1, 2], 2)
    assert solo["tokens"] == together["tokens"] and set(solo["tokens"]) == {0, 1, 2}
    for result in (solo, together):
        assert result["runs_per_s"] == pytest.approx(3 / result["wall_s"]) and result["computing_s"] > 0
        if result["waiting_s"] is not None:  # the threads' wall time, split three ways
            assert result["waiting_s"] >= 0 and result["blocked_s"] >= -0.01


def test_frame_parts_and_gpu_share_on_the_embedded_model(engine):
    parts = model.measure_frame_parts(engine, repeats=1)
    assert set(parts) == {"library_accept_ms", "statistics_ms", "statistics_separate_pass_ms", "token_strings_cold_ms",
                          "token_strings_cold_single_ms", "token_strings_warm_ms", "transfer_ms"}
    assert all(value >= 0 for value in parts.values()) and parts["token_strings_cold_ms"] > 0
    share = model.gpu_share(256, 262_144, 51.6)
    plane = 256 * 262_144 * 4  # one [canvas x vocabulary] float32 buffer
    assert share["held_buffer_bytes"] == plane and share["separate_pass_bytes_per_frame"] == 8 * plane
    assert share["engine_share"] < 1e-5 < share["separate_pass_share"]
    assert "GPU share" in model.standin_report({"vocab": 262_144, "canvas": 256, "threads": 1, "parameters": 1e6,
                                                "frame_parts": parts, "gpu_share": share})


def test_the_canvas_app_run_source_yields_whole_blocks_that_settle():
    class Tokens:
        def __call__(self, token_id):
            return f"t{token_id}"

        def kind(self, token_id):
            return "text"

    times = []
    frames = list(browser.synthetic_run(Tokens(), 50, 8, 4, 2, 1e6, times)(None))
    assert len(frames) == len(times) == 8 and [f.forward_index for f in frames] == list(range(8))
    assert [f.block_done for f in frames] == [False, False, False, True] * 2 and frames[-1].done
    for before, after in zip(frames, frames[1:]):
        if before.block_index == after.block_index:  # accepted positions stay accepted with their draft
            assert all(b <= a for b, a in zip(before.accepted, after.accepted))
            assert all(d == e for d, e, ok in zip(before.draft_ids, after.draft_ids, before.accepted) if ok)
    assert all(frames[3].accepted) and len(frames[-1].committed_ids) == 16
    assert all(top[0] == d for top, d in zip(frames[0].top_ids, frames[0].draft_ids))

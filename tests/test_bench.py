"""`benchmarks/bench.py` on tiny settings (the GPU kit's own parts: tests/test_gpu_kit.py).

Fast and free of timing assertions: the numbers only have to be sane (positive, consistent with each other, the
same tokens on every path).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import urllib.request

import pytest

from engine.loading import REPO_ROOT


def load_script(name: str):
    """benchmarks/<name>.py as a module (benchmarks/ is a folder of scripts, not a package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


bench = load_script("bench")

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
    assert bench.counted_ids(engine, [10, pad, 11, eos, 12, pad, pad]) == [10, 11, eos]
    assert bench.counted_ids(engine, [10, 11]) == [10, 11]


def test_spread_and_ratio():
    assert bench.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    slow = [bench.Run(2.0, [1], cpu_seconds=1.0), bench.Run(3.0, [1], cpu_seconds=3.0)]
    fast = [bench.Run(1.0, [1], cpu_seconds=1.0), bench.Run(2.0, [1], cpu_seconds=1.0)]
    assert bench.ratio(slow, fast) == {"median": 1.75, "min": 1.5, "max": 2.0}
    assert bench.ratio(slow, fast, "cpu_seconds") == {"median": 2.0, "min": 1.0, "max": 3.0}


def test_stopwatch_counts_cpu_time_of_other_processes():
    import os
    import time as clock

    with bench.Stopwatch(os.getpid()) as watch:  # this process twice: its CPU time counts twice
        end = clock.process_time() + 0.05
        while clock.process_time() < end:
            pass
    assert watch.seconds >= 0.05 * 0.5 and watch.cpu_seconds >= 2 * 0.05 * 0.9


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
    assert result["gradio_client"]["tokens"] == result["bare_generate"]["tokens"]


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
    for text in ("engine_overhead_ratio", "same on CPU time", "tokens counted", "never counted", "(b) UI overhead: skipped",
                 "(c) the race", "diffusion speedup", "fast preset", "peak RSS", "output blocks", "prompt tokens"):
        assert text in table
    assert results["memory"]["peak_rss_mb"] > 0


def test_bad_thread_count_is_refused(capsys):
    assert bench.main(["--threads", "0"]) == 2
    assert "--threads must be at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_launched_app_serves_and_stops(engine):
    with bench.launched_app(str(REPO_ROOT / "assets" / "models" / "diffgemma-tiny"), "cpu", "float32", 1) as (url, process):
        with urllib.request.urlopen(url, timeout=10) as page:
            assert page.status == 200
        assert bench.peak_rss_mb(process.pid) is None or bench.peak_rss_mb(process.pid) > 0
    assert process.poll() is not None

"""`python -m engine generate`: the JSON output, the text output, and clear errors for bad settings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

from engine import DEFAULT_MODEL, DiffusionSettings, load_model, preset
from engine.cli import main
from engine.loading import REPO_ROOT

pytestmark = pytest.mark.slow
SMALL = ["--prompt", "In the beginning", "--raw", "--seed", "3", "--max-new-tokens", "64", "--steps", "4", "--device",
         "cpu"]
JSON_KEYS = {"token_ids", "text", "frames", "forwards", "tokens_per_second", "tokens_per_forward", "seconds"}


def run_json(capsys, *extra: str) -> dict:
    assert main(["generate", *SMALL, "--json", *extra]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1, "--json prints exactly one line"
    return json.loads(out)


def test_json_output_has_the_documented_fields(capsys):
    result = run_json(capsys)
    assert JSON_KEYS <= result.keys()
    assert isinstance(result["text"], str)
    assert all(isinstance(t, int) for t in result["token_ids"])
    assert 0 < len(result["token_ids"]) <= 64
    assert result["frames"] == result["forwards"] == sum(result["forwards_per_block"])
    assert 1 <= result["forwards"] <= 4
    assert result["seconds"] > 0
    assert result["seed"] == 3
    counted = sum(1 for t in result["token_ids"] if t != 0)
    assert result["tokens_per_forward"] == pytest.approx(counted / result["forwards"])
    assert result["tokens_per_second"] == pytest.approx(counted / result["seconds"], rel=1e-6)
    assert result["stop_reason"] in ("eos", "max_new_tokens")


def test_same_seed_same_tokens(capsys):
    first, second = run_json(capsys), run_json(capsys)
    assert first["token_ids"] == second["token_ids"]
    assert first["text"] == second["text"]


def test_no_adaptive_stopping_runs_every_step(capsys):
    result = run_json(capsys, "--no-adaptive-stopping")
    assert result["forwards_per_block"] == [4]


def test_preset_selects_its_settings_and_flags_override_it(capsys):
    config = DiffusionGemmaGenerationConfig.from_pretrained(DEFAULT_MODEL)
    recommended = DiffusionSettings.from_generation_config(config)
    small = [a for a in SMALL if a not in ("--steps", "4")]
    for name in ("fast", "careful"):
        assert main(["generate", *small, "--json", "--preset", name, "--no-adaptive-stopping"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["forwards_per_block"] == [preset(name, recommended).max_denoising_steps], name
    assert main(["generate", *small, "--json", "--preset", "careful", "--steps", "3", "--no-adaptive-stopping"]) == 0
    assert json.loads(capsys.readouterr().out)["forwards_per_block"] == [3]
    with pytest.raises(SystemExit):
        main(["generate", *SMALL, "--preset", "turbo"])
    assert "invalid choice: 'turbo'" in capsys.readouterr().err


def test_text_output_prints_text_and_a_summary_line(capsys):
    assert main(["generate", *SMALL]) == 0
    captured = capsys.readouterr()
    assert "tokens/s" in captured.err and "seed 3" in captured.err
    assert not captured.out.startswith("{")


@pytest.mark.parametrize("extra, message", [
    (["--steps", "0"], "error: --steps: max_denoising_steps must be in [1, 512], got 0"),
    (["--max-new-tokens", "0"], "--max-new-tokens: max_new_tokens must be in [1, 4096], got 0"),
    (["--entropy-bound", "-1"], "--entropy-bound: entropy_bound must be in (0.0, 1000.0]"),
    (["--t-min", "0.9", "--t-max", "0.5"], "t_min must be below t_max"),
    (["--seed", "-5"], "seed must be an integer in [0, "),
    (["--model", "/nonexistent/model"], "does not exist"),
    (["--prompt", "   "], "prompt is empty"),
])
def test_bad_setting_fails_with_a_clear_message(capsys, extra, message):
    assert main(["generate", *SMALL, *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    last_line = captured.err.strip().splitlines()[-1]  # after transformers' "Loading weights" progress bar
    assert last_line.startswith("error: ") and message in last_line
    assert "Traceback" not in captured.err


def test_settings_are_checked_before_the_model_loads(capsys):
    # A bad flag beside a model that cannot load: the flag's message, so nothing was loaded first
    assert main(["generate", *SMALL, "--steps", "0", "--model", "/nonexistent/model"]) == 2
    assert "max_denoising_steps must be in [1, 512], got 0" in capsys.readouterr().err


def test_module_entry_point_exits_non_zero_on_a_bad_setting():
    process = subprocess.run(
        [sys.executable, "-m", "engine", "generate", *SMALL, "--steps", "0", "--json"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert process.returncode == 2
    assert process.stdout == ""
    assert "error: --steps: max_denoising_steps must be in [1, 512], got 0" in process.stderr
    assert "Traceback" not in process.stderr


def test_unparseable_number_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", *SMALL, "--steps", "many"])
    assert exit_info.value.code == 2
    assert "--steps: invalid int value: 'many'" in capsys.readouterr().err


def test_preset_is_applied_first_and_explicit_flags_override_it(capsys, tmp_path):
    loaded = load_model(DEFAULT_MODEL, device="cpu")
    recommended = DiffusionSettings.from_generation_config(loaded.model.generation_config)
    fast = preset("fast", recommended)
    trace = tmp_path / "run.json"
    base = ["generate", "--prompt", "In the beginning", "--raw", "--max-new-tokens", "64", "--device", "cpu", "--json"]
    assert main([*base, "--preset", "fast", "--stability-threshold", "3", "--trace", str(trace)]) == 0
    settings = json.loads(trace.read_text())["settings"]
    assert settings["entropy_bound"] == fast.entropy_bound != recommended.entropy_bound
    assert settings["max_denoising_steps"] == fast.max_denoising_steps and settings["stability_threshold"] == 3
    assert main([*base, "--preset", "fast", "--steps", "2", "--trace", str(trace)]) == 0
    settings = json.loads(trace.read_text())["settings"]
    assert settings["max_denoising_steps"] == 2 and settings["entropy_bound"] == fast.entropy_bound
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["forwards"] <= 2


def test_a_seed_of_minus_one_draws_a_53_bit_seed(capsys):
    args = [arg for arg in SMALL if arg != "3"]
    args[args.index("--seed") + 1:args.index("--seed") + 1] = ["-1"]
    assert main(["generate", *args, "--json"]) == 0
    seed = json.loads(capsys.readouterr().out)["seed"]
    assert 0 <= seed < 2**53


@pytest.mark.parametrize("extra, message", [
    (["--preset", "turbo"], "invalid choice: 'turbo'"),
    (["--stability-threshold", "1.5"], "--stability-threshold: invalid int value: '1.5'"),
])
def test_bad_preset_or_setting_syntax_is_an_argparse_error(capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", *SMALL, *extra])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("command", [["race", "--prompt", "x"], ["chat"], ["infill", "--template", "a [___] b"]])
def test_every_subcommand_checks_the_shared_flags_before_loading(capsys, command):
    assert main([*command, "--steps", "0", "--model", "/nonexistent/model"]) == 2
    assert "--steps: max_denoising_steps must be in [1, 512], got 0" in capsys.readouterr().err
    assert main([*command, "--seed", "-7", "--model", "/nonexistent/model"]) == 2
    assert "seed must be an integer in [0, " in capsys.readouterr().err


@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["race", "--prompt", "x"], ["chat"],
                                     ["infill", "--template", "a [___] b"]])
def test_settings_that_clash_with_the_checkpoints_are_refused_before_loading(capsys, monkeypatch, command):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("engine.cli.load_model", no_load)
    # the embedded model recommends t_max 0.05: a t_min of 0.9 alone cannot run, nor can the careful preset under it
    assert main([*command, "--t-min", "0.9"]) == 2
    assert "t_min must be below t_max" in capsys.readouterr().err


def test_threads_sets_torchs_cpu_threads_and_refuses_zero(capsys):
    before = torch.get_num_threads()
    try:
        assert run_json(capsys, "--threads", "1")["token_ids"]
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert main(["generate", "--prompt", "x", "--threads", "0", "--model", "/nonexistent/model"]) == 2
    assert "threads must be a whole number >= 1, got 0" in capsys.readouterr().err

"""The `/generate` API through `gradio_client` against the in-process app, and the `app.py` command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

import app
from diffgemma_ui.validation import build_request
from pages import free_port

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
# prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold,
# confidence_threshold, adaptive_stopping, seed
SMALL = ("In the beginning", True, 64, 3, 0.5, 0.4, 0.8, 1, 0.05, True, 11)


@pytest.fixture(scope="module")
def client(served_app):
    return Client(served_app[1], verbose=False)


def test_api_is_named_generate_with_the_documented_parameters(client):
    api = client.view_api(return_format="dict", print_info=False)
    endpoint = api["named_endpoints"]["/generate"]
    names = [p["parameter_name"] for p in endpoint["parameters"]]
    assert names == ["prompt", "raw", "max_new_tokens", "max_denoising_steps", "entropy_bound", "t_min", "t_max",
                     "stability_threshold", "confidence_threshold", "adaptive_stopping", "seed"]
    assert len(endpoint["returns"]) == 2
    # the UI's own events are private
    assert set(api["named_endpoints"]) == {"/generate", "/race", "/export", "/chat", "/infill"}


def test_generate_returns_text_and_a_sane_summary_reproducibly(client, engine):
    text, summary = client.predict(*SMALL, api_name="/generate")
    assert isinstance(text, str)
    assert summary["seed"] == 11 and summary["stop_reason"] in ("eos", "max_new_tokens")
    assert summary["frames"] == summary["forwards"] == sum(summary["forwards_per_block"]) >= 1
    assert all(1 <= f <= 3 for f in summary["forwards_per_block"])
    assert 0 < len(summary["token_ids"]) <= 64
    assert summary["seconds"] > 0 and summary["tokens_per_second"] > 0
    assert summary["time_to_first_frame_s"] <= summary["seconds"]
    # TPF counts non-pad tokens only (a model may emit pads before its EOS)
    assert 0 < summary["tokens_per_forward"] * summary["forwards"] <= len(summary["token_ids"]) + 1e-6
    again_text, again = client.predict(*SMALL, api_name="/generate")
    assert again["token_ids"] == summary["token_ids"] and again_text == text
    # and the same tokens as the engine itself, for the same settings and seed
    request = build_request(SMALL[0], SMALL[1], dict(zip(
        ("max_new_tokens", "max_denoising_steps", "entropy_bound", "t_min", "t_max", "stability_threshold",
         "confidence_threshold", "adaptive_stopping"), SMALL[2:10])), SMALL[10])
    direct = engine.generate(request.prompt, request.settings, raw=True, seed=11)
    assert direct.token_ids == summary["token_ids"]


def test_random_seed_and_keyword_call(client):
    _, summary = client.predict(prompt="Blessed are the", raw=True, max_new_tokens=8, max_denoising_steps=2,
                                seed=-1, api_name="/generate")
    assert isinstance(summary["seed"], int) and summary["seed"] >= 0


@pytest.mark.parametrize("changes, message", [
    ({0: "   "}, "prompt is empty"),
    ({5: 0.9}, "t_min must be below t_max"),
    ({4: -1.0}, "entropy_bound"),
    ({3: 0}, "max_denoising_steps"),
    ({2: "lots"}, "max_new_tokens must be a number"),
    ({10: -7}, "seed"),
    ({1: "maybe"}, "raw must be true or false"),
])
def test_bad_input_is_a_clear_error(client, changes, message):
    args = list(SMALL)
    for index, value in changes.items():
        args[index] = value
    with pytest.raises(AppError, match=message) as info:
        client.predict(*args, api_name="/generate")
    assert "Traceback" not in str(info.value)


# -- app.py ----------------------------------------------------------------------------------------------------------
def run_app(*args, env=None, timeout=120):
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, str(REPO / "app.py"), *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=REPO)


def test_app_help_lists_every_option(capsys):
    with pytest.raises(SystemExit) as exited:
        app.build_parser().parse_args(["--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    for option in ("--model", "--device", "--dtype", "--quantization", "--threads", "--max-run-seconds", "--host",
                   "--port", "--share", "DIFFGEMMA_MODEL", "DIFFGEMMA_THREADS", "DIFFGEMMA_MAX_RUN_SECONDS",
                   "GRADIO_SERVER_NAME"):
        assert option in shown


def test_app_model_load_failure_is_one_clear_line(capsys, monkeypatch):
    monkeypatch.setattr(app, "limit_malloc_arenas", lambda: None)  # a serving-process setting, not this process's
    assert app.main(["--model", "/nonexistent/model-folder", "--device", "cpu", "--port", str(free_port())]) == 2
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not exist" in errors[0]


@pytest.mark.parametrize("flag, bad, message", [
    *(("--threads", bad, "threads must be 'auto' or an integer >= 1") for bad in ("0", "-2", "many")),
    *(("--max-run-seconds", bad, "max run seconds must be a number >= 0") for bad in ("-1", "nan", "inf", "soon")),
])
def test_app_rejects_bad_thread_counts_and_time_limits(capsys, flag, bad, message):
    with pytest.raises(SystemExit) as exited:
        app.build_parser().parse_args([flag, bad])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_app_refuses_a_bad_flag_before_loading():
    result = run_app("--threads", "0")
    assert result.returncode == 2 and "threads must be 'auto' or an integer >= 1" in result.stderr
    assert "Loading" not in result.stdout


def test_app_environment_defaults():
    env = {"DIFFGEMMA_DEVICE": "cpu", "GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "7999",
           "DIFFGEMMA_SHARE": "1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        args = app.build_parser().parse_args([])
        assert (args.device, args.host, args.port, args.share) == ("cpu", "0.0.0.0", 7999, True)
        os.environ["DIFFGEMMA_HOST"] = "127.0.0.2"
        assert app.build_parser().parse_args([]).host == "127.0.0.2"
        assert app.build_parser().parse_args(["--port", "8000", "--no-share"]).port == 8000
        assert args.threads is None  # auto
        assert args.max_run_seconds == 300
        assert app.build_parser().parse_args(["--max-run-seconds", "0"]).max_run_seconds is None  # no limit
        assert app.build_parser().parse_args(["--threads", "3"]).threads == 3
        os.environ["DIFFGEMMA_THREADS"] = "2"
        assert app.build_parser().parse_args([]).threads == 2
    finally:
        os.environ.pop("DIFFGEMMA_HOST", None)
        os.environ.pop("DIFFGEMMA_THREADS", None)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

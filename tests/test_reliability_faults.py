"""Faults: a model that cannot load, running out of memory mid-run, and crashes inside the engine.

- `load_model` turns every way a checkpoint can be broken into `ModelLoadError` with a clear message, and
  `python app.py --model BAD` exits non-zero with one `error:` line and no traceback.
- Out of memory during a run (simulated on CPU: the decoder forward raises `torch.OutOfMemoryError`) is a clear
  message in the API and the live UI; the failed run's tensors (its KV cache, its activations) are released even
  though the session keeps the run's record, memory is released, and the next run works.
- Any exception inside the engine (decoder, encoder, token rendering, tokenizer, even `SystemExit`) ends that one
  request with a clear message; the server keeps serving and the next run gives the same tokens as before.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import weakref
from contextlib import contextmanager
from pathlib import Path

import gradio as gr
import pytest
import torch
from gradio_client import Client
from gradio_client.exceptions import AppError

import app
from diffgemma_ui import runs as runs_module
from diffgemma_ui.hub import RUN_INPUT_NAMES, Hub
from diffgemma_ui.playground_tab import PlaygroundTab
from diffgemma_ui.session import SessionState
from diffgemma_ui.validation import parse_run
from engine import DEFAULT_MODEL, ModelLoadError, load_model
from playground import fed_frames, messages, page_run

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
# prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold,
# confidence_threshold, adaptive_stopping, seed
ARGS = ("And it came to pass", True, 128, 3, 0.5, 0.4, 0.8, 1, 0.05, False, 21)


# -- broken checkpoints ----------------------------------------------------------------------------------------------
def model_copy(tmp_path: Path, name: str, *, drop=(), replace: dict | None = None) -> Path:
    """A copy of the embedded model in tmp_path/name: files linked, except those dropped or replaced (bytes/str)."""
    folder = tmp_path / name
    folder.mkdir()
    replace = replace or {}
    for source in DEFAULT_MODEL.iterdir():
        if source.name in drop:
            continue
        target = folder / source.name
        if source.name in replace:
            content = replace[source.name]
            target.write_bytes(content if isinstance(content, bytes) else content.encode())
        else:
            target.symlink_to(source)
    return folder


def config_with(**changes) -> str:
    config = json.loads((DEFAULT_MODEL / "config.json").read_text())
    config.update(changes)
    return json.dumps(config)


def broken_models(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (model argument, a phrase its ModelLoadError must contain)."""
    weights = (DEFAULT_MODEL / "model.safetensors").read_bytes()
    return {
        "missing folder": (str(tmp_path / "no-such-model"), "does not exist"),
        "empty folder": (str(model_copy(tmp_path, "empty", drop=[p.name for p in DEFAULT_MODEL.iterdir()])),
                         "cannot read a model config"),
        "garbage weights": (str(model_copy(tmp_path, "garbage", replace={
            "model.safetensors": b"\x00\xffNOT SAFETENSORS" * 4096})), "cannot load weights"),
        "truncated weights": (str(model_copy(tmp_path, "truncated", replace={
            "model.safetensors": weights[: len(weights) // 3]})), "cannot load weights"),
        "no weights": (str(model_copy(tmp_path, "noweights", drop=["model.safetensors"])), "cannot load weights"),
        "no tokenizer": (str(model_copy(tmp_path, "notokenizer", drop=["tokenizer.json", "tokenizer_config.json"])),
                         "tokenizer files (tokenizer.json) are missing"),
        "another architecture": (str(model_copy(tmp_path, "llama", replace={
            "config.json": config_with(model_type="llama")})), "is a 'llama' model"),
        "unknown architecture": (str(model_copy(tmp_path, "unknown", replace={
            "config.json": config_with(model_type="not_a_real_model")})), "cannot read a model config"),
        "config not JSON": (str(model_copy(tmp_path, "badjson", replace={"config.json": "{not json"})),
                            "cannot read a model config"),
        "hub id, offline": ("no-such-org/no-such-model", "cannot read a model config"),
    }


def test_broken_checkpoints_raise_model_load_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, (model, phrase) in broken_models(tmp_path).items():
        with pytest.raises(ModelLoadError) as info:
            load_model(model, device="cpu")
        message = str(info.value)
        assert phrase in message, (name, message)
        assert model in message, (name, message)  # says which model
        assert "Traceback" not in message


@pytest.mark.parametrize("kwargs, phrase", [
    ({"device": "tpu"}, "device must be one of"),
    ({"dtype": "float8"}, "dtype must be one of"),
    ({"quantization": "2bit"}, "quantization must be one of"),
])
def test_bad_load_options_raise_model_load_error(kwargs, phrase):
    with pytest.raises(ModelLoadError, match=phrase):
        load_model(DEFAULT_MODEL, **kwargs)


def test_app_prints_one_clear_line_for_every_broken_model(tmp_path, monkeypatch, capsys):
    """In process (fast): `app.main` returns 2 and prints exactly one `error:` line, even for the multi-line
    messages transformers and the hub give (unknown architecture, offline hub id)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, (model, phrase) in broken_models(tmp_path).items():
        assert app.main(["--model", model, "--device", "cpu"]) == 2, name
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and phrase in errors[0], (name, err)
        assert "Traceback" not in err, (name, err)


def test_app_refuses_a_port_in_use_before_loading_and_a_share_word_it_does_not_know(monkeypatch, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert app.main(["--device", "cpu", "--port", str(port)]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"error: cannot listen on 127.0.0.1:{port} (Address already in use): pick another "
                                "port with --port or DIFFGEMMA_PORT"]
    assert "Loading" not in out  # refused before the model loads
    monkeypatch.setenv("DIFFGEMMA_SHARE", "maybe")
    with pytest.raises(SystemExit) as exit_info:
        app.main(["--device", "cpu"])
    assert exit_info.value.code == 2
    assert "DIFFGEMMA_SHARE must be one of 1, true, yes, on, 0, false, no, off, got 'maybe'" in capsys.readouterr().err


def test_app_exits_nonzero_with_one_line_for_a_corrupt_model(tmp_path):
    """The real command line: `python app.py --model <garbage weights>` exits 2 with one line, no traceback."""
    model = model_copy(tmp_path, "garbage", replace={"model.safetensors": os.urandom(64 * 1024)})
    result = subprocess.run(
        [sys.executable, str(REPO / "app.py"), "--model", str(model), "--device", "cpu"], capture_output=True,
        text=True, timeout=240, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot load weights" in errors[0] and str(model) in errors[0], result.stderr


# -- failures during a run -------------------------------------------------------------------------------------------
class Fault:
    """Replaces one callable of the engine for a while; its `fail_on`-th call (1-based) raises `error`.

    The failing call allocates a tensor and keeps only weak references to it and to the run's KV cache (if it was
    passed), so a test can check that the failed run's memory is released.
    """

    def __init__(self, error: BaseException, fail_on: int = 1):
        self.error, self.fail_on, self.calls, self.failed = error, fail_on, 0, False
        self.activation_ref = self.cache_ref = None

    def wrap(self, original):
        def replacement(*args, **kwargs):
            self.calls += 1
            if self.calls == self.fail_on:
                activation = torch.ones(512, 512)  # what a forward would hold when it runs out of memory
                self.activation_ref = weakref.ref(activation)
                cache = kwargs.get("past_key_values")
                self.cache_ref = weakref.ref(cache) if cache is not None else None
                self.failed = True
                raise self.error
            return original(*args, **kwargs)

        return replacement


@contextmanager
def fault_in(owner, name: str, fault: Fault):
    """Install `fault` on `owner.name` (an instance attribute) for the duration of the block."""
    own = name in vars(owner)  # an instance attribute (put back) or a method of the class (uncovered again)
    original = getattr(owner, name)
    setattr(owner, name, fault.wrap(original))
    try:
        yield fault
    finally:
        if own:
            setattr(owner, name, original)
        else:
            delattr(owner, name)


@pytest.fixture(scope="module")
def client(served_app):
    api_client = Client(served_app[1], verbose=False)
    yield api_client
    api_client.close()


@pytest.fixture(scope="module")
def reference(engine):
    """The tokens ARGS give on a healthy engine."""
    request = parse_run(dict(zip(RUN_INPUT_NAMES, ARGS)), ui_limits=False)
    return engine.generate(request.prompt, request.settings, raw=True, seed=request.seed).token_ids


@pytest.fixture
def release_spy(monkeypatch):
    """Counts `diffgemma_ui.runs.release_memory` calls (still releasing)."""
    calls = []
    original = runs_module.release_memory

    def spy():
        calls.append(1)
        original()

    monkeypatch.setattr(runs_module, "release_memory", spy)
    return calls


def oom() -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")


def test_out_of_memory_in_the_api_is_a_clear_message_and_the_next_run_works(client, engine, reference, release_spy):
    with fault_in(engine.model, "forward", Fault(oom(), fail_on=2)) as fault:
        with pytest.raises(AppError) as info:
            client.predict(*ARGS, api_name="/generate")
    assert fault.failed
    message = str(info.value)
    assert message.startswith("out of memory during this run") and "max_new_tokens" in message, message
    assert "Traceback" not in message and "\n" not in message
    assert release_spy == [1]  # garbage collected and accelerator cache emptied, once
    _, summary = client.predict(*ARGS, api_name="/generate")
    assert summary["token_ids"] == reference


def test_out_of_memory_in_the_live_ui_releases_the_runs_tensors(engine, reference, release_spy):
    """The session keeps its run's record (to re-plot it), yet the failed run's KV cache and activations are freed."""
    tab = PlaygroundTab(Hub(engine, max_fps=1000))
    session = SessionState()
    outputs = []
    with fault_in(engine.model, "forward", Fault(oom(), fail_on=3)) as fault:
        ticket, *_ = tab.request_run(session, *ARGS)
        with pytest.raises(gr.Error, match="out of memory during this run"):
            for out in tab.generate_stream(session, ticket):
                outputs.append(out)
    # before the error: the run's frames up to the failed forward, the engine's end, Generate back on
    assert outputs and fed_frames(outputs) and messages(outputs)[-1]["final"] is True
    assert outputs[-1][3]["interactive"] is True and outputs[-1][4]["interactive"] is False
    assert isinstance(session.worker.record.snapshot().error, torch.OutOfMemoryError)  # still referenced...
    gc.collect()
    assert fault.activation_ref() is None, "the failed forward's tensors are still alive"  # ...without its frames
    assert fault.cache_ref is not None and fault.cache_ref() is None, "the failed run's KV cache is still alive"
    assert release_spy == [1]
    final = page_run(tab, session, *ARGS)[-1]  # the same session runs again
    assert session.worker.record.snapshot().error is None and final[1]  # its text
    request = parse_run(dict(zip(RUN_INPUT_NAMES, ARGS)), ui_limits=False)
    assert engine.generate(request.prompt, request.settings, raw=True, seed=21).token_ids == reference


CRASHES = {
    "decoder forward": (lambda e: (e.model, "forward"), RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED"), 2),
    # the prompt prefill: a later canvas exists only if the model has not ended at EOS, which depends on the weights
    "encoder": (lambda e: (e.model.model.encoder, "forward"), KeyError("layer_3"), 1),
    "token rendering": (lambda e: (e, "token_text"), IndexError("token id 4096 out of range"), 5),
    "SystemExit in the engine": (lambda e: (e.model, "forward"), SystemExit("bye"), 1),
}


@pytest.mark.parametrize("where", list(CRASHES))
def test_a_crash_in_one_run_is_a_clear_message_and_the_server_keeps_serving(client, engine, reference, where,
                                                                            release_spy):
    target, error, fail_on = CRASHES[where]
    owner, name = target(engine)
    with fault_in(owner, name, Fault(error, fail_on=fail_on)) as fault:
        with pytest.raises(AppError) as info:
            client.predict(*ARGS, api_name="/generate")
    assert fault.failed
    message = str(info.value)
    assert message.startswith(f"the engine failed ({type(error).__name__}"), message
    assert "Traceback" not in message and "\n" not in message and 'File "' not in message
    assert release_spy == []  # not an out-of-memory error
    client.view_api(print_info=False)  # the server is up...
    _, summary = client.predict(*ARGS, api_name="/generate")  # ...and the next run is unaffected
    assert summary["token_ids"] == reference


def test_a_tokenizer_crash_before_the_run_is_a_clear_message(client, engine, reference):
    with fault_in(engine, "encode_prompt", Fault(RuntimeError("tokenizer exploded"))):
        with pytest.raises(AppError, match=r"^the engine failed \(RuntimeError: tokenizer exploded\)"):
            client.predict(*ARGS, api_name="/generate")
    _, summary = client.predict(*ARGS, api_name="/generate")
    assert summary["token_ids"] == reference

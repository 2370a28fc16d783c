"""Hugging Face Spaces, checked offline: the Space folders of each target, detection of the platform from its
environment variables, and ZeroGPU emulated with the real `spaces` package (tests/zerogpu_emulation.py)."""

from __future__ import annotations

import base64
import importlib.util
import json
import math
import multiprocessing
import os
import pickle
import platform
import signal
import subprocess
import sys
import threading
import time
import uuid
from importlib.metadata import PackageNotFoundError, metadata
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from gradio_client import Client
from gradio_client.utils import apply_diff
from huggingface_hub import SpaceHardware
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import app
from deploy.space import front_matter, normalize, read_pins, write_space
from deploy.targets import REAL_MODEL, SDK_PROVIDED, TARGETS
from diffgemma_ui.deployment import (QUEUE_IDLE_POLL_S, GpuBudget, StopFlag, cpu_concurrency, default_threads,
                                     gpu_size_for, limit_malloc_arenas, make_hub, queue_plan, slow_idle_queue_polling,
                                     space_cpu_cores, space_id, zero_gpu)
from diffgemma_ui.hub import Hub, Job
from diffgemma_ui.live_view import status_text
from diffgemma_ui.validation import RunRequest
from engine import DiffusionEngine, DiffusionSettings
from engine.loading import available_cpus, meta_model
from engine.quantization import memory_report, model_bytes
from pages import free_port
from playground import fed_frames
from playground import messages as feed_messages

REPO = Path(__file__).resolve().parent.parent
EMULATION = Path(__file__).resolve().parent / "zerogpu_emulation.py"
# GPU memory of the dedicated Space hardware the gpu target suggests (the hub's Spaces GPU table)
SPACE_GPU_MEMORY_GB = {"a100-large": 80, "l40sx1": 48, "l4x1": 24}


def _front_matter(readme: Path) -> dict:
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("---\n"), f"{readme} has no front matter"
    return yaml.safe_load(text[4:text.index("\n---", 4)])


def _requires_python(name: str) -> SpecifierSet:
    try:
        return SpecifierSet(metadata(name).get("Requires-Python") or "")
    except PackageNotFoundError:
        pytest.fail(f"{name} is pinned but not installed here: its Requires-Python cannot be read")


def _requirements(path: Path) -> dict[str, Requirement]:
    found = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            requirement = Requirement(line)
            found[normalize(requirement.name)] = requirement
    return found


# -- the Space folders ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spaces_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("spaces")
    for name in TARGETS:
        write_space(name, root / name)
    write_space("gpu", root / "gpu-4bit", quantization="4bit")
    write_space("gpu", root / "gpu-8bit", quantization="8bit")
    return root


@pytest.mark.parametrize("name", [*TARGETS, "gpu-4bit", "gpu-8bit"])
def test_space_front_matter_names_versions_every_pin_accepts(spaces_dir, name):
    target = TARGETS[name.split("-")[0]]
    fields = _front_matter(spaces_dir / name / "README.md")
    pins = {pin.key: pin for pin in read_pins()}
    python = Version(str(fields["python_version"]))
    assert python >= Version("3.11")
    refused = {key: str(_requires_python(pin.name)) for key, pin in pins.items()
               if python not in _requires_python(pin.name)}
    assert not refused, f"python_version {python} is refused by {refused}"
    assert fields["sdk"] == "gradio" and fields["sdk_version"] == pins["gradio"].version
    assert (spaces_dir / name / fields["app_file"]).is_file()
    assert fields["suggested_hardware"] == {"cpu": "cpu-basic", "gpu": "a100-large", "gpu-4bit": "l4x1",
                                            "gpu-8bit": "l40sx1", "zerogpu": "zero-a10g"}[name]
    assert fields["suggested_hardware"] in {flavor.value for flavor in SpaceHardware}
    if target.model is None:
        assert "models" not in fields and "preload_from_hub" not in fields
        assert (spaces_dir / name / "assets/models/diffgemma-tiny/model.safetensors").is_file()
    else:
        assert fields["models"] == [REAL_MODEL] and fields["preload_from_hub"] == [REAL_MODEL]
        assert fields["startup_duration_timeout"] == "1h"  # over the default 30 min, for 52 GB of weights
        assert not (spaces_dir / name / "assets/models").exists()


@pytest.mark.parametrize("name", [*TARGETS, "gpu-4bit", "gpu-8bit"])
def test_space_requirements_fit_the_target(spaces_dir, name):
    target = TARGETS[name.split("-")[0]]
    python = Version(str(_front_matter(spaces_dir / name / "README.md")["python_version"]))
    listed = _requirements(spaces_dir / name / "requirements.txt")
    assert not {normalize(n) for n in SDK_PROVIDED} & set(listed), "the SDK installs gradio, spaces, huggingface_hub"
    torch = Version(next(iter(listed["torch"].specifier)).version)
    assert torch.release in (Version(target.torch_version).release,)
    assert torch in SpecifierSet(target.torch_supported), f"torch {torch} is not one the {name} target runs"
    if name.startswith("zerogpu"):
        assert Version("2.8") <= torch < Version("2.12"), "ZeroGPU documents torch 2.8 to 2.11"
    for pin in read_pins():
        if pin.key in {normalize(n) for n in SDK_PROVIDED} | {"torch"}:
            continue
        if pin.key == "bitsandbytes" and not name.startswith("gpu"):
            assert pin.key not in listed, "bitsandbytes only where quantization can be used"
            continue
        assert pin.key in listed, f"{pin.name} missing from the {name} Space"
        assert str(listed[pin.key].specifier) == f"=={pin.version}"
        # every pinned package accepts the Space's Python and torch
        assert python in _requires_python(pin.name)
        for requirement in map(Requirement, metadata(pin.name).get_all("Requires-Dist") or []):
            if normalize(requirement.name) == "torch" and requirement.marker is None:
                assert torch in requirement.specifier, f"{pin.name} needs torch {requirement.specifier}"
    if target.torch_index:
        assert f"--extra-index-url {target.torch_index}" in (spaces_dir / name / "requirements.txt").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cpu", "zerogpu"])  # the gpu folder differs from zerogpu's only in its files' text
def test_space_folder_is_self_contained(spaces_dir, name):
    """The folder's entry point imports the app and its page text from the folder itself, with the target's
    environment defaults."""
    folder = spaces_dir / name
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIFFGEMMA_", "SPACES_"))}
    code = ("import os, sys; sys.argv = ['space_app.py', '--help']; import space_app, app; "
            "assert os.path.dirname(os.path.abspath(app.__file__)) == os.getcwd(), app.__file__; "
            "from diffgemma_ui.text import PROSE_PATH, prose; prose('chat-intro'); "
            "from diffgemma_ui.blocks import EXPLAINER_PATH; assert EXPLAINER_PATH.is_file(); "
            "assert all(str(p).startswith(os.getcwd()) for p in (PROSE_PATH, EXPLAINER_PATH)), PROSE_PATH; "
            "print(os.environ.get('DIFFGEMMA_MODEL', '-')); app.main(['--help'])")
    done = subprocess.run([sys.executable, "-c", code], cwd=folder, env={**env, "PYTHONPATH": ""},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    first = done.stdout.splitlines()[0]
    assert first == (TARGETS[name].model or "-")
    assert "--quantization" in done.stdout


def test_deploy_command_refuses_bad_arguments(tmp_path):
    run = [sys.executable, "-m", "deploy", "space"]
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    cases = {("--target", "zerogpu", "--quantization", "4bit", str(tmp_path / "a")): "zerogpu takes quantization",
             ("--target", "cpu", "--model", "org/x", str(tmp_path / "b")): "serves the embedded model",
             ("--target", "cpu", str(tmp_path / "busy")): "not an empty folder"}
    for args, message in cases.items():
        done = subprocess.run([*run, *args], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_gpu_target_suggests_a_card_that_holds_the_weights():
    """Each `--quantization` of the gpu target suggests hardware whose GPU memory holds the 26B model's weights, as
    `python -m engine memory` counts them (8bit's 27 GB do not fit the 24 GB L4 that 4bit's 16 GB fit)."""
    model = meta_model(REPO / "assets" / "configs" / "diffusiongemma-26B-A4B-it")
    target = TARGETS["gpu"]
    for quantization in target.quantizations:
        hardware = front_matter(target, REAL_MODEL, quantization)["suggested_hardware"]
        weights = memory_report(model, quantization)["total_bytes"]
        assert weights < SPACE_GPU_MEMORY_GB[hardware] * 1e9, (quantization, hardware, weights)


def test_repo_readme_front_matter_names_a_python_the_pins_accept():
    fields = _front_matter(REPO / "README.md")
    python = Version(str(fields["python_version"]))
    for pin in read_pins():
        assert python in _requires_python(pin.name), pin.name


# -- detection by environment variable, not by import -------------------------------------------------------------
def test_deployment_is_read_from_the_environment():
    assert not zero_gpu({})
    assert zero_gpu({"SPACES_ZERO_GPU": "true"}) and zero_gpu({"SPACES_ZERO_GPU": "1"})
    assert not zero_gpu({"SPACES_ZERO_GPU": "false"}) and not zero_gpu({"SPACES_ZERO_GPU": ""})
    assert space_id({"SPACE_ID": "a/b"}) is None  # SYSTEM=spaces is what marks a Space
    assert space_id({"SYSTEM": "spaces", "SPACE_ID": "a/b"}) == "a/b"
    assert space_cpu_cores({"SYSTEM": "spaces", "CPU_CORES": "2"}) == 2
    assert space_cpu_cores({"CPU_CORES": "2"}) is None
    assert space_cpu_cores({"SYSTEM": "spaces", "CPU_CORES": "x"}) is None
    assert default_threads({"SYSTEM": "spaces", "CPU_CORES": "2"}) == 1
    assert default_threads({"SYSTEM": "spaces", "CPU_CORES": "8"}) == 7
    assert default_threads({}) is None
    assert queue_plan("cuda", {"SPACES_ZERO_GPU": "true"}).max_size is not None  # never Gradio's silent default of 1


def test_the_cpu_queue_runs_as_many_runs_as_the_cores_hold_and_an_accelerator_one():
    space = {"SYSTEM": "spaces"}
    assert queue_plan("cuda", {}).concurrency == 1 and queue_plan("mps", {}).concurrency == 1
    assert queue_plan("cuda", {"SPACES_ZERO_GPU": "1"}).concurrency == 4  # the platform queues GPU requests
    assert queue_plan("cpu", {**space, "CPU_CORES": "2"}, threads=1).concurrency == 2  # a free CPU Space, by default
    assert queue_plan("cpu", {**space, "CPU_CORES": "8"}, threads=7).concurrency == 1
    assert queue_plan("cpu", {**space, "CPU_CORES": "16"}, threads=4).concurrency == 4
    assert queue_plan("cpu", {}, threads=1).concurrency == available_cpus()
    assert queue_plan("cpu", {}).concurrency == max(1, available_cpus() // torch.get_num_threads())
    assert cpu_concurrency(2, 3) == 1 and cpu_concurrency(4, 2) == 2
    with pytest.raises(ValueError, match="threads"):
        cpu_concurrency(2, 0)


def test_the_served_queue_polls_for_new_events_every_10_ms_not_every_1_ms(served_app):
    assert served_app[0]._queue.sleep_when_free == QUEUE_IDLE_POLL_S == 0.01  # a Gradio without this loop fails
    assert not slow_idle_queue_polling(object())  # an app with no queue yet is left alone


@pytest.mark.slow
def test_spaces_installed_changes_nothing_without_zerogpu(engine):
    """`spaces` imports here, yet without SPACES_ZERO_GPU the hub is the plain one, Stop reaches the engine
    (a "cancelled" frame, not a run cut off after two more forwards) and the meter's last frame says so."""
    assert importlib.util.find_spec("spaces") is not None
    hub = make_hub(engine, environ={})
    assert type(hub) is Hub
    settings = DiffusionSettings(max_new_tokens=1024, max_denoising_steps=64, adaptive_stopping=False)
    run = RunRequest(prompt="In the beginning", raw=True, settings=settings, seed=0)
    worker = hub.start_job(Job("generate", run, settings))
    while worker.record.count < 2:
        time.sleep(0.01)
    worker.stop()
    snap = worker.wait(timeout=60)
    assert snap.finished and snap.error is None
    assert snap.latest.stop_reason == "cancelled"
    assert status_text(snap.latest).startswith("Stopped")


@pytest.mark.slow
def test_app_warms_up_without_zerogpu_even_with_spaces_installed(monkeypatch):
    calls = []
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    monkeypatch.setattr(DiffusionEngine, "warm_up", lambda self: calls.append("warm") or 0.0)

    class Launched:
        def launch(self, **kwargs):
            calls.append("launch")

    monkeypatch.setattr("diffgemma_ui.build_app", lambda engine, **kwargs: Launched())
    assert app.main(["--device", "cpu", "--threads", "1", "--port", "7999"]) == 0
    assert calls == ["warm", "launch"]


# -- what crosses the process boundary -------------------------------------------------------------------------------
def _wait_for_flag(path: str, queue) -> None:
    flag = StopFlag.__new__(StopFlag)
    flag.path = path
    deadline = time.monotonic() + 10
    while not flag.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    queue.put(flag.is_set())


def test_stop_flag_pickles_and_reaches_a_forked_process(tmp_path):
    flag = StopFlag(tmp_path)
    copy = pickle.loads(pickle.dumps(flag))
    assert not copy.is_set()
    context = multiprocessing.get_context("fork")
    queue = context.SimpleQueue()
    child = context.Process(target=_wait_for_flag, args=(copy.path, queue))
    child.start()
    flag.set()
    assert queue.get() is True
    child.join(10)
    flag.discard()
    assert not copy.is_set()


@pytest.mark.slow
def test_what_crosses_to_the_gpu_process_pickles(engine):
    """The GPU function's arguments (a RunRequest, a StopFlag) and what it yields (frames) pickle as they are."""
    request = RunRequest(prompt="Hi", raw=True, settings=DiffusionSettings(max_new_tokens=8, max_denoising_steps=2),
                         seed=0)
    frames = list(engine.frames(request.prompt, request.settings, raw=request.raw, seed=request.seed))
    assert pickle.loads(pickle.dumps(frames)) == frames
    assert pickle.loads(pickle.dumps(request)) == request
    assert pickle.loads(pickle.dumps(StopFlag())).path


def test_gpu_budget_duration_and_refusal():
    budget = GpuBudget(seconds_per_forward=0.5, setup_s=10, quota_s=120, size="large")
    settings = DiffusionSettings(max_new_tokens=300, max_denoising_steps=20)
    # 300 tokens = 2 canvases of 256; 2 x 20 forwards x 0.5 s + 10 s of setup
    assert budget.forwards(settings, 256) == 40 and budget.duration_s(settings, 256) == 30
    budget.check(settings, 256)
    xlarge = GpuBudget(seconds_per_forward=0.5, setup_s=10, quota_s=120, size="xlarge")
    big = settings.replace(max_denoising_steps=60)  # 70 s, charged twice on xlarge: 140 > 120
    assert xlarge.duration_s(big, 256) == 70
    budget.check(big, 256)
    with pytest.raises(ValueError, match=r"70 s of GPU .*lower max_new_tokens or max_denoising_steps"):
        xlarge.check(big, 256)
    with pytest.raises(ValueError, match="DIFFGEMMA_ZEROGPU_SETUP_SECONDS"):
        GpuBudget.from_environment("large", {"DIFFGEMMA_ZEROGPU_SETUP_SECONDS": "-1"})
    from_env = GpuBudget.from_environment("xlarge", {"DIFFGEMMA_ZEROGPU_SECONDS_PER_FORWARD": "0.2"})
    assert from_env.seconds_per_forward == 0.2 and from_env.size == "xlarge"


def test_gpu_size_follows_the_weights():
    class Weights(torch.nn.Module):
        def __init__(self, count):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(count, dtype=torch.bfloat16, device="meta"))

    real = Weights(25_823_778_864)  # the 26B model's parameters in bf16 (assets/configs): about 52 GB
    assert model_bytes(real) == 2 * 25_823_778_864
    assert gpu_size_for(real, {}) == "xlarge"
    assert gpu_size_for(Weights(25_823_778_864 // 4), {}) == "large"  # 4-bit
    assert gpu_size_for(real, {"DIFFGEMMA_ZEROGPU_SIZE": "large"}) == "large"
    with pytest.raises(ValueError, match="DIFFGEMMA_ZEROGPU_SIZE"):
        gpu_size_for(real, {"DIFFGEMMA_ZEROGPU_SIZE": "huge"})


# -- ZeroGPU emulated with the real `spaces` package -------------------------------------------------------------
SETUP_S, PER_FORWARD_S, QUOTA_S = 30, 0.25, 600
LONG = (1024, 128)  # 16 canvases x 128 steps = 2048 forwards: 542 s asked for, inside the quota


@pytest.fixture(scope="module")
def zerogpu_space(tmp_path_factory):
    """tests/zerogpu_emulation.py serving on a free port: yields (url, event ids, log path, server pid)."""
    pytest.importorskip("spaces")
    folder = tmp_path_factory.mktemp("zerogpu")
    log = folder / "log.jsonl"
    port, closed_port = free_port(), free_port()
    env = {**os.environ, "SPACES_ZERO_GPU": "true", "SPACES_ZERO_DEVICE_API_URL": f"http://127.0.0.1:{closed_port}",
           "HOME": str(folder), "ZEROGPU_OFFLOAD_DIR": str(folder / "tensors"), "OMP_NUM_THREADS": "1",
           "DIFFGEMMA_ZEROGPU_SETUP_SECONDS": str(SETUP_S),
           "DIFFGEMMA_ZEROGPU_SECONDS_PER_FORWARD": str(PER_FORWARD_S),
           "DIFFGEMMA_ZEROGPU_QUOTA_SECONDS": str(QUOTA_S), "PYTHONPATH": str(REPO)}
    server = subprocess.Popen([sys.executable, str(EMULATION), str(port), str(log)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []

    def read():
        for line in server.stdout:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 240
    ready = None
    while ready is None and time.monotonic() < deadline and server.poll() is None:
        ready = next((line for line in lines if line.startswith("READY ")), None)
        time.sleep(0.2)
    if ready is None:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        pytest.fail("the emulated ZeroGPU Space did not start:\n" + "".join(lines)[-4000:])
    _, url, ids = ready.split(" ", 2)
    try:
        yield url, json.loads(ids), log, server.pid
    finally:
        os.killpg(server.pid, signal.SIGKILL)  # the server and the GPU processes it forked
        server.wait(10)


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def _wait_log(path: Path, predicate, timeout: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = _log(path)
        if predicate(entries):
            return entries
        time.sleep(0.1)
    pytest.fail(f"log never matched; it holds {_log(path)}")


def _visitor_token(name: str) -> str:
    """An X-IP-Token as the hub's proxy sends it (a JWT; `spaces` only decodes its payload)."""
    payload = base64.urlsafe_b64encode(json.dumps({"user": name}).encode()).decode().rstrip("=")
    return f"header.{payload}.signature"


def _ui_inputs(ids, prompt, max_new_tokens, steps, adaptive=False) -> list:
    """Generate's check step's input values: the page's defaults, with these settings (raw prompt, seed 3)."""
    chosen = {"Prompt": prompt, "Max new tokens": max_new_tokens, "Max denoising steps": steps,
              "Adaptive stopping": adaptive, "Seed": 3}
    values = [chosen.get(item["label"], item["value"]) for item in ids["generate_inputs"]]
    labels = [item["label"] for item in ids["generate_inputs"]]
    assert set(chosen) <= set(labels), labels
    raw = next(i for i, label in enumerate(labels) if label and label.startswith("Raw prompt"))
    values[raw] = True
    return values


def _join(client, fn_index, data, session) -> str:
    joined = client.post("gradio_api/queue/join", json={"data": data, "fn_index": fn_index, "session_hash": session,
                                                         "event_data": None, "trigger_id": None})
    assert joined.status_code == 200, joined.text
    return joined.json()["event_id"]


def _stream(url, fn_index, data, session, token, on_message=None, timeout=180.0) -> dict[str, list[dict]]:
    """Join the queue for event `fn_index` as the page does and read the session's messages, by event id, until
    every event joined has completed. `on_message(client, message, by_event)` may join more events (returning their
    ids) or return "close": the visitor closes the tab."""
    by_event: dict[str, list[dict]] = {}
    with httpx.Client(base_url=url, headers={"X-IP-Token": token}, timeout=timeout) as client:
        waiting = {_join(client, fn_index, data, session)}
        with client.stream("GET", "gradio_api/queue/data", params={"session_hash": session}) as events:
            for line in events.iter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                if message.get("event_id") is None:  # heartbeats
                    continue
                by_event.setdefault(message.get("event_id"), []).append(message)
                if on_message is not None:
                    more = on_message(client, message, by_event)
                    if more == "close":
                        return by_event
                    waiting |= set(more or ())
                if message.get("msg") == "process_completed":
                    waiting.discard(message.get("event_id"))
                    if not waiting:
                        return by_event
    return by_event


def _request_run(url, ids, values, session, token) -> str:
    """Generate's check step as the page sends it: the ticket of the checked run, which waits in the session."""
    (messages,) = _stream(url, ids["request_run"], values, session, token).values()
    done = messages[-1]
    assert done["msg"] == "process_completed" and done["success"], done
    return done["output"]["data"][0]


def _outputs(messages: list[dict]) -> list[list]:
    """The outputs of each of an event's `process_generating` messages, then of its `process_completed`, whole
    (Gradio sends the changes from the previous one)."""
    outputs: list[list] = []
    for message in messages:
        if message.get("msg") not in ("process_generating", "process_completed") or not message.get("success"):
            continue
        data = message["output"]["data"]
        if message["msg"] == "process_generating" and outputs:
            data = [apply_diff(old, change) for old, change in zip(outputs[-1], data)]
        outputs.append(data)
    return outputs


def _assert_cancelled_in_gpu_process(log: Path, start: int) -> None:
    """The run's engine, in the GPU process, ended with its own "cancelled" frame long before its 2048 forwards,
    and the GPU was released (not failed)."""
    entries = _wait_log(log, lambda e: any(x["event"] == "release" for x in e[start:]), timeout=60)[start:]
    run_end = [x for x in entries if x["event"] == "frames_end"][-1]
    assert run_end["stop_reason"] == "cancelled" and run_end["count"] < LONG[0] // 64 * LONG[1], run_end
    assert run_end["pid"] != next(x["pid"] for x in entries if x["event"] == "schedule")
    assert [x["fail"] for x in entries if x["event"] == "release"] == [False]


@pytest.mark.slow
def test_zerogpu_generate_streams_frames_from_the_gpu_process(zerogpu_space):
    url, ids, log, server_pid = zerogpu_space
    assert ids["hub"] == "ZeroGpuHub" and ids["budget"]["size"] == "large"
    session, token = uuid.uuid4().hex[:10], _visitor_token("visitor-generate")
    start = len(_log(log))
    ticket = _request_run(url, ids, _ui_inputs(ids, "And he said", 128, 4), session, token)
    (messages,) = _stream(url, ids["generate_stream"], [None, ticket], session, token).values()
    done = messages[-1]
    assert done["msg"] == "process_completed" and done["success"], done
    streamed = _outputs(messages)[:-1]  # what came while the run step ran (the last again in process_completed)
    fed = [message for message in feed_messages(streamed) if "frames" in message]
    assert len(fed) >= 2 and not fed[0]["final"] and fed[-1]["final"]  # frames reached the page before the end
    frames = fed_frames(streamed)
    # 128 tokens: two canvases of the embedded 64 (seed 3), the run done, not stopped
    assert {frame["block"] for frame in frames} == {0, 1} and frames[-1]["block_done"]
    assert frames[-1]["stop_reason"] in ("eos", "max_new_tokens") and done["output"]["data"][1]
    entries = _wait_log(log, lambda e: any(x["event"] == "release" for x in e[start:]))[start:]
    schedule = next(x for x in entries if x["event"] == "schedule")
    # the visitor's request reached the scheduler: their token and their session
    assert schedule["has_request"] and schedule["token"] == token and schedule["session"] == session
    assert schedule["pid"] == server_pid
    # 2 canvases x 4 steps x 0.25 s + 30 s of setup
    assert schedule["duration_s"] == math.ceil(SETUP_S + 2 * 4 * PER_FORWARD_S) == 32
    assert schedule["size"] == "large"
    frames_pids = {x["pid"] for x in entries if x["event"] == "frames"}
    assert frames_pids and server_pid not in frames_pids  # the engine ran in the forked GPU process
    assert [x["fail"] for x in entries if x["event"] == "release"] == [False]


@pytest.mark.slow
def test_zerogpu_stop_ends_the_run_in_the_gpu_process(zerogpu_space):
    url, ids, log, _ = zerogpu_space
    session, token = uuid.uuid4().hex[:10], _visitor_token("visitor-stop")
    start = len(_log(log))

    stop_ids = []

    def press_stop(client, message, by_event):
        generating = [m for m in by_event.get(message.get("event_id"), []) if m.get("msg") == "process_generating"]
        if not stop_ids and message.get("msg") == "process_generating" and len(generating) == 2:
            stop_ids.append(_join(client, ids["stop"], [None], session))
            return stop_ids

    ticket = _request_run(url, ids, _ui_inputs(ids, "In the beginning", *LONG), session, token)
    by_event = _stream(url, ids["generate_stream"], [None, ticket], session, token, on_message=press_stop)
    assert stop_ids
    done = by_event[stop_ids[0]][-1]
    assert done["msg"] == "process_completed" and done["success"], done
    (message,) = feed_messages([done["output"]["data"]])
    # the engine's own "cancelled" frame came back from the GPU process, and Stop sent it to the page
    assert message["final"] and message["frames"][-1]["stop_reason"] == "cancelled", message
    _assert_cancelled_in_gpu_process(log, start)


@pytest.mark.slow
def test_zerogpu_closed_tab_ends_the_run_in_the_gpu_process(zerogpu_space):
    url, ids, log, _ = zerogpu_space
    session, token = uuid.uuid4().hex[:10], _visitor_token("visitor-leaves")
    start = len(_log(log))
    closed_at = []

    def leave(client, message, by_event):
        if message.get("msg") == "process_generating":
            closed_at.append(time.monotonic())
            return "close"

    ticket = _request_run(url, ids, _ui_inputs(ids, "In the beginning", *LONG), session, token)
    _stream(url, ids["generate_stream"], [None, ticket], session, token, on_message=leave)
    assert closed_at
    _assert_cancelled_in_gpu_process(log, start)


@pytest.mark.slow
def test_zerogpu_api_generate_runs_the_same_way(zerogpu_space):
    url, ids, log, server_pid = zerogpu_space
    token = _visitor_token("visitor-api")
    start = len(_log(log))
    client = Client(url, headers={"X-IP-Token": token}, verbose=False, download_files=False, analytics_enabled=False)
    try:
        text, summary = client.predict("In the beginning", raw=True, max_new_tokens=64, max_denoising_steps=2,
                                       api_name="/generate")
        assert summary["forwards"] == 2 and summary["stop_reason"] in ("eos", "max_new_tokens") and text
        entries = _wait_log(log, lambda e: any(x["event"] == "release" for x in e[start:]))[start:]
        schedule = next(x for x in entries if x["event"] == "schedule")
        assert schedule["has_request"] and schedule["token"] == token and schedule["pid"] == server_pid
        assert schedule["duration_s"] == math.ceil(SETUP_S + 1 * 2 * PER_FORWARD_S) == 31  # 1 canvas x 2 steps
        assert server_pid not in {x["pid"] for x in entries if x["event"] == "frames"}

        # A request that cannot fit the quota is refused before any GPU is asked for
        before = len(_log(log))
        with pytest.raises(Exception, match="lower max_new_tokens or max_denoising_steps"):
            client.predict("In the beginning", raw=True, max_new_tokens=4096, max_denoising_steps=128,
                           api_name="/generate")  # 8192 forwards: 2078 s
        assert not [x for x in _log(log)[before:] if x["event"] == "schedule"]
    finally:
        client.close()


def test_the_server_bounds_malloc_arenas_unless_the_operator_chose():
    assert limit_malloc_arenas(environ={"MALLOC_ARENA_MAX": "4"}) is None  # the operator's value stays
    if platform.libc_ver()[0] == "glibc":
        assert limit_malloc_arenas(environ={}) == 2
    with pytest.raises(ValueError, match="arenas must be >= 1"):
        limit_malloc_arenas(0, environ={})


def _sources_ran_in_gpu_process(log: Path, start: int, kind: str, server_pid: int) -> list[dict]:
    """The log entries since `start` once the GPU was released; asserts source `kind` ran outside the server."""
    entries = _wait_log(log, lambda e: any(x["event"] == "release" for x in e[start:]))[start:]
    ran = [x for x in entries if x["event"] == "source" and x["kind"] == kind]
    assert ran and server_pid not in {x["pid"] for x in ran}, entries
    schedule = next(x for x in entries if x["event"] == "schedule")
    assert schedule["has_request"] and schedule["pid"] == server_pid
    assert [x["fail"] for x in entries if x["event"] == "release"] == [False]
    return entries


@pytest.mark.slow
def test_zerogpu_runs_race_chat_and_infill_in_the_gpu_process(zerogpu_space):
    url, ids, log, server_pid = zerogpu_space
    client = Client(url, headers={"X-IP-Token": _visitor_token("visitor-tabs")}, verbose=False,
                    download_files=False, analytics_enabled=False)
    try:
        start = len(_log(log))
        filled, summary = client.predict("In the beginning God created the [___ 2]", max_denoising_steps=2,
                                         seed=1, api_name="/infill")
        assert filled.startswith("In the beginning God created the") and len(summary["fills"]) == 1
        _sources_ran_in_gpu_process(log, start, "infill", server_pid)

        start = len(_log(log))
        answer, summary = client.predict("Who made the light?", max_new_tokens=64, max_denoising_steps=2, seed=2,
                                         api_name="/chat")
        assert summary["history"][-1] == {"role": "assistant", "content": answer}
        assert summary["report"]["prompt_tokens"] > 0
        _sources_ran_in_gpu_process(log, start, "chat", server_pid)

        start = len(_log(log))
        diffusion, autoregressive, summary = client.predict("In the beginning", raw=True, max_new_tokens=64,
                                                            max_denoising_steps=2, seed=3,
                                                            order="diffusion first", api_name="/race")
        assert summary["diffusion"]["tokens"] > 0 and summary["autoregressive"]["tokens"] > 0
        entries = _sources_ran_in_gpu_process(log, start, "race", server_pid)
        schedule = next(x for x in entries if x["event"] == "schedule")
        # 1 canvas x 2 steps of diffusion and 64 autoregressive forwards, x 0.25 s, + 30 s of setup
        assert schedule["duration_s"] == math.ceil(SETUP_S + (2 + 64) * PER_FORWARD_S) == 47
    finally:
        client.close()


@pytest.mark.slow
def test_zerogpu_compares_both_sides_in_the_gpu_process(zerogpu_space):
    pytest.importorskip("diffusers")
    url, ids, log, server_pid = zerogpu_space
    session, token = uuid.uuid4().hex[:10], _visitor_token("visitor-compare")
    chosen = {"Prompt": "Who made the light?", "Max new tokens": 64, "A: max denoising steps": 2,
              "B: max denoising steps": 2, "B: sampler": "diffusers: BlockRefinementScheduler", "Seed": 3}
    labels = [item["label"] for item in ids["compare_inputs"]]
    assert set(chosen) <= set(labels), labels
    values = [chosen.get(item["label"], item["value"]) for item in ids["compare_inputs"]]
    start = len(_log(log))
    (messages,) = _stream(url, ids["compare"], values, session, token).values()
    done = messages[-1]
    assert done["msg"] == "process_completed" and done["success"], done
    card_a, card_b, verdict = done["output"]["data"][:3]
    assert 'data-state="done"' in card_a and 'data-state="done"' in card_b and "BlockRefinementScheduler" in card_b
    assert 'data-state="done"' in verdict
    # Both sides are jobs of the one run mechanism: each a GPU call of its own, run in the GPU process
    entries = _wait_log(log, lambda e: sum(x["event"] == "release" for x in e[start:]) >= 2)[start:]
    ran = {x["kind"]: x["pid"] for x in entries if x["event"] == "source"}
    assert set(ran) == {"generate", "pipeline"} and server_pid not in ran.values(), entries
    assert [x["fail"] for x in entries if x["event"] == "release"] == [False, False]


@pytest.mark.slow
def test_zerogpu_steps_through_a_run_one_gpu_call_per_step(zerogpu_space):
    url, ids, log, server_pid = zerogpu_space
    session, token = uuid.uuid4().hex[:10], _visitor_token("visitor-steps")
    values = [{"Prompt": "And he said", "Max denoising steps": 4, "Max new tokens": 64, "Seed": 3}.get(label)
              for label in ids["step_inputs"]]
    raw = next(i for i, label in enumerate(ids["step_inputs"]) if label and label.startswith("Raw prompt"))
    values[raw] = True
    defaults = {item["label"]: item["value"] for item in ids["generate_inputs"]}
    values = [defaults.get(label) if value is None and label in defaults else value
              for label, value in zip(ids["step_inputs"], values)]
    notes = []
    for _ in range(2):
        start = len(_log(log))
        (messages,) = _stream(url, ids["next_step"], values, session, token).values()
        done = messages[-1]
        assert done["msg"] == "process_completed" and done["success"], done
        notes.append(done["output"]["data"][-1])
        _sources_ran_in_gpu_process(log, start, "steps", server_pid)
    assert "forward 1:" in notes[0] and "forward 2:" in notes[1], notes

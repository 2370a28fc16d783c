"""A ZeroGPU Space emulated on this CPU machine, for tests/test_spaces.py (run as a script, in its own process).

    SPACES_ZERO_GPU=true SPACES_ZERO_DEVICE_API_URL=http://127.0.0.1:<closed port> \
        python tests/zerogpu_emulation.py PORT LOG

Runs the real `spaces` package (its `spaces.GPU` fork-and-pickle wrapper, its Gradio hooks) around the playground,
with only what needs a GPU or Hugging Face's device API replaced:
- `client.schedule`, `client.release`, `client.allow`, `client.startup_report` (the device API) are stubs that log
  each call (the visitor's request headers and session, the requested duration and size) to LOG, one JSON object a
  line; any other call to the device API fails at the closed port;
- `torch.init` / `torch.move` (CUDA set-up of the forked GPU process) do nothing, and `torch.version.cuda` is given a
  value: a CPU torch has no CUDA, so the embedded model stays on the CPU, in the forked process as in the main one.
The engine's `frames` logs the process that runs it (so a test can tell the child from the server), and at its end
how many frames it yielded and the last one's stop reason; each tab's source (`Hub.sources`) logs its kind and
process. Prints
"READY <url> <json: event ids, the check step's inputs>" once serving, then serves until killed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import uuid

import torch

# CPU-torch shims: `spaces` reads the CUDA version and saves CUDA's low-level init at import; with CUDA reported
# available, torch._dynamo (imported by diffusers) imports a CUDA stream getter by name
torch.version.cuda = torch.version.cuda or "12.8"


def _no_cuda(*args, **kwargs):
    raise RuntimeError("this torch has no CUDA")


for _name in ("_cuda_init", "_cuda_getCurrentRawStream"):  # imported by name by spaces and by torch._dynamo
    if not hasattr(torch._C, _name):
        setattr(torch._C, _name, _no_cuda)


def _not_in_bad_fork() -> bool:
    return False


torch.cuda._is_in_bad_fork = _not_in_bad_fork  # CPU torch's is a lambda, which `spaces` cannot send to its check

import spaces  # noqa: E402, F401 - before the app, as on a Space: patches torch for ZeroGPU
from spaces.zero import client as zero_client  # noqa: E402
from spaces.zero import torch as zero_torch  # noqa: E402
from spaces.zero.api import ScheduleResponse  # noqa: E402

from diffgemma_ui import build_app  # noqa: E402 - after spaces, as on a Space
from engine import DEFAULT_MODEL, DiffusionEngine, load_model  # noqa: E402

LOG_LOCK = threading.Lock()


def main(port: int, log_path: str) -> None:
    def log(event: str, **data) -> None:
        with LOG_LOCK, open(log_path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"event": event, "pid": os.getpid(), **data}) + "\n")

    def schedule(task_id, request=None, duration=None, gpu_size=None, _first_attempt=True):
        headers = dict(getattr(request, "headers", None) or {})
        log("schedule", token=headers.get("x-ip-token"), session=getattr(request, "session_hash", None),
            has_request=request is not None, duration_s=None if duration is None else duration.total_seconds(),
            size=gpu_size)
        return ScheduleResponse(idle=True, nvidiaIndex=0, nvidiaUUID="emulated-gpu", allowToken=uuid.uuid4().hex)

    def release(allow_token, *, fail=False, allow_404=False):
        log("release", fail=fail)

    zero_client.schedule = schedule
    zero_client.release = release
    zero_client.allow = lambda allow_token: log("allow")
    zero_client.startup_report = lambda: log("startup_report")
    zero_torch.init = lambda nvidia_uuid: None
    zero_torch.move = lambda callback=None: None

    engine = DiffusionEngine(load_model(DEFAULT_MODEL, device="cpu"))
    engine_frames = engine.frames

    def frames(*args, **kwargs):
        log("frames")
        count, last = 0, None
        try:
            for last in engine_frames(*args, **kwargs):
                count += 1
                yield last
        finally:
            log("frames_end", count=count, stop_reason=getattr(last, "stop_reason", None))

    engine.frames = frames
    app = build_app(engine, abandon_after_s=5.0)
    sources = app.hub.sources

    def logged(kind, source):
        def run(*args):
            log("source", kind=kind)
            yield from source(*args)
        return run

    for kind in list(sources):  # every tab's source logs the process it runs in
        sources[kind] = logged(kind, sources[kind])
    playground = app.tabs["playground"]
    handlers = {"generate_stream": playground.generate_stream, "stop": playground.stop}
    fns = {name: next(fn for fn in app.fns.values() if fn.fn == handler) for name, handler in handlers.items()}
    ids = {name: fn._id for name, fn in fns.items()}

    def clicked(elem_id: str):
        """The first event a click on the button `elem_id` triggers with Python (not JavaScript alone)."""
        button = next(block._id for block in app.blocks.values() if getattr(block, "elem_id", None) == elem_id)
        return next(fn for fn in app.fns.values() if fn.fn is not None and (button, "click") in map(tuple, fn.targets))

    request_run = clicked("dg-generate")  # Generate's check step: its ticket carries the checked run to the run step
    step = clicked("dg-next-step")
    ids["request_run"], ids["next_step"] = request_run._id, step._id
    ids["step_inputs"] = [getattr(block, "label", None) for block in step.inputs]
    compare = next(fn for fn in app.fns.values() if getattr(fn.fn, "__name__", None) == "compare")
    ids["compare"] = compare._id
    # A run's inputs, for a client that joins the queue as the page does: label and default value of each
    for name, fn in (("generate_inputs", request_run), ("compare_inputs", compare)):
        ids[name] = [{"label": getattr(block, "label", None),
                      "value": block.value if isinstance(block.value, (str, int, float, bool, type(None))) else None}
                     for block in fn.inputs]
    ids["hub"] = type(app.hub).__name__
    ids["budget"] = {"size": app.hub.budget.size}
    _, url, _ = app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    print("READY", url, json.dumps(ids), flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])

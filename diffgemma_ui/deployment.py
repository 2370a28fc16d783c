"""How the app is served: the platform, the queue plan, malloc arenas, the port; ZeroGPU's `ZeroGpuHub`."""

import copy
import ctypes
import ctypes.util
import dataclasses
import itertools
import logging
import math
import os
import socket
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from typing import NamedTuple
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import torch

from engine import DiffusionEngine, DiffusionSettings, Frame
from engine.settings import draw_seed, parse_number
from engine.loading import ModelLoadError, available_cpus, load_model
from engine.quantization import model_bytes

from .hub import Hub, Job, generation_frames, received
from .runs import RunWorker
from .tab import describe_error, user_error
from .text import plural
from .validation import RunRequest

TRUE_WORDS = ("1", "t", "true", "yes", "on")  # as `spaces.config.boolean` reads them
M_ARENA_MAX = -8  # glibc's malloc.h
SERVING_ARENAS = 2
QUEUE_IDLE_POLL_S = 0.01  # how often an idle Gradio queue looks for new events
LOG = logging.getLogger(__name__)
GpuSize = str  # "large" (half a card) or "xlarge" (the whole card)
XLARGE_WEIGHTS_BYTES = 45_097_156_608  # `spaces`' own switch to "xlarge"
MIN_RUN_S = 5.0  # the shortest time limit a run gets
BUDGET_VARIABLES = {"seconds_per_forward": "DIFFGEMMA_ZEROGPU_SECONDS_PER_FORWARD",
                    "setup_s": "DIFFGEMMA_ZEROGPU_SETUP_SECONDS", "quota_s": "DIFFGEMMA_ZEROGPU_QUOTA_SECONDS"}


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def zero_gpu(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs on ZeroGPU: `SPACES_ZERO_GPU` is a true word (any case)."""
    return _environ(environ).get("SPACES_ZERO_GPU", "").strip().lower() in TRUE_WORDS


def space_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The Space's id (or "unknown") on Hugging Face Spaces (`SYSTEM=spaces`), else None."""
    env = _environ(environ)
    if env.get("SYSTEM", "").strip().lower() != "spaces":
        return None
    return env.get("SPACE_ID", "").strip() or "unknown"


def space_cpu_cores(environ: Mapping[str, str] | None = None) -> int | None:
    """A Space's `CPU_CORES` (>= 1), or None off Spaces or if unset or bad."""
    if space_id(environ) is None:
        return None
    text = _environ(environ).get("CPU_CORES", "").strip()
    try:
        cores = int(float(text))
    except ValueError:
        return None
    return cores if cores >= 1 else None


def default_threads(environ: Mapping[str, str] | None = None) -> int | None:
    """Torch CPU threads by default: a Space's `CPU_CORES` - 1 (at least 1), None off Spaces."""
    cores = space_cpu_cores(environ)
    return None if cores is None else max(1, cores - 1)


@dataclass(frozen=True)
class QueuePlan:
    """The Gradio queue: `concurrency` runs at once on the engine, `max_size` events waiting (None: unbounded)."""

    concurrency: int
    max_size: int | None


QUEUE_PLANS = {"accelerator": QueuePlan(concurrency=1, max_size=None), "zerogpu": QueuePlan(concurrency=4, max_size=16)}


def cpu_concurrency(cores: int, threads: int) -> int:
    """Runs computing at once on `cores` CPU cores, each run with `threads` torch threads: as many as fit, at least
    one; `ValueError` below 1."""
    if cores < 1 or threads < 1:
        raise ValueError(f"cores and threads must be >= 1, got {cores} and {threads}")
    return max(1, cores // threads)


def queue_plan(device_type: str, environ: Mapping[str, str] | None = None, threads: int | None = None) -> QueuePlan:
    """The `QueuePlan` for a model on `device_type` ("cpu", "cuda", "mps") in this environment; on a CPU with
    `threads` torch threads a run (default: torch's setting) over a Space's `CPU_CORES` or this process's CPUs."""
    if zero_gpu(environ):
        return QUEUE_PLANS["zerogpu"]
    if device_type != "cpu":
        return QUEUE_PLANS["accelerator"]
    cores = space_cpu_cores(environ) or available_cpus()
    return QueuePlan(concurrency=cpu_concurrency(cores, threads or torch.get_num_threads()), max_size=None)


def slow_idle_queue_polling(app, seconds: float = QUEUE_IDLE_POLL_S) -> bool:
    """After `app.queue()`: poll an idle queue every `seconds` (Gradio's: 1 ms); whether it could."""
    queue = getattr(app, "_queue", None)
    if queue is None or not hasattr(queue, "sleep_when_free"):
        return False
    queue.sleep_when_free = seconds
    return True


def limit_malloc_arenas(arenas: int = SERVING_ARENAS, environ: Mapping[str, str] | None = None) -> int | None:
    """Set glibc's malloc arena limit as `MALLOC_ARENA_MAX` would: it, or None (that variable set, or not glibc);
    ValueError below 1."""
    if arenas < 1:
        raise ValueError(f"arenas must be >= 1, got {arenas}")
    if _environ(environ).get("MALLOC_ARENA_MAX", "").strip():
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return arenas if mallopt(M_ARENA_MAX, arenas) == 1 else None


def port_in_use(host: str, port: int) -> str | None:
    """Why the server could not listen on `host`:`port`, or None if it can."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.strerror or str(error)
    return None


class StopFlag:
    """A stop signal across processes (`set`, `is_set` as `threading.Event`'s): a file, only its path pickled."""

    def __init__(self, directory: str | os.PathLike | None = None):
        if directory is None:
            shm = Path("/dev/shm")
            directory = shm if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()
        self.path = str(Path(directory) / f"diffgemma-stop-{uuid.uuid4().hex}")

    def set(self) -> None:
        try:
            Path(self.path).touch()
        except OSError as error:  # the worker still ends
            LOG.warning("could not raise the stop flag %s: %s", self.path, error)

    def is_set(self) -> bool:
        return os.path.exists(self.path)

    def discard(self) -> None:
        Path(self.path).unlink(missing_ok=True)


@dataclass(frozen=True)
class GpuBudget:
    """A request's ZeroGPU time: per forward, `setup_s`, the `quota_s` it must fit; an xlarge second costs two."""

    seconds_per_forward: float = 0.1
    setup_s: float = 20.0
    quota_s: float = 120.0
    size: GpuSize = "large"

    @classmethod
    def from_environment(cls, size: GpuSize, environ: Mapping[str, str] | None = None) -> "GpuBudget":
        """The budget from DIFFGEMMA_ZEROGPU_* (defaults where unset); ValueError names a bad variable."""
        values = {}
        for field, name in BUDGET_VARIABLES.items():
            if text := _environ(environ).get(name, "").strip():
                value = parse_number(text)
                if value is None or not (math.isfinite(value) and value > 0):
                    raise ValueError(f"{name} must be a number > 0, got {text!r}")
                values[field] = float(value)
        return cls(size=size, **values)

    @staticmethod
    def forwards(settings: DiffusionSettings, canvas_length: int) -> int:
        """The most decoder forwards a request may take."""
        return math.ceil(settings.max_new_tokens / canvas_length) * settings.max_denoising_steps

    def duration_s(self, settings: DiffusionSettings, canvas_length: int, extra_forwards: int = 0) -> int:
        """Seconds of GPU to ask for: `setup_s` plus the forwards' time, rounded up."""
        forwards = self.forwards(settings, canvas_length) + extra_forwards
        return math.ceil(self.setup_s + forwards * self.seconds_per_forward)

    def check(self, settings: DiffusionSettings, canvas_length: int, extra_forwards: int = 0) -> None:
        """ValueError naming what to lower when the request's GPU time exceeds `quota_s`."""
        duration = self.duration_s(settings, canvas_length, extra_forwards)
        cost = 2 if self.size == "xlarge" else 1  # quota seconds per GPU second
        if duration * cost <= self.quota_s:
            return
        most = max(0, int((self.quota_s - self.setup_s * cost) // (self.seconds_per_forward * cost)))
        forwards = self.forwards(settings, canvas_length) + extra_forwards
        raise ValueError(f"this request may need {duration} s of GPU ({plural(forwards, 'decoder forward')} of "
                         f"{canvas_length}-token canvases), over what this ZeroGPU Space can ask for ({self.quota_s:g} "
                         f"s of quota{', an xlarge second counting twice' if self.size == 'xlarge' else ''}): lower "
                         f"max_new_tokens or max_denoising_steps (at most about {plural(most, 'forward')} in all)")


def gpu_size_for(model, environ: Mapping[str, str] | None = None) -> GpuSize:
    """DIFFGEMMA_ZEROGPU_SIZE (large|xlarge) when set, else by weight bytes; ValueError for another value."""
    chosen = _environ(environ).get("DIFFGEMMA_ZEROGPU_SIZE", "").strip().lower()
    if chosen and chosen != "auto":
        if chosen not in ("large", "xlarge"):
            raise ValueError(f"DIFFGEMMA_ZEROGPU_SIZE must be auto, large or xlarge, got {chosen!r}")
        return chosen
    return "xlarge" if model_bytes(model) > XLARGE_WEIGHTS_BYTES else "large"


def import_spaces():
    """The `spaces` package, imported only on ZeroGPU (it patches torch for ZeroGPU); ImportError when missing."""
    import spaces  # noqa: PLC0415 - only on ZeroGPU

    return spaces


def load_zero_gpu_model(model: str, device: str = "auto", dtype: str = "auto", quantization: str = "none"):
    """A checkpoint loaded on the CPU, then `.to("cuda")` for `spaces`; ModelLoadError, also if quantized."""
    if device not in ("auto", "cuda"):
        raise ModelLoadError(f"on ZeroGPU the model runs on the GPU: device must be auto or cuda, got {device!r}")
    if quantization != "none":
        raise ModelLoadError(f"{quantization} quantization is not offered on ZeroGPU (its packed weights under "
                             "ZeroGPU's CUDA emulation were never checked): use --quantization none (bf16 weights, an "
                             "xlarge GPU)")
    loaded = load_model(model, "cpu", "bfloat16" if dtype == "auto" else dtype, "none")
    loaded.model.to("cuda")
    loaded.device = torch.device("cuda")
    return loaded


_WARMED_PID: int | None = None  # the process whose model has been warmed up


class ZeroGpuHub(Hub):
    """`Hub` whose jobs run under `spaces.GPU` on `gpu_engine`; `engine` is a CPU view for checks."""

    def __init__(self, engine: DiffusionEngine, *, budget: GpuBudget | None = None, spaces_module=None, **kwargs):
        view = copy.copy(engine)  # its model never runs in the main process
        view.device = torch.device("cpu")
        super().__init__(view, **kwargs)
        self.gpu_engine = engine
        self.budget = budget or GpuBudget.from_environment(gpu_size_for(engine.model))
        self.sources["steps"] = first_frames
        spaces_module = spaces_module or import_spaces()
        self._gpu_frames = spaces_module.GPU(duration=self.gpu_seconds, size=self.budget.size)(self._frames_on_gpu)

    def gpu_seconds(self, job: Job, stop: StopFlag) -> int:
        return self.budget.duration_s(job.settings, self.engine.canvas_length, job.extra_forwards)

    def check_job(self, job: Job) -> None:
        """The job fits the GPU budget (ValueError)."""
        self.budget.check(job.settings, self.engine.canvas_length, job.extra_forwards)

    def start_job(self, job: Job, key: str | None = None, *, keep_history: bool = True, record=None,
                  receive=None) -> RunWorker:
        """Start `job` on a GPU, blocking until its first frame; gr.Error: refused, or failed before it."""
        stop = StopFlag()
        frames = self._gpu_frames(job, stop)
        try:
            first = [next(frames)]
        except StopIteration:
            first = []
        except BaseException as error:
            stop.discard()
            if isinstance(error, Exception) and not isinstance(error, gr.Error):
                LOG.error("ZeroGPU run failed to start", exc_info=error)
                raise user_error(describe_error(error)) from None
            raise
        # set-up ends with the first frame; the rest is the forwards' share
        left = max(MIN_RUN_S, self.gpu_seconds(job, stop) - self.budget.setup_s)

        def source(_stop) -> Iterator[Frame]:
            try:
                yield from received(itertools.chain(first, frames), receive)
            finally:
                frames.close()  # ends the GPU call
                stop.discard()

        return self.runs.start(source, key, keep_history=keep_history, stop_event=stop, record=record, limit_s=left)

    def step_frames(self, request: RunRequest) -> Iterator[Frame]:
        """A stepped run: step n is a GPU call running the first n forwards (same seed), sending the last."""
        request = dataclasses.replace(request, seed=draw_seed() if request.seed is None else request.seed)
        self.check_job(Job("steps", None, request.settings))
        for count in itertools.count(1):
            worker = self.start_job(Job("steps", StepsJob(request, count), request.settings), keep_history=False)
            snap = worker.wait()
            if snap.error is not None:
                raise snap.error
            if snap.latest is None or snap.frames_seen < count:
                return
            yield snap.latest
            if snap.latest.done:
                return

    def _frames_on_gpu(self, job: Job, stop: StopFlag) -> Iterator[Frame]:
        """In the GPU process: warm up once, then the job's source; errors as the `gr.Error` `spaces` passes on."""
        global _WARMED_PID
        try:
            if _WARMED_PID != os.getpid():
                self.gpu_engine.warm_up()
                _WARMED_PID = os.getpid()
            yield from self.sources[job.kind](self.gpu_engine, job.payload, stop)
        except Exception as error:  # noqa: BLE001 - one clear message across the process boundary
            if not isinstance(error, ValueError):
                LOG.error("run failed on the GPU", exc_info=error)
            raise user_error(describe_error(error)) from None


class StepsJob(NamedTuple):
    """A "steps" job's payload: the first `count` frames of `request`'s run."""

    request: RunRequest
    count: int


def first_frames(engine: DiffusionEngine, payload: StepsJob, stop) -> Iterator[Frame]:
    """The "steps" source: the first `payload.count` frames of `payload.request`'s run."""
    return itertools.islice(generation_frames(engine, payload.request, stop), payload.count)


def make_hub(engine: DiffusionEngine, environ: Mapping[str, str] | None = None, **kwargs) -> Hub:
    """`ZeroGpuHub` on ZeroGPU, else a plain `Hub`."""
    return (ZeroGpuHub if zero_gpu(environ) else Hub)(engine, **kwargs)

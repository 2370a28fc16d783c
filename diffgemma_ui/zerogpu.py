"""ZeroGPU (Hugging Face Spaces' shared GPUs): every tab's model work runs in the GPU process ZeroGPU forks.

`ZeroGpuPlayground.start_job` runs a job's source under `spaces.GPU`; the `Job`, its `StopFlag` and each frame are
pickled across. `GpuBudget` sizes the GPU time a job asks for and refuses one that cannot fit the quota. The main
process never touches CUDA. Off ZeroGPU nothing here is used (`make_playground`).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import math
import os
import tempfile
import traceback
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import torch

from engine import DiffusionEngine, DiffusionSettings, Frame
from engine.settings import draw_seed
from engine.loading import ModelLoadError, load_model
from engine.memory import memory_report

from .deployment import zero_gpu
from .handlers import Job, Playground, generation_frames, received
from .runs import RunWorker
from .tab import describe_error, user_error
from .validation import RunRequest

LOG = logging.getLogger(__name__)
GpuSize = str  # "large" (half a card) or "xlarge" (the whole card), as `spaces.GPU(size=...)` takes it
XLARGE_WEIGHTS_BYTES = 45_097_156_608  # `spaces`' own switch to "xlarge" (the 26B model in bf16 is above it)
MIN_RUN_S = 5.0  # the shortest time limit a run gets (its estimate may be a fraction of a second)


# -- the stop signal ----------------------------------------------------------------------------------------------
class StopFlag:
    """A stop signal across processes (`set`, `is_set` as `threading.Event`'s): set when its file exists; only
    the path is pickled. `discard()` removes the file once the run is over."""

    def __init__(self, directory: str | os.PathLike | None = None):
        folder = Path(directory) if directory is not None else _flag_dir()
        self.path = str(folder / f"diffgemma-stop-{uuid.uuid4().hex}")

    def set(self) -> None:
        """Raise the flag (idempotent)."""
        try:
            Path(self.path).touch()
        except OSError as error:  # a full or read-only disk must not turn Stop into a crash; the worker still ends
            LOG.warning("could not raise the stop flag %s: %s", self.path, error)

    def is_set(self) -> bool:
        """Whether the flag is raised (from any process)."""
        return os.path.exists(self.path)

    def discard(self) -> None:
        """Remove the flag's file (the run is over)."""
        Path(self.path).unlink(missing_ok=True)


def _flag_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


# -- the GPU time a request needs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuBudget:
    """How much ZeroGPU time a request asks for, and which requests are refused up front.

    Attributes:
        seconds_per_forward: assumed seconds per decoder forward (env DIFFGEMMA_ZEROGPU_SECONDS_PER_FORWARD).
        setup_s: seconds for the GPU process's start: weights, warm-up, prefill (env DIFFGEMMA_ZEROGPU_SETUP_SECONDS).
        quota_s: the quota every request must fit (default 120 s, an unauthenticated visitor's;
            env DIFFGEMMA_ZEROGPU_QUOTA_SECONDS).
        size: "large" or "xlarge" (an xlarge second is charged twice).
    """

    seconds_per_forward: float = 0.1
    setup_s: float = 20.0
    quota_s: float = 120.0
    size: GpuSize = "large"

    def __post_init__(self):
        if self.size not in ("large", "xlarge"):
            raise ValueError(f"ZeroGPU size must be 'large' or 'xlarge', got {self.size!r}")
        for name in ("seconds_per_forward", "setup_s", "quota_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"ZeroGPU {name} must be a number > 0, got {value!r}")

    @classmethod
    def from_environment(cls, size: GpuSize, environ: Mapping[str, str] | None = None) -> "GpuBudget":
        """The budget from the environment (defaults where unset); ValueError names a variable that is not a
        number > 0."""
        env = os.environ if environ is None else environ
        values = {}
        for field, name in (("seconds_per_forward", "DIFFGEMMA_ZEROGPU_SECONDS_PER_FORWARD"),
                            ("setup_s", "DIFFGEMMA_ZEROGPU_SETUP_SECONDS"),
                            ("quota_s", "DIFFGEMMA_ZEROGPU_QUOTA_SECONDS")):
            if text := env.get(name, "").strip():
                try:
                    values[field] = float(text)
                except ValueError:
                    values[field] = math.nan
                if not (math.isfinite(values[field]) and values[field] > 0):
                    raise ValueError(f"{name} must be a number > 0, got {text!r}")
        return cls(size=size, **values)

    @staticmethod
    def forwards(settings: DiffusionSettings, canvas_length: int) -> int:
        """Decoder forwards a request may take at most: whole canvases x `max_denoising_steps`."""
        return math.ceil(settings.max_new_tokens / canvas_length) * settings.max_denoising_steps

    def duration_s(self, settings: DiffusionSettings, canvas_length: int, extra_forwards: int = 0) -> int:
        """Seconds of GPU to ask for: `setup_s + forwards * seconds_per_forward`, rounded up (`extra_forwards`: a
        race's autoregressive side)."""
        forwards = self.forwards(settings, canvas_length) + extra_forwards
        return math.ceil(self.setup_s + forwards * self.seconds_per_forward)

    def quota_cost_s(self, duration_s: float) -> float:
        """Quota seconds a `duration_s` request costs (an xlarge second counts twice)."""
        return duration_s * (2 if self.size == "xlarge" else 1)

    def check(self, settings: DiffusionSettings, canvas_length: int, extra_forwards: int = 0) -> None:
        """Refuse a request that cannot fit the quota, naming what to lower.

        Raises:
            ValueError: the request's GPU time (as `quota_cost_s`) is over `quota_s`.
        """
        duration = self.duration_s(settings, canvas_length, extra_forwards)
        cost = self.quota_cost_s(duration)
        if cost <= self.quota_s:
            return
        per_forward = self.seconds_per_forward * (2 if self.size == "xlarge" else 1)
        most = max(0, int((self.quota_s - self.quota_cost_s(self.setup_s)) // per_forward))
        raise ValueError(
            f"this request may need {duration} s of GPU "
            f"({self.forwards(settings, canvas_length) + extra_forwards} decoder forwards "
            f"of {canvas_length}-token canvases), over what this ZeroGPU Space can ask for ({self.quota_s:g} s of "
            f"quota{', an xlarge second counting twice' if self.size == 'xlarge' else ''}): lower max_new_tokens or "
            f"max_denoising_steps (at most about {most} forwards in all)")


def weight_bytes(model) -> int:
    """Bytes of a model's weights as stored (`engine.memory.memory_report`)."""
    return memory_report(model)["total_bytes"]


def gpu_size_for(model, environ: Mapping[str, str] | None = None) -> GpuSize:
    """The ZeroGPU size to ask for: DIFFGEMMA_ZEROGPU_SIZE (large|xlarge) when set, else "xlarge" when the weights
    take more than `XLARGE_WEIGHTS_BYTES` (the 26B model in bf16), else "large".

    Raises:
        ValueError: DIFFGEMMA_ZEROGPU_SIZE is set to something else.
    """
    env = os.environ if environ is None else environ
    chosen = env.get("DIFFGEMMA_ZEROGPU_SIZE", "").strip().lower()
    if chosen and chosen != "auto":
        if chosen not in ("large", "xlarge"):
            raise ValueError(f"DIFFGEMMA_ZEROGPU_SIZE must be auto, large or xlarge, got {chosen!r}")
        return chosen
    return "xlarge" if weight_bytes(model) > XLARGE_WEIGHTS_BYTES else "large"


# -- loading --------------------------------------------------------------------------------------------------------
def load_zero_gpu_model(model: str, dtype: str = "auto", quantization: str = "none"):
    """Load a checkpoint for ZeroGPU (after `import spaces`): on the CPU, then `.to("cuda")`, which `spaces`
    turns into placeholders packed at launch. Returns the `LoadedModel` with `device` cuda.

    Raises:
        ModelLoadError: as `engine.load_model`, and for any quantization (not offered on ZeroGPU).
    """
    if quantization != "none":
        raise ModelLoadError(f"{quantization} quantization is not offered on ZeroGPU (its packed weights under "
                             "ZeroGPU's CUDA emulation were never checked): use --quantization none (bf16 weights, an "
                             "xlarge GPU)")
    loaded = load_model(model, "cpu", "bfloat16" if dtype == "auto" else dtype, "none")
    loaded.model.to("cuda")
    loaded.device = torch.device("cuda")
    return loaded


def cpu_view(engine: DiffusionEngine) -> DiffusionEngine:
    """A shallow copy of `engine` on the CPU, for the main process's checks (its model is never run)."""
    view = copy.copy(engine)
    view.device = torch.device("cpu")
    return view


# -- the playground ---------------------------------------------------------------------------------------------------
_WARMED_PID: int | None = None  # the process whose model has been warmed up (a forked GPU process starts cold)


class ZeroGpuPlayground(Playground):
    """`Playground` whose runs execute under `spaces.GPU`, in the GPU process ZeroGPU forks; `self.engine` is a
    CPU view of `engine` (checks, summaries), `self.gpu_engine` runs in the GPU process. `budget`: default from
    the environment; `spaces_module`: the imported `spaces` (default: imported here)."""

    def __init__(self, engine: DiffusionEngine, *, budget: GpuBudget | None = None, spaces_module=None, **kwargs):
        super().__init__(cpu_view(engine), **kwargs)
        self.gpu_engine = engine
        self.budget = budget or GpuBudget.from_environment(gpu_size_for(engine.model))
        self.sources["steps"] = first_frames
        if spaces_module is None:
            import spaces as spaces_module  # noqa: PLC0415 - only on ZeroGPU
        self._gpu_frames = spaces_module.GPU(duration=self.gpu_seconds, size=self.budget.size)(self._frames_on_gpu)

    # -- in the main process ---------------------------------------------------------------------------------------
    def gpu_seconds(self, job: Job, stop: StopFlag) -> int:
        """`spaces.GPU`'s `duration`: called with the GPU function's arguments, returns seconds to ask for."""
        return self.budget.duration_s(job.settings, self.engine.canvas_length, job.extra_forwards)

    def check_request(self, request: RunRequest) -> None:
        """`Playground.check_request` on the CPU view, then the GPU budget (raises ValueError)."""
        super().check_request(request)
        self.check_job(Job("generate", request, request.settings))

    def check_job(self, job: Job) -> None:
        """The GPU budget of `job` (raises ValueError naming what to lower)."""
        self.budget.check(job.settings, self.engine.canvas_length, job.extra_forwards)

    def start_job(self, job: Job, key: str | None = None, *, keep_history: bool = True, record=None,
                  receive=None) -> RunWorker:
        """Ask ZeroGPU for a GPU and start `job` there; returns the `RunWorker` reading what it yields. Call it
        where Gradio has the visitor's request in context (their quota identity): it blocks until the first frame.

        Raises:
            gr.Error: the platform refused (quota, no GPU) or the run failed before its first frame.
        """
        stop = StopFlag()
        frames = self._gpu_frames(job, stop)  # a Job (plain values) and a StopFlag: both pickle
        try:
            first = [next(frames)]
        except StopIteration:
            first = []
        except BaseException as error:
            stop.discard()
            if isinstance(error, Exception) and not isinstance(error, gr.Error):
                LOG.error("ZeroGPU run failed to start: %s", "".join(traceback.format_exception(error)).rstrip())
                raise user_error(describe_error(error)) from None
            raise
        # Set-up is over with the first frame: the run may take the forwards' share of the time it asked for
        left = max(MIN_RUN_S, self.gpu_seconds(job, stop) - self.budget.setup_s)

        def source(_stop) -> Iterator[Frame]:
            try:
                yield from received(itertools.chain(first, frames), receive)
            finally:
                frames.close()  # ends the GPU call: the child stops after its next frame, the GPU is released
                stop.discard()

        return self.runs.start(source, key, keep_history=keep_history, stop_event=stop, record=record, limit_s=left)

    def step_frames(self, request: RunRequest) -> Iterator[Frame]:
        """A stepped run on ZeroGPU: step n is a GPU call that runs the first n forwards (the same seed, so the same
        tokens as one run) and sends the last."""
        request = dataclasses.replace(request, seed=draw_seed() if request.seed is None else request.seed)
        self.check_job(Job("steps", None, request.settings))
        for count in itertools.count(1):
            worker = self.start_job(Job("steps", (request, count), request.settings), keep_history=False)
            snap = worker.wait()
            if snap.error is not None:
                raise snap.error
            if snap.latest is None or snap.frames_seen < count:
                return
            yield snap.latest
            if snap.latest.done:
                return

    # -- in the GPU process ----------------------------------------------------------------------------------------
    def _frames_on_gpu(self, job: Job, stop: StopFlag) -> Iterator[Frame]:
        """What `spaces.GPU` runs in its forked process: warm up once per process, then the job's source on the
        GPU engine. Errors become `gr.Error` (`spaces` passes only a `gr.Error`'s message back)."""
        global _WARMED_PID
        try:
            if _WARMED_PID != os.getpid():
                self.gpu_engine.warm_up()
                _WARMED_PID = os.getpid()
            yield from self.sources[job.kind](self.gpu_engine, job.payload, stop)
        except Exception as error:  # noqa: BLE001 - one clear message across the process boundary
            if not isinstance(error, ValueError):
                LOG.error("run failed on the GPU: %s", "".join(traceback.format_exception(error)).rstrip())
            raise user_error(describe_error(error)) from None


def first_frames(engine: DiffusionEngine, payload: tuple, stop) -> Iterator[Frame]:
    """The "steps" source: the first `count` frames of a run of `request` (payload `(request, count)`)."""
    request, count = payload
    return itertools.islice(generation_frames(engine, request, stop), count)


def make_playground(engine: DiffusionEngine, environ: Mapping[str, str] | None = None, **kwargs) -> Playground:
    """`ZeroGpuPlayground` on ZeroGPU (`SPACES_ZERO_GPU` set), a plain `Playground` everywhere else."""
    if zero_gpu(environ):
        return ZeroGpuPlayground(engine, **kwargs)
    return Playground(engine, **kwargs)

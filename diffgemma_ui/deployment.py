"""How the app is served: the platform from its environment (Spaces, ZeroGPU, CPU cores), the queue plan, glibc's
malloc arenas and the listening port."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

TRUE_WORDS = ("1", "t", "true", "yes", "on")  # as `spaces.config.boolean` reads them
M_ARENA_MAX = -8  # glibc's malloc.h
SERVING_ARENAS = 2
QUEUE_IDLE_POLL_S = 0.01  # how often an idle Gradio queue looks for new events


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
    """A Space's `CPU_CORES` (>= 1), or None off Spaces or when unset or bad."""
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


QUEUE_PLANS = {"cpu": QueuePlan(concurrency=4, max_size=None), "cuda": QueuePlan(concurrency=1, max_size=None),
               "zerogpu": QueuePlan(concurrency=4, max_size=16)}


def queue_plan(device_type: str, environ: Mapping[str, str] | None = None) -> QueuePlan:
    """The `QueuePlan` for a model on `device_type` ("cpu", "cuda", "mps") in this environment."""
    return QUEUE_PLANS["zerogpu" if zero_gpu(environ) else "cuda" if device_type == "cuda" else "cpu"]


def slow_idle_queue_polling(app, seconds: float = QUEUE_IDLE_POLL_S) -> bool:
    """After `app.queue()`: poll an idle queue every `seconds` (Gradio's 1 ms takes the GIL); whether it could."""
    queue = getattr(app, "_queue", None)
    if queue is None or not hasattr(queue, "sleep_when_free"):
        return False
    queue.sleep_when_free = seconds
    return True


def limit_malloc_arenas(arenas: int = SERVING_ARENAS, environ: Mapping[str, str] | None = None) -> int | None:
    """Set glibc's malloc arena limit (as `MALLOC_ARENA_MAX` would); returns it, or None when `MALLOC_ARENA_MAX` is
    set or the C library is not glibc. ValueError for `arenas` < 1."""
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
    """Why the server could not listen on `host`:`port`, or None when it can."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.strerror or str(error)
    return None

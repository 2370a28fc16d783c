"""Where the app is deployed, read from the environment the platform sets (never from which packages import).

Hugging Face Spaces set `SYSTEM=spaces` and `SPACE_ID` on every Space, `SPACES_ZERO_GPU` on ZeroGPU hardware (the
variable the `spaces` package and Gradio read themselves) and `CPU_CORES` with the Space's CPU allowance. The `spaces`
package is preinstalled on every Gradio Space and installable anywhere, so whether it imports says nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

TRUE_WORDS = ("1", "t", "true", "yes", "on")  # `spaces.config.boolean` accepts 1, t, true (case-insensitive)


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def zero_gpu(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs on ZeroGPU hardware: `SPACES_ZERO_GPU` is set to a true word (1, t, true, yes, on;
    any case), the condition under which `spaces.GPU` stops being a no-op."""
    return _environ(environ).get("SPACES_ZERO_GPU", "").strip().lower() in TRUE_WORDS


def space_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The Space's id (`owner/name`) when running on Hugging Face Spaces (`SYSTEM=spaces`), else None.

    A Space without `SPACE_ID` (never seen, but cheap to handle) gives "unknown"."""
    env = _environ(environ)
    if env.get("SYSTEM", "").strip().lower() != "spaces":
        return None
    return env.get("SPACE_ID", "").strip() or "unknown"


def space_cpu_cores(environ: Mapping[str, str] | None = None) -> int | None:
    """The CPU cores a Space is allotted (`CPU_CORES`, a whole number >= 1), or None off Spaces or when unset/bad.

    On a Space the container sees the host's CPUs (`os.cpu_count()`), not its allowance, so thread counts must come
    from here.
    """
    if space_id(environ) is None:
        return None
    text = _environ(environ).get("CPU_CORES", "").strip()
    try:
        cores = int(float(text))
    except ValueError:
        return None
    return cores if cores >= 1 else None


def default_threads(environ: Mapping[str, str] | None = None) -> int | None:
    """Torch CPU threads to serve with when none were asked for: one fewer than a Space's `CPU_CORES` (at least 1,
    leaving a core to the web server, as `engine.loading.set_serving_threads` does with the CPUs it can see), or None
    (let `set_serving_threads` decide) off Spaces."""
    cores = space_cpu_cores(environ)
    return None if cores is None else max(1, cores - 1)


@dataclass(frozen=True)
class QueuePlan:
    """How the Gradio queue is set up: `concurrency` runs at once on the engine, `max_size` events waiting (None:
    unbounded). Set on purpose on every path: Gradio silently uses `max_size=1` on ZeroGPU when the app sets none."""

    concurrency: int
    max_size: int | None


# A CPU serves a few small runs side by side; one dedicated GPU is best used by one run at a time; the queue behind
# them is unbounded there (each run is capped by the server's time limit per run, so every wait ends). On ZeroGPU each
# run gets its own GPU from the platform, which queues GPU requests itself (with its own notices and quota), so
# several runs may be in flight and Gradio's queue only holds a few events beyond them.
QUEUE_PLANS = {
    "cpu": QueuePlan(concurrency=4, max_size=None),
    "cuda": QueuePlan(concurrency=1, max_size=None),
    "zerogpu": QueuePlan(concurrency=4, max_size=16),
}


def queue_plan(device_type: str, environ: Mapping[str, str] | None = None) -> QueuePlan:
    """The `QueuePlan` for a model on `device_type` ("cpu", "cuda", "mps") in this environment."""
    if zero_gpu(environ):
        return QUEUE_PLANS["zerogpu"]
    return QUEUE_PLANS["cuda" if device_type == "cuda" else "cpu"]

"""Hugging Face ZeroGPU support: run the engine's frame loop under `spaces.GPU` when (and only when) the `spaces`
package is importable. Everywhere else the function is used unchanged."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

DEFAULT_GPU_SECONDS = 120


def spaces_available() -> bool:
    """Whether the `spaces` package (Hugging Face Spaces, ZeroGPU) can be imported."""
    return importlib.util.find_spec("spaces") is not None


def on_gpu_if_spaces(fn: Callable, duration: int = DEFAULT_GPU_SECONDS) -> Callable:
    """`spaces.GPU(duration=duration)(fn)` when `spaces` is importable, else `fn` itself.

    On a ZeroGPU Space the decorated call gets a GPU for at most `duration` seconds; outside ZeroGPU hardware the
    decorator is a no-op by design of the `spaces` package.
    """
    if not spaces_available():
        return fn
    import spaces  # noqa: PLC0415 - only on Spaces

    return spaces.GPU(duration=duration)(fn)

"""Bound glibc's malloc arenas in the serving process, as `MALLOC_ARENA_MAX` would.

Each run's worker thread allocates in its own glibc arena, and every arena keeps its high-water mark (up to 8 per
core), so the server's RSS climbs with the number of visitors: measured +133 MiB over 50 browser visitors with the
default, +42 MiB with two arenas (`benchmarks/load_test.py --browser-sessions 50`, benchmarks/README.md), at the same
throughput within noise. `mallopt(M_ARENA_MAX, n)` is the call glibc itself makes for the variable; it applies to
arenas created after it, so the app calls it before it loads the model and starts serving.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping

M_ARENA_MAX = -8  # glibc's malloc.h
SERVING_ARENAS = 2


def limit_malloc_arenas(arenas: int = SERVING_ARENAS, environ: Mapping[str, str] | None = None) -> int | None:
    """Set glibc's arena limit to `arenas` (>= 1) and return it; None when nothing was changed: `MALLOC_ARENA_MAX` is
    set in `environ` (default `os.environ`; the operator's choice, which glibc has already applied) or the C library
    is not glibc (macOS, musl), which has no such arenas.

    Raises:
        ValueError: `arenas` < 1.
    """
    if arenas < 1:
        raise ValueError(f"arenas must be >= 1, got {arenas}")
    if (os.environ if environ is None else environ).get("MALLOC_ARENA_MAX", "").strip():
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return arenas if mallopt(M_ARENA_MAX, arenas) == 1 else None

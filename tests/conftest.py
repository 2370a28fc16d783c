"""Shared fixtures: the embedded model's engine and the playground served in-process on a free port."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # before gradio and the hub client read them
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gradio_client import Client  # noqa: E402

from diffgemma_ui import build_app  # noqa: E402
from engine import DEFAULT_MODEL, DiffusionEngine, load_model  # noqa: E402
from pages import CHROMIUM, CHROMIUM_ARGS, free_port  # noqa: E402
from standin import ensure_standin  # noqa: E402


# A test that needs one of these (directly or through another fixture) runs a model, a server or a browser
SLOW_FIXTURES = frozenset({"engine", "standin_engine", "standin_path", "served_app", "browser"})


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: runs the embedded model or a browser (seconds, not milliseconds)")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # pytest-xdist: share the cores between the workers instead of each taking all of them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(config, items):
    """Mark `slow` every test that uses a model, server or browser fixture, so `-m "not slow"` is the fast loop."""
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium (`pages.CHROMIUM`, never a downloaded browser), one per test module; the test is
    skipped when Playwright or Chromium is missing."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    with playwright_api.sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield instance
        instance.close()


@pytest.fixture(scope="session")
def engine():
    """A `DiffusionEngine` on the embedded diffgemma-tiny model (or DIFFGEMMA_TEST_MODEL), on CPU, loaded once."""
    return DiffusionEngine(load_model(os.environ.get("DIFFGEMMA_TEST_MODEL") or DEFAULT_MODEL, device="cpu"))


@pytest.fixture(scope="session")
def standin_path():
    """The stand-in for google/diffusiongemma-26B-A4B-it (`standin.ensure_standin`): built once into data/standin
    (about a minute), then reused across sessions while its generator's inputs are unchanged."""
    return ensure_standin()


@pytest.fixture(scope="session")
def standin_engine(standin_path):
    """A `DiffusionEngine` on the stand-in, on CPU (float32), loaded once. Each decoder forward at its 262,144-token
    vocabulary costs seconds here: use 1-3 denoising steps."""
    return DiffusionEngine(load_model(standin_path, device="cpu"))


@pytest.fixture(scope="session")
def served_app(engine):
    """The playground launched in-process: yields (app, url). Closed at the end of the session."""
    app = build_app(engine)
    _, url, _ = app.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True)
    yield app, url
    app.close()


@pytest.fixture(scope="module")
def client(served_app):
    """A `gradio_client.Client` of the served playground, one per test module; closed after it."""
    api_client = Client(served_app[1], verbose=False)
    yield api_client
    api_client.close()

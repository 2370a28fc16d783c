"""What docs/design.md's "Where to change what" promises, done: a tab is one module plus one line in the app's list
of tabs, and a setting is one row in the settings table plus its `DiffusionSettings` field."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from diffgemma_ui import build_app
from diffgemma_ui.blocks import make_tabs
from diffgemma_ui.hub import Job
from diffgemma_ui.tab import Tab, api_run
from diffgemma_ui.text import plain_text
from engine import DiffusionSettings
from engine.trace import record_trace
from synthetic import synthetic_frame

REPO = Path(__file__).resolve().parent.parent
ADDED_SETTING = Path(__file__).resolve().parent / "added_setting.py"


def counted_frames(engine, count: int, stop):
    """The "trivial" source: `count` one-token forwards of a synthetic canvas, the last one done."""
    for step in range(count):
        last = step == count - 1
        yield synthetic_frame(1, ["x"], step=step, block_done=last, done=last, stop_reason="eos" if last else "")


class TrivialTab(Tab):
    """A whole tab in a few lines: a title, a note, a frame source and `/trivial`, which runs a job of it."""

    title = "Trivial"
    sources = {"trivial": counted_frames}
    closed: list[str | None]

    def build(self, page) -> None:
        self.closed = []
        gr.Markdown("Nothing to see here.", elem_id="dg-trivial-note")

    def endpoints(self, page):
        return [("trivial", self.count_api, [("frames", int, 2)], dict, "Run `frames` forwards of the trivial source.")]

    async def count_api(self, frames, request: gr.Request = None) -> dict:
        job = Job("trivial", int(frames), DiffusionSettings())
        snap = await api_run(self.hub, lambda: job, request, keep_history=False)
        return {"frames": snap.frames_seen, "stop_reason": snap.latest.stop_reason}

    def unload(self, request: gr.Request) -> None:
        self.closed.append(getattr(request, "session_hash", None))


def descendants(node: dict) -> set[int]:
    """The component ids below a node of a page config's layout."""
    below = set()
    for child in node.get("children", ()):
        below |= {child["id"], *descendants(child)}
    return below


def layout_node(node: dict, component: int) -> dict | None:
    """The node of `component` in the layout tree under `node`."""
    if node["id"] == component:
        return node
    return next((found for child in node.get("children", ()) if (found := layout_node(child, component))), None)


def test_a_tab_is_one_module_plus_one_line_in_the_list_of_tabs(engine):
    app = build_app(engine, tabs=lambda hub: [*make_tabs(hub), TrivialTab(hub)])
    trivial = app.tabs["trivial"]
    assert list(app.tabs) == ["playground", "race", "compare", "chat", "infill", "trivial"]  # the others unchanged
    assert isinstance(trivial, TrivialTab) and trivial.hub is app.hub
    assert app.hub.sources["trivial"] is counted_frames and "generate" in app.hub.sources

    # its own gr.Tab, last in the page, holding what its build made
    config = app.get_config_file()
    components = {c["id"]: c for c in config["components"]}
    tabs = [c for c in config["components"] if c["type"] == "tabitem"]
    assert [c["props"]["label"] for c in tabs][-1] == "Trivial"
    (tab,) = [c for c in tabs if c["props"].get("elem_id") == "dg-tab-trivial"]
    (note,) = [i for i, c in components.items() if c["props"].get("elem_id") == "dg-trivial-note"]
    assert note in descendants(layout_node(config["layout"], tab["id"]))

    # its endpoint, registered and run through the hub with the tab's own frame source
    (endpoint,) = [dep.fn for dep in app.fns.values() if dep.api_name == "trivial"]
    assert list(inspect.signature(endpoint).parameters) == ["frames", "request"]
    assert "/trivial" in app.get_api_info()["named_endpoints"]
    assert asyncio.run(endpoint(frames=3)) == {"frames": 3, "stop_reason": "eos"}

    # and its unload, called when a visitor's page closes
    unloads = [dep.fn for dep in app.fns.values() if any(target[1] == "unload" for target in dep.targets)]
    assert trivial.unload in unloads and app.tabs["playground"].unload in unloads
    trivial.unload(SimpleNamespace(session_hash="closed"))
    assert trivial.closed == ["closed"]


def with_new_settings(root: Path) -> Path:
    """A copy of `engine/` and `diffgemma_ui/` under `root` (assets linked) whose settings table has two rows more
    and `DiffusionSettings` their two fields: the whole change a new setting should need. Its settings.py."""
    for package in ("engine", "diffgemma_ui"):
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "assets").symlink_to(REPO / "assets")
    path = root / "engine" / "settings.py"
    text = path.read_text(encoding="utf-8")
    table_start = text.index("SETTINGS: tuple[SettingSpec, ...] = (\n")
    table_end = text.index("\n)\n", table_start)
    rows = ('\n    SettingSpec("noise_floor", "Noise floor", float, 0.0, 1.0, True, "a number added by a test", '
            '"--noise-floor"),'
            '\n    SettingSpec("tie_shuffle", "Shuffle ties", bool, None, None, True, "a flag added by a test", '
            '"--tie-shuffle"),')
    text = text[:table_end] + rows + text[table_end:]
    fields_end = text.index("\n\n    def __post_init__(self):", text.index("class DiffusionSettings:"))
    text = text[:fields_end] + "\n    noise_floor: float = 0.0\n    tie_shuffle: bool = False" + text[fields_end:]
    path.write_text(text, encoding="utf-8")
    return path


def test_a_setting_is_one_row_and_its_field(engine, tmp_path):
    old_trace = tmp_path / "old.json"  # written by this code, which has no such settings
    trace = record_trace(engine, "In the beginning", DiffusionSettings(max_new_tokens=8, max_denoising_steps=1),
                         raw=True, seed=2)
    old_trace.write_text(json.dumps(trace.to_dict()), encoding="utf-8")
    root = tmp_path / "tree"
    with_new_settings(root)
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ADDED_SETTING), str(old_trace), str(tmp_path)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    new = {"noise_floor": 0.25, "tie_shuffle": True}
    defaults = {"noise_floor": 0.0, "tie_shuffle": False}
    assert Path(report["engine"]).resolve().is_relative_to(root.resolve())  # the copy ran, not this tree
    assert report["setting_names"][-2:] == list(new) and report["defaults"] == defaults
    # the command line: a flag each, the values in the run's trace
    assert report["cli_args"] == new and report["cli_status"] == 0 and report["cli_trace"] == new
    # the app: a Playground control each, wired into Generate's check; a parameter of every run endpoint
    assert report["controls"] == {"noise_floor": ["Slider"], "tie_shuffle": ["Checkbox"]}
    assert {"Noise floor", "Shuffle ties"} <= set(report["generate_inputs"])
    assert set(report["endpoint_parameters"]) == {"generate", "export", "race", "chat", "infill"}
    for name, parameters in report["endpoint_parameters"].items():
        assert {"noise_floor", "tie_shuffle"} <= set(parameters), name
    assert report["checked_request"] == new and report["exported"] == new
    # a trace written before the settings existed reads with their defaults, as a file and as an upload
    assert report["old_trace"] == defaults and report["uploaded"] == defaults
    assert report["uploaded_text"] == plain_text(trace.text)

"""What docs/design.md's "Where to change what" promises, done: a tab is one module plus one line in the app's list
of tabs."""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace

import gradio as gr

from diffgemma_ui import build_app
from diffgemma_ui.blocks import make_tabs
from diffgemma_ui.hub import Job
from diffgemma_ui.tab import Tab, api_run
from engine import DiffusionSettings
from synthetic import synthetic_frame


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


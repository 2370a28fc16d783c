"""DiffGemma Playground UI: Gradio views of the engine's frames.

Modules, one job each: `text` (escaping, visible whitespace), `colors` (viridis), `canvas_view` (canvas HTML),
`plots` (Plotly figure dicts), `meter` (speed meter HTML), `record` (frames of a run), `worker` (background run +
coalescing), `validation` (input checks), `session` (per-session state), `deployment` (where it runs, read from the
environment), `zerogpu` (runs on ZeroGPU), `handlers` (event handlers), `blocks` (layout and wiring only). The UI
uses the engine's public API only.
"""

from .blocks import build_app

__all__ = ["build_app"]

"""DiffGemma Playground UI: Gradio views of the engine's frames (docs/design.md maps the modules)."""

from .blocks import build_app

__all__ = ["build_app"]

"""The app: the header, then one `gr.Tab` per tab of `make_tabs`, each built by its own module; the queue plan."""

import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from engine import DiffusionEngine
from engine.loading import DEFAULT_MODEL
from engine.quantization import model_bytes
from engine.race import RaceRunner
from engine.trace import PLOTLY_GZ

from .chat_tab import ChatTab
from .compare_tab import CompareHandlers
from .deployment import make_hub, queue_plan, slow_idle_queue_polling
from .hub import Hub
from .infill_tab import InfillTab
from .keep import present_head
from .playground_tab import PlaygroundTab
from .race_tab import RaceTab
from .session import SessionState
from .tab import Tab, register_api
from .text import escape_html, prose

DEFAULT_PROMPT = "Tell me what happened after the flood."
INSTRUCTION_DEFAULT_PROMPT = "Explain in three sentences how a diffusion language model writes text."
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
EXAMPLES_PATH = ASSETS_DIR / "examples.json"
EXPLAINER_PATH = ASSETS_DIR / "text" / "explainer.md"


class PlaygroundBlocks(gr.Blocks):
    """`gr.Blocks` whose `launch()` defaults to the playground's theme, CSS and head (as Gradio 6 wants)."""

    def launch(self, *args, **kwargs):
        kwargs.setdefault("theme", gr.themes.Soft(
            primary_hue="violet", secondary_hue="teal", neutral_hue="slate",
            font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif"],
            font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"],
        ).set(checkbox_border_color="*neutral_400", checkbox_border_color_dark="*neutral_500"))
        kwargs.setdefault("css_paths", [ASSETS_DIR / "style.css", ASSETS_DIR / "chat_infill.css"])
        kwargs.setdefault("head_paths", [ASSETS_DIR / "head.html"])
        kwargs.setdefault("head", present_head())
        return super().launch(*args, **kwargs)


def load_examples(path: Path = EXAMPLES_PATH, *, embedded: bool = True) -> list[list]:
    """`[[prompt, raw], ...]`: the JSON's "examples" for the embedded model, else its "instruction_examples"."""
    data = json.loads(path.read_text(encoding="utf-8"))
    chosen = data["examples"] if embedded else data.get("instruction_examples") or data["examples"]
    return [[str(e["prompt"]), bool(e.get("raw", False))] for e in chosen]


def header_html(engine: DiffusionEngine) -> str:
    """The page header: title, model, device, canvas, the weights' memory as stored (escaped)."""
    model = escape_html(Path(str(engine.source)).name or str(engine.source))
    nbytes = model_bytes(engine.model)
    size = f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"
    vision = getattr(getattr(engine.model, "config", None), "vision_config", None) is not None
    text_only = prose("text-only-badge") if vision else ""
    return (
        f'<div class="dg-header">{prose("header")}<div class="dg-badges"><span class="dg-badge">model: {model}</span>'
        f'<span class="dg-badge">device: {escape_html(str(engine.device))}</span>'
        f'<span class="dg-badge">canvas: {int(engine.canvas_length)} tokens</span>'
        f'<span class="dg-badge" title="memory the weights take on the device, as stored (quantized or not)">'
        f"weights: {size}</span>{text_only}</div></div>"
    )


@dataclass(frozen=True)
class Page:
    """What every tab's `build` and `endpoints` may read: the engine, the shared session state, the defaults."""

    engine: DiffusionEngine
    session: gr.State
    embedded: bool
    default_prompt: str
    examples: list[list] = field(default_factory=list)
    explainer: str = ""
    required: object = inspect.Parameter.empty  # an endpoint parameter without a default

    @staticmethod
    def file_url(path: Path) -> str:
        """The page's URL of a file under `ASSETS_DIR` (served by Gradio; see `build_app`)."""
        return f"gradio_api/file={Path(path).resolve()}"


def make_tabs(hub: Hub, race: RaceRunner | None = None) -> list[Tab]:
    """The app's tabs, in page order: one line each."""
    return [
        PlaygroundTab(hub),
        RaceTab(race or RaceRunner(hub.engine), hub),
        CompareHandlers(hub),
        ChatTab(hub),
        InfillTab(hub),
    ]


def build_app(engine: DiffusionEngine, *, race: RaceRunner | None = None,
              tabs: Callable[[Hub], Sequence[Tab]] | None = None, **limits) -> gr.Blocks:
    """The app of `engine`: the hub in `app.hub`, each tab in `app.tabs` by title (lower case); `limits` as
    `Hub`'s, `race` the Race tab's runner, `tabs` the tab maker (default `make_tabs`)."""
    hub = make_hub(engine, **limits)
    made = tabs(hub) if tabs is not None else make_tabs(hub, race)
    try:
        embedded = Path(str(engine.source)).resolve() == DEFAULT_MODEL.resolve()
    except (OSError, RuntimeError):
        embedded = False
    gr.set_static_paths([PLOTLY_GZ.parent])
    with PlaygroundBlocks(title="DiffGemma Playground", analytics_enabled=False) as app:
        page = Page(engine=engine, session=gr.State(SessionState()), embedded=embedded,
                    default_prompt=DEFAULT_PROMPT if embedded else INSTRUCTION_DEFAULT_PROMPT,
                    examples=load_examples(embedded=embedded), explainer=EXPLAINER_PATH.read_text(encoding="utf-8"))
        gr.HTML(header_html(engine), elem_id="dg-header-block")
        with gr.Tabs(elem_id="dg-tabs"):
            for tab in made:
                name = tab.title.lower()
                with gr.Tab(tab.title, id=name, elem_id=f"dg-tab-{name}"):
                    tab.build(page)
        for tab in made:
            app.unload(tab.unload)
            for endpoint in tab.endpoints(page):
                register_api(*endpoint)

    app.queue_plan = queue_plan(engine.device.type)  # set on every path: Gradio's ZeroGPU default is max_size=1
    app.queue(default_concurrency_limit=app.queue_plan.concurrency, max_size=app.queue_plan.max_size)
    slow_idle_queue_polling(app)
    app.hub = hub
    app.tabs = {tab.title.lower(): tab for tab in made}
    hub.runs.blocks = app
    return app

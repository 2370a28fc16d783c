"""The skeleton every tab fills in: a `checked` step, a `live_run` stream, `user_error`, `register_api`."""

import functools
import inspect
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import gradio as gr

from engine import PRESET_NAMES, DiffusionSettings
from engine.settings import SETTING_NAMES, spec

from . import plots
from .runs import RunSnapshot, RunTimeLimitExceeded, RunWorker, is_out_of_memory, session_key
from .session import SessionState
from .text import escape_html

LOG = logging.getLogger(__name__)
PLOT_INTERVAL_S = 1.0  # live plots re-render at most this often
PLOT_CELLS = 8192  # heatmap cells the browser redraws each PLOT_INTERVAL_S at most
PRIVATE = dict(api_visibility="private", show_progress="hidden")
UNQUEUED = dict(concurrency_limit=None, **PRIVATE)
_EXPECTED = (ValueError, gr.Error, RunTimeLimitExceeded)


class Tab:
    """A tab (or a panel of one) on the app's `hub.Hub`: its `title`, frame `sources` (job kind -> frame source,
    registered in the hub), `build(page)` (its components and events inside its `gr.Tab`), `endpoints(page)`
    (rows for `register_api`) and `unload` (its visitor closed the page)."""

    title = ""
    sources: dict[str, Callable] = {}

    def __init__(self, hub):
        self.hub, self.engine = hub, hub.engine
        if self.sources:
            hub.sources.update(self.sources)

    def build(self, page) -> None:
        """The tab's components and events, inside its `gr.Tab`; `page` as `blocks.Page`."""

    def endpoints(self, page) -> Sequence[tuple]:
        """(name, handler, parameters, returns, doc) of the tab's endpoints."""
        return ()

    def unload(self, request: gr.Request) -> None:
        """The visitor's page closed."""


def describe_error(error: BaseException) -> str:
    """The visitor's words for an error that ended a run or refused a request (no traceback)."""
    if isinstance(error, _EXPECTED):
        return str(error.message) if isinstance(error, gr.Error) else str(error) or type(error).__name__
    if is_out_of_memory(error):
        return ("out of memory during this run: lower max_new_tokens or max_denoising_steps, or shorten the prompt "
                "(the run's memory has been freed; the server is fine)")
    detail = " ".join(str(error).split())
    return f"the engine failed ({type(error).__name__}{': ' + detail if detail else ''}); the server log has details"


def user_error(error: BaseException | str, *, prefix: str = "") -> gr.Error:
    """The `gr.Error` for `error` (text, or an exception in `describe_error`'s words); unexpected ones logged."""
    if isinstance(error, BaseException) and not isinstance(error, _EXPECTED):
        LOG.error("request failed: %s: %s", type(error).__name__, error, exc_info=error)
    message = error if isinstance(error, str) else describe_error(error)
    return gr.Error(prefix + message, print_exception=False)


@contextmanager
def refusing() -> Iterator[None]:
    """Any exception raised in the block leaves it as `user_error`'s `gr.Error`."""
    try:
        yield
    except gr.Error:
        raise
    except Exception as error:  # noqa: BLE001 - a clear message either way
        raise user_error(error) from None


async def api_run(hub, job: Callable, request, **options) -> RunSnapshot:
    """An endpoint's `job()` (made and checked under `refusing`) run to its final snapshot; gr.Error."""
    def start() -> RunWorker:
        with refusing():
            made = job()
            hub.check_job(made)
        return hub.start_job(made, **options)

    snap = await hub.runs.served(start, request)
    if snap.error is not None:
        raise user_error(snap.error)
    return snap


def stop_run(state: SessionState | None) -> None:
    if state is not None:
        state.stop()


@contextmanager
def live_run(hub, job, request, state: SessionState, suffix: str, **options) -> Iterator[RunWorker]:
    """`hub.start_job(job, **options)` as `state.worker` under its `session_key`, stopped on leaving."""
    key = session_key(request, state, suffix)
    state.worker = worker = hub.start_job(job, key, **options)
    try:
        yield worker
    finally:
        hub.runs.finish(key, worker)


def buttons(running: bool) -> tuple:
    """(run button, Stop button) updates: Stop on while `running`."""
    return gr.update(interactive=not running), gr.update(interactive=running)


def run_buttons(label: str, run_id: str, stop_id: str, *, scale: int = 3,
                min_widths: tuple[int | None, int | None] = (None, None)) -> tuple[gr.Button, gr.Button]:
    """A tab's primary `label` button and its Stop button (off until a run starts)."""
    return (gr.Button(label, variant="primary", elem_id=run_id, scale=scale, min_width=min_widths[0]),
            gr.Button("Stop", variant="stop", interactive=False, elem_id=stop_id, scale=1, min_width=min_widths[1]))


def preset_dropdown(elem_id: str, label: str = "Preset", min_width: int = 140) -> gr.Dropdown:
    return gr.Dropdown(list(PRESET_NAMES), value="recommended", label=label, elem_id=elem_id, min_width=min_width)


def seed_box(elem_id: str, value: str = "0", info: str = "-1 = random", **options) -> gr.Textbox:
    return gr.Textbox(value=value, label="Seed", info=info, max_lines=1, max_length=24, elem_id=elem_id, **options)


class Refusal:
    """A session's last refusal in one tab (a `gr.State`, copied empty)."""

    reason = ""

    def __deepcopy__(self, memo) -> "Refusal":
        return Refusal()

    def html(self) -> str:
        return refusal_html(self.reason)


def refusal_html(reason: str) -> str:
    """The box under a tab's buttons: `reason` escaped, or "" for none."""
    if not reason:
        return ""
    return (f'<div class="dg-refusal" role="alert"><b>Not run:</b> {escape_html(reason)}'
            '<span class="dg-refusal-note"> (this stays until the next run)</span></div>')


def refusal_box(tab: str) -> tuple[gr.HTML, gr.State]:
    """The refusal box of `tab` (an element id part) and its state."""
    return gr.HTML("", elem_id=f"dg-{tab}-refusal", elem_classes=["dg-refusal-box"]), gr.State(Refusal())


@contextmanager
def noting(refusal: Refusal) -> Iterator[None]:
    """Clear `refusal`, then note in it why the block raised (and raise)."""
    refusal.reason = ""
    try:
        yield
    except Exception as error:
        refusal.reason = describe_error(error)
        raise


def guarded(fn: Callable, width: int | None = None) -> Callable:
    """`fn` (generator or not) taking a `Refusal` first, its errors noted there; `width`: a check step's outputs."""
    if inspect.isgeneratorfunction(fn):
        def stream(refusal: Refusal, *inputs):
            with noting(refusal):
                yield from fn(*inputs)
        return stream

    def step(refusal: Refusal, *inputs):
        with noting(refusal):
            result = fn(*inputs)
        if width is None:
            return result
        return "" if width == 0 else (*(result if width > 1 else (result,)), "")
    return step


def checked(triggers: Sequence, check: Callable, *, inputs: list, box: tuple[gr.HTML, gr.State],
            outputs: Sequence = (), refused: Callable | None = None, refused_inputs: Sequence = (),
            refused_outputs: Sequence = (), **options):
    """Wire `triggers` to `check(*inputs)` (gr.Error shown in `box`, then `refused` called); the event."""
    html, state = box
    event = gr.on(list(triggers), guarded(check, len(outputs)), inputs=[state, *inputs], outputs=[*outputs, html],
                  **{**UNQUEUED, **options})
    event.failure(Refusal.html, inputs=[state], outputs=[html], **UNQUEUED)
    if refused is not None:
        event.failure(refused, inputs=list(refused_inputs), outputs=list(refused_outputs), **UNQUEUED)
    return event


def wire_run(triggers: Sequence, check: Callable, stream: Callable, *, state: gr.State, inputs: list, outputs: list,
             box: tuple[gr.HTML, gr.State], stop: gr.Button, check_inputs: list | None = None, **refused):
    """A tab's run: `check(*check_inputs)` (default `inputs`), then `stream(state, *inputs)` in the engine's slot
    (a trigger while a stream ends runs after it); `stop` stops it. The stream's event."""
    event = checked(triggers, check, inputs=inputs if check_inputs is None else check_inputs, box=box,
                    trigger_mode="once", **refused)
    wire_stop(stop, state)
    return event.success(settled(stream, len(outputs)), inputs=[state, *inputs], outputs=outputs,
                         concurrency_id="engine", trigger_mode="always_last", **PRIVATE)


def settled(stream: Callable, outputs: int) -> Callable:
    """`stream`, then a no-op update (docs/design.md says why)."""
    @functools.wraps(stream)
    def step(*inputs, **options):
        yield from stream(*inputs, **options)
        yield (gr.skip(),) * outputs
    return step


def wire_stop(button: gr.Button, state: gr.State) -> None:
    button.click(stop_run, inputs=[state], **UNQUEUED)


def noted(listener: Callable, fn: Callable, box: tuple[gr.HTML, gr.State], *, inputs: list, **options):
    """`listener(fn)` on `inputs`, its errors shown in `box` (emptied after a pass); the event."""
    html, refusal = box
    event = listener(guarded(fn), inputs=[refusal, *inputs], **options)
    for outcome in (event.success, event.failure):  # Gradio runs no `.then` after an error
        outcome(Refusal.html, inputs=[refusal], outputs=[html], **UNQUEUED)
    return event


def setting_control(name: str, value, **options) -> gr.Slider | gr.Checkbox:
    """Setting `name`'s slider over the UI's range, or checkbox."""
    row = spec(name)
    options = {"label": row.label, "info": row.help, "value": value, **options}
    if row.kind is bool:
        return gr.Checkbox(**options)
    step = row.ui_step or (1 if row.kind is int else 0.01)
    low = row.low if row.low_inclusive else row.low + step
    return gr.Slider(low, row.ui_high if row.ui_high is not None else row.high, step=step, **options)


def live_plots(prefix: str, *, min_width: int = 260, row_id: str | None = None) -> tuple[gr.Plot, gr.Plot, gr.Plot]:
    """The three plots, empty, the heatmap above the others (element ids `prefix` + name)."""
    heatmap, order, entropy = plots.block_plots([])
    heatmap = gr.Plot(heatmap, show_label=False, elem_id=f"{prefix}heatmap")
    with gr.Row(elem_id=row_id):
        order, entropy = (gr.Plot(figure, show_label=False, elem_id=f"{prefix}{name}", min_width=min_width)
                          for name, figure in (("order", order), ("entropy", entropy)))
    return heatmap, order, entropy


class PlotClock:
    """Live plots are due each `PLOT_INTERVAL_S` (longer past `PLOT_CELLS` `cells`) and at a new block."""

    def __init__(self, wait_first: bool = False, cells: int = 0):
        self.last = time.monotonic() if wait_first else 0.0
        self.block = 0
        self.interval = PLOT_INTERVAL_S * max(1.0, cells / PLOT_CELLS)

    def due(self, block_count: int = 0) -> bool:
        now = time.monotonic()
        if now - self.last >= self.interval or block_count > self.block:
            self.last, self.block = now, block_count
            return True
        return False


Param = tuple[str, type, object]  # (name, type, default)


def setting_params(defaults: DiffusionSettings, names: Sequence[str] = SETTING_NAMES) -> list[Param]:
    """The endpoint parameters of settings `names`, defaulting to `defaults`."""
    return [(name, spec(name).kind, getattr(defaults, name)) for name in names]


def register_api(name: str, handler: Callable, params: Sequence[Param], returns, doc: str) -> None:
    """Register `/name`: `await handler(*values, request=...)` behind a signature of `params`."""
    parameters = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=kind)
                  for p, kind, default in (*params, ("request", gr.Request, None))]
    signature = inspect.Signature(parameters, return_annotation=returns)

    async def endpoint(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        *values, request = bound.arguments.values()
        return await handler(*values, request=request)

    endpoint.__name__ = endpoint.__qualname__ = f"{name}_api"
    endpoint.__doc__ = doc
    endpoint.__signature__ = signature
    endpoint.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": returns}
    gr.api(endpoint, api_name=name, concurrency_id="engine")

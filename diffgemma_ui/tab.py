"""The tab skeleton every tab (Playground, Race, Compare, Chat, Infill) fills in.

A tab keeps its visitor's run in a `TabState`, checks its inputs in a step wired by `checked` (a refusal's reason
stays in the tab's `refusal_box` until its next run), streams a `live_run` and renders it; `user_error` is how any
failure reaches the visitor; `register_api` builds an endpoint whose settings come from the settings table.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import gradio as gr

from engine import DiffusionSettings
from engine.settings import SETTING_NAMES, spec

from . import plots
from .runs import STOP_WAIT_S, ClientGone, Runner, RunTimeLimitExceeded, RunWorker, is_out_of_memory
from .text import escape_html

LOG = logging.getLogger(__name__)
PLOT_INTERVAL_S = 1.0  # live plots re-render at most this often (the final render always has everything)
PLOT_CELLS = 8192  # heatmap cells the browser redraws each PLOT_INTERVAL_S at most (256 x 128: every 4 s)
API_SETTINGS = SETTING_NAMES  # the settings every endpoint takes, in the settings table's order
PRIVATE = dict(api_visibility="private", show_progress="hidden")


def describe_error(error: BaseException) -> str:
    """The user-facing message for an error that ended a run or rejected a request (never a traceback): a
    ValueError's own message, what to lower when out of memory, else the error's type."""
    if isinstance(error, (ValueError, gr.Error, RunTimeLimitExceeded)):
        return str(error) or type(error).__name__
    if is_out_of_memory(error):
        return ("out of memory during this run: lower max_new_tokens or max_denoising_steps, or shorten the prompt "
                "(the run's memory has been freed; the server is fine)")
    detail = " ".join(str(error).split())
    return f"the engine failed ({type(error).__name__}{': ' + detail if detail else ''}); the server log has details"


def user_error(error: BaseException | str, *, prefix: str = "") -> gr.Error:
    """The `gr.Error` a handler raises for `error` (a message, or an exception as `describe_error` words it); an
    unexpected exception is logged for the operator."""
    if isinstance(error, BaseException) and not isinstance(error, (ValueError, gr.Error, RunTimeLimitExceeded)):
        LOG.error("request failed: %s: %s", type(error).__name__, error, exc_info=error)
    message = error if isinstance(error, str) else describe_error(error)
    return gr.Error(prefix + message, print_exception=False)


@contextmanager
def refusing() -> Iterator[None]:
    """Any exception raised in the block (bad input, a failing tokenizer) leaves it as `user_error`'s `gr.Error`."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - a clear message either way
        raise user_error(error) from None


async def served(runs: Runner, start: Callable, request):
    """`Runner.served` (an API call's run, stopped when its client goes away), its errors as `gr.Error`."""
    try:
        return await runs.served(start, request)
    except ClientGone as error:
        raise user_error(str(error)) from None


async def api_run(playground, start: Callable[[], RunWorker], request):
    """An endpoint's run to its end (`served`); returns its final snapshot. Raises gr.Error: `start` refused, the
    client went away, or the run failed."""
    snap = await served(playground.runs, start, request)
    if snap.error is not None:
        raise user_error(snap.error)
    return snap


# -- a tab's state and run -----------------------------------------------------------------------------------------
class TabState:
    """A visitor's state in one tab (a `gr.State` value): `worker`, its run in progress, and `stopped`, set by
    Stop (for a tab whose work outlasts one run). A copy is always fresh (nothing crosses sessions)."""

    def __init__(self):
        self.worker: RunWorker | None = None
        self.stopped = threading.Event()

    def __deepcopy__(self, memo):
        return type(self)()

    def stop(self) -> None:
        """Ask the run in progress to stop (it ends within one decoder forward)."""
        self.stopped.set()
        if self.worker is not None:
            self.worker.stop()

    def halt(self) -> None:
        """Stop the run in progress and wait for it to end."""
        if self.worker is not None:
            self.worker.stop()
            self.worker.join(STOP_WAIT_S)


def stop_run(state: TabState | None) -> None:
    """A tab's Stop button: its run ends within one decoder forward."""
    if state is not None:
        state.stop()


def wire_stop(button: gr.Button, state: gr.State) -> None:
    """Wire a tab's Stop `button` to `stop_run` of its `state` (outside the queue)."""
    button.click(stop_run, inputs=[state], outputs=None, concurrency_limit=None, **PRIVATE)


@contextmanager
def live_run(playground, job, key: str | None, state: TabState | None = None, **options) -> Iterator[RunWorker]:
    """`playground.start_job(job, key, **options)` as `state.worker`; on leaving the block (its end, an error, or
    Gradio closing the stream) the run is stopped and unregistered."""
    worker = playground.start_job(job, key, **options)
    if state is not None:
        state.worker = worker
    try:
        yield worker
    finally:
        playground.runs.finish(key, worker)


def buttons(running: bool) -> tuple:
    """(run button, Stop button) updates: Stop on only while a run is `running`."""
    return gr.update(interactive=not running), gr.update(interactive=running)


# -- the refusal box ---------------------------------------------------------------------------------------------
class Refusal:
    """A session's last refusal in one tab (a `gr.State` value); a copy is always empty."""

    def __init__(self):
        self.reason = ""

    def __deepcopy__(self, memo) -> "Refusal":
        return Refusal()


def reason_of(error: Exception) -> str:
    """What the refusal box says of `error`: a `gr.Error`'s message, else `describe_error`'s words."""
    return str(error.message) if isinstance(error, gr.Error) else describe_error(error)


def refusal_html(reason: str) -> str:
    """The box under a tab's buttons: the refusal's reason (escaped), or "" (nothing shown) when there is none."""
    if not reason:
        return ""
    return (f'<div class="dg-refusal" role="alert"><b>Not run:</b> {escape_html(reason)}'
            '<span class="dg-refusal-note"> (this stays until the next run)</span></div>')


def refusal_box(tab: str) -> tuple[gr.HTML, gr.State]:
    """The refusal box of `tab` (an element id part) and its state, created in the current Blocks context."""
    return gr.HTML("", elem_id=f"dg-{tab}-refusal", elem_classes=["dg-refusal-box"]), gr.State(Refusal())


@contextmanager
def noting(refusal: Refusal) -> Iterator[None]:
    """Clear `refusal`, then note in it the reason of an exception the block raises (raised again)."""
    refusal.reason = ""
    try:
        yield
    except Exception as error:
        refusal.reason = reason_of(error)
        raise


def guarded(fn: Callable, width: int) -> Callable:
    """`fn` (a check step returning `width` outputs) taking a `Refusal` first, noted as `noting` does; a pass
    also clears the box (the last output)."""
    def step(refusal: Refusal, *inputs):
        with noting(refusal):
            result = fn(*inputs)
        return "" if width == 0 else (*(result if width > 1 else (result,)), "")

    return step


def checked(triggers: Sequence, check: Callable, *, inputs: list, box: tuple[gr.HTML, gr.State],
            outputs: Sequence = (), refused: Callable | None = None, refused_inputs: Sequence = (),
            refused_outputs: Sequence = (), **options):
    """Wire `triggers` to a tab's check step: `check(*inputs)` returns a value per `outputs` or raises `gr.Error`,
    whose reason `box` (`refusal_box`) shows until a later request passes; `refused` (optional) then also marks
    what the previous run left on the page (`refused_outputs`). Returns the event (`.success`: the run step)."""
    html, state = box
    event = gr.on(list(triggers), guarded(check, len(outputs)), inputs=[state, *inputs], outputs=[*outputs, html],
                  concurrency_limit=None, **{**PRIVATE, **options})
    event.failure(shown_refusal, inputs=[state], outputs=[html], concurrency_limit=None, **PRIVATE)
    if refused is not None:
        event.failure(refused, inputs=list(refused_inputs), outputs=list(refused_outputs), concurrency_limit=None,
                      **PRIVATE)
    return event


def guard_stream(fn: Callable) -> Callable:
    """`fn` (a run step that may itself refuse: a generator or a function) taking a `Refusal` first, its errors
    noted there (`shown_refusal` shows them)."""
    if inspect.isgeneratorfunction(fn):
        def step(refusal: Refusal, *inputs):
            with noting(refusal):
                yield from fn(*inputs)
    else:
        def step(refusal: Refusal, *inputs):
            with noting(refusal):
                return fn(*inputs)
    return step


def shown_refusal(refusal: Refusal) -> str:
    """The refusal box's HTML for the session's last refusal (a failure step's handler)."""
    return refusal_html(refusal.reason)


# -- controls ---------------------------------------------------------------------------------------------------
def setting_control(name: str, value, **options) -> gr.Slider | gr.Checkbox:
    """The control of setting `name` from the settings table: a slider over the UI's range (an excluded low end
    starts one step above it) or a checkbox; label and info from the table unless `options` give them."""
    row = spec(name)
    options = {"label": row.label, "info": row.help, "value": value, **options}
    if row.kind is bool:
        return gr.Checkbox(**options)
    step = row.ui_step or (1 if row.kind is int else 0.01)
    low = row.low if row.low_inclusive else row.low + step
    return gr.Slider(low, row.ui_high if row.ui_high is not None else row.high, step=step, **options)


def empty_plots() -> tuple:
    """The three plots of a live view before a run: confidence heatmap, unmasking order, entropy and acceptance."""
    return plots.confidence_heatmap([]), plots.unmasking_order(None), plots.entropy_and_acceptance([])


def live_plots(tab: str) -> tuple[gr.Plot, gr.Plot, gr.Plot]:
    """`tab`'s three plots, empty, the heatmap above the other two, in the current Blocks context."""
    heatmap, order, entropy = empty_plots()
    heatmap = gr.Plot(heatmap, show_label=False, elem_id=f"dg-{tab}-heatmap")
    with gr.Row():
        order, entropy = (gr.Plot(figure, show_label=False, elem_id=f"dg-{tab}-{name}", min_width=260)
                          for name, figure in (("order", order), ("entropy", entropy)))
    return heatmap, order, entropy


# -- pacing ------------------------------------------------------------------------------------------------------
class PlotClock:
    """When the live plots are due: at most every `PLOT_INTERVAL_S`, stretched for a heatmap of more than
    `PLOT_CELLS` `cells` (positions x steps), and at once when a new block starts. `wait_first`: hold the first plots
    back for an interval."""

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


# -- API endpoints ------------------------------------------------------------------------------------------------
Param = tuple[str, type, object]  # (name, type, default)


def setting_params(defaults: DiffusionSettings, names: Sequence[str] = API_SETTINGS) -> list[Param]:
    """The endpoint parameters of the settings `names` (the settings table's order), defaulting to `defaults`."""
    return [(name, spec(name).kind, getattr(defaults, name)) for name in names]


def register_api(name: str, handler: Callable, params: Sequence[Param], returns, doc: str, *,
                 served: bool = False) -> None:
    """Register `/name` in the current Blocks context: `handler(**arguments, request=...)` behind a signature of
    `params` (default `inspect.Parameter.empty`: required) returning `returns`; `served`: `handler` is async."""
    parameters = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=kind)
                  for p, kind, default in params]
    parameters.append(inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                        annotation=gr.Request))
    signature = inspect.Signature(parameters, return_annotation=returns)

    def arguments(args, kwargs) -> dict:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    if served:
        async def endpoint(*args, **kwargs):
            return await handler(**arguments(args, kwargs))
    else:
        def endpoint(*args, **kwargs):
            return handler(**arguments(args, kwargs))
    endpoint.__name__ = endpoint.__qualname__ = f"{name}_api"
    endpoint.__doc__ = doc
    endpoint.__signature__ = signature
    endpoint.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": returns}
    gr.api(endpoint, api_name=name, concurrency_id="engine")

"""The tab skeleton every tab (Playground, Race, Compare, Chat, Infill) fills in.

`user_error` is the one way a refused request or a failed run reaches the visitor; `checked` wires a tab's check
step so that a refusal's reason stays on the page, in the tab's `refusal_box`, until its next run; `register_api`
builds an endpoint whose settings parameters come from the settings table; `PlotClock` paces the live plots.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence

import gradio as gr

from engine import DiffusionSettings
from engine.settings import SETTING_NAMES, spec

from .runs import ClientGone, Runner, RunTimeLimitExceeded, is_out_of_memory
from .text import escape_html

LOG = logging.getLogger(__name__)
# Live plots re-render at most once a second (each Plotly redraw costs the browser ~0.1 s of CPU); the canvas and
# meter follow every frame, up to the live rate (`runs.default_live_rate`); the final render always has everything.
PLOT_INTERVAL_S = 1.0
API_SETTINGS = SETTING_NAMES  # the settings every endpoint takes, in the settings table's order
PRIVATE = dict(api_visibility="private", show_progress="hidden")


def describe_error(error: BaseException) -> str:
    """The user-facing message for an error that ended a run or rejected a request (never a traceback).

    Validation errors (ValueError) keep their message; running out of memory says so and what to change; anything
    else names the error type, so an engine failure is recognisable without showing internals. No message invites a
    retry: settings that fail deterministically are refused before the run (`DiffusionEngine.check_settings`).
    """
    if isinstance(error, (ValueError, gr.Error, RunTimeLimitExceeded)):
        return str(error) or type(error).__name__
    if is_out_of_memory(error):
        return ("out of memory during this run: lower max_new_tokens or max_denoising_steps, or shorten the prompt "
                "(the run's memory has been freed; the server is fine)")
    detail = " ".join(str(error).split())
    return f"the engine failed ({type(error).__name__}{': ' + detail if detail else ''}); the server log has details"


def user_error(error: BaseException | str, *, prefix: str = "") -> gr.Error:
    """The `gr.Error` a handler raises for `error` (a message, or an exception as `describe_error` words it), with
    no traceback for the visitor; an unexpected exception (not ValueError, not gr.Error) is logged for the
    operator."""
    if isinstance(error, BaseException) and not isinstance(error, (ValueError, gr.Error, RunTimeLimitExceeded)):
        LOG.error("request failed: %s: %s", type(error).__name__, error, exc_info=error)
    message = error if isinstance(error, str) else describe_error(error)
    return gr.Error(prefix + message, print_exception=False)


async def served(runs: Runner, start: Callable, request):
    """`Runner.served` (an API call's run, stopped when its client goes away), its errors as `gr.Error`."""
    try:
        return await runs.served(start, request)
    except ClientGone as error:
        raise user_error(str(error)) from None


# -- the refusal box ---------------------------------------------------------------------------------------------
class Refusal:
    """A session's last refusal in one tab (a `gr.State` value): the reason its check step gave, read by the
    failure step that shows it. A copy is always empty (nothing crosses sessions)."""

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


def guarded(fn: Callable, width: int) -> Callable:
    """`fn` (a check step: returns `width` outputs, or None when it has none) taking a `Refusal` first: a raised
    `gr.Error` is noted in it and raised again; a pass clears the box (the last output)."""

    def step(refusal: Refusal, *inputs):
        try:
            result = fn(*inputs)
        except Exception as error:
            refusal.reason = reason_of(error)
            raise
        refusal.reason = ""
        if width == 0:
            return ""
        return (*(result if width > 1 else (result,)), "")

    return step


def checked(triggers: Sequence, check: Callable, *, inputs: list, box: tuple[gr.HTML, gr.State],
            outputs: Sequence = (), refused: Callable | None = None, refused_inputs: Sequence = (),
            refused_outputs: Sequence = (), **options):
    """Wire `triggers` to a tab's check step: `check(*inputs)` returns a value per `outputs` or raises `gr.Error`.
    A refusal shows its reason in `box` (`refusal_box`) until a later request passes its checks; `refused`
    (optional) then also marks what the previous run left on the page (`refused_outputs`). Returns the check's
    event, whose `.success` is the tab's run step."""
    html, state = box
    event = gr.on(list(triggers), guarded(check, len(outputs)), inputs=[state, *inputs], outputs=[*outputs, html],
                  concurrency_limit=None, **{**PRIVATE, **options})
    event.failure(lambda refusal: refusal_html(refusal.reason), inputs=[state], outputs=[html],
                  concurrency_limit=None, **PRIVATE)
    if refused is not None:
        event.failure(refused, inputs=list(refused_inputs), outputs=list(refused_outputs), concurrency_limit=None,
                      **PRIVATE)
    return event


def guard_stream(fn: Callable) -> Callable:
    """`fn` (a run step that may itself refuse: a generator or a function) taking a `Refusal` first, which its
    `gr.Error`s are noted in (`shown_refusal` then shows them); returns the step."""

    if inspect.isgeneratorfunction(fn):
        def step(refusal: Refusal, *inputs):
            try:
                refusal.reason = ""
                yield from fn(*inputs)
            except Exception as error:
                refusal.reason = reason_of(error)
                raise
    else:
        def step(refusal: Refusal, *inputs):
            try:
                refusal.reason = ""
                return fn(*inputs)
            except Exception as error:
                refusal.reason = reason_of(error)
                raise
    return step


def shown_refusal(refusal: Refusal) -> str:
    """The refusal box's HTML for the session's last refusal (a failure step's handler)."""
    return refusal_html(refusal.reason)


# -- controls ---------------------------------------------------------------------------------------------------
def setting_control(name: str, value, **options) -> gr.Slider | gr.Checkbox:
    """The control of setting `name` from its row of the settings table: a slider over the UI's range with its
    step (an excluded low end starts one step above it), or a checkbox; label and info from the table unless
    `options` give them."""
    row = spec(name)
    options = {"label": row.label, "info": row.help, "value": value, **options}
    if row.kind is bool:
        return gr.Checkbox(**options)
    step = row.ui_step or (1 if row.kind is int else 0.01)
    low = row.low if row.low_inclusive else row.low + step
    return gr.Slider(low, row.ui_high if row.ui_high is not None else row.high, step=step, **options)


# -- pacing ------------------------------------------------------------------------------------------------------
class PlotClock:
    """When the live plots are due: at most every `PLOT_INTERVAL_S`, and at once when a new block starts.
    `wait_first`: hold the first plots back for an interval (a session's first run leaves the placeholders)."""

    def __init__(self, wait_first: bool = False):
        self.last = time.monotonic() if wait_first else 0.0
        self.block = 0

    def due(self, block_count: int = 0) -> bool:
        now = time.monotonic()
        if now - self.last >= PLOT_INTERVAL_S or block_count > self.block:
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
    """Register `/name` in the current Blocks context: `handler(**arguments, request=...)` behind a signature made
    of `params` (`(name, type, default)`, default `inspect.Parameter.empty` for a required one) and `returns` (the
    return annotation); `served`: `handler` is a coroutine function."""
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

"""Every combination of settings and dtype either runs or is refused up front with one line naming the setting.

A property test over the whole settings space (`engine.settings.RANGES`) on the embedded model, in float32, bfloat16
and float16 on CPU, with one or two denoising steps and one canvas (milliseconds per run); plus the CLI's exit 2
and the API's message for the reported case (`--t-min 0 --t-max 1e-38`).
"""

from __future__ import annotations

import asyncio

import gradio as gr
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from diffgemma_ui.hub import Hub
from diffgemma_ui.playground_tab import PlaygroundTab
from engine import DEFAULT_MODEL, DiffusionEngine, DiffusionSettings, load_model
from engine.cli import main as cli_main
from engine.settings import RANGES

pytestmark = pytest.mark.slow
SETTING_NAMES = {"max_new_tokens", "max_denoising_steps", "entropy_bound", "t_min", "t_max", "stability_threshold",
                 "confidence_threshold", "adaptive_stopping"}


def _value(name: str):
    """Values of one float setting across its whole range, with its edges and tiny values over-represented."""
    low, high, _, _ = RANGES[name]
    return st.one_of(
        st.floats(low, high, allow_nan=False),
        st.sampled_from([low, high, 1e-45, 1e-38, 1e-30, 1e-6, 1e-4, 5e-4, 1e-3, 0.5]),
        st.floats(0.0, 1e-3, allow_nan=False),
    )


@pytest.fixture(scope="module", params=["float32", "bfloat16", "float16"])
def typed_engine(request):
    return DiffusionEngine(load_model(DEFAULT_MODEL, device="cpu", dtype=request.param))


@hypothesis_settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t_min=_value("t_min"), t_max=_value("t_max"), entropy_bound=_value("entropy_bound"),
       confidence_threshold=_value("confidence_threshold"), steps=st.integers(1, 2),
       stability=st.integers(0, 64), adaptive=st.booleans())
def test_every_setting_runs_or_is_refused_naming_it(typed_engine, t_min, t_max, entropy_bound, confidence_threshold,
                                                     steps, stability, adaptive):
    values = dict(max_new_tokens=1, max_denoising_steps=steps, entropy_bound=entropy_bound, t_min=t_min, t_max=t_max,
                  stability_threshold=stability, confidence_threshold=confidence_threshold,
                  adaptive_stopping=adaptive)
    try:
        settings = DiffusionSettings(**values)
        frames = list(typed_engine.frames("In the beginning", settings, raw=True, seed=0))
    except ValueError as error:
        message = str(error)
        assert "\n" not in message and any(name in message for name in SETTING_NAMES), message
        return
    assert frames[-1].done and frames[-1].committed_ids  # it ran to the end
    assert all(c == c for f in frames for c in f.confidence)  # no NaN reached the views


@pytest.mark.parametrize("t_max", ["1e-38"])
def test_cli_refuses_an_overflowing_schedule_with_exit_2_and_one_line(t_max, capsys):
    status = cli_main(["generate", "--prompt", "In the beginning", "--raw", "--seed", "0", "--t-min", "0",
                       "--t-max", t_max])
    stderr = capsys.readouterr().err
    assert status == 2, stderr[-2000:]
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "t_min and t_max" in lines[0], stderr[-2000:]
    assert "Traceback" not in stderr


def test_api_refuses_it_naming_the_setting_and_never_says_try_again(engine):
    tab = PlaygroundTab(Hub(engine))
    with pytest.raises(gr.Error) as refused:
        asyncio.run(tab.generate_api_served("In the beginning", True, 64, 32, 0.5, 0.0, 1e-38, 1, 0.05, True, 0))
    assert "t_min and t_max" in refused.value.message and "try again" not in refused.value.message

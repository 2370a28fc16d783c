"""DiffusionSettings and seeds: defaults, validation at the door, presets."""

import dataclasses
import math
import statistics

import pytest
import torch
from hypothesis import given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

from engine.loading import available_cpus, set_serving_threads
from engine.settings import (PRESET_NAMES, RANGES, SETTING_NAMES, SETTINGS, DiffusionSettings, check_prompt, draw_seed,
                             parse_seed, parse_setting, preset, spec)


def test_defaults_match_transformers_generation_defaults():
    library = DiffusionGemmaGenerationConfig._get_default_generation_params()
    ours = DiffusionSettings.from_generation_config(None)
    assert ours.max_new_tokens == library["max_new_tokens"] == 256
    assert ours.max_denoising_steps == library["max_denoising_steps"] == 48
    assert ours.entropy_bound == library["sampler_config"].entropy_bound == 0.1
    assert (ours.t_min, ours.t_max) == (library["t_min"], library["t_max"]) == (0.4, 0.8)
    assert ours.stability_threshold == 1 and ours.confidence_threshold == 0.005


def test_checkpoint_generation_config_overrides_defaults(engine):
    config = engine.model.generation_config
    assert engine.recommended.max_denoising_steps == config.max_denoising_steps
    assert engine.recommended.entropy_bound == config.sampler_config.entropy_bound


@pytest.mark.parametrize(
    "name,value",
    [("max_new_tokens", 0), ("max_new_tokens", 1.5), ("max_new_tokens", "many"), ("max_denoising_steps", -1),
     ("entropy_bound", 0.0), ("entropy_bound", float("nan")), ("entropy_bound", float("inf")), ("t_min", -0.1),
     ("t_max", 0.0), ("stability_threshold", 65), ("confidence_threshold", 0), ("max_new_tokens", True),
     ("max_denoising_steps", None)],
)
def test_out_of_range_setting_names_itself(name, value):
    with pytest.raises(ValueError, match=name):
        DiffusionSettings(**{name: value})


def test_t_min_must_stay_below_t_max():
    with pytest.raises(ValueError, match="t_min must be below t_max"):
        DiffusionSettings(t_min=0.8, t_max=0.8)


def test_numeric_strings_are_converted():
    s = DiffusionSettings(max_new_tokens="64", entropy_bound=" 0.3 ")
    assert s.max_new_tokens == 64 and isinstance(s.max_new_tokens, int) and s.entropy_bound == 0.3


@hyp_settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(RANGES)),
    value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6), st.text(max_size=5)),
)
def test_any_value_is_accepted_within_range_or_rejected_with_value_error(name, value):
    low, high, low_inclusive, integer = RANGES[name]
    try:
        s = DiffusionSettings(**{name: value}) if name not in ("t_min", "t_max") else None
    except ValueError as error:
        assert name in str(error) or "t_min" in str(error)
        return
    if s is not None:
        got = getattr(s, name)
        assert math.isfinite(got) and (low < got or (low_inclusive and got == low)) and got <= high
        assert isinstance(got, int) if integer else isinstance(got, float)


def test_adaptive_stopping_off_removes_the_stopping_criterion():
    kwargs = DiffusionSettings(adaptive_stopping=False).generate_kwargs()
    assert kwargs["stability_threshold"] is None and kwargs["confidence_threshold"] is None


@pytest.mark.parametrize("seed,expected", [(None, None), ("", None), (0, 0), ("42", 42), (7.0, 7),
                                           (2**63 - 1, 2**63 - 1), (-1, None), ("-1", None), (-1.0, None)])
def test_valid_seeds(seed, expected):
    assert parse_seed(seed) == expected


@pytest.mark.parametrize("seed", [-2, 2**63, 1.5, float("nan"), "abc", True, [1], "7.0", "-1.5"])
def test_invalid_seeds(seed):
    with pytest.raises(ValueError, match="seed"):
        parse_seed(seed)


def test_presets_are_valid_and_differ():
    recommended = DiffusionSettings.from_generation_config(None)
    made = {name: preset(name, recommended) for name in PRESET_NAMES}
    assert made["recommended"] == recommended
    assert made["fast"].entropy_bound > recommended.entropy_bound > made["careful"].entropy_bound
    assert made["fast"].max_denoising_steps < recommended.max_denoising_steps < made["careful"].max_denoising_steps
    with pytest.raises(ValueError, match="unknown preset"):
        preset("turbo", recommended)


def test_careful_takes_visibly_more_forwards_than_recommended(engine):
    """Careful's median decoder forwards per first canvas, over three prompts and seeds 700-702, is at least 1.4x
    the recommended settings' (forwards are counted, not timed: the same seed gives the same forwards)."""
    prompts = (("Tell me what happened after the flood.", False), ("Tell me about the mountains.", False),
               ("The old woman climbed the hill", True))

    def median_forwards(settings) -> float:
        one_canvas = settings.replace(max_new_tokens=engine.canvas_length)
        return statistics.median(forwards for prompt, raw in prompts for seed in (700, 701, 702) for forwards in
                                 engine.generate(prompt, one_canvas, raw=raw, seed=seed).forwards_per_block)

    recommended = median_forwards(engine.recommended)
    assert median_forwards(preset("careful", engine.recommended)) >= 1.4 * recommended


def test_serving_threads_leave_one_cpu_for_the_server_on_cpu():
    before = torch.get_num_threads()
    try:
        assert set_serving_threads(torch.device("cpu")) == max(1, available_cpus() - 1)
        assert set_serving_threads(torch.device("cpu"), 1) == 1 == torch.get_num_threads()
        torch.set_num_threads(2)
        assert set_serving_threads(torch.device("cuda")) == 2  # the GPU default leaves torch's setting alone
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError, match="threads must be a whole number >= 1"):
                set_serving_threads(torch.device("cpu"), bad)
    finally:
        torch.set_num_threads(before)


def test_preset_values_are_tidy_and_tiny_bounds_stay_positive():
    careful = preset("careful", DiffusionSettings(t_min=0.4, t_max=0.8, entropy_bound=0.5))
    assert careful.entropy_bound == 0.125 and (careful.t_min, careful.t_max) == (0.4, 0.8)  # no cooler start
    assert preset("careful", DiffusionSettings(entropy_bound=2e-6)).entropy_bound == pytest.approx(5e-7)


def test_the_table_lists_every_field_in_order_and_its_rows_are_sound():
    assert SETTING_NAMES == tuple(f.name for f in dataclasses.fields(DiffusionSettings)) == tuple(
        s.name for s in SETTINGS)
    defaults = DiffusionSettings()
    for row in SETTINGS:
        assert spec(row.name) is row and row.flag.startswith("--") and row.help and row.label
        assert isinstance(getattr(defaults, row.name), row.kind)
        if row.kind is not bool:
            assert row.low < row.high and (row.ui_high is None or row.ui_high <= row.high) and row.ui_step > 0
    assert spec("max_denoising_steps").flag == "--steps"
    with pytest.raises(ValueError, match="unknown setting"):
        spec("temperature")


@pytest.mark.parametrize("name, value, message", [
    ("max_new_tokens", 1025, "max_new_tokens must be at most 1024 here, got 1025"),
    ("max_denoising_steps", 129, "max_denoising_steps must be at most 128 here"),
    ("entropy_bound", 20.5, "entropy_bound must be at most 20.0 here"),
    ("max_new_tokens", 0, "max_new_tokens must be in [1, 1024], got 0"),
])
def test_ui_ranges_apply_with_ui_only(name, value, message):
    with pytest.raises(ValueError) as info:
        parse_setting(name, value, ui=True)
    assert str(info.value) == message or str(info.value).startswith(message)
    if value > 0:
        assert parse_setting(name, value) == value


def test_parse_setting_converts_and_names_itself():
    assert parse_setting("max_new_tokens", "64") == 64 and type(parse_setting("max_new_tokens", 64.0)) is int
    assert parse_setting("entropy_bound", 1) == 1.0 and type(parse_setting("entropy_bound", 1)) is float
    assert parse_setting("adaptive_stopping", "false") is False and parse_setting("adaptive_stopping", 1) is True
    for value, message in ((None, "missing"), ("x" * 5000, "must be a number"), (10**400, "must be in"),
                           ("1e400", "finite"), (2.5, "integer"), ("maybe", "true or false")):
        name = "adaptive_stopping" if value == "maybe" else "max_denoising_steps"
        with pytest.raises(ValueError) as info:
            parse_setting(name, value)
        assert str(info.value).startswith(name) and message in str(info.value) and len(str(info.value)) < 150


def test_with_values_parses_present_names_over_the_settings():
    base = DiffusionSettings(max_new_tokens=64)
    changed = base.with_values({"max_denoising_steps": "7", "adaptive_stopping": "false"})
    assert changed == base.replace(max_denoising_steps=7, adaptive_stopping=False)
    assert base.with_values({}) == base
    with pytest.raises(ValueError, match="max_new_tokens must be at most 1024 here"):
        base.with_values({"max_new_tokens": 2000}, ui=True)
    with pytest.raises(ValueError, match="t_min must be below t_max"):
        base.with_values({"t_min": 0.9})
    with pytest.raises(ValueError, match="unknown setting"):
        base.with_values({"steps": 3})


def test_one_prompt_limit_and_53_bit_seeds():
    assert check_prompt("x" * 20_000) == "x" * 20_000
    with pytest.raises(ValueError, match="the limit here is 20,000"):
        check_prompt("x" * 20_001)
    assert all(0 <= draw_seed() < 2**53 for _ in range(100))

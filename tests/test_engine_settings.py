"""DiffusionSettings and seeds: defaults, validation at the door, presets."""

import math

import pytest
from hypothesis import given, settings as hyp_settings, strategies as st

from engine.settings import RANGES, DiffusionSettings, PRESET_NAMES, check_seed, preset


def test_defaults_match_transformers_generation_defaults():
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

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


@pytest.mark.parametrize("seed,expected", [(None, None), ("", None), (0, 0), ("42", 42), (7.0, 7), (2**63 - 1, 2**63 - 1)])
def test_valid_seeds(seed, expected):
    assert check_seed(seed) == expected


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, float("nan"), "abc", True, [1]])
def test_invalid_seeds(seed):
    with pytest.raises(ValueError, match="seed"):
        check_seed(seed)


def test_presets_are_valid_and_differ():
    recommended = DiffusionSettings.from_generation_config(None)
    made = {name: preset(name, recommended) for name in PRESET_NAMES}
    assert made["recommended"] == recommended
    assert made["fast"].entropy_bound > recommended.entropy_bound > made["careful"].entropy_bound
    assert made["fast"].max_denoising_steps < recommended.max_denoising_steps < made["careful"].max_denoising_steps
    with pytest.raises(ValueError, match="unknown preset"):
        preset("turbo", recommended)


def test_serving_threads_leave_one_cpu_for_the_server_on_cpu():
    import torch

    from engine.loading import available_cpus, set_serving_threads

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
    assert careful.t_max == 0.6 and careful.entropy_bound == 0.125
    assert preset("careful", DiffusionSettings(entropy_bound=2e-6)).entropy_bound == pytest.approx(5e-7)

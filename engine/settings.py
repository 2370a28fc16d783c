"""Denoising settings: the field's names, the checkpoint's defaults, validation at the door, and presets.

Names and defaults mirror transformers' `DiffusionGemmaGenerationConfig` (and its
`_get_default_generation_params`): max_new_tokens 256, max_denoising_steps 48, entropy_bound 0.1, t_min 0.4,
t_max 0.8, stability_threshold 1, confidence_threshold 0.005. A checkpoint's `generation_config.json` overrides
them (`DiffusionSettings.from_generation_config`). `adaptive_stopping=False` drops the stable-and-confident stopping
criterion, so every canvas runs all `max_denoising_steps` decoder forwards.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass

from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    DiffusionGemmaGenerationConfig,
    EntropyBoundSamplerConfig,
)

MAX_NEW_TOKENS_LIMIT = 4096
MAX_DENOISING_STEPS_LIMIT = 512
MAX_SEED = 2**63 - 1
# Seeds this project draws stay below 2**53, so any client (a browser, JSON in JavaScript) holds them exactly and a
# reported seed typed back in reproduces the run; seeds up to MAX_SEED are still accepted.
DRAWN_SEED_BITS = 53


def draw_seed() -> int:
    """A fresh random seed in [0, 2**53 - 1] (exact as a JavaScript number)."""
    return secrets.randbits(DRAWN_SEED_BITS)

# setting -> (low, high, low inclusive, integer); high is always inclusive
RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "max_new_tokens": (1, MAX_NEW_TOKENS_LIMIT, True, True),
    "max_denoising_steps": (1, MAX_DENOISING_STEPS_LIMIT, True, True),
    "entropy_bound": (0.0, 1000.0, False, False),
    "t_min": (0.0, 10.0, True, False),
    "t_max": (0.0, 10.0, False, False),
    "stability_threshold": (0, 64, True, True),
    "confidence_threshold": (0.0, 100.0, False, False),
}


def check_setting(name: str, value) -> int | float:
    """Return `value` as setting `name`'s type (int or float), or raise `ValueError` naming the setting and its range
    (`RANGES`); a bare value check, without the cross-field rule t_min < t_max."""
    low, high, low_inclusive, integer = RANGES[name]
    opening = "[" if low_inclusive else "("
    span = f"{opening}{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(str(value).strip())
        except ValueError:
            raise ValueError(f"{name} must be a number in {span}, got {value!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number in {span}, got {value!r}")
    if integer:
        if value != int(value):
            raise ValueError(f"{name} must be an integer in {span}, got {value!r}")
        value = int(value)
    else:
        value = float(value)
    if value < low or (value == low and not low_inclusive) or value > high:
        raise ValueError(f"{name} must be in {span}, got {value!r}")
    return value


def check_seed(seed) -> int | None:
    """Validate a seed: None or "" (random) or an integer in [0, 2**63 - 1] (int, integral float, or digit string).

    Raises:
        ValueError: anything else, naming the range.
    """
    if seed is None or (isinstance(seed, str) and not seed.strip()):
        return None
    error = ValueError(f"seed must be an integer in [0, {MAX_SEED}], got {seed!r}")
    if isinstance(seed, float):
        if not math.isfinite(seed) or seed != int(seed):
            raise error
        seed = int(seed)
    elif isinstance(seed, str):
        try:
            seed = int(seed.strip())
        except ValueError:
            raise error from None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise error
    return seed


@dataclass(frozen=True)
class DiffusionSettings:
    """Validated settings of one generation; construct it to validate (raises `ValueError` naming the setting).

    Attributes:
        max_new_tokens: generated tokens at most; rounded up to whole canvases of `canvas_length` tokens.
        max_denoising_steps: decoder forwards per canvas at most.
        entropy_bound: the entropy-bound sampler's budget (nats): per step it accepts the k lowest-entropy positions
            whose entropy sum minus their max stays within it (https://arxiv.org/abs/2505.24857).
        t_min, t_max: linear temperature schedule, t_max at the first step down towards t_min at the last.
        stability_threshold: adaptive stopping needs the argmax canvas unchanged for this many steps.
        confidence_threshold: ...and the mean per-position entropy (nats) below this.
        adaptive_stopping: False runs every canvas for all `max_denoising_steps`.
    """

    max_new_tokens: int = 256
    max_denoising_steps: int = 48
    entropy_bound: float = 0.1
    t_min: float = 0.4
    t_max: float = 0.8
    stability_threshold: int = 1
    confidence_threshold: float = 0.005
    adaptive_stopping: bool = True

    def __post_init__(self):
        for name in RANGES:
            object.__setattr__(self, name, check_setting(name, getattr(self, name)))
        if self.t_min >= self.t_max:
            raise ValueError(f"t_min must be below t_max, got t_min={self.t_min} and t_max={self.t_max}")
        if not isinstance(self.adaptive_stopping, bool):
            raise ValueError(f"adaptive_stopping must be True or False, got {self.adaptive_stopping!r}")

    @classmethod
    def from_generation_config(cls, generation_config: DiffusionGemmaGenerationConfig | None) -> "DiffusionSettings":
        """The checkpoint's recommended settings: its generation config, library defaults for what it leaves unset."""
        values = DiffusionGemmaGenerationConfig._get_default_generation_params()
        if generation_config is not None:
            for key in values:
                if getattr(generation_config, key, None) is not None:
                    values[key] = getattr(generation_config, key)
        sampler = values.pop("sampler_config")
        return cls(entropy_bound=sampler.entropy_bound, **values)

    def replace(self, **changes) -> "DiffusionSettings":
        """A copy with `changes` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def generate_kwargs(self) -> dict:
        """Keyword arguments that make `model.generate()` run with exactly these settings."""
        kwargs = {
            "max_new_tokens": self.max_new_tokens,
            "max_denoising_steps": self.max_denoising_steps,
            "sampler_config": EntropyBoundSamplerConfig(entropy_bound=float(self.entropy_bound)),
            "t_min": float(self.t_min),
            "t_max": float(self.t_max),
            "stability_threshold": self.stability_threshold,
            "confidence_threshold": float(self.confidence_threshold),
        }
        if not self.adaptive_stopping:
            kwargs["stability_threshold"] = None
            kwargs["confidence_threshold"] = None
        return kwargs


PRESET_NAMES = ("recommended", "fast", "careful")


def _tidy(value: float) -> float:
    """`value` to 6 significant digits: 0.6, not 0.6000000000000001, in a slider; never rounds a small value to 0."""
    return float(f"{value:.6g}")


def preset(name: str, recommended: DiffusionSettings) -> DiffusionSettings:
    """Return a named preset relative to the checkpoint's `recommended` settings.

    - "recommended": the checkpoint's generation config as is.
    - "fast": a looser entropy bound (x5) and a third of the steps: more tokens accepted per forward.
    - "careful": a tighter entropy bound (/4) and twice the steps, colder sampling: fewer tokens per forward.

    Raises:
        ValueError: unknown preset name.
    """
    if name == "recommended":
        return recommended
    if name == "fast":
        return recommended.replace(
            entropy_bound=_tidy(min(RANGES["entropy_bound"][1], recommended.entropy_bound * 5)),
            max_denoising_steps=max(4, recommended.max_denoising_steps // 3),
        )
    if name == "careful":
        return recommended.replace(
            entropy_bound=_tidy(recommended.entropy_bound / 4),
            max_denoising_steps=min(MAX_DENOISING_STEPS_LIMIT, recommended.max_denoising_steps * 2),
            t_max=_tidy(max(recommended.t_min + 0.05, recommended.t_max * 0.75)),
        )
    raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESET_NAMES)}")

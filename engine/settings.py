"""The settings table and the one parser of settings, seeds and prompts."""

import dataclasses
import math
import numbers
import secrets
from dataclasses import dataclass

from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    DiffusionGemmaGenerationConfig,
    EntropyBoundSamplerConfig,
)

MAX_NEW_TOKENS_LIMIT = 4096
MAX_DENOISING_STEPS_LIMIT = 512
MAX_SEED = 2**63 - 1
DRAWN_SEED_BITS = 53  # exact in JavaScript
MAX_PROMPT_CHARS = 20_000
SHOWN_CHARS = 40  # an echoed bad value's length


@dataclass(frozen=True)
class SettingSpec:
    """One row of the settings table; `ui_high`: the UI slider's top."""

    name: str
    label: str
    kind: type
    low: float | None
    high: float | None
    low_inclusive: bool
    help: str
    flag: str
    ui_high: float | None = None
    ui_step: float | None = None

    def span(self, ui: bool = False) -> str:
        """The range as text, "[1, 4096]" or "(0.0, 1000.0]" (ui: to `ui_high`)."""
        high = self.ui_high if ui and self.ui_high is not None else self.high
        return f"{'[' if self.low_inclusive else '('}{self.low}, {high}]"

    def parse(self, value, *, ui: bool = False) -> int | float | bool:
        if self.kind is bool:
            return parse_flag(self.name, value)
        span = self.span(ui)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ValueError(f"{self.name} is missing: enter a number in {span}")
        number = parse_number(value)
        if number is None:
            raise ValueError(f"{self.name} must be a number in {span}, got {shown(value)}")
        if isinstance(number, float) and not math.isfinite(number):
            raise ValueError(f"{self.name} must be a finite number in {span}, got {shown(value)}")
        if self.kind is int and number != int(number):
            raise ValueError(f"{self.name} must be an integer in {span}, got {shown(value)}")
        if number < self.low or (number == self.low and not self.low_inclusive) or number > self.high:
            raise ValueError(f"{self.name} must be in {span}, got {shown(value)}")
        if ui and self.ui_high is not None and number > self.ui_high:
            raise ValueError(f"{self.name} must be at most {self.ui_high} here, got {shown(value)}")
        return int(number) if self.kind is int else float(number)


SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec(name="max_new_tokens", label="Max new tokens", kind=int, low=1, high=MAX_NEW_TOKENS_LIMIT,
                low_inclusive=True, help="generated tokens at most, rounded up to whole canvases",
                flag="--max-new-tokens", ui_high=1024, ui_step=1),
    SettingSpec(name="max_denoising_steps", label="Max denoising steps", kind=int, low=1,
                high=MAX_DENOISING_STEPS_LIMIT, low_inclusive=True, help="decoder forwards per canvas, at most",
                flag="--steps", ui_high=128, ui_step=1),
    SettingSpec(name="entropy_bound", label="Entropy bound", kind=float, low=0.0, high=1000.0, low_inclusive=False,
                help="nats: higher accepts more positions per step", flag="--entropy-bound", ui_high=20.0,
                ui_step=0.01),
    SettingSpec(name="t_min", label="t_min", kind=float, low=0.0, high=10.0, low_inclusive=True,
                help="sampling temperature at the last step", flag="--t-min", ui_high=2.0, ui_step=0.01),
    SettingSpec(name="t_max", label="t_max", kind=float, low=0.0, high=10.0, low_inclusive=False,
                help="sampling temperature at the first step (falls linearly to t_min)", flag="--t-max",
                ui_high=2.0, ui_step=0.01),
    SettingSpec(name="stability_threshold", label="Stability threshold", kind=int, low=0, high=64, low_inclusive=True,
                help="steps unchanged: adaptive stopping needs the likeliest canvas stable this long",
                flag="--stability-threshold", ui_high=16, ui_step=1),
    SettingSpec(name="confidence_threshold", label="Confidence threshold", kind=float, low=0.0, high=100.0,
                low_inclusive=False, help="mean entropy, nats: adaptive stopping needs the canvas below it",
                flag="--confidence-threshold", ui_high=2.0, ui_step=0.001),
    SettingSpec(name="adaptive_stopping", label="Adaptive stopping", kind=bool, low=None, high=None,
                low_inclusive=True, help="end a canvas early once its likeliest tokens are stable and confident",
                flag="--adaptive-stopping"),
)
SETTING_NAMES: tuple[str, ...] = tuple(s.name for s in SETTINGS)
_SPECS = {s.name: s for s in SETTINGS}
RANGES: dict[str, tuple[float, float, bool, bool]] = {
    s.name: (s.low, s.high, s.low_inclusive, s.kind is int) for s in SETTINGS if s.kind is not bool}


def spec(name: str) -> SettingSpec:
    try:
        return _SPECS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown setting {shown(name)}; choose one of {', '.join(SETTING_NAMES)}") from None


def shown(value) -> str:
    """`repr(value)` for an error message, cut to `SHOWN_CHARS` characters."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "\u2026"


def parse_number(value) -> int | float | None:
    """A real number or numeric string (not a bool) as an int or float; else None."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value.strip())
            except ValueError:
                pass
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def parse_flag(name: str, value) -> bool:
    """`value` as a bool: True/False, 1/0 or "true"/"false"; else `ValueError`."""
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{name} must be true or false, got {shown(value)}")


def parse_setting(name: str, value, *, ui: bool = False) -> int | float | bool:
    """`value` as setting `name`'s kind in its range (`ui`: the UI's); `ValueError`."""
    return spec(name).parse(value, ui=ui)


def parse_seed(value) -> int | None:
    """A seed in [0, 2**63 - 1], None for a random one (None, "", -1); `ValueError`."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    error = ValueError(f"seed must be an integer in [0, {MAX_SEED}] (or -1 for a random seed), got {shown(value)}")
    number = parse_number(value)
    integral = isinstance(number, int) or isinstance(number, float) and number.is_integer()
    if not integral or isinstance(value, str) and isinstance(number, float) and number != -1:
        raise error  # a seed string is digits, or -1
    number = int(number)
    if number == -1:
        return None
    if not 0 <= number <= MAX_SEED:
        raise error
    return number


def draw_seed() -> int:
    """A fresh random seed in [0, 2**53 - 1]."""
    return secrets.randbits(DRAWN_SEED_BITS)


def check_prompt(prompt) -> str:
    """`prompt` if non-empty text of at most `MAX_PROMPT_CHARS` characters; else `ValueError`."""
    if prompt is None or isinstance(prompt, str) and not prompt.strip():
        raise ValueError("prompt is empty: type something for the model to continue")
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be text, got {type(prompt).__name__}")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"prompt is {len(prompt):,} characters; the limit here is {MAX_PROMPT_CHARS:,}")
    return prompt


@dataclass(frozen=True)
class DiffusionSettings:
    """Validated settings of one generation (`ValueError`); ranges in `SETTINGS`."""

    max_new_tokens: int = 256
    max_denoising_steps: int = 48
    entropy_bound: float = 0.1
    t_min: float = 0.4
    t_max: float = 0.8
    stability_threshold: int = 1
    confidence_threshold: float = 0.005
    adaptive_stopping: bool = True

    def __post_init__(self):
        for name in SETTING_NAMES:
            object.__setattr__(self, name, parse_setting(name, getattr(self, name)))
        if self.t_min >= self.t_max:
            raise ValueError(f"t_min must be below t_max, got t_min={self.t_min} and t_max={self.t_max}")

    @classmethod
    def from_generation_config(cls, generation_config: DiffusionGemmaGenerationConfig | None) -> "DiffusionSettings":
        """The checkpoint's generation config, library defaults where unset."""
        values = DiffusionGemmaGenerationConfig._get_default_generation_params()
        for key in values:
            if getattr(generation_config, key, None) is not None:
                values[key] = getattr(generation_config, key)
        sampler = values.pop("sampler_config")
        return cls(entropy_bound=sampler.entropy_bound, **values)

    def replace(self, **changes) -> "DiffusionSettings":
        return dataclasses.replace(self, **changes)

    def with_values(self, values, *, ui: bool = False) -> "DiffusionSettings":
        """A copy with `values` parsed and applied; `ValueError`."""
        for name in values:
            spec(name)
        return self.replace(**{name: parse_setting(name, values[name], ui=ui)
                               for name in SETTING_NAMES if name in values})

    def temperature_at(self, cur_step: int) -> float:
        """The temperature at remaining step `cur_step` (N at a canvas's first forward, 1 at its last)."""
        return self.t_min + (self.t_max - self.t_min) * cur_step / self.max_denoising_steps

    def generate_kwargs(self) -> dict:
        """`model.generate()` keyword arguments for these settings."""
        adaptive = self.adaptive_stopping
        return {
            "max_new_tokens": self.max_new_tokens, "max_denoising_steps": self.max_denoising_steps,
            "sampler_config": EntropyBoundSamplerConfig(entropy_bound=self.entropy_bound),
            "t_min": self.t_min, "t_max": self.t_max,
            "stability_threshold": self.stability_threshold if adaptive else None,
            "confidence_threshold": self.confidence_threshold if adaptive else None,
        }


PRESET_NAMES = ("recommended", "fast", "careful")


def _tidy(value: float) -> float:
    return float(f"{value:.6g}")


def preset(name: str, recommended: DiffusionSettings) -> DiffusionSettings:
    """The named preset over `recommended`; `ValueError` for another name."""
    if name == "recommended":
        return recommended
    if name == "fast":
        return recommended.replace(entropy_bound=_tidy(min(RANGES["entropy_bound"][1], recommended.entropy_bound * 5)),
                                   max_denoising_steps=max(4, recommended.max_denoising_steps // 3))
    if name == "careful":
        steps = min(MAX_DENOISING_STEPS_LIMIT, recommended.max_denoising_steps * 2)
        return recommended.replace(entropy_bound=_tidy(recommended.entropy_bound / 4), max_denoising_steps=steps)
    raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESET_NAMES)}")

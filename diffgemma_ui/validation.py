"""Checking what arrives from the browser or the API before anything runs.

Everything here raises `ValueError` with a message meant for the user (the UI turns it into `gr.Error`). Settings
themselves are validated by `engine.DiffusionSettings`; this module adds what only the UI knows: its own limits,
booleans that must really be booleans, the seed convention (-1 or empty = random), and the prompt checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine import PRESET_NAMES, DiffusionSettings, check_seed, preset
from engine.engine import check_prompt as engine_check_prompt
from engine.settings import MAX_SEED, RANGES

MAX_PROMPT_CHARS = 20_000
# The adaptive stopping checkbox's hint (Playground and Compare): StableAndConfidentStoppingCriteria looks at the
# argmax canvas, not at what the entropy bound accepted, so a confident canvas ends early at any entropy bound
ADAPTIVE_STOPPING_INFO = ("end a canvas early once its likeliest tokens are stable and confident, however few the "
                          "entropy bound accepted")
# The live UI keeps every frame of a run for its plots; these bounds keep that (and a shared queue) reasonable.
UI_MAX_NEW_TOKENS = 1024
UI_MAX_DENOISING_STEPS = 128
# the entropy-bound sliders' top (nats, summed over the positions a step accepts): room for the fast preset's x5 of
# the embedded model's recommended 2.0
UI_MAX_ENTROPY_BOUND = 20.0
SETTING_NAMES = (
    "max_new_tokens", "max_denoising_steps", "entropy_bound", "t_min", "t_max", "stability_threshold",
    "confidence_threshold",
)
# What a preset sets: how the model denoises, never how long the answer is (max_new_tokens stays the user's)
PRESET_FIELDS = (*SETTING_NAMES[1:], "adaptive_stopping")
CUSTOM_PRESET = "custom"  # what the preset box shows once a setting is changed by hand


SHOWN_CHARS = 40  # an echoed bad value is cut to this many characters: the message stays one readable line


def shown(value) -> str:
    """`repr(value)` for an error message, cut to `SHOWN_CHARS` characters (a request may carry megabytes)."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "\u2026"


@dataclass(frozen=True)
class RunRequest:
    """A validated request: prompt text, `raw` (no chat template), settings, seed (None = draw one), `thinking`
    (let a checkpoint whose chat template has a thinking mode think first; the engine checks it applies)."""

    prompt: str
    raw: bool
    settings: DiffusionSettings
    seed: int | None
    thinking: bool = False


def check_prompt(prompt) -> str:
    """The engine's prompt check (`engine.engine.check_prompt`) with the UI's tighter `MAX_PROMPT_CHARS` limit."""
    return engine_check_prompt(prompt, MAX_PROMPT_CHARS)


def check_flag(name: str, value) -> bool:
    """`value` as a bool: True/False (or 1/0, "true"/"false"); anything else raises ValueError naming `name`."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{name} must be true or false, got {shown(value)}")


def check_ui_seed(seed) -> int | None:
    """The UI's seed convention: -1, None or "" mean a random seed (None); otherwise `engine.check_seed`.

    Raises:
        ValueError: NaN, infinities, fractions, negative values other than -1, or above 2**63 - 1.
    """
    if seed is None or (isinstance(seed, str) and not seed.strip()):
        return None
    if isinstance(seed, bool):
        raise ValueError(f"seed must be an integer (-1 for random), got {shown(seed)}")
    try:
        if float(str(seed).strip() if isinstance(seed, str) else seed) == -1:
            return None
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer too large for a float
        pass
    try:
        return check_seed(seed)
    except ValueError:
        raise ValueError(f"seed must be an integer in [0, {MAX_SEED}] (or -1 for a random seed), got {shown(seed)}") from None


def _number(name: str, value):
    """Reject missing and non-numeric values early with the setting's name (the engine checks ranges)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{name} is missing: enter a number")
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {shown(value)}")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"{name} must be a number, got {shown(value)}") from None
    if not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if abs(value) > 2**53:  # beyond any range here (and an int maybe beyond a float's): say so briefly
        low, high, low_inclusive, _ = RANGES[name]
        raise ValueError(f"{name} must be in {'[' if low_inclusive else '('}{low}, {high}], got {shown(value)}")
    if isinstance(value, float) and value.is_integer() and name in ("max_new_tokens", "max_denoising_steps",
                                                                     "stability_threshold"):
        value = int(value)
    return value


def build_settings(values: dict, *, ui_limits: bool = True) -> DiffusionSettings:
    """`DiffusionSettings` from raw values keyed by setting name (plus `adaptive_stopping`).

    Args:
        values: the seven numeric settings of `SETTING_NAMES` and `adaptive_stopping`.
        ui_limits: also enforce the live UI's caps (`UI_MAX_NEW_TOKENS`, `UI_MAX_DENOISING_STEPS`).

    Raises:
        ValueError: missing, non-numeric, NaN/inf, out-of-range values, or t_min >= t_max (engine messages).
    """
    numbers = {name: _number(name, values.get(name)) for name in SETTING_NAMES}
    adaptive = check_flag("adaptive_stopping", values.get("adaptive_stopping", True))
    settings = DiffusionSettings(adaptive_stopping=adaptive, **numbers)
    if ui_limits:
        if settings.max_new_tokens > UI_MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens must be at most {UI_MAX_NEW_TOKENS} here, got {settings.max_new_tokens}")
        if settings.max_denoising_steps > UI_MAX_DENOISING_STEPS:
            raise ValueError(
                f"max_denoising_steps must be at most {UI_MAX_DENOISING_STEPS} here, got {settings.max_denoising_steps}"
            )
    return settings


def build_request(prompt, raw, values: dict, seed, *, ui_limits: bool = True, thinking=False) -> RunRequest:
    """Validate everything a run needs; raises ValueError with the first problem found (prompt first)."""
    return RunRequest(
        prompt=check_prompt(prompt),
        raw=check_flag("raw", raw),
        settings=build_settings(values, ui_limits=ui_limits),
        seed=check_ui_seed(seed),
        thinking=check_flag("thinking", thinking),
    )


def preset_values(name, recommended: DiffusionSettings) -> dict:
    """The values of `PRESET_FIELDS` for preset `name` (see `engine.preset`); raises ValueError for an unknown
    name."""
    if name not in PRESET_NAMES:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESET_NAMES)}")
    settings = preset(name, recommended)
    return {field: getattr(settings, field) for field in PRESET_FIELDS}

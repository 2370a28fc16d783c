"""The UI's request (`RunRequest`) and presets, checked with the settings table's parsers (`ValueError`)."""

from dataclasses import dataclass

from engine import DiffusionSettings, preset
from engine.settings import MAX_PROMPT_CHARS, check_prompt, parse_flag, parse_seed, spec
from engine.settings import SETTING_NAMES as ALL_SETTING_NAMES

__all__ = ["MAX_PROMPT_CHARS", "check_prompt"]
SETTING_NAMES = tuple(name for name in ALL_SETTING_NAMES if spec(name).kind is not bool)
PRESET_FIELDS = (*SETTING_NAMES[1:], "adaptive_stopping")  # all but max_new_tokens, the user's
CUSTOM_PRESET = "custom"  # the preset box once a setting is changed by hand


@dataclass(frozen=True)
class RunRequest:
    """A checked request: prompt, `raw` (no chat template), settings, seed (None: draw one), `thinking`."""

    prompt: str
    raw: bool
    settings: DiffusionSettings
    seed: int | None
    thinking: bool = False


def build_settings(values: dict, *, ui_limits: bool = True) -> DiffusionSettings:
    """`DiffusionSettings` from raw values by name (`ui_limits`: the UI's ranges); ValueError for a bad value."""
    values = {**{name: values.get(name) for name in SETTING_NAMES},
              "adaptive_stopping": values.get("adaptive_stopping", True)}
    return DiffusionSettings().with_values(values, ui=ui_limits)


def build_request(prompt, raw, values: dict, seed, *, ui_limits: bool = True, thinking=False) -> RunRequest:
    """Everything a run needs, checked; ValueError with the first problem (prompt first)."""
    return RunRequest(prompt=check_prompt(prompt), raw=parse_flag("raw", raw),
                      settings=build_settings(values, ui_limits=ui_limits), seed=parse_seed(seed),
                      thinking=parse_flag("thinking", thinking))


def preset_values(name, recommended: DiffusionSettings, **changes) -> dict:
    """The `PRESET_FIELDS` values of preset `name`, then `changes`; ValueError for an unknown name."""
    settings = preset(name, recommended)
    return {**{field: getattr(settings, field) for field in PRESET_FIELDS}, **changes}

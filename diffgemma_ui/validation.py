"""The UI's request (`RunRequest`) and presets, checked with the settings table's parsers (`ValueError`)."""

from dataclasses import dataclass, replace

from engine import DiffusionSettings, preset
from engine.settings import MAX_PROMPT_CHARS, SETTING_NAMES, check_prompt, parse_flag, parse_seed, spec

__all__ = ["MAX_PROMPT_CHARS", "check_prompt"]
DENOISING_SETTINGS = tuple(name for name in SETTING_NAMES if name != "max_new_tokens")  # how, not how long
PRESET_FIELDS = DENOISING_SETTINGS  # a preset never sets the answer's length
CUSTOM_PRESET = "custom"  # the preset box once a setting is changed by hand


@dataclass(frozen=True)
class RunRequest:
    """A checked request: prompt, `raw` (no chat template), settings, seed (None: draw one), `thinking`, and the
    prompt's token ids once the door has encoded it (None before)."""

    prompt: str
    raw: bool
    settings: DiffusionSettings
    seed: int | None
    thinking: bool = False
    prompt_ids: tuple[int, ...] | None = None

    def with_prompt_ids(self, ids) -> "RunRequest":
        """This request with its encoded prompt (`ids`: a [1, n] tensor or a sequence of ints)."""
        rows = ids.tolist() if hasattr(ids, "tolist") else ids
        return replace(self, prompt_ids=tuple(int(i) for i in (rows[0] if rows and isinstance(rows[0], list)
                                                                 else rows)))


def build_settings(values: dict, *, ui_limits: bool = True) -> DiffusionSettings:
    """`DiffusionSettings` from raw values by name (other keys ignored; `ui_limits`: the UI's ranges; a flag left
    out: its default); ValueError for a bad value."""
    defaults = DiffusionSettings()
    return defaults.with_values({name: values.get(name) if spec(name).kind is not bool
                                 else values.get(name, getattr(defaults, name)) for name in SETTING_NAMES},
                                ui=ui_limits)


def build_request(prompt, raw, values: dict, seed, *, ui_limits: bool = True, thinking=False) -> RunRequest:
    """Everything a run needs, checked; ValueError with the first problem (prompt first)."""
    return RunRequest(prompt=check_prompt(prompt), raw=parse_flag("raw", raw),
                      settings=build_settings(values, ui_limits=ui_limits), seed=parse_seed(seed),
                      thinking=parse_flag("thinking", thinking))


def parse_run(values: dict, *, ui_limits: bool = True) -> RunRequest:
    """`build_request` of a run's raw inputs by name: "prompt", "raw", the settings, "seed", "thinking" (optional)."""
    return build_request(values["prompt"], values["raw"], values, values["seed"], ui_limits=ui_limits,
                         thinking=values.get("thinking", False))


def preset_values(name, recommended: DiffusionSettings, **changes) -> dict:
    """The `PRESET_FIELDS` values of preset `name`, then `changes`; ValueError for an unknown name."""
    settings = preset(name, recommended)
    return {**{field: getattr(settings, field) for field in PRESET_FIELDS}, **changes}

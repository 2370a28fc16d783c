"""DiffusionGemma engine (no UI code): loading, block diffusion as one `Frame` per forward, settings."""

from .engine import DiffusionEngine, GenerationResult
from .frames import Frame
from .loading import DEFAULT_MODEL, LoadedModel, ModelLoadError, load_model
from .settings import PRESET_NAMES, SETTINGS, DiffusionSettings, parse_seed, parse_setting, preset

__all__ = [
    "DEFAULT_MODEL", "DiffusionEngine", "DiffusionSettings", "Frame", "GenerationResult", "LoadedModel",
    "ModelLoadError", "PRESET_NAMES", "SETTINGS", "parse_seed", "parse_setting", "load_model", "preset",
]

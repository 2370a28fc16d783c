"""DiffusionGemma engine: model loading, step-by-step block diffusion yielding frames, settings, benchmarks.

No UI code lives here. Typical use:

    from engine import DiffusionEngine, load_model
    engine = DiffusionEngine(load_model())            # the embedded diffgemma-tiny model
    for frame in engine.frames("In the beginning", seed=0):
        print(frame.block_index, frame.step_index, sum(frame.accepted))
"""

from .engine import DiffusionEngine, GenerationResult
from .frames import Frame
from .loading import DEFAULT_MODEL, LoadedModel, ModelLoadError, load_model
from .settings import PRESET_NAMES, SETTINGS, DiffusionSettings, parse_seed, parse_setting, preset

__all__ = [
    "DEFAULT_MODEL",
    "DiffusionEngine",
    "DiffusionSettings",
    "Frame",
    "GenerationResult",
    "LoadedModel",
    "ModelLoadError",
    "PRESET_NAMES",
    "SETTINGS",
    "parse_seed",
    "parse_setting",
    "load_model",
    "preset",
]

"""Settings that pass their range checks but overflow the sampler's arithmetic (a temperature schedule too low for
the softcapped logits in float32 or in the embeddings' dtype): refused before any work.
"""

from __future__ import annotations

import torch

from .settings import DiffusionSettings

# Headroom for rounding: the limits below are kept with a factor of 2 to spare.
SAFETY = 2.0
# A model without a logit softcap: logits are assumed to stay within this bound (not measured; no published
# DiffusionGemma checkpoint lacks the softcap).
UNCAPPED_LOGIT_BOUND = 1.0e4


def temperature_at(settings: DiffusionSettings, cur_step: int) -> float:
    """The schedule's temperature at remaining step `cur_step` (N at the first forward of a canvas, 1 at the last)."""
    return settings.t_min + (settings.t_max - settings.t_min) * cur_step / settings.max_denoising_steps


def lowest_safe_temperature(logit_cap: float, dtype: torch.dtype) -> float:
    """The smallest temperature `T` for which `logit_cap / T` (times `SAFETY`) is finite in `dtype`."""
    return SAFETY * logit_cap / float(torch.finfo(dtype).max)


def check_temperature_schedule(settings: DiffusionSettings, *, logit_cap: float | None,
                               feedback_dtype: torch.dtype) -> None:
    """Refuse a temperature schedule whose scaled logits would overflow (see the module docstring).

    Args:
        settings: validated settings (t_min, t_max, max_denoising_steps are used).
        logit_cap: the model's `final_logit_softcapping` (None: no cap; `UNCAPPED_LOGIT_BOUND` is assumed).
        feedback_dtype: the dtype the self-conditioning logits are cast to (the decoder embeddings' dtype).

    Raises:
        ValueError: one line naming t_min and t_max, the temperature reached, the limit and what to change.
    """
    cap = float(logit_cap) if logit_cap else UNCAPPED_LOGIT_BOUND
    n = settings.max_denoising_steps
    lowest = temperature_at(settings, 1)
    sampler_floor = lowest_safe_temperature(2 * cap, torch.float32)
    if lowest < sampler_floor:
        raise ValueError(
            f"t_min and t_max: the temperature schedule falls to {lowest:.3g} at the last of {n} steps "
            f"(t_min + (t_max - t_min) / max_denoising_steps), below {sampler_floor:.3g}, where the scaled logits "
            "overflow float32: raise t_min or t_max")
    if n < 2:
        return
    fed_back = temperature_at(settings, 2)  # the lowest temperature of a step whose logits are fed back
    feedback_floor = lowest_safe_temperature(cap, feedback_dtype)
    if fed_back < feedback_floor:
        name = str(feedback_dtype).removeprefix("torch.")
        raise ValueError(
            f"t_min and t_max: the temperature schedule falls to {fed_back:.3g} at step {n - 1} of {n}, below "
            f"{feedback_floor:.3g}, where the logits fed back to the next step overflow this model's {name}: "
            "raise t_min or t_max")

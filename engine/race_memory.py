"""Does a separate autoregressive checkpoint fit next to the loaded diffusion model? Checked before loading it.

The autoregressive model's weights are sized on the meta device (its config only, no weights read); the diffusion
model's from its loaded tensors. Free memory is the GPU's (`torch.cuda.mem_get_info`) or the host's available RAM.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import torch
from accelerate import init_empty_weights
from transformers import AutoConfig, AutoModelForCausalLM

from .autoregressive import AutoregressiveDecoder
from .loading import ModelLoadError
from .memory import model_bytes
from .race import RaceRunner

HEADROOM = 1.15  # KV cache, activations and the allocator's slack on top of the weights


def causal_lm_bytes(model_id: str, dtype: torch.dtype) -> int:
    """Bytes the weights of causal LM `model_id` take in `dtype`, from its config alone (built on the meta device).

    Raises:
        ModelLoadError: no readable config.
    """
    local = Path(str(model_id)).expanduser()
    try:
        config = AutoConfig.from_pretrained(str(local) if local.exists() else model_id, trust_remote_code=False,
                                            local_files_only=local.exists())
        with init_empty_weights():
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception as error:  # noqa: BLE001 - one clear message
        raise ModelLoadError(f"cannot read the autoregressive model {model_id!r}: {type(error).__name__}: "
                             f"{' '.join(str(error).split())}") from error
    parameters = {id(p): p.numel() for p in model.parameters()}
    return sum(parameters.values()) * torch.empty((), dtype=dtype).element_size()


def free_bytes(device: torch.device) -> int:
    """Free memory where models go: the CUDA device's free memory, else the host's available RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device.index or 0)[0]
    return psutil.virtual_memory().available


def check_fit(engine, ar_model: str, dtype: torch.dtype, free: int | None = None) -> int:
    """Refuse `ar_model` when it does not fit next to `engine`'s loaded diffusion model; returns its bytes.

    Args:
        free: free bytes (default: `free_bytes(engine.device)`, measured now).

    Raises:
        ModelLoadError: one line saying how much memory each model needs and how much is free.
    """
    needed = causal_lm_bytes(ar_model, dtype)
    free = free_bytes(engine.device) if free is None else free
    if needed * HEADROOM > free:
        gib = 2**30
        raise ModelLoadError(
            f"the autoregressive model {ar_model} needs about {needed / gib:.1f} GiB "
            f"({str(dtype).removeprefix('torch.')} weights, plus {HEADROOM - 1:.0%} for its cache) next to the "
            "diffusion model's "
            f"{model_bytes(engine.model) / gib:.1f} GiB, but {engine.device} has {free / gib:.1f} GiB free: "
            "run without --ar-model to race against the diffusion model's own causal encoder")
    return needed


def race_runner(engine, ar_model: str):
    """A `RaceRunner` whose autoregressive side is the separate causal LM `ar_model`, loaded next to `engine` in the
    diffusion model's dtype once `check_fit` allows it.

    Raises:
        ModelLoadError: it does not fit (one line with both models' needs) or does not load.
    """
    dtype = engine.model.dtype
    check_fit(engine, ar_model, dtype)
    return RaceRunner(engine, AutoregressiveDecoder.load(ar_model, engine.device, dtype))

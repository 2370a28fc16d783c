"""Memory report: bytes of every parameter and buffer of a DiffusionGemma model, by group, without running it.

    python -m engine memory --model M [--quantization none|4bit|8bit|fp8] [--dtype auto|bfloat16|...] [--json]

`M` may be a full checkpoint or a folder with only `config.json`: the model is built on the meta device (no memory
for weights, about a second for the 26B config), and quantized sizes come from `quantized_nbytes` (4bit, 8bit) or
from transformers' own FP8 conversion run on the meta model (`engine.fp8.convert_to_fp8`, about 20 s for the 26B
config); tests check both against the tensors of models quantized for real.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .quantization import (
    QUANTIZATIONS, quant_state_tensors, quantization_targets, quantized_nbytes, quantized_parameters,
    share_tied_modules,
)

GROUPS = ("experts", "attention", "embeddings", "vision_tower", "other")


def group_of(name: str) -> str:
    """The report group of a parameter or buffer named `name` (as `named_parameters()` spells it)."""
    if ".vision_tower." in f".{name}" or ".embed_vision." in f".{name}":
        return "vision_tower"
    if ".experts." in name:
        return "experts"
    if ".self_attn." in name:
        return "attention"
    if "embed_tokens" in name or name.startswith("lm_head"):
        return "embeddings"
    return "other"


def memory_report(model: nn.Module, quantization: str = "none") -> dict:
    """Bytes of `model`'s tensors: `{"total_bytes": N, "groups": {group: N}}` (groups of `GROUPS`).

    Counts each parameter, buffer and quantization-state tensor (bitsandbytes block scales and code tables) once,
    as stored: a tied or shared tensor counts once, a quantized one by its packed bytes. With `quantization` other
    than `none`, parameters that `quantize_model` would quantize and that are not quantized yet (e.g. on the meta
    device) count as `quantized_nbytes` says; this shares the tied modules of `model` (`share_tied_modules`). With
    `fp8`, a model on the meta device that is not converted yet is converted in place (`convert_to_fp8`), and its
    FP8 tensors and scales count as allocated.

    Raises:
        ValueError: unknown `quantization`; `fp8` for an unconverted model outside the meta device.
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    planned = set()
    if quantization == "fp8":
        from .fp8 import convert_to_fp8, fp8_modules  # noqa: PLC0415

        if not fp8_modules(model):
            if any(p.device.type != "meta" for p in model.parameters()):
                raise ValueError("the fp8 report converts the model: build it on the meta device (meta_model)")
            convert_to_fp8(model, "meta")
    elif quantization != "none":
        share_tied_modules(model)
        planned = {id(t.module._parameters[t.param]) for t in quantization_targets(model) if t.param in t.module._parameters}
    groups = dict.fromkeys(GROUPS, 0)
    seen = set()

    def add(name: str, tensor: torch.Tensor, nbytes: int | None = None) -> None:
        if id(tensor) in seen:
            return
        seen.add(id(tensor))
        groups[group_of(name)] += tensor.numel() * tensor.element_size() if nbytes is None else nbytes

    for name, param in model.named_parameters():
        add(name, param, quantized_nbytes(param.numel(), quantization) if id(param) in planned else None)
    for name, buffer in model.named_buffers():
        add(name, buffer)
    for name, _, state in quantized_parameters(model):
        for tensor in quant_state_tensors(state):
            add(name, tensor)
    return {"total_bytes": sum(groups.values()), "groups": groups}


def meta_model(model: str | Path, dtype: torch.dtype = torch.bfloat16):
    """`DiffusionGemmaForBlockDiffusion` of the config in `model` (a folder, or a hub id), on the meta device.

    Raises:
        ModelLoadError: no readable config, or not a DiffusionGemma config.
    """
    from transformers import DiffusionGemmaForBlockDiffusion  # noqa: PLC0415

    from .loading import read_config  # noqa: PLC0415

    config = read_config(model)
    with torch.device("meta"):
        return DiffusionGemmaForBlockDiffusion._from_config(config, dtype=dtype)


def format_report(report: dict, title: str) -> str:
    """The report as an aligned table in GB (10^9 bytes) and bytes."""
    lines = [title]
    for group, nbytes in report["groups"].items():
        lines.append(f"  {group:<13} {nbytes / 1e9:9.3f} GB  {nbytes:>15,} bytes")
    lines.append(f"  {'total':<13} {report['total_bytes'] / 1e9:9.3f} GB  {report['total_bytes']:>15,} bytes")
    return "\n".join(lines)


def memory_command(model: str, quantization: str, dtype: str, as_json: bool) -> int:
    """`python -m engine memory`: print the report of `model` (built on the meta device) as a table or one JSON
    object; returns the exit status (2 and one line on stderr for a config that cannot be read)."""
    import json  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from .loading import ModelLoadError  # noqa: PLC0415

    torch_dtype = torch.bfloat16 if dtype == "auto" else getattr(torch, dtype)
    try:
        report = memory_report(meta_model(model, torch_dtype), quantization)
    except ModelLoadError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(report))
    else:
        print(format_report(report, f"{model}: {quantization}, unquantized tensors in {str(torch_dtype).removeprefix('torch.')}"))
    return 0

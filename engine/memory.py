"""Bytes of a model's tensors (`model_bytes`), by group and as each quantization would store them."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from .quantization import (QUANTIZATIONS, convert_to_fp8, fp8_modules, quant_state_tensors, quantization_targets,
                           quantized_nbytes, quantized_parameters, share_tied_modules)

GROUPS = ("experts", "attention", "embeddings", "vision_tower", "other")


def group_of(name: str) -> str:
    if ".vision_tower." in f".{name}" or ".embed_vision." in f".{name}":
        return "vision_tower"
    if ".experts." in name:
        return "experts"
    if ".self_attn." in name:
        return "attention"
    if "embed_tokens" in name or name.startswith("lm_head"):
        return "embeddings"
    return "other"


def stored_tensors(*modules: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter, buffer and quant-state tensor of `modules`, each tensor once."""
    seen = set()
    for module in modules:
        named = [*module.named_parameters(), *module.named_buffers()]
        named += [(name, t) for name, _, state in quantized_parameters(module) for t in quant_state_tensors(state)]
        for name, tensor in named:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                yield name, tensor


def model_bytes(model: nn.Module) -> int:
    """Bytes of a model's tensors as stored (quantized ones packed, shared ones once)."""
    return sum(tensor.numel() * tensor.element_size() for _, tensor in stored_tensors(model))


def memory_report(model: nn.Module, quantization: str = "none") -> dict:
    """`{"total_bytes": N, "groups": {group: N}}` as `quantization` would store `model`; `ValueError`."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    planned = set()
    if quantization == "fp8":
        if not fp8_modules(model):
            if any(p.device.type != "meta" for p in model.parameters()):
                raise ValueError("the fp8 report converts the model: build it on the meta device (meta_model)")
            convert_to_fp8(model, "meta")
    elif quantization != "none":
        share_tied_modules(model)
        planned = {id(t.module._parameters[t.param]) for t in quantization_targets(model)
                   if t.param in t.module._parameters}
    groups = dict.fromkeys(GROUPS, 0)
    for name, tensor in stored_tensors(model):
        nbytes = quantized_nbytes(tensor.numel(), quantization) if id(tensor) in planned else None
        groups[group_of(name)] += tensor.numel() * tensor.element_size() if nbytes is None else nbytes
    return {"total_bytes": sum(groups.values()), "groups": groups}


def format_report(report: dict, title: str) -> str:
    """The report as a table in GB (10^9 bytes) and bytes."""
    rows = [*report["groups"].items(), ("total", report["total_bytes"])]
    return "\n".join([title] + [f"  {group:<13} {nbytes / 1e9:9.3f} GB  {nbytes:>15,} bytes" for group, nbytes in rows])

"""Weight quantization of the whole DiffusionGemma network (fused 3-D experts and tied linears too): `4bit` (NF4)
and `8bit` (blockwise dynamic 8-bit) through bitsandbytes parametrizations, on CUDA and the CPU; `fp8` lives in
engine/fp8.py. What is quantized and why: docs/quantization.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parametrize

QUANTIZATIONS = ("none", "4bit", "8bit", "fp8")
BITSANDBYTES_QUANTIZATIONS = ("4bit", "8bit")  # the choices `quantize_parameter` implements (CUDA and CPU)
EXPERT_PARAMETERS = ("gate_up_proj", "down_proj")
NF4_BLOCKSIZE = 64
BLOCKWISE8_BLOCKSIZE = 256
# Modules never quantized: routing decisions and the tied vocabulary matrix
SKIPPED_SUFFIXES = ("router.proj", "lm_head")


@dataclass(frozen=True)
class Target:
    """One parameter to quantize: `module.<param>`, reached as `name` (the first of its names when shared)."""

    name: str
    module: nn.Module
    param: str


class Blockwise8bitParametrization(nn.Module):
    """Dequantizes a parameter stored as bitsandbytes blockwise 8-bit codes (uint8, same shape as the weight).

    The mirror of `bitsandbytes.nn.parametrize.Bnb4bitParametrization` for `quantize_blockwise`; `quant_state`
    holds the float32 per-block scales (`absmax`) and the 256-entry code table.
    """

    def __init__(self, quant_state):
        super().__init__()
        self.quant_state = quant_state

    @torch.no_grad()
    def forward(self, quantized: torch.Tensor) -> torch.Tensor:
        return bitsandbytes().functional.dequantize_blockwise(quantized, self.quant_state)


def is_experts(module: nn.Module) -> bool:
    """True for a fused mixture-of-experts module (`gate_up_proj` and `down_proj` parameters, quantized or not)."""
    return module.__class__.__name__.endswith("Experts") and all(
        name in module._parameters or parametrize.is_parametrized(module, name) for name in EXPERT_PARAMETERS
    )


def text_layer_pairs(model: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
    """(encoder text layer, decoder layer) pairs of a DiffusionGemma model, in order; [] for another model."""
    inner = getattr(model, "model", model)
    encoder_layers = getattr(getattr(getattr(inner, "encoder", None), "language_model", None), "layers", None)
    decoder_layers = getattr(getattr(inner, "decoder", None), "layers", None)
    if encoder_layers is None or decoder_layers is None:
        return []
    return list(zip(encoder_layers, decoder_layers))


def share_tied_modules(model: nn.Module) -> int:
    """Make each encoder text-layer `nn.Linear` or experts module whose parameters are the decoder's (tied) the very
    same module object as the decoder's, so that quantizing it once serves both. Returns how many were shared.

    Only modules whose every parameter is identical (`is`) to the decoder's counterpart are shared, so an untied
    checkpoint (`tie_word_embeddings: false`) keeps separate modules. Model without encoder/decoder layers: 0.
    """
    shared = 0
    for encoder_layer, decoder_layer in text_layer_pairs(model):
        for path, encoder_module in list(encoder_layer.named_modules()):
            if not path or not (isinstance(encoder_module, nn.Linear) or is_experts(encoder_module)):
                continue
            decoder_module = decoder_layer.get_submodule(path)
            if decoder_module is encoder_module or type(decoder_module) is not type(encoder_module):
                continue
            encoder_params = dict(encoder_module.named_parameters(recurse=False))
            decoder_params = dict(decoder_module.named_parameters(recurse=False))
            if encoder_params.keys() != decoder_params.keys() or any(
                encoder_params[k] is not decoder_params[k] for k in encoder_params
            ):
                continue
            parent_path, _, child = path.rpartition(".")
            setattr(encoder_layer.get_submodule(parent_path) if parent_path else encoder_layer, child, decoder_module)
            shared += 1
    return shared


def quantization_targets(model: nn.Module) -> list[Target]:
    """The parameters `quantize_model` quantizes, each module once (shared modules appear under their first name):
    both tensors of every experts module, and the weight of every `nn.Linear` except the router and the LM head."""
    targets, seen = [], set()
    for name, module in model.named_modules():
        if id(module) in seen:
            continue
        seen.add(id(module))
        if is_experts(module):
            targets += [Target(name, module, param) for param in EXPERT_PARAMETERS]
        elif isinstance(module, nn.Linear) and not name.endswith(SKIPPED_SUFFIXES):
            targets.append(Target(name, module, "weight"))
    return targets


def bitsandbytes():
    """The bitsandbytes package with its `functional` and `nn.parametrize` modules loaded (an optional dependency:
    only 4bit and 8bit need it, so it is imported on first use).

    Raises:
        ImportError: bitsandbytes is not installed or does not load.
    """
    import bitsandbytes.functional  # noqa: PLC0415 - optional heavy dependency
    import bitsandbytes.nn.parametrize  # noqa: PLC0415

    return bitsandbytes


def bitsandbytes_missing() -> str | None:
    """The one line saying that bitsandbytes (which 4bit and 8bit need) cannot be imported, or None when it can."""
    try:
        bitsandbytes()
    except ImportError as error:
        return f"4bit and 8bit quantization need bitsandbytes ({error}): pip install bitsandbytes==0.50.2"
    return None


def quantize_parameter(module: nn.Module, param: str, quantization: str) -> None:
    """Replace `module.<param>` with its `quantization` (`4bit`|`8bit`) form, on the device it is on.

    Reading `module.<param>` afterwards returns the dequantized tensor (original shape and dtype); within one
    forward of `module` it is dequantized once (bitsandbytes' parametrization cache hooks).

    Raises:
        ValueError: unknown `quantization`.
    """
    bnb = bitsandbytes()
    if quantization == "4bit":
        bnb.nn.parametrize.replace_parameter_4bit(module, param, quant_type="nf4", blocksize=NF4_BLOCKSIZE)
        return
    if quantization != "8bit":
        raise ValueError(f"quantization must be 4bit or 8bit, got {quantization!r}")
    original = getattr(module, param)
    codes, state = bnb.functional.quantize_blockwise(original.data, blocksize=BLOCKWISE8_BLOCKSIZE)
    setattr(module, param, nn.Parameter(codes, requires_grad=False))
    del original
    parametrize.register_parametrization(module, param, Blockwise8bitParametrization(state), unsafe=True)
    # bitsandbytes' hooks: dequantize once per forward of `module`, however often the forward reads the parameter
    module.register_forward_pre_hook(bnb.nn.parametrize._enable_parametrization_cache)
    module.register_forward_hook(bnb.nn.parametrize._disable_parametrization_cache, always_call=True)


def quantize_model(model: nn.Module, quantization: str, device: torch.device | str) -> nn.Module:
    """Quantize `model` (loaded on the CPU, e.g. memory-mapped by `from_pretrained(device_map="cpu")`) onto `device`,
    one tensor at a time: each target parameter is copied to `device`, quantized there, and its full-precision copy
    dropped before the next; the remaining parameters and buffers then move as they are. The device therefore never
    holds more than the quantized model plus one full-precision tensor (the largest: one layer's
    `experts.gate_up_proj`, 1.0 GB in bf16 for the 26B model). Returns `model` (changed in place).

    `fp8` has its own path of the same shape, `engine.fp8.convert_to_fp8`.

    Raises:
        ImportError: bitsandbytes is not installed (one line).
        ValueError: `quantization` other than none, 4bit or 8bit.
    """
    if quantization == "none":
        return model.to(device)
    if quantization not in BITSANDBYTES_QUANTIZATIONS:
        raise ValueError(
            f"quantize_model runs none, 4bit or 8bit (fp8: engine.fp8.convert_to_fp8), got {quantization!r}")
    if (missing := bitsandbytes_missing()) is not None:
        raise ImportError(missing)
    device = torch.device(device)
    share_tied_modules(model)
    for target in quantization_targets(model):
        weight = getattr(target.module, target.param)
        setattr(target.module, target.param, nn.Parameter(weight.data.to(device), requires_grad=False))
        del weight
        quantize_parameter(target.module, target.param, quantization)
    return model.to(device)


def quantized_parameters(model: nn.Module) -> Iterator[tuple[str, torch.Tensor, object]]:
    """(qualified name, stored tensor, quant state) of every quantized parameter, each once."""
    seen = set()
    for name, module in model.named_modules():
        if not parametrize.is_parametrized(module) or id(module) in seen:
            continue
        seen.add(id(module))
        for param, plist in module.parametrizations.items():
            state = getattr(plist[0], "quant_state", None)
            yield f"{name}.{param}", plist.original, state


def quant_state_tensors(state) -> list[torch.Tensor]:
    """The tensors a bitsandbytes `QuantState` holds (per-block scales, code table, nested statistics)."""
    if state is None:
        return []
    tensors = [t for t in (state.absmax, state.code) if isinstance(t, torch.Tensor)]
    if getattr(state, "nested", False):
        tensors += quant_state_tensors(state.state2)
        if isinstance(getattr(state, "offset", None), torch.Tensor):
            tensors.append(state.offset)
    return tensors


def quantized_nbytes(numel: int, quantization: str) -> int:
    """Bytes a `numel`-element parameter takes after `quantize_parameter` (packed codes + float32 block scales +
    float32 code table), without running it: what `memory_report` uses on the meta device."""
    if quantization == "4bit":
        return math.ceil(numel / 2) + 4 * math.ceil(numel / NF4_BLOCKSIZE) + 4 * 16
    if quantization == "8bit":
        return numel + 4 * math.ceil(numel / BLOCKWISE8_BLOCKSIZE) + 4 * 256
    raise ValueError(f"quantization must be 4bit or 8bit, got {quantization!r}")

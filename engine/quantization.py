"""Weight quantization of the whole DiffusionGemma network (fused 3-D experts and tied linears too): `4bit` (NF4) and
`8bit` (blockwise) through bitsandbytes parametrizations on CUDA and the CPU, and `fp8` through transformers'
FineGrainedFP8 on CUDA GPUs of compute capability >= 8.9. What is quantized and why: docs/quantization.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parametrize
from transformers import DiffusionGemmaForBlockDiffusion, FineGrainedFP8Config
from transformers.integrations.finegrained_fp8 import FP8Experts, FP8Linear
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer
from transformers.utils import import_utils

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
    """Dequantizes a parameter stored as bitsandbytes blockwise 8-bit codes (the 8-bit mirror of
    `Bnb4bitParametrization`); `quant_state` holds the per-block scales and the code table.
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
    """Make each encoder text-layer linear or experts module whose parameters are the decoder's (tied) the decoder's
    module, so both quantize once; returns how many were shared.
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
    """The parameters `quantize_model` quantizes, each module once: both tensors of every experts module and the
    weight of every `nn.Linear` except the router and the LM head.
    """
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
    """The bitsandbytes package with `functional` and `nn.parametrize` loaded (optional: imported on first use);
    `ImportError` when it does not load.
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
    """Replace `module.<param>` with its `4bit`|`8bit` form on its device; reading it returns the dequantized tensor,
    dequantized once per forward of `module`. `ValueError` for another choice.
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
    """Quantize `model` (on the CPU) onto `device` one tensor at a time (the device never holds more than the
    quantized model and one full-precision tensor); returns it, changed in place. `ImportError` without bitsandbytes,
    `ValueError` for a choice other than none, 4bit or 8bit.
    """
    if quantization == "none":
        return model.to(device)
    if quantization not in BITSANDBYTES_QUANTIZATIONS:
        raise ValueError(
            f"quantize_model runs none, 4bit or 8bit (fp8: convert_to_fp8), got {quantization!r}")
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
    """Bytes a `numel`-element parameter takes after `quantize_parameter` (codes, float32 block scales and code
    table).
    """
    if quantization == "4bit":
        return math.ceil(numel / 2) + 4 * math.ceil(numel / NF4_BLOCKSIZE) + 4 * 16
    if quantization == "8bit":
        return numel + 4 * math.ceil(numel / BLOCKWISE8_BLOCKSIZE) + 4 * 256
    raise ValueError(f"quantization must be 4bit or 8bit, got {quantization!r}")


# -- fp8 -----------------------------------------------------------------------------------------------------------
FP8_BLOCK_SIZE = (64, 64)
FP8_SKIPPED = ["lm_head", "router.proj"]  # the tied vocabulary matrix and the routing decisions stay as they are
FP8_MIN_CAPABILITY = (8, 9)  # Ada (8.9), Hopper (9.0), Blackwell (10.x, 12.x): GPUs with FP8 matmul units


def fp8_config():
    """The `FineGrainedFP8Config` of `fp8`: blocks of `FP8_BLOCK_SIZE`, dynamic activation scales, tied modules
    converted.
    """
    return FineGrainedFP8Config(weight_block_size=FP8_BLOCK_SIZE, modules_to_not_convert=list(FP8_SKIPPED))


def fp8_refusal(device: torch.device) -> str | None:
    """The one line saying why `fp8` cannot run on `device` (needs CUDA capability >= 8.9 and the `kernels` package),
    or None when it can.
    """
    advice = "use --quantization 8bit or 4bit"
    if device.type != "cuda":
        return (f"fp8 quantization needs a CUDA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell: FP8 "
                f"matmul units), not {device.type}: {advice}")
    if not torch.cuda.is_available():
        return ("fp8 quantization needs a CUDA GPU of compute capability 8.9 or newer, and CUDA is not available: "
                f"{advice}")
    capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < FP8_MIN_CAPABILITY:
        return (f"fp8 quantization needs compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
                f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}: {advice}")
    if not import_utils.is_kernels_available():
        return kernels_refusal()
    return None


def kernels_refusal() -> str:
    """The one line for an fp8-capable GPU without the `kernels` package in the range this transformers accepts."""
    low, high = (getattr(import_utils, name, None) for name in ("KERNELS_MIN_VERSION", "KERNELS_MAX_VERSION"))
    wanted = f"kernels>={low},<{high}" if low and high else "the kernels package"
    return (f"fp8 quantization needs {wanted} (what this transformers accepts), and its FP8 matmul kernel is "
            "downloaded from the Hugging Face Hub when the model loads: without both, use --quantization 8bit or 4bit")


def check_fp8_shapes(config) -> None:
    """Refuse (`ValueError`, one line) a model whose expert widths `FP8_BLOCK_SIZE` does not divide: the library
    would leave them in bf16 for kernels that read FP8.
    """
    text = config.get_text_config()
    block_rows, block_cols = FP8_BLOCK_SIZE
    widths = {"hidden_size": text.hidden_size, "moe_intermediate_size": text.moe_intermediate_size}
    bad = {name: width for name, width in widths.items() if width % block_rows or width % block_cols}
    if bad:
        listed = ", ".join(f"{name} {width}" for name, width in bad.items())
        raise ValueError(f"fp8 quantizes blocks of {block_rows}x{block_cols}; this model's {listed} is not a multiple: "
                         "use --quantization 8bit or 4bit")


def _fp8_quantizer():
    return FineGrainedFP8HfQuantizer(fp8_config(), pre_quantized=False)


def fp8_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every `FP8Linear` / `FP8Experts` of `model`, each module once."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, (FP8Linear, FP8Experts))]


def share_fp8_tied_modules(model: nn.Module) -> int:
    """Make each encoder text-layer FP8 module whose FP8 weights are the decoder's the decoder's module, so it uses
    the decoder's scales too; returns how many were shared.
    """
    shared = 0
    for encoder_layer, decoder_layer in text_layer_pairs(model):
        for path, decoder_module in fp8_modules(decoder_layer):
            encoder_module = encoder_layer.get_submodule(path)
            if encoder_module is decoder_module or type(encoder_module) is not type(decoder_module):
                continue
            weights = [n for n, p in decoder_module.named_parameters(recurse=False) if p.dtype == torch.float8_e4m3fn]
            if weights and all(getattr(encoder_module, n) is getattr(decoder_module, n) for n in weights):
                encoder_layer.set_submodule(path, decoder_module)
                shared += 1
    return shared


@torch.no_grad()
def convert_to_fp8(model: nn.Module, device: torch.device | str) -> nn.Module:
    """Convert `model` (on the CPU, or on the meta device for counting) to `fp8` on `device` with the library's own
    quantizer and ops, one tensor at a time (tied tensors once), then share the tied encoder modules; returns `model`
    (changed in place).
    """
    device = torch.device(device)
    quantizer = _fp8_quantizer()
    originals = {name: dict(module.named_parameters(recurse=False))
                 for name, module in model.named_modules(remove_duplicate=False)}
    quantizer.preprocess_model(model)
    quantize = quantizer.get_quantize_ops()
    converted: dict[int, dict[str, nn.Parameter]] = {}  # id(original tensor) -> {parameter name: converted}
    for name, module in model.named_modules(remove_duplicate=False):
        if not isinstance(module, (FP8Linear, FP8Experts)):
            continue
        for param_name, original in originals[name].items():
            if id(original) not in converted:
                if quantizer.param_needs_quantization(model, f"{name}.{param_name}"):
                    out = quantize.convert({param_name: original.data.to(device)})
                else:
                    out = {param_name: original.data.to(device)}
                converted[id(original)] = {key: nn.Parameter(t, requires_grad=False) for key, t in out.items()}
            module._parameters.update(converted[id(original)])
        for param_name, param in module.named_parameters(recurse=False):
            if param.device != device:  # the scale of a tensor kept in the model dtype: allocated, never read
                module._parameters[param_name] = nn.Parameter(
                    torch.zeros(param.shape, dtype=param.dtype, device=device), requires_grad=False)
    share_fp8_tied_modules(model)
    quantizer.postprocess_model(model)
    return model.to(device)


def from_pretrained_fp8(where: str, device: torch.device, dtype: torch.dtype, **common):
    """`from_pretrained` with the `fp8` config, quantized on `device` as it loads, tied encoder modules shared."""
    network = DiffusionGemmaForBlockDiffusion.from_pretrained(
        where, dtype=dtype, device_map={"": device}, quantization_config=fp8_config(), **common)
    share_fp8_tied_modules(network)
    return network

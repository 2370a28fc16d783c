"""`fp8`: FP8 weights through transformers' FineGrainedFP8 integration, on CUDA GPUs of compute capability >= 8.9.

What the library leaves out for DiffusionGemma (tied encoder scales, a block size that divides its widths) and
what this module adds is in docs/quantization.md; `convert_to_fp8` also runs on the meta device, for counting.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DiffusionGemmaForBlockDiffusion, FineGrainedFP8Config
from transformers.integrations.finegrained_fp8 import FP8Experts, FP8Linear
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer
from transformers.utils import import_utils

from .quantization import text_layer_pairs

FP8_BLOCK_SIZE = (64, 64)
FP8_SKIPPED = ["lm_head", "router.proj"]  # the tied vocabulary matrix and the routing decisions stay as they are
FP8_MIN_CAPABILITY = (8, 9)  # Ada (8.9), Hopper (9.0), Blackwell (10.x, 12.x): GPUs with FP8 matmul units


def fp8_config():
    """The `FineGrainedFP8Config` of the `fp8` choice: blocks of `FP8_BLOCK_SIZE`, dynamic activation scales, tied
    modules converted (only `FP8_SKIPPED` kept as they are)."""
    return FineGrainedFP8Config(weight_block_size=FP8_BLOCK_SIZE, modules_to_not_convert=list(FP8_SKIPPED))


def fp8_refusal(device: torch.device) -> str | None:
    """The one line saying why `fp8` cannot run on `device`, or None when it can (a CUDA GPU of compute capability
    >= 8.9 and the `kernels` package, through which transformers fetches its FP8 matmul kernel)."""
    advice = "use --quantization 8bit or 4bit"
    if device.type != "cuda":
        return (f"fp8 quantization needs a CUDA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell: FP8 "
                f"matmul units), not {device.type}: {advice}")
    if not torch.cuda.is_available():
        return f"fp8 quantization needs a CUDA GPU of compute capability 8.9 or newer, and CUDA is not available: {advice}"
    capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < FP8_MIN_CAPABILITY:
        return (f"fp8 quantization needs compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
                f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}: {advice}")
    if not import_utils.is_kernels_available():
        return kernels_refusal()
    return None


def kernels_refusal() -> str:
    """The one line for a CUDA GPU that could run fp8 but lacks the `kernels` package in the version range the
    installed transformers accepts (its FP8 matmul kernel is then fetched from the Hugging Face Hub)."""
    low, high = (getattr(import_utils, name, None) for name in ("KERNELS_MIN_VERSION", "KERNELS_MAX_VERSION"))
    wanted = f"kernels>={low},<{high}" if low and high else "the kernels package"
    return (f"fp8 quantization needs {wanted} (what this transformers accepts), and its FP8 matmul kernel is "
            "downloaded from the Hugging Face Hub when the model loads: without both, use --quantization 8bit or 4bit")


def check_fp8_shapes(config) -> None:
    """Refuse (ValueError, one line) a model whose expert matrices `FP8_BLOCK_SIZE` does not divide: the library
    would leave them in bf16 and its grouped expert kernels would then read bf16 as FP8."""
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
    """Make each encoder text-layer FP8 module whose FP8 weights are the decoder's (tied) the decoder's module, so
    it also uses the decoder's scales (the library leaves the encoder's `*_scale_inv` uninitialised). Returns how
    many were shared; a module whose weights are not the very same tensors is left alone."""
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
    """Convert `model` (already in memory: on the CPU, or on the meta device for counting) to the `fp8` choice on
    `device`, with the library's own steps: the FP8 quantizer's module replacement (`preprocess_model`), then each
    parameter it marks as needing quantization, moved to `device` and passed through its `Fp8Quantize` op (one
    tensor at a time, so `device` holds at most the FP8 model plus one bf16 tensor; tied tensors once); a tensor the
    op leaves as it is (block not dividing it) is kept in the model dtype beside its unused allocated scale, as
    `from_pretrained` leaves it. Then tied encoder modules are shared (`share_fp8_tied_modules`) and the rest of the
    model moves to `device`. Returns `model` (changed in place).
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
    """`DiffusionGemmaForBlockDiffusion.from_pretrained` with the `fp8` config, every tensor placed on `device` and
    quantized there as it loads (the library's on-the-fly path: the GPU never holds the bf16 model), then the tied
    encoder modules shared with the decoder's (`share_fp8_tied_modules`)."""
    network = DiffusionGemmaForBlockDiffusion.from_pretrained(
        where, dtype=dtype, device_map={"": device}, quantization_config=fp8_config(), **common)
    share_fp8_tied_modules(network)
    return network

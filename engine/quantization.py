"""Quantization (`4bit`/`8bit` by bitsandbytes, `fp8` on CUDA >= 8.9) and the bytes a model's tensors take."""

import logging
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
BITSANDBYTES_QUANTIZATIONS = ("4bit", "8bit")
EXPERT_PARAMETERS = ("gate_up_proj", "down_proj")
NF4_BLOCKSIZE = 64
BLOCKWISE8_BLOCKSIZE = 256
SKIPPED_SUFFIXES = ("router.proj", "lm_head")  # kept as they are
FP8_BLOCK_SIZE = (64, 64)
FP8_MIN_CAPABILITY = (8, 9)
OTHER_CHOICES = "use --quantization 8bit or 4bit"
GROUPS = ("experts", "attention", "embeddings", "vision_tower", "other")
BNB_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"
KERNELS_NOTICE = "Failed to load CPU gemm_4bit_forward from kernels-community"  # bitsandbytes' import-time line
CPU_PATHS = {"4bit": "bitsandbytes NF4 (blocks of 64), each weight dequantized per forward by bitsandbytes' own CPU "
                     "code; the fused 4-bit kernel of the `kernels` package is not used",
             "8bit": "bitsandbytes blockwise 8-bit (blocks of 256), each weight dequantized per forward by "
                     "bitsandbytes' own CPU code"}


@dataclass(frozen=True)
class Target:
    """One parameter to quantize, `module.<param>`, under its first name."""

    name: str
    module: nn.Module
    param: str


class Blockwise8bitParametrization(nn.Module):
    """Dequantizes bitsandbytes blockwise 8-bit codes with their `quant_state`."""

    def __init__(self, quant_state):
        super().__init__()
        self.quant_state = quant_state

    @torch.no_grad()
    def forward(self, quantized: torch.Tensor) -> torch.Tensor:
        return bitsandbytes().functional.dequantize_blockwise(quantized, self.quant_state)


def is_experts(module: nn.Module) -> bool:
    """Whether `module` is a fused mixture-of-experts module."""
    return module.__class__.__name__.endswith("Experts") and all(
        name in module._parameters or parametrize.is_parametrized(module, name) for name in EXPERT_PARAMETERS)


def share_tied_modules(model: nn.Module, fp8: bool = False) -> int:
    """Share each encoder text-layer module tied to its decoder twin (`fp8`: FP8 weights); how many."""
    inner = getattr(model, "model", model)
    encoder_layers = getattr(getattr(getattr(inner, "encoder", None), "language_model", None), "layers", None)
    decoder_layers = getattr(getattr(inner, "decoder", None), "layers", None)
    shared = 0
    for encoder_layer, decoder_layer in zip(encoder_layers or [], decoder_layers or []):
        for path, module in [(p, m) for p, m in decoder_layer.named_modules() if p and (
                isinstance(m, (FP8Linear, FP8Experts)) if fp8 else isinstance(m, nn.Linear) or is_experts(m))]:
            twin = encoder_layer.get_submodule(path)
            if twin is not module and type(twin) is type(module) and _tied(twin, module, fp8):
                encoder_layer.set_submodule(path, module)
                shared += 1
    return shared


def _tied(a: nn.Module, b: nn.Module, fp8: bool) -> bool:
    if fp8:
        weights = [n for n, p in b.named_parameters(recurse=False) if p.dtype == torch.float8_e4m3fn]
        return bool(weights) and all(getattr(a, n) is getattr(b, n) for n in weights)
    own_a, own_b = dict(a.named_parameters(recurse=False)), dict(b.named_parameters(recurse=False))
    return own_a.keys() == own_b.keys() and all(own_a[k] is own_b[k] for k in own_a)


def quantization_targets(model: nn.Module) -> list[Target]:
    """What `quantize_model` quantizes, once each: experts and linears but the router and LM head."""
    targets = []
    for name, module in model.named_modules():
        if is_experts(module):
            targets += [Target(name, module, param) for param in EXPERT_PARAMETERS]
        elif isinstance(module, nn.Linear) and not name.endswith(SKIPPED_SUFFIXES):
            targets.append(Target(name, module, "weight"))
    return targets


def _not_kernels_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(KERNELS_NOTICE)


def bitsandbytes():
    """bitsandbytes with `functional` (its package imports it) and `nn.parametrize`, its import-time notice about
    the `kernels` package dropped (its other log records kept); `ImportError`."""
    logging.getLogger(BNB_CPU_LOGGER).addFilter(_not_kernels_notice)
    import bitsandbytes.nn.parametrize  # noqa: PLC0415 - optional, heavy

    return bitsandbytes


def cpu_path(quantization: str, device: torch.device | str) -> str | None:
    """The line saying how `quantization` runs on `device` when that is the CPU, else None."""
    path = CPU_PATHS.get(quantization) if torch.device(device).type == "cpu" else None
    return f"{quantization} on the CPU: {path}" if path else None


def bitsandbytes_missing() -> str | None:
    """Why 4bit and 8bit cannot run, or None."""
    try:
        bitsandbytes()
    except ImportError as error:
        return f"4bit and 8bit quantization need bitsandbytes ({error}): pip install bitsandbytes==0.50.2"
    return None


def quantize_parameter(module: nn.Module, param: str, quantization: str) -> None:
    """Replace `module.<param>` with its `4bit` or `8bit` form, dequantized per forward."""
    bnb = bitsandbytes()
    if quantization == "4bit":
        bnb.nn.parametrize.replace_parameter_4bit(module, param, quant_type="nf4", blocksize=NF4_BLOCKSIZE)
        return
    original = getattr(module, param)
    codes, state = bnb.functional.quantize_blockwise(original.data, blocksize=BLOCKWISE8_BLOCKSIZE)
    setattr(module, param, nn.Parameter(codes, requires_grad=False))
    del original
    parametrize.register_parametrization(module, param, Blockwise8bitParametrization(state), unsafe=True)
    module.register_forward_pre_hook(bnb.nn.parametrize._enable_parametrization_cache)
    module.register_forward_hook(bnb.nn.parametrize._disable_parametrization_cache, always_call=True)


def quantize_model(model: nn.Module, quantization: str, device: torch.device | str) -> nn.Module:
    """Quantize `model` (on the CPU) onto `device` tensor by tensor, in place; `ImportError`, `ValueError`."""
    if quantization == "none":
        return model.to(device)
    if quantization not in BITSANDBYTES_QUANTIZATIONS:
        raise ValueError(f"quantize_model runs none, 4bit or 8bit (fp8: convert_to_fp8), got {quantization!r}")
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


def quant_state_tensors(state) -> list[torch.Tensor]:
    """The tensors of a bitsandbytes `QuantState`."""
    if state is None:
        return []
    tensors = [t for t in (state.absmax, state.code) if isinstance(t, torch.Tensor)]
    if getattr(state, "nested", False):
        tensors += quant_state_tensors(state.state2)
        if isinstance(getattr(state, "offset", None), torch.Tensor):
            tensors.append(state.offset)
    return tensors


def quantized_nbytes(numel: int, quantization: str) -> int:
    """Bytes of a `numel`-element parameter after `quantize_parameter`."""
    if quantization == "4bit":
        return math.ceil(numel / 2) + 4 * math.ceil(numel / NF4_BLOCKSIZE) + 4 * 16
    if quantization == "8bit":
        return numel + 4 * math.ceil(numel / BLOCKWISE8_BLOCKSIZE) + 4 * 256
    raise ValueError(f"quantization must be 4bit or 8bit, got {quantization!r}")


def fp8_config():
    return FineGrainedFP8Config(weight_block_size=FP8_BLOCK_SIZE, modules_to_not_convert=list(SKIPPED_SUFFIXES))


def fp8_refusal(device: torch.device) -> str | None:
    """Why `fp8` cannot run on `device`, or None."""
    needs = "fp8 quantization needs a CUDA GPU of compute capability 8.9 or newer"
    if device.type != "cuda":
        return f"{needs}, not {device.type}: {OTHER_CHOICES}"
    if not torch.cuda.is_available():
        return f"{needs}, and CUDA is not available: {OTHER_CHOICES}"
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        return (f"fp8 quantization needs compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
                f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}: {OTHER_CHOICES}")
    if import_utils.is_kernels_available():
        return None
    low, high = (getattr(import_utils, name, None) for name in ("KERNELS_MIN_VERSION", "KERNELS_MAX_VERSION"))
    wanted = f"kernels>={low},<{high}" if low and high else "the kernels package"
    return (f"fp8 quantization needs {wanted} (what this transformers accepts), and its FP8 matmul kernel is "
            f"downloaded from the Hugging Face Hub when the model loads: without both, {OTHER_CHOICES}")


def check_fp8_shapes(config) -> None:
    """`ValueError` for expert widths that `FP8_BLOCK_SIZE` does not divide."""
    text = config.get_text_config()
    rows, cols = FP8_BLOCK_SIZE
    widths = {"hidden_size": text.hidden_size, "moe_intermediate_size": text.moe_intermediate_size}
    bad = ", ".join(f"{name} {width}" for name, width in widths.items() if width % rows or width % cols)
    if bad:
        raise ValueError(f"fp8 quantizes blocks of {rows}x{cols}; this model's {bad} is not a multiple: "
                         f"{OTHER_CHOICES}")


@torch.no_grad()
def convert_to_fp8(model: nn.Module, device: torch.device | str) -> nn.Module:
    """Convert `model` (CPU or meta) to `fp8` on `device`, tensor by tensor, in place."""
    device = torch.device(device)
    quantizer = FineGrainedFP8HfQuantizer(fp8_config(), pre_quantized=False)
    originals = {name: dict(module.named_parameters(recurse=False))
                 for name, module in model.named_modules(remove_duplicate=False)}
    quantizer.preprocess_model(model)
    quantize = quantizer.get_quantize_ops()
    converted: dict[int, dict[str, nn.Parameter]] = {}  # id(original) -> {name: converted}
    for name, module in model.named_modules(remove_duplicate=False):
        if not isinstance(module, (FP8Linear, FP8Experts)):
            continue
        for param_name, original in originals[name].items():
            if id(original) not in converted:
                out = {param_name: original.data.to(device)}
                if quantizer.param_needs_quantization(model, f"{name}.{param_name}"):
                    out = quantize.convert(out)
                converted[id(original)] = {key: nn.Parameter(t, requires_grad=False) for key, t in out.items()}
            module._parameters.update(converted[id(original)])
        for param_name, param in module.named_parameters(recurse=False):
            if param.device != device:  # a scale of a tensor kept in the model dtype: never read
                module._parameters[param_name] = nn.Parameter(
                    torch.zeros(param.shape, dtype=param.dtype, device=device), requires_grad=False)
    share_tied_modules(model, fp8=True)
    quantizer.postprocess_model(model)
    return model.to(device)


def from_pretrained_fp8(where: str, device: torch.device, dtype: torch.dtype, **common):
    """The model quantized to `fp8` on `device` as it loads, tied modules shared."""
    network = DiffusionGemmaForBlockDiffusion.from_pretrained(
        where, dtype=dtype, device_map={"": device}, quantization_config=fp8_config(), **common)
    share_tied_modules(network, fp8=True)
    return network


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
    """(name, tensor) of every parameter, buffer and quant-state tensor of `modules`, each once."""
    seen = set()
    for module in modules:
        named = [*module.named_parameters(), *module.named_buffers()]
        named += [(f"{name}.{param}", t) for name, sub in module.named_modules()
                  for param, plist in getattr(sub, "parametrizations", {}).items()
                  for t in quant_state_tensors(getattr(plist[0], "quant_state", None))]
        for name, tensor in named:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                yield name, tensor


def model_bytes(model: nn.Module) -> int:
    """Bytes of a model's tensors as stored (shared ones once)."""
    return sum(tensor.numel() * tensor.element_size() for _, tensor in stored_tensors(model))


def memory_report(model: nn.Module, quantization: str = "none") -> dict:
    """`{"total_bytes": N, "groups": {group: N}}` as `quantization` would store `model`; `ValueError`."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    planned = set()
    if quantization == "fp8":
        if not any(isinstance(m, (FP8Linear, FP8Experts)) for m in model.modules()):
            if any(p.device.type != "meta" for p in model.parameters()):
                raise ValueError("the fp8 report converts the model: build it on the meta device (meta_model)")
            convert_to_fp8(model, "meta")
    elif quantization != "none":
        share_tied_modules(model)
        planned = {id(t.module._parameters[t.param]) for t in quantization_targets(model)
                   if t.param in t.module._parameters}
    groups = dict.fromkeys(GROUPS, 0)
    for name, tensor in stored_tensors(model):
        groups[group_of(name)] += (quantized_nbytes(tensor.numel(), quantization) if id(tensor) in planned
                                   else tensor.numel() * tensor.element_size())
    return {"total_bytes": sum(groups.values()), "groups": groups}


def format_report(report: dict, title: str) -> str:
    """The report as a table in GB (10^9 bytes) and bytes."""
    rows = [*report["groups"].items(), ("total", report["total_bytes"])]
    return "\n".join([title] + [f"  {group:<13} {nbytes / 1e9:9.3f} GB  {nbytes:>15,} bytes" for group, nbytes in rows])

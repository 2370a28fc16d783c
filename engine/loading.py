"""Load a DiffusionGemma checkpoint (folder or hub id; default: the embedded one) with transformers, no remote code."""

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, DiffusionGemmaForBlockDiffusion

from .quantization import (QUANTIZATIONS, bitsandbytes_missing, check_fp8_shapes, fp8_refusal, from_pretrained_fp8,
                           memory_report, quantize_model)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO_ROOT / "assets" / "models" / "diffgemma-tiny"
DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")
FIT_HEADROOM = 1.15  # cache, activations and allocator slack over the weights


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message says why and what to do."""


@dataclass
class LoadedModel:
    """A loaded checkpoint, `model` in eval mode."""

    model: object
    tokenizer: object
    source: str
    device: torch.device
    dtype: torch.dtype


def resolve_device(device: str) -> torch.device:
    """`auto`: cuda, else mps, else cpu; `ModelLoadError` for an unknown or absent device."""
    if device not in DEVICES:
        raise ModelLoadError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available()
                            else "cpu")
    missing = {"cuda": (torch.cuda, "torch sees no CUDA GPU"),
               "mps": (torch.backends.mps, "this machine has no Apple GPU")}
    if device in missing and not missing[device][0].is_available():
        raise ModelLoadError(f"device {device!r} was asked for, but {missing[device][1]} (use --device cpu)")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto`: bfloat16 on CUDA, float32 elsewhere."""
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def available_cpus() -> int:
    """CPUs this process may run on, at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def set_serving_threads(device: torch.device, threads: int | None = None) -> int:
    """Set torch's CPU threads to `threads` (CPU default: all but one), returned; `ValueError` below 1."""
    if threads is not None:
        if isinstance(threads, bool) or int(threads) != threads or threads < 1:
            raise ValueError(f"threads must be a whole number >= 1, got {threads!r}")
        torch.set_num_threads(int(threads))
    elif device.type == "cpu":
        torch.set_num_threads(max(1, available_cpus() - 1))
    return torch.get_num_threads()


def check_quantization(quantization: str, device: torch.device) -> None:
    """`ModelLoadError` for a quantization `device` or the installed packages cannot run."""
    if quantization == "fp8":
        refusal = fp8_refusal(device)
    elif quantization != "none" and device.type not in ("cuda", "cpu"):
        refusal = (f"{quantization} quantization runs on CUDA or the CPU (bitsandbytes), not on {device.type}: "
                   "use --device cuda, --device cpu or --quantization none")
    else:
        refusal = bitsandbytes_missing() if quantization != "none" else None
    if refusal is not None:
        raise ModelLoadError(refusal)


def model_location(model: str | Path, *, strict: bool = True) -> tuple[str, dict]:
    """(where, `from_pretrained` options) of a folder or hub id; `strict`: `ModelLoadError` for neither."""
    source = str(model)
    local = Path(source).expanduser()
    is_local = local.exists()
    if strict and not is_local and (source.startswith((".", "/", "~")) or source.count("/") != 1):
        raise ModelLoadError(f"model folder {source!r} does not exist (and it is not a hub id like 'org/name')")
    return (str(local) if is_local else source), {"trust_remote_code": False, "local_files_only": is_local}


def model_name(source) -> str:
    """A model's name to show: a local folder's name (never the path), else the hub id."""
    text = str(source)
    return Path(text).name if Path(text).expanduser().exists() else text


def read_config(model: str | Path):
    """The `DiffusionGemmaConfig` of `model`; `ModelLoadError` for an unreadable or other config."""
    where, common = model_location(model)
    try:
        config = AutoConfig.from_pretrained(where, **common)
    except Exception as error:  # noqa: BLE001
        raise ModelLoadError(f"cannot read a model config from {str(model)!r}: {error}") from error
    if getattr(config, "model_type", None) != "diffusion_gemma":
        raise ModelLoadError(f"{str(model)!r} is a {getattr(config, 'model_type', 'unknown')!r} model, not "
                             "DiffusionGemma (model_type 'diffusion_gemma')")
    return config


def meta_model(model, dtype: torch.dtype = torch.bfloat16):
    """The model of a config, folder or hub id on the meta device; `ModelLoadError`."""
    config = model if hasattr(model, "get_text_config") else read_config(model)
    with torch.device("meta"):
        return DiffusionGemmaForBlockDiffusion._from_config(config, dtype=dtype)


def check_fits(config, dtype: torch.dtype, quantization: str, device: torch.device, free: int | None = None) -> int:
    """The weights' bytes on CUDA (0 elsewhere); `ModelLoadError` naming a quantization that fits."""
    if device.type != "cuda":
        return 0
    free = torch.cuda.mem_get_info(device)[0] if free is None else free
    meta = meta_model(config, dtype)
    needs = {choice: memory_report(meta, choice)["total_bytes"] for choice in ("none", "8bit", "4bit")}
    needed = needs["8bit" if quantization == "fp8" else quantization]
    if needed * FIT_HEADROOM <= free:
        return needed
    fitting = [choice for choice in ("8bit", "4bit") if needs[choice] * FIT_HEADROOM <= free]
    advice = (f"use --quantization {fitting[0]} (about {needs[fitting[0]] / 1e9:.1f} GB)" if fitting
              else f"not even 4bit fits (about {needs['4bit'] / 1e9:.1f} GB): use a larger GPU or --device cpu")
    raise ModelLoadError(
        f"the {'unquantized' if quantization == 'none' else quantization} weights need about {needed / 1e9:.1f} GB "
        f"(+{FIT_HEADROOM - 1:.0%} for the cache and activations) but {device} has {free / 1e9:.1f} GB free: {advice}")


def load_model(model: str | Path = DEFAULT_MODEL, device: str = "auto", dtype: str = "auto",
               quantization: str = "none") -> LoadedModel:
    """The model and tokenizer on `device` in `dtype`, quantized as asked; `ModelLoadError`."""
    if quantization not in QUANTIZATIONS:
        raise ModelLoadError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    check_quantization(quantization, torch_device)
    source = str(model)
    where, common = model_location(model)
    config = read_config(model)
    if quantization == "fp8":
        try:
            check_fp8_shapes(config)
        except ValueError as error:
            raise ModelLoadError(str(error)) from error
    check_fits(config, torch_dtype, quantization, torch_device)
    cuda = torch_device.type == "cuda"
    device_map = "cpu" if quantization != "none" else {"": torch_device} if cuda else None
    try:
        if quantization == "fp8":
            network = from_pretrained_fp8(where, torch_device, torch_dtype, **common)
        else:
            network = DiffusionGemmaForBlockDiffusion.from_pretrained(where, dtype=torch_dtype, device_map=device_map,
                                                                      **common)
        tokenizer = AutoTokenizer.from_pretrained(where, **common)
    except Exception as error:  # noqa: BLE001
        raise ModelLoadError(
            f"cannot load weights or tokenizer from {source!r}: {type(error).__name__}: {error}") from error
    vocab_size = config.text_config.vocab_size
    if len(tokenizer) < vocab_size // 2:  # no tokenizer.json
        raise ModelLoadError(f"the tokenizer in {source!r} has {len(tokenizer):,} tokens for a model of "
                             f"{vocab_size:,}: its tokenizer files (tokenizer.json) are missing or wrong")
    if quantization in ("4bit", "8bit"):
        network = quantize_model(network, quantization, torch_device)
    elif not cuda:
        network = network.to(torch_device)
    if cuda:
        torch.cuda.init()
    network.eval()
    return LoadedModel(model=network, tokenizer=tokenizer, source=source, device=torch_device, dtype=torch_dtype)

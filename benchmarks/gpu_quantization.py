"""GPU check of the quantization choices on the full 26B config with random weights (one H100/H200; not CI).

    python benchmarks/gpu_quantization.py [--choices none,8bit,4bit,fp8] [--json]
    python benchmarks/gpu_quantization.py --tiny --device cpu      # the smoke run the test suite does

For each choice: builds the real config (assets/configs/diffusiongemma-26B-A4B-it, vision tower included) on the
CPU without initialising it (`no_init_weights`: no memory is touched), points every matrix at a view of one shared
random bf16 pool (N(0, 0.02); norms and scales 1), so that the CPU model costs about 1.5 GB whatever its size, then
moves it to the GPU through `engine.quantization.quantize_model`, the function `load_model` uses after its
memory-mapped CPU load: one tensor at a time, quantized on the GPU. Reports the GPU memory after load (allocated,
and `engine.memory`'s count of the weights), the peak during one 256-token generation, and tokens/s of bare
`model.generate()` at 16 and 48 fixed steps (adaptive stopping off, EOS off: every canvas is 256 tokens after
exactly that many decoder forwards). `fp8` goes through `engine.fp8.convert_to_fp8` (transformers' own FP8 module
replacement and quantize op, tensor by tensor, as `from_pretrained` applies them) and is skipped, with the line
`load_model` would refuse it with, on a CPU or a GPU older than compute capability 8.9. Random weights give the right memory and nearly the right speed (routers
spread tokens over experts), not meaningful text. Expected run time: under 10 minutes. Without CUDA (and without
`--device cpu`) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.loading import REPO_ROOT  # noqa: E402
from engine.memory import memory_report  # noqa: E402
from engine.fp8 import fp8_refusal  # noqa: E402
from engine.quantization import QUANTIZATIONS, quantize_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_full_scale.py, beside this script
from gpu_full_scale import fixed_generation_config  # noqa: E402

REAL_CONFIG = REPO_ROOT / "assets" / "configs" / "diffusiongemma-26B-A4B-it"
TINY_TEXT = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, moe_intermediate_size=64, num_experts=8, top_k_experts=2,
                 sliding_window=32, vocab_size=4096, layer_types=["sliding_attention", "full_attention"],
                 per_layer_config={"1": {"head_dim": 64, "num_key_value_heads": 1}})
TINY_VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=16, position_embedding_size=64)
FULL_CANVAS, TINY_CANVAS = 256, 16
PROMPT_TOKENS = 64


def build_config(tiny: bool):
    """The real config, or the same structure with tiny widths (`tiny`)."""
    from transformers import DiffusionGemmaConfig

    real = json.loads((REAL_CONFIG / "config.json").read_text())
    if not tiny:
        return DiffusionGemmaConfig(**real)
    return DiffusionGemmaConfig(**dict(real, text_config=dict(real["text_config"], **TINY_TEXT),
                                       vision_config=dict(real["vision_config"], **TINY_VISION),
                                       canvas_length=TINY_CANVAS))


def random_cpu_model(config, seed: int = 0):
    """`DiffusionGemmaForBlockDiffusion` on the CPU, every matrix a view of one random bf16 pool (as large as the
    largest tensor), 1-D parameters ones; buffers as the constructor computes them; encoder and decoder tied."""
    from transformers import DiffusionGemmaForBlockDiffusion
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = DiffusionGemmaForBlockDiffusion._from_config(config, dtype=torch.bfloat16)
    model.tie_weights()
    largest = max(p.numel() for p in model.parameters())
    generator = torch.Generator().manual_seed(seed)
    pool = (torch.randn(largest + 4096, generator=generator) * 0.02).to(torch.bfloat16)
    for index, (name, param) in enumerate(model.named_parameters()):  # tied parameters appear once
        module_name, _, attribute = name.rpartition(".")
        module = model.get_submodule(module_name)
        if param.dim() == 1:
            value = torch.ones(param.shape, dtype=torch.bfloat16)
        else:
            offset = (index * 997) % (pool.numel() - param.numel() + 1)
            value = pool[offset:offset + param.numel()].view(param.shape)
        new = torch.nn.Parameter(value, requires_grad=False)
        for tied_module in [m for m in model.modules() if m._parameters.get(attribute) is param]:
            tied_module._parameters[attribute] = new
    return model.eval()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_generate(model, prompt: torch.Tensor, steps: int, tokens: int, device: torch.device) -> dict:
    """One fixed-length `generate()`: seconds, generated tokens, tokens/s."""
    config = fixed_generation_config(steps, tokens)
    synchronize(device)
    start = time.perf_counter()
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(prompt, generation_config=config)
    synchronize(device)
    seconds = time.perf_counter() - start
    generated = out.sequences.shape[-1] - prompt.shape[-1]
    return {"steps": steps, "tokens": int(generated), "seconds": round(seconds, 3),
            "tokens_per_second": round(generated / seconds, 1)}


def measure_choice(config, quantization: str, device: torch.device, steps: list[int]) -> dict:
    """Build, load through `quantize_model`, measure memory and speed of one choice; frees the GPU after."""
    started = time.perf_counter()
    model = random_cpu_model(config)
    built_s = time.perf_counter() - started
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    model = quantize_model(model, quantization, device)
    result = {"quantization": quantization, "build_s": round(built_s, 1),
              "load_s": round(time.perf_counter() - start, 1),
              "weights_bytes": memory_report(model)["total_bytes"]}
    if device.type == "cuda":
        result["gpu_allocated_after_load_bytes"] = torch.cuda.memory_allocated() - base
        result["gpu_peak_while_loading_bytes"] = torch.cuda.max_memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
    canvas = config.canvas_length
    generator = torch.Generator().manual_seed(1)
    high = min(config.text_config.vocab_size, config.boi_token_id)  # plain text ids: no image or special tokens
    prompt = torch.randint(3, high, (1, PROMPT_TOKENS), generator=generator).to(device)
    timed_generate(model, prompt, 2, canvas, device)  # warm-up
    runs = [timed_generate(model, prompt, s, canvas, device) for s in steps]
    result["runs"] = runs
    if device.type == "cuda":
        result["gpu_peak_during_generation_bytes"] = torch.cuda.max_memory_allocated() - base
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def format_report(results: dict) -> str:
    lines = [f"{results['config']} config on {results['device']}, {PROMPT_TOKENS}-token prompt, "
             f"{results['canvas_length']}-token canvas"]
    for r in results["choices"]:
        if "skipped" in r:
            lines.append(f"  {r['quantization']:<5} skipped: {r['skipped']}")
            continue
        if "error" in r:
            lines.append(f"  {r['quantization']:<5} FAILED: {r['error']}")
            continue
        gpu = ""
        if "gpu_allocated_after_load_bytes" in r:
            gpu = (f", GPU after load {r['gpu_allocated_after_load_bytes'] / 1e9:.2f} GB (peak while loading "
                   f"{r['gpu_peak_while_loading_bytes'] / 1e9:.2f}), peak while generating "
                   f"{r['gpu_peak_during_generation_bytes'] / 1e9:.2f} GB")
        speed = ", ".join(f"{run['tokens_per_second']} tok/s at {run['steps']} steps" for run in r["runs"])
        lines.append(f"  {r['quantization']:<5} weights {r['weights_bytes'] / 1e9:.2f} GB{gpu}; {speed}; "
                     f"load {r['load_s']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="tiny widths, same structure (smoke test)")
    parser.add_argument("--choices", default=",".join(QUANTIZATIONS), help="comma-separated quantization choices")
    parser.add_argument("--steps", default="16,48", help="comma-separated fixed step counts to time")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    choices = [c for c in args.choices.split(",") if c]
    unknown = [c for c in choices if c not in QUANTIZATIONS]
    if unknown:
        parser.error(f"unknown choice(s) {', '.join(unknown)}; choose from {', '.join(QUANTIZATIONS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_quantization: no CUDA GPU here; nothing measured (run it on an H100/H200, or --tiny --device cpu)")
        return 0
    device = torch.device(args.device)
    config = build_config(args.tiny)
    results = {"config": "tiny" if args.tiny else "26B-A4B", "canvas_length": config.canvas_length,
               "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "choices": []}
    for quantization in choices:
        if quantization == "fp8" and (refusal := fp8_refusal(device)) is not None:
            results["choices"].append({"quantization": "fp8", "skipped": refusal})
            continue
        if device.type == "cuda" and quantization == "none" and torch.cuda.mem_get_info()[0] < 60e9 and not args.tiny:
            results["choices"].append({"quantization": "none", "error": "bf16 needs about 52 GB; less is free"})
            continue
        try:
            results["choices"].append(measure_choice(config, quantization, device,
                                                     [int(s) for s in args.steps.split(",")]))
        except Exception as error:  # noqa: BLE001 - keep the other choices' figures
            results["choices"].append({"quantization": quantization, "error": f"{type(error).__name__}: {error}"[:500]})
    print(json.dumps(results) if args.json else format_report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""DiffusionGemma 26B-A4B at full scale on one H100/H200-class GPU: random bf16 weights, no hub, about 5 minutes.

    python benchmarks/gpu_full_scale.py [--steps 16] [--blocks 2] [--prompt-tokens 512] [--repeats 3] [--json]

Builds the full architecture from a config (random weights, directly on the GPU), runs fixed canvases (adaptive
stopping off, EOS disabled, so every canvas is 256 tokens after exactly `--steps` decoder forwards) and reports
tokens/s of bare `model.generate()` and of the playground's engine (every frame consumed), eager with the dynamic
cache and then with `cache_implementation="static"` (which makes transformers `torch.compile` the encoder, the
decoder forward and the sampler, mode "reduce-overhead"), next to the published speed and the memory-bandwidth
bound. Speed does not depend on what the weights say, except through MoE routing: random routers spread tokens
over experts about uniformly, as a trained model roughly does. Runs only when asked (never in CI); without CUDA it
says so and exits 0. `--tiny --device cpu` runs every step on a tiny variant, which the test suite does.

The model is built from the checkpoint's own config.json (`assets/configs/diffusiongemma-26B-A4B-it`, the published
values as transformers 5.23 serializes them): 30 layers (5 sliding : 1 full), hidden 2816, 16 query heads, 8 KV heads
of 256 on sliding layers and 2 of 512 on full layers (keys double as values there), dense MLP 2112, 128 experts of
704 with top-8 routing, vocabulary 262,144 (tied), sliding window 1024, "vision" bidirectional attention, canvas 256,
and the real 27-layer vision tower (text generation never calls it, but it takes its memory). That gives 25.2B text
parameters, 3.8B active per token, 25.8B in all, as published. Prompts are encoded and tokens shown with the Gemma 4
tokenizer of the stand-in (`standin/`, 262,144 ids; the embedded tokenizer when the stand-in's vocabulary package is
not installed, which the report says).

Bandwidth bound: at batch 1 every decoder forward reads its weights from HBM once. Per forward: every layer's
attention, dense MLP and router; the experts its 256 canvas tokens are routed to; the self-conditioning MLP; and the
tied 262,144 x 2816 embedding twice (the LM head, and the self-conditioning soft embeddings). Each canvas also costs
one encoder pass over the previous canvas (no LM head). Two bounds are given: "active" counts only top-k experts per
layer (what "active parameters" suggests, and far too optimistic for 256 tokens at once) and "expected" counts the
experts that 256 uniformly routed tokens hit (about all 128). KV-cache and activation traffic are left out (< 1% at
these lengths). Published: 1288 tokens/s on H200 and 1008 on H100, FP8, batch 1 (secondary source attributing vLLM).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench.py, beside this script

from bench import interleave, path_summary, ratio, run_bare, run_engine, same_tokens, scaling_prompt  # noqa: E402
from engine.engine import DiffusionEngine  # noqa: E402
from engine.loading import DEFAULT_MODEL, LoadedModel  # noqa: E402
from standin.build import REAL_CONFIG_DIR  # noqa: E402

# A tiny variant of the real config for the CPU smoke test: every structural choice kept, sizes shrunk, and a
# vocabulary of 4096 so that the embedded tokenizer fits it
TINY_TEXT = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
    head_dim=32, global_head_dim=64, num_global_key_value_heads=1, moe_intermediate_size=32, num_experts=8,
    top_k_experts=2, sliding_window=32, vocab_size=4096, max_position_embeddings=8192,
    layer_types=["sliding_attention", "full_attention"],
)
TINY_VISION = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=8)
FULL_CANVAS, TINY_CANVAS = 256, 16
# GPU name fragment -> (HBM bandwidth in bytes/s, published batch-1 tokens/s, FP8)
GPUS = {"H200": (4.8e12, 1288), "H100": (3.35e12, 1008)}


def build_config(tiny: bool = False):
    """The `DiffusionGemmaConfig` of the 26B-A4B checkpoint, read from `REAL_CONFIG_DIR` (or its tiny variant:
    `TINY_TEXT`, `TINY_VISION` and a 16-token canvas over the same config)."""
    from transformers import DiffusionGemmaConfig

    real = json.loads((REAL_CONFIG_DIR / "config.json").read_text())
    if not tiny:
        return DiffusionGemmaConfig.from_dict(real)
    text = {k: v for k, v in real["text_config"].items() if k != "per_layer_config"}  # re-derived from TINY_TEXT
    top = {k: v for k, v in real.items() if k not in ("text_config", "vision_config", "transformers_version")}
    return DiffusionGemmaConfig(**{**top, "canvas_length": TINY_CANVAS}, text_config={**text, **TINY_TEXT},
                                vision_config={**real["vision_config"], **TINY_VISION})


def load_tokenizer(tiny: bool) -> tuple[object, str]:
    """(tokenizer, where it came from): the stand-in's Gemma 4 tokenizer for the full model, the embedded model's
    for the tiny variant or when the stand-in cannot be built here (its vocabulary package is missing)."""
    from transformers import AutoTokenizer

    if not tiny:
        try:
            from standin import ensure_standin

            path = ensure_standin()
            return AutoTokenizer.from_pretrained(path), f"Gemma 4 (stand-in, {path.name})"
        except RuntimeError as error:
            print(f"gpu_full_scale: the stand-in's tokenizer is not available ({error}); using the embedded one",
                  file=sys.stderr)
    return AutoTokenizer.from_pretrained(DEFAULT_MODEL), "embedded diffgemma-tiny (4,096 ids)"


@dataclass(frozen=True)
class WeightCensus:
    """Parameter counts by how often a forward reads them (tied weights counted once, vision tower left out)."""

    dense: int             # attention, dense MLP, router and norms of all layers, final norm
    experts: int           # all experts of all layers
    vocab_matrix: int      # the tied embedding / LM head
    self_conditioning: int
    num_experts: int
    top_k: int

    @property
    def text_total(self) -> int:
        return self.dense + self.experts + self.vocab_matrix + self.self_conditioning

    @property
    def active_per_token(self) -> int:
        """Parameters one token uses: all but the unrouted experts (the "A4B" figure)."""
        return self.dense + self.experts * self.top_k // self.num_experts + self.vocab_matrix


def weight_census(model) -> WeightCensus:
    """Count `model`'s parameters by role (works on the meta device, so the 26B census costs no memory)."""
    counts = {"dense": 0, "experts": 0, "vocab_matrix": 0, "self_conditioning": 0}
    for name, parameter in model.named_parameters():  # tied parameters appear once
        if "vision" in name:
            continue
        role = ("experts" if ".experts." in name else "vocab_matrix" if "embed_tokens" in name or "lm_head" in name
                else "self_conditioning" if "self_conditioning" in name else "dense")
        counts[role] += parameter.numel()
    text = model.config.text_config
    return WeightCensus(**counts, num_experts=text.num_experts, top_k=text.top_k_experts)


def expected_experts_hit(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts that `tokens` tokens reach in one layer, each routed uniformly to `top_k`."""
    return num_experts * (1 - (1 - top_k / num_experts) ** tokens)


def bytes_per_pass(census: WeightCensus, canvas_length: int, bytes_per_param: float, routing: str) -> dict:
    """Weight bytes one decoder forward and one encoder pass (over one canvas) read from memory.

    routing: "active" reads top-k experts per layer; "expected" the experts `canvas_length` uniformly routed tokens
    hit.
    """
    if routing == "active":
        experts_read = census.top_k
    elif routing == "expected":
        experts_read = expected_experts_hit(census.num_experts, census.top_k, canvas_length)
    else:
        raise ValueError(f"routing must be 'active' or 'expected', got {routing!r}")
    layers_params = census.dense + census.experts * experts_read / census.num_experts
    decoder = layers_params + census.self_conditioning + 2 * census.vocab_matrix  # LM head + soft embeddings
    return {"decoder_forward": decoder * bytes_per_param, "encoder_pass": layers_params * bytes_per_param,
            "experts_read_per_layer": experts_read}


def bandwidth_bound_tokens_per_second(decoder_bytes: float, encoder_bytes: float, steps: int, canvas_length: int,
                                      bandwidth_bytes_per_s: float) -> float:
    """Upper bound on tokens/s: one canvas of `canvas_length` tokens costs `steps` decoder forwards and one encoder
    pass, each reading its weights once at `bandwidth_bytes_per_s` (prompt prefill left out)."""
    seconds_per_canvas = (steps * decoder_bytes + encoder_bytes) / bandwidth_bytes_per_s
    return canvas_length / seconds_per_canvas


def bounds(census: WeightCensus, canvas_length: int, steps: int, bandwidth: float) -> dict:
    """Bandwidth bounds (tokens/s) for bf16 and FP8 weights, "active" and "expected" routing."""
    result = {}
    for dtype, size in (("bf16", 2), ("fp8", 1)):
        for routing in ("active", "expected"):
            passes = bytes_per_pass(census, canvas_length, size, routing)
            result[f"{dtype}_{routing}"] = round(bandwidth_bound_tokens_per_second(
                passes["decoder_forward"], passes["encoder_pass"], steps, canvas_length, bandwidth), 1)
            result[f"{dtype}_{routing}_decoder_gb"] = round(passes["decoder_forward"] / 1e9, 2)
    return result


def meta_census(config) -> WeightCensus:
    """The weight census of `config`'s model built on the meta device (no memory, about a second)."""
    from transformers import DiffusionGemmaForBlockDiffusion

    with torch.device("meta"):
        return weight_census(DiffusionGemmaForBlockDiffusion(config))


def format_bounds(census: WeightCensus, canvas_length: int, steps: int) -> str:
    """The bandwidth bounds on each GPU in the table (computed, not measured)."""
    lines = [f"26B-A4B: {census.text_total / 1e9:.2f}B text parameters, {census.active_per_token / 1e9:.2f}B active "
             f"per token; {steps} steps per {canvas_length}-token canvas; bandwidth bounds (computed, not measured):"]
    for name, (bandwidth, published) in GPUS.items():
        b = bounds(census, canvas_length, steps, bandwidth)
        lines.append(f"  {name} {bandwidth / 1e12} TB/s: bf16 {b['bf16_expected']:.0f} tok/s (experts hit by "
                     f"{canvas_length} tokens; {b['bf16_expected_decoder_gb']} GB per decoder forward), "
                     f"{b['bf16_active']:.0f} (top-k only; {b['bf16_active_decoder_gb']} GB); FP8 "
                     f"{b['fp8_expected']:.0f} / {b['fp8_active']:.0f}; published FP8 {published} tok/s")
    return "\n".join(lines)


def build_model(config, device: torch.device, dtype: torch.dtype):
    """`DiffusionGemmaForBlockDiffusion` with random weights, created directly on `device` in `dtype`."""
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(0)
    with torch.device(device):
        model = DiffusionGemmaForBlockDiffusion._from_config(config, dtype=dtype)
    return model.eval()


def fixed_generation_config(steps: int, max_new_tokens: int):
    """Fixed-length generation: `steps` forwards per canvas, no adaptive stopping, no EOS (every canvas is full)."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationConfig,
        EntropyBoundSamplerConfig,
    )

    return DiffusionGemmaGenerationConfig(
        max_new_tokens=max_new_tokens, max_denoising_steps=steps, sampler_config=EntropyBoundSamplerConfig(0.1),
        t_min=0.4, t_max=0.8, stability_threshold=None, confidence_threshold=None, eos_token_id=None,
        pad_token_id=0, bos_token_id=2, return_dict_in_generate=True,
    )


def measure_variant(engine: DiffusionEngine, prompt: str, repeats: int, cache_implementation: str | None) -> dict:
    """Bare `generate()` and engine tokens/s with one cache implementation, interleaved; the first (warm-up) call's
    time is kept as `warmup_s` (it includes compilation with the static cache). When the engine fails, bare
    `generate()` is still measured and the engine's error is kept."""
    engine.model.generation_config.cache_implementation = cache_implementation
    settings = engine.recommended.replace(adaptive_stopping=False)  # the fixed generation config, all steps
    input_ids = engine.encode_prompt(prompt, raw=True)
    started = time.perf_counter()
    run_bare(engine, input_ids, settings, 12345)
    result = {"cache_implementation": cache_implementation or "dynamic",
              "warmup_s": round(time.perf_counter() - started, 2)}
    paths = {"bare": lambda seed: run_bare(engine, input_ids, settings, seed),
             "engine": lambda seed: run_engine(engine, prompt, settings, seed, True)}
    try:
        runs = interleave(paths, (0,), repeats)
    except Exception as error:  # noqa: BLE001 - keep the bare figure
        result["engine_error"] = f"{type(error).__name__}: {error}"[:500]
        del paths["engine"]
        runs = interleave(paths, (0,), repeats, warmup=False)
    result["bare_generate"] = path_summary(runs["bare"])
    if "engine" in runs:
        result.update(engine_frames=path_summary(runs["engine"]), same_tokens=same_tokens(runs["bare"], runs["engine"]),
                      engine_overhead_ratio=ratio(runs["engine"], runs["bare"]))
    return result


def run(args) -> dict:
    """Build, census, measure each variant while the time budget lasts."""
    started = time.perf_counter()
    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    config = build_config(tiny=args.tiny)
    model = build_model(config, device, dtype)
    canvas = config.canvas_length
    model.generation_config = fixed_generation_config(args.steps, args.blocks * canvas)
    tokenizer, tokenizer_source = load_tokenizer(args.tiny)
    engine = DiffusionEngine(LoadedModel(model, tokenizer, "random weights", device, dtype))
    census = weight_census(model)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    bandwidth, published = next((v for k, v in GPUS.items() if k in gpu), (args.bandwidth_tb_s * 1e12, None))
    results = {
        "gpu": gpu, "config": "tiny" if args.tiny else "26B-A4B", "dtype": str(dtype).removeprefix("torch."),
        "tokenizer": tokenizer_source, "parameters": sum(p.numel() for p in model.parameters()),
        "text_parameters": census.text_total, "active_parameters_per_token": census.active_per_token,
        "experts_implementation": model.config.text_config._experts_implementation,
        "attn_implementation": model.config._attn_implementation,
        "steps": args.steps, "blocks": args.blocks, "canvas_length": canvas, "prompt_tokens": args.prompt_tokens,
        "build_s": round(time.perf_counter() - started, 1),
        "published_tokens_per_second_fp8": published, "bandwidth_tb_s": bandwidth / 1e12,
        "bandwidth_bound_tokens_per_second": bounds(census, canvas, args.steps, bandwidth),
        "variants": [], "skipped": [],
    }
    prompt = scaling_prompt(engine, args.prompt_tokens)
    variants = [None] if args.no_compile else [None, "static"]
    for cache_implementation in variants:
        if time.perf_counter() - started > args.budget_s:
            results["skipped"].append(f"{cache_implementation or 'dynamic'}: time budget of {args.budget_s} s spent")
            continue
        try:
            results["variants"].append(measure_variant(engine, prompt, args.repeats, cache_implementation))
        except Exception as error:  # noqa: BLE001 - e.g. the reported static-cache crashes; keep the other figures
            results["skipped"].append(f"{cache_implementation or 'dynamic'}: {type(error).__name__}: {error}"[:500])
    if device.type == "cuda":
        results["peak_gpu_allocated_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 1)
    results["total_s"] = round(time.perf_counter() - started, 1)
    return results


def format_report(results: dict) -> str:
    b = results["bandwidth_bound_tokens_per_second"]
    lines = [
        f"{results['config']} on {results['gpu']} ({results['dtype']}, experts {results['experts_implementation']}, "
        f"attention {results['attn_implementation']}): {results['text_parameters'] / 1e9:.2f}B text parameters, "
        f"{results['active_parameters_per_token'] / 1e9:.2f}B active per token, {results['parameters'] / 1e9:.2f}B "
        f"with the vision tower; built in {results['build_s']} s; tokenizer {results['tokenizer']}",
        f"fixed canvases: {results['blocks']} x {results['canvas_length']} tokens, {results['steps']} steps each, "
        f"prompt {results['prompt_tokens']} tokens; tokens counted: generated, never the prompt",
    ]
    for v in results["variants"]:
        bare = f"  {v['cache_implementation']:>7} cache: bare generate() " \
               f"{v['bare_generate']['tokens_per_second']['median']:.1f} tok/s (warm-up {v['warmup_s']} s), "
        if "engine_error" in v:
            lines.append(bare + f"engine FAILED: {v['engine_error']}")
        else:
            lines.append(bare + f"engine {v['engine_frames']['tokens_per_second']['median']:.1f} tok/s, overhead "
                         f"ratio {v['engine_overhead_ratio']['median']:.3f} (same tokens {v['same_tokens']})")
    lines += [f"  skipped {s}" for s in results["skipped"]]
    lines += [
        f"published (FP8, batch 1): {results['published_tokens_per_second_fp8'] or 'n/a'} tok/s",
        f"bandwidth bound at {results['bandwidth_tb_s']} TB/s: bf16 {b['bf16_expected']:.0f} tok/s with the experts "
        f"{results['canvas_length']} tokens hit ({b['bf16_expected_decoder_gb']} GB per decoder forward), {b['bf16_active']:.0f} counting "
        f"top-k experts only ({b['bf16_active_decoder_gb']} GB); FP8 {b['fp8_expected']:.0f} / {b['fp8_active']:.0f}",
    ]
    if "peak_gpu_allocated_gb" in results:
        lines.append(f"peak GPU memory allocated {results['peak_gpu_allocated_gb']} GB; total {results['total_s']} s")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="a tiny variant of the architecture (smoke test)")
    parser.add_argument("--steps", type=int, default=16, help="decoder forwards per canvas (fixed)")
    parser.add_argument("--blocks", type=int, default=2, help="canvases per run")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="skip the static-cache + torch.compile variant")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start no new variant after this many seconds (the whole run should stay under 10 min)")
    parser.add_argument("--bandwidth-tb-s", type=float, default=3.35, help="HBM bandwidth of a GPU not in the table")
    parser.add_argument("--bounds-only", action="store_true", help="print the computed bandwidth bounds and exit")
    parser.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.bounds_only or (args.device == "cuda" and not torch.cuda.is_available()):
        if not args.bounds_only:
            print("gpu_full_scale: no CUDA GPU here; nothing measured (this benchmark needs an H100/H200-class GPU, "
                  "or use --tiny --device cpu for a smoke run)")
        print(format_bounds(meta_census(build_config()), FULL_CANVAS, args.steps))
        return 0
    if args.device == "cuda" and not args.tiny:
        free, _ = torch.cuda.mem_get_info()
        if free < 60e9:
            print(f"gpu_full_scale: the 26B model needs about 55 GB of GPU memory; {free / 1e9:.0f} GB are free")
            return 1
    results = run(args)
    print(json.dumps(results) if args.json else format_report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

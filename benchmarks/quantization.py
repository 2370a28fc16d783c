"""Quantization on the CPU: bytes and quality of each `--quantization` choice (engine/quantization.py).

    python benchmarks/quantization.py [--layers 2] [--choices none,4bit,8bit] [--skip-full-width] [--skip-embedded]
                                      [--skip-mapped-load] [--prompts 20] [--json]

1. Bytes of the real 26B config (assets/configs/diffusiongemma-26B-A4B-it), by group, from the meta device
   (`engine.memory`), for each choice.
2. A full-width build of that config with `--layers` text layers (every real width, vocabulary 262,144, 128
   experts of 704; the last layer full attention, the others sliding; the vision tower cut to one layer, its real
   bytes come from step 1) with random bf16 weights (`benchmarks/gpu/steps.py`'s `random_cpu_model`: views of one seeded
   N(0, 0.02) pool, the same weights for every choice), quantized on the CPU by `quantize_model` (what
   `load_model` runs after its CPU load), each choice in a fresh process. Printed: bytes per sliding and full
   layer, embeddings, vision tower, extrapolated to the real 25 sliding + 5 full layers; and one decoder forward's
   logits (a 64-token random prompt and a random 256-token canvas, seed 0) against the unquantized model's: mean
   KL(unquantized || quantized) per position in nats and the share of positions whose argmax agrees. The forward
   keeps the bf16 weights (and the quantized codes) as stored but computes in float32 (`float32_arithmetic`):
   CPUs without bf16 matrix instructions (this AMD one) take minutes for a bf16 forward of this build, seconds
   in float32. Then the memory of the loading path's first step (`from_pretrained(device_map="cpu")`) on a saved
   1.1 GB bf16 checkpoint.
3. The embedded model at its recommended settings: dictionary-word rate (training/evaluate.py's measure, Debian's
   /usr/share/dict/words) and tokens per forward over `--prompts` of training/evaluate.py's prompts, seed = index,
   for each choice against the unquantized model.

Runs on the CPU (bitsandbytes 0.50 quantizes there), so `fp8` (CUDA only) is not among its choices except in
step 1; about 15-30 minutes on a busy 2-core machine, 8 GB of memory and 1 GB of temporary disk.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils import parametrize

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))

from engine.loading import REPO_ROOT  # noqa: E402
from engine.loading import meta_model  # noqa: E402
from engine.memory import memory_report  # noqa: E402
from engine.quantization import QUANTIZATIONS, quantize_model  # noqa: E402

CPU_CHOICES = ("none", "4bit", "8bit")  # what bitsandbytes runs on the CPU; fp8 needs CUDA (engine/loading.py)
from steps import random_cpu_model  # noqa: E402  (benchmarks/gpu/steps.py, the GPU kit's)

REAL_CONFIG = REPO_ROOT / "assets" / "configs" / "diffusiongemma-26B-A4B-it"
TINY_VISION = dict(num_hidden_layers=1)
PROMPT_TOKENS, SEED = 64, 0


def full_width_config(layers: int):
    """The real config with `layers` text layers (the last full attention) and a one-layer vision tower."""
    from transformers import DiffusionGemmaConfig

    real = json.loads((REAL_CONFIG / "config.json").read_text())
    full_index = layers - 1
    full_overrides = real["text_config"]["per_layer_config"]["05"]
    text = dict(real["text_config"], num_hidden_layers=layers,
                layer_types=["sliding_attention"] * full_index + ["full_attention"],
                per_layer_config={f"{full_index:02d}": full_overrides})
    config_dict = dict(real, text_config=text, vision_config=dict(real["vision_config"], **TINY_VISION))
    return DiffusionGemmaConfig(**config_dict)


class PeakMemory:
    """Samples this process's resident memory (anonymous and file-backed, MB) every 50 ms; `peak` holds the maxima."""

    def __init__(self):
        self.peak = {"RssAnon": 0, "RssFile": 0, "VmRSS": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> dict:
        values = {}
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in self.peak:
                values[key] = int(rest.split()[0]) // 1024
        return values

    def _run(self):
        while not self._stop.is_set():
            for key, value in self.sample().items():
                self.peak[key] = max(self.peak[key], value)
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def decoder_inputs(config) -> dict:
    """A random prompt and canvas (seed 0) for one decoder forward."""
    generator = torch.Generator().manual_seed(SEED)
    vocab = config.text_config.vocab_size
    return {"input_ids": torch.randint(3, vocab, (1, PROMPT_TOKENS), generator=generator),
            "decoder_input_ids": torch.randint(3, vocab, (1, config.canvas_length), generator=generator)}


def layer_bytes(model, quantization: str) -> dict:
    """Bytes of each decoder layer (shared with the encoder, so counted once) and the report groups."""
    report = memory_report(model)
    per_layer = []
    for layer in model.model.decoder.layers:
        tensors = {id(t): t for t in [*layer.parameters(), *layer.buffers()]}
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        for module in layer.modules():
            for plist in getattr(module, "parametrizations", {}).values():
                state = getattr(plist[0], "quant_state", None)
                if state is not None:
                    nbytes += sum(t.numel() * t.element_size() for t in (state.absmax, state.code))
        per_layer.append(nbytes)
    return {"quantization": quantization, "per_layer": per_layer, "groups": report["groups"],
            "total_bytes": report["total_bytes"]}


class Upcast(nn.Module):
    """Parametrization: a stored bf16 matrix read as float32 (`[*shape]` -> same shape, float32)."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.float()


def float32_arithmetic(model: nn.Module) -> None:
    """Compute in float32 without storing float32 copies of the weights: quantized parameters dequantize to
    float32 (their bitsandbytes quant state's dtype), unquantized bf16 matrices are read through `Upcast` (once per
    module forward: bitsandbytes' parametrization-cache hooks), the embedding table (read row by row, and tied to
    the LM head), vectors and buffers are converted. The values are the bf16 ones; only the arithmetic widens."""
    from bitsandbytes.nn import parametrize as bnb_parametrize

    for module in model.modules():
        if isinstance(module, nn.Embedding) and module.weight.dtype == torch.bfloat16:
            module.weight.data = module.weight.data.float()
    for module in list(model.modules()):  # listed first: registering a parametrization adds modules
        for plist in getattr(module, "parametrizations", {}).values():
            state = getattr(plist[0], "quant_state", None)
            if state is not None:
                state.dtype = torch.float32
        upcast = False
        for name, param in list(module._parameters.items()):
            if param is None or param.dtype != torch.bfloat16:
                continue
            if param.dim() >= 2:
                parametrize.register_parametrization(module, name, Upcast(), unsafe=True)
                upcast = True
            else:
                param.data = param.data.float()
        if upcast:
            module.register_forward_pre_hook(bnb_parametrize._enable_parametrization_cache)
            module.register_forward_hook(bnb_parametrize._disable_parametrization_cache, always_call=True)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.dtype == torch.bfloat16:
                module._buffers[name] = buffer.float()


def one_choice(layers: int, quantization: str, out: Path) -> None:
    """(Child process) build the full-width model from the random pool, quantize it as `load_model` does after
    its CPU load (`quantize_model`), save the figures and one decoder forward's logits."""
    torch.set_num_threads(1)
    model = random_cpu_model(full_width_config(layers))
    start = time.perf_counter()
    model = quantize_model(model, quantization, "cpu").eval()
    quantize_s = time.perf_counter() - start
    figures = layer_bytes(model, quantization)
    float32_arithmetic(model)
    inputs = decoder_inputs(model.config)
    start = time.perf_counter()
    with torch.no_grad():
        logits = model(**inputs).logits[0].float()
    figures.update(quantize_seconds=round(quantize_s, 1), forward_seconds=round(time.perf_counter() - start, 1))
    torch.save(logits, out.with_suffix(".pt"))
    out.write_text(json.dumps(figures))


def mapped_load_memory() -> dict:
    """Memory (MB, this process) of the loading path's first step on a bf16 checkpoint: `from_pretrained(dtype=
    bfloat16, device_map="cpu")` of a 2-layer model with 1.1 GB of weights, saved to a temporary folder."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    real = json.loads((REAL_CONFIG / "config.json").read_text())
    text = dict(real["text_config"], num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
                per_layer_config={"01": real["text_config"]["per_layer_config"]["05"]}, num_experts=32,
                vocab_size=65_536)
    config = DiffusionGemmaConfig(**dict(real, text_config=text, vision_config=dict(real["vision_config"], **TINY_VISION)))
    work = Path(tempfile.mkdtemp(prefix="quant_bench_"))
    try:
        model = random_cpu_model(config)
        for param in model.parameters():  # own storage for each (tied ones are one parameter): safetensors needs it
            param.data = param.data.clone()
        checkpoint_bytes = memory_report(model)["total_bytes"]
        model.save_pretrained(work)
        del model
        peak = PeakMemory()
        before = peak.sample()
        with peak:
            loaded = DiffusionGemmaForBlockDiffusion.from_pretrained(work, dtype=torch.bfloat16, device_map="cpu")
        after = peak.sample()
        del loaded
        return {"checkpoint_bytes": checkpoint_bytes, "before": before, "after": after, "peak": peak.peak}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compare(reference: torch.Tensor, logits: torch.Tensor) -> dict:
    """Mean KL(reference || logits) per position (nats) and argmax agreement of [positions, vocab] logits."""
    ref, other = reference.log_softmax(-1), logits.log_softmax(-1)
    kl = torch.nn.functional.kl_div(other, ref, log_target=True, reduction="none").sum(-1)
    return {"mean_kl_per_position": kl.mean().item(),
            "argmax_agreement": (reference.argmax(-1) == logits.argmax(-1)).float().mean().item()}


def compare_without_echo(reference: torch.Tensor, logits: torch.Tensor, canvas: torch.Tensor) -> dict:
    """`compare` over the vocabulary less each position's own canvas token (`canvas`: [positions] ids). With random
    weights the full-width decoder echoes its input: the scaled input embedding dominates the residual stream and
    the tied LM head gives the canvas token itself about 0.999 of the probability at every position, which makes
    the plain comparison near-trivial; the rest of the distribution is where quantization shows."""
    keep = ~torch.nn.functional.one_hot(canvas, reference.shape[-1]).bool()
    rows = (reference.shape[0], reference.shape[-1] - 1)
    figures = compare(reference[keep].view(rows), logits[keep].view(rows))
    echo = (reference.argmax(-1) == canvas).float().mean().item()
    return {"kl_without_echo": figures["mean_kl_per_position"], "argmax_without_echo": figures["argmax_agreement"],
            "reference_argmax_is_canvas_token": echo}


def full_width(layers: int, choices: list[str]) -> dict:
    """Step 2: each choice in a child process (the same random weights: `random_cpu_model` is seeded)."""
    config = full_width_config(layers)
    work = Path(tempfile.mkdtemp(prefix="quant_bench_"))
    try:
        results = {}
        for quantization in choices:
            out = work / f"{quantization}.json"
            subprocess.run([sys.executable, __file__, "--one-choice", quantization, "--layers", str(layers),
                            "--out", str(out)], check=True)
            results[quantization] = json.loads(out.read_text())
            results[quantization]["logits"] = torch.load(out.with_suffix(".pt"))
            print(f"  {quantization}: quantized in {results[quantization]['quantize_seconds']} s, forward in "
                  f"{results[quantization]['forward_seconds']} s", file=sys.stderr)
        reference = results["none"]["logits"]
        canvas = decoder_inputs(config)["decoder_input_ids"][0]
        for figures in results.values():
            logits = figures.pop("logits")
            figures.update(compare(reference, logits), **compare_without_echo(reference, logits, canvas))
        return {"layers": layers, "layer_types": config.text_config.layer_types, "choices": results}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def extrapolate(measured: dict, layer_types: list[str], real_report: dict, real_layer_types: list[str]) -> dict:
    """Bytes of the real model from one choice's `measured` build (layers of `layer_types`): per-layer bytes by type
    x the real layer count, plus the measured embeddings and other non-layer tensors, plus the real vision tower
    (meta report)."""
    per_type = {t: measured["per_layer"][layer_types.index(t)] for t in set(layer_types)}
    layers_measured = sum(measured["per_layer"])
    outside_layers = measured["total_bytes"] - layers_measured - measured["groups"]["vision_tower"]
    layers_real = sum(per_type[t] for t in real_layer_types)
    return {"bytes_per_layer": per_type, "outside_layers": outside_layers,
            "vision_tower": real_report["groups"]["vision_tower"],
            "total_bytes": layers_real + outside_layers + real_report["groups"]["vision_tower"]}


def embedded_quality(prompts: int, choices: list[str]) -> dict:
    """Step 3: dictionary-word rate and tokens per forward of the embedded model per choice."""
    from engine.engine import DiffusionEngine
    from engine.loading import load_model
    from training.evaluate import EVAL_PROMPTS, load_dictionary, sample_quality

    dictionary = load_dictionary()
    results, reference = {}, None
    for quantization in choices:
        engine = DiffusionEngine(load_model(device="cpu", quantization=quantization))
        with torch.no_grad():
            logits = engine.model(**decoder_inputs(engine.model.config)).logits[0].float()
        reference = logits if reference is None else reference  # "none" comes first
        quality = sample_quality(engine, engine.recommended, dictionary, EVAL_PROMPTS[:prompts]) if prompts else {}
        results[quantization] = {k: quality[k] for k in ("dictionary_word_rate", "tokens_per_forward",
                                                          "distinct_2", "tokens_per_second") if k in quality}
        results[quantization].update(compare(reference, logits))
        print(f"  embedded {quantization}: {json.dumps(results[quantization])}", file=sys.stderr)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2, help="text layers of the full-width build (>= 2)")
    parser.add_argument("--prompts", type=int, default=20,
                        help="embedded-model prompts (training/evaluate.py); 0: logits comparison only")
    parser.add_argument("--choices", default=",".join(CPU_CHOICES),
                        help="comma-separated CPU choices for steps 2 and 3 (none first: the reference)")
    parser.add_argument("--skip-full-width", action="store_true")
    parser.add_argument("--skip-mapped-load", action="store_true", help="skip the from_pretrained memory check")
    parser.add_argument("--skip-embedded", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--one-choice", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_choice:
        one_choice(args.layers, args.one_choice, args.out)
        return 0
    if args.layers < 2:
        parser.error("--layers must be at least 2 (one sliding and one full attention layer)")
    choices = [c for c in args.choices.split(",") if c]
    if not choices or choices[0] != "none" or any(c not in CPU_CHOICES for c in choices):
        parser.error(f"--choices: 'none' first, then any of {', '.join(CPU_CHOICES[1:])} (fp8 needs CUDA)")
    torch.set_num_threads(1)
    report = {"real_config": {}}
    real_types = list(meta_model(REAL_CONFIG).config.text_config.layer_types)
    for quantization in QUANTIZATIONS:  # a fresh meta model each: the report may convert its modules
        report["real_config"][quantization] = memory_report(meta_model(REAL_CONFIG), quantization)
    print("Real 26B config, meta device (GB):")
    for quantization, r in report["real_config"].items():
        groups = "  ".join(f"{g} {b / 1e9:.3f}" for g, b in r["groups"].items())
        print(f"  {quantization:<5} total {r['total_bytes'] / 1e9:7.3f}  {groups}")
    if not args.skip_full_width:
        measured = full_width(args.layers, choices)
        report["full_width"] = measured
        print(f"\nFull-width build, {args.layers} layers ({', '.join(measured['layer_types'])}), random bf16 weights, "
              "float32 arithmetic:")
        print("  choice  sliding layer GB  full layer GB  embeddings GB  vision (real) GB  30-layer total GB  "
              "KL/position  argmax agree  KL w/o echo  argmax w/o echo  quantize s  forward s")
        for quantization, figures in measured["choices"].items():
            extra = extrapolate(figures, measured["layer_types"], report["real_config"][quantization], real_types)
            figures["extrapolated"] = extra
            per = extra["bytes_per_layer"]
            print(f"  {quantization:<6}  {per['sliding_attention'] / 1e9:16.3f}  {per['full_attention'] / 1e9:13.3f}  "
                  f"{figures['groups']['embeddings'] / 1e9:13.3f}  {extra['vision_tower'] / 1e9:16.3f}  "
                  f"{extra['total_bytes'] / 1e9:17.3f}  {figures['mean_kl_per_position']:11.4f}  "
                  f"{figures['argmax_agreement']:12.3f}  {figures['kl_without_echo']:11.4f}  "
                  f"{figures['argmax_without_echo']:15.3f}  {figures['quantize_seconds']:10.0f}  "
                  f"{figures['forward_seconds']:9.1f}")
    if not args.skip_mapped_load:
        mapped = mapped_load_memory()
        report["mapped_load_memory"] = mapped
        print(f"\nfrom_pretrained(device_map='cpu') of a {mapped['checkpoint_bytes'] / 1e9:.2f} GB bf16 checkpoint: "
              f"anonymous memory {mapped['before']['RssAnon']} -> {mapped['after']['RssAnon']} MB (peak "
              f"{mapped['peak']['RssAnon']}), file-backed {mapped['before']['RssFile']} -> {mapped['after']['RssFile']} MB")
    if not args.skip_embedded:
        quality = embedded_quality(args.prompts, choices)
        report["embedded"] = quality
        print(f"\nEmbedded model, {args.prompts} prompts, recommended settings:")
        print("  choice  dictionary words  tokens/forward  distinct-2  KL/position  argmax agree")
        for quantization, q in quality.items():
            words = (f"{q['dictionary_word_rate']:16.3f}  {q['tokens_per_forward']:14.2f}  {q['distinct_2']:10.3f}"
                     if "distinct_2" in q else f"{'-':>16}  {'-':>14}  {'-':>10}")
            print(f"  {quantization:<6}  {words}  {q['mean_kl_per_position']:11.4f}  {q['argmax_agreement']:12.3f}")
    if args.json:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

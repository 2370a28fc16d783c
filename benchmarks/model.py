"""What the model costs and how its quality holds, by choice and by mode: `python -m benchmarks.model CMD`.

    quantization  bytes and quality of each CPU --quantization choice (real 26B config, full-width build, embedded)
    standin       per-frame cost of what the engine adds to a forward at the real vocabulary and canvas (stand-in)
    chat-reuse    prefill seconds per chat turn, encoder cache reused against re-encoding the conversation
    parallel      runs in several threads at once against one thread, and where each thread's time went

Each command's --help says what it measures. The engine's cost against bare generate() at the real vocabulary is
`python -m benchmarks.bench --ways-only --standin`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn.utils import parametrize
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

from benchmarks.bench import run_command
from benchmarks.gpu.measure import random_cpu_model
from engine import DEFAULT_MODEL, DiffusionEngine, load_model
from engine.engine import ChatSession, encode_into_cache
from engine.frames import token_text_for
from engine.generator import host_lists
from engine.loading import REPO_ROOT, set_serving_threads
from engine.loading import meta_model
from engine.quantization import QUANTIZATIONS, bitsandbytes, memory_report, quantize_model
from engine.sampling import RecordingEntropyBoundSampler, canvas_statistics, frame_statistics
from standin import ensure_standin
from training.evaluate import EVAL_PROMPTS, load_dictionary, sample_quality

CPU_CHOICES = ("none", "4bit", "8bit")  # what bitsandbytes runs on the CPU; fp8 needs CUDA (engine/loading.py)
H100_BANDWIDTH = 3.35e12  # bytes/s
FORWARD_GB = 51.6  # weights a real 26B-A4B decoder forward reads, bf16 (the GPU kit's weight census)
QUANTIZATION_DOC = (
    "Quantization on the CPU, each choice: (1) bytes of the real 26B config by group (meta device); (2) a "
    "full-width build of that config with --layers text layers and random bf16 weights (views of one seeded pool, "
    "the same for every choice), quantized by quantize_model in a fresh process: bytes per layer extrapolated to the "
    "real 30 layers, and one decoder forward's logits against the unquantized model's (mean KL per position, argmax "
    "agreement; float32 arithmetic on the stored weights), then the memory of from_pretrained(device_map='cpu') on a "
    "saved 1.1 GB checkpoint; (3) the embedded model at its recommended settings: dictionary-word rate and tokens "
    "per forward over --prompts of training/evaluate.py's prompts. About 15-30 minutes on a busy 2-core machine.")
STANDIN_DOC = (
    "Per-frame cost of each part the engine adds, on tensors of the real shape ([1 x 256 x 262,144] float32 "
    "logits, a random noise canvas): statistics (the recording sampler against transformers' own and against a "
    "separate log-softmax pass), token strings (512 ids, fresh and warm cache), the host transfer; and the GPU "
    "share of the engine's device work estimated from bytes moved against a real forward (--forward-gb).")
CHAT_REUSE_DOC = (
    "A ChatSession runs --turns user turns (one canvas, --steps steps each); after each turn the conversation it "
    "encoded is also encoded from scratch into a fresh cache (--repeats times, median). One row per turn: prompt "
    "tokens, reused, encoded, prefill seconds with reuse and re-encoding everything, and the session's estimate.")

PARALLEL_DOC = (
    "The same --runs runs (one prompt, seeds 0..runs-1) first in one thread, then shared out over --workers "
    "threads at once, each run computing with --threads torch threads (the server's default: all CPUs but one). "
    "Prints the throughput of each and their ratio, whether every run gave its solo tokens, and, summed over the "
    "threads, where their time went (Linux schedstat): computing, runnable but waiting for a core (other processes "
    "had it), and blocked (waiting for the GIL or another lock; nothing else blocks a run). The load average is "
    "printed before and after.")

REAL_CONFIG = REPO_ROOT / "assets" / "configs" / "diffusiongemma-26B-A4B-it"
TINY_VISION = dict(num_hidden_layers=1)
PROMPT_TOKENS, SEED = 64, 0


def full_width_config(layers: int):
    """The real config with `layers` text layers (the last full attention) and a one-layer vision tower."""

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
    bnb_parametrize = bitsandbytes().nn.parametrize
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

    real = json.loads((REAL_CONFIG / "config.json").read_text())
    text = dict(real["text_config"], num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
                per_layer_config={"01": real["text_config"]["per_layer_config"]["05"]}, num_experts=32,
                vocab_size=65_536)
    vision = dict(real["vision_config"], **TINY_VISION)
    config = DiffusionGemmaConfig(**dict(real, text_config=text, vision_config=vision))
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
            subprocess.run([sys.executable, "-m", "benchmarks.model", "quantization", "--one-choice", quantization,
                            "--layers", str(layers), "--out", str(out)], check=True, cwd=REPO_ROOT)
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


def main_quantization(argv: list[str] | None = None) -> int:
    """`quantization`: bytes and quality of each CPU `--quantization` choice (see QUANTIZATION_DOC)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model quantization", description=QUANTIZATION_DOC)
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
              f"{mapped['peak']['RssAnon']}), file-backed {mapped['before']['RssFile']} -> "
              f"{mapped['after']['RssFile']} MB")
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


def median_ms(function, repeats: int) -> float:
    """Median wall time of `function()` in milliseconds over `repeats` calls (after one untimed call)."""
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 3)


def measure_frame_parts(engine: DiffusionEngine, repeats: int) -> dict:
    """Milliseconds per frame of each part the engine adds, on tensors of the real shape (see the module doc)."""
    model = engine.model
    canvas, vocab = engine.canvas_length, model.config.text_config.vocab_size
    generator = torch.Generator().manual_seed(0)
    logits = 30.0 * torch.tanh(torch.randn(1, canvas, vocab, generator=generator)) / 0.8  # soft-capped, t = 0.8
    current = torch.randint(0, vocab, (1, canvas), generator=generator)
    denoiser = torch.randint(0, vocab, (1, canvas), generator=generator)
    draft = logits.argmax(-1)
    library = model._prepare_sampler(model.generation_config)
    recording = RecordingEntropyBoundSampler.of(library)

    def recorded_frame():
        recording.accept_canvas(current, denoiser, logits, 1)
        return frame_statistics(recording, logits, draft)

    library_accept_ms = median_ms(lambda: library.accept_canvas(current, denoiser, logits, 1), repeats)
    recorded_ms = median_ms(recorded_frame, repeats)
    separate_ms = median_ms(lambda: canvas_statistics(logits[0], draft[0]), repeats)
    confidence, entropy, _, _ = recorded_frame()
    first = torch.full((canvas,), -1, dtype=torch.long)
    transfer_ms = median_ms(lambda: host_lists(current[0], draft[0], recording.accepted_token_mask[0], first,
                                               confidence, entropy), repeats)
    ids = current[0].tolist() + draft[0].tolist()

    def strings(token_text):  # what the engine does per frame
        described = token_text.describe_many(ids)
        return [d[0] for d in described], [d[1] for d in described]

    def single(token_text):  # one lookup per id
        return [token_text(i) for i in ids], [token_text.kind(i) for i in ids]

    cold = {strings: [], single: []}
    for _ in range(3):  # a fresh cache each time: the noise canvas is mostly ids never seen before
        for way in (single, strings):
            token_text = token_text_for(engine.tokenizer, model)
            start = time.thread_time()
            way(token_text)
            cold[way].append(time.thread_time() - start)
    warm_ms = median_ms(lambda: strings(token_text), repeats)
    return {
        "library_accept_ms": library_accept_ms,
        "statistics_ms": round(max(0.0, recorded_ms - library_accept_ms), 3),
        "statistics_separate_pass_ms": separate_ms,
        "token_strings_cold_ms": round(statistics.median(cold[strings]) * 1000, 3),
        "token_strings_cold_single_ms": round(statistics.median(cold[single]) * 1000, 3),
        "token_strings_warm_ms": warm_ms,
        "transfer_ms": transfer_ms,
    }


def gpu_share(canvas: int, vocab: int, forward_gb: float) -> dict:
    """Bytes the engine's own device work moves per frame, and their share of a real forward's (estimated)."""
    element = 4  # float32 logits
    plane = canvas * vocab * element
    # now: gather `canvas` log-probabilities, exp, cast; six [canvas] rows stacked and copied to the host
    recorded = canvas * (element * 4) + 6 * canvas * 8 * 2
    # before: log_softmax (read, write), exp (read, write), multiply (2 reads, write), sum (read), gather
    separate = 8 * plane
    forward = forward_gb * 1e9
    return {
        "forward_gb": forward_gb, "forward_ms_at_h100": round(forward / H100_BANDWIDTH * 1000, 2),
        "engine_bytes_per_frame": recorded, "engine_share": recorded / forward,
        "separate_pass_bytes_per_frame": separate, "separate_pass_share": round(separate / forward, 4),
        "separate_pass_ms_at_h100": round(separate / H100_BANDWIDTH * 1000, 3),
        "held_buffer_bytes": plane,
    }


def standin_report(result: dict) -> str:
    """The `standin` command's lines."""
    f, g = result["frame_parts"], result["gpu_share"]
    return "\n".join([
        f"stand-in: vocabulary {result['vocab']:,}, canvas {result['canvas']}, {result['parameters'] / 1e6:.1f}M "
        f"parameters, {result['threads']} torch threads, CPU",
        "per frame, what the engine adds (ms, median):",
        f"  statistics {f['statistics_ms']:.2f} (the sampler's own acceptance, paid by generate() too: "
        f"{f['library_accept_ms']:.1f}; a separate log-softmax pass would cost {f['statistics_separate_pass_ms']:.1f})",
        f"  token strings {f['token_strings_cold_ms']:.2f} on a fresh cache (one lookup per id: "
        f"{f['token_strings_cold_single_ms']:.2f}), {f['token_strings_warm_ms']:.2f} warm (512 ids, strings and kinds; "
        "CPU ms)",
        f"  transfer {f['transfer_ms']:.3f} (six [256] rows to Python lists, one device-to-host copy)",
        f"GPU share (estimated from bytes moved; a real forward reads {g['forward_gb']} GB, "
        f"{g['forward_ms_at_h100']} ms at 3.35 TB/s):",
        f"  engine device work {g['engine_bytes_per_frame'] / 1e3:.1f} kB per frame = {g['engine_share']:.1e} of a "
        f"forward; the separate pass it replaces: {g['separate_pass_bytes_per_frame'] / 1e9:.2f} GB = "
        f"{g['separate_pass_share'] * 100:.1f}% ({g['separate_pass_ms_at_h100']:.2f} ms at 3.35 TB/s)",
        f"  host work between forwards: token strings + transfer, {f['token_strings_warm_ms'] + f['transfer_ms']:.2f}"
        f" ms warm per frame (beside ~{g['forward_ms_at_h100']} ms of forward)",
    ])


def main_standin(argv: list[str] | None = None) -> int:
    """`standin`: per-frame cost of each part the engine adds, at the real vocabulary and canvas."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model standin", description=STANDIN_DOC)
    parser.add_argument("--repeats", type=int, default=5, help="repeats of each per-frame part")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores but one)")
    parser.add_argument("--forward-gb", type=float, default=FORWARD_GB)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    loaded = load_model(ensure_standin(), device="cpu")
    threads = set_serving_threads(loaded.device, args.threads)
    engine = DiffusionEngine(loaded)
    vocab = engine.model.config.text_config.vocab_size
    result = {
        "vocab": vocab, "canvas": engine.canvas_length, "threads": threads,
        "parameters": sum(p.numel() for p in engine.model.parameters()),
        "frame_parts": measure_frame_parts(engine, args.repeats),
        "gpu_share": gpu_share(engine.canvas_length, vocab, args.forward_gb),
    }
    print(json.dumps(result) if args.json else standin_report(result))
    return 0


PARALLEL_PROMPT = "In the beginning"
TURNS = ["Tell me a story about a lighthouse keeper.", "What happened to the keeper's cat?",
         "Why did the light go out that night?", "Who came to help?", "How did the story end?",
         "Summarize it in one sentence.", "Give the story a title.", "Thank you!"]


def reencode_seconds(engine: DiffusionEngine, ids: list[int], settings, repeats: int) -> float:
    """Median seconds to encode `ids` into a fresh cache (the prefill of a session without reuse)."""
    model = engine.model
    tensor = torch.tensor([ids], dtype=torch.long, device=engine.device)
    times = []
    for _ in range(repeats):
        generation_config, _ = model._prepare_generation_config(None, **settings.generate_kwargs())
        cache = model._prepare_cache_for_generation(generation_config, 1, len(ids) + settings.max_new_tokens)
        start = time.perf_counter()
        with torch.no_grad():
            encode_into_cache(model, cache, tensor)
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main_chat_reuse(argv: list[str] | None = None) -> int:
    """`chat-reuse`: prefill seconds per chat turn with the encoder cache reused against re-encoding."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model chat-reuse", description=CHAT_REUSE_DOC)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    engine = DiffusionEngine(load_model(args.model, device=args.device))
    settings = engine.recommended.replace(max_new_tokens=engine.canvas_length, max_denoising_steps=args.steps)
    session = ChatSession(engine)
    engine.warm_up()
    print(f"model {engine.source}, canvas {engine.canvas_length}, {args.steps} steps, torch threads "
          f"{torch.get_num_threads()}")
    print("turn  prompt  reused  encoded  prefill_reuse_s  prefill_full_s  saved_s  estimated_saved_s")
    for turn, text in enumerate(TURNS[:args.turns], start=1):
        session.reply(text, settings, seed=turn)
        report = session.last_report
        cached = len(session._cache_ids)  # the prefix this turn encoded itself (plus denoise's few tokens)
        full = reencode_seconds(engine, session._cache_ids, settings, args.repeats) if cached else 0.0
        print(f"{turn:>4}  {report.prompt_tokens:>6}  {report.reused_tokens:>6}  {report.encoded_tokens:>7}  "
              f"{report.prefill_s:>15.4f}  {full:>14.4f}  {full - report.prefill_s:>7.4f}  "
              f"{'-' if report.prefill_saved_s is None else f'{report.prefill_saved_s:.4f}':>17}")
    return 0


def thread_seconds() -> tuple[float, float, float | None]:
    """(wall clock, CPU, runnable-but-waiting) seconds of the calling thread (the last None without schedstat)."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as stats:
            cpu_ns, waiting_ns, _ = map(int, stats.read().split())
        return time.perf_counter(), cpu_ns / 1e9, waiting_ns / 1e9
    except (OSError, ValueError):
        return time.perf_counter(), time.thread_time(), None


def parallel_runs(engine: DiffusionEngine, prompt: str, settings, seeds: list[int], workers: int) -> dict:
    """`seeds` runs of `prompt` shared out over `workers` threads at once: wall seconds, runs/s, each seed's token
    ids and the threads' summed `computing_s`, `waiting_s` and `blocked_s` (None without schedstat)."""
    tokens: dict[int, list[int]] = {}
    spent: list[tuple[float, float, float | None]] = []

    def work(share: list[int]) -> None:
        start = thread_seconds()
        for seed in share:
            tokens[seed] = engine.generate(prompt, settings, raw=True, seed=seed).token_ids
        end = thread_seconds()
        waiting = None if start[2] is None else end[2] - start[2]
        spent.append((end[0] - start[0], end[1] - start[1], waiting))

    threads = [threading.Thread(target=work, args=(seeds[i::workers],)) for i in range(workers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    waiting = None if any(w is None for _, _, w in spent) else sum(w for _, _, w in spent)
    computing = sum(c for _, c, _ in spent)
    return {"wall_s": wall, "runs_per_s": len(seeds) / wall, "tokens": tokens, "computing_s": computing,
            "waiting_s": waiting,
            "blocked_s": None if waiting is None else sum(w for w, _, _ in spent) - computing - waiting}


def main_parallel(argv: list[str] | None = None) -> int:
    """`parallel`: runs in threads at once against one thread, and where the threads' time went."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.model parallel", description=PARALLEL_DOC)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="threads at once (default 2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the server's)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=14)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.workers < 1:
        raise SystemExit("error: --runs and --workers must be at least 1")
    engine = DiffusionEngine(load_model(args.model, device="cpu"))
    threads = set_serving_threads(engine.device, args.threads)
    engine.warm_up()
    settings = engine.recommended.replace(max_new_tokens=args.max_new_tokens, max_denoising_steps=args.steps)
    seeds = list(range(args.runs))
    print(f"model {engine.source}, {args.max_new_tokens} tokens, {args.steps} steps, {args.runs} runs, torch threads "
          f"{threads}, CPUs {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}")
    solo = parallel_runs(engine, PARALLEL_PROMPT, settings, seeds, 1)
    together = parallel_runs(engine, PARALLEL_PROMPT, settings, seeds, args.workers)
    print("threads  wall_s  runs_per_s  computing_s  waiting_for_a_core_s  blocked_s")
    for workers, result in ((1, solo), (args.workers, together)):
        shown = [f"{result[key]:>{width}.2f}" if result[key] is not None else f"{'-':>{width}}"
                 for key, width in (("computing_s", 11), ("waiting_s", 20), ("blocked_s", 9))]
        print(f"{workers:>7}  {result['wall_s']:>6.1f}  {result['runs_per_s']:>10.3f}  {'  '.join(shown)}")
    print(f"throughput {args.workers} threads / 1: {together['runs_per_s'] / solo['runs_per_s']:.2f}x; every run "
          f"gave its solo tokens: {together['tokens'] == solo['tokens']}; load average {os.getloadavg()[0]:.2f}")
    return 0 if together["tokens"] == solo["tokens"] else 1


COMMANDS = {"quantization": main_quantization, "standin": main_standin, "chat-reuse": main_chat_reuse,
            "parallel": main_parallel}


def main(argv: list[str] | None = None) -> int:
    """Run one command (`COMMANDS`) with the rest of `argv` (`bench.run_command`)."""
    return run_command(COMMANDS, "python -m benchmarks.model", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())

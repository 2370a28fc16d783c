"""What the engine costs on top of bare `model.generate()` at the real vocabulary and canvas, on the stand-in.

    python benchmarks/standin_cost.py [--runs 5] [--steps 3] [--threads N] [--json]

The stand-in for google/diffusiongemma-26B-A4B-it (`standin/`: the real layout, vocabulary 262,144, canvas 256,
random weights) is loaded on the CPU. Then:

1. **Engine / bare ratio**: the same run (`--steps` denoising steps, one 256-token canvas, raw prompt, the
   checkpoint's other settings), bare `torch.manual_seed(s); model.generate(...)` against consuming every frame of
   `DiffusionEngine.frames()`, interleaved over `--runs` seeds after one warm-up each (benchmarks/bench.py's
   `interleave`); ratios are taken run by run, on wall time and on CPU time (CPU time barely moves when other
   programs compete for the cores). Tokens are checked identical.
2. **Per-frame cost** of what the engine adds to a decoder forward, each part timed alone (median of repeats) on
   tensors of the real shape ([1 x 256 x 262,144] float32 logits, a uniformly random noise canvas):
   statistics (confidence and entropy per position: what the recording sampler adds to transformers' sampler, and
   for comparison the earlier separate log-softmax pass), token strings (display string and kind of the 512 input
   and draft ids, on a fresh cache and on a warm one) and transfer (the per-position tensors to Python lists).
3. **GPU share**, estimated from bytes moved: the engine's own device work per frame against the weights a real
   H100 forward reads (about 51.6 GB, `--forward-gb`: about 15 ms at 3.35 TB/s). Host-side work (token strings,
   lists) is given in ms beside it: on a GPU it runs between forwards unless overlapped.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench.py, beside this script

from bench import interleave, ratio, run_bare, run_engine, same_tokens, spread  # noqa: E402
from engine import DiffusionEngine, load_model  # noqa: E402
from engine.generator import host_lists  # noqa: E402
from engine.loading import set_serving_threads  # noqa: E402
from engine.sampling import RecordingEntropyBoundSampler, canvas_statistics, frame_statistics  # noqa: E402
from engine.tokens import token_text_for  # noqa: E402
from standin import ensure_standin  # noqa: E402

PROMPT = "In the beginning"
H100_BANDWIDTH = 3.35e12  # bytes/s
FORWARD_GB = 51.6  # weights a real 26B-A4B decoder forward reads, bf16 (benchmarks/gpu/steps.py's census)


def median_ms(function, repeats: int) -> float:
    """Median wall time of `function()` in milliseconds over `repeats` calls (after one untimed call)."""
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 3)


def measure_ratio(engine: DiffusionEngine, steps: int, runs: int) -> dict:
    """Engine / bare on wall and CPU time over `runs` seeds (same settings, one canvas, `steps` forwards)."""
    settings = engine.recommended.replace(max_denoising_steps=steps, max_new_tokens=engine.canvas_length)
    input_ids = engine.encode_prompt(PROMPT, raw=True)

    def logged(name, run):
        def timed(seed):
            done = run(seed)
            print(f"  {name} seed {seed}: {done.seconds:.2f} s wall, {done.cpu_seconds:.2f} s CPU", file=sys.stderr,
                  flush=True)
            return done
        return timed

    result = interleave({
        "bare": logged("bare", lambda seed: run_bare(engine, input_ids, settings, seed)),
        "engine": logged("engine", lambda seed: run_engine(engine, PROMPT, settings, seed, True)),
    }, tuple(range(runs)), 1)
    return {
        "runs": runs, "steps": steps, "forwards": [r.forwards for r in result["engine"]],
        "same_tokens": same_tokens(result["bare"], result["engine"]),
        "bare_seconds": spread([r.seconds for r in result["bare"]], 3),
        "engine_seconds": spread([r.seconds for r in result["engine"]], 3),
        "wall_ratio": ratio(result["engine"], result["bare"]),
        "cpu_ratio": ratio(result["engine"], result["bare"], clock="cpu_seconds"),
        "wall_ratios": [round(e.seconds / b.seconds, 4) for e, b in zip(result["engine"], result["bare"])],
    }


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
    confidence, entropy = recorded_frame()
    first = torch.full((canvas,), -1, dtype=torch.long)
    transfer_ms = median_ms(lambda: host_lists(current[0], draft[0], recording.accepted_token_mask[0], first,
                                               confidence, entropy), repeats)
    ids = current[0].tolist() + draft[0].tolist()

    def strings(token_text):
        return [token_text(i) for i in ids], [token_text.kind(i) for i in ids]

    cold = []
    for _ in range(3):  # a fresh cache each time: the noise canvas is mostly ids never seen before
        token_text = token_text_for(engine.tokenizer, model)
        start = time.perf_counter()
        strings(token_text)
        cold.append(time.perf_counter() - start)
    warm_ms = median_ms(lambda: strings(token_text), repeats)
    return {
        "library_accept_ms": library_accept_ms,
        "statistics_ms": round(max(0.0, recorded_ms - library_accept_ms), 3),
        "statistics_separate_pass_ms": separate_ms,
        "token_strings_cold_ms": round(statistics.median(cold) * 1000, 3),
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


def report(result: dict) -> str:
    r, f, g = result["ratio"], result["frame_parts"], result["gpu_share"]
    return "\n".join([
        f"stand-in: vocabulary {result['vocab']:,}, canvas {result['canvas']}, {result['parameters'] / 1e6:.1f}M "
        f"parameters, {result['threads']} torch threads, CPU",
        f"engine / bare generate(), {r['steps']} steps, {r['runs']} runs (forwards {r['forwards']}, same tokens "
        f"{r['same_tokens']}):",
        f"  wall {r['wall_ratio']['median']:.3f}x [{r['wall_ratio']['min']:.3f}..{r['wall_ratio']['max']:.3f}] "
        f"(run by run {r['wall_ratios']}); CPU time {r['cpu_ratio']['median']:.3f}x "
        f"[{r['cpu_ratio']['min']:.3f}..{r['cpu_ratio']['max']:.3f}]",
        f"  bare {r['bare_seconds']['median']:.2f} s [{r['bare_seconds']['min']:.2f}..{r['bare_seconds']['max']:.2f}], "
        f"engine {r['engine_seconds']['median']:.2f} s [{r['engine_seconds']['min']:.2f}..{r['engine_seconds']['max']:.2f}]",
        "per frame, what the engine adds (ms, median):",
        f"  statistics {f['statistics_ms']:.2f} (the sampler's own acceptance, paid by generate() too: "
        f"{f['library_accept_ms']:.1f}; a separate log-softmax pass would cost {f['statistics_separate_pass_ms']:.1f})",
        f"  token strings {f['token_strings_cold_ms']:.2f} on a fresh cache, {f['token_strings_warm_ms']:.2f} warm "
        f"(512 ids, strings and kinds)",
        f"  transfer {f['transfer_ms']:.3f} (six [256] rows to Python lists, one device-to-host copy)",
        f"GPU share (estimated from bytes moved; a real forward reads {g['forward_gb']} GB, "
        f"{g['forward_ms_at_h100']} ms at 3.35 TB/s):",
        f"  engine device work {g['engine_bytes_per_frame'] / 1e3:.1f} kB per frame = {g['engine_share']:.1e} of a "
        f"forward; the separate pass it replaces: {g['separate_pass_bytes_per_frame'] / 1e9:.2f} GB = "
        f"{g['separate_pass_share'] * 100:.1f}% ({g['separate_pass_ms_at_h100']:.2f} ms at 3.35 TB/s)",
        f"  host work between forwards: token strings + transfer, {f['token_strings_warm_ms'] + f['transfer_ms']:.2f}"
        f" ms warm per frame (beside ~{g['forward_ms_at_h100']} ms of forward)",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="seeds for the engine / bare ratio")
    parser.add_argument("--steps", type=int, default=3, help="denoising steps per run (one canvas)")
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
        "ratio": measure_ratio(engine, args.steps, args.runs),
        "frame_parts": measure_frame_parts(engine, args.repeats),
        "gpu_share": gpu_share(engine.canvas_length, vocab, args.forward_gb),
    }
    print(json.dumps(result) if args.json else report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

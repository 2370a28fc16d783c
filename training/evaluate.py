"""Evaluate diffgemma-tiny: validation losses, sample quality on unseen prompts, denoising, speed against AR, pads.

Figures printed (and written as JSON with `--json-out`):
- validation denoising cross-entropy (nats/token) at fixed corruption t = 0.25, 0.5, 0.75 (no self-conditioning,
  as at a canvas's first step), encoder next-token perplexity, and the unigram baseline's cross-entropy/perplexity
  (token frequencies of training canvases, add-one smoothed); the denoising CE scores text positions only (canvas
  tokens up to and including the text's end token), which v1 and v2 share: v2 fills a canvas after the end with the
  end token, v1 with `<pad>`;
- on `EVAL_PROMPTS` (20 prompts, none of which occurs in the training text: checked at start, seed = prompt index) at
  the checkpoint's recommended settings: share of generated words found in Debian wamerican's /usr/share/dict/words
  (case-insensitive, punctuation stripped), distinct-2 (distinct word bigrams / all word bigrams over all samples, as
  in Li et al. 2016; also the per-sample mean), decoder forwards per canvas, tokens per forward (non-pad generated
  tokens / decoder forwards, as `generate()` counts them), `<pad>` written as content, answers ended by an EOS id;
- speed on this machine: diffusion tokens/s against greedy autoregressive decoding with the same weights
  (`engine.autoregressive.AutoregressiveDecoder.from_diffusion`: the causal encoder, one forward per token) on the
  same prompts and token budget, prompts alternating which side runs first; peak RSS;
- a low-temperature sweep (`TEMPERATURES`, every fourth prompt): `<pad>` written as content and EOS endings.

Run: `python -m training.evaluate --model assets/models/diffgemma-tiny` (`--sweep` compares sampler settings on
`DEV_PROMPTS`, `--canvas-costs` times decoder forwards at canvas 32..256).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import resource
from pathlib import Path

import torch

from engine.autoregressive import AutoregressiveDecoder
from engine.engine import DiffusionEngine
from engine.loading import DEFAULT_MODEL, load_model
from .data import ExampleSampler
from .model_config import PAD_ID
from .train import losses

DICTIONARY = Path("/usr/share/dict/words")
# (prompt, raw): raw prompts are continued as text, the others go through the chat template. None occurs in the
# training text (`unseen_check`); v1's card used prompts quoted from the Bible instead.
EVAL_PROMPTS = [
    ("The shepherd counted his sheep", True),
    ("In the days of the old king", True),
    ("The river ran past the city", True),
    ("When the morning came, the women", True),
    ("A stranger came to the gate and", True),
    ("The children of the village", True),
    ("After the harvest, the farmers", True),
    ("The lamp burned all night while", True),
    ("At the edge of the desert", True),
    ("The merchant sold his", True),
    ("Tell me about the sea.", False),
    ("Who built the first city?", False),
    ("Write a blessing for a journey.", False),
    ("What is wisdom?", False),
    ("Describe a storm at night.", False),
    ("Give me advice about anger.", False),
    ("Why do people pray?", False),
    ("What happened at the river?", False),
    ("Tell a story about a lost sheep.", False),
    ("What should a king do?", False),
]
# Sampler settings are chosen on these (`--sweep`), never on EVAL_PROMPTS, so the card's figures are not tuned to the
# prompts they are measured on; none occurs in the training text either.
DEV_PROMPTS = [
    ("The old woman climbed the hill", True),
    ("Before the rain, the birds", True),
    ("The soldiers waited by the wall", True),
    ("On the third night the boy", True),
    ("The fisherman mended his net and", True),
    ("Under the great tree the elders", True),
    ("The bread was warm when", True),
    ("Across the valley a voice", True),
    ("The prince returned from the war", True),
    ("Her brother kept the keys of", True),
    ("Tell me about the mountains.", False),
    ("Who was the first shepherd?", False),
    ("Write a prayer for the sick.", False),
    ("What is mercy?", False),
    ("Describe a city in the morning.", False),
    ("Give me advice about money.", False),
    ("Why do rivers flood?", False),
    ("What happened on the mountain?", False),
    ("Tell a story about a brave girl.", False),
    ("What should a judge do?", False),
]
# (t_min, t_max) of the low-temperature sweep; v1 wrote whole canvases of <pad> at the coldest of these
TEMPERATURES = [(0.01, 0.02), (0.05, 0.1), (0.1, 0.2), (0.2, 0.4)]
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")


def unseen_check(prompts, corpus_dir: Path) -> list[str]:
    """Prompts of `prompts` whose text (final punctuation dropped, case-insensitive) occurs in the training split."""
    with open(corpus_dir / "train.jsonl", encoding="utf-8") as f:
        text = " ".join(" ".join(json.loads(line)["verses"]) for line in f).lower()
    return [p for p, _ in prompts if p.lower().rstrip(".?!") in text]


def load_dictionary(path: Path = DICTIONARY) -> set[str]:
    """Lower-cased words of Debian's wamerican list, possessive `'s` entries included."""
    return {line.strip().lower() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()}


def words_of(text: str) -> list[str]:
    """Lower-cased words of `text` with punctuation stripped (digits and symbols dropped)."""
    return [w.lower() for w in _WORD.findall(text)]


def dictionary_rate(texts: list[str], dictionary: set[str]) -> float:
    """Share of words across `texts` found in `dictionary` (0..1)."""
    words = [w for t in texts for w in words_of(t)]
    return sum(w in dictionary for w in words) / max(1, len(words))


def distinct_2(texts: list[str]) -> tuple[float, float]:
    """(distinct word bigrams / word bigrams over all texts, mean of the same ratio per text)."""
    all_bigrams, per_text = [], []
    for text in texts:
        w = words_of(text)
        bigrams = list(zip(w, w[1:]))
        all_bigrams += bigrams
        if bigrams:
            per_text.append(len(set(bigrams)) / len(bigrams))
    corpus = len(set(all_bigrams)) / max(1, len(all_bigrams))
    return corpus, sum(per_text) / max(1, len(per_text))


@torch.no_grad()
def validation_losses(model, tokenizer, corpus_dir: Path, batches: int = 40, batch_size: int = 16,
                      after_end: str = "end") -> dict:
    """Validation denoising CE at t in {0.25, 0.5, 0.75}, encoder CE/perplexity, and the unigram baseline.

    The denoising CE is scored on text positions only (canvas tokens up to and including a text's end token): what
    fills a canvas after the end differs between v1 (`<pad>`) and v2 (the end token), the text does not. The corrupted
    canvas the model reads is filled after the end as the model was trained (`after_end`, see `training.data`), with
    the same corruption draws either way. The unigram baseline counts the same positions of training canvases."""
    canvas_length = model.config.canvas_length
    vocab = model.config.text_config.vocab_size
    train = ExampleSampler(tokenizer, corpus_dir / "train.jsonl", canvas_length, 96, seed=0, after_end="pad")
    counts = torch.ones(vocab)
    for _ in range(400):
        canvas = train.batch(16).canvas.flatten()
        counts += torch.bincount(canvas[canvas != PAD_ID], minlength=vocab)[:vocab]
    unigram_log_probs = (counts / counts.sum()).log()

    model.eval()
    results = {}
    for t in (0.25, 0.5, 0.75):
        val = ExampleSampler(tokenizer, corpus_dir / "val.jsonl", canvas_length, 96, seed=1, after_end="pad")
        generator = torch.Generator().manual_seed(1)
        diff_total, enc_total, unigram_total = 0.0, 0.0, 0.0
        for _ in range(batches):
            batch = val.batch(batch_size)
            replace = torch.rand(batch.canvas.shape, generator=generator) < t
            noise = torch.randint(0, vocab, batch.canvas.shape, generator=generator)
            clean = batch.canvas
            if after_end == "end":  # fill after the end token with that token, as v2 was trained
                ends = clean.gather(1, (clean != PAD_ID).sum(1, keepdim=True) - 1)
                clean = torch.where(clean == PAD_ID, ends, clean)
            noisy = torch.where(replace, noise, clean)
            diffusion_ce, encoder_ce = losses(model, batch, noisy, None, ignore_pad=True)
            diff_total += diffusion_ce.item()
            enc_total += encoder_ce.item()
            text = batch.canvas[batch.canvas != PAD_ID]
            unigram_total += -unigram_log_probs[text].mean().item()
        results[f"diffusion_ce_t{t}"] = diff_total / batches
        results["encoder_ce"] = enc_total / batches
        results["unigram_ce"] = unigram_total / batches
    results["encoder_perplexity"] = math.exp(results["encoder_ce"])
    results["unigram_perplexity"] = math.exp(results["unigram_ce"])
    return results


def sample_quality(engine: DiffusionEngine, settings, dictionary: set[str], prompts=EVAL_PROMPTS) -> dict:
    """Generate for every prompt of `prompts` (seed = index); measure words, diversity, denoising, pads and speed.

    `pads_as_content` counts `<pad>` ids among the generated tokens (the engine drops the pads `generate()` writes
    after an EOS, so any left were written by the model mid-answer); `eos_endings` counts answers that stopped at an
    EOS id rather than at `max_new_tokens`."""
    texts, samples, forwards, tokens, seconds, canvases, pads, eos = [], [], 0, 0, 0.0, 0, 0, 0
    pad_id = engine.model.generation_config.pad_token_id
    for seed, (prompt, raw) in enumerate(prompts):
        result = engine.generate(prompt, settings, raw=raw, seed=seed)
        texts.append(result.text)
        samples.append({"prompt": prompt, "raw": raw, "seed": seed, "text": result.text, "tokens": result.tokens,
                        "forwards_per_block": list(result.forwards_per_block), "stop_reason": result.stop_reason})
        forwards += result.forwards
        canvases += len(result.forwards_per_block)
        tokens += result.tokens
        seconds += result.seconds
        pads += sum(t == pad_id for t in result.token_ids)
        eos += result.stop_reason == "eos"
    corpus_d2, mean_d2 = distinct_2(texts)
    return {
        "dictionary_word_rate": dictionary_rate(texts, dictionary),
        "distinct_2": corpus_d2,
        "distinct_2_per_sample": mean_d2,
        "mean_forwards_per_canvas": forwards / canvases,
        "max_denoising_steps": settings.max_denoising_steps,
        "tokens_per_second": tokens / seconds,
        "tokens_per_forward": tokens / forwards,
        "mean_generated_tokens": tokens / len(prompts),
        "mean_seconds_per_answer": seconds / len(prompts),
        "pads_as_content": pads,
        "eos_endings": eos,
        "answers": len(prompts),
        "samples": samples,
    }


def speed_against_ar(engine: DiffusionEngine, settings, prompts=EVAL_PROMPTS[::2]) -> dict:
    """Diffusion tokens/s against greedy same-weights autoregressive tokens/s on `prompts`, same token budget.

    Both sides are warmed up first; each prompt runs both sides, alternating which goes first. Tokens/s of a side =
    all its non-pad generated tokens (up to and including EOS) / all its seconds (prefill included)."""
    ar = AutoregressiveDecoder.from_diffusion(engine)
    ar.warm_up()
    engine.generate("Warm-up.", settings.replace(max_new_tokens=engine.canvas_length), raw=True, seed=0)
    totals = {"diffusion": [0, 0.0], "autoregressive": [0, 0.0]}
    for seed, (prompt, raw) in enumerate(prompts):
        for side in (("diffusion", "autoregressive") if seed % 2 == 0 else ("autoregressive", "diffusion")):
            if side == "diffusion":
                result = engine.generate(prompt, settings, raw=raw, seed=seed)
                tokens, seconds = result.tokens, result.seconds
            else:
                last = None
                for last in ar.frames(prompt, settings.max_new_tokens, raw=raw, temperature=0.0, seed=seed):
                    pass
                tokens, seconds = last.committed_tokens, last.elapsed_s
            totals[side][0] += tokens
            totals[side][1] += seconds
    diffusion, autoregressive = (totals[s][0] / totals[s][1] for s in ("diffusion", "autoregressive"))
    return {"diffusion_tokens_per_second": diffusion, "ar_tokens_per_second": autoregressive,
            "diffusion_over_ar": diffusion / autoregressive,
            "diffusion_tokens": totals["diffusion"][0], "ar_tokens": totals["autoregressive"][0]}


def temperature_sweep(engine: DiffusionEngine, dictionary: set[str], prompts=EVAL_PROMPTS[::4],
                      max_new_tokens: int = 128) -> list[dict]:
    """At each (t_min, t_max) of `TEMPERATURES` (other settings recommended, `max_new_tokens` at most): pads written
    as content, EOS endings, dictionary words, forwards per canvas."""
    rows = []
    for t_min, t_max in TEMPERATURES:
        settings = engine.recommended.replace(t_min=t_min, t_max=t_max, max_new_tokens=max_new_tokens)
        q = sample_quality(engine, settings, dictionary, prompts)
        rows.append({"t_min": t_min, "t_max": t_max, **{k: q[k] for k in (
            "pads_as_content", "eos_endings", "answers", "dictionary_word_rate", "mean_forwards_per_canvas",
            "mean_generated_tokens")}})
    return rows


def reference_dictionary_rate(corpus_dir: Path, dictionary: set[str]) -> float:
    """Dictionary-word rate of the real validation text (the ceiling a Bible-trained model can reach)."""
    with open(corpus_dir / "val.jsonl", encoding="utf-8") as f:
        texts = [" ".join(json.loads(line)["verses"]) for line in f]
    return dictionary_rate(texts, dictionary)


def canvas_length_costs(lengths=(32, 64, 128, 256), steps: int = 8, repeats: int = 3) -> list[dict]:
    """Seconds per decoder forward of the diffgemma-tiny architecture (random weights) at each canvas length.

    Each measurement is one block of `steps` forwards (adaptive stopping off) after a 32-token prompt; the median of
    `repeats` runs after a warm-up. The per-token cost tells which canvas keeps a CPU answer within seconds.
    """
    import statistics
    import time

    from transformers import DiffusionGemmaForBlockDiffusion

    from engine.settings import DiffusionSettings
    from .model_config import tiny_config

    rows = []
    for length in lengths:
        model = DiffusionGemmaForBlockDiffusion(tiny_config(canvas_length=length)).eval()
        kwargs = DiffusionSettings(max_new_tokens=length, max_denoising_steps=steps, adaptive_stopping=False).generate_kwargs()
        ids = torch.randint(5, 4096, (1, 32))
        times = []
        for run in range(repeats + 1):
            start = time.perf_counter()
            model.generate(ids, **kwargs)
            if run:
                times.append((time.perf_counter() - start) / steps)
        per_forward = statistics.median(times)
        rows.append({"canvas_length": length, "ms_per_forward": per_forward * 1000,
                     "ms_per_forward_per_position": per_forward * 1000 / length})
    return rows


# Changes to the recommended settings compared by `--sweep`
SWEEP = [
    {},
    {"entropy_bound": 1.0},
    {"entropy_bound": 4.0},
    {"max_denoising_steps": 12},
    {"t_min": 0.1, "t_max": 0.3},
    {"t_min": 0.3, "t_max": 0.8},
    {"confidence_threshold": 0.2},
    {"entropy_bound": 0.5, "max_denoising_steps": 32, "t_min": 0.4, "t_max": 0.8},  # v1's shipped settings
]
# Colder schedules (`--sweep cold`): colder sampling writes more dictionary words and fewer distinct bigrams; this
# measures both, with forwards, from t 0.1 -> 0.05 (v2 of 30 November) to colder schedules and lower bounds.
COLD_SWEEP = [
    {"t_min": 0.05, "t_max": 0.1, "entropy_bound": 2.0},
    {"t_min": 0.02, "t_max": 0.05, "entropy_bound": 2.0},
    {"t_min": 0.01, "t_max": 0.03, "entropy_bound": 2.0},
    {"t_min": 0.02, "t_max": 0.05, "entropy_bound": 1.0},
    {"t_min": 0.02, "t_max": 0.05, "entropy_bound": 0.5},
    {"t_min": 0.03, "t_max": 0.07, "entropy_bound": 1.0},
    {"t_min": 0.05, "t_max": 0.1, "entropy_bound": 1.0},
    {"t_min": 0.05, "t_max": 0.1, "entropy_bound": 0.5},
]


def print_sweep(engine: DiffusionEngine, dictionary: set[str], sweep: list[dict] = SWEEP) -> None:
    """Print a sweep table (`SWEEP` or `COLD_SWEEP`: changes to the recommended settings, one row each) on
    `DEV_PROMPTS`, at the recommended token budget, as the card measures."""
    print(f"{'changes':<50} {'dict':>6} {'d2':>6} {'fwd/canvas':>10} {'TPF':>6} {'tok/s':>7} {'pads':>5} {'EOS':>4}")
    for changes in sweep:
        settings = engine.recommended.replace(**changes)
        q = sample_quality(engine, settings, dictionary, DEV_PROMPTS)
        print(f"{json.dumps(changes):<50} {q['dictionary_word_rate']:6.3f} {q['distinct_2']:6.3f} "
              f"{q['mean_forwards_per_canvas']:10.1f} {q['tokens_per_forward']:6.2f} {q['tokens_per_second']:7.1f} "
              f"{q['pads_as_content']:5d} {q['eos_endings']:4d}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--after-end", choices=("end", "pad"), default="end",
                        help="what the model was trained to read after a text's end (v1: pad)")
    parser.add_argument("--sweep", nargs="?", const="wide", choices=("wide", "cold"),
                        help="compare sampling settings on every other prompt (wide: SWEEP, cold: COLD_SWEEP)")
    parser.add_argument("--canvas-costs", action="store_true", help="time decoder forwards at canvas 32..256")
    parser.add_argument("--validation-only", action="store_true", help="only the validation losses")
    parser.add_argument("--batches", type=int, default=20, help="validation batches of 16 per noise level")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if args.canvas_costs:
        for row in canvas_length_costs():
            print(f"canvas {row['canvas_length']:4d}: {row['ms_per_forward']:6.1f} ms per decoder forward, "
                  f"{row['ms_per_forward_per_position']:.3f} ms per canvas position")
        return
    seen = unseen_check(EVAL_PROMPTS + DEV_PROMPTS, args.corpus)
    if seen:
        raise SystemExit(f"evaluation prompts found in the training text: {seen}")
    engine = DiffusionEngine(load_model(args.model, device="cpu"))
    dictionary = load_dictionary()
    if args.sweep:
        print_sweep(engine, dictionary, sweep=COLD_SWEEP if args.sweep == "cold" else SWEEP)
        return

    report = {"model": args.model, "settings": engine.recommended.__dict__}
    report["validation"] = validation_losses(
        engine.model, engine.tokenizer, args.corpus, batches=args.batches, after_end=args.after_end
    )
    v = report["validation"]
    print("validation (World English Bible held-out chapters; denoising CE on text positions):")
    for t in (0.25, 0.5, 0.75):
        print(f"  denoising CE at t={t}: {v[f'diffusion_ce_t{t}']:.3f} nats/token (unigram baseline {v['unigram_ce']:.3f})")
    print(f"  encoder next-token perplexity: {v['encoder_perplexity']:.1f} (unigram baseline {v['unigram_perplexity']:.1f})")
    if args.validation_only:
        return
    report["reference_dictionary_word_rate"] = reference_dictionary_rate(args.corpus, dictionary)
    report["quality"] = q = sample_quality(engine, engine.recommended, dictionary)
    print(f"samples on {len(EVAL_PROMPTS)} prompts not in the training text, recommended settings:")
    print(f"  dictionary words: {q['dictionary_word_rate']:.1%} (real validation text: "
          f"{report['reference_dictionary_word_rate']:.1%})")
    print(f"  distinct-2: {q['distinct_2']:.3f} over all samples, {q['distinct_2_per_sample']:.3f} per sample")
    print(f"  decoder forwards per canvas: {q['mean_forwards_per_canvas']:.1f} of at most {q['max_denoising_steps']}; "
          f"{q['tokens_per_forward']:.2f} tokens per forward; {q['mean_generated_tokens']:.0f} tokens per answer")
    print(f"  <pad> written as content: {q['pads_as_content']}; answers ended by EOS: {q['eos_endings']}/{q['answers']}")
    report["speed"] = s = speed_against_ar(engine, engine.recommended)
    print(f"speed on this machine ({len(EVAL_PROMPTS[::2])} prompts): diffusion {s['diffusion_tokens_per_second']:.1f} tokens/s, same-weights greedy AR "
          f"{s['ar_tokens_per_second']:.1f} tokens/s: {s['diffusion_over_ar']:.2f}x")
    report["temperature_sweep"] = rows = temperature_sweep(engine, dictionary)
    print("low-temperature sweep (5 prompts, at most 128 tokens):")
    for row in rows:
        print(f"  t {row['t_max']} -> {row['t_min']}: <pad> as content {row['pads_as_content']}, EOS endings "
              f"{row['eos_endings']}/{row['answers']}, dictionary words {row['dictionary_word_rate']:.1%}, "
              f"{row['mean_forwards_per_canvas']:.1f} forwards per canvas, {row['mean_generated_tokens']:.0f} tokens")
    report["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {report['peak_rss_mib']:.0f} MiB")
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()

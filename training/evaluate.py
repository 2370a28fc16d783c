"""Evaluate diffgemma-tiny: validation losses against a unigram baseline, sample quality, denoising and speed.

Figures printed (and written as JSON with `--json-out`):
- validation denoising cross-entropy (nats/token) at fixed corruption t = 0.25, 0.5, 0.75 (no self-conditioning,
  as at a canvas's first step), encoder next-token perplexity, and the unigram baseline's cross-entropy/perplexity
  (token frequencies of training canvases, pads included, add-one smoothed);
- on `EVAL_PROMPTS` (20 fixed prompts, seed = prompt index) at the shipped settings: share of generated words found in
  Debian wamerican's /usr/share/dict/words (case-insensitive, punctuation stripped), distinct-2 (distinct word bigrams
  / all word bigrams, over all samples, as in Li et al. 2016; also the per-sample mean), mean decoder forwards per
  canvas against the maximum, and the same dictionary rate for real validation text as a reference;
- speed on this machine: tokens/s, tokens per forward, peak RSS.

Run: `python -m training.evaluate --model assets/models/diffgemma-tiny` (`--sweep` compares settings).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import resource
from pathlib import Path

import torch

from engine.engine import DiffusionEngine
from engine.loading import DEFAULT_MODEL, load_model
from .data import ExampleSampler
from .train import losses

DICTIONARY = Path("/usr/share/dict/words")
EVAL_PROMPTS = [
    ("In the beginning", True),
    ("The Lord is my shepherd", True),
    ("Blessed are the", True),
    ("And God said", True),
    ("Then Jesus said to his disciples", True),
    ("The king of Israel", True),
    ("Now the serpent was", True),
    ("Hear, O Israel", True),
    ("Love is patient and kind", True),
    ("A wise son makes", True),
    ("Tell me about David.", False),
    ("Who was Moses?", False),
    ("Sing a song of praise.", False),
    ("What is love?", False),
    ("Continue: And the earth was without form", False),
    ("Write a prayer for the morning.", False),
    ("Give me a proverb about wisdom.", False),
    ("The people of Israel cried out to the Lord.", False),
    ("Describe the city of Jerusalem.", False),
    ("What did the prophet say?", False),
]
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")


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
def validation_losses(model, tokenizer, corpus_dir: Path, batches: int = 40, batch_size: int = 16) -> dict:
    """Validation denoising CE at t in {0.25, 0.5, 0.75}, encoder CE/perplexity, and the unigram baseline."""
    canvas_length = model.config.canvas_length
    vocab = model.config.text_config.vocab_size
    # Unigram baseline over the same kind of positions the model is scored on: training canvases, pads included
    train = ExampleSampler(tokenizer, corpus_dir / "train.jsonl", canvas_length, 96, seed=0)
    counts = torch.ones(vocab)
    for _ in range(400):
        counts += torch.bincount(train.batch(16).canvas.flatten(), minlength=vocab)[:vocab]
    unigram_log_probs = (counts / counts.sum()).log()

    model.eval()
    results = {}
    for t in (0.25, 0.5, 0.75):
        val = ExampleSampler(tokenizer, corpus_dir / "val.jsonl", canvas_length, 96, seed=1)
        generator = torch.Generator().manual_seed(1)
        diff_total, enc_total, unigram_total = 0.0, 0.0, 0.0
        for _ in range(batches):
            batch = val.batch(batch_size)
            replace = torch.rand(batch.canvas.shape, generator=generator) < t
            noise = torch.randint(0, vocab, batch.canvas.shape, generator=generator)
            noisy = torch.where(replace, noise, batch.canvas)
            diffusion_ce, encoder_ce = losses(model, batch, noisy, None)
            diff_total += diffusion_ce.item()
            enc_total += encoder_ce.item()
            unigram_total += -unigram_log_probs[batch.canvas].mean().item()
        results[f"diffusion_ce_t{t}"] = diff_total / batches
        results["encoder_ce"] = enc_total / batches
        results["unigram_ce"] = unigram_total / batches
    results["encoder_perplexity"] = math.exp(results["encoder_ce"])
    results["unigram_perplexity"] = math.exp(results["unigram_ce"])
    return results


def sample_quality(engine: DiffusionEngine, settings, dictionary: set[str], prompts=EVAL_PROMPTS) -> dict:
    """Generate for every prompt of `prompts` (seed = index) and measure words, diversity, denoising and speed."""
    texts, samples, forwards, tokens, seconds, canvases = [], [], 0, 0, 0.0, 0
    for seed, (prompt, raw) in enumerate(prompts):
        result = engine.generate(prompt, settings, raw=raw, seed=seed)
        texts.append(result.text)
        samples.append({"prompt": prompt, "raw": raw, "seed": seed, "text": result.text,
                        "tokens_per_forward": round(result.tokens_per_forward, 2)})
        forwards += result.forwards
        canvases += len(result.forwards_per_block)
        tokens += sum(1 for t in result.token_ids if t != engine.model.generation_config.pad_token_id)
        seconds += result.seconds
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
        "samples": samples,
    }


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
    from engine.settings import DiffusionSettings
    from .model_config import tiny_config
    from transformers import DiffusionGemmaForBlockDiffusion
    import statistics
    import time

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


SWEEP = [
    {},
    {"t_min": 0.2, "t_max": 0.5},
    {"entropy_bound": 0.1},
    {"entropy_bound": 0.1, "t_min": 0.2, "t_max": 0.5},
    {"confidence_threshold": 0.3},  # adaptive stopping that a small model can reach
    {"confidence_threshold": 0.3, "entropy_bound": 1.0},
    {"entropy_bound": 2.5, "max_denoising_steps": 10},  # the "fast" preset
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--sweep", action="store_true", help="compare sampling settings on every other prompt")
    parser.add_argument("--canvas-costs", action="store_true", help="time decoder forwards at canvas 32..256")
    parser.add_argument("--validation-only", action="store_true", help="only the validation losses")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if args.canvas_costs:
        for row in canvas_length_costs():
            print(f"canvas {row['canvas_length']:4d}: {row['ms_per_forward']:6.1f} ms per decoder forward, "
                  f"{row['ms_per_forward_per_position']:.3f} ms per canvas position")
        return
    engine = DiffusionEngine(load_model(args.model, device="cpu"))
    dictionary = load_dictionary()

    if args.sweep:
        print(f"{'changes':<60} {'dict':>6} {'d2':>6} {'fwd/canvas':>10} {'TPF':>6} {'tok/s':>7}")
        for changes in SWEEP:
            q = sample_quality(engine, engine.recommended.replace(**changes), dictionary, EVAL_PROMPTS[::2])
            print(f"{json.dumps(changes):<60} {q['dictionary_word_rate']:6.3f} {q['distinct_2']:6.3f} "
                  f"{q['mean_forwards_per_canvas']:10.1f} {q['tokens_per_forward']:6.2f} {q['tokens_per_second']:7.1f}")
        return

    report = {"settings": engine.recommended.__dict__}
    report["validation"] = validation_losses(engine.model, engine.tokenizer, args.corpus)
    if args.validation_only:
        print(json.dumps(report["validation"], indent=1))
        return
    report["reference_dictionary_word_rate"] = reference_dictionary_rate(args.corpus, dictionary)
    report["quality"] = sample_quality(engine, engine.recommended, dictionary)
    report["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    v, q = report["validation"], report["quality"]
    print("validation (World English Bible held-out chapters):")
    for t in (0.25, 0.5, 0.75):
        print(f"  denoising CE at t={t}: {v[f'diffusion_ce_t{t}']:.3f} nats/token (unigram baseline {v['unigram_ce']:.3f})")
    print(f"  encoder next-token perplexity: {v['encoder_perplexity']:.1f} (unigram baseline {v['unigram_perplexity']:.1f})")
    print(f"samples on {len(EVAL_PROMPTS)} fixed prompts at the shipped settings:")
    print(f"  dictionary words: {q['dictionary_word_rate']:.1%} (real validation text: "
          f"{report['reference_dictionary_word_rate']:.1%})")
    print(f"  distinct-2: {q['distinct_2']:.3f} over all samples, {q['distinct_2_per_sample']:.3f} per sample")
    print(f"  decoder forwards per canvas: {q['mean_forwards_per_canvas']:.1f} of at most {q['max_denoising_steps']}")
    print(f"speed on this machine: {q['tokens_per_second']:.1f} tokens/s, {q['tokens_per_forward']:.2f} tokens/forward, "
          f"{q['mean_seconds_per_answer']:.2f} s per answer ({q['mean_generated_tokens']:.0f} tokens), "
          f"peak RSS {report['peak_rss_mib']:.0f} MiB")
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()

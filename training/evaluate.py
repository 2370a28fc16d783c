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
  (`engine.race.AutoregressiveDecoder.from_diffusion`: the causal encoder, one forward per token) on the
  same prompts and token budget, prompts alternating which side runs first; peak RSS;
- what a watcher sees (`training.denoising`), for the recommended settings and for the fast and careful presets
  (`engine.settings.preset`), each with its own race: median decoder forwards per canvas, the share of a canvas the
  first forward accepts, at how many different steps positions are first accepted, the longest run of one
  punctuation character, each preset's forwards over the recommended settings', every target marked met or missed;
- a low-temperature sweep (`TEMPERATURES`, every fourth prompt): `<pad>` written as content and EOS endings.

Run: `python -m training.evaluate --model assets/models/diffgemma-tiny` (`--settings JSON` evaluates changes to the
recommended settings, `--prompts dev` the development prompts, `--denoising-only` skips the validation losses and
the low-temperature sweep; `--sweep denoise|cold|wide` compares sampler settings on `DEV_PROMPTS`,
`--canvas-costs` times decoder forwards at canvas 32..256).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import resource
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch
from transformers import DiffusionGemmaForBlockDiffusion

from engine.race import AutoregressiveDecoder
from engine.engine import DiffusionEngine
from engine.loading import DEFAULT_MODEL, load_model
from engine.settings import PRESET_NAMES, RANGES, DiffusionSettings, preset
from .data import ExampleSampler
from .denoising import PRESET_TARGETS, TARGETS, check, denoising_figures, observe
from .model_config import PAD_ID, tiny_config
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
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return {line.strip().lower() for line in lines if line.strip()}


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
    EOS id rather than at `max_new_tokens`. The denoising figures (`training.denoising.denoising_figures`) come from
    each run's frames."""
    texts, samples, forwards, tokens, seconds, canvases, pads, eos = [], [], 0, 0, 0.0, 0, 0, 0
    pad_id = engine.model.generation_config.pad_token_id
    for seed, (prompt, raw) in enumerate(prompts):
        blocks, count, last = [], 0, None
        for last in engine.frames(prompt, settings, raw=raw, seed=seed):
            count += 1
            observe(last, blocks)
        result = engine.summarize(last, count)
        texts.append(result.text)
        samples.append({"prompt": prompt, "raw": raw, "seed": seed, "text": result.text, "tokens": result.tokens,
                        "forwards_per_block": list(result.forwards_per_block), "stop_reason": result.stop_reason,
                        "first_forward_accepted": [b["first_forward_accepted"] for b in blocks],
                        "acceptance_steps": [b["acceptance_steps"] for b in blocks]})
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
        **denoising_figures(samples, engine.canvas_length),
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
            "diffusion_over_ar": diffusion / autoregressive, "prompts": len(prompts),
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
    rows = []
    for length in lengths:
        model = DiffusionGemmaForBlockDiffusion(tiny_config(canvas_length=length)).eval()
        settings = DiffusionSettings(max_new_tokens=length, max_denoising_steps=steps, adaptive_stopping=False)
        kwargs = settings.generate_kwargs()
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


# Settings a report prints (the token budget is the same for all)
SETTING_KEYS = [k for k in RANGES if k != "max_new_tokens"]
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


# Schedules that show denoising (`--sweep denoise`): every row sets the temperature schedule, entropy bound and steps
# (stability and confidence thresholds as recommended unless the row sets them), from the 26B checkpoint's own
# shape (high temperature, tight bound) down to few steps.
DENOISE_SWEEP = [
    {"t_max": 1.0, "t_min": 0.1, "entropy_bound": 0.5, "max_denoising_steps": 16},
    {"t_max": 0.8, "t_min": 0.05, "entropy_bound": 0.5, "max_denoising_steps": 16},
    {"t_max": 0.8, "t_min": 0.05, "entropy_bound": 0.5, "max_denoising_steps": 14},
    {"t_max": 0.8, "t_min": 0.05, "entropy_bound": 0.5, "max_denoising_steps": 12},
    {"t_max": 0.8, "t_min": 0.05, "entropy_bound": 1.0, "max_denoising_steps": 12},
    {"t_max": 0.8, "t_min": 0.1, "entropy_bound": 0.25, "max_denoising_steps": 12},
    {"t_max": 0.6, "t_min": 0.05, "entropy_bound": 0.5, "max_denoising_steps": 12},
    {"t_max": 0.6, "t_min": 0.02, "entropy_bound": 0.5, "max_denoising_steps": 12},
    {"t_max": 0.8, "t_min": 0.05, "entropy_bound": 0.5, "max_denoising_steps": 24, "confidence_threshold": 0.5},
    {"t_max": 0.8, "t_min": 0.05, "entropy_bound": 0.5, "max_denoising_steps": 24, "confidence_threshold": 1.0},
]
SWEEPS = {"wide": SWEEP, "cold": COLD_SWEEP, "denoise": DENOISE_SWEEP}


def print_sweep(engine: DiffusionEngine, dictionary: set[str], sweep: list[dict] = SWEEP,
                prompts=DEV_PROMPTS) -> None:
    """Print a sweep table (`SWEEPS`: changes to the recommended settings, one row each) on `prompts`
    (`DEV_PROMPTS` unless told), at the recommended token budget, as the card measures: word figures, the
    denoising figures of `TARGETS` and speed."""
    print(f"{'changes':<104} {'dict':>6} {'d2':>6} {'fwd':>5} {'first':>6} {'steps':>5} {'punct':>5} "
          f"{'TPF':>6} {'tok/s':>6} {'pads':>4} {'EOS':>3}")
    for changes in sweep:
        settings = engine.recommended.replace(**changes)
        q = sample_quality(engine, settings, dictionary, prompts)
        print(f"{json.dumps(changes):<104} {q['dictionary_word_rate']:6.3f} {q['distinct_2']:6.3f} "
              f"{q['median_forwards_per_canvas']:5.1f} {q['max_first_forward_accepted_share']:6.2f} "
              f"{q['median_acceptance_steps']:5.1f} {q['longest_punctuation_run']:5d} {q['tokens_per_forward']:6.2f} "
              f"{q['tokens_per_second']:6.1f} {q['pads_as_content']:4d} {q['eos_endings']:3d}", flush=True)


def preset_run(engine: DiffusionEngine, name: str, settings, dictionary: set[str], prompts, race_prompts) -> dict:
    """Preset `name` of `settings`: its settings, sample figures on `prompts` and race on `race_prompts`."""
    chosen = preset(name, settings)
    return {"settings": chosen.__dict__, "quality": sample_quality(engine, chosen, dictionary, prompts),
            "speed": speed_against_ar(engine, chosen, race_prompts)}


def _preset_run_in_process(model: str, name: str, settings, prompts, race_prompts) -> dict:
    """`preset_run` in a worker process of its own (its own model copy and dictionary)."""
    torch.set_num_threads(1)
    return preset_run(DiffusionEngine(load_model(model, device="cpu")), name, settings, load_dictionary(), prompts,
                      race_prompts)


def denoising_report(engine: DiffusionEngine, settings, dictionary: set[str], prompts=EVAL_PROMPTS,
                     race_prompts=None, jobs: int = 1) -> dict:
    """`settings` and their presets (`engine.settings.preset`) on `prompts`: each one's sample figures and race
    against same-weights greedy AR (on `race_prompts`, every other prompt unless told), each preset's median
    forwards per canvas over the settings' own, and every target of `TARGETS` and `PRESET_TARGETS` marked.
    `jobs` > 1 runs the presets in that many worker processes of one thread each (same figures, less wall time on a
    machine with idle cores; the races then share the machine with the other presets)."""
    race_prompts = prompts[::2] if race_prompts is None else race_prompts
    if jobs > 1:
        with ProcessPoolExecutor(min(jobs, len(PRESET_NAMES)), mp_context=get_context("spawn")) as pool:
            futures = {name: pool.submit(_preset_run_in_process, engine.source, name, settings, prompts,
                                         race_prompts) for name in PRESET_NAMES}
            runs = {name: future.result() for name, future in futures.items()}
    else:
        runs = {name: preset_run(engine, name, settings, dictionary, prompts, race_prompts) for name in PRESET_NAMES}
    base = runs["recommended"]["quality"]["median_forwards_per_canvas"]
    for run in runs.values():
        run["forwards_ratio"] = run["quality"]["median_forwards_per_canvas"] / base
    targets = [{"figure": figure, "comparison": comparison, "bound": bound,
                "value": runs["recommended"]["quality"][figure],
                "met": check(runs["recommended"]["quality"][figure], comparison, bound)}
               for figure, comparison, bound in TARGETS]
    targets += [{"figure": f"{name} forwards ratio", "comparison": comparison, "bound": bound,
                 "value": runs[name]["forwards_ratio"], "met": check(runs[name]["forwards_ratio"], comparison, bound)}
                for name, comparison, bound in PRESET_TARGETS]
    return {"runs": runs, "targets": targets}


def print_denoising_report(report: dict, prompts: int) -> None:
    """Print `denoising_report`'s figures: one line per setting, then the targets."""
    print(f"settings and presets on {prompts} prompts (race on every other):")
    for name, run in report["runs"].items():
        q, s = run["quality"], run["speed"]
        print(f"  {name}: {json.dumps({k: run['settings'][k] for k in SETTING_KEYS})}")
        print(f"    forwards per canvas median {q['median_forwards_per_canvas']:.1f} (mean "
              f"{q['mean_forwards_per_canvas']:.1f}, {run['forwards_ratio']:.2f}x recommended); first forward "
              f"accepts median {q['median_first_forward_accepted_share']:.1%}, at most "
              f"{q['max_first_forward_accepted_share']:.1%} of a canvas; positions first accepted at "
              f"{q['median_acceptance_steps']:.1f} different steps (median)")
        print(f"    longest punctuation run {q['longest_punctuation_run']} ({q['answers_with_punctuation_run_over_3']} "
              f"answers over 3); distinct-2 {q['distinct_2']:.3f}; dictionary words {q['dictionary_word_rate']:.1%}; "
              f"EOS endings {q['eos_endings']}/{q['answers']}; {q['mean_generated_tokens']:.0f} tokens per answer")
        print(f"    {q['tokens_per_second']:.1f} tokens/s, {q['tokens_per_forward']:.2f} tokens per forward; race: "
              f"diffusion {s['diffusion_tokens_per_second']:.1f} tokens/s, same-weights greedy AR "
              f"{s['ar_tokens_per_second']:.1f} tokens/s: {s['diffusion_over_ar']:.2f}x", flush=True)
    print("targets:")
    for t in report["targets"]:
        print(f"  {t['figure']} {t['comparison']} {t['bound']}: {t['value']:.3f} {'met' if t['met'] else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--after-end", choices=("end", "pad"), default="end",
                        help="what the model was trained to read after a text's end (v1: pad)")
    parser.add_argument("--settings", type=json.loads, default={},
                        help="JSON object of changes to the model's recommended settings, e.g. '{\"t_max\": 0.8}'")
    parser.add_argument("--prompts", choices=("eval", "dev"), default="eval",
                        help="EVAL_PROMPTS (report) or DEV_PROMPTS (choose); a sweep always uses DEV_PROMPTS")
    parser.add_argument("--every", type=int, default=1, help="use every n-th prompt only (a quicker look)")
    parser.add_argument("--sweep", nargs="?", const="wide", choices=tuple(SWEEPS),
                        help="compare sampling settings on the development prompts (wide: SWEEP, cold: COLD_SWEEP, "
                             "denoise: DENOISE_SWEEP)")
    parser.add_argument("--denoising-only", action="store_true",
                        help="only the settings' and presets' sample, denoising and race figures with their targets")
    parser.add_argument("--canvas-costs", action="store_true", help="time decoder forwards at canvas 32..256")
    parser.add_argument("--validation-only", action="store_true", help="only the validation losses")
    parser.add_argument("--batches", type=int, default=20, help="validation batches of 16 per noise level")
    parser.add_argument("--jobs", type=int, default=1,
                        help="run the recommended settings and the presets in this many processes (one thread each)")
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
    engine.recommended = engine.recommended.replace(**args.settings)
    dictionary = load_dictionary()
    prompts = (DEV_PROMPTS if args.prompts == "dev" or args.sweep else EVAL_PROMPTS)[::args.every]
    if args.sweep:
        print_sweep(engine, dictionary, sweep=SWEEPS[args.sweep], prompts=prompts)
        return

    report = {"model": args.model, "settings": engine.recommended.__dict__, "prompts": args.prompts}
    with ThreadPoolExecutor(1) as background:  # with --jobs the presets' workers run while this process measures
        denoising = background.submit(denoising_report, engine, engine.recommended, dictionary, prompts,
                                      jobs=args.jobs) if args.jobs > 1 else None
        if not args.denoising_only:
            report["validation"] = validation_losses(
                engine.model, engine.tokenizer, args.corpus, batches=args.batches, after_end=args.after_end
            )
            v = report["validation"]
            print("validation (World English Bible held-out chapters; denoising CE on text positions):")
            for t in (0.25, 0.5, 0.75):
                print(f"  denoising CE at t={t}: {v[f'diffusion_ce_t{t}']:.3f} nats/token "
                      f"(unigram baseline {v['unigram_ce']:.3f})")
            print(f"  encoder next-token perplexity: {v['encoder_perplexity']:.1f} "
                  f"(unigram baseline {v['unigram_perplexity']:.1f})", flush=True)
            if args.validation_only:
                return
            report["reference_dictionary_word_rate"] = reference_dictionary_rate(args.corpus, dictionary)
            report["temperature_sweep"] = temperature_sweep(engine, dictionary)
        report["denoising"] = denoising.result() if denoising else denoising_report(
            engine, engine.recommended, dictionary, prompts)
    recommended = report["denoising"]["runs"]["recommended"]
    report["quality"] = q = recommended["quality"]
    report["speed"] = s = recommended["speed"]
    print(f"samples on {len(prompts)} prompts not in the training text, recommended settings:")
    print(f"  dictionary words: {q['dictionary_word_rate']:.1%}"
          + (f" (real validation text: {report['reference_dictionary_word_rate']:.1%})"
             if "reference_dictionary_word_rate" in report else ""))
    print(f"  distinct-2: {q['distinct_2']:.3f} over all samples, {q['distinct_2_per_sample']:.3f} per sample")
    print(f"  decoder forwards per canvas: {q['mean_forwards_per_canvas']:.1f} of at most {q['max_denoising_steps']}; "
          f"{q['tokens_per_forward']:.2f} tokens per forward; {q['mean_generated_tokens']:.0f} tokens per answer")
    print(f"  <pad> written as content: {q['pads_as_content']}; "
          f"answers ended by EOS: {q['eos_endings']}/{q['answers']}")
    print(f"speed on this machine ({s['prompts']} prompts): diffusion {s['diffusion_tokens_per_second']:.1f} tokens/s, "
          f"same-weights greedy AR {s['ar_tokens_per_second']:.1f} tokens/s: {s['diffusion_over_ar']:.2f}x")
    print_denoising_report(report["denoising"], len(prompts))
    if "temperature_sweep" in report:
        print("low-temperature sweep (5 prompts, at most 128 tokens):")
        for row in report["temperature_sweep"]:
            print(f"  t {row['t_max']} -> {row['t_min']}: <pad> as content {row['pads_as_content']}, EOS endings "
                  f"{row['eos_endings']}/{row['answers']}, dictionary words {row['dictionary_word_rate']:.1%}, "
                  f"{row['mean_forwards_per_canvas']:.1f} forwards per canvas, "
                  f"{row['mean_generated_tokens']:.0f} tokens")
    report["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {report['peak_rss_mib']:.0f} MiB")
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()

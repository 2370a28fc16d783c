"""Rank diffgemma-tiny shapes by a short training run each, at equal wall time.

Each candidate (layers, hidden size) is trained from random weights with v2's objective (`training.train`: end-token
targets after a text's end, noise t = u ** 1.5) for `--minutes` of wall time, then its checkpoint is scored by
`training.evaluate.validation_losses` (denoising cross-entropy on held-out text positions at t = 0.25 / 0.5 / 0.75,
encoder next-token perplexity). Equal wall time rather than equal steps, because the question on a fixed CPU budget
is which shape learns the most per hour: a bigger model takes fewer steps in the same time. The learning rate warms
up and then stays near its peak (the cosine is planned for far more steps than a short run makes), so no candidate is
favoured by where its run stops on a schedule. A short run ranks early learning, not where a long run ends; to
tell learning per step from steps per minute, the table ends with each candidate's mean training denoising loss over
the same 49 steps (the last ones the slowest candidate made).

Run: `python -m training.sweep --minutes 6 --out data/sweep` (a candidate whose checkpoint exists in `--out` is
scored, not trained again).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

from .evaluate import validation_losses

CANDIDATES = [
    {"layers": 4, "hidden_size": 256},  # the shipped shape
    {"layers": 6, "hidden_size": 256},
    {"layers": 4, "hidden_size": 384},
    {"layers": 2, "hidden_size": 256},
]


def candidate_dir(out: Path, candidate: dict) -> Path:
    """The folder of `candidate`'s run under `out` (its checkpoint and `log.csv`)."""
    return out / f"L{candidate['layers']}-H{candidate['hidden_size']}"


def train_candidate(candidate: dict, out: Path, minutes: float, corpus: Path, tokenizer: Path) -> None:
    """Train one candidate from random weights for `minutes` of wall time into `out` (`training.train` in a child
    process, so each run starts from the same process state).

    Raises:
        subprocess.CalledProcessError: the training run failed.
    """
    command = [sys.executable, "-m", "training.train", "--out", str(out), "--corpus", str(corpus),
               "--tokenizer", str(tokenizer), "--layers", str(candidate["layers"]),
               "--hidden-size", str(candidate["hidden_size"]), "--steps", "100000", "--lr", "2e-3", "--warmup", "50",
               "--after-end", "end", "--noise-power", "1.5", "--max-prefix", "96", "--minutes", str(minutes),
               "--checkpoint-every", "100000", "--seed", "0"]
    shutil.rmtree(out, ignore_errors=True)  # a run killed before its checkpoint starts again, with a fresh log
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "TQDM_DISABLE": "1"})


def score_candidate(out: Path, corpus: Path, tokenizer, batches: int) -> dict:
    """Validation losses of the checkpoint in `out`, with its parameter count, steps, seconds per step and training
    log (`log`: (step, training denoising CE) per step, not written to the report)."""
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(out / "checkpoint").eval()
    steps = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)["step"]
    with open(out / "log.csv") as f:
        rows = list(csv.DictReader(f))
    return {"parameters": sum(p.numel() for p in model.parameters()), "steps": steps,
            "seconds_per_step": float(rows[-1]["seconds"]) / steps,
            "log": [(int(r["step"]), float(r["diffusion_ce"])) for r in rows],
            **validation_losses(model, tokenizer, corpus, batches=batches, after_end="end")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/sweep"))
    parser.add_argument("--minutes", type=float, default=6.0, help="wall time of each candidate's training run")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer"))
    parser.add_argument("--batches", type=int, default=10, help="validation batches of 16 per noise level")
    args = parser.parse_args()
    print(f"{'shape':<14} {'params':>7} {'steps':>6} {'s/step':>7} {'CE t=.25':>9} {'CE t=.5':>8} {'CE t=.75':>9} "
          f"{'enc ppl':>8}")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    results = []
    for candidate in CANDIDATES:
        out = candidate_dir(args.out, candidate)
        if not (out / "checkpoint").exists():
            train_candidate(candidate, out, args.minutes, args.corpus, args.tokenizer)
        row = {**candidate, **score_candidate(out, args.corpus, tokenizer, args.batches)}
        results.append(row)
        print(f"{candidate['layers']} x {candidate['hidden_size']:<8} "
              f"{row['parameters'] / 1e6:6.2f}M {row['steps']:6d} "
              f"{row['seconds_per_step']:7.2f} {row['diffusion_ce_t0.25']:9.3f} {row['diffusion_ce_t0.5']:8.3f} "
              f"{row['diffusion_ce_t0.75']:9.3f} {row['encoder_perplexity']:8.1f}", flush=True)
    last = min(row["steps"] for row in results)
    print(f"mean training denoising CE over steps {last - 48}-{last}:")
    for row in results:
        losses = [loss for step, loss in row.pop("log") if last - 49 < step <= last]
        row["training_diffusion_ce_same_steps"] = sum(losses) / len(losses)
        print(f"{row['layers']} x {row['hidden_size']:<8} {row['training_diffusion_ce_same_steps']:.3f}")
    (args.out / "sweep.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

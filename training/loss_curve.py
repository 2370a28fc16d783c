"""Plot training logs (`log.csv` from `training.train`) as a PNG loss curve.

Run: `python -m training.loss_curve data/run/log.csv assets/models/diffgemma-tiny/loss_curve.png`. Several logs
(runs that each start from the previous one's weights) are drawn one after another on one step axis:
`python -m training.loss_curve data/run-a/log.csv data/run-b/log.csv out.png`. Needs matplotlib (not in the
requirements files: `pip install matplotlib`).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import matplotlib.pyplot as plt


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over at most `window` values (same length as `values`)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot(log_files: list[Path], out: Path, window: int = 50) -> None:
    """Write the diffusion and encoder cross-entropy curves (raw and smoothed) of `log_files` to `out`: each log's
    steps continue the previous log's, with a dotted line where a run starts from the previous one's weights."""
    plt.switch_backend("Agg")
    rows, starts = [], []
    for log_file in log_files:
        with open(log_file) as f:
            run = list(csv.DictReader(f))
        offset = int(rows[-1]["step"]) if rows else 0
        starts.append(offset)
        rows += [{**r, "step": int(r["step"]) + offset} for r in run]
    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for key, label, colour in (("diffusion_ce", "denoising CE (canvas)", "#0072B2"),
                               ("encoder_ce", "encoder next-token CE", "#D55E00")):
        values = [float(r[key]) for r in rows]
        ax.plot(steps, values, color=colour, alpha=0.2, linewidth=0.8)
        ax.plot(steps, moving_average(values, window), color=colour, label=f"{label} ({window}-step mean)")
    for start in starts[1:]:
        ax.axvline(start, color="#555555", linestyle=":", linewidth=1)
    ax.set_xlabel("training step (batch of 16 examples)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("diffgemma-tiny training on the World English Bible")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path, nargs="+", help="log.csv files, in training order")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    plot(args.logs, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

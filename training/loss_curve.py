"""Plot a training log (`log.csv` from `training.train`) as a PNG loss curve.

Run: `python -m training.loss_curve data/run/log.csv assets/models/diffgemma-tiny/loss_curve.png`.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over at most `window` values (same length as `values`)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot(log_file: Path, out: Path, window: int = 50) -> None:
    """Write the diffusion and encoder cross-entropy curves (raw and smoothed) of `log_file` to `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(log_file) as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for key, label, colour in (("diffusion_ce", "denoising CE (canvas)", "#0072B2"),
                               ("encoder_ce", "encoder next-token CE", "#D55E00")):
        values = [float(r[key]) for r in rows]
        ax.plot(steps, values, color=colour, alpha=0.2, linewidth=0.8)
        ax.plot(steps, moving_average(values, window), color=colour, label=f"{label} ({window}-step mean)")
    ax.set_xlabel("training step (batch of 16 examples)")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("diffgemma-tiny training on the World English Bible")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    plot(args.log, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""The deploy command line: `python -m deploy space --target cpu|gpu|zerogpu OUT`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .space import write_space
from .targets import TARGETS


def build_parser() -> argparse.ArgumentParser:
    """The `deploy` command line."""
    parser = argparse.ArgumentParser(prog="python -m deploy", description="Write deployable Hugging Face Spaces.")
    commands = parser.add_subparsers(dest="command", required=True)
    space = commands.add_parser("space", help="write a Space folder for one target",
                                description="Write a Space folder (app, README front matter, requirements, entry "
                                            "point) for one target; push it with `hf upload`.")
    space.add_argument("--target", required=True, choices=tuple(TARGETS),
                       help="cpu: CPU basic, embedded model; gpu: a dedicated GPU, the 26B model; zerogpu: ZeroGPU, "
                            "the 26B model")
    space.add_argument("out", type=Path, help="folder to write (new or empty)")
    space.add_argument("--model", default=None, help="hub id to serve instead of the target's (gpu, zerogpu)")
    space.add_argument("--quantization", default=None, choices=("none", "4bit", "8bit"),
                       help="gpu target only: 8bit fits a 48 GB card, 4bit a 24 GB one (default: none, bf16)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit status (2: bad arguments, with one line on stderr)."""
    args = build_parser().parse_args(argv)
    try:
        out = write_space(args.target, args.out, model=args.model, quantization=args.quantization)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"Wrote the {args.target} Space to {out}. Create the Space once and push the folder with:\n"
          f"  hf repos create <your-name>/<space-name> --type space --sdk gradio\n"
          f"  hf upload <your-name>/<space-name> {out} . --type space\n"
          f"then choose its hardware (and any secret its README names) in the Space's settings.")
    return 0

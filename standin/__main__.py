"""python -m standin [--out DIR] [--cache DIR]: write the stand-in checkpoint and print its folder."""

from __future__ import annotations

import argparse
import sys

from . import build_standin, ensure_standin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m standin", description=__doc__)
    parser.add_argument("--out", help="write a fresh stand-in into this new or empty folder")
    parser.add_argument("--cache", help="cache folder for the reused copy (default: data/standin)")
    args = parser.parse_args(argv)
    try:
        path = build_standin(args.out) if args.out else ensure_standin(args.cache)
    except (FileExistsError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

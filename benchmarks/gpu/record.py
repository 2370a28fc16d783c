"""The GPU kit's run record: one entry per step in `run.json`, added by `run.sh` after each step's process ends
(or instead of a step skipped for time). Standard library only, so it records whatever failed to import.

    python benchmarks/gpu/record.py STEP --rc N --wall S --cap S [--log FILE] --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Each step's result file (without .json), and the run record's: at most 8 files come back from the GPU machine
FILES = {"env": "env", "preflight": "preflight", "bf16": "bf16", "8bit": "quant_8bit", "4bit": "quant_4bit",
         "static_tiny": "static_tiny", "static_26b": "static_26b"}
RUN_FILE = "run"  # the run record: one entry per step (exit status, wall time, cap, log tail)


def record(out: Path, step: str, rc: int, wall: float, cap: float, log: Path) -> None:
    """Add one step's outcome to `out/run.json` (exit status, wall seconds, cap, the last 3,000 characters of its
    log; 124/137: the cap was hit)."""
    path = out / f"{RUN_FILE}.json"
    data = json.loads(path.read_text()) if path.exists() else {"steps": []}
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    data["steps"].append({"step": step, "rc": rc, "timed_out": rc in (124, 137), "wall_s": wall, "cap_s": cap,
                          "file": f"{FILES.get(step, step)}.json", "log_tail": tail})
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=1))
    temporary.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", metavar="STEP", help="the step whose outcome to add")
    parser.add_argument("--rc", type=int, default=0, help="its exit status (124, 137: its cap was hit; -1: skipped)")
    parser.add_argument("--wall", type=float, default=0.0, help="its wall seconds")
    parser.add_argument("--cap", type=float, default=0.0, help="its cap in seconds")
    parser.add_argument("--log", type=Path, help="its log, whose tail goes into the entry")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    record(args.out, args.step, args.rc, args.wall, args.cap, args.log or Path("/nonexistent"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

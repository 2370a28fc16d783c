"""`python -m engine race --prompt TEXT [options]`: race block diffusion against autoregressive decoding.

Prints both answers and one line per side (tokens, forwards, tokens/s, tokens/forward, seconds, cost per forward),
the speedup, and the facts of `RaceResult.verdict()` on one line; `--json` prints `RaceResult.summary()` with both
texts as one JSON object instead.
"""

from __future__ import annotations

import argparse
import json
import sys

from .loading import DEFAULT_MODEL, DEVICES, DTYPES, QUANTIZATIONS, ModelLoadError, load_model
from .settings import PRESET_NAMES, check_seed, check_setting, preset


def add_race_parser(commands) -> None:
    """Add the `race` subcommand to `python -m engine`'s subparsers."""
    race = commands.add_parser("race", help="race block diffusion against autoregressive decoding on one prompt")
    race.add_argument("--model", default=str(DEFAULT_MODEL), help="diffusion model: local folder or hub id")
    race.add_argument("--ar-model", help="separate causal LM for the autoregressive side (default: the diffusion "
                                         "model's own causal encoder)")
    race.add_argument("--prompt", required=True)
    race.add_argument("--raw", action="store_true", help="no chat template: tokenize the prompt as is")
    race.add_argument("--preset", default="recommended", choices=PRESET_NAMES, help="diffusion settings")
    race.add_argument("--max-new-tokens", type=int, help="token budget of both sides (whole canvases)")
    race.add_argument("--steps", type=int, help="max denoising steps per canvas (overrides the preset)")
    race.add_argument("--seed", type=int, default=None)
    race.add_argument("--ar-temperature", type=float, default=0.0, help="0: greedy (default); above: sampled")
    race.add_argument("--order", default="alternate", choices=("alternate", "diffusion-first", "autoregressive-first"))
    race.add_argument("--no-warm-up", dest="warm_up", action="store_false", help="skip each side's warm-up")
    race.add_argument("--device", default="auto", choices=DEVICES)
    race.add_argument("--dtype", default="auto", choices=DTYPES)
    race.add_argument("--quantization", default="none", choices=QUANTIZATIONS)
    race.add_argument("--json", action="store_true", help="print one JSON object")


def verdict_line(verdict: dict) -> str:
    """`RaceResult.verdict()` as one line of key=value facts, e.g. "winner=diffusion stopped_side=none
    cost_ratio=3.10 bound=compute faults=diffusion:punctuation+repetition" ("none" and "n/a" for missing values)."""
    faults = ",".join(f"{side}:{'+'.join(names)}" for side, names in verdict["faults"].items() if names) or "none"
    ratio = verdict["cost_ratio"]
    return (f"winner={verdict['winner'] or 'none'} stopped_side={verdict['stopped_side'] or 'none'} "
            f"cost_ratio={'n/a' if ratio is None else f'{ratio:.2f}'} bound={verdict['bound']} faults={faults}")


def race_command(args: argparse.Namespace) -> int:
    """Run `python -m engine race`; returns the exit status (2: bad input, a model that does not load or does not
    fit)."""
    from .autoregressive import check_temperature
    from .engine import DiffusionEngine, check_prompt
    from .race import RaceRunner
    from .race_memory import race_runner

    try:
        check_prompt(args.prompt)
        check_seed(args.seed)
        check_temperature(args.ar_temperature)
        for name, value in (("max_new_tokens", args.max_new_tokens), ("max_denoising_steps", args.steps)):
            if value is not None:
                check_setting(name, value)
        engine = DiffusionEngine(load_model(args.model, args.device, args.dtype, args.quantization))
        runner = race_runner(engine, args.ar_model) if args.ar_model else RaceRunner(engine)
        settings = preset(args.preset, engine.recommended)
        if args.max_new_tokens is not None:
            settings = settings.replace(max_new_tokens=args.max_new_tokens)
        if args.steps is not None:
            settings = settings.replace(max_denoising_steps=args.steps)
        result = runner.run(
            args.prompt, settings, raw=args.raw, seed=args.seed, ar_temperature=args.ar_temperature,
            order=args.order.replace("-", " "), warm_up=args.warm_up)
    except (ModelLoadError, ValueError) as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    summary = result.summary()
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
        return 0
    for side in (result.diffusion, result.autoregressive):
        print(f"--- {side.name} ({side.model}) ---\n{side.text}")
    for side in (result.diffusion, result.autoregressive):
        print(f"[{side.line()}]", file=sys.stderr)
    speedup = summary["speedup"]
    print(f"[speedup (diffusion tokens/s / autoregressive tokens/s): "
          f"{'n/a' if speedup is None else f'{speedup:.2f}x'}; order {', '.join(result.order)}; seed {result.seed}]",
          file=sys.stderr)
    print(f"[verdict: {verdict_line(summary['verdict'])}]", file=sys.stderr)
    return 0

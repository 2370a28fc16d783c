"""Command line: `python -m engine generate --prompt TEXT [options]` prints the text, or one JSON object."""

from __future__ import annotations

import argparse
import json
import sys

from .engine import DiffusionEngine, check_prompt
from .loading import DEFAULT_MODEL, DEVICES, DTYPES, QUANTIZATIONS, ModelLoadError, load_model
from .settings import check_seed, check_setting


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="DiffusionGemma block-diffusion engine")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate text for one prompt")
    gen.add_argument("--model", default=str(DEFAULT_MODEL), help="local folder or hub id (default: embedded model)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--raw", action="store_true", help="no chat template: tokenize the prompt as is")
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--max-new-tokens", type=int)
    gen.add_argument("--steps", type=int, help="max denoising steps per canvas")
    gen.add_argument("--entropy-bound", type=float)
    gen.add_argument("--t-min", type=float)
    gen.add_argument("--t-max", type=float)
    gen.add_argument("--no-adaptive-stopping", action="store_true", help="run every canvas for all steps")
    gen.add_argument("--device", default="auto", choices=DEVICES)
    gen.add_argument("--dtype", default="auto", choices=DTYPES)
    gen.add_argument("--quantization", default="none", choices=QUANTIZATIONS)
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (2: bad input or a model that does not load)."""
    args = build_parser().parse_args(argv)
    changes = {
        "max_new_tokens": args.max_new_tokens, "max_denoising_steps": args.steps,
        "entropy_bound": args.entropy_bound, "t_min": args.t_min, "t_max": args.t_max,
    }
    changes = {k: v for k, v in changes.items() if v is not None}
    try:
        # Everything that can be checked without the model first: a typo must not cost a load of the 26B model
        check_prompt(args.prompt)
        check_seed(args.seed)
        for name, value in changes.items():
            check_setting(name, value)
        engine = DiffusionEngine(load_model(args.model, args.device, args.dtype, args.quantization))
        settings = engine.recommended.replace(**changes)
        if args.no_adaptive_stopping:
            settings = settings.replace(adaptive_stopping=False)
        result = engine.generate(args.prompt, settings, raw=args.raw, seed=args.seed)
    except (ModelLoadError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        print(result.text)
        print(
            f"[{len(result.token_ids)} tokens, {result.forwards} forwards, {result.tokens_per_second:.1f} tokens/s, "
            f"{result.tokens_per_forward:.2f} tokens/forward, {result.seconds:.2f} s, seed {result.seed}]",
            file=sys.stderr,
        )
    return 0

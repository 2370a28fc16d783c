"""`python -m engine infill --template TEXT [options]`: fill a template's blanks (`[___]` one token, `[___ 12]`
twelve) while its fixed text stays put (`engine.infill`). Prints the filled text, or with `--json` one object:
{"text", "fills", "blank_positions", "template_positions", "result"}."""

from __future__ import annotations

import argparse
import json
import sys

from .loading import DEFAULT_MODEL, DEVICES, DTYPES, QUANTIZATIONS, ModelLoadError, load_model
from .settings import parse_seed, parse_setting


def add_infill_parser(commands) -> None:
    """Add the `infill` subcommand to `python -m engine`'s subparsers."""
    infill = commands.add_parser("infill", help="fill the blanks of a template inside one canvas")
    infill.add_argument("--model", default=str(DEFAULT_MODEL), help="local folder or hub id (default: embedded model)")
    infill.add_argument("--template", required=True, help="text with blanks: [___] one token, [___ 12] twelve")
    infill.add_argument("--prompt", help="raw context the encoder reads before the canvas (default: <bos> only)")
    infill.add_argument("--seed", type=int, default=None)
    infill.add_argument("--steps", type=int, help="max denoising steps")
    infill.add_argument("--device", default="auto", choices=DEVICES)
    infill.add_argument("--dtype", default="auto", choices=DTYPES)
    infill.add_argument("--quantization", default="none", choices=QUANTIZATIONS)
    infill.add_argument("--json", action="store_true", help="print one JSON object")


def infill_command(args: argparse.Namespace) -> int:
    """Run `python -m engine infill`; returns the exit status (2: bad template or options, a model that does not
    load, a template that does not fit one canvas)."""
    try:
        parse_seed(args.seed)
        if args.steps is not None:
            parse_setting("max_denoising_steps", args.steps)
        from .engine import DiffusionEngine  # noqa: PLC0415 (torch import only once the options are sound)
        from .infill import filled_text, infill_frames, parse_template  # noqa: PLC0415

        parse_template(args.template, None)  # syntax first: a typo must not cost a model load
        engine = DiffusionEngine(load_model(args.model, args.device, args.dtype, args.quantization))
        settings = engine.recommended
        if args.steps is not None:
            settings = settings.replace(max_denoising_steps=args.steps)
        layout, frames = infill_frames(engine, args.template, settings, prompt=args.prompt, seed=args.seed)
        count, last = 0, None
        for last in frames:
            count += 1
    except (ModelLoadError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result = engine.summarize(last, count)
    text, fills = filled_text(engine.tokenizer, layout, last.committed_ids)
    if args.json:
        print(json.dumps({"text": text, "fills": fills, "blank_positions": layout.blanks,
                          "template_positions": layout.template_positions, "result": result.to_dict()},
                         ensure_ascii=False))
    else:
        print(text)
        print(f"[{len(layout.blanks)} blank positions filled, {result.forwards} forwards, {result.seconds:.2f} s, "
              f"seed {result.seed}]", file=sys.stderr)
    return 0

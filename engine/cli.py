"""Command line: `python -m engine generate --prompt TEXT [options]` prints the text, or one JSON object (and with
`--trace FILE` writes the run's trace); `python -m engine replay TRACE --html FILE` writes a trace's offline replay."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .engine import DiffusionEngine, check_prompt
from .loading import DEFAULT_MODEL, DEVICES, DTYPES, QUANTIZATIONS, ModelLoadError, load_model
from .chat_cli import add_chat_parser, chat_command
from .infill_cli import add_infill_parser, infill_command
from .race_cli import add_race_parser, race_command
from .settings import PRESET_NAMES, check_seed, check_setting, preset
from .trace import TraceError, load_trace, trace_of_run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="DiffusionGemma block-diffusion engine")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate text for one prompt")
    gen.add_argument("--model", default=str(DEFAULT_MODEL), help="local folder or hub id (default: embedded model)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--raw", action="store_true", help="no chat template: tokenize the prompt as is")
    gen.add_argument("--thinking", action="store_true",
                     help="let the model think first (chat templates with enable_thinking, e.g. Gemma 4)")
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--preset", default="recommended", choices=PRESET_NAMES,
                     help="denoising settings relative to the model's recommended ones (the flags below override)")
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
    add_race_parser(commands)
    add_chat_parser(commands)
    add_infill_parser(commands)
    gen.add_argument("--trace", type=Path, help="also write the run's trace here (JSON, see docs/trace.md)")
    rep = commands.add_parser("replay", help="write the offline HTML replay of a trace")
    rep.add_argument("trace", type=Path, help="a trace JSON file (python -m engine generate ... --trace FILE)")
    rep.add_argument("--html", type=Path, required=True, help="where to write the self-contained HTML page")
    mem = commands.add_parser("memory", help="bytes of every parameter and buffer by group, without running the model")
    mem.add_argument("--model", default=str(DEFAULT_MODEL), help="checkpoint, or a folder with only config.json")
    mem.add_argument("--quantization", default="none", choices=QUANTIZATIONS)
    mem.add_argument("--dtype", default="auto", choices=DTYPES, help="unquantized tensors' dtype (auto: bfloat16)")
    mem.add_argument("--json", action="store_true", help='print {"total_bytes": N, "groups": {...}}')
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (2: bad input or a model that does not load)."""
    args = build_parser().parse_args(argv)
    if args.command == "race":
        return race_command(args)
    if args.command == "chat":
        return chat_command(args)
    if args.command == "infill":
        return infill_command(args)
    if args.command == "memory":
        from .memory import memory_command  # noqa: PLC0415

        return memory_command(args.model, args.quantization, args.dtype, args.json)
    if args.command == "replay":
        return replay(args.trace, args.html)
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
        settings = preset(args.preset, engine.recommended).replace(**changes)
        if args.no_adaptive_stopping:
            settings = settings.replace(adaptive_stopping=False)
        if args.trace:
            frames = list(engine.frames(args.prompt, settings, raw=args.raw, seed=args.seed, thinking=args.thinking))
            result = engine.summarize(frames[-1], len(frames))
            trace = trace_of_run(engine, frames, prompt=args.prompt, settings=settings, raw=args.raw,
                                 thinking=args.thinking)
        else:
            result = engine.generate(args.prompt, settings, raw=args.raw, seed=args.seed, thinking=args.thinking)
    except (ModelLoadError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.trace:
        try:
            trace.save(args.trace)
        except OSError as error:
            print(f"error: cannot write the trace to {args.trace}: {error.strerror or error}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        print(result.text)
        print(
            f"[{result.tokens} tokens, {result.forwards} forwards, {result.tokens_per_second:.1f} tokens/s, "
            f"{result.tokens_per_forward:.2f} tokens/forward, {result.seconds:.2f} s, seed {result.seed}]",
            file=sys.stderr,
        )
    return 0


def replay(trace_path: Path, html_path: Path) -> int:
    """`python -m engine replay`: load and check the trace, write its offline HTML replay; 2 on a refused trace."""
    from diffgemma_ui.replay_html import write_replay  # the page is a view: the engine only calls it from here

    try:
        trace = load_trace(trace_path)
        write_replay(trace, html_path)
    except TraceError as error:
        print(f"error: {trace_path}: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"error: cannot write {html_path}: {error.strerror or error}", file=sys.stderr)
        return 2
    print(f"wrote {html_path} ({html_path.stat().st_size / 2**20:.2f} MiB, {len(trace.frames)} forwards)",
          file=sys.stderr)
    return 0

"""Command line: `python -m engine generate|race|chat|infill|replay|memory`; errors: one `error:` line, status 2."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

from .autoregressive import AR_TEMPERATURE, check_temperature
from .chat import ChatSession
from .conversation import check_thinking
from .engine import DiffusionEngine, last_and_count
from .infill import filled_text, infill_frames, parse_template
from .loading import (DEFAULT_MODEL, DEVICES, DTYPES, QUANTIZATIONS, ModelLoadError, load_model, meta_model,
                      model_location)
from .memory import format_report, memory_report
from .race import RaceRunner, race_runner
from .replay_page import write_replay
from .settings import (PRESET_NAMES, SETTING_NAMES, SETTINGS, DiffusionSettings, check_prompt, parse_seed,
                       parse_setting, preset)
from .trace import TraceError, load_trace, trace_of_run

RACE_ORDERS = ("alternate", "diffusion-first", "autoregressive-first")
THINKING_HELP = "let the model think first (chat templates with enable_thinking, e.g. Gemma 4)"
RAW_HELP = "no chat template: tokenize the prompt as is"


def add_model_flags(parser, model_help: str, *, device: bool = True, dtype_help: str | None = None) -> None:
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help=model_help)
    if device:
        parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help=dtype_help)
    parser.add_argument("--quantization", default="none", choices=QUANTIZATIONS)


def add_settings_flags(parser: argparse.ArgumentParser, names=SETTING_NAMES) -> None:
    """--preset, --seed and a flag per setting of `names`; unset flags stay None."""
    parser.add_argument("--preset", default="recommended", choices=PRESET_NAMES,
                        help="diffusion settings to start from; the settings flags override it")
    parser.add_argument("--seed", type=int, default=None, help="-1 or none: a random seed")
    for row in SETTINGS:
        if row.name not in names:
            continue
        if row.kind is bool:
            parser.add_argument(row.flag, dest=row.name, action=argparse.BooleanOptionalAction, help=row.help)
        else:
            parser.add_argument(row.flag, dest=row.name, type=row.kind, metavar="N" if row.kind is int else "X",
                                help=f"{row.help}; {row.span()}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="DiffusionGemma block-diffusion engine")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="generate text for one prompt")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--raw", action="store_true", help=RAW_HELP)
    gen.add_argument("--thinking", action="store_true", help=THINKING_HELP)
    gen.add_argument("--trace", type=Path, help="also write the run's trace here (JSON, see docs/trace.md)")

    race = commands.add_parser("race", help="race block diffusion against autoregressive decoding on one prompt")
    race.add_argument("--ar-model", help="separate causal LM for the autoregressive side (default: the diffusion "
                                         "model's own causal encoder)")
    race.add_argument("--prompt", required=True)
    race.add_argument("--raw", action="store_true", help=RAW_HELP)
    race.add_argument(AR_TEMPERATURE.flag, type=float, default=0.0, help=AR_TEMPERATURE.help)
    race.add_argument("--order", default="alternate", choices=RACE_ORDERS)
    race.add_argument("--no-warm-up", dest="warm_up", action="store_false", help="skip each side's warm-up")

    chat = commands.add_parser("chat", help="multi-turn chat, one user turn per stdin line (encoder cache reused)")
    chat.add_argument("--system", help="a system message (kept when old turns are cut)")
    chat.add_argument("--thinking", action="store_true", help=THINKING_HELP)

    infill = commands.add_parser("infill", help="fill the blanks of a template inside one canvas")
    infill.add_argument("--template", required=True, help="text with blanks: [___] one token, [___ 12] twelve")
    infill.add_argument("--prompt", help="raw context the encoder reads before the canvas (default: <bos> only)")

    for sub, one_json in ((gen, "one JSON object instead of the text"), (race, "one JSON object"),
                          (chat, "one JSON object per turn"), (infill, "one JSON object")):
        add_model_flags(sub, "local folder or hub id (default: embedded model)")
        add_settings_flags(sub, [n for n in SETTING_NAMES if sub is not infill or n != "max_new_tokens"])
        sub.add_argument("--json", action="store_true", help=f"print {one_json}")

    rep = commands.add_parser("replay", help="write the offline HTML replay of a trace")
    rep.add_argument("trace", type=Path, help="a trace JSON file (python -m engine generate ... --trace FILE)")
    rep.add_argument("--html", type=Path, required=True, help="where to write the self-contained HTML page")

    mem = commands.add_parser("memory", help="bytes of every parameter and buffer by group, without running the model")
    add_model_flags(mem, "checkpoint, or a folder with only config.json", device=False,
                    dtype_help="unquantized tensors' dtype (auto: bfloat16)")
    mem.add_argument("--json", action="store_true", help='print {"total_bytes": N, "groups": {...}}')
    return parser


def checked_options(args: argparse.Namespace) -> tuple[int | None, dict]:
    """(seed, settings flags given), checked over the checkpoint's generation config where it is readable."""
    seed = parse_seed(args.seed)
    changes = {name: getattr(args, name) for name in SETTING_NAMES if getattr(args, name, None) is not None}
    for name, value in changes.items():
        parse_setting(name, value)
    try:
        where, common = model_location(args.model)
        config = DiffusionGemmaGenerationConfig.from_pretrained(where, local_files_only=common["local_files_only"])
    except Exception:  # noqa: BLE001 - any failure is the load's to report
        return seed, changes
    preset(args.preset, DiffusionSettings.from_generation_config(config)).with_values(changes)
    return seed, changes


def load_engine(args: argparse.Namespace, changes: dict) -> tuple[DiffusionEngine, DiffusionSettings]:
    engine = DiffusionEngine(load_model(args.model, args.device, args.dtype, args.quantization))
    return engine, preset(args.preset, engine.recommended).with_values(changes)


def print_json(data: dict) -> None:
    print(json.dumps(data, ensure_ascii=False), flush=True)


def fail(error: BaseException, prefix: str = "") -> int:
    print(f"error: {prefix}{' '.join(str(error).split())}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (2: bad input or a model that does not load)."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (ModelLoadError, ValueError) as error:
        return fail(error)


def generate_command(args: argparse.Namespace) -> int:
    check_prompt(args.prompt)
    seed, changes = checked_options(args)
    engine, settings = load_engine(args, changes)
    if not args.trace:
        result = engine.generate(args.prompt, settings, raw=args.raw, seed=seed, thinking=args.thinking)
    else:
        frames = list(engine.frames(args.prompt, settings, raw=args.raw, seed=seed, thinking=args.thinking))
        result = engine.summarize(frames[-1], len(frames))
        trace = trace_of_run(engine, frames, prompt=args.prompt, settings=settings, raw=args.raw,
                             thinking=args.thinking)
        try:
            trace.save(args.trace)
        except OSError as error:
            return fail(error.strerror or error, f"cannot write the trace to {args.trace}: ")
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.text)
        print(f"[{result.tokens} tokens, {result.forwards} forwards, {result.tokens_per_second:.1f} tokens/s, "
              f"{result.tokens_per_forward:.2f} tokens/forward, {result.seconds:.2f} s, seed {result.seed}]",
              file=sys.stderr)
    return 0


def verdict_line(verdict: dict) -> str:
    """`RaceResult.verdict()` as one line of key=value facts."""
    faults = ",".join(f"{side}:{'+'.join(names)}" for side, names in verdict["faults"].items() if names) or "none"
    ratio = verdict["cost_ratio"]
    return (f"winner={verdict['winner'] or 'none'} stopped_side={verdict['stopped_side'] or 'none'} "
            f"cost_ratio={'n/a' if ratio is None else f'{ratio:.2f}'} bound={verdict['bound']} faults={faults}")


def race_command(args: argparse.Namespace) -> int:
    check_prompt(args.prompt)
    seed, changes = checked_options(args)
    check_temperature(args.ar_temperature)
    engine, settings = load_engine(args, changes)
    runner = race_runner(engine, args.ar_model) if args.ar_model else RaceRunner(engine)
    result = runner.run(args.prompt, settings, raw=args.raw, seed=seed, ar_temperature=args.ar_temperature,
                        order=args.order.replace("-", " "), warm_up=args.warm_up)
    summary = result.summary()
    if args.json:
        print_json(summary)
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


def chat_command(args: argparse.Namespace) -> int:
    """`chat < turns.txt`: a user turn per non-empty line; a refused turn is reported (status 2)."""
    seed, changes = checked_options(args)
    engine, settings = load_engine(args, changes)
    check_thinking(engine.tokenizer, args.thinking)
    session = ChatSession(engine, system=args.system)
    status = 0
    for turn, text in enumerate((line.rstrip("\n") for line in sys.stdin if line.strip()), start=1):
        try:
            result, report = session.reply(text, settings, seed=seed, thinking=args.thinking)
        except ValueError as error:
            status = fail(error, f"turn {turn}: ")
            continue
        if args.json:
            print_json({"turn": turn, "text": result.text, "thought": result.thought, "report": report.to_dict(),
                        "result": result.to_dict()})
            continue
        if result.thought:
            print(f"[thought]\n{result.thought}\n[/thought]", file=sys.stderr)
        print(result.text, flush=True)
        if report.note:
            print(f"[note: {report.note}]", file=sys.stderr)
        saved = "" if report.prefill_saved_s is None else f", about {report.prefill_saved_s:.3f} s saved"
        print(f"[turn {turn}: {report.reused_tokens} of {report.prompt_tokens} prompt tokens reused (not "
              f"re-encoded), prefill {report.prefill_s:.3f} s{saved}; "
              f"{result.tokens} tokens, {result.forwards} forwards, seed {result.seed}]", file=sys.stderr)
    return status


def infill_command(args: argparse.Namespace) -> int:
    seed, changes = checked_options(args)
    parse_template(args.template, None)
    engine, settings = load_engine(args, changes)
    layout, frames = infill_frames(engine, args.template, settings, prompt=args.prompt, seed=seed)
    last, count = last_and_count(frames)
    result = engine.summarize(last, count)
    text, fills = filled_text(engine.tokenizer, layout, last.committed_ids)
    if args.json:
        print_json({"text": text, "fills": fills, "blank_positions": layout.blanks,
                    "template_positions": layout.template_positions, "result": result.to_dict()})
    else:
        print(text)
        print(f"[{len(layout.blanks)} blank positions filled, {result.forwards} forwards, {result.seconds:.2f} s, "
              f"seed {result.seed}]", file=sys.stderr)
    return 0


def replay_command(args: argparse.Namespace) -> int:
    try:
        trace = load_trace(args.trace)
        write_replay(trace, args.html)
    except TraceError as error:
        return fail(error, f"{args.trace}: ")
    except OSError as error:
        return fail(error.strerror or error, f"cannot write {args.html}: ")
    print(f"wrote {args.html} ({args.html.stat().st_size / 2**20:.2f} MiB, {len(trace.frames)} forwards)",
          file=sys.stderr)
    return 0


def memory_command(args: argparse.Namespace) -> int:
    dtype = torch.bfloat16 if args.dtype == "auto" else getattr(torch, args.dtype)
    report = memory_report(meta_model(args.model, dtype), args.quantization)
    if args.json:
        print_json(report)
    else:
        dtype_name = str(dtype).removeprefix("torch.")
        print(format_report(report, f"{args.model}: {args.quantization}, unquantized tensors in {dtype_name}"))
    return 0


COMMANDS = {"generate": generate_command, "race": race_command, "chat": chat_command, "infill": infill_command,
            "replay": replay_command, "memory": memory_command}

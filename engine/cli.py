"""Command line: `python -m engine generate|race|chat|infill|replay|memory`; errors: one `error:` line, status 2."""

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

from .engine import ChatSession, DiffusionEngine, check_thinking, last_and_count
from .infill import filled_text, infill_frames, parse_template
from .loading import (DEFAULT_MODEL, DEVICES, DTYPES, QUANTIZATIONS, ModelLoadError, load_model, meta_model,
                      model_location, set_serving_threads)
from .quantization import format_report, memory_report
from .race import AR_TEMPERATURE, RaceRunner, race_runner
from .settings import (PRESET_NAMES, SETTING_NAMES, SETTINGS, DiffusionSettings, SettingSpec, check_prompt,
                       parse_seed, preset, spec)
from .trace import TraceError, load_trace, trace_of_run, write_replay
from .wording import plural

RACE_ORDERS = ("alternate", "diffusion-first", "autoregressive-first")


def add_model_flags(parser, model_help: str, *, device: bool = True, dtype_help: str | None = None) -> None:
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help=model_help)
    if device:
        parser.add_argument("--device", default="auto", choices=DEVICES)
        parser.add_argument("--threads", type=int, default=None,
                            help="torch CPU threads (default: one per core)")
    parser.add_argument("--dtype", default="auto", choices=DTYPES, help=dtype_help)
    parser.add_argument("--quantization", default="none", choices=QUANTIZATIONS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description="DiffusionGemma block-diffusion engine")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="generate text for one prompt")
    race = commands.add_parser("race", help="race block diffusion against autoregressive decoding")
    chat = commands.add_parser("chat", help="multi-turn chat, one user turn per stdin line")
    for sub in (gen, race):
        sub.add_argument("--prompt", required=True)
        sub.add_argument("--raw", action="store_true", help="no chat template: tokenize the prompt as is")
    for sub in (gen, chat):
        sub.add_argument("--thinking", action="store_true",
                         help="let the model think first (chat templates with enable_thinking)")
    gen.add_argument("--trace", type=Path, help="also write the run's trace here (JSON: docs/trace.md)")
    race.add_argument("--ar-model", help="causal LM to race (default: the diffusion model's own causal encoder)")
    race.add_argument(AR_TEMPERATURE.flag, type=float, default=0.0, help=AR_TEMPERATURE.help)
    race.add_argument("--order", default="alternate", choices=RACE_ORDERS)
    race.add_argument("--no-warm-up", dest="warm_up", action="store_false", help="skip each side's warm-up")
    chat.add_argument("--system", help="a system message (kept when old turns are cut)")

    infill = commands.add_parser("infill", help="fill the blanks of a template inside one canvas")
    infill.add_argument("--template", required=True, help="text with blanks: [___] one token, [___ 12] twelve")
    infill.add_argument("--prompt", help="raw context before the canvas (default: <bos> only)")

    for sub, one_json in ((gen, "one JSON object instead of the text"), (race, "one JSON object"),
                          (chat, "one JSON object per turn"), (infill, "one JSON object")):
        add_model_flags(sub, "local folder or hub id (default: embedded model)")
        sub.add_argument("--preset", default="recommended", choices=PRESET_NAMES,
                         help="settings to start from; the settings flags override it")
        sub.add_argument("--seed", type=int, default=None, help="-1 or none: a random seed")
        for row in SETTINGS:  # one flag each (infill's budget is its canvas); unset flags stay None
            if row.kind is bool:
                sub.add_argument(row.flag, dest=row.name, action=argparse.BooleanOptionalAction, help=row.help)
            elif sub is not infill or row.name != "max_new_tokens":
                sub.add_argument(row.flag, dest=row.name, type=row.kind, metavar="N" if row.kind is int else "X",
                                 help=f"{row.help}; {row.span()}")
        sub.add_argument("--json", action="store_true", help=f"print {one_json}")

    rep = commands.add_parser("replay", help="write the offline HTML replay of a trace")
    rep.add_argument("trace", type=Path, help="a trace JSON file (python -m engine generate ... --trace FILE)")
    rep.add_argument("--html", type=Path, required=True, help="where to write the HTML page")

    mem = commands.add_parser("memory", help="parameter and buffer bytes by group, without running the model")
    add_model_flags(mem, "checkpoint, or a folder with only config.json", device=False,
                    dtype_help="unquantized tensors' dtype (auto: bfloat16)")
    mem.add_argument("--json", action="store_true", help='print {"total_bytes": N, "groups": {...}}')
    return parser


def flag_value(row: SettingSpec, value) -> int | float | bool:
    """`row.parse(value)`; its `ValueError` names the flag first ("--steps: ...")."""
    try:
        return row.parse(value)
    except ValueError as error:
        raise ValueError(f"{row.flag}: {error}") from None


def load_engine(args: argparse.Namespace, *checks) -> tuple[int | None, DiffusionEngine, DiffusionSettings]:
    """(seed, engine, settings), the flags and `checks` (callables) checked before the model loads."""
    seed = parse_seed(args.seed)
    if args.threads is not None:
        set_serving_threads(torch.device("cpu"), args.threads)
    changes = {name: getattr(args, name) for name in SETTING_NAMES if getattr(args, name, None) is not None}
    for name, value in changes.items():
        flag_value(spec(name), value)
    for check in checks:
        check()
    try:
        where, common = model_location(args.model)
        config = DiffusionGemmaGenerationConfig.from_pretrained(where, local_files_only=common["local_files_only"])
    except Exception:  # noqa: BLE001 - the load reports it
        pass
    else:
        preset(args.preset, DiffusionSettings.from_generation_config(config)).with_values(changes)
    engine = DiffusionEngine(load_model(args.model, args.device, args.dtype, args.quantization))
    return seed, engine, preset(args.preset, engine.recommended).with_values(changes)


def report(args: argparse.Namespace, data: dict, text: str, *notes: str) -> int:
    """Print `data` as one JSON line with --json, else `text` on stdout and `notes` on stderr; 0."""
    if args.json:
        print(json.dumps(data, ensure_ascii=False), flush=True)
        return 0
    print(text, flush=True)
    for note in notes:
        print(note, file=sys.stderr)
    return 0


def fail(error: BaseException | str, prefix: str = "") -> int:
    """Print `prefix` and `error` as one `error:` line (whitespace runs as one space) on stderr; 2."""
    print(f"error: {prefix}{' '.join(str(error).split())}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run the command line; the exit status (2: bad input or a model that does not load)."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (ModelLoadError, ValueError) as error:
        return fail(error)


def generate_command(args: argparse.Namespace) -> int:
    seed, engine, settings = load_engine(args, lambda: check_prompt(args.prompt))
    frames = engine.frames(args.prompt, settings, raw=args.raw, seed=seed, thinking=args.thinking)
    frames = list(frames) if args.trace else frames
    result = engine.summarize(*last_and_count(frames))
    if args.trace:
        trace = trace_of_run(engine, frames, prompt=args.prompt, settings=settings, raw=args.raw,
                             thinking=args.thinking)
        try:
            trace.save(args.trace)
        except OSError as error:
            return fail(error.strerror or error, f"cannot write the trace to {args.trace}: ")
    return report(args, result.to_dict(), result.text, f"[{plural(result.tokens, 'token')}, "
                  f"{plural(result.forwards, 'forward')}, {result.tokens_per_second:.1f} tokens/s, "
                  f"{result.tokens_per_forward:.2f} tokens/forward, {result.seconds:.2f} s, seed {result.seed}]")


def verdict_line(verdict: dict) -> str:
    """`RaceResult.verdict()` as one line of key=value facts."""
    faults = ",".join(f"{side}:{'+'.join(names)}" for side, names in verdict["faults"].items() if names) or "none"
    ratio = verdict["cost_ratio"]
    return (f"winner={verdict['winner'] or 'none'} stopped_side={verdict['stopped_side'] or 'none'} "
            f"cost_ratio={'n/a' if ratio is None else f'{ratio:.2f}'} bound={verdict['bound']} faults={faults}")


def race_command(args: argparse.Namespace) -> int:
    seed, engine, settings = load_engine(args, lambda: check_prompt(args.prompt),
                                         lambda: flag_value(AR_TEMPERATURE, args.ar_temperature))
    runner = race_runner(engine, args.ar_model) if args.ar_model else RaceRunner(engine)
    result = runner.run(args.prompt, settings, raw=args.raw, seed=seed, ar_temperature=args.ar_temperature,
                        order=args.order.replace("-", " "), warm_up=args.warm_up)
    summary, sides = result.summary(), (result.diffusion, result.autoregressive)
    speedup = summary["speedup"]
    return report(args, summary, "\n".join(f"--- {side.name} ({side.model}) ---\n{side.text}" for side in sides),
                  *(f"[{side.line()}]" for side in sides),
                  f"[speedup (diffusion tokens/s / autoregressive tokens/s): "
                  f"{'n/a' if speedup is None else f'{speedup:.2f}x'}; order {', '.join(result.order)}; "
                  f"seed {result.seed}]", f"[verdict: {verdict_line(summary['verdict'])}]")


def chat_command(args: argparse.Namespace) -> int:
    """`chat < turns.txt`: a user turn per non-empty line; a refused turn sets status 2."""
    seed, engine, settings = load_engine(args)
    check_thinking(engine.tokenizer, args.thinking)
    session = ChatSession(engine, system=args.system)
    status = 0
    for turn, text in enumerate((line.rstrip("\n") for line in sys.stdin if line.strip()), start=1):
        try:
            result, used = session.reply(text, settings, seed=seed, thinking=args.thinking)
        except ValueError as error:
            status = fail(error, f"turn {turn}: ")
            continue
        if result.thought and not args.json:
            print(f"[thought]\n{result.thought}\n[/thought]", file=sys.stderr)
        saved = "" if used.prefill_saved_s is None else f", about {used.prefill_saved_s:.3f} s saved"
        report(args, {"turn": turn, "text": result.text, "thought": result.thought, "report": used.to_dict(),
                      "result": result.to_dict()}, result.text, *([f"[note: {used.note}]"] if used.note else []),
               f"[turn {turn}: {used.reused_tokens} of {used.prompt_tokens} prompt tokens reused (not re-encoded), "
               f"prefill {used.prefill_s:.3f} s{saved}; {plural(result.tokens, 'token')}, "
               f"{plural(result.forwards, 'forward')}, seed {result.seed}]")
    return status


def infill_command(args: argparse.Namespace) -> int:
    seed, engine, settings = load_engine(args, lambda: parse_template(args.template, None))
    layout, frames = infill_frames(engine, args.template, settings, prompt=args.prompt, seed=seed)
    result = engine.summarize(*last_and_count(frames))
    text, fills = filled_text(engine.tokenizer, layout, result.token_ids)
    return report(args, {"text": text, "fills": fills, "blank_positions": layout.blanks,
                         "template_positions": layout.template_positions, "result": result.to_dict()}, text,
                  f"[{plural(len(layout.blanks), 'blank position')} filled, {plural(result.forwards, 'forward')}, "
                  f"{result.seconds:.2f} s, seed {result.seed}]")


def replay_command(args: argparse.Namespace) -> int:
    try:
        trace = load_trace(args.trace)
        write_replay(trace, args.html)
    except TraceError as error:
        return fail(error, f"{args.trace}: ")
    except OSError as error:
        return fail(error.strerror or error, f"cannot write {args.html}: ")
    print(f"wrote {args.html} ({args.html.stat().st_size / 2**20:.2f} MiB, {plural(len(trace.frames), 'forward')})",
          file=sys.stderr)
    return 0


def memory_command(args: argparse.Namespace) -> int:
    dtype = "bfloat16" if args.dtype == "auto" else args.dtype
    data = memory_report(meta_model(args.model, getattr(torch, dtype)), args.quantization)
    return report(args, data, format_report(data, f"{args.model}: {args.quantization}, unquantized tensors in {dtype}"))


COMMANDS = {"generate": generate_command, "race": race_command, "chat": chat_command, "infill": infill_command,
            "replay": replay_command, "memory": memory_command}

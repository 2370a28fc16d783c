"""`python -m engine chat [options] < turns.txt`: a multi-turn conversation, one user turn per stdin line.

Each answer goes to stdout as the model wrote it; the turn's report (tokens reused from the previous turn's cache,
prefill seconds, estimated saving, history cuts) and the thought channel (with `--thinking`) go to stderr. `--json` prints one JSON object per turn instead:
{"turn", "text", "thought", "report", "result"}. Empty lines are skipped; a refused turn (empty, too long for the
context) is reported on stderr and the conversation goes on; the exit status is then 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from .chat import ChatSession
from .loading import DEFAULT_MODEL, DEVICES, DTYPES, QUANTIZATIONS, ModelLoadError, load_model
from .settings import parse_seed, parse_setting


def add_chat_parser(commands) -> None:
    """Add the `chat` subcommand to `python -m engine`'s subparsers."""
    chat = commands.add_parser("chat", help="multi-turn chat, one user turn per stdin line (encoder cache reused)")
    chat.add_argument("--model", default=str(DEFAULT_MODEL), help="local folder or hub id (default: embedded model)")
    chat.add_argument("--system", help="a system message (kept when old turns are cut)")
    chat.add_argument("--thinking", action="store_true",
                      help="let the model think first (chat templates with enable_thinking, e.g. Gemma 4)")
    chat.add_argument("--seed", type=int, default=None, help="seed of every turn (default: a fresh one each)")
    chat.add_argument("--max-new-tokens", type=int)
    chat.add_argument("--steps", type=int, help="max denoising steps per canvas")
    chat.add_argument("--device", default="auto", choices=DEVICES)
    chat.add_argument("--dtype", default="auto", choices=DTYPES)
    chat.add_argument("--quantization", default="none", choices=QUANTIZATIONS)
    chat.add_argument("--json", action="store_true", help="print one JSON object per turn")


def chat_command(args: argparse.Namespace, stdin=None) -> int:
    """Run `python -m engine chat`; returns the exit status (2: bad options, a model that does not load, or a
    refused turn)."""
    stdin = stdin or sys.stdin
    changes = {"max_new_tokens": args.max_new_tokens, "max_denoising_steps": args.steps}
    changes = {k: v for k, v in changes.items() if v is not None}
    try:
        parse_seed(args.seed)
        for name, value in changes.items():
            parse_setting(name, value)
        from .engine import DiffusionEngine  # noqa: PLC0415 (torch import only once the options are sound)

        engine = DiffusionEngine(load_model(args.model, args.device, args.dtype, args.quantization))
        settings = engine.recommended.replace(**changes)
        if args.thinking and not engine.supports_thinking:
            raise ValueError("thinking needs a chat template with a thinking mode (enable_thinking); this model's "
                             "template has none")
        session = ChatSession(engine, system=args.system)
    except (ModelLoadError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    status, turn = 0, 0
    for line in stdin:
        text = line.rstrip("\n")
        if not text.strip():
            continue
        turn += 1
        try:
            result, report = session.reply(text, settings, seed=args.seed, thinking=args.thinking)
        except ValueError as error:
            print(f"error: turn {turn}: {error}", file=sys.stderr)
            status = 2
            continue
        if args.json:
            print(json.dumps({"turn": turn, "text": result.text, "thought": result.thought,
                              "report": report.to_dict(), "result": result.to_dict()}, ensure_ascii=False),
                  flush=True)
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

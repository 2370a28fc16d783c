"""What reusing a chat's encoder cache saves: prefill seconds per turn with reuse against re-encoding the whole
conversation, measured on the same turns.

    .venv/bin/python benchmarks/chat_reuse.py [--model PATH] [--turns 6] [--steps 2] [--repeats 3]

A `ChatSession` (engine/chat.py) runs `--turns` user turns (one canvas each, `--steps` denoising steps). After each
turn, the conversation that turn encoded (its prompt up to the point the session caches) is also encoded from
scratch into a fresh cache, `--repeats` times, and the median is taken; the session's own prefill is the figure of
the turn itself (one run, so noisier). Prints one row per turn: prompt tokens, tokens reused, tokens encoded, prefill
seconds with reuse, prefill seconds re-encoding everything, and the session's estimate of the saving.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import DEFAULT_MODEL, DiffusionEngine, load_model  # noqa: E402
from engine.chat import ChatSession, encode_into_cache  # noqa: E402

TURNS = ["Tell me a story about a lighthouse keeper.", "What happened to the keeper's cat?",
         "Why did the light go out that night?", "Who came to help?", "How did the story end?",
         "Summarize it in one sentence.", "Give the story a title.", "Thank you!"]


def reencode_seconds(engine: DiffusionEngine, ids: list[int], settings, repeats: int) -> float:
    """Median seconds to encode `ids` into a fresh cache (the prefill of a session without reuse)."""
    model = engine.model
    tensor = torch.tensor([ids], dtype=torch.long, device=engine.device)
    times = []
    for _ in range(repeats):
        generation_config, _ = model._prepare_generation_config(None, **settings.generate_kwargs())
        cache = model._prepare_cache_for_generation(generation_config, 1, len(ids) + settings.max_new_tokens)
        start = time.perf_counter()
        with torch.no_grad():
            encode_into_cache(model, cache, tensor)
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    engine = DiffusionEngine(load_model(args.model, device=args.device))
    settings = engine.recommended.replace(max_new_tokens=engine.canvas_length, max_denoising_steps=args.steps)
    session = ChatSession(engine)
    engine.warm_up()
    print(f"model {engine.source}, canvas {engine.canvas_length}, {args.steps} steps, torch threads "
          f"{torch.get_num_threads()}")
    print("turn  prompt  reused  encoded  prefill_reuse_s  prefill_full_s  saved_s  estimated_saved_s")
    for turn, text in enumerate(TURNS[:args.turns], start=1):
        session.reply(text, settings, seed=turn)
        report = session.last_report
        cached = len(session._cache_ids)  # the prefix this turn encoded itself (plus denoise's few tokens)
        full = reencode_seconds(engine, session._cache_ids, settings, args.repeats) if cached else 0.0
        print(f"{turn:>4}  {report.prompt_tokens:>6}  {report.reused_tokens:>6}  {report.encoded_tokens:>7}  "
              f"{report.prefill_s:>15.4f}  {full:>14.4f}  {full - report.prefill_s:>7.4f}  "
              f"{'-' if report.prefill_saved_s is None else f'{report.prefill_saved_s:.4f}':>17}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

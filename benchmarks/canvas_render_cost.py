"""Server-side cost of drawing the canvas at the real vocabulary: one block of 256 positions as HTML, per frame.

Frames of uniformly random ids over the 262,144-token Gemma vocabulary (the stand-in's tokenizer; a quarter to a third
of positions accepted, the rest renoised: the live block's worst case, with ~2.4% special tokens and some byte
pieces), through the engine's `TokenText` (display strings and kinds) and `canvas_view.block_html`. Prints CPU
milliseconds per frame (process time: other processes on the machine do not inflate it).

    python benchmarks/canvas_render_cost.py [--tokenizer DIR] [--frames 60]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", help="a tokenizer folder (default: the stand-in, built if needed)")
    parser.add_argument("--frames", type=int, default=60)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from diffgemma_ui import canvas_view
    from engine import Frame
    from engine.tokens import TokenText

    if args.tokenizer is None:
        from standin import ensure_standin

        args.tokenizer = ensure_standin()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    token_text = TokenText(tokenizer, eos_token_ids=[1, 106, 50], pad_token_id=0,
                           special_ids=[255999, 258880, 258882])
    rng = random.Random(0)
    n, frames, lookups = 256, [], 0.0
    for index in range(args.frames):
        input_ids = [rng.randrange(len(tokenizer)) for _ in range(n)]
        draft_ids = [rng.randrange(len(tokenizer)) for _ in range(n)]
        for ids in (input_ids, draft_ids):  # fill the cache as a run does (its cost is paid once per id)
            for token_id in ids:
                token_text.describe(token_id)
        start = time.process_time()
        strings = ([token_text(i) for i in input_ids], [token_text(i) for i in draft_ids],
                   [token_text.kind(i) for i in input_ids], [token_text.kind(i) for i in draft_ids])
        lookups += time.process_time() - start
        accepted = [rng.random() < 0.3 for _ in range(n)]
        frames.append(Frame(
            block_index=0, step_index=index, forward_index=index, canvas_length=n, max_denoising_steps=48,
            temperature=0.6, input_ids=input_ids, draft_ids=draft_ids, accepted=accepted,
            confidence=[rng.random() for _ in range(n)], entropy=[rng.random() * 5 for _ in range(n)],
            first_accepted_step=[0 if a else -1 for a in accepted], input_tokens=strings[0], draft_tokens=strings[1],
            input_kinds=strings[2], draft_kinds=strings[3], block_done=False, block_stopped_early=False, done=False,
            committed_ids=draft_ids, committed_tokens=n, forwards_per_block=[], elapsed_s=1.0,
            time_to_first_frame_s=0.1, tokens_per_second=1.0, tokens_per_forward=1.0,
        ))
    print(f"token strings and kinds (cached lookups, 4 x {n}): {lookups / len(frames) * 1e3:.2f} ms CPU per frame")
    for live in (True, False):
        canvas_view.block_html(frames[0], live=live)
        start = time.process_time()
        for frame in frames:
            canvas_view.block_html(frame, live=live)
        label = "live block (draft + noise)" if live else "finished block"
        print(f"block_html, {label}, {n} positions: {(time.process_time() - start) / len(frames) * 1e3:.2f} ms CPU "
              "per frame")


if __name__ == "__main__":
    main()

"""Size of a trace and of its offline HTML replay for a run of the real model's size, without the model.

    python -m benchmarks.replay_size [--canvas 256] [--steps 48] [--blocks 1] [--vocab 262144] [--out DIR]

Builds a synthetic trace of a `--blocks` x `--canvas`-token run of `--steps` decoder forwards per block (the real
checkpoint: canvas 256, 48 steps, vocabulary 262,144): uniformly random noise ids every step (so the token table is
as large as a real run's), a draft that settles as positions are accepted, confidences and entropies with 3 decimals.
Prints the trace JSON size, the HTML size and the time to build it; `--out` also writes both files.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from engine.frames import Frame
from engine.settings import DiffusionSettings
from engine.trace import ModelInfo, Trace


def synthetic_trace(canvas: int = 256, steps: int = 48, blocks: int = 1, vocab: int = 262_144, seed: int = 0,
                    token_text=None, adaptive_stopping: bool = False) -> Trace:
    """A `Trace` of a synthetic run: `blocks` canvases of `canvas` positions, `steps` forwards each, random ids in
    `[0, vocab)`; `token_text(id)` gives the strings (default: a pseudo-word per id)."""
    rng = random.Random(seed)
    token_text = token_text or (lambda i: f" w{i % 9973}" if i % 7 else f"<{i}>")
    settings = DiffusionSettings(max_new_tokens=blocks * canvas, max_denoising_steps=steps,
                                 adaptive_stopping=adaptive_stopping)
    frames, committed, forwards_per_block, elapsed = [], [], [], 0.0
    for block in range(blocks):
        draft = [rng.randrange(vocab) for _ in range(canvas)]
        first = [-1] * canvas
        order = list(range(canvas))
        rng.shuffle(order)
        for step in range(steps):
            accepted_now = set(order[: (step + 1) * canvas // steps])
            for pos in range(canvas):
                if pos not in accepted_now and rng.random() < 0.5:
                    draft[pos] = rng.randrange(vocab)
                if pos in accepted_now and first[pos] < 0:
                    first[pos] = step
            accepted = [pos in accepted_now for pos in range(canvas)]
            noise = [draft[p] if accepted[p] else rng.randrange(vocab) for p in range(canvas)]
            elapsed += 0.05
            block_done = step == steps - 1
            if block_done:
                committed = committed + list(draft)
                forwards_per_block = forwards_per_block + [steps]
            done = block_done and block == blocks - 1
            frames.append(Frame(
                block_index=block, step_index=step, forward_index=len(frames), canvas_length=canvas,
                max_denoising_steps=steps, temperature=0.8, input_ids=noise, draft_ids=list(draft),
                accepted=accepted, confidence=[rng.random() for _ in range(canvas)],
                entropy=[rng.random() * 3 for _ in range(canvas)], first_accepted_step=list(first),
                input_tokens=[], draft_tokens=[], block_done=block_done, block_stopped_early=False, done=done,
                committed_ids=list(committed), committed_tokens=len(committed),
                forwards_per_block=list(forwards_per_block), elapsed_s=elapsed, time_to_first_frame_s=0.05,
                tokens_per_second=0.0, tokens_per_forward=0.0, prompt_tokens=4, seed=seed,
                stop_reason="max_new_tokens" if done else "",
            ))
    model = ModelInfo(name="synthetic", revision="", device="cpu", dtype="float32", canvas_length=canvas)
    return Trace.from_frames(frames, model=model, settings=settings, prompt="In the beginning", raw=True,
                             prompt_ids=[2, 10, 11, 12], token_text=token_text,
                             text="".join(token_text(i) for i in committed))


def main(argv: list[str] | None = None) -> None:
    from diffgemma_ui.replay_html import replay_html

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--canvas", type=int, default=256)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--blocks", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=262_144)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    trace = synthetic_trace(args.canvas, args.steps, args.blocks, args.vocab)
    start = time.perf_counter()
    page = replay_html(trace)
    seconds = time.perf_counter() - start
    text = trace.to_json()
    print(f"run: {args.blocks} block(s) x {args.canvas} positions x {args.steps} steps, vocabulary {args.vocab:,}, "
          f"{len(trace.tokens):,} distinct token ids")
    print(f"trace JSON: {len(text.encode()):,} bytes ({len(text.encode()) / 2**20:.2f} MiB)")
    print(f"HTML replay: {len(page.encode()):,} bytes ({len(page.encode()) / 2**20:.2f} MiB), built in {seconds:.2f} s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        trace.save(args.out / "trace.json")
        (args.out / "replay.html").write_text(page, encoding="utf-8")
        print(f"wrote {args.out / 'trace.json'} and {args.out / 'replay.html'}")


if __name__ == "__main__":
    main()

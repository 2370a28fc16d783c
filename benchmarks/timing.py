"""Timing one generation path, bare `generate()` or the engine's frames, as `Run`s interleaved over seeds and
summarized: shared by `benchmarks.bench` and the GPU kit (`benchmarks/gpu/`). It imports torch, psutil and the
engine only, which the GPU machine has (it has no Gradio)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch

from engine.engine import DiffusionEngine
from engine.generator import strip_after_eos
from engine.settings import DiffusionSettings

SCALING_TEXT = (
    "The quick brown fox jumps over the lazy dog while the farmer counts his sheep in the morning light. "
    "Rain fell on the old town, and the river carried leaves past the mill, the bridge and the quiet church. "
)


@dataclass(frozen=True)
class Run:
    """One timed generation: wall `seconds` around the whole call, the generated `token_ids` (up to EOS), the
    decoder `forwards`, and for engine runs `time_to_first_frame_s` and `forwards_per_block` (else None).
    `cpu_seconds`: CPU time the call used in every process involved (this one, and the app's for API calls); unlike
    wall time it barely moves when other programs compete for the cores."""

    seconds: float
    token_ids: list[int]
    forwards: int | None = None
    time_to_first_frame_s: float | None = None
    forwards_per_block: list[int] | None = None
    engine_seconds: float | None = None
    cpu_seconds: float | None = None

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def spread(values: list[float], digits: int = 4) -> dict:
    """{"median", "min", "max"} of `values`, rounded."""
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


class Stopwatch:
    """Wall time (perf_counter) and CPU time (this process, plus `other` processes given by pid) of a block."""

    def __init__(self, *other_pids: int):
        self._others = [psutil.Process(pid) for pid in other_pids]

    def _cpu(self) -> float:
        return time.process_time() + sum(sum(p.cpu_times()[:2]) for p in self._others)

    def __enter__(self):
        self._cpu_start, self._start = self._cpu(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._start
        self.cpu_seconds = self._cpu() - self._cpu_start
        return False


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def counted_ids(engine: DiffusionEngine, generated: list[int]) -> list[int]:
    """The generated ids that count as output: up to and including the first EOS, pads dropped."""
    config = engine.model.generation_config
    ids = strip_after_eos(generated, config.eos_token_id)
    return [t for t in ids if t != config.pad_token_id]


def run_bare(engine: DiffusionEngine, input_ids: torch.Tensor, settings: DiffusionSettings, seed: int) -> Run:
    """`torch.manual_seed(seed); model.generate(input_ids, **settings.generate_kwargs())`, timed."""
    synchronize(engine.device)
    with Stopwatch() as watch:
        torch.manual_seed(seed)
        output = engine.model.generate(input_ids, **settings.generate_kwargs())
        synchronize(engine.device)
    sequences = getattr(output, "sequences", output)
    return Run(watch.seconds, counted_ids(engine, sequences[0, input_ids.shape[1]:].tolist()),
               cpu_seconds=watch.cpu_seconds)


def run_engine(engine: DiffusionEngine, prompt: str, settings: DiffusionSettings, seed: int, raw: bool) -> Run:
    """Consume every frame of `engine.frames(prompt, ...)`, timed (prompt encoding included)."""
    frames, last = 0, None
    with Stopwatch() as watch:
        for last in engine.frames(prompt, settings, raw=raw, seed=seed):
            frames += 1
    return Run(watch.seconds, counted_ids(engine, list(last.committed_ids)), frames, last.time_to_first_frame_s,
               list(last.forwards_per_block), last.elapsed_s, watch.cpu_seconds)


def interleave(paths: dict[str, Callable[[int], Run]], seeds: tuple[int, ...], repeats: int,
               warmup: bool = True) -> dict[str, list[Run]]:
    """Warm each path up once (seed 12345, discarded), then run `repeats` rounds over `seeds`, alternating which
    path goes first; returns the runs of each path in the same order (run k of every path used the same seed)."""
    for run in paths.values() if warmup else ():
        run(12345)
    runs: dict[str, list[Run]] = {name: [] for name in paths}
    names = list(paths)
    for round_index in range(repeats):
        for i, seed in enumerate(seeds):
            for name in names if (round_index + i) % 2 == 0 else names[::-1]:
                runs[name].append(paths[name](seed))
    return runs


def path_summary(runs: list[Run]) -> dict:
    """tokens/s, seconds and tokens of a list of runs."""
    return {"tokens_per_second": spread([r.tokens_per_second for r in runs], 2),
            "seconds": spread([r.seconds for r in runs]), "tokens": spread([r.tokens for r in runs], 1)}


def ratio(slow: list[Run], fast: list[Run], clock: str = "seconds") -> dict:
    """Run-by-run `slow / fast` time on `clock` ("seconds": wall, "cpu_seconds": CPU); the runs pair up by
    position (same seed, same round)."""
    return spread([getattr(s, clock) / getattr(f, clock) for s, f in zip(slow, fast)])


def same_tokens(a: list[Run], b: list[Run]) -> bool:
    return all(x.token_ids == y.token_ids for x, y in zip(a, b))


def scaling_prompt(engine: DiffusionEngine, length: int) -> str:
    """A raw prompt of about `length` tokens, special tokens the tokenizer adds included (English text repeated and
    cut; the benchmark reports the exact count it encodes to)."""
    tokenizer = engine.tokenizer
    added = len(tokenizer("a").input_ids) - len(tokenizer("a", add_special_tokens=False).input_ids)
    text = SCALING_TEXT * (length // 20 + 2)
    return tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids[: max(1, length - added)])


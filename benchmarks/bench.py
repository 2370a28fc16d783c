"""Speed of the engine and the playground against bare `generate()`: `python -m benchmarks.bench [--quick] [--json]`.

What it measures, on one model (the embedded diffgemma-tiny unless `--model`), after the engine's warm-up as the app
does it (`DiffusionEngine.warm_up`), each with a warm-up run first, then
repetitions interleaved path by path (alternating which path goes first) over a few seeds, reported as the median
with min and max:

(a) engine overhead: bare `model.generate()` (perf_counter around `torch.manual_seed(s); model.generate(ids,
    **settings.generate_kwargs())`) against consuming every frame of `DiffusionEngine.frames()` with the same
    settings and seed; `engine_overhead_ratio` = engine seconds / bare seconds, run by run. Both produce the same
    tokens (checked).
(b) UI overhead: the same run through the playground's Gradio API (`/generate` of `app.py` launched as a
    subprocess on a free local port) against the bare run; `ui_overhead_ratio` = round-trip seconds over Gradio's
    REST call API / bare seconds; gradio_client's round trip (it polls for messages every 50 ms) beside. The app's
    own engine clock splits the gap into engine and HTTP/queue time.
(c) the race, diffusion vs autoregressive decoding of the same weights (`engine.race.RaceRunner`, the Race tab's
    engine): at the recommended and the fast preset, races over a few seeds, the order alternating, each side after
    its warm-up; both sides stop at EOS within the same token budget; speedup = diffusion tokens/s / AR tokens/s,
    with tokens per forward and the measured cost of one forward on each side (and the GPU bandwidth bound).
(d) tokens per forward, forwards per block, time to first frame, peak memory.
(e) scaling: tokens/s at 1, 2, 4 and 8 output blocks (adaptive stopping off, so every canvas runs all its steps)
    and at prompt lengths from 16 to 2048 tokens (one block).
(f) `--ways-only`: the ways to watch the model denoise, for one chat prompt, settings and seed: bare `generate()`;
    `generate()` with a logits streamer computing each position's draft, confidence and entropy; `generate()` with
    `TextDiffusionStreamer`-style argmax drafts; diffusers' `DiffusionGemmaPipeline` with a step callback computing
    the same statistics; the engine's frames. Rounds after a warm-up, each path once per round with the round's
    seed in a rotating order; per-round ratios to bare on this thread's CPU time (wall beside), median [q1..q3];
    `--readings` independent readings with the load average; which paths gave bare's tokens. `--standin`: at the
    real vocabulary and canvas.

Tokens counted: generated tokens up to and including the first EOS; the prompt and the pads after EOS are never
counted. Seconds include prompt encoding and prefill.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import httpx
import torch
from gradio_client import Client
from transformers.generation.streamers import BaseStreamer, TextDiffusionStreamer

from benchmarks.timing import (Run, Stopwatch, counted_ids, interleave, path_summary, ratio, run_bare, run_engine,
                               same_tokens, scaling_prompt, spread, synchronize)
from engine.diffusers_sampler import import_diffusers, make_scheduler, turn_end_id
from engine.engine import DiffusionEngine
from engine.loading import DEFAULT_MODEL, DEVICES, DTYPES, REPO_ROOT, load_model
from engine.race import RaceResult, RaceRunner
from engine.sampling import canvas_statistics
from engine.settings import DiffusionSettings, preset
from standin import ensure_standin

TOKENS_COUNTED = ("generated tokens up to and including the first EOS; prompt and pad tokens are never counted; "
                  "seconds include prompt encoding and prefill")
DEFAULT_RACE_PROMPT = "Tell me what happened after the flood."  # the Race tab's default (a chat prompt)


@dataclass(frozen=True)
class Mode:
    """How much to measure: repetitions, seeds, canvases per run and the scaling grid."""

    repeats: int
    seeds: tuple[int, ...]
    blocks: int                    # canvases per run in (a), (b) and (c)
    ui_repeats: int
    ar_repeats: int
    scaling_repeats: int
    output_blocks: tuple[int, ...]
    prompt_lengths: tuple[int, ...]
    # Denoising steps per canvas of the fixed runs of (a), (b) and (e); None: the base settings' own. Fixed, so
    # that the overhead ratios do not move when a checkpoint's recommended steps change (the embedded v2 recommends
    # 16: half-length runs, on which the fixed HTTP cost of (b) weighs twice as much)
    fixed_steps: int | None = None


QUICK = Mode(repeats=2, seeds=(0, 1), blocks=2, ui_repeats=2, ar_repeats=1, scaling_repeats=1,
             output_blocks=(1, 2, 4, 8), prompt_lengths=(16, 256, 2048), fixed_steps=32)
FULL = Mode(repeats=3, seeds=(0, 1, 2), blocks=4, ui_repeats=3, ar_repeats=3, scaling_repeats=3,
            output_blocks=(1, 2, 4, 8), prompt_lengths=(16, 64, 256, 1024, 2048), fixed_steps=32)


# -- one run of each path ----------------------------------------------------------------------------------------


def api_inputs(prompt: str, settings: DiffusionSettings, seed: int, raw: bool) -> list:
    """`/generate`'s inputs, in order."""
    return [prompt, raw, settings.max_new_tokens, settings.max_denoising_steps, settings.entropy_bound,
            settings.t_min, settings.t_max, settings.stability_threshold, settings.confidence_threshold,
            settings.adaptive_stopping, seed]


def rest_predict(http: httpx.Client, url: str, inputs: list) -> list:
    """`/generate` over Gradio's REST call API (POST, then its event stream read to `event: complete`): no client
    library polling between the server's messages. Returns the endpoint's outputs; RuntimeError on an error event."""
    event_id = http.post(f"{url}gradio_api/call/generate", json={"data": inputs}).raise_for_status().json()["event_id"]
    event = None
    with http.stream("GET", f"{url}gradio_api/call/generate/{event_id}") as response:
        for line in response.raise_for_status().iter_lines():
            if line.startswith("event:"):
                event = line.removeprefix("event:").strip()
            elif line.startswith("data:") and event in ("complete", "error"):
                data = json.loads(line.removeprefix("data:"))
                if event == "error":
                    raise RuntimeError(f"/generate failed: {data}")
                return data
    raise RuntimeError("/generate's event stream ended without a result")


def run_client(engine: DiffusionEngine, client, prompt: str, settings: DiffusionSettings, seed: int, raw: bool,
               app_pid: int | None = None) -> Run:
    """One `/generate` call, timed on the client: `client` a gradio_client.Client, or (httpx.Client, url) for the
    REST call API; the app's engine clock kept beside. CPU time counts this process and the app's (`app_pid`;
    None: the app is served in this process)."""
    inputs = api_inputs(prompt, settings, seed, raw)
    with Stopwatch(*([app_pid] if app_pid else [])) as watch:
        if isinstance(client, tuple):
            _, summary = rest_predict(*client, inputs)
        else:
            _, summary = client.predict(*inputs, api_name="/generate")
    return Run(watch.seconds, counted_ids(engine, summary["token_ids"]), summary["forwards"],
               summary["time_to_first_frame_s"], summary["forwards_per_block"], summary["seconds"], watch.cpu_seconds)


# -- the measurements --------------------------------------------------------------------------------------------
def against_bare(bare: list, runs: list, path: str, ratio_key: str) -> dict:
    """Both paths' summaries, `ratio_key` (wall seconds, run by run) and `<ratio_key>_cpu`, same tokens, run count."""
    return {"bare_generate": path_summary(bare), path: path_summary(runs), ratio_key: ratio(runs, bare),
            f"{ratio_key}_cpu": ratio(runs, bare, "cpu_seconds"), "same_tokens": same_tokens(bare, runs),
            "runs": len(runs)}


def measure_engine_overhead(engine: DiffusionEngine, prompt: str, settings: DiffusionSettings, mode: Mode,
                            raw: bool = True) -> dict:
    """(a) bare `generate()` against the engine yielding every frame; `engine_overhead_ratio` (target <= 1.03)."""
    input_ids = engine.encode_prompt(prompt, raw=raw)
    runs = interleave({
        "bare": lambda seed: run_bare(engine, input_ids, settings, seed),
        "engine": lambda seed: run_engine(engine, prompt, settings, seed, raw),
    }, mode.seeds, mode.repeats)
    engine_runs = runs["engine"]
    return {
        **against_bare(runs["bare"], engine_runs, "engine_frames", "engine_overhead_ratio"),
        "tokens_per_forward": spread([r.tokens / r.forwards for r in engine_runs], 3),
        "forwards_per_block": sorted({f for r in engine_runs for f in r.forwards_per_block}),
        "time_to_first_frame_s": spread([r.time_to_first_frame_s for r in engine_runs]),
    }


def run_command(commands: dict[str, Callable[[list[str]], int]], prog: str, doc: str,
                argv: list[str] | None = None) -> int:
    """Run the command named by `argv[0]` (default: the process's arguments) of `commands` with the rest; 2 with the
    usage and `doc` on stderr for a missing or unknown one."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in commands:
        print(f"usage: {prog} {{{','.join(commands)}}} [--help]\n\n{doc}", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:]) or 0


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def launched_app(model: str | None = None, device: str = "auto", dtype: str | None = None, threads: int | None = None,
                 timeout_s: float = 240.0) -> Iterator[tuple]:
    """Run `app.py` on a free loopback port in a subprocess (`model`: None for the embedded one; `dtype`, `threads`:
    None for the app's defaults; no server time limit); yields (url, process) once the page answers, and stops the
    process afterwards.

    Raises:
        RuntimeError: the app exited before serving (with the end of its output) or did not answer in `timeout_s`.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    env.pop("DIFFGEMMA_SHARE", None)
    command = [sys.executable, str(REPO_ROOT / "app.py"), "--device", device, "--max-run-seconds", "0", "--host",
               "127.0.0.1", "--port", str(port), "--no-share"]
    for flag, value in (("--model", model), ("--dtype", dtype), ("--threads", threads)):
        if value is not None:
            command += [flag, str(value)]
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if process.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"app.py exited with status {process.returncode} before serving: "
                                       f"{log.read()[-2000:]}")
                try:
                    with urllib.request.urlopen(url, timeout=5):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"app.py did not answer on {url} within {timeout_s:.0f} s") from None
                    time.sleep(0.5)
            yield url, process
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def peak_rss_mb(pid: int) -> float | None:
    """A process's peak resident memory (VmHWM) in MiB, where /proc has it."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def measure_ui_overhead(engine: DiffusionEngine, url: str, prompt: str, settings: DiffusionSettings, mode: Mode,
                        raw: bool = True, app_pid: int | None = None) -> dict:
    """(b) the same runs through the app at `url` (its `/generate` API, via gradio_client) against bare
    `generate()`; `ui_overhead_ratio` (target <= 1.05) = client round trip / bare seconds, run by run.
    `app_pid`: the app's process, whose CPU time counts too (None: the app runs in this process)."""

    input_ids = engine.encode_prompt(prompt, raw=raw)
    client = Client(url, verbose=False)
    with httpx.Client(timeout=None) as http:
        runs = interleave({
            "bare": lambda seed: run_bare(engine, input_ids, settings, seed),
            "rest": lambda seed: run_client(engine, (http, url), prompt, settings, seed, raw, app_pid),
            "client": lambda seed: run_client(engine, client, prompt, settings, seed, raw, app_pid),
        }, mode.seeds, mode.ui_repeats)
    rest, client_runs, bare = runs["rest"], runs["client"], runs["bare"]
    return {
        **against_bare(bare, rest, "rest_call", "ui_overhead_ratio"),
        "gradio_client": path_summary(client_runs), "gradio_client_ratio": ratio(client_runs, bare),
        "same_tokens": same_tokens(bare, rest) and same_tokens(bare, client_runs),
        "app_engine_over_bare": spread([c.engine_seconds / b.seconds for c, b in zip(rest, bare)]),
        "http_and_queue_s": spread([c.seconds - c.engine_seconds for c in rest]),
        "gradio_client_http_and_queue_s": spread([c.seconds - c.engine_seconds for c in client_runs]),
    }


RACE_PRESETS = ("recommended", "fast")


def measure_race(engine: DiffusionEngine, prompt: str, base: DiffusionSettings, mode: Mode, raw: bool = True,
                 presets: tuple[str, ...] = RACE_PRESETS) -> dict:
    """(c) races (`RaceRunner`, the order alternating) at each preset of `presets` applied to `base`, over
    `mode.seeds` x `mode.ar_repeats`; per preset: the speedup and each side's tokens/s, tokens, tokens per forward
    and cost per forward (ms), as median [min..max], and on a GPU the bandwidth bound of each side."""
    runner = RaceRunner(engine)
    rows = {}
    for name in presets:
        settings = preset(name, engine.recommended).replace(max_new_tokens=base.max_new_tokens)
        races: list[RaceResult] = [runner.run(prompt, settings, raw=raw, seed=seed)
                                   for _ in range(mode.ar_repeats) for seed in mode.seeds]
        row = {"settings": settings.__dict__, "races": len(races),
               "speedup": spread([r.speedup or 0.0 for r in races], 3)}
        for side in ("diffusion", "autoregressive"):
            results = [getattr(r, side) for r in races]
            row[side] = {
                "tokens_per_second": spread([s.tokens_per_second for s in results], 2),
                "tokens": spread([s.tokens for s in results], 1),
                "tokens_per_forward": spread([s.tokens_per_forward for s in results], 3),
                "ms_per_forward": spread([s.seconds_per_forward * 1000 for s in results], 3),
                "time_to_first_token_ms": spread([(s.time_to_first_token_s or 0.0) * 1000 for s in results], 1),
                "stop_reasons": sorted({s.stop_reason for s in results}),
            }
            if results[0].bandwidth_bound_s_per_forward:
                row[side]["bandwidth_bound_ms_per_forward"] = round(results[0].bandwidth_bound_s_per_forward * 1000, 4)
                row[side]["weights_bytes_per_forward"] = results[0].weights_bytes_per_forward
        row["memory_bandwidth_gb_s"] = races[0].memory_bandwidth_gb_s
        rows[name] = row
    return {"presets": rows, "length_rule": races[0].length_rule, "prompt": prompt, "raw": raw}


def measure_output_scaling(engine: DiffusionEngine, prompt: str, settings: DiffusionSettings, mode: Mode) -> list:
    """(e) engine tokens/s at 1, 2, 4, 8 output blocks, adaptive stopping off."""
    rows = []
    for blocks in mode.output_blocks:
        fixed = settings.replace(max_new_tokens=blocks * engine.canvas_length, adaptive_stopping=False)
        runs = interleave({"engine": lambda seed: run_engine(engine, prompt, fixed, seed, True)},
                          mode.seeds[:1], mode.scaling_repeats, warmup=False)["engine"]
        rows.append({"blocks": blocks, "max_new_tokens": fixed.max_new_tokens, **path_summary(runs),
                     "forwards": runs[0].forwards,
                     "time_to_first_frame_s": spread([r.time_to_first_frame_s for r in runs])})
    return rows


def measure_prompt_scaling(engine: DiffusionEngine, settings: DiffusionSettings, mode: Mode) -> list:
    """(e) engine tokens/s and time to first frame at growing prompt lengths, one block, adaptive stopping off."""
    fixed = settings.replace(max_new_tokens=engine.canvas_length, adaptive_stopping=False)
    rows = []
    for length in mode.prompt_lengths:
        prompt = scaling_prompt(engine, length)
        runs = interleave({"engine": lambda seed: run_engine(engine, prompt, fixed, seed, True)},
                          mode.seeds[:1], mode.scaling_repeats, warmup=False)["engine"]
        rows.append({"prompt_tokens": int(engine.encode_prompt(prompt, raw=True).shape[1]), **path_summary(runs),
                     "time_to_first_frame_s": spread([r.time_to_first_frame_s for r in runs])})
    return rows


def memory_summary(device: torch.device) -> dict:
    """Peak resident memory of this process (and peak CUDA memory allocated on a GPU)."""
    summary = {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if device.type == "cuda":
        summary["peak_gpu_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return summary


# -- (f) ways to watch the model denoise -------------------------------------------------------------------------
WAYS = ("bare", "logits_streamer", "draft_streamer", "diffusers", "engine")
WAY_LABELS = {
    "bare": "bare model.generate()",
    "logits_streamer": "generate(streamer), logits + stats",
    "draft_streamer": "generate(streamer), argmax drafts",
    "diffusers": "diffusers pipeline + step callback",
    "engine": "engine.frames(), every frame",
}


class LogitsStreamer(BaseStreamer):
    """A `generate()` streamer that takes the logits (`_takes_logits`): after every decoder forward it receives the
    temperature-scaled logits `[1, canvas, vocab]` on the host and computes what the playground shows of each
    position (argmax draft, confidence, entropy) as Python lists. `steps`: one (draft, confidence, entropy) per
    forward."""

    _takes_logits = True

    def __init__(self):
        self.steps: list[tuple[list[int], list[float], list[float]]] = []

    def put(self, value) -> None:
        """Committed ids (the prompt, then each finished canvas): nothing to compute."""

    def put_draft(self, logits) -> None:
        draft = logits[0].argmax(dim=-1)
        confidence, entropy = canvas_statistics(logits[0], draft)
        self.steps.append((draft.tolist(), confidence.tolist(), entropy.tolist()))

    def end(self) -> None:
        """Generation ended."""


class DraftStreamer(TextDiffusionStreamer):
    """`TextDiffusionStreamer` without the terminal: each forward's argmax draft decoded to text and kept (`drafts`),
    committed text kept in `text`. No confidence: transformers hands a plain streamer the argmax canvas only."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, skip_prompt=True)
        self.drafts: list[str] = []
        self.text = ""

    def put_draft(self, value, **kwargs) -> None:
        self.drafts.append(self.tokenizer.decode(value[0], **self.decode_kwargs))

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.text += text


class Clock:
    """Wall time, process CPU time and this thread's CPU time of a block (seconds)."""

    def __enter__(self):
        gc.collect()
        self._start = (time.perf_counter(), time.process_time(), time.thread_time())
        return self

    def __exit__(self, *exc):
        end = (time.perf_counter(), time.process_time(), time.thread_time())
        self.wall, self.cpu, self.thread = (b - a for a, b in zip(self._start, end))
        return False


@dataclass(frozen=True)
class WayRun:
    """One timed run of one way: wall, process CPU and thread CPU seconds, the generated ids (pads dropped, up to
    EOS) and decoder forwards."""

    wall: float
    cpu: float
    thread: float
    token_ids: list[int]
    forwards: int


class Ways:
    """The five ways to get a run's tokens, each a callable `seed -> WayRun` on the same prompt ids and settings.

    `settings`: their max_new_tokens, steps, entropy bound and temperatures go to every way (diffusers'
    `EntropyBoundScheduler` included); adaptive stopping must be off so that every way runs the same forwards.
    The prompt is the chat prompt (the diffusers pipeline always applies the chat template).
    """

    def __init__(self, engine: DiffusionEngine, prompt: str, settings: DiffusionSettings):
        if settings.adaptive_stopping:
            raise ValueError("the ways comparison needs adaptive stopping off (every way then runs the same forwards)")
        self.engine, self.prompt, self.settings = engine, prompt, settings
        self.input_ids = engine.encode_prompt(prompt)
        scheduler = make_scheduler("EntropyBoundScheduler", settings)
        self.pipe = import_diffusers().DiffusionGemmaPipeline(model=engine.model, scheduler=scheduler,
                                                              processor=engine.tokenizer)
        self.pipe.set_progress_bar_config(disable=True)
        self.eos = turn_end_id(engine.tokenizer, engine.model.generation_config.eos_token_id)

    def _generate(self, seed: int, streamer=None) -> tuple[Clock, list[int]]:
        with Clock() as clock:
            torch.manual_seed(seed)
            output = self.engine.model.generate(self.input_ids, streamer=streamer, **self.settings.generate_kwargs())
            synchronize(self.engine.device)
        sequences = getattr(output, "sequences", output)
        return clock, counted_ids(self.engine, sequences[0, self.input_ids.shape[1]:].tolist())

    def bare(self, seed: int) -> WayRun:
        clock, ids = self._generate(seed)
        return WayRun(clock.wall, clock.cpu, clock.thread, ids, self.forwards)

    def logits_streamer(self, seed: int) -> WayRun:
        streamer = LogitsStreamer()
        clock, ids = self._generate(seed, streamer)
        return WayRun(clock.wall, clock.cpu, clock.thread, ids, len(streamer.steps))

    def draft_streamer(self, seed: int) -> WayRun:
        streamer = DraftStreamer(self.engine.tokenizer)
        clock, ids = self._generate(seed, streamer)
        return WayRun(clock.wall, clock.cpu, clock.thread, ids, len(streamer.drafts))

    def diffusers(self, seed: int) -> WayRun:
        steps = []

        def on_step(pipeline, global_step, step_index, tensors):
            logits = tensors["logits"][0]
            draft = logits.argmax(dim=-1)
            confidence, entropy = canvas_statistics(logits, draft)
            steps.append((tensors["canvas"][0].tolist(), draft.tolist(), confidence.tolist(), entropy.tolist()))
            return {}

        s = self.settings
        with Clock() as clock:
            generator = torch.Generator(device=self.engine.device).manual_seed(seed)
            output = self.pipe(prompt=self.prompt, gen_length=s.max_new_tokens,
                               num_inference_steps=s.max_denoising_steps, eos_token_id=self.eos,
                               confidence_threshold=None, generator=generator, output_type="seq",
                               callback_on_step_end=on_step, callback_on_step_end_tensor_inputs=["canvas", "logits"])
            synchronize(self.engine.device)
        return WayRun(clock.wall, clock.cpu, clock.thread, counted_ids(self.engine, output.sequences[0].tolist()),
                      len(steps))

    def engine_frames(self, seed: int) -> WayRun:
        frames, last = 0, None
        with Clock() as clock:
            for last in self.engine.frames(self.prompt, self.settings, seed=seed):
                frames += 1
        return WayRun(clock.wall, clock.cpu, clock.thread, counted_ids(self.engine, list(last.committed_ids)), frames)

    @property
    def forwards(self) -> int:
        """Decoder forwards of one run (adaptive stopping off: every canvas runs all its steps)."""
        return math.ceil(self.settings.max_new_tokens / self.engine.canvas_length) * self.settings.max_denoising_steps

    def paths(self) -> dict[str, Callable[[int], WayRun]]:
        return {"bare": self.bare, "logits_streamer": self.logits_streamer, "draft_streamer": self.draft_streamer,
                "diffusers": self.diffusers, "engine": self.engine_frames}


def rounds(paths: dict[str, Callable[[int], WayRun]], count: int, report: Callable[[str], None] = lambda _: None
           ) -> dict[str, list[WayRun]]:
    """Warm every path up (seed 12345, discarded), then `count` rounds; round k runs every path once with seed k, in
    an order rotated by k and reversed on odd k (each path takes every place in turn). Returns each path's runs,
    round by round."""
    names = list(paths)
    for name in names:
        report(f"warm-up {name}: {paths[name](12345).thread:.3f} s")
    gc.collect()
    gc.freeze()  # the model's and tokenizer's objects: later collections (one before each run) skip them
    runs: dict[str, list[WayRun]] = {name: [] for name in names}
    for k in range(count):
        order = names[k % len(names):] + names[: k % len(names)]
        for name in order[::-1] if k % 2 else order:
            runs[name].append(paths[name](k))
        report(f"round {k + 1}/{count}: " + ", ".join(f"{n} {runs[n][-1].thread:.3f}" for n in names))
    return runs


def quartiles(values: list[float], digits: int = 4) -> dict:
    """{"median", "q1", "q3", "min", "max"} of `values`, rounded (q1, q3: the quartiles, statistics' inclusive
    method)."""
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else (values[0],) * 3
    return {"median": round(statistics.median(values), digits), "q1": round(q1, digits), "q3": round(q3, digits),
            "min": round(min(values), digits), "max": round(max(values), digits)}


def interquartile_mean_ratio(ratios: list[float], digits: int = 4) -> float:
    """The geometric mean of the middle half of `ratios` (the quarter above and below dropped): a per-round ratio's
    noise on a shared CPU is a few large outliers on either side, which it ignores, and it uses more rounds than
    the median does."""
    logs = sorted(math.log(r) for r in ratios)
    cut = len(logs) // 4
    middle = logs[cut: len(logs) - cut] or logs
    return round(math.exp(statistics.fmean(middle)), digits)


def ways_summary(runs: dict[str, list[WayRun]]) -> dict:
    """Per way: seconds (wall, thread CPU) and the per-round ratio to bare `generate()` on each clock (quartiles,
    and the interquartile geometric mean of the thread CPU ratio); whether its tokens equal bare's in every
    round."""
    bare = runs["bare"]
    summary = {}
    for name, way in runs.items():
        summary[name] = {
            "wall_s": quartiles([r.wall for r in way]), "cpu_s": quartiles([r.thread for r in way]),
            "ratio_wall": quartiles([r.wall / b.wall for r, b in zip(way, bare)]),
            "ratio_cpu": quartiles([r.thread / b.thread for r, b in zip(way, bare)]),
            "ratio_cpu_iqm": interquartile_mean_ratio([r.thread / b.thread for r, b in zip(way, bare)]),
            "ratio_process_cpu": quartiles([r.cpu / b.cpu for r, b in zip(way, bare)]),
            "same_tokens_as_bare": all(r.token_ids == b.token_ids for r, b in zip(way, bare)),
            "forwards": sorted({r.forwards for r in way}),
        }
    return summary


def measure_ways(engine: DiffusionEngine, prompt: str, settings: DiffusionSettings, count: int, readings: int = 1,
                 report: Callable[[str], None] = lambda _: None, only: Sequence[str] | None = None) -> dict:
    """(f) `readings` independent readings of `rounds(Ways(...).paths(), count)`, each with the 1-minute load average
    before and after it; `only`: the ways besides bare (default: all)."""
    ways = Ways(engine, prompt, settings)
    paths = {name: path for name, path in ways.paths().items() if only is None or name == "bare" or name in only}
    done = []
    for _ in range(readings):
        load_before = os.getloadavg()[0]
        runs = rounds(paths, count, report)
        done.append({"load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)], "rounds": count,
                     "ways": ways_summary(runs)})
    return {"prompt": prompt, "settings": settings.__dict__, "forwards": ways.forwards,
            "prompt_tokens": int(ways.input_ids.shape[1]), "readings": done}


# -- the whole benchmark -----------------------------------------------------------------------------------------
def machine_description(engine: DiffusionEngine) -> dict:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    described = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                 "load_average_1min": round(os.getloadavg()[0], 2),
                 "device": str(engine.device), "dtype": str(engine.model.dtype).removeprefix("torch."),
                 "torch": torch.__version__, "python": platform.python_version()}
    if engine.device.type == "cuda":
        described["gpu"] = torch.cuda.get_device_name()
    return described


def run_benchmark(engine: DiffusionEngine, *, model: str, mode: Mode, prompt: str, threads: int,
                  ui: bool = True, base: DiffusionSettings | None = None, race_prompt: str = DEFAULT_RACE_PROMPT,
                  race_raw: bool = False, race_only: bool = False,
                  report: Callable[[str], None] = lambda _: None) -> dict:
    """Every measurement in order, from the checkpoint's recommended settings (or `base`); `report` hears each
    section's name as it starts. A UI failure is recorded in `results["ui"]["error"]`, not raised. `race_only`:
    (c) alone, on `race_prompt` (a chat prompt unless `race_raw`)."""
    base = base or engine.recommended
    fixed = base.replace(max_new_tokens=mode.blocks * engine.canvas_length, adaptive_stopping=False,
                         max_denoising_steps=mode.fixed_steps or base.max_denoising_steps)
    recommended = base.replace(max_new_tokens=mode.blocks * engine.canvas_length)
    parameters = sum(p.numel() for p in engine.model.parameters())
    results = {
        "model": str(model), "parameters": parameters, "canvas_length": engine.canvas_length,
        "machine": machine_description(engine), "tokens_counted": TOKENS_COUNTED, "prompt": prompt,
        "fixed_settings": fixed.__dict__, "recommended_settings": recommended.__dict__,
    }
    if race_only:
        report("(c) the race: diffusion vs autoregressive")
        results["race"] = measure_race(engine, race_prompt, recommended, mode, raw=race_raw)
        return results
    report("(a) engine overhead")
    results["engine"] = measure_engine_overhead(engine, prompt, fixed, mode)
    if ui:
        report("(b) UI overhead (launching app.py)")
        try:
            dtype = str(engine.model.dtype).removeprefix("torch.")
            with launched_app(model, engine.device.type, dtype, threads) as (url, process):
                results["ui"] = measure_ui_overhead(engine, url, prompt, fixed, mode, app_pid=process.pid)
                results["ui"]["app_peak_rss_mb"] = peak_rss_mb(process.pid)
        except Exception as error:  # noqa: BLE001 - recorded and reported, the rest still runs
            results["ui"] = {"error": f"{type(error).__name__}: {error}"}
    report("(c) the race: diffusion vs autoregressive")
    results["race"] = measure_race(engine, race_prompt, recommended, mode, raw=race_raw)
    report("(e) scaling with output length")
    results["output_scaling"] = measure_output_scaling(engine, prompt, fixed, mode)
    report("(e) scaling with prompt length")
    results["prompt_scaling"] = measure_prompt_scaling(engine, fixed, mode)
    results["memory"] = memory_summary(engine.device)
    return results


def _cell(s: dict, digits: int = 1) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}..{s['max']:.{digits}f}]"


def _verdict(s: dict, target: float) -> str:
    """"met" or "MISSED": the median against an upper bound."""
    return "met" if s["median"] <= target else "MISSED"


def format_race(race: dict) -> list[str]:
    """The (c) lines of the report: per preset, the speedup and each side's figures."""
    kind = "raw" if race["raw"] else "chat"
    lines = [f"(c) the race, same weights ({kind} prompt {race['prompt']!r}; {race['length_rule']})"]
    for name, row in race["presets"].items():
        settings = row["settings"]
        lines += [
            f"    {name} preset ({settings['max_denoising_steps']} steps, entropy bound {settings['entropy_bound']}, "
            f"{row['races']} races): diffusion speedup {_cell(row['speedup'], 2)}x",
            "      side            tokens/s               tokens        tokens/forward     ms/forward"
            "             first token ms",
        ]
        for side in ("diffusion", "autoregressive"):
            r = row[side]
            bound = (f"  bound {r['bandwidth_bound_ms_per_forward']:.3f} ms/forward"
                     if "bandwidth_bound_ms_per_forward" in r else "")
            lines.append(
                f"      {side:<15} {_cell(r['tokens_per_second']):<22} {_cell(r['tokens'], 0):<13} "
                f"{_cell(r['tokens_per_forward'], 2):<18} {_cell(r['ms_per_forward'], 2):<22} "
                f"{_cell(r['time_to_first_token_ms'], 0)}  stop {','.join(r['stop_reasons'])}{bound}")
        if row.get("memory_bandwidth_gb_s"):
            lines.append(f"      measured memory bandwidth {row['memory_bandwidth_gb_s']} GB/s")
    return lines


def format_ways(ways: dict, header: str = "") -> str:
    """The (f) report: per reading, each way's thread CPU seconds and per-round ratios to bare `generate()` (median
    [q1..q3], min..max), wall ratio beside, and whether its tokens equal bare's."""
    s = ways["settings"]
    lines = [header] if header else []
    lines.append(f"(f) ways to watch it denoise: chat prompt {ways['prompt']!r} ({ways['prompt_tokens']} tokens), "
                 f"{s['max_new_tokens']} new tokens, {s['max_denoising_steps']} steps, adaptive stopping off, "
                 f"{ways['forwards']} forwards a run")
    for index, reading in enumerate(ways["readings"], 1):
        before, after = reading["load_average_1min"]
        lines += [f"  reading {index}: {reading['rounds']} rounds, 1-min load average {before} -> {after}",
                  "    way                                  CPU s    CPU ratio: IQM  median [q1..q3] (min..max)   "
                  "ratio wall  same tokens"]
        for name, w in reading["ways"].items():
            c = w["ratio_cpu"]
            lines.append(f"    {WAY_LABELS[name]:<36} {w['cpu_s']['median']:>7.3f}  {w['ratio_cpu_iqm']:.3f}  "
                         f"{c['median']:.3f} [{c['q1']:.3f}..{c['q3']:.3f}] ({c['min']:.3f}..{c['max']:.3f})   "
                         f"{w['ratio_wall']['median']:>6.3f}      {w['same_tokens_as_bare']}")
    for index in range(1, len(ways["readings"])):
        first, later = ways["readings"][0]["ways"], ways["readings"][index]["ways"]
        lines.append(f"  readings 1 and {index + 1} differ by (CPU ratio IQM; median): " + ", ".join(
            f"{name} {abs(later[name]['ratio_cpu_iqm'] / first[name]['ratio_cpu_iqm'] - 1) * 100:.1f}%; "
            f"{abs(later[name]['ratio_cpu']['median'] / first[name]['ratio_cpu']['median'] - 1) * 100:.1f}%"
            for name in first if name != "bare"))
    return "\n".join(lines)


def format_table(results: dict) -> str:
    """The human-readable report: medians with [min..max]."""
    m = results["machine"]
    fixed = results["fixed_settings"]
    header = [
        f"model {results['model']} ({results['parameters'] / 1e6:.1f}M params, canvas {results['canvas_length']})",
        f"machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} with {m['torch_threads']} threads, "
        f"{m['device']} {m['dtype']}" + (f", {m['gpu']}" if "gpu" in m else "")
        + f"; 1-min load average at start {m['load_average_1min']} on {m['cores']} cores",
        f"tokens counted: {results['tokens_counted']}",
    ]
    if "engine" not in results:  # --race-only
        return "\n".join(header + format_race(results["race"]))
    e = results["engine"]
    lines = header + [
        f"fixed runs: {fixed['max_new_tokens']} new tokens, {fixed['max_denoising_steps']} steps per canvas, "
        f"adaptive stopping off; median [min..max] over {e['runs']} runs per path",
        "",
        "(a) engine overhead                    tokens/s               seconds",
        f"    bare model.generate()             {_cell(e['bare_generate']['tokens_per_second']):<22} "
        f"{_cell(e['bare_generate']['seconds'], 3)}",
        f"    engine.frames(), every frame      {_cell(e['engine_frames']['tokens_per_second']):<22} "
        f"{_cell(e['engine_frames']['seconds'], 3)}",
        f"    engine_overhead_ratio             {_cell(e['engine_overhead_ratio'], 3)}  (target <= 1.03: "
        f"{_verdict(e['engine_overhead_ratio'], 1.03)}; "
        f"same tokens: {e['same_tokens']})",
        f"      same on CPU time                {_cell(e['engine_overhead_ratio_cpu'], 3)}",
    ]
    ui = results.get("ui")
    if ui is None:
        lines.append("(b) UI overhead: skipped (--no-ui)")
    elif "error" in ui:
        lines.append(f"(b) UI overhead: FAILED: {ui['error']}")
    else:
        lines += [
            "(b) UI overhead",
            f"    bare model.generate()             {_cell(ui['bare_generate']['tokens_per_second']):<22} "
            f"{_cell(ui['bare_generate']['seconds'], 3)}",
            f"    REST call API /generate           {_cell(ui['rest_call']['tokens_per_second']):<22} "
            f"{_cell(ui['rest_call']['seconds'], 3)}",
            f"    ui_overhead_ratio (REST)          {_cell(ui['ui_overhead_ratio'], 3)}  (target <= 1.05: "
            f"{_verdict(ui['ui_overhead_ratio'], 1.05)}; "
            f"same tokens: {ui['same_tokens']})",
            f"      same on CPU time (client + app) {_cell(ui['ui_overhead_ratio_cpu'], 3)}",
            f"    of which HTTP + queue             {_cell(ui['http_and_queue_s'], 3)} s per call; app engine "
            f"clock / bare {_cell(ui['app_engine_over_bare'], 3)}",
            f"    gradio_client /generate / bare    {_cell(ui['gradio_client_ratio'], 3)}  (its HTTP + queue "
            f"{_cell(ui['gradio_client_http_and_queue_s'], 3)} s: the library polls for messages every 50 ms)",
        ]
    lines += format_race(results["race"])
    lines += [
        "(d) per run (engine, fixed runs)",
        f"    tokens per forward {_cell(e['tokens_per_forward'], 2)}; forwards per block {e['forwards_per_block']}; "
        f"time to first frame {_cell(e['time_to_first_frame_s'], 3)} s",
        f"    peak RSS {results['memory']['peak_rss_mb']} MiB (bench process)"
        + (f", app process {ui['app_peak_rss_mb']} MiB" if ui and ui.get("app_peak_rss_mb") else "")
        + (f", peak GPU {results['memory']['peak_gpu_allocated_mb']} MiB"
           if "peak_gpu_allocated_mb" in results["memory"] else ""),
        "(e) scaling, engine, adaptive stopping off",
        "    output blocks  new tokens  tokens/s               seconds              forwards",
    ]
    for row in results["output_scaling"]:
        lines.append(f"    {row['blocks']:>13}  {row['tokens']['median']:>10.0f}  "
                     f"{_cell(row['tokens_per_second']):<22} "
                     f"{_cell(row['seconds'], 3):<20} {row['forwards']}")
    lines.append("    prompt tokens  new tokens  tokens/s               time to first frame s")
    for row in results["prompt_scaling"]:
        lines.append(f"    {row['prompt_tokens']:>13}  {row['tokens']['median']:>10.0f}  "
                     f"{_cell(row['tokens_per_second']):<22} {_cell(row['time_to_first_frame_s'], 3)}")
    mismatched = [name for name, section in (("(a)", e), ("(b)", ui or {})) if section.get("same_tokens") is False]
    if mismatched:
        lines.append(f"WARNING: in {', '.join(mismatched)} the paths produced different tokens (a model changed on "
                     "disk mid-run?): those ratios compare different work")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and a smaller grid (about 2 min)")
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="local folder or hub id (default: embedded)")
    parser.add_argument("--standin", action="store_true",
                        help="the stand-in of the 26B checkpoint (standin/: vocabulary 262,144, canvas 256) as --model")
    parser.add_argument("--device", default="auto", choices=DEVICES)
    parser.add_argument("--dtype", default="auto", choices=DTYPES)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads for this process and the app (default: torch's own choice; on a "
                             "2-core CPU use 1, or the two processes compete for the cores during (b))")
    parser.add_argument("--prompt", default="In the beginning", help="raw prompt of (a), (b), (c) and output scaling")
    parser.add_argument("--no-ui", dest="ui", action="store_false", help="skip (b), the app round trip")
    parser.add_argument("--race-only", action="store_true", help="only (c), the race")
    parser.add_argument("--race-prompt", default=DEFAULT_RACE_PROMPT, help="prompt of (c) (the Race tab's default)")
    parser.add_argument("--race-raw", action="store_true", help="(c)'s prompt without the chat template")
    parser.add_argument("--ways-only", action="store_true",
                        help="only (f), the ways to watch it denoise: one canvas, --steps steps, --rounds rounds")
    parser.add_argument("--steps", type=int, default=None,
                        help="(f)'s denoising steps (default: 16; 3 with --standin, whose forwards cost seconds)")
    parser.add_argument("--rounds", type=int, default=None, help="(f)'s rounds per reading (default: 12; 6 --quick)")
    parser.add_argument("--readings", type=int, default=2, help="(f)'s independent readings (default: 2)")
    parser.add_argument("--ways", nargs="+", choices=[w for w in WAYS if w != "bare"], default=None,
                        help="(f)'s ways besides bare generate() (default: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("threads", "steps", "rounds", "readings"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(f"error: --{name} must be at least 1", file=sys.stderr)
            return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    if args.standin:
        args.model = str(ensure_standin())
    engine = DiffusionEngine(load_model(args.model, args.device, args.dtype))
    started = time.perf_counter()

    def report(section: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {section}", file=sys.stderr, flush=True)

    report(f"engine warm-up, as the app's: {engine.warm_up():.1f} s")

    mode = QUICK if args.quick else FULL
    if args.ways_only:
        steps = args.steps or (3 if args.standin else 16)
        settings = engine.recommended.replace(max_new_tokens=engine.canvas_length, max_denoising_steps=steps,
                                              adaptive_stopping=False)
        results = {"model": args.model, "machine": machine_description(engine),
                   "ways": measure_ways(engine, DEFAULT_RACE_PROMPT, settings, args.rounds or (6 if args.quick else 12),
                                        args.readings, report, args.ways)}
        results["bench_seconds"] = round(time.perf_counter() - started, 1)
        m = results["machine"]
        header = (f"model {args.model} (vocabulary {engine.model.config.text_config.vocab_size:,}, canvas "
                  f"{engine.canvas_length}); {m['cpu']}, {m['cores']} cores, torch {m['torch']} with "
                  f"{m['torch_threads']} threads, {m['device']} {m['dtype']}")
        print(json.dumps(results) if args.json else format_ways(results["ways"], header)
              + f"\n({results['bench_seconds']} s)")
        return 0
    results = run_benchmark(
        engine, model=args.model, mode=mode, prompt=args.prompt, threads=threads,
        ui=args.ui, race_prompt=args.race_prompt, race_raw=args.race_raw, race_only=args.race_only, report=report,
    )
    results["mode"] = "quick" if args.quick else "full"
    results["bench_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(results) if args.json else format_table(results) + f"\n({results['bench_seconds']} s)")
    return 1 if "error" in results.get("ui", {}) else 0


if __name__ == "__main__":
    sys.exit(main())

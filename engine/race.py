"""The race: block diffusion against autoregressive decoding on one prompt, one side after the other.

Fairness rules, all enforced here:
- the two sides never share the device: they run one after the other, in an order that alternates from race to
  race (or that the caller picks), and races never overlap each other;
- each side runs right after a warm-up of its own, so neither pays one-time costs (kernel choice, allocator growth);
- time is the engine clock (`EngineClock`: time inside the model code, CUDA synchronized, the consumer's time
  excluded), from the start of prompt encoding, so a view can replay both traces on one common clock;
- both sides have the same token budget (`max_new_tokens` rounded up to whole canvases, the diffusion side's
  granularity) and both stop at their first EOS; tokens are counted the same way on both sides: generated tokens up
  to and including EOS, pad ids never. The speedup is diffusion tokens/s over autoregressive tokens/s.

Why either side can win: seconds per token = (seconds per forward) / (tokens per forward). A canvas forward runs
the decoder over `canvas_length` positions; an autoregressive forward over one. On a CPU a forward's cost grows
with the positions it computes (compute-bound), so a canvas forward costs many AR forwards; on a GPU at batch 1 both
are bound by reading the weights from memory, so a forward that commits several tokens wins. `bandwidth_bound`
gives that floor on a GPU: weights' bytes read per forward / measured memory bandwidth.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import torch

from .autoregressive import AutoregressiveDecoder, TokenFrame, check_temperature
from .engine import DiffusionEngine
from .memory import stored_tensors
from .settings import DiffusionSettings, draw_seed, parse_seed

SIDES = ("diffusion", "autoregressive")
ORDERS = ("alternate", "diffusion first", "autoregressive first")
LENGTH_RULE = ("both sides stop at their first end-of-sequence token, within the same budget of "
               "{budget} tokens; tokens counted: generated tokens up to and including EOS, never the prompt or pads")
FAIRNESS = ("The two runs take turns on the device, never at once, each right after its own warm-up, and are "
            "replayed here on the engine's clock, so each side's time is what it takes alone.")

FrameCallback = Callable[[str, object], None]


def check_order(order) -> str:
    """`order` if it is one of `ORDERS`; raises ValueError naming the choices."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(repr(o) for o in ORDERS)}, got {order!r}")
    return order


@dataclass(frozen=True)
class SideResult:
    """One side of a race, on its own engine clock.

    name: "diffusion" or "autoregressive"; model: where its weights came from; text (raw model text) and token_ids
    (up to and including EOS); tokens: counted tokens (pads excluded); forwards: decoder forwards (diffusion) or
    token forwards (AR); seconds: engine seconds, prompt encoding and prefill included; tokens_per_second;
    tokens_per_forward; time_to_first_token_s: engine seconds until the first token was committed (for diffusion,
    the end of its first canvas); seconds_per_forward = seconds / forwards (the measured cost of one forward,
    prefill shared out); seconds_per_token = seconds / tokens; stop_reason; prompt_tokens; position: 1 or 2 (when it
    ran); warm_up_s: its warm-up's seconds; trace: [(elapsed_s, counted tokens)] after every forward;
    weights_bytes_per_forward: weights read by one forward (estimate, see `weights_bytes_per_forward`);
    bandwidth_bound_s_per_forward / bandwidth_bound_tokens_per_second: on a GPU, the floor that reading those bytes
    at the measured bandwidth sets (None elsewhere).
    """

    name: str
    model: str
    text: str
    token_ids: list[int]
    tokens: int
    forwards: int
    seconds: float
    tokens_per_second: float
    tokens_per_forward: float
    time_to_first_token_s: float | None
    seconds_per_forward: float
    seconds_per_token: float | None
    stop_reason: str
    prompt_tokens: int
    position: int
    warm_up_s: float
    trace: list[tuple[float, int]] = field(repr=False)
    weights_bytes_per_forward: int | None = None
    bandwidth_bound_s_per_forward: float | None = None
    bandwidth_bound_tokens_per_second: float | None = None

    def line(self) -> str:
        """One plain-text line: tokens, forwards, tokens/s, tokens/forward, seconds, cost per forward."""
        return (f"{self.name}: {self.tokens} tokens, {self.forwards} forwards, {self.tokens_per_second:.1f} "
                f"tokens/s, {self.tokens_per_forward:.2f} tokens/forward, {self.seconds:.2f} s, "
                f"{self.seconds_per_forward * 1000:.2f} ms per forward, stop: {self.stop_reason}")

    def summary(self) -> dict:
        """JSON-ready dict of every field but the trace."""
        data = asdict(self)
        data.pop("trace")
        return data


@dataclass(frozen=True)
class RaceResult:
    """A finished (or stopped) race: both sides, the speedup and the rules it ran under.

    speedup: diffusion tokens/s / autoregressive tokens/s (None when a side made no tokens, or the race was stopped);
    order: the sides in the order they ran; seed; budget: the token budget of both sides; canvas_length: positions
    a canvas forward computes; length_rule and
    fairness: one sentence each; device; memory_bandwidth_gb_s: measured on a GPU (device-to-device copy), else None;
    cancelled: the race was stopped before both sides finished.
    """

    diffusion: SideResult | None
    autoregressive: SideResult | None
    order: tuple[str, str]
    seed: int
    budget: int
    canvas_length: int
    device: str
    memory_bandwidth_gb_s: float | None
    cancelled: bool = False

    @property
    def speedup(self) -> float | None:
        d, a = self.diffusion, self.autoregressive
        if self.cancelled or d is None or a is None or d.tokens_per_second <= 0 or a.tokens_per_second <= 0:
            return None
        return d.tokens_per_second / a.tokens_per_second

    @property
    def stopped_side(self) -> str | None:
        """The side a Stop cut short or kept from running: the first in running order that is missing or ended
        "cancelled"; None when the race was not stopped."""
        if not self.cancelled:
            return None
        for name in self.order:
            side = getattr(self, name)
            if side is None or side.stop_reason == "cancelled":
                return name
        return None

    @property
    def length_rule(self) -> str:
        return LENGTH_RULE.format(budget=self.budget)

    @property
    def fairness(self) -> str:
        return FAIRNESS

    def summary(self) -> dict:
        """JSON-ready dict: both sides' summaries (no traces), speedup, order, rules, explanation."""
        return {
            "diffusion": self.diffusion.summary() if self.diffusion else None,
            "autoregressive": self.autoregressive.summary() if self.autoregressive else None,
            "speedup": self.speedup, "order": list(self.order), "seed": self.seed, "budget": self.budget,
            "canvas_length": self.canvas_length,
            "length_rule": self.length_rule, "fairness": self.fairness, "device": self.device,
            "memory_bandwidth_gb_s": self.memory_bandwidth_gb_s, "cancelled": self.cancelled,
            "explanation": explanation(self),
        }


def explanation(result: RaceResult) -> str:
    """Plain text (not HTML) saying why the race came out as it did, with the measured cost per forward times
    tokens per forward of both sides; "" when a side is missing."""
    d, a = result.diffusion, result.autoregressive
    if d is None or a is None or d.tokens == 0 or a.tokens == 0:
        return ""
    ms = 1000.0
    per_token = (
        f"Diffusion: {d.seconds_per_forward * ms:.2f} ms per canvas forward / {d.tokens_per_forward:.2f} tokens per "
        f"forward = {d.seconds_per_token * ms:.2f} ms per token. Autoregressive: {a.seconds_per_forward * ms:.2f} ms "
        f"per forward / {a.tokens_per_forward:.2f} tokens per forward = {a.seconds_per_token * ms:.2f} ms per token."
    )
    cost_ratio = d.seconds_per_forward / a.seconds_per_forward if a.seconds_per_forward > 0 else float("inf")
    costs = (f"a canvas forward cost {cost_ratio:.1f}x an autoregressive forward here, and each committed "
             f"{d.tokens_per_forward:.2f} tokens against 1.")
    if result.cancelled:  # both sides ran, one of them cut short: no winner
        side = result.stopped_side
        why = (f"No winner: the race was stopped while the {side} side ran after {getattr(result, side).tokens} "
               f"tokens. So far {costs}")
    else:
        winner = "Diffusion wins" if (result.speedup or 0) >= 1 else "Autoregressive decoding wins"
        why = f"{winner}: {costs}"
    if result.device.startswith("cuda"):
        device_note = ("On a GPU at batch size 1 both kinds of forward are bound by reading the weights from memory, "
                       "so a forward that commits several tokens should win; the bandwidth bound below is that floor.")
        if d.bandwidth_bound_s_per_forward and a.bandwidth_bound_s_per_forward:
            device_note += (f" Bandwidth bound: {d.bandwidth_bound_s_per_forward * ms:.3f} ms per canvas forward, "
                            f"{a.bandwidth_bound_s_per_forward * ms:.3f} ms per autoregressive forward.")
    else:
        device_note = (f"On a {result.device.split(':')[0].upper()} a forward's cost grows with the positions it "
                       f"computes (compute-bound): a canvas forward computes {result.canvas_length} positions, an "
                       "autoregressive forward one, so diffusion wins only when it commits more tokens per forward "
                       "than that cost ratio.")
    return f"{why} {per_token} {device_note}"


# -- bandwidth -----------------------------------------------------------------------------------------------------
def measure_memory_bandwidth(device: torch.device, megabytes: int = 512, repeats: int = 10) -> float | None:
    """Measured memory bandwidth of a CUDA device in bytes/s: a device-to-device copy of `megabytes` MiB timed over
    `repeats` copies (each reads and writes every byte, so 2 x bytes move). None off CUDA, or when the two buffers do
    not fit in the free memory."""
    if device.type != "cuda":
        return None
    n = megabytes * 2**20
    try:
        source = torch.empty(n, dtype=torch.uint8, device=device)
        target = torch.empty_like(source)
    except torch.OutOfMemoryError:  # a device filled by the model: no bound rather than a failed race
        return None
    target.copy_(source)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        target.copy_(source)
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    del source, target
    return 2 * n * repeats / seconds


def _experts(config) -> tuple[int, int] | None:
    """(experts per layer, experts each token uses) of a text config, or None for a dense model."""
    total = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    used = getattr(config, "top_k_experts", None) or getattr(config, "num_experts_per_tok", None)
    return (int(total), int(used)) if total and used else None


def weights_bytes_per_forward(modules: list[torch.nn.Module], config, positions: int) -> int:
    """Bytes of weights one forward over `positions` tokens reads: every tensor of `modules` once
    (`engine.memory.stored_tensors`), mixture-of-experts weights (parameters named `experts`) scaled by the expected
    share of experts the tokens touch, 1 - (1 - k/E)^positions for top-k of E experts with uniform routing (an estimate)."""
    experts = _experts(config)
    share = 1.0 if experts is None else 1.0 - (1.0 - experts[1] / experts[0]) ** positions
    total = 0.0
    for name, tensor in stored_tensors(*modules):
        if "vision" not in name and "audio" not in name:
            size = tensor.numel() * tensor.element_size()
            total += size * share if ".experts." in f".{name}" else size
    return int(total)


def side_weights_bytes(engine: DiffusionEngine, ar: AutoregressiveDecoder) -> tuple[int, int]:
    """(bytes one canvas forward reads, bytes one autoregressive forward reads)."""
    model = engine.model
    text_config = model.config.get_text_config(decoder=True)
    diffusion = weights_bytes_per_forward([model.model.decoder, model.lm_head], text_config, engine.canvas_length)
    if ar.shared_weights:
        modules = [model.model.encoder.language_model, model.lm_head]
    else:
        modules = [ar.model]
    autoregressive = weights_bytes_per_forward(modules, ar.model.config.get_text_config(decoder=True), 1)
    return diffusion, autoregressive


# -- the runner ----------------------------------------------------------------------------------------------------
class RaceRunner:
    """Runs races between `engine` (block diffusion) and `ar` (default: the same weights' causal encoder).

    Races run one at a time (a lock), so two races never share the device. `order="alternate"` alternates which
    side goes first from one race to the next.
    """

    def __init__(self, engine: DiffusionEngine, ar: AutoregressiveDecoder | None = None):
        self.engine = engine
        self.ar = ar or AutoregressiveDecoder.from_diffusion(engine)
        self._lock = threading.Lock()
        self._races = 0
        self._bandwidth: float | None = None
        self._measured = False
        self._weights: tuple[int, int] | None = None

    def budget(self, settings: DiffusionSettings) -> int:
        """Tokens each side may make: `max_new_tokens` rounded up to whole canvases."""
        canvas = self.engine.canvas_length
        return math.ceil(settings.max_new_tokens / canvas) * canvas

    def check(self, prompt: str, settings: DiffusionSettings, *, raw: bool, ar_temperature=0.0,
              order: str = "alternate", seed=None) -> None:
        """Every check of a race before anything runs (prompt, budgets of both models, temperature, order, seed).

        Raises:
            ValueError: the first problem found, in words.
        """
        check_order(order)
        check_temperature(ar_temperature)
        parse_seed(seed)
        diffusion_ids = self.engine.encode_prompt(prompt, raw=raw)
        self.engine.check_budget(int(diffusion_ids.shape[1]), settings)
        ar_ids = diffusion_ids if self.ar.shared_weights else self.ar.encode_prompt(prompt, raw=raw)
        self.ar.check_budget(int(ar_ids.shape[1]), self.budget(settings))

    def _order(self, order: str) -> tuple[str, str]:
        if order == "diffusion first":
            return SIDES
        if order == "autoregressive first":
            return SIDES[::-1]
        self._races += 1
        return SIDES if self._races % 2 == 1 else SIDES[::-1]

    def _warm_up(self, side: str, settings: DiffusionSettings) -> float:
        if side == "autoregressive":
            start = time.perf_counter()
            self.ar.warm_up()
            return time.perf_counter() - start
        start = time.perf_counter()
        short = settings.replace(max_new_tokens=self.engine.canvas_length,
                                 max_denoising_steps=min(2, settings.max_denoising_steps), adaptive_stopping=False)
        self.engine.generate("Warm-up.", short, raw=True, seed=0)
        return time.perf_counter() - start

    def _bandwidth_figures(self) -> tuple[float | None, tuple[int, int] | None]:
        """(measured bandwidth in bytes/s, weights bytes per forward of both sides) on a GPU, else (None, None)."""
        if self.engine.device.type != "cuda":
            return None, None
        if not self._measured:
            self._measured = True  # once per runner: the device does not change
            self._bandwidth = measure_memory_bandwidth(self.engine.device)
            self._weights = side_weights_bytes(self.engine, self.ar)
        return self._bandwidth, self._weights

    def run(self, prompt: str, settings: DiffusionSettings | None = None, *, raw: bool = False, seed=None,
            ar_temperature=0.0, order: str = "alternate", warm_up: bool = True,
            on_frame: FrameCallback | None = None, stop_event: threading.Event | None = None) -> RaceResult:
        """Race `prompt` through both sides, one after the other, and return both results.

        Args:
            settings: the diffusion side's settings (default: the checkpoint's recommended ones); its
                `max_new_tokens`, rounded up to whole canvases, is both sides' budget.
            raw: no chat template, on both sides. seed: both sides' seed (None: one is drawn, used by both).
            ar_temperature: 0: greedy autoregressive decoding; above 0: sampled at that temperature.
            order: one of `ORDERS`. warm_up: warm each side up right before it runs.
            on_frame: called as `on_frame(side, frame)` after every forward (a `Frame` for "diffusion", a
                `TokenFrame` for "autoregressive"), from the calling thread; the time it takes is not counted.
            stop_event: when set, the running side stops within one forward and the other does not start.

        Raises:
            ValueError: bad input (see `check`), before anything runs.
        """
        settings = settings or self.engine.recommended
        seed = parse_seed(seed)
        seed = draw_seed() if seed is None else seed
        ar_temperature = check_temperature(ar_temperature)
        self.check(prompt, settings, raw=raw, ar_temperature=ar_temperature, order=order, seed=seed)
        budget = self.budget(settings)
        with self._lock:
            bandwidth, weights = self._bandwidth_figures()
            sides = self._order(order)
            results: dict[str, SideResult | None] = dict.fromkeys(SIDES)
            cancelled = False
            for position, side in enumerate(sides, start=1):
                if stop_event is not None and stop_event.is_set():
                    cancelled = True
                    break
                warm_s = self._warm_up(side, settings) if warm_up else 0.0
                if side == "diffusion":
                    frames = self.engine.frames(prompt, settings, raw=raw, seed=seed, stop_event=stop_event)
                else:
                    frames = self.ar.frames(prompt, budget, raw=raw, temperature=ar_temperature, seed=seed,
                                            stop_event=stop_event)
                results[side] = self._run_side(side, frames, position, warm_s, on_frame)
                cancelled = cancelled or results[side].stop_reason == "cancelled"
        if bandwidth and weights:
            for side, bytes_per_forward in zip(SIDES, weights):
                if results[side] is not None:
                    results[side] = _with_bound(results[side], bytes_per_forward, bandwidth)
        return RaceResult(
            diffusion=results["diffusion"], autoregressive=results["autoregressive"], order=sides, seed=seed,
            budget=budget, canvas_length=self.engine.canvas_length, device=str(self.engine.device),
            memory_bandwidth_gb_s=round(bandwidth / 1e9, 1) if bandwidth else None, cancelled=cancelled,
        )

    def _run_side(self, side: str, frames, position: int, warm_s: float,
                  on_frame: FrameCallback | None) -> SideResult:
        """Consume one side's frames into a `SideResult` (its trace, time to first token and totals)."""
        trace: list[tuple[float, int]] = []
        first_token_s = None
        last = None
        count = 0
        for last in frames:
            count += 1
            trace.append((last.elapsed_s, last.committed_tokens))
            if first_token_s is None and last.committed_tokens > 0:
                first_token_s = last.elapsed_s
            if on_frame is not None:
                on_frame(side, last)
        if last is None:
            raise RuntimeError(f"the {side} side ended before its first forward")
        if side == "diffusion":
            summary = self.engine.summarize(last, count)
            forwards = summary.forwards
            model, text, token_ids = str(self.engine.source), summary.text, summary.token_ids
        else:
            forwards = last.forwards
            model, text, token_ids = self.ar.source, self.ar.text(last.committed_ids), list(last.committed_ids)
        tokens, seconds = last.committed_tokens, last.elapsed_s
        return SideResult(
            name=side, model=model, text=text, token_ids=token_ids, tokens=tokens, forwards=forwards,
            seconds=seconds, tokens_per_second=tokens / seconds if seconds > 0 else 0.0,
            tokens_per_forward=tokens / forwards if forwards else 0.0, time_to_first_token_s=first_token_s,
            seconds_per_forward=seconds / forwards if forwards else 0.0,
            seconds_per_token=seconds / tokens if tokens else None, stop_reason=last.stop_reason,
            prompt_tokens=last.prompt_tokens, position=position, warm_up_s=warm_s, trace=trace,
        )


def _with_bound(side: SideResult, bytes_per_forward: int, bandwidth: float) -> SideResult:
    """`side` with its weights' bytes per forward and the bandwidth bound they set."""
    per_forward = bytes_per_forward / bandwidth
    return replace(side, weights_bytes_per_forward=bytes_per_forward, bandwidth_bound_s_per_forward=per_forward,
                   bandwidth_bound_tokens_per_second=side.tokens_per_forward / per_forward)


"""The race: block diffusion against autoregressive decoding on one prompt, one side after the other, same budget."""

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace

import psutil
import torch
from accelerate import init_empty_weights
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache

from .engine import DiffusionEngine, encode_text, last_and_count
from .frames import BYTE, TEXT, TokenText, eos_id_list
from .generator import EngineClock, RunRandomState
from .loading import FIT_HEADROOM, ModelLoadError, model_location
from .quantization import model_bytes, stored_tensors
from .settings import DiffusionSettings, SettingSpec, draw_seed, parse_seed, parse_setting
from .wording import plural

SIDES = ("diffusion", "autoregressive")
ORDERS = ("alternate", "diffusion first", "autoregressive first")
LENGTH_RULE = ("both sides stop at their first end-of-sequence token, within the same budget of "
               "{budget}; tokens counted: generated tokens up to and including EOS, never the prompt or pads")
FAIRNESS = ("The two runs take turns on the device, never at once, each right after its own warm-up, and are "
            "timed on the engine's clock, so each side's time is its own.")
FrameCallback = Callable[[str, object], None]
PUNCTUATION_LIMIT = 2 / 3  # shares past these mark an answer faulty
REPETITION_LIMIT = 0.5
REPEAT_N = 4  # tokens per run counted as repetition
AR_TEMPERATURE = SettingSpec("ar_temperature", "Autoregressive temperature", float, 0.0, 10.0, True,
                             "0: greedy (default); above: sampled", "--ar-temperature", ui_step=0.05)
check_temperature = AR_TEMPERATURE.parse  # `value` as the AR temperature in [0, 10] (0: greedy); `ValueError`


@dataclass(frozen=True)
class TokenFrame:
    """One autoregressive forward (0: the prefill); `token` is raw text (escape it)."""

    forward_index: int
    token_id: int
    token: str
    committed_ids: list[int]
    committed_tokens: int
    temperature: float
    done: bool
    stop_reason: str
    elapsed_s: float
    time_to_first_token_s: float
    tokens_per_second: float
    tokens_per_forward: float
    prompt_tokens: int
    seed: int

    @property
    def forwards(self) -> int:
        return self.forward_index + 1

    def to_dict(self) -> dict:
        return asdict(self)


def eos_ids(generation_config) -> set[int]:
    return set(eos_id_list(getattr(generation_config, "eos_token_id", None)))


class AutoregressiveDecoder:
    """Token-by-token decoding with a KV cache on a DiffusionGemma encoder or a causal LM."""

    def __init__(self, model, tokenizer, *, source: str, device: torch.device, shared_weights: bool):
        self.model = model
        self.tokenizer = tokenizer
        self.source = source
        self.device = device
        self.shared_weights = shared_weights
        self.token_text = TokenText(tokenizer)
        self.eos_token_ids = eos_ids(model.generation_config)
        self.pad_token_id = getattr(model.generation_config, "pad_token_id", None)
        self.text_config = model.config.get_text_config(decoder=True)
        self.context_limit = getattr(self.text_config, "max_position_embeddings", None)

    @classmethod
    def from_diffusion(cls, engine) -> "AutoregressiveDecoder":
        """The decoder on a `DiffusionEngine`'s own encoder and `lm_head`."""
        return cls(engine.model, engine.tokenizer, source=f"{engine.source} (its causal encoder)",
                   device=engine.device, shared_weights=True)

    @classmethod
    def load(cls, model_id: str, device: torch.device, dtype: torch.dtype) -> "AutoregressiveDecoder":
        """A separate causal LM and its tokenizer on `device`; `ModelLoadError`."""
        where, common = model_location(model_id, strict=False)
        placed = {"device_map": {"": device.index or 0}} if device.type == "cuda" else {}
        try:
            model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **placed, **common)
            tokenizer = AutoTokenizer.from_pretrained(where, **common)
        except Exception as error:  # noqa: BLE001
            raise ModelLoadError(f"cannot load the autoregressive model {model_id!r}: {type(error).__name__}: "
                                 f"{error}") from error
        if device.type != "cuda":
            model = model.to(device)
        model.eval()
        return cls(model, tokenizer, source=str(model_id), device=device, shared_weights=False)

    def next_token_logits(self, step_ids: torch.LongTensor, cache: DynamicCache, position: int) -> torch.Tensor:
        """One forward of `step_ids` `[1, n]` at `position`, extending `cache`; float32 logits `[1, vocab]`."""
        positions = torch.arange(position, position + step_ids.shape[1], device=step_ids.device).unsqueeze(0)
        if self.shared_weights:
            hidden = self.model.model.encoder(input_ids=step_ids, past_key_values=cache,
                                              position_ids=positions).last_hidden_state
            logits = self.model.lm_head(hidden[:, -1]).float()
            cap = self.model.final_logit_softcapping
            return torch.tanh(logits / cap) * cap if cap else logits
        output = self.model(input_ids=step_ids, past_key_values=cache, position_ids=positions, use_cache=True,
                            logits_to_keep=1)
        return output.logits[:, -1].float()

    def encode_prompt(self, prompt: str, raw: bool = False) -> torch.LongTensor:
        return encode_text(self.tokenizer, prompt, raw, self.device)

    def check_budget(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """`ValueError` when the prompt plus `max_new_tokens` exceed the context window."""
        if self.context_limit and prompt_tokens + max_new_tokens > self.context_limit:
            raise ValueError(f"prompt of {prompt_tokens:,} tokens plus {max_new_tokens:,} new ones exceeds the "
                             f"autoregressive model's context of {self.context_limit:,} tokens: shorten the prompt or "
                             "lower max_new_tokens")

    def frames(self, prompt: str, max_new_tokens: int, *, raw: bool = False, temperature: float = 0.0,
               seed: int | None = None, stop_event: threading.Event | None = None) -> Iterator[TokenFrame]:
        """`decode` of `prompt`; `ValueError` before any work."""
        max_new_tokens = parse_setting("max_new_tokens", max_new_tokens)
        temperature = check_temperature(temperature)
        seed = parse_seed(seed)
        input_ids = self.encode_prompt(prompt, raw=raw)
        self.check_budget(input_ids.shape[1], max_new_tokens)
        return self.decode(input_ids, max_new_tokens, temperature=temperature, random_state=RunRandomState(seed),
                           stop_event=stop_event)

    @torch.no_grad()
    def decode(self, input_ids: torch.LongTensor, max_new_tokens: int, *, temperature: float = 0.0,
               random_state: RunRandomState | None = None,
               stop_event: threading.Event | None = None) -> Iterator[TokenFrame]:
        """One `TokenFrame` per forward after `input_ids` `[1, n]` until EOS or the budget; `ValueError`."""
        if input_ids.ndim != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must have shape [1, prompt_length], got {tuple(input_ids.shape)}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        rng = random_state or RunRandomState(None)
        clock = EngineClock(input_ids.device)
        prompt_tokens, committed, counted, frame = input_ids.shape[1], [], 0, None
        cache = DynamicCache(config=self.text_config)
        step_ids, position = input_ids, 0
        for forward in range(max_new_tokens):
            if stop_event is not None and stop_event.is_set():
                if frame is not None:
                    yield replace(frame, done=True, stop_reason="cancelled")
                return
            with clock:
                logits = self.next_token_logits(step_ids, cache, position)
                position += step_ids.shape[1]
                if temperature > 0:
                    with rng.active():
                        step_ids = torch.multinomial(torch.softmax(logits / temperature, dim=-1), num_samples=1)
                else:
                    step_ids = logits.argmax(dim=-1, keepdim=True)
                token_id = int(step_ids)
                committed = [*committed, token_id]
                counted += token_id != self.pad_token_id
                stop_reason = ("eos" if token_id in self.eos_token_ids
                               else "max_new_tokens" if forward == max_new_tokens - 1 else "")
                elapsed = clock.now()
                frame = TokenFrame(
                    forward_index=forward, token_id=token_id, token=self.token_text(token_id), committed_ids=committed,
                    committed_tokens=counted, temperature=temperature, done=bool(stop_reason), stop_reason=stop_reason,
                    elapsed_s=elapsed, time_to_first_token_s=elapsed if frame is None else frame.time_to_first_token_s,
                    tokens_per_second=counted / elapsed if elapsed > 0 else 0.0,
                    tokens_per_forward=counted / (forward + 1), prompt_tokens=prompt_tokens, seed=rng.seed)
            yield frame
            if frame.done:
                return

    def text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def warm_up(self) -> float:
        """Pay first-run costs with a short greedy run; its seconds."""
        last, _ = last_and_count(self.frames("Warm-up.", 4, raw=True, seed=0))
        return last.elapsed_s


@dataclass(frozen=True)
class SideResult:
    """One side of a race on its engine clock; `trace`: (seconds, committed tokens) per forward."""

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
    punctuation_share: float = 0.0
    repeated_share: float = 0.0

    @property
    def faults(self) -> tuple[str, ...]:
        """The shares past their limits, punctuation first."""
        return tuple(name for name, share, limit in (("punctuation", self.punctuation_share, PUNCTUATION_LIMIT),
                                                     ("repetition", self.repeated_share, REPETITION_LIMIT))
                     if share > limit)

    def line(self) -> str:
        return (f"{self.name}: {plural(self.tokens, 'token')}, {plural(self.forwards, 'forward')}, "
                f"{self.tokens_per_second:.1f} tokens/s, {self.tokens_per_forward:.2f} tokens/forward, "
                f"{self.seconds:.2f} s, {self.seconds_per_forward * 1000:.2f} ms per forward, stop: {self.stop_reason}")

    def summary(self) -> dict:
        data = asdict(self)
        data.pop("trace")
        data["faults"] = list(self.faults)
        return data


@dataclass(frozen=True)
class RaceResult:
    """A finished or stopped race (a side is None when it never ran); bandwidth in GB/s."""

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
        """Diffusion tokens/s over autoregressive tokens/s; None if stopped or a side has no tokens."""
        d, a = self.diffusion, self.autoregressive
        if self.cancelled or d is None or a is None or d.tokens_per_second <= 0 or a.tokens_per_second <= 0:
            return None
        return d.tokens_per_second / a.tokens_per_second

    @property
    def stopped_side(self) -> str | None:
        """The first side in running order that a Stop cut short or kept from running."""
        if not self.cancelled:
            return None
        return next((name for name in self.order
                     if getattr(self, name) is None or getattr(self, name).stop_reason == "cancelled"), None)

    @property
    def length_rule(self) -> str:
        return LENGTH_RULE.format(budget=plural(self.budget, "token"))

    @property
    def winner(self) -> str | None:
        """The faster side ("diffusion" on a tie); None without a speedup."""
        speedup = self.speedup
        return None if speedup is None else "diffusion" if speedup >= 1 else "autoregressive"

    def verdict(self) -> dict:
        """JSON-ready facts; cost_ratio: seconds per canvas forward over per AR forward."""
        d, a = self.diffusion, self.autoregressive
        ratio = None
        if d is not None and a is not None and d.tokens and a.tokens and a.seconds_per_forward > 0:
            ratio = d.seconds_per_forward / a.seconds_per_forward
        return {
            "winner": self.winner, "stopped_side": self.stopped_side, "cost_ratio": ratio,
            "bound": "memory" if self.device.startswith("cuda") else "compute",
            "faults": {side.name: list(side.faults) for side in (d, a) if side is not None},
        }

    def summary(self) -> dict:
        """JSON-ready: sides without traces, speedup, order, rules and `verdict()`."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update({side: data[side] and data[side].summary() for side in SIDES}, order=list(self.order),
                    speedup=self.speedup, length_rule=self.length_rule, fairness=FAIRNESS, verdict=self.verdict())
        return data


def punctuation_share(tokens: Sequence[str]) -> float:
    """Share of the non-blank `tokens` with no letter or digit; 0.0 for none."""
    shown = [token for token in tokens if token.strip()]
    return sum(not any(c.isalnum() for c in token) for token in shown) / len(shown) if shown else 0.0


def repeated_share(tokens: Sequence[str], n: int = REPEAT_N) -> float:
    """Share of `tokens` inside a run of `n` seen earlier (runs may overlap); 0.0 for none."""
    seen: set[tuple[str, ...]] = set()
    repeated = [False] * len(tokens)
    for start in range(len(tokens) - n + 1):
        run = tuple(tokens[start:start + n])
        if run in seen:
            repeated[start:start + n] = [True] * n
        seen.add(run)
    return sum(repeated) / len(tokens) if tokens else 0.0


def measure_memory_bandwidth(device: torch.device, megabytes: int = 512, repeats: int = 10) -> float | None:
    """CUDA memory bandwidth in bytes/s from timed copies; None off CUDA or out of memory."""
    if device.type != "cuda":
        return None
    n = megabytes * 2**20
    try:
        source = torch.empty(n, dtype=torch.uint8, device=device)
        target = torch.empty_like(source)
    except torch.OutOfMemoryError:
        return None
    target.copy_(source)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        target.copy_(source)
    torch.cuda.synchronize(device)
    return 2 * n * repeats / (time.perf_counter() - start)


def weights_bytes_per_forward(modules: list[torch.nn.Module], config, positions: int) -> int:
    """Bytes of `modules` one forward over `positions` reads (experts: the share touched)."""
    total = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    used = getattr(config, "top_k_experts", None) or getattr(config, "num_experts_per_tok", None)
    share = 1.0 - (1.0 - used / total) ** positions if total and used else 1.0
    nbytes = 0.0
    for name, tensor in stored_tensors(*modules):
        if "vision" not in name and "audio" not in name:
            size = tensor.numel() * tensor.element_size()
            nbytes += size * share if ".experts." in f".{name}" else size
    return int(nbytes)


def side_weights_bytes(engine: DiffusionEngine, ar: AutoregressiveDecoder) -> tuple[int, int]:
    """(bytes one canvas forward reads, bytes one AR forward reads)."""
    model = engine.model
    text_config = model.config.get_text_config(decoder=True)
    diffusion = weights_bytes_per_forward([model.model.decoder, model.lm_head], text_config, engine.canvas_length)
    modules = [model.model.encoder.language_model, model.lm_head] if ar.shared_weights else [ar.model]
    return diffusion, weights_bytes_per_forward(modules, ar.text_config, 1)


class RaceRunner:
    """Races `engine` against `ar` (default: its causal encoder), one race at a time."""

    def __init__(self, engine: DiffusionEngine, ar: AutoregressiveDecoder | None = None):
        self.engine = engine
        self.ar = ar or AutoregressiveDecoder.from_diffusion(engine)
        self._lock = threading.Lock()
        self._races = 0
        self._figures: tuple[float | None, tuple[int, int] | None] | None = None

    def check(self, prompt: str, settings: DiffusionSettings, *, raw: bool, ar_temperature=0.0,
              order: str = "alternate", seed=None) -> None:
        """`ValueError` naming the race's first problem, before anything runs."""
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(repr(o) for o in ORDERS)}, got {order!r}")
        check_temperature(ar_temperature)
        parse_seed(seed)
        diffusion_ids = self.engine.encode_prompt(prompt, raw=raw)
        self.engine.check_budget(diffusion_ids.shape[1], settings)
        ar_ids = diffusion_ids if self.ar.shared_weights else self.ar.encode_prompt(prompt, raw=raw)
        self.ar.check_budget(ar_ids.shape[1], self.engine.budget(settings))

    def _order(self, order: str) -> tuple[str, str]:
        if order == "alternate":
            self._races += 1
            return SIDES if self._races % 2 == 1 else SIDES[::-1]
        return SIDES if order == "diffusion first" else SIDES[::-1]

    def _warm_up(self, side: str, settings: DiffusionSettings) -> float:
        start = time.perf_counter()
        if side == "autoregressive":
            self.ar.warm_up()
        else:
            self.engine.generate("Warm-up.", settings.replace(
                max_new_tokens=self.engine.canvas_length, max_denoising_steps=min(2, settings.max_denoising_steps),
                adaptive_stopping=False), raw=True, seed=0)
        return time.perf_counter() - start

    def _bandwidth_figures(self) -> tuple[float | None, tuple[int, int] | None]:
        if self._figures is None and self.engine.device.type == "cuda":
            self._figures = measure_memory_bandwidth(self.engine.device), side_weights_bytes(self.engine, self.ar)
        return self._figures or (None, None)

    def run(self, prompt: str, settings: DiffusionSettings | None = None, *, raw: bool = False, seed=None,
            ar_temperature=0.0, order: str = "alternate", warm_up: bool = True,
            on_frame: FrameCallback | None = None, stop_event: threading.Event | None = None) -> RaceResult:
        """Race `prompt`, `on_frame(side, frame)` after each forward; `ValueError`."""
        settings = settings or self.engine.recommended
        self.check(prompt, settings, raw=raw, ar_temperature=ar_temperature, order=order, seed=seed)
        seed, ar_temperature, budget = parse_seed(seed), check_temperature(ar_temperature), self.engine.budget(settings)
        seed = draw_seed() if seed is None else seed
        with self._lock:
            bandwidth, weights = self._bandwidth_figures()
            weights_bytes = dict(zip(SIDES, weights)) if bandwidth else {}
            sides = self._order(order)
            results: dict[str, SideResult | None] = dict.fromkeys(SIDES)
            for position, side in enumerate(sides, start=1):
                if stop_event is not None and stop_event.is_set():
                    break
                warm_s = self._warm_up(side, settings) if warm_up else 0.0
                if side == "diffusion":
                    frames = self.engine.frames(prompt, settings, raw=raw, seed=seed, stop_event=stop_event)
                else:
                    frames = self.ar.frames(prompt, budget, raw=raw, temperature=ar_temperature, seed=seed,
                                            stop_event=stop_event)
                results[side] = self._run_side(side, frames, position, warm_s, on_frame, weights_bytes.get(side),
                                               bandwidth)
        return RaceResult(
            **results, order=sides, seed=seed, budget=budget, canvas_length=self.engine.canvas_length,
            device=str(self.engine.device), memory_bandwidth_gb_s=round(bandwidth / 1e9, 1) if bandwidth else None,
            cancelled=any(result is None or result.stop_reason == "cancelled" for result in results.values()))

    def _run_side(self, side: str, frames, position: int, warm_s: float, on_frame: FrameCallback | None,
                  weights_bytes: int | None, bandwidth: float | None) -> SideResult:
        trace: list[tuple[float, int]] = []
        last = None
        for last in frames:
            trace.append((last.elapsed_s, last.committed_tokens))
            if on_frame is not None:
                on_frame(side, last)
        if last is None:
            raise RuntimeError(f"the {side} side ended before its first forward")
        if side == "diffusion":
            summary = self.engine.summarize(last, len(trace))
            forwards, token_text = summary.forwards, self.engine.token_text
            model, text, token_ids = str(self.engine.source), summary.text, summary.token_ids
        else:
            forwards, token_text = last.forwards, self.ar.token_text
            model, text, token_ids = self.ar.source, self.ar.text(last.committed_ids), list(last.committed_ids)
        tokens, seconds = last.committed_tokens, last.elapsed_s
        per_forward = tokens / forwards
        bound_s = weights_bytes / bandwidth if weights_bytes else None
        shown = [token_text(i) for i in token_ids if token_text.kind(i) in (TEXT, BYTE)]
        return SideResult(
            name=side, model=model, text=text, token_ids=token_ids, tokens=tokens, forwards=forwards, seconds=seconds,
            tokens_per_second=tokens / seconds if seconds > 0 else 0.0, tokens_per_forward=per_forward,
            time_to_first_token_s=next((s for s, n in trace if n > 0), None), seconds_per_forward=seconds / forwards,
            seconds_per_token=seconds / tokens if tokens else None, stop_reason=last.stop_reason,
            prompt_tokens=last.prompt_tokens, position=position, warm_up_s=warm_s, trace=trace,
            weights_bytes_per_forward=weights_bytes, bandwidth_bound_s_per_forward=bound_s,
            bandwidth_bound_tokens_per_second=None if bound_s is None else per_forward / bound_s,
            punctuation_share=punctuation_share(shown), repeated_share=repeated_share(shown))


def causal_lm_bytes(model_id: str, dtype: torch.dtype) -> int:
    """Bytes of causal LM `model_id`'s weights in `dtype`, from its config; `ModelLoadError`."""
    where, common = model_location(model_id, strict=False)
    try:
        config = AutoConfig.from_pretrained(where, **common)
        with init_empty_weights():
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception as error:  # noqa: BLE001
        raise ModelLoadError(f"cannot read the autoregressive model {model_id!r}: {type(error).__name__}: "
                             f"{' '.join(str(error).split())}") from error
    return model.num_parameters() * torch.empty((), dtype=dtype).element_size()


def free_bytes(device: torch.device) -> int:
    """Free bytes on the CUDA device, else the host's available RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device.index or 0)[0]
    return psutil.virtual_memory().available


def check_fit(engine, ar_model: str, dtype: torch.dtype, free: int | None = None) -> int:
    """Bytes of `ar_model`; `ModelLoadError` when it does not fit next to `engine`'s model."""
    needed = causal_lm_bytes(ar_model, dtype)
    free = free_bytes(engine.device) if free is None else free
    if needed * FIT_HEADROOM > free:
        gib = 2**30
        raise ModelLoadError(
            f"the autoregressive model {ar_model} needs about {needed / gib:.1f} GiB "
            f"({str(dtype).removeprefix('torch.')} weights, plus {FIT_HEADROOM - 1:.0%} for its cache) next to the "
            f"diffusion model's {model_bytes(engine.model) / gib:.1f} GiB, but {engine.device} has "
            f"{free / gib:.1f} GiB free: run without --ar-model to race the diffusion model's own encoder")
    return needed


def race_runner(engine, ar_model: str):
    """A `RaceRunner` against causal LM `ar_model` in the engine's dtype; `ModelLoadError`."""
    dtype = engine.model.dtype
    check_fit(engine, ar_model, dtype)
    return RaceRunner(engine, AutoregressiveDecoder.load(ar_model, engine.device, dtype))

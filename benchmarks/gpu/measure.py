"""The GPU kit's model steps and the arithmetic beside them: every CUDA path on the embedded model (preflight), the
26B-A4B with random weights in bf16, 8bit and 4bit, the static cache (tiny and 26B), the weight census and the
bandwidth bound. `steps.py` runs one step per process (`STEPS`); a rehearsal runs them on the CPU with tiny models.
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from accelerate import init_empty_weights
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoTokenizer, DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (DiffusionGemmaGenerationConfig,
                                                                             EntropyBoundSamplerConfig)

from benchmarks.timing import interleave, path_summary, ratio, run_bare, run_engine, same_tokens, scaling_prompt
from engine.engine import DiffusionEngine
from engine.loading import DEFAULT_MODEL, LoadedModel, ModelLoadError, check_fits, load_model
from engine.quantization import model_bytes, quantize_model
from engine.race import measure_memory_bandwidth

REPO = Path(__file__).resolve().parents[2]

REAL_CONFIG = REPO / "assets" / "configs" / "diffusiongemma-26B-A4B-it"
STEP_COUNTS = (16, 48)  # fixed decoder forwards per canvas
REHEARSAL_STEP_COUNTS = (4, 8)  # the same comparisons, fewer forwards, on the CPU
PROMPT_TOKENS = 64
SEED = 0
INIT_STD = 0.02  # the config's initializer_range: N(0, 0.02) matrices, ones for 1-D parameters
# The tiny variant of the real config used by the rehearsal and the tests: every structural choice kept (5
# sliding : 1 full becomes 1 : 1, per-layer head sizes, tied encoder/decoder, a vision tower), widths cut down
TINY_TEXT = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, moe_intermediate_size=64, num_experts=8, top_k_experts=2,
                 sliding_window=32, vocab_size=4096, layer_types=["sliding_attention", "full_attention"],
                 per_layer_config={"1": {"head_dim": 64, "num_key_value_heads": 1}})
TINY_VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=16, position_embedding_size=64)
TINY_CANVAS = 16
# Published batch-1 speed of the 26B-A4B (FP8; a secondary source attributing vLLM), by GPU name fragment
PUBLISHED_FP8 = {"H200": 1288, "H100": 1008}
# The sampler and logits path over the [canvas, vocab] float32 logits of one decoder forward, when the op count
# was not measured: about 31 ops, each reading the logits and writing on average half as much
LOGITS_OPS, LOGITS_PASSES_PER_OP = 31, 1.5


def build_config(tiny: bool = False):
    """The `DiffusionGemmaConfig` of the 26B-A4B checkpoint (`REAL_CONFIG`), or its tiny variant (`TINY_TEXT`,
    `TINY_VISION`, a `TINY_CANVAS`-token canvas)."""
    real = json.loads((REAL_CONFIG / "config.json").read_text())
    if not tiny:
        return DiffusionGemmaConfig(**real)
    return DiffusionGemmaConfig(**dict(real, text_config=dict(real["text_config"], **TINY_TEXT),
                                       vision_config=dict(real["vision_config"], **TINY_VISION),
                                       canvas_length=TINY_CANVAS))


def skeleton(config, dtype):
    """`DiffusionGemmaForBlockDiffusion` with every parameter on the meta device (no memory) and its buffers as the
    constructor computes them (CPU), encoder and decoder tied: the 26B costs about a second and no memory."""
    with init_empty_weights(include_buffers=False):
        model = DiffusionGemmaForBlockDiffusion._from_config(config, dtype=dtype)
    model.tie_weights()  # inside the context each tie re-created the parameter; tie again with the real objects
    return model


def fill(model, make) -> int:
    """Replace each distinct parameter of `model` by `make(index, parameter)` (a tensor), in every module that holds
    it, so tied parameters stay one tensor; returns how many distinct parameters there were."""
    holders: dict[int, list] = {}
    for module in model.modules():
        for attribute, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((module, attribute))
    for index, (_, param) in enumerate(list(model.named_parameters())):
        new = torch.nn.Parameter(make(index, param), requires_grad=False)
        for module, attribute in holders[id(param)]:
            module._parameters[attribute] = new
    return len(holders)


def random_model(config, device, dtype):
    """The model of `config` with random weights made directly on `device`, each distinct (tied: once) tensor
    allocated once, so the device's peak is the model itself (51.6 GB for the 26B in bf16, not the 102 GB of
    building encoder and decoder before tying them): N(0, `INIT_STD`) matrices, ones for 1-D parameters."""
    torch.manual_seed(SEED)
    model = skeleton(config, dtype)

    def make(_, param):
        if param.dim() < 2:
            return torch.ones(param.shape, dtype=param.dtype, device=device)
        return torch.empty(param.shape, dtype=param.dtype, device=device).normal_(0.0, INIT_STD)

    fill(model, make)
    return model.to(device).eval()


def random_cpu_model(config, seed: int = 0, pool_device: str = "cpu"):
    """The model of `config` on the CPU in bf16, every matrix a view of one random N(0, `INIT_STD`) pool as large as
    the largest tensor (seeded: the same weights every time), 1-D parameters ones; costs about the pool's memory
    (1.5 GB for the 26B) whatever the model's size. The pool is drawn on `pool_device` (a GPU draws it in
    milliseconds; the CPU takes seconds) and copied to the CPU."""
    model = skeleton(config, torch.bfloat16)
    largest = max(p.numel() for p in model.parameters())
    generator = torch.Generator(device=pool_device).manual_seed(seed)
    pool = (torch.randn(largest + 4096, generator=generator, device=pool_device) * INIT_STD).to(torch.bfloat16).cpu()

    def make(index, param):
        if param.dim() < 2:
            return torch.ones(param.shape, dtype=torch.bfloat16)
        offset = (index * 997) % (pool.numel() - param.numel() + 1)
        return pool[offset:offset + param.numel()].view(param.shape)

    fill(model, make)
    return model.eval()


def fixed_generation_config(steps: int, max_new_tokens: int):
    """Fixed-length generation: `steps` forwards per canvas, no adaptive stopping, no EOS (every canvas is full)."""
    return DiffusionGemmaGenerationConfig(
        max_new_tokens=max_new_tokens, max_denoising_steps=steps, sampler_config=EntropyBoundSamplerConfig(0.1),
        t_min=0.4, t_max=0.8, stability_threshold=None, confidence_threshold=None, eos_token_id=None,
        pad_token_id=0, bos_token_id=2, return_dict_in_generate=True,
    )


def engine_for(model, device, dtype, steps: int):
    """A `DiffusionEngine` over `model` with the embedded model's tokenizer (the 26B's own tokenizer cannot travel:
    ids >= 4096 show as `<id:N>`, speed does not depend on it) and `fixed_generation_config` for one canvas."""


    model.generation_config = fixed_generation_config(steps, model.config.canvas_length)
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    return DiffusionEngine(LoadedModel(model, tokenizer, "random weights", device, dtype))


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def memory_now(device) -> dict:
    """Allocated and peak-allocated bytes on a CUDA `device` since the last reset; {} elsewhere."""
    if torch.device(device).type != "cuda":
        return {}
    synchronize(device)
    return {"allocated_bytes": torch.cuda.memory_allocated(), "peak_allocated_bytes": torch.cuda.max_memory_allocated()}


def reset_peak(device) -> None:
    if torch.device(device).type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats()


def release(device) -> None:
    """Free what the last model held: parametrized (quantized) modules sit in reference cycles, so `gc.collect()`
    first, then the CUDA cache."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def fixed_settings(engine, steps: int):
    return engine.recommended.replace(max_new_tokens=engine.canvas_length, max_denoising_steps=steps,
                                      adaptive_stopping=False)


def compare_paths(engine, prompt: str, steps: int, repeats: int, engine_path: bool = True) -> dict:
    """Bare `generate()` and (with `engine_path`) the engine's frames at `steps` fixed forwards, warmed up once, then
    `repeats` rounds alternating which goes first: tokens/s, seconds, whether both gave the same tokens."""
    settings = fixed_settings(engine, steps)
    input_ids = engine.encode_prompt(prompt, raw=True)

    def bare(seed):
        return run_bare(engine, input_ids, settings, seed)  # synchronizes before and after

    def frames(seed):
        synchronize(engine.device)
        return run_engine(engine, prompt, settings, seed, True)  # the engine clock synchronizes each frame

    paths = {"bare": bare, **({"engine": frames} if engine_path else {})}
    runs = interleave(paths, (SEED,), repeats)
    result = {"steps": steps, "bare_generate": path_summary(runs["bare"])}
    if engine_path:
        result.update(engine_frames=path_summary(runs["engine"]), same_tokens=same_tokens(runs["bare"], runs["engine"]),
                      engine_over_bare_seconds=ratio(runs["engine"], runs["bare"]))
    return result


def count_forward_ops(engine, prompt: str) -> dict:
    """Aten ops one decoder forward (with its sampler step) dispatches, and the bytes its ops read and write in
    tensors at least half the size of the [canvas, vocab] logits: the difference between 2-step and 1-step
    generations of one canvas, each counted under a `TorchDispatchMode` (so the figure is the model's, not a guess)."""
    canvas, vocab = engine.canvas_length, engine.model.config.get_text_config().vocab_size
    threshold = canvas * vocab // 2

    class Counter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.logits_bytes = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.ops += 1
            for t in [*args, *(kwargs or {}).values(), *(out if isinstance(out, (tuple, list)) else [out])]:
                if isinstance(t, torch.Tensor) and t.numel() >= threshold:
                    self.logits_bytes += t.numel() * t.element_size()
            return out

    input_ids = engine.encode_prompt(prompt, raw=True)
    counts = {}
    for steps in (1, 2):
        counter = Counter()
        with counter, torch.no_grad():
            torch.manual_seed(SEED)
            engine.model.generate(input_ids, **fixed_settings(engine, steps).generate_kwargs())
        counts[steps] = counter
    ops = counts[2].ops - counts[1].ops
    logits_bytes = counts[2].logits_bytes - counts[1].logits_bytes
    return {"ops_per_forward": ops, "logits_bytes_per_forward": logits_bytes,
            "logits_tensor_bytes": canvas * vocab * 4,
            "logits_passes_per_forward": round(logits_bytes / (canvas * vocab * 4), 1),
            "ops_one_step_generation": counts[1].ops}


def measure_bandwidth(device) -> float | None:
    """Device-to-device copy bandwidth in bytes/s (`engine.race.measure_memory_bandwidth`); None off CUDA."""


    return measure_memory_bandwidth(torch.device(device))


@dataclass(frozen=True)
class WeightCensus:
    """Parameter counts by how often a forward reads them (tied weights counted once, vision tower left out)."""

    dense: int             # attention, dense MLP, router and norms of all layers, final norm
    experts: int           # all experts of all layers
    vocab_matrix: int      # the tied embedding / LM head
    self_conditioning: int
    num_experts: int
    top_k: int

    @property
    def text_total(self) -> int:
        return self.dense + self.experts + self.vocab_matrix + self.self_conditioning

    @property
    def active_per_token(self) -> int:
        """Parameters one token uses: all but the unrouted experts (the "A4B" figure)."""
        return self.dense + self.experts * self.top_k // self.num_experts + self.vocab_matrix


def weight_census(model) -> WeightCensus:
    """Count `model`'s parameters by role (works on the meta device, so the 26B census costs no memory)."""
    counts = {"dense": 0, "experts": 0, "vocab_matrix": 0, "self_conditioning": 0}
    for name, parameter in model.named_parameters():  # tied parameters appear once
        if "vision" in name:
            continue
        role = ("experts" if ".experts." in name else "vocab_matrix" if "embed_tokens" in name or "lm_head" in name
                else "self_conditioning" if "self_conditioning" in name else "dense")
        counts[role] += parameter.numel()
    text = model.config.text_config
    return WeightCensus(**counts, num_experts=text.num_experts, top_k=text.top_k_experts)


def meta_census(config) -> WeightCensus:
    """The weight census of `config`'s model built on the meta device (no memory, about a second)."""
    with torch.device("meta"):
        return weight_census(DiffusionGemmaForBlockDiffusion(config))


def expected_experts_hit(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts that `tokens` tokens reach in one layer, each routed uniformly to `top_k`."""
    return num_experts * (1 - (1 - top_k / num_experts) ** tokens)


def estimated_logits_bytes(canvas_length: int, vocab_size: int) -> float:
    """Bytes the sampler and logits path move per decoder forward when not measured: `LOGITS_OPS` ops over the
    float32 [canvas, vocab] logits, `LOGITS_PASSES_PER_OP` tensor passes each (12.5 GB for 256 x 262,144)."""
    return LOGITS_OPS * LOGITS_PASSES_PER_OP * canvas_length * vocab_size * 4


def bytes_per_pass(census: WeightCensus, canvas_length: int, bytes_per_param: float, routing: str,
                   logits_bytes: float = 0.0) -> dict:
    """Bytes one decoder forward and one encoder pass (over one canvas) move through memory: their weights, and
    for the decoder forward `logits_bytes` of logits and sampler traffic.

    routing: "active" reads top-k experts per layer; "expected" the experts `canvas_length` uniformly routed tokens
    hit. Raises ValueError for another routing.
    """
    if routing == "active":
        experts_read = census.top_k
    elif routing == "expected":
        experts_read = expected_experts_hit(census.num_experts, census.top_k, canvas_length)
    else:
        raise ValueError(f"routing must be 'active' or 'expected', got {routing!r}")
    layers_params = census.dense + census.experts * experts_read / census.num_experts
    decoder = layers_params + census.self_conditioning + 2 * census.vocab_matrix  # LM head + soft embeddings
    return {"decoder_forward": decoder * bytes_per_param + logits_bytes,
            "encoder_pass": layers_params * bytes_per_param, "experts_read_per_layer": experts_read}


def bandwidth_bound_tokens_per_second(decoder_bytes: float, encoder_bytes: float, steps: int, canvas_length: int,
                                      bandwidth_bytes_per_s: float) -> float:
    """Upper bound on tokens/s: one canvas of `canvas_length` tokens costs `steps` decoder forwards and one encoder
    pass, each moving its bytes once at `bandwidth_bytes_per_s` (prompt prefill left out)."""
    seconds_per_canvas = (steps * decoder_bytes + encoder_bytes) / bandwidth_bytes_per_s
    return canvas_length / seconds_per_canvas


def bounds(census: WeightCensus, canvas_length: int, steps: int, bandwidth: float, logits_bytes: float) -> dict:
    """Bandwidth bounds (tokens/s) for bf16 and FP8 weights, "active" and "expected" routing, logits traffic in."""
    result = {}
    for dtype, size in (("bf16", 2), ("fp8", 1)):
        for routing in ("active", "expected"):
            passes = bytes_per_pass(census, canvas_length, size, routing, logits_bytes)
            result[f"{dtype}_{routing}"] = round(bandwidth_bound_tokens_per_second(
                passes["decoder_forward"], passes["encoder_pass"], steps, canvas_length, bandwidth), 1)
            result[f"{dtype}_{routing}_decoder_gb"] = round(passes["decoder_forward"] / 1e9, 2)
    return result


def device_of(rehearsal: bool) -> str:
    return "cpu" if rehearsal else "cuda"


def step_counts(rehearsal: bool) -> tuple[int, ...]:
    return REHEARSAL_STEP_COUNTS if rehearsal else STEP_COUNTS


def step_preflight(result, rehearsal: bool) -> None:
    """Every CUDA path on the embedded tiny model through `load_model`: none, 4bit, 8bit (load, generate one fixed
    canvas, memory), the fp8 refusal, and the fit refusal of the 26B against a 40 GB card (meta-device count)."""


    device = device_of(rehearsal)
    for quantization in ("none", "4bit", "8bit"):
        try:
            release(device)
            reset_peak(device)
            started = time.perf_counter()
            engine = DiffusionEngine(load_model(DEFAULT_MODEL, device=device, quantization=quantization))
            synchronize(device)
            load_s = time.perf_counter() - started
            settings = fixed_settings(engine, 4)
            started = time.perf_counter()
            out = engine.generate("In the beginning", settings, raw=True, seed=SEED)
            synchronize(device)
            result.add(quantization, {
                "load_s": round(load_s, 2), "generate_s": round(time.perf_counter() - started, 3),
                "tokens": len(out.token_ids), "weights_bytes": model_bytes(engine.model),
                "model_device": str(next(engine.model.parameters()).device), "memory": memory_now(device)})
            del engine, out
        except Exception as error:  # noqa: BLE001 - the next path still runs
            result.error(quantization, error)
    try:
        load_model(DEFAULT_MODEL, device=device, quantization="fp8")
        result.add("fp8", {"refused": None, "loaded": True})
    except ModelLoadError as error:
        result.add("fp8", {"refused": str(error)})
    except Exception as error:  # noqa: BLE001
        result.error("fp8", error)
    try:
        check_fits(build_config(), torch.bfloat16, "none", torch.device("cuda"), free=int(40e9))
        result.add("fit_refusal_40gb", None)
    except ModelLoadError as error:
        result.add("fit_refusal_40gb", str(error))


def build_26b(result, rehearsal: bool):
    """The 26B config (the tiny variant in a rehearsal) with random bf16 weights on the device; records the build
    time and peak (the peak counter is reset after), and the bytes of the weights."""


    device = device_of(rehearsal)
    release(device)
    reset_peak(device)
    started = time.perf_counter()
    model = random_model(build_config(tiny=rehearsal), device, torch.bfloat16)
    synchronize(device)
    result.add("build", {"seconds": round(time.perf_counter() - started, 2), "weights_bytes": model_bytes(model),
                         "memory": memory_now(device), "config": "tiny" if rehearsal else "26B-A4B"})
    reset_peak(device)
    return model


def step_bf16(result, rehearsal: bool) -> None:
    """The 26B in bf16, eager, dynamic cache: bare `generate()` against the engine's frames at each of `STEP_COUNTS`
    (same tokens?), GPU memory after load and peak while generating, ops and logits bytes per forward, and the
    bandwidth bound from the measured bandwidth and measured logits traffic."""


    device = device_of(rehearsal)
    model = build_26b(result, rehearsal)
    engine = engine_for(model, torch.device(device), torch.bfloat16, step_counts(rehearsal)[0])
    prompt = scaling_prompt(engine, PROMPT_TOKENS)
    result.add("prompt_tokens", int(engine.encode_prompt(prompt, raw=True).shape[1]))
    for steps in step_counts(rehearsal):
        try:
            result.add(f"steps_{steps}", compare_paths(engine, prompt, steps, repeats=1 if rehearsal else 2))
        except Exception as error:  # noqa: BLE001
            result.error(f"steps_{steps}", error)
    result.add("memory_while_generating", memory_now(device))
    logits_bytes = estimated_logits_bytes(engine.canvas_length, model.config.get_text_config().vocab_size)
    try:
        counted = count_forward_ops(engine, prompt)
        result.add("forward_ops", counted)
        logits_bytes = counted["logits_bytes_per_forward"]
    except Exception as error:  # noqa: BLE001 - the bound then uses the estimate
        result.error("forward_ops", error)
    census = weight_census(model)
    bandwidth = measure_bandwidth(device)
    result.add("bandwidth_bound", {
        "measured_bandwidth_bytes_per_s": bandwidth, "logits_bytes_per_forward": logits_bytes,
        "text_parameters": census.text_total,
        "active_parameters_per_token": census.active_per_token,
        "published_fp8_tokens_per_second": next((v for k, v in PUBLISHED_FP8.items() if k in
                                                 result.data["versions"].get("gpu", "")), None),
        **({f"steps_{s}": bounds(census, engine.canvas_length, s, bandwidth, logits_bytes)
            for s in step_counts(rehearsal)} if bandwidth else {"skipped": "no measured bandwidth (not CUDA)"})})


def step_quantized(result, rehearsal: bool, quantization: str) -> None:
    """One quantization choice on the 26B: a seeded random CPU model (views of one pool) moved to the device by
    `engine.quantization.quantize_model`, the path `load_model` takes after its memory-mapped CPU load (one tensor
    at a time, quantized on the device); memory after load, peak while loading and while generating, bare
    `generate()` tokens/s at each of `STEP_COUNTS`."""


    device = device_of(rehearsal)
    started = time.perf_counter()
    model = random_cpu_model(build_config(tiny=rehearsal), pool_device=device)
    result.add("cpu_build_s", round(time.perf_counter() - started, 2))
    release(device)
    reset_peak(device)
    started = time.perf_counter()
    model = quantize_model(model, quantization, device)
    synchronize(device)
    gc.collect()
    result.add("load", {"seconds": round(time.perf_counter() - started, 2), "weights_bytes": model_bytes(model),
                        "memory": memory_now(device)})
    reset_peak(device)
    engine = engine_for(model, torch.device(device), torch.bfloat16, step_counts(rehearsal)[0])
    prompt = scaling_prompt(engine, PROMPT_TOKENS)
    for steps in step_counts(rehearsal):
        try:
            result.add(f"steps_{steps}", compare_paths(engine, prompt, steps, repeats=1, engine_path=False))
        except Exception as error:  # noqa: BLE001
            result.error(f"steps_{steps}", error)
    result.add("memory_while_generating", memory_now(device))


def step_static(result, rehearsal: bool, full: bool) -> None:
    """The static cache (`cache_implementation="static"`), which makes transformers `torch.compile` the encoder, the
    decoder forward and the sampler: the embedded tiny model (or, `full`, the 26B), bare `generate()` against the
    engine at 16 fixed steps. The first (compiling) call's time is written before it starts and when it ends, so a cap
    hit during compilation still says how far it got. A rehearsal keeps the static cache but not the compile
    (`disable_compile`: a CPU compile of even the tiny model takes minutes)."""


    device = device_of(rehearsal)
    if full:
        engine = engine_for(build_26b(result, rehearsal), torch.device(device), torch.bfloat16, 16)
    else:
        engine = DiffusionEngine(load_model(DEFAULT_MODEL, device=device))
    prompt = scaling_prompt(engine, PROMPT_TOKENS)
    steps, repeats = step_counts(rehearsal)[0], 1 if rehearsal else 3
    if not full:  # the tiny model's eager speed, for comparison
        result.add("dynamic", compare_paths(engine, prompt, steps, repeats))
    config = engine.model.generation_config
    config.cache_implementation = "static"
    config.disable_compile = rehearsal
    result.add("compiled", not rehearsal)
    result.add("compile_started_unix", round(time.time(), 1))
    input_ids = engine.encode_prompt(prompt, raw=True)
    synchronize(device)
    started = time.perf_counter()
    with torch.no_grad():
        engine.model.generate(input_ids, **fixed_settings(engine, steps).generate_kwargs())
    synchronize(device)
    result.add("first_call_s", round(time.perf_counter() - started, 2))
    result.add("static", compare_paths(engine, prompt, steps, repeats))
    result.add("memory_while_generating", memory_now(device))


# Each model step by name, as `steps.run_step` calls it: (a `steps.Result` to fill, rehearsal)
STEPS = {"preflight": step_preflight, "bf16": step_bf16, "8bit": partial(step_quantized, quantization="8bit"),
         "4bit": partial(step_quantized, quantization="4bit"), "static_tiny": partial(step_static, full=False),
         "static_26b": partial(step_static, full=True)}

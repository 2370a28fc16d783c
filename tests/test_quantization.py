"""Quantization (engine/quantization.py, fp8 included) and the memory report (its `memory_report`), on the CPU.

Each CPU choice (4bit, 8bit) loads the embedded model and a scaled stand-in of the real 26B config (its structure:
5 sliding : 1 full attention layers with their own head sizes, tied encoder/decoder, a vision tower; widths cut
down), and the expert tensors must end up stored as packed bytes, shared by encoder and decoder. `fp8` needs a
CUDA GPU of compute capability 8.9: here it must be refused with one line, and what transformers' FP8 loading
path produces (run on the CPU with its hardware check patched out: conversion only, no FP8 matmul) must be what the
meta-device memory report counts.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import shutil
import subprocess
import sys

import pytest
import torch
from torch.nn.utils import parametrize
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
from transformers.integrations.finegrained_fp8 import FP8Experts, FP8Linear
from transformers.quantizers.quantizer_finegrained_fp8 import FineGrainedFP8HfQuantizer

from diffgemma_ui.blocks import header_html
from engine import DEFAULT_MODEL, DiffusionEngine, ModelLoadError, load_model
from engine.cli import main as cli_main
from engine.loading import REPO_ROOT, check_fits, check_quantization, meta_model, read_config
from engine.quantization import (BITSANDBYTES_QUANTIZATIONS, BNB_CPU_LOGGER, FP8_BLOCK_SIZE, GROUPS,
                                 bitsandbytes_missing, check_fp8_shapes, cpu_path, fp8_refusal, from_pretrained_fp8,
                                 is_experts, memory_report, model_bytes, quantized_nbytes)

REAL_CONFIG = REPO_ROOT / "assets" / "configs" / "diffusiongemma-26B-A4B-it"
CHOICES = list(BITSANDBYTES_QUANTIZATIONS)  # the choices that run on a CPU
STORED_BYTES_PER_WEIGHT = {"4bit": 0.5, "8bit": 1.0}  # packed codes, scales aside


def save_scaled_real_config(folder, text_widths: dict, vision_hidden_size: int) -> None:
    """Save, with random bf16 weights (seed 0), the real config with `text_widths`, one sliding and one full text
    layer, and a one-layer vision tower of `vision_hidden_size` (2 heads of 16, MLP 48 wide)."""
    real = json.loads((REAL_CONFIG / "config.json").read_text())
    text = dict(real["text_config"], num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
                sliding_window=64, **text_widths)
    vision = dict(real["vision_config"], hidden_size=vision_hidden_size, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=16, position_embedding_size=64)
    config = DiffusionGemmaConfig(**dict(real, text_config=text, vision_config=vision, canvas_length=32))
    torch.manual_seed(0)
    DiffusionGemmaForBlockDiffusion._from_config(config, dtype=torch.bfloat16).save_pretrained(folder)


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """The real config scaled down (hidden 64, 16 experts of 32, one sliding and one full layer, vocabulary of the
    embedded tokenizer), random bf16 weights, saved with the embedded model's tokenizer files."""
    folder = tmp_path_factory.mktemp("standin")
    save_scaled_real_config(folder, dict(hidden_size=64, intermediate_size=48, num_attention_heads=2,
                                         num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, num_experts=16,
                                         top_k_experts=4, vocab_size=4096,
                                         per_layer_config={"1": {"head_dim": 32, "num_key_value_heads": 1}}),
                            vision_hidden_size=32)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(DEFAULT_MODEL / name, folder / name)
    return folder


def experts_modules(model):
    return [m for m in model.modules() if is_experts(m)]


def check_quantized(model, quantization: str) -> None:
    """Every experts tensor and text-layer linear is stored packed (uint8, the bytes the scheme gives), and encoder
    and decoder layers share the quantized module."""
    experts = experts_modules(model)
    assert experts
    for module in experts:
        for name in ("gate_up_proj", "down_proj"):
            assert parametrize.is_parametrized(module, name), name
            stored = module.parametrizations[name].original
            read = getattr(module, name)
            assert stored.dtype == torch.uint8 and read.dtype == torch.float32 and read.dim() == 3
            assert stored.numel() == math.ceil(read.numel() * STORED_BYTES_PER_WEIGHT[quantization])
    inner = model.model
    for encoder_layer, decoder_layer in zip(inner.encoder.language_model.layers, inner.decoder.layers):
        assert encoder_layer.experts is decoder_layer.experts
        assert encoder_layer.self_attn.q_proj is decoder_layer.self_attn.q_proj
        assert parametrize.is_parametrized(decoder_layer.self_attn.q_proj, "weight")
        assert parametrize.is_parametrized(decoder_layer.mlp.down_proj, "weight")
        assert not parametrize.is_parametrized(decoder_layer.router.proj)  # routing stays in full precision


@pytest.mark.slow
@pytest.mark.parametrize("quantization", CHOICES)
def test_embedded_model_quantizes_experts_and_generates_reproducibly(quantization):
    plain = load_model(device="cpu")
    loaded = load_model(device="cpu", quantization=quantization)
    check_quantized(loaded.model, quantization)
    before, after = memory_report(plain.model)["groups"], memory_report(loaded.model)["groups"]
    # fp32 experts (4 bytes a weight) stored at 0.5625 (4bit) or 1.0156 (8bit) bytes a weight
    ratio = after["experts"] / before["experts"]
    assert ratio == pytest.approx({"4bit": 0.5625 / 4, "8bit": 1.015625 / 4}[quantization], rel=0.01)
    assert after["embeddings"] == before["embeddings"]  # the tied vocabulary matrix stays as it is
    engine = DiffusionEngine(loaded)
    settings = engine.recommended.replace(max_new_tokens=64, max_denoising_steps=8)
    first = engine.generate("In the beginning", settings, raw=True, seed=7)
    second = engine.generate("In the beginning", settings, raw=True, seed=7)
    assert first.token_ids and first.token_ids == second.token_ids


@pytest.mark.parametrize("quantization", CHOICES)
def test_scaled_standin_of_the_real_config_quantizes_and_generates(standin, quantization):
    loaded = load_model(standin, device="cpu", quantization=quantization)
    check_quantized(loaded.model, quantization)
    assert len(loaded.model.model.decoder.layers) == 2
    engine = DiffusionEngine(loaded)
    settings = engine.recommended.replace(max_new_tokens=32, max_denoising_steps=2)
    runs = [engine.generate("Hello", settings, raw=True, seed=3).token_ids for _ in range(2)]
    assert runs[0] and runs[0] == runs[1]


@pytest.mark.slow
def test_quantized_logits_stay_close_to_full_precision():
    """4-bit and 8-bit change the decoder's output a little, 8-bit less than 4-bit (same inputs)."""
    ids = torch.arange(5, 69).unsqueeze(0)
    logits = {}
    for quantization in ("none", *CHOICES):
        model = load_model(device="cpu", quantization=quantization).model
        with torch.no_grad():
            out = model.model.encoder.language_model(input_ids=ids).last_hidden_state
            logits[quantization] = model.lm_head(out).log_softmax(-1)

    def kl(q):
        per_position = torch.nn.functional.kl_div(logits[q], logits["none"], log_target=True, reduction="none")
        return per_position.sum(-1).mean().item()  # mean KL(full || quantized) per position, nats

    assert 0 < kl("8bit") < kl("4bit") < 0.1


@pytest.mark.slow
def test_memory_report_equals_the_tensors_bytes():
    """Unquantized: the report's total is the bytes of every distinct parameter and buffer. Quantized: the report
    computed on the meta device (from the config alone) equals the report of the model quantized for real, group by
    group, and the experts group equals the packed codes plus their bitsandbytes scales and code tables."""
    model = load_model(device="cpu").model
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    report = memory_report(model)
    assert set(report["groups"]) == set(GROUPS)
    assert report["total_bytes"] == sum(t.numel() * t.element_size() for t in tensors) == sum(report["groups"].values())
    for quantization in CHOICES:
        quantized = load_model(device="cpu", quantization=quantization).model
        real = memory_report(quantized)
        assert memory_report(meta_model(DEFAULT_MODEL, torch.float32), quantization) == real
        experts_bytes = 0
        for module in experts_modules(quantized):
            for name in ("gate_up_proj", "down_proj"):
                plist = module.parametrizations[name]
                state = plist[0].quant_state
                experts_bytes += sum(t.numel() * t.element_size() for t in (plist.original, state.absmax, state.code))
        assert real["groups"]["experts"] == experts_bytes


@pytest.mark.slow
def test_memory_command_reads_a_config_only_folder_on_the_meta_device(capsys):
    """The full 26B config: 25.8B parameters, bf16 about 51.6 GB; 4-bit under 18 GB and 8-bit under 30 GB."""
    assert cli_main(["memory", "--model", str(REAL_CONFIG), "--quantization", "4bit", "--json"]) == 0
    four = json.loads(capsys.readouterr().out)
    assert set(four) == {"total_bytes", "groups"} and set(four["groups"]) == set(GROUPS)
    model = meta_model(REAL_CONFIG)
    assert sum(p.numel() for p in model.parameters()) == 25_823_778_864
    full, eight = memory_report(model), memory_report(model, "8bit")
    assert full["groups"]["experts"] == 2 * 30 * 128 * 3 * 704 * 2816  # gate_up [128, 1408, 2816] + down, bf16
    assert four["groups"]["experts"] == 30 * sum(quantized_nbytes(128 * n * 704 * 2816, "4bit") for n in (2, 1))
    assert four["total_bytes"] < 18e9 < eight["total_bytes"] < 30e9 < full["total_bytes"]


@pytest.mark.slow
def test_refusals_are_one_clear_line(tmp_path):
    with pytest.raises(ModelLoadError, match="^4bit quantization runs on CUDA or the CPU .*not on mps") as info:
        check_quantization("4bit", torch.device("mps"))
    assert "\n" not in str(info.value)
    check_quantization("8bit", torch.device("cpu"))  # accepted
    out = subprocess.run([sys.executable, "-m", "engine", "memory", "--model", str(tmp_path / "missing")],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert out.returncode == 2 and out.stderr.startswith("error: model folder") and out.stderr.count("\n") == 1


def test_cuda_loads_onto_the_device_and_refuses_a_model_that_does_not_fit(monkeypatch):
    """`device="cuda"` places every weight on the GPU (never `device_map="auto"`, which spreads a large model onto
    the CPU without a word), after a meta-device count of the weights against the free memory."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10_000_000, 80_000_000_000))
    with pytest.raises(ModelLoadError) as info:  # 27.7 MB of fp32 weights, 10 MB free
        load_model(DEFAULT_MODEL, device="cuda", dtype="float32")
    message = str(info.value)
    assert "\n" not in message and message.startswith("the unquantized weights need about 0.0 GB")
    assert message.endswith("cuda has 0.0 GB free: use --quantization 4bit (about 0.0 GB)")
    seen = {}

    def from_pretrained(where, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop before touching CUDA")

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80_000_000_000, 80_000_000_000))
    monkeypatch.setattr(DiffusionGemmaForBlockDiffusion, "from_pretrained", from_pretrained)
    with pytest.raises(ModelLoadError, match="stop before touching CUDA"):
        load_model(DEFAULT_MODEL, device="cuda")
    assert seen["device_map"] == {"": torch.device("cuda")} and seen["dtype"] == torch.bfloat16


@pytest.mark.slow
def test_fit_check_counts_the_26b_on_the_meta_device_and_names_what_fits():
    config = meta_model(REAL_CONFIG).config
    gb = 1e9
    assert check_fits(config, torch.bfloat16, "none", torch.device("cuda"), free=int(70 * gb)) == pytest.approx(
        51.6 * gb, rel=0.01)
    with pytest.raises(ModelLoadError, match=r"need about 51\.\d GB .* has 40\.0 GB free: use --quantization 8bit"):
        check_fits(config, torch.bfloat16, "none", torch.device("cuda"), free=int(40 * gb))
    with pytest.raises(ModelLoadError, match=r"has 24\.0 GB free: use --quantization 4bit \(about 1[45]\.\d GB\)"):
        check_fits(config, torch.bfloat16, "8bit", torch.device("cuda"), free=int(24 * gb))
    with pytest.raises(ModelLoadError, match="not even 4bit fits"):
        check_fits(config, torch.bfloat16, "4bit", torch.device("cuda"), free=int(8 * gb))
    assert check_fits(config, torch.bfloat16, "none", torch.device("cpu"), free=0) == 0  # only CUDA is checked


@pytest.mark.slow
def test_model_bytes_is_the_memory_reports_total():
    for quantization in ("none", "4bit"):
        model = load_model(device="cpu", quantization=quantization).model
        assert model_bytes(model) == memory_report(model)["total_bytes"]
    assert model_bytes(meta_model(DEFAULT_MODEL, torch.float32)) == model_bytes(load_model(device="cpu").model)


def test_header_shows_the_weights_memory_of_the_loaded_model():
    for quantization in ("none", "4bit"):  # 27.7 MB and 7.6 MB
        engine = DiffusionEngine(load_model(device="cpu", quantization=quantization))
        expected = f"weights: {memory_report(engine.model)['total_bytes'] / 1e6:.1f} MB"
        assert expected in header_html(engine)


def test_fp8_is_refused_on_a_cpu_and_an_older_gpu_with_one_line(monkeypatch, tmp_path, capsys):
    """Before any loading (the model folder does not even exist), and through the CLI as one line."""
    with pytest.raises(ModelLoadError, match=r"^fp8 quantization needs a CUDA GPU of compute capability 8\.9") as info:
        load_model(tmp_path / "missing", device="cpu", quantization="fp8")
    assert "\n" not in str(info.value) and "not cpu" in str(info.value)
    assert cli_main(["generate", "--prompt", "Hi", "--device", "cpu", "--quantization", "fp8"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    refusal = fp8_refusal(torch.device("cuda"))
    assert refusal.startswith("fp8 quantization needs compute capability 8.9") and "A100-SXM4-80GB has 8.0" in refusal
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100 or H200
    monkeypatch.setattr("transformers.utils.import_utils.is_kernels_available", lambda: False)
    assert fp8_refusal(torch.device("cuda")) == (
        "fp8 quantization needs kernels>=0.18.2,<0.19.0 (what this transformers accepts), and its FP8 matmul kernel "
        "is downloaded from the Hugging Face Hub when the model loads: without both, use --quantization 8bit or 4bit")
    monkeypatch.setattr("transformers.utils.import_utils.is_kernels_available", lambda: True)
    assert fp8_refusal(torch.device("cuda")) is None


@pytest.fixture(scope="module")
def fp8_standin(tmp_path_factory):
    """The real config scaled down to widths the fp8 blocks divide (hidden 64, 4 experts of 64), bf16 weights; the
    vision tower's 32-row attention matrices are not a multiple of the block, as the real 4304-wide vision MLP."""
    folder = tmp_path_factory.mktemp("fp8_standin")
    save_scaled_real_config(folder, dict(hidden_size=64, intermediate_size=128, num_attention_heads=2,
                                         num_key_value_heads=2, head_dim=32, moe_intermediate_size=64, num_experts=4,
                                         top_k_experts=2, vocab_size=512,
                                         per_layer_config={"1": {"head_dim": 64, "num_key_value_heads": 1}}),
                            vision_hidden_size=64)
    return folder


def distinct_tensor_bytes(model) -> int:
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    return sum(t.numel() * t.element_size() for t in tensors)


def test_fp8_meta_count_equals_what_transformers_fp8_loading_produces(fp8_standin, monkeypatch):
    """transformers' own path (`from_pretrained(quantization_config=FineGrainedFP8Config)`), run on the CPU with
    its GPU check patched out: experts become FP8Experts with float8 tensors, the tied encoder modules are the
    decoder's (the library alone leaves the encoder's scales uninitialised), and the meta-device report counts
    exactly the bytes of the loaded tensors, tensor by tensor."""
    monkeypatch.setattr(FineGrainedFP8HfQuantizer, "validate_environment", lambda self, *args, **kwargs: None)
    loaded = from_pretrained_fp8(str(fp8_standin), torch.device("cpu"), torch.bfloat16)
    meta = meta_model(fp8_standin)
    report = memory_report(meta, "fp8")
    assert report["total_bytes"] == distinct_tensor_bytes(loaded) == distinct_tensor_bytes(meta)
    assert report == memory_report(loaded)
    shapes = {name: (p.shape, p.dtype) for name, p in meta.named_parameters()}
    assert shapes == {name: (p.shape, p.dtype) for name, p in loaded.named_parameters()}
    for encoder_layer, decoder_layer in zip(loaded.model.encoder.language_model.layers, loaded.model.decoder.layers):
        assert isinstance(decoder_layer.experts, FP8Experts)
        assert encoder_layer.experts is decoder_layer.experts
        assert encoder_layer.mlp.down_proj is decoder_layer.mlp.down_proj
        assert isinstance(decoder_layer.self_attn.q_proj, FP8Linear)
        for name in ("gate_up_proj", "down_proj"):
            weight, scale = getattr(decoder_layer.experts, name), getattr(decoder_layer.experts, f"{name}_scale_inv")
            assert weight.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
            blocks = (math.ceil(n / b) for n, b in zip(weight.shape[1:], FP8_BLOCK_SIZE))
            assert scale.shape == (weight.shape[0], *blocks)
        assert decoder_layer.router.proj.weight.dtype == torch.bfloat16  # routing stays as it is
    vision_q = loaded.model.encoder.vision_tower.encoder.layers[0].self_attn.q_proj.linear
    assert vision_q.weight.dtype == torch.bfloat16  # 32 rows: not a multiple of the block, kept by the library


@pytest.mark.slow
def test_fp8_meta_report_of_the_real_config_converts_every_expert():
    """The 26B config on the meta device: every experts module FP8Experts with float8_e4m3fn tensors and a float32
    scale per 64 x 64 block; the report is the sum of the converted tensors' bytes; 27.0 GB in all."""
    model = meta_model(REAL_CONFIG)
    report = memory_report(model, "fp8")
    assert report["total_bytes"] == distinct_tensor_bytes(model) == sum(report["groups"].values())
    experts = {id(m): m for m in model.modules() if isinstance(m, FP8Experts)}.values()
    assert len(experts) == 30  # shared by encoder and decoder
    for module in experts:
        assert module.gate_up_proj.dtype == module.down_proj.dtype == torch.float8_e4m3fn
        assert module.gate_up_proj.device.type == "meta"
    per_layer = 128 * 3 * 704 * 2816 + 4 * 128 * (22 * 44 + 44 * 11)  # float8 weights + float32 block scales
    assert report["groups"]["experts"] == 30 * per_layer
    assert report["total_bytes"] < 30e9


def test_fp8_refuses_expert_widths_its_blocks_do_not_divide(standin):
    """The 4bit/8bit stand-in has experts 32 wide: fp8 would leave them in bf16 for kernels that read FP8."""
    with pytest.raises(ValueError, match=r"^fp8 quantizes blocks of 64x64; this model's moe_intermediate_size 32 is"):
        check_fp8_shapes(read_config(standin))
    check_fp8_shapes(read_config(REAL_CONFIG))  # 2816 and 704: accepted


def test_bitsandbytes_kernels_notice_is_dropped_and_its_other_warnings_kept(caplog):
    if (missing := bitsandbytes_missing()) is not None:  # imports it, the filter set first
        pytest.skip(missing)
    with caplog.at_level(logging.WARNING):
        logger = logging.getLogger(BNB_CPU_LOGGER)
        logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you "
                       "already `pip install kernels`", ModuleNotFoundError("No module named 'kernels'"))
        logger.warning("Failed to load CPU-only bitsandbytes library")
    assert [r.getMessage() for r in caplog.records] == ["Failed to load CPU-only bitsandbytes library"]


def test_the_cpu_path_is_named_for_bitsandbytes_choices_on_a_cpu_only():
    assert cpu_path("4bit", "cpu").startswith("4bit on the CPU: bitsandbytes NF4")
    assert cpu_path("8bit", torch.device("cpu")).startswith("8bit on the CPU: bitsandbytes blockwise 8-bit")
    assert cpu_path("4bit", "cuda") is None and cpu_path("none", "cpu") is None


def test_loading_modules_import_one_way_and_only_optional_packages_late():
    """quantization <- loading: each imports only modules before it, at the top; inside a
    function only an optional heavy package (bitsandbytes) is imported."""
    order = ["quantization", "loading"]
    for index, name in enumerate(order):
        tree = ast.parse((REPO_ROOT / "engine" / f"{name}.py").read_text())
        top = set(tree.body)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if node not in top:
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert all(m.split(".")[0] == "bitsandbytes" for m in modules), (name, modules)
            elif isinstance(node, ast.ImportFrom) and node.level:
                assert node.module in order[:index], (name, node.module)

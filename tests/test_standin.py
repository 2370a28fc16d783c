"""The product on the stand-in for google/diffusiongemma-26B-A4B-it (`standin/`): its files look like the real
checkpoint's, prompts are encoded as the real model expects, and the engine, CLI and `/generate` run on it.

Every decoder forward at the stand-in's 262,144-token vocabulary costs seconds on a CPU: runs use 1-2 denoising
steps and one canvas.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gradio_client import Client
from transformers import DiffusionGemmaForBlockDiffusion

from benchmarks.gpu import measure
from diffgemma_ui import build_app
from engine.cli import main as cli_main
from engine.generator import strip_after_eos
from engine.parity import STANDIN_PARITY_CASES, run_case
from pages import free_port
from standin.build import REAL_CONFIG_DIR, TEXT_SCALE, VISION_SCALE

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
# transformers 5.23's DiffusionGemma test: one user turn begins <bos><|turn>user\n and ends with an empty thought block
CHAT_START = [2, 105, 2364, 107]
CHAT_END = [106, 107, 105, 4368, 107, 100, 45518, 107, 101]
# ... and with enable_thinking=True a system turn <|turn>system\n<|think|>\n<turn|>\n comes first, no thought block
THINKING_START = [2, 105, 9731, 107, 98, 107, 106, 107, 105, 2364, 107]
THINKING_END = [106, 107, 105, 4368, 107]
REAL_EOS = [1, 106, 50]


def test_standin_has_the_real_checkpoints_files_and_structure(standin_path):
    names = {p.name for p in standin_path.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
            "processor_config.json", "model.safetensors.index.json"} <= names
    index = json.loads((standin_path / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) >= 2 and shards <= names
    generation_config = (REAL_CONFIG_DIR / "generation_config.json").read_bytes()
    assert (standin_path / "generation_config.json").read_bytes() == generation_config

    real = json.loads((REAL_CONFIG_DIR / "config.json").read_text())
    standin = json.loads((standin_path / "config.json").read_text())
    assert "auto_map" not in standin
    scaled_text = set(TEXT_SCALE) - {"global_head_dim", "num_global_key_value_heads"}
    scaled_text |= {"layer_types", "per_layer_config"}
    for key in set(real["text_config"]) | set(standin["text_config"]):
        if key not in scaled_text:
            assert standin["text_config"].get(key) == real["text_config"].get(key), key
    for key in set(real["vision_config"]) | set(standin["vision_config"]):
        if key not in VISION_SCALE:
            assert standin["vision_config"].get(key) == real["vision_config"].get(key), key
    assert {k: v for k, v in standin.items() if k not in ("text_config", "vision_config")} == \
        {k: v for k, v in real.items() if k not in ("text_config", "vision_config")}

    text = standin["text_config"]
    assert text["vocab_size"] == 262_144 and text["sliding_window"] == 1024 and standin["canvas_length"] == 256
    assert text["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert text["use_bidirectional_attention"] == "vision" and standin["tie_word_embeddings"] is True
    full_layer = {int(k): v for k, v in text["per_layer_config"].items()}[5]
    assert full_layer["head_dim"] != text["head_dim"]
    assert full_layer["num_key_value_heads"] < text["num_key_value_heads"]
    assert not any("layers.5.self_attn.v_proj" in name for name in index["weight_map"])  # keys double as values
    assert any("layers.4.self_attn.v_proj" in name for name in index["weight_map"])


def test_chat_prompt_ids_are_the_real_models(standin_engine):
    ids = standin_engine.encode_prompt("Why is the sky blue?")[0].tolist()
    assert ids[:4] == CHAT_START and ids[-9:] == CHAT_END
    thinking = standin_engine.encode_prompt("Why is the sky blue?", thinking=True)[0].tolist()
    assert thinking[:11] == THINKING_START and thinking[-5:] == THINKING_END
    assert thinking[11:-5] == ids[4:-9]  # the user's text is the same in both


def test_raw_prompt_starts_with_bos_once(standin_engine):
    tokenizer = standin_engine.tokenizer
    assert tokenizer("In the beginning").input_ids[0] != 2  # the Gemma 4 IT tokenizer adds no <bos>...
    ids = standin_engine.encode_prompt("In the beginning", raw=True)[0].tolist()
    assert ids == [2] + tokenizer("In the beginning").input_ids  # ...the engine does
    assert standin_engine.encode_prompt("<bos>In the beginning", raw=True)[0].tolist() == ids  # never twice


def test_thinking_is_offered_only_where_the_template_has_it(standin_engine, engine):
    assert standin_engine.supports_thinking and not engine.supports_thinking
    with pytest.raises(ValueError, match="raw"):
        standin_engine.encode_prompt("Hi", raw=True, thinking=True)
    with pytest.raises(ValueError, match="template"):
        engine.encode_prompt("Hi", thinking=True)


def test_eos_is_the_real_list_everywhere(standin_engine):
    assert standin_engine.model.generation_config.eos_token_id == REAL_EOS
    assert standin_engine.model.config.eos_token_id == [1, 106]
    # each of the three ends the answer; the pads that follow it are dropped
    for eos in REAL_EOS:
        assert strip_after_eos([9259, eos, 0, 0, 1902], REAL_EOS) == [9259, eos]


@pytest.mark.parametrize("case", STANDIN_PARITY_CASES[:3], ids=lambda case: case.label())
def test_parity_with_generate_on_the_standin(standin_engine, case):
    expected, got, stop_reason = run_case(standin_engine, case)
    assert got == expected and len(got) > 0
    assert stop_reason in ("eos", "max_new_tokens")


def test_frames_at_the_real_vocabulary_and_canvas(standin_engine):
    settings = standin_engine.recommended.replace(max_denoising_steps=1)
    frames = list(standin_engine.frames("In the beginning", settings, raw=True, seed=3))
    frame = frames[-1]
    assert len(frames) == 1 and frame.canvas_length == 256 and frame.done
    assert len(frame.draft_ids) == len(frame.confidence) == len(frame.entropy) == 256
    assert all(0 <= i < 262_144 for i in frame.input_ids + frame.draft_ids)
    assert all(0.0 < c <= 1.0 for c in frame.confidence)
    assert all(0.0 <= e <= 12.48 for e in frame.entropy)  # at most log(262,144) nats
    assert sum(frame.accepted) >= 1


def test_cli_on_the_standin_with_thinking(standin_path, standin_engine, capsys):
    status = cli_main(["generate", "--model", str(standin_path), "--device", "cpu", "--prompt", "Why is the sky blue?",
                       "--thinking", "--steps", "1", "--seed", "5", "--json"])
    out, err = capsys.readouterr()
    assert status == 0, err[-2000:]
    result = json.loads(out)
    prompt = standin_engine.encode_prompt("Why is the sky blue?", thinking=True)
    assert result["prompt_tokens"] == prompt.shape[1]
    assert result["seed"] == 5 and result["forwards"] == 1 and len(result["token_ids"]) > 0


def test_generate_api_on_the_standin(standin_engine):
    app = build_app(standin_engine)
    _, url, _ = app.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True)
    try:
        client = Client(url, verbose=False)
        s = standin_engine.recommended
        text, summary = client.predict("In the beginning", True, 256, 1, s.entropy_bound, s.t_min, s.t_max,
                                       s.stability_threshold, s.confidence_threshold, True, 11, api_name="/generate")
    finally:
        app.close()
    assert summary["forwards"] == 1 and summary["seed"] == 11
    assert summary["prompt_tokens"] == standin_engine.encode_prompt("In the beginning", raw=True).shape[1]
    torch.manual_seed(11)
    expected = standin_engine.generate("In the beginning", standin_engine.recommended.replace(max_denoising_steps=1),
                                       raw=True, seed=11)
    assert summary["token_ids"] == expected.token_ids and text == expected.text


def test_gpu_kit_builds_the_real_checkpoints_config():
    config = measure.build_config()
    assert config.text_config.use_bidirectional_attention == "vision"
    assert config.vision_config.num_hidden_layers == 27 and config.vision_config.hidden_size == 1152
    with torch.device("meta"):
        model = DiffusionGemmaForBlockDiffusion(config)
    saved = [name for name in model.state_dict() if name not in model.all_tied_weights_keys]
    assert len(saved) == 1047  # the published checkpoint's tensor count
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(25.8e9, rel=0.01)
    tiny = measure.build_config(tiny=True)
    assert tiny.text_config.use_bidirectional_attention == "vision" and tiny.canvas_length == 16
    assert tiny.text_config.per_layer_config[1].head_dim == 64  # the full layer's wider global head dim

"""Write the stand-in checkpoint: the real config scaled down, random weights, Gemma 4 tokenizer and chat template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, Gemma4AudioFeatureExtractor
from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
from transformers.utils import logging as transformers_logging

from .tokenizer import build_gemma4_tokenizer

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
REAL_CONFIG_DIR = REPO_ROOT / "assets" / "configs" / "diffusiongemma-26B-A4B-it"
CHAT_TEMPLATE = PACKAGE_DIR / "chat_template.jinja"

# Only depth, width, heads and experts shrink; everything else is the real checkpoint's (vocabulary 262,144,
# canvas 256, sliding window 1024, 5:1 sliding/full pattern, keys-equal-values full-attention layers with fewer
# key-value heads of a wider global head dim, "vision" bidirectional attention, tied embeddings, logit soft-cap).
TEXT_SCALE = dict(
    hidden_size=128, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, global_head_dim=64, num_global_key_value_heads=1, moe_intermediate_size=32, num_experts=8,
    top_k_experts=2,
)
VISION_SCALE = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=2, head_dim=24)
WEIGHTS_SEED = 0
MAX_SHARD_SIZE = "24MB"  # several shards and an index, as the real checkpoint has
IMAGE_SEQ_LENGTH = 280  # soft tokens per image (Gemma4Processor)


def scaled_config():
    """The real `DiffusionGemmaConfig` (from `REAL_CONFIG_DIR`) with `TEXT_SCALE` and `VISION_SCALE` applied."""
    real = json.loads((REAL_CONFIG_DIR / "config.json").read_text())
    text = {k: v for k, v in real["text_config"].items() if k != "per_layer_config"}  # re-derived from the scale
    text.update(TEXT_SCALE)
    pattern = real["text_config"]["layer_types"]
    text["layer_types"] = pattern[: TEXT_SCALE["num_hidden_layers"]]
    vision = {**real["vision_config"], **VISION_SCALE}
    top = {k: v for k, v in real.items() if k not in ("text_config", "vision_config", "transformers_version")}
    return DiffusionGemmaConfig(**top, text_config=text, vision_config=vision)


def processor_config(tokenizer) -> dict:
    """`processor_config.json` for `Gemma4Processor`: the image processor (280 soft tokens, patch 16, pooling 3),
    the audio feature extractor and the video processor at transformers 5.23's Gemma 4 defaults."""
    image = Gemma4ImageProcessorPil(max_soft_tokens=IMAGE_SEQ_LENGTH, patch_size=16, pooling_kernel_size=3).to_dict()
    image["resample"] = int(image["resample"])
    audio = Gemma4AudioFeatureExtractor().to_dict()
    audio = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in audio.items()}
    video = {**image, "video_processor_type": "Gemma4VideoProcessor", "max_soft_tokens": 70, "num_frames": 32,
             "do_sample_frames": True}
    video.pop("image_processor_type")
    return {"processor_class": "Gemma4Processor", "image_seq_length": IMAGE_SEQ_LENGTH, "audio_seq_length": 750,
            "audio_ms_per_token": 40, "image_processor": image, "feature_extractor": audio, "video_processor": video}


def build_standin(out: Path) -> Path:
    """Write the stand-in checkpoint into the empty or absent folder `out` and return it.

    Files, as the real checkpoint has them: config.json, generation_config.json (copied byte for byte),
    model-0000N-of-0000M.safetensors + model.safetensors.index.json (bf16), tokenizer.json, tokenizer_config.json,
    chat_template.jinja, processor_config.json. Takes about a minute on a 2-core CPU (most of it the tokenizer).

    Raises:
        FileExistsError: `out` exists and is not empty.
        standin.tokenizer.StandinTokenizerError: the Gemma 3 vocabulary package is missing.
    """
    transformers_logging.disable_progress_bar()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_gemma4_tokenizer(CHAT_TEMPLATE.read_text())

    config = scaled_config()
    torch.manual_seed(WEIGHTS_SEED)
    model = DiffusionGemmaForBlockDiffusion(config).to(torch.bfloat16).eval()
    model.generation_config = DiffusionGemmaGenerationConfig.from_pretrained(REAL_CONFIG_DIR)
    model.save_pretrained(out, max_shard_size=MAX_SHARD_SIZE)
    shutil.copyfile(REAL_CONFIG_DIR / "generation_config.json", out / "generation_config.json")

    tokenizer.save_pretrained(out)
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    tokenizer_config.update(processor_class="Gemma4Processor", extra_special_tokens=["<|video|>"])
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    (out / "processor_config.json").write_text(json.dumps(processor_config(tokenizer), indent=2, sort_keys=True) + "\n")
    return out

"""Package a training checkpoint as a shippable model folder: safetensors weights, config, tokenizer, generation config.

Run: `python -m training.export --checkpoint data/run/checkpoint --out assets/models/diffgemma-tiny`
(add `--random-init` to export an untrained model with the same architecture, for tests of the plumbing).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    DiffusionGemmaGenerationConfig,
    EntropyBoundSamplerConfig,
)

from .model_config import BOS_ID, END_OF_TURN_ID, EOS_ID, PAD_ID, tiny_config

# Recommended sampling settings of diffgemma-tiny v2, chosen with `python -m training.evaluate --sweep denoise` on the
# development prompts for a run that shows denoising (see the card); v2 first shipped 16 steps, entropy bound 2.0,
# t 0.05 -> 0.02, and v1 32 steps, entropy bound 0.5, t 0.8 -> 0.4.
SHIPPED_SETTINGS = {
    "max_new_tokens": 256,
    "max_denoising_steps": 14,
    "entropy_bound": 0.5,
    "t_min": 0.02,
    "t_max": 0.6,
    "stability_threshold": 1,
    "confidence_threshold": 0.05,
}


def generation_config(settings: dict) -> DiffusionGemmaGenerationConfig:
    """The `generation_config.json` content for `settings` (keys as in `SHIPPED_SETTINGS`)."""
    values = dict(settings)
    values["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=float(values.pop("entropy_bound")))
    return DiffusionGemmaGenerationConfig(
        **values, bos_token_id=BOS_ID, pad_token_id=PAD_ID, eos_token_id=[EOS_ID, END_OF_TURN_ID]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("data/run/checkpoint"))
    parser.add_argument("--tokenizer", type=Path, default=Path("data/tokenizer"))
    parser.add_argument("--out", type=Path, default=Path("assets/models/diffgemma-tiny"))
    parser.add_argument("--settings", type=json.loads, default=SHIPPED_SETTINGS, help="JSON object of settings")
    parser.add_argument("--random-init", action="store_true")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    if args.random_init:
        model = DiffusionGemmaForBlockDiffusion(tiny_config(len(tokenizer)))
    else:
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(args.checkpoint)
    model.generation_config = generation_config(args.settings)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"exported {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters to {args.out}")


if __name__ == "__main__":
    main()

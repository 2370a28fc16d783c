"""The diffgemma-tiny architecture: a `DiffusionGemmaConfig` scaled down from google/diffusiongemma-26B-A4B-it.

Same blocks as the released model (shared-weight causal encoder and bidirectional decoder, 5:1-style sliding/full
attention pattern ending in full attention, a dense MLP beside a top-k mixture of experts in every layer,
self-conditioning MLP, tied embeddings, final logit soft-capping at 30), scaled to ~6.9M parameters so it trains on
two CPU cores. transformers always builds a vision tower for `DiffusionGemmaConfig`; diffgemma-tiny takes no images,
so its vision tower is the smallest one the library accepts (under 3k parameters, never called).
"""

from __future__ import annotations

from transformers import DiffusionGemmaConfig

PAD_ID, EOS_ID, BOS_ID, START_OF_TURN_ID, END_OF_TURN_ID = 0, 1, 2, 3, 4

TINY_VISION_CONFIG = {
    "model_type": "gemma4_vision",
    "hidden_size": 8,
    "intermediate_size": 8,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "patch_size": 2,
    "position_embedding_size": 4,
    "pooling_kernel_size": 1,
}


def tiny_config(
    vocab_size: int = 4096, canvas_length: int = 64, hidden_size: int = 256, layers: int = 4
) -> DiffusionGemmaConfig:
    """Return the diffgemma-tiny `DiffusionGemmaConfig`.

    Args:
        vocab_size: tokenizer size, special tokens included (pad 0, eos 1, bos 2).
        canvas_length: tokens per canvas (block); every decoder forward denoises this many positions.
        hidden_size: model width; heads are 64 wide.
        layers: decoder (= encoder) layers; the last uses full attention, the others a 128-token sliding window.
    """
    text_config = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden_size // 64,
        "num_key_value_heads": max(1, hidden_size // 128),
        "head_dim": 64,
        "global_head_dim": 64,
        "max_position_embeddings": 8192,
        "sliding_window": 128,
        "layer_types": ["sliding_attention"] * (layers - 1) + ["full_attention"],
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": hidden_size,
        "pad_token_id": PAD_ID,
        "eos_token_id": EOS_ID,
        "bos_token_id": BOS_ID,
    }
    return DiffusionGemmaConfig(text_config=text_config, vision_config=TINY_VISION_CONFIG, canvas_length=canvas_length)

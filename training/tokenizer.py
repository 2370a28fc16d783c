"""Train diffgemma-tiny's byte-level BPE tokenizer on the corpus and save it in the Hugging Face layout.

Special tokens use the ids DiffusionGemma's config expects (pad 0, eos 1, bos 2), plus the Gemma turn markers
`<start_of_turn>` (3) and `<end_of_turn>` (4); `<end_of_turn>` also ends generation (an EOS id in the generation
config). The chat template is Gemma's: `<bos><start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n`.

Run: `python -m training.tokenizer --corpus data/corpus --out data/tokenizer --vocab-size 4096`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def chapter_texts(corpus_file: Path):
    """Yield one plain-text string per chapter of a corpus JSONL file (see `training.corpus`)."""
    with open(corpus_file, encoding="utf-8") as f:
        for line in f:
            yield " ".join(json.loads(line)["verses"])


def train_tokenizer(corpus_file: Path, vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of `vocab_size` tokens (specials included) and wrap it as a transformers tokenizer.

    The tokenizer prepends `<bos>` when called with `add_special_tokens=True`, like Gemma's.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
    )
    tokenizer.train_from_iterator(chapter_texts(corpus_file), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", 2)]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        additional_special_tokens=["<start_of_turn>", "<end_of_turn>"],
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert wrapped.convert_tokens_to_ids(token) == token_id, token
    return wrapped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    parser.add_argument("--out", type=Path, default=Path("data/tokenizer"))
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args()
    tokenizer = train_tokenizer(args.corpus / "train.jsonl", args.vocab_size)
    tokenizer.save_pretrained(args.out)
    sample = "In the beginning, God created the heavens and the earth."
    print(f"vocab {len(tokenizer)}; {sample!r} -> {tokenizer.tokenize(sample)}")


if __name__ == "__main__":
    main()

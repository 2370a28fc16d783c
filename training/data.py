"""Training examples for diffgemma-tiny: (prefix, clean canvas) pairs cut from the tokenized corpus.

Two kinds of example, mixed half and half, both aligned the way `generate()` lays out blocks:
- raw continuation: prefix = `<bos>` + the start of a chapter (at most `max_prefix` tokens kept), canvas = the next
  `canvas_length` tokens; a chapter ends in `<eos>`.
- chat: the chat template around one or two verses as the user turn, then one to five following verses as the model
  turn, ended by `<end_of_turn>`; canvases start at the model turn and every `canvas_length` tokens after it.
After the end token (`<eos>` or `<end_of_turn>`) the rest of the canvas is filled with that same end token
(`after_end="end"`, v2) or with `<pad>` (`after_end="pad"`, v1). `generate()` keeps the first end token of a canvas
and replaces what follows by `<pad>` itself, so the model never needs to write `<pad>`; with v1's pad targets it
learnt `<pad>` as the likeliest canvas token and, at low temperature, wrote canvases of pads without ending.
Tokenized chapters are cached as a list of verses, each a list of token ids with a leading space; the user turn
is tokenized as typed (no leading space), as a playground user's prompt would be.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from .model_config import BOS_ID, END_OF_TURN_ID, EOS_ID, PAD_ID


@dataclass
class Batch:
    """One training batch. Shapes: `prefix` and `prefix_mask` `[batch, prefix_len]` (left-padded, mask 1 on real
    tokens), `canvas` `[batch, canvas_length]` (clean targets)."""

    prefix: torch.LongTensor
    prefix_mask: torch.LongTensor
    canvas: torch.LongTensor


class ExampleSampler:
    """Draws (prefix, canvas) examples from tokenized chapters; seeded and independent of torch's global RNG."""

    def __init__(self, tokenizer, corpus_file: Path, canvas_length: int, max_prefix: int, seed: int,
                 after_end: str = "end"):
        if after_end not in ("end", "pad"):
            raise ValueError(f"after_end must be 'end' or 'pad', got {after_end!r}")
        self.after_end = after_end
        self.canvas_length = canvas_length
        self.max_prefix = max_prefix
        self.rng = random.Random(seed)
        with open(corpus_file, encoding="utf-8") as f:
            chapters = [json.loads(line)["verses"] for line in f]
        flat = [" " + v for verses in chapters for v in verses]
        encoded = tokenizer(flat, add_special_tokens=False).input_ids
        self.tokenizer = tokenizer
        self.texts = chapters
        self.chapters: list[list[list[int]]] = []
        k = 0
        for verses in chapters:
            self.chapters.append(encoded[k : k + len(verses)])
            k += len(verses)
        self.user_open = tokenizer("<start_of_turn>user\n", add_special_tokens=False).input_ids
        self.model_open = tokenizer("<end_of_turn>\n<start_of_turn>model\n", add_special_tokens=False).input_ids

    def raw_example(self) -> tuple[list[int], list[int]]:
        chapter = self.rng.choice(self.chapters)
        doc = [BOS_ID] + [t for verse in chapter for t in verse] + [EOS_ID]
        start = self.rng.randrange(1, len(doc))
        return doc[max(0, start - self.max_prefix) : start], self._fill(doc[start : start + self.canvas_length])

    def _fill(self, canvas: list[int]) -> list[int]:
        """Complete a canvas cut short by the end of its text: repeat the end token (or leave `<pad>` to `batch`)."""
        if self.after_end == "end" and len(canvas) < self.canvas_length:
            canvas = canvas + [canvas[-1]] * (self.canvas_length - len(canvas))
        return canvas

    def chat_example(self) -> tuple[list[int], list[int]]:
        index = self.rng.randrange(len(self.chapters))
        chapter = self.chapters[index]
        n_prompt, n_reply = self.rng.randint(1, 2), self.rng.randint(1, 5)
        first = self.rng.randrange(0, max(1, len(chapter) - n_prompt))
        prompt_text = " ".join(self.texts[index][first : first + n_prompt])
        prompt = self.tokenizer(prompt_text, add_special_tokens=False).input_ids
        reply = [t for verse in chapter[first + n_prompt : first + n_prompt + n_reply] for t in verse]
        doc = [BOS_ID] + self.user_open + prompt + self.model_open
        reply_start = len(doc)
        doc += reply + [END_OF_TURN_ID]
        n_blocks = -(-(len(doc) - reply_start) // self.canvas_length)
        start = reply_start + self.canvas_length * self.rng.randrange(n_blocks)
        return doc[max(0, start - self.max_prefix) : start], self._fill(doc[start : start + self.canvas_length])

    def batch(self, size: int) -> Batch:
        """Return `size` examples, half raw and half chat on average, left-padded to a common prefix length."""
        examples = [self.raw_example() if self.rng.random() < 0.5 else self.chat_example() for _ in range(size)]
        prefix_len = max(len(p) for p, _ in examples)
        prefix = torch.full((size, prefix_len), PAD_ID, dtype=torch.long)
        mask = torch.zeros((size, prefix_len), dtype=torch.long)
        canvas = torch.full((size, self.canvas_length), PAD_ID, dtype=torch.long)
        for row, (p, c) in enumerate(examples):
            prefix[row, prefix_len - len(p) :] = torch.tensor(p)
            mask[row, prefix_len - len(p) :] = 1
            canvas[row, : len(c)] = torch.tensor(c)
        return Batch(prefix=prefix, prefix_mask=mask, canvas=canvas)

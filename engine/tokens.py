"""Display strings for single tokens, cached per id."""

from __future__ import annotations


class TokenText:
    """Maps a token id to the text it stands for (`tokenizer.decode([id])`, special tokens kept), cached.

    Ids the tokenizer does not know (the model's vocabulary can be larger than the tokenizer's) read `<id:N>`.
    Strings are raw model output: escape them before rendering as HTML.
    """

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._size = len(tokenizer)
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            if 0 <= token_id < self._size:
                text = self._tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            else:
                text = f"<id:{token_id}>"
            self._cache[token_id] = text
        return text

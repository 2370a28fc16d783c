"""Chat prompts whose user text stays text (typed special-token strings never become control tokens),
thinking-mode support, and the thought channel of an answer.
"""

from __future__ import annotations

# Private-use characters: no template or tokenizer gives them a meaning, and a prompt containing them is refused
_PLACEHOLDER = "\ue000diffgemma-user-text\ue001"
CHANNEL_OPEN, CHANNEL_CLOSE = "<|channel>", "<channel|>"


def _messages(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def chat_template_text(tokenizer) -> str:
    """The tokenizer's chat template source ("" when it has none; the default one of several named templates)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = template.get("default", next(iter(template.values()), ""))
    return template if isinstance(template, str) else ""


def supports_thinking(tokenizer) -> bool:
    """Whether the tokenizer's chat template takes `enable_thinking` (Gemma 4 checkpoints)."""
    return "enable_thinking" in chat_template_text(tokenizer)


def chat_prompt_ids(tokenizer, content: str, **template_kwargs) -> list[int]:
    """Ids of `content` as one user turn plus the generation prompt, its special-token strings kept as plain text.

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        content: the user's text (as the template renders it: a template that trims keeps trimming).
        template_kwargs: passed to the template (e.g. `enable_thinking=True`).

    Returns:
        the prompt's token ids (a list, BOS included when the template writes it).

    Raises:
        ValueError: the text holds the private-use characters U+E000/U+E001 around the internal placeholder, or the
            template renders the user text in a way that cannot be told apart from its own markers.
    """
    if _PLACEHOLDER in content:
        raise ValueError("prompt contains a reserved private-use sequence (U+E000 ... U+E001)")
    render = dict(add_generation_prompt=True, tokenize=False, **template_kwargs)
    rendered = tokenizer.apply_chat_template(_messages(content), **render)
    marked = tokenizer.apply_chat_template(_messages(_PLACEHOLDER), **render)
    prefix, found, suffix = marked.partition(_PLACEHOLDER)
    if (not found or _PLACEHOLDER in suffix or len(prefix) + len(suffix) > len(rendered)
            or not rendered.startswith(prefix) or not rendered.endswith(suffix)):
        raise ValueError("this model's chat template changes the user text in a way the playground cannot keep "
                         "apart from its markers; use a raw prompt")
    user = rendered[len(prefix):len(rendered) - len(suffix)]

    def encode(text: str, **kwargs) -> list[int]:
        return tokenizer(text, add_special_tokens=False, **kwargs)["input_ids"] if text else []

    return encode(prefix) + encode(user, split_special_tokens=True) + encode(suffix)


def split_thought(token_ids: list[int], tokenizer) -> tuple[str, str]:
    """(thought, answer) text of generated ids: the thought channel's text and the rest, special tokens skipped.

    The thought channel runs from `<|channel>` to `<channel|>` (or to the end while it is still open); its first
    line names the channel ("thought") and is dropped. Tokenizers without these markers, and answers without a
    channel, give ("", the whole text).
    """
    vocab = tokenizer.get_vocab()
    open_id, close_id = vocab.get(CHANNEL_OPEN), vocab.get(CHANNEL_CLOSE)

    def text(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    if open_id is None or open_id not in token_ids:
        return "", text(token_ids)
    start = token_ids.index(open_id)
    end = token_ids.index(close_id, start) if close_id is not None and close_id in token_ids[start:] else None
    channel = text(token_ids[start + 1:end])
    _, newline, body = channel.partition("\n")
    thought = body if newline else ""
    answer = token_ids[:start] + (token_ids[end + 1:] if end is not None else [])
    return thought.strip(), text(answer)

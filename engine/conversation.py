"""Chat prompts through the chat template, message text kept as plain text (no typed control tokens); thoughts."""

from __future__ import annotations

CHANNEL_OPEN, CHANNEL_CLOSE = "<|channel>", "<channel|>"
ROLES = ("system", "user", "assistant")


def _encode(tokenizer, text: str, **kwargs) -> list[int]:
    return tokenizer(text, add_special_tokens=False, **kwargs)["input_ids"] if text else []


def chat_template_text(tokenizer) -> str:
    """The tokenizer's chat template ("" for none; of several named ones, the default)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = template.get("default", next(iter(template.values()), ""))
    return template if isinstance(template, str) else ""


def supports_thinking(tokenizer) -> bool:
    """Whether the tokenizer's chat template takes `enable_thinking` (Gemma 4 checkpoints)."""
    return "enable_thinking" in chat_template_text(tokenizer)


def check_thinking(tokenizer, thinking: bool, raw: bool = False) -> None:
    """`ValueError` for thinking with a raw prompt or a chat template without a thinking mode."""
    if thinking and (raw or not supports_thinking(tokenizer)):
        raise ValueError("thinking needs a chat prompt and a chat template with a thinking mode (enable_thinking); "
                         + ("this prompt is raw" if raw else "this model's template has none"))


def chat_prompt_ids(tokenizer, content: str, **template_kwargs) -> list[int]:
    """Ids of `content` as one user turn plus the generation prompt (`conversation_ids`)."""
    return conversation_ids(tokenizer, [{"role": "user", "content": content}], **template_kwargs)


def split_thought(token_ids: list[int], tokenizer) -> tuple[str, str]:
    """(thought, answer) of generated ids: the thought is the `<|channel>`...`<channel|>` span, name line dropped."""
    vocab = tokenizer.get_vocab()
    open_id, close_id = vocab.get(CHANNEL_OPEN), vocab.get(CHANNEL_CLOSE)

    def text(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    if open_id not in token_ids:
        return "", text(token_ids)
    start = token_ids.index(open_id)
    end = token_ids.index(close_id, start) if close_id in token_ids[start:] else None
    _, newline, thought = text(token_ids[start + 1:end]).partition("\n")
    answer = token_ids[:start] + (token_ids[end + 1:] if end is not None else [])
    return thought.strip() if newline else "", text(answer)


def _placeholder(index: int) -> str:
    """A marker of private-use characters, which no template or tokenizer gives a meaning."""
    return f"\ue000diffgemma-text-{index}\ue001"


def check_messages(messages) -> list[dict]:
    """`messages` as {"role", "content"} dicts, lone surrogates replaced; `ValueError` for anything else."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("a conversation is a non-empty list of messages")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) - {"role", "content"}:
            raise ValueError(f"message {i} must be a dict with 'role' and 'content' only")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise ValueError(f"message {i} has role {role!r}; allowed: {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"message {i} content must be text, got {type(content).__name__}")
        if "\ue000" in content and "\ue001" in content:
            raise ValueError(f"message {i} contains a reserved private-use sequence (U+E000 ... U+E001)")
        checked.append({"role": role, "content": content.encode("utf-8", errors="replace").decode("utf-8")})
    return checked


def conversation_ids(tokenizer, messages, **template_kwargs) -> list[int]:
    """Ids of `messages` through the chat template, texts as plain text; `ValueError` for bad messages or template."""
    messages = check_messages(messages)
    if not chat_template_text(tokenizer):
        raise ValueError("this model has no chat template: a conversation needs one")
    render = dict(add_generation_prompt=True, tokenize=False, **template_kwargs)
    rendered = tokenizer.apply_chat_template(messages, **render)
    skeleton = tokenizer.apply_chat_template(
        [{"role": m["role"], "content": _placeholder(i)} for i, m in enumerate(messages)], **render)
    parts, rest = [], skeleton
    for i in range(len(messages)):
        before, found, rest = rest.partition(_placeholder(i))
        if not found:
            raise ValueError("this model's chat template drops or repeats message text; the playground cannot keep "
                             "it apart from its markers")
        parts.append(before)
    parts.append(rest)
    for texts in ([m["content"] for m in messages], [m["content"].strip() for m in messages]):
        if "".join(p + t for p, t in zip(parts, texts)) + parts[-1] == rendered:
            break
    else:
        raise ValueError("this model's chat template changes message text in a way the playground cannot keep "
                         "apart from its markers")
    ids: list[int] = []
    for part, text in zip(parts, texts):
        ids += _encode(tokenizer, part) + _encode(tokenizer, text, split_special_tokens=True)
    return ids + _encode(tokenizer, parts[-1])

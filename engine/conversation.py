"""Token ids of a whole conversation through the chat template, every message's text kept as plain text
(the multi-turn form of `engine.prompts.chat_prompt_ids`).
"""

from __future__ import annotations

from .prompts import _PLACEHOLDER, chat_template_text

ROLES = ("system", "user", "assistant")


def _placeholder(index: int) -> str:
    return _PLACEHOLDER.replace("user-text", f"text-{index}")


def check_messages(messages) -> list[dict]:
    """`messages` as a list of {"role", "content"} dicts with string contents and known roles.

    Raises:
        ValueError: not a list, a message that is not a dict, an unknown role (allowed: system, user, assistant), a
            content that is not a string, or a content holding the reserved private-use sequence U+E000 ... U+E001.
    """
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


def conversation_ids(tokenizer, messages, *, add_generation_prompt: bool = True, **template_kwargs) -> list[int]:
    """Ids of `messages` rendered by the tokenizer's chat template, message texts encoded as plain text.

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        messages: [{"role": "system" | "user" | "assistant", "content": str}, ...] (`check_messages`).
        add_generation_prompt: end with the template's opening of a model turn.
        template_kwargs: passed to the template (e.g. `enable_thinking=True`).

    Returns:
        the token ids (a list; BOS included when the template writes it). For one user message they equal
        `engine.prompts.chat_prompt_ids`'s.

    Raises:
        ValueError: bad messages (`check_messages`); no chat template; a template that renders the texts other than
            as they are or trimmed.
    """
    messages = check_messages(messages)
    if not chat_template_text(tokenizer):
        raise ValueError("this model has no chat template: a conversation needs one")
    render = dict(add_generation_prompt=add_generation_prompt, tokenize=False, **template_kwargs)
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

    def encode(text: str, **kwargs) -> list[int]:
        return tokenizer(text, add_special_tokens=False, **kwargs)["input_ids"] if text else []

    ids: list[int] = []
    for part, text in zip(parts, texts):
        ids += encode(part) + encode(text, split_special_tokens=True)
    return ids + encode(parts[-1])

"""Prompt rendering: the model's chat template when it has one, else the raw text."""

from __future__ import annotations

from typing import Any


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a single-turn user prompt ready for generation."""
    if getattr(tokenizer, "chat_template", None):
        return encode_messages(tokenizer, [{"role": "user", "content": text}])
    return list(tokenizer(text)["input_ids"])


def encode_messages(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Token ids of a conversation rendered by the chat template, ready for generation."""
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])

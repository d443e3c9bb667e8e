"""Prompt rendering: the model's chat template when it has one, else the raw text."""

from __future__ import annotations

from typing import Any


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a single-turn user prompt ready for generation."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])

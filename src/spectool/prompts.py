"""Prompt rendering as the RL run renders it: the conversation (every turn the data gave, system turns included, or
a text as one user turn), a system turn put first (--system-prompt), through the model's chat template with its
extra keyword arguments (--chat-template-kwargs, TRL's `chat_template_kwargs`: e.g. Qwen3's enable_thinking).
The ids are what `tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)`
returns, as TRL's GRPOTrainer renders a conversational prompt (trl/trainer/grpo_trainer.py). A model without a chat
template takes a text prompt as it is.

TRL renders by the dataset's format (GRPOTrainer._tokenize_prompts, TRL 1.16): a conversational prompt (a list of
messages) through the chat template, a standard-format prompt (a text) raw: `tokenizer(text)`, with the special tokens
the tokenizer adds (a Llama-style BOS), no template, no turns. spectool's own RL runs (train-rl, both backends) give
every prompt as a conversation, so a text is one user turn by default; `--text-prompts raw` renders text prompts as
TRL does a standard-format dataset's, for a draft that serves a TRL run on one (conversations keep the template)."""

from __future__ import annotations

import json
from typing import Any

from spectool.errors import SpectoolError

SYSTEM_FLAG = "--system-prompt"
KWARGS_FLAG = "--chat-template-kwargs"
TEXT_FLAG = "--text-prompts"
# how a text prompt is rendered (a command's `text_prompts`; unset: the chat template, as every earlier run did), and the
# words a run's log and manifest say it in
TEXT_RENDERINGS = {"chat-template": "chat template", "raw": "raw text, as TRL tokenizes standard-format prompts"}
CHAT_TEMPLATE, RAW_TEXT = TEXT_RENDERINGS.values()
# apply_chat_template's own parameters (transformers 5): spectool sets them, a template kwarg of that name would clash
OWN_PARAMETERS = ("conversation", "tools", "documents", "chat_template", "add_generation_prompt",
                  "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
                  "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")


def template_kwargs(value: dict | str | None, flag: str = KWARGS_FLAG) -> dict:
    """The chat template's extra keyword arguments from a mapping or its JSON text (None: none); errors name `flag`."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise SpectoolError(f"{flag}={value!r}: not valid JSON ({e.msg}); give a JSON object of the chat "
                                "template's keyword arguments, e.g. '{\"enable_thinking\": false}'") from None
    if not isinstance(value, dict):
        raise SpectoolError(f"{flag}={value!r}: must be a JSON object (a mapping of the chat template's keyword "
                            "arguments), e.g. '{\"enable_thinking\": false}'")
    clash = sorted(set(value) & set(OWN_PARAMETERS))
    if clash:
        raise SpectoolError(f"{flag}: {', '.join(clash)} {'is' if len(clash) == 1 else 'are'} apply_chat_template's own "
                            "argument, set by spectool (a prompt ready for generation); drop it")
    return value


def text_prompts(value: str | None, flag: str = TEXT_FLAG) -> str:
    """The text prompts' rendering, "chat-template" (the default: None) or "raw"; errors name `flag`."""
    if value is None:
        return "chat-template"
    if value not in TEXT_RENDERINGS:
        raise SpectoolError(f"{flag}={value!r}: must be one of {', '.join(TEXT_RENDERINGS)} (chat-template: a text is "
                            "one user turn through the chat template; raw: the text's own tokens, as TRL tokenizes a "
                            "standard-format prompt)")
    return value


def check_system_prompt(value: str | None, flag: str = SYSTEM_FLAG) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise SpectoolError(f"{flag}={value!r}: must be a non-empty text (or unset: no system turn added)")


def conversation(prompt: str | list[dict], system_prompt: str | None = None, flag: str = SYSTEM_FLAG) -> list[dict]:
    """The messages rendered: `prompt` (a text is one user turn), with `system_prompt` put first. Data that has a
    system turn of its own is refused with a system prompt: which of the two the RL run uses is the user's call."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if system_prompt is None:
        return messages
    own = next((m["content"] for m in messages if m["role"] == "system"), None)
    if own is not None:
        raise SpectoolError(f"{flag} is refused: the data's prompts have a system turn of their own ({own[:60]!r}); "
                            f"drop {flag} to keep theirs, or take the system turns out of the data to use {flag}")
    return [{"role": "system", "content": system_prompt}, *messages]


def encode_prompt(tokenizer: Any, prompt: str | list[dict], system_prompt: str | None = None,
                  chat_template_kwargs: dict | str | None = None, text: str | None = None) -> list[int]:
    """Token ids of a prompt (a text or a conversation) ready for generation, rendered as the RL run renders it
    (`text`: a text prompt's rendering, text_prompts())."""
    if isinstance(prompt, str) and text_prompts(text) == "raw":
        # TRL 1.16 on a standard-format prompt: processing_class(text=prompts)["input_ids"], special tokens included
        return list(tokenizer(prompt)["input_ids"])
    messages = conversation(prompt, system_prompt)
    kwargs = template_kwargs(chat_template_kwargs)
    if not getattr(tokenizer, "chat_template", None):
        if len(messages) == 1 and messages[0]["role"] == "user" and not kwargs:
            return list(tokenizer(messages[0]["content"])["input_ids"])
        what = f"{KWARGS_FLAG}" if kwargs else f"a conversation (several turns, a system turn or {SYSTEM_FLAG})"
        raise SpectoolError(f"the model's tokenizer has no chat template, so {what} cannot be rendered: give "
                            "plain-text prompts, or a model whose tokenizer has a chat template")
    # rendered, then tokenized without special tokens: apply_chat_template(tokenize=True)'s own two steps
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def encode_tasks(tokenizer: Any, tasks: list, settings: Any = None) -> list[list[int]]:
    """Every task's prompt ids as a command renders them. `settings`: the command's config (its `system_prompt` and
    `chat_template_kwargs`: every prompt-rendering command's dataclass, rl.yaml's rollout section; `text_prompts`:
    harvest's); None: neither."""
    system, kwargs = (getattr(settings, "system_prompt", None), getattr(settings, "chat_template_kwargs", None))
    kwargs = template_kwargs(kwargs)  # parsed once
    text = text_prompts(getattr(settings, "text_prompts", None))
    return [encode_prompt(tokenizer, _prompt(t, text), system, kwargs, text) for t in tasks]


def _prompt(task: Any, text: str) -> str | list[dict]:
    """What a task gives to render: its text where text prompts render raw and the data gave a text (a one-turn
    conversation is the same task as its text, but TRL renders it as a conversation), else its messages."""
    return task.prompt if text == "raw" and not getattr(task, "conversational", True) else task.messages


def rendering(settings: Any) -> dict:
    """The rendering settings as a manifest records them (`text_prompts` only where text prompts render raw: every
    other run's, earlier ones included, went through the chat template)."""
    text = text_prompts(getattr(settings, "text_prompts", None))
    return {"system_prompt": getattr(settings, "system_prompt", None),
            "chat_template_kwargs": template_kwargs(getattr(settings, "chat_template_kwargs", None)),
            **({"text_prompts": text} if text == "raw" else {})}


def text_rendering(recorded: dict | None) -> str:
    """How a run rendered its text prompts, in words (CHAT_TEMPLATE or RAW_TEXT), from the `rendering` its manifest
    records."""
    return TEXT_RENDERINGS[text_prompts((recorded or {}).get("text_prompts"))]


def encode_messages(tokenizer: Any, messages: list[dict], chat_template_kwargs: dict | str | None = None) -> list[int]:
    """Token ids of a conversation rendered by the chat template, ready for generation."""
    return encode_prompt(tokenizer, messages, None, chat_template_kwargs)


def check_rendering(settings: Any, system_flag: str = SYSTEM_FLAG, kwargs_flag: str = KWARGS_FLAG) -> None:
    """Refuse a command's bad system prompt, chat template kwargs or text rendering before anything starts, naming the
    flag."""
    check_system_prompt(getattr(settings, "system_prompt", None), system_flag)
    template_kwargs(getattr(settings, "chat_template_kwargs", None), kwargs_flag)
    if text_prompts(getattr(settings, "text_prompts", None)) == "raw" and getattr(settings, "system_prompt", None):
        raise SpectoolError(f"{system_flag} with {TEXT_FLAG} raw: a raw text prompt has no turns to put a system turn "
                            f"before (TRL's standard format has none); drop one of them")


def check_conversations(tasks: list, settings: Any) -> None:
    """Refuse, before any engine starts, a system prompt over data whose prompts have a system turn of their own."""
    system = getattr(settings, "system_prompt", None)
    if system is not None:
        for t in tasks:
            conversation(t.messages, system)

"""The policy and its data: which model is run, on which prompts, rendered how.

`PolicyData` is taken by every entry point that reads a data source (the commands, rl.yaml's top level);
`Rendering` by every one that renders a prompt (the commands, export's check, rl.yaml's rollout section); `Split` by
the commands that read either half of the data.
"""

from __future__ import annotations

from dataclasses import dataclass

from spectool.constants import DEFAULT_DATA, DEFAULT_MODEL
from spectool.errors import check
from spectool.prompts import check_rendering
from spectool.settings.spelling import Spell, flag

SPLITS = ("train", "eval")


@dataclass(kw_only=True)
class Rendering:
    """How a prompt becomes the policy's tokens."""

    system_prompt: str | None = None
    """A system turn put first in every prompt, as the RL run's prompts have it (refused with data whose prompts have
    a system turn of their own)."""
    chat_template_kwargs: dict | None = None
    """Extra keyword arguments to the chat template, a JSON object (TRL's chat_template_kwargs), e.g.
    '{"enable_thinking": false}' for Qwen3."""

    def validate(self, spell: Spell = flag) -> None:
        check_rendering(self, spell("system_prompt"), spell("chat_template_kwargs"))


@dataclass(kw_only=True)
class PolicyData:
    """The policy and the data source its prompts come from."""

    model: str = DEFAULT_MODEL
    """Policy: local HF folder, hub id, or 'smollm2-135m' (embedded)."""
    data: str = DEFAULT_DATA
    """dapo | gym:<task>[:k=v,...] | hub:ORG/NAME[:split=S,config=C] (a hub dataset) | file.jsonl/.parquet | chat
    (general prompts)."""
    prompt_col: str = "prompt"
    """Prompt column of a file or hub source (a text, or a conversation: a list of messages)."""
    answer_col: str = "answer"
    """Answer column of a file or hub source (a hub source's may be a nested field: a.b)."""

    def validate(self, spell: Spell = flag) -> None:
        for name in ("prompt_col", "answer_col"):
            value = getattr(self, name)
            check(isinstance(value, str) and bool(value.strip()), spell(name), value, "must be a column name of the data")


@dataclass(kw_only=True)
class Split:
    """Which of the data's two deterministic, never overlapping halves the prompts come from."""

    split: str = "eval"
    """train | eval (held-out prompts)."""

    def validate(self, spell: Spell = flag) -> None:
        check(self.split in SPLITS, spell("split"), self.split, f"must be one of {' | '.join(SPLITS)}")

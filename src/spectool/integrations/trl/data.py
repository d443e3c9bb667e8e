"""A spectool data source as TRL's GRPOTrainer takes it."""

from __future__ import annotations

from typing import Any

from spectool.data import load_source
from spectool.errors import SpectoolError
from spectool.prompts import check_system_prompt, conversation


def task_data(data: str, n: int, seed: int = 0, split: str = "train", system_prompt: str | None = None,
              prompt_col: str = "prompt", answer_col: str = "answer"):
    """A spectool data source as TRL wants it: a `datasets.Dataset` of conversational prompts (every turn the data
    gives, `system_prompt` put first; a `task_id` column) and a reward function scoring completions with the source's
    own verifier. A file or hub source is read by its `prompt_col` and `answer_col`. TRL renders them with
    GRPOConfig's chat_template_kwargs, as spectool's commands do theirs."""
    from datasets import Dataset  # noqa: PLC0415 (heavy, loaded only on this path)

    check_system_prompt(system_prompt, "system_prompt")
    source = load_source(data, seed=seed, prompt_col=prompt_col, answer_col=answer_col)
    if not source.verifiable:
        raise SpectoolError(f"data {data} has no verifier: GRPO needs rewards (use gym:..., or a file or "
                            "hub source with answers: answer_col names their column)")
    tasks = {t.id: t for t in source.tasks(split, n)}
    ds = Dataset.from_list([{"prompt": conversation(t.messages, system_prompt, "system_prompt"), "task_id": t.id}
                            for t in tasks.values()])

    def spectool_reward(prompts, completions, task_id, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [source.score(tasks[i], text) for i, text in zip(task_id, texts)]

    return ds, spectool_reward

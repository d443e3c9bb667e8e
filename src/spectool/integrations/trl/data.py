"""A spectool data source as TRL's GRPOTrainer takes it."""

from __future__ import annotations

from typing import Any

from spectool.data import load_source
from spectool.errors import SpectoolError


def task_data(data: str, n: int, seed: int = 0, split: str = "train"):
    """A spectool data source as TRL wants it: a `datasets.Dataset` of chat prompts (with a
    `task_id` column) and a reward function scoring completions with the source's own verifier."""
    from datasets import Dataset  # noqa: PLC0415 (heavy, loaded only on this path)

    source = load_source(data, seed=seed)
    if not source.verifiable:
        raise SpectoolError(f"data {data} has no verifier: GRPO needs rewards (use gym:... or a file with answers)")
    tasks = {t.id: t for t in source.tasks(split, n)}
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": t.prompt}], "task_id": t.id} for t in tasks.values()])

    def spectool_reward(prompts, completions, task_id, **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [source.score(tasks[i], text) for i, text in zip(task_id, texts)]

    return ds, spectool_reward

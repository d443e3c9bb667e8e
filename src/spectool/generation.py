"""Scored rollouts: generate completions for tasks on a running engine and score them with the data
source's verifier (rollout, harvest)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from spectool.data import Task, TaskSource
from spectool.engine.engine import Sampling
from spectool.prompts import encode_tasks
from spectool.settings.sampling import SamplingConfig


def rollout_tasks(engine, tokenizer, source: TaskSource, tasks: list[Task], s: SamplingConfig, settings: Any = None,
                  progress: Callable[[int], None] | None = None):
    """Generate `s.samples` completions per task and score them; the prompts rendered as `settings` (the command's
    config: its system_prompt and chat_template_kwargs, prompts.encode_tasks) say, their ids recorded in each row.

    Returns (rows, acceptance deltas, generated tokens, generation seconds).
    """

    prompts = encode_tasks(tokenizer, tasks, settings)
    t0 = time.perf_counter()
    outs, stats = engine.generate(
        prompts, Sampling(n=s.samples, max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, seed=s.seed),
        progress=progress,  # Engine.generate's: tokens so far, every few seconds
    )
    seconds = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    for task, samples in zip(tasks, outs):
        for j, c in enumerate(samples):
            rows.append(
                dict(
                    prompt_id=task.id, sample_idx=j, prompt=task.prompt, answer=task.answer or "",
                    prompt_ids=c.prompt_ids, response_ids=c.response_ids, logprobs=c.logprobs,
                    reward=source.score(task, c.text), finish_reason=c.finish_reason, response=c.text,
                )
            )
    n_tokens = sum(len(r["response_ids"]) for r in rows)
    return rows, stats, n_tokens, seconds

"""A spectool data source as TRL's GRPOTrainer takes it, and which rendering TRL gives a dataset's prompts."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from spectool.constants import OWN_MTP as MTP
from spectool.data import load_source
from spectool.errors import SpectoolError
from spectool.prompts import CHAT_TEMPLATE, RAW_TEXT, check_system_prompt, conversation, text_rendering
from spectool.runs import MANIFEST, read_json

log = logging.getLogger(__name__)


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


def dataset_rendering(dataset) -> str | None:
    """How TRL 1.16 renders a train dataset's prompts: CHAT_TEMPLATE for conversational ones, RAW_TEXT for
    standard-format (text) ones, decided as GRPOTrainer._tokenize_prompts decides it (trl.data_utils.is_conversational
    of a batch's first prompt); None without a `prompt` column to read."""
    from trl.data_utils import is_conversational  # noqa: PLC0415 (TRL is the optional spectool[trl])

    if dataset is None or "prompt" not in (getattr(dataset, "column_names", None) or []):
        return None
    first = next(iter(dataset), None)
    return None if first is None else CHAT_TEMPLATE if is_conversational({"prompt": first["prompt"]}) else RAW_TEXT


def draft_rendering(draft: Path) -> str | None:
    """How the harvest a draft folder was trained on rendered its text prompts (CHAT_TEMPLATE or RAW_TEXT), from the
    folder's manifest (init-draft's `rendering`, an export's `training_data.rendering`); None where it records none."""
    m = read_json(draft / MANIFEST) if (draft / MANIFEST).exists() else {}
    recorded = (m.get("training_data") or {}).get("rendering") if m.get("kind") == "export" else m.get("rendering")
    return None if recorded is None else text_rendering(recorded)


def prompt_rendering(draft: str | None, dataset, tokenizer) -> str | None:
    """The rendering TRL gives this run's prompts (dataset_rendering), logged; a warning where the draft's harvest
    rendered its text prompts the other way (the draft then proposes for other ids than the run samples from).
    `tokenizer`: TRL's processing_class (without a chat template both renderings are the text's own tokens)."""
    used = dataset_rendering(dataset)
    if used is None:
        return None
    log.info("spectool in TRL: the prompts are rendered as TRL renders this dataset's: %s", used)
    trained = draft_rendering(Path(draft)) if draft and draft != MTP else None
    if trained is None or trained == used or not getattr(tokenizer, "chat_template", None):
        return used
    if used == RAW_TEXT:
        what, fix = ("standard-format (text) prompts, which TRL tokenizes raw, without the chat template",
                     "`spectool harvest --text-prompts raw` (TRL's rendering of a text prompt), or give TRL "
                     "conversational prompts ([{\"role\": \"user\", \"content\": text}]), which it renders through "
                     "the chat template as the draft's harvest did")
    else:
        what, fix = ("conversational prompts, which TRL renders through the chat template",
                     "`spectool harvest` without --text-prompts raw (text prompts through the chat template), or give "
                     "TRL standard-format (text) prompts, which it tokenizes raw as the draft's harvest did")
    log.warning("spectool in TRL: the draft %s was trained on a harvest that rendered its text prompts as %s, and this "
                "dataset has %s: the draft proposes for other token ids than the run samples from (lower acceptance "
                "until refreshes catch up). Train the draft on a harvest made with %s", draft, trained, what, fix)
    return used

"""Prompts as TRL renders them (issue 68, item 8): TRL 1.16's GRPOTrainer tokenizes a standard-format (text) prompt raw
and renders a conversational one through the chat template. spectool's ids are held against TRL's own tokenization
(GRPOTrainer._tokenize_prompts, TRL's code from the installed package) on the same rows: harvest's with
--text-prompts raw for each format, the TRL length check's, and the rendering a TRL run says it used."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from spectool.errors import SpectoolError

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs spectool[trl]"),
              pytest.mark.usefixtures("environment_restored")]  # TRL sets process-wide variables

TEXTS = ["What is 2 + 3?", "What is 7 + 8? Think it through, then give the answer.", "What is 1 + 1?",
         "What is 4 + 9?", "What is 6 + 6?", "What is 9 + 9?", "What is 3 + 5?", "What is 2 + 2?"]
CHATS = [[{"role": "user", "content": TEXTS[0]}],  # one user turn: TRL renders it through the template
         [{"role": "system", "content": "Reason step by step."}, {"role": "user", "content": TEXTS[1]}],
         *([{"role": "user", "content": t}] for t in TEXTS[2:])]



def trl_tokenize_prompts():
    """TRL's own GRPOTrainer._tokenize_prompts, compiled from the installed trl/trainer/grpo_trainer.py with the
    module's own imports of the names it uses (importing that module whole starts vLLM's import: 10 s)."""
    import ast

    path = Path(importlib.util.find_spec("trl").submodule_search_locations[0]) / "trainer" / "grpo_trainer.py"
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GRPOTrainer")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_tokenize_prompts")
    used = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
               and {(a.asname or a.name).split(".")[0] for a in n.names} & used]
    namespace = {"__package__": "trl.trainer", "__name__": "trl.trainer.grpo_trainer"}
    exec(compile(ast.Module(body=[*imports, fn], type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace["_tokenize_prompts"]


def trl_ids(tokenizer, prompts: list, chat_template_kwargs: dict | None = None) -> list[list[int]]:
    """The prompt ids TRL 1.16's GRPOTrainer generates from (a trainer as _tokenize_prompts reads it: no tools, no
    environments, not a vision model, GRPOConfig.chat_template_kwargs)."""
    import sys

    trainer = SimpleNamespace(processing_class=tokenizer, _is_vlm=False, environment_factories=None, tools=None,
                              chat_template=None, chat_template_kwargs=chat_template_kwargs or {})
    loaded = sys.modules.get("trl.trainer.grpo_trainer")  # imported already (a trainer was built): the method itself
    tokenize = loaded.GRPOTrainer._tokenize_prompts if loaded else trl_tokenize_prompts()
    ids, _, _ = tokenize(trainer, prompts)
    return [list(x) for x in ids]


def _file(tmp_path, name: str, prompts: list) -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps({"prompt": p, "answer": "0"}) + "\n" for p in prompts))
    return str(path)


def _tasks(data: str) -> list:
    from spectool.data import load_source

    tasks = load_source(data).tasks("train", 100)
    try:  # the rows that hash into the held-out split, where any does
        return tasks + load_source(data).tasks("eval", 100)
    except SpectoolError:
        return tasks


def _as_given(task, standard: bool):
    """A task's dataset cell as the file held it (a text, or the conversation, one user turn included)."""
    return task.prompt if standard else task.messages


def test_harvest_with_raw_text_prompts_gets_trls_ids_for_both_formats(bos_tokenizer, tmp_path):
    """A Llama-style tokenizer (its encoding adds BOS, its template writes one): TRL tokenizes a standard-format
    prompt raw, BOS included, and a conversation through the template. harvest's ids with --text-prompts raw are
    TRL's for either format, every row; by default a text is one user turn through the template (spectool's own RL
    runs give every prompt as a conversation), which is TRL's rendering of conversations only."""
    from spectool.harvesting import HarvestConfig
    from spectool.prompts import encode_tasks

    raw = HarvestConfig(out="x", text_prompts="raw")
    raw.validate()
    tok = bos_tokenizer
    for name, prompts, standard in (("standard.jsonl", TEXTS, True), ("chat.jsonl", CHATS, False)):
        tasks = _tasks(_file(tmp_path, name, prompts))
        assert len(tasks) == len(prompts)
        trl = trl_ids(tok, [_as_given(t, standard) for t in tasks])
        assert encode_tasks(tok, tasks, raw) == trl, name
        default = encode_tasks(tok, tasks, HarvestConfig(out="x"))
        assert (default == trl) == (not standard), name
    text = trl_ids(tok, ["What is 2 + 3?"])[0]
    assert text[0] == tok.bos_token_id and text.count(tok.bos_token_id) == 1  # raw, with the tokenizer's own BOS
    assert tok.decode(text) == "<s>What is 2 + 3?"


def test_the_engine_gets_trls_ids_and_the_manifest_says_raw(bos_tokenizer, tmp_path):
    """generation.rollout_tasks (harvest's path to the engine) with --text-prompts raw: the engine is given TRL's ids,
    each record keeps them, and the rendering a manifest records says raw."""
    from spectool.data import load_source
    from spectool.engine.engine import Completion
    from spectool.generation import rollout_tasks
    from spectool.harvesting import HarvestConfig
    from spectool.prompts import RAW_TEXT, rendering, text_rendering
    from spectool.stats import AcceptanceStats

    class Engine:
        def generate(self, prompts, sampling, **_):
            self.prompts = prompts
            return [[Completion(list(p), [5], [0.0], "stop", "5")] for p in prompts], AcceptanceStats()

    source = load_source(_file(tmp_path, "standard.jsonl", TEXTS))
    tasks = source.tasks("train", 4)
    cfg = HarvestConfig(out="x", text_prompts="raw")
    engine = Engine()
    rows, *_ = rollout_tasks(engine, bos_tokenizer, source, tasks, cfg.sampling, cfg)
    want = trl_ids(bos_tokenizer, [t.prompt for t in tasks])
    assert engine.prompts == want and [r["prompt_ids"] for r in rows] == want
    assert rendering(cfg) == {"system_prompt": None, "chat_template_kwargs": {}, "text_prompts": "raw"}
    assert text_rendering(rendering(cfg)) == RAW_TEXT
    assert "text_prompts" not in rendering(HarvestConfig(out="x"))  # the default: as every earlier manifest


def test_text_prompts_settings_are_checked_naming_the_flag():
    from spectool.harvesting import HarvestConfig

    with pytest.raises(SpectoolError, match=r"--text-prompts='tokens': must be one of chat-template, raw"):
        HarvestConfig(out="x", text_prompts="tokens").validate()
    with pytest.raises(SpectoolError, match=r"--system-prompt with --text-prompts raw"):
        HarvestConfig(out="x", text_prompts="raw", system_prompt="Be brief.").validate()
    HarvestConfig(out="x", text_prompts="chat-template").validate()


def test_trls_length_check_counts_prompts_as_trl_tokenizes_them(bos_tokenizer, tiny_policy):
    """The TRL pre-flight's longest prompt (preflight.check_lengths, named in its refusal) is the longest of TRL's own
    ids for the same rows, standard-format and conversational."""
    from datasets import Dataset

    from spectool.integrations.trl import SpectoolSpeculation
    from spectool.integrations.trl.preflight import check_lengths

    args = SimpleNamespace(max_completion_length=2000, vllm_max_model_length=None, chat_template_kwargs=None)
    for prompts in (TEXTS, CHATS):
        ds = Dataset.from_list([{"prompt": p} for p in prompts])
        longest = max(map(len, trl_ids(bos_tokenizer, list(ds["prompt"]))))
        with pytest.raises(SpectoolError, match=r"the longest prompt, (\d+) tokens") as refused:
            check_lengths(SpectoolSpeculation(None), str(tiny_policy), args,
                          trainer_kwargs={"train_dataset": ds, "processing_class": bos_tokenizer})
        assert int(re.search(r"the longest prompt, (\d+) tokens", str(refused.value))[1]) == longest


def _draft(tmp_path, name: str, manifest: dict | None) -> str:
    folder = tmp_path / name
    folder.mkdir()
    if manifest is not None:
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return str(folder)


def test_a_trl_run_says_which_rendering_it_used_and_warns_of_a_draft_harvested_otherwise(bos_tokenizer, tmp_path,
                                                                                          caplog):
    """TRL's rendering of the dataset (GRPOTrainer's own decision) is logged and kept (trainer.spectool.rendering);
    a draft whose harvest rendered its text prompts the other way is warned of, naming the harvest setting."""
    from datasets import Dataset

    from spectool.integrations.trl.data import dataset_rendering, draft_rendering, prompt_rendering
    from spectool.prompts import CHAT_TEMPLATE, RAW_TEXT

    standard = Dataset.from_list([{"prompt": t} for t in TEXTS])
    chat = Dataset.from_list([{"prompt": c} for c in CHATS])
    assert (dataset_rendering(standard), dataset_rendering(chat)) == (RAW_TEXT, CHAT_TEMPLATE)
    assert dataset_rendering(Dataset.from_list([{"question": "q"}])) is None
    templated = _draft(tmp_path, "templated", {"kind": "draft", "rendering": {"system_prompt": None}})
    raw = _draft(tmp_path, "raw", {"kind": "draft", "rendering": {"text_prompts": "raw"}})
    export = _draft(tmp_path, "export", {"kind": "export", "rendering": {},
                                         "training_data": {"rendering": {"text_prompts": "raw"}}})
    unknown = _draft(tmp_path, "unknown", None)
    assert [draft_rendering(Path(d)) for d in (templated, raw, export, unknown)] == [CHAT_TEMPLATE, RAW_TEXT, RAW_TEXT,
                                                                                      None]
    plain = SimpleNamespace(chat_template=None)  # no template: spectool's harvest tokenized the text raw too
    cases = [(templated, standard, bos_tokenizer, True), (raw, chat, bos_tokenizer, True),
             (raw, standard, bos_tokenizer, False), (export, standard, bos_tokenizer, False),
             (templated, chat, bos_tokenizer, False), (unknown, standard, bos_tokenizer, False),
             (None, standard, bos_tokenizer, False), (templated, standard, plain, False)]
    for draft, ds, tok, warned in cases:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="spectool"):
            used = prompt_rendering(draft, ds, tok)
        assert used == dataset_rendering(ds)
        assert f"rendered as TRL renders this dataset's: {used}" in caplog.text
        warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert bool(warning) == warned, (draft, warning)
        if warned and ds is standard:
            assert "--text-prompts raw" in warning[0] and "standard-format" in warning[0]

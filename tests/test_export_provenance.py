"""One reading of a draft folder's provenance (export_card.training_data): export picks its check prompts, the
rendering and the card's training data from an init-draft folder's manifest and from an export's alike, so an
export re-exported (pushed, or written for another target) is checked on its own training data, not on `chat`."""

from __future__ import annotations

import json

from spectool.commands.export import draft_data, draft_rendering
from spectool.commands.export_card import training_data
from spectool.config.export import ExportConfig

RENDERING = {"system_prompt": "Think step by step.", "chat_template_kwargs": {"enable_thinking": False}}


def _folder(path, manifest: dict):
    path.mkdir()
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def test_an_export_is_checked_on_its_drafts_training_data_as_the_draft_is(tmp_path):
    harvest = _folder(tmp_path / "harvest", {"kind": "harvest"})
    (harvest / "config.json").write_text(json.dumps({"split": "train", "prompt_col": "question", "answer_col": "solution",
                                                     "sampling": {"n_prompts": 64, "samples": 4, "max_tokens": 128}}))
    draft = _folder(tmp_path / "draft", {"kind": "draft", "harvest": str(harvest), "harvest_data": "gym:chain_sum",
                                         "rendering": RENDERING, "records": 256, "train_records": 240,
                                         "eval_records": 16})
    provenance = training_data(draft)
    assert provenance["harvest_data"] == "gym:chain_sum" and provenance["harvest"]["prompt_col"] == "question"
    # what export writes (export.run): its own settings at the top level, the draft's provenance under training_data
    export = _folder(tmp_path / "export", {"kind": "export", "source": str(draft), "format": "vllm", "k": 3,
                                           "rendering": {"system_prompt": None, "chat_template_kwargs": {}},
                                           "training_data": provenance})
    assert training_data(export) == provenance
    for folder in (draft, export):
        assert draft_data(folder) == "gym:chain_sum", folder.name  # not None, which export reads as "chat"
        cfg = draft_rendering(folder, ExportConfig(draft=str(folder), out=str(tmp_path / "x")))
        assert (cfg.system_prompt, cfg.chat_template_kwargs) == ("Think step by step.", {"enable_thinking": False})

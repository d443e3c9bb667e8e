"""Drafts and policies are identified by what the engine needs (shapes and the token map), not by
file bytes; every draft folder spectool writes, exports included, carries that metadata."""

from __future__ import annotations

import json
import shutil

import pytest

from spectool.draft.checkpoint import check_draft
from spectool.errors import SpectoolError
from spectool.models import resolve_model


def _reconverted(src, dst):
    """The same model as another transformers version writes it: other bytes, same content."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["transformers_version"] = "4.0.0-other"
    (dst / "config.json").write_text(json.dumps(cfg, indent=4, sort_keys=False))
    tj = json.loads((dst / "tokenizer.json").read_text())
    (dst / "tokenizer.json").write_text(json.dumps(tj, indent=1))
    return dst


def test_same_model_converted_twice_has_one_identity(tiny_policy, tmp_path):
    a, b = resolve_model(str(tiny_policy)), resolve_model(str(_reconverted(tiny_policy, tmp_path / "again")))
    assert (tmp_path / "again" / "config.json").read_bytes() != (tiny_policy / "config.json").read_bytes()
    assert a.fingerprint == b.fingerprint and a.identity == b.identity


def test_other_hidden_size_or_vocabulary_fails_naming_the_field(tiny_policy, random_draft, tmp_path):
    from conftest import make_policy

    wide = resolve_model(str(make_policy(tmp_path / "wide", hidden=256)))
    with pytest.raises(SpectoolError, match=r"hidden_size: 128 vs 256 \(draft's policy vs this one\)"):
        check_draft(str(random_draft), wide, 1)
    other_vocab = _reconverted(tiny_policy, tmp_path / "vocab")
    tj = json.loads((other_vocab / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    a, b = list(vocab)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # same size, two ids swapped
    (other_vocab / "tokenizer.json").write_text(json.dumps(tj))
    swapped = resolve_model(str(other_vocab))
    with pytest.raises(SpectoolError, match=r"tokenizer_vocab_sha: '[0-9a-f]+' vs '[0-9a-f]+'"):
        check_draft(str(random_draft), swapped, 1)
    check_draft(str(random_draft), resolve_model(str(_reconverted(tiny_policy, tmp_path / "same"))), 3)


def test_an_export_keeps_the_draft_checks(tiny_policy, random_draft, tmp_path):
    from spectool.commands.export import ExportConfig, run

    model = resolve_model(str(tiny_policy))
    for fmt in ("vllm", "speculators"):
        out = tmp_path / f"export-{fmt}"
        run(ExportConfig(draft=str(random_draft), out=str(out), format=fmt, model=str(tiny_policy), k=3, verify=False))
        meta = json.loads((out / "draft.json").read_text())
        assert meta["ttt_steps"] == 3 and meta["policy_fingerprint"] == model.fingerprint
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["kind"] == "export" and "schema_version" in manifest and "spectool_version" in manifest
        with pytest.raises(SpectoolError, match="--k 9 exceeds the 3 positions"):
            check_draft(str(out), model, 9)
    verifier = json.loads((tmp_path / "export-speculators" / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier["name_or_path"] == tiny_policy.name  # no machine path

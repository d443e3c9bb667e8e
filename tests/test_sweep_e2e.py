"""sweep-k on the real engine (tiny policy, untrained draft) and rollout --k auto with vLLM's
per-batch-size speculation, through the CLI."""

from __future__ import annotations

import json

import pytest

from clirun import spectool

pytestmark = pytest.mark.e2e
DATA = "gym:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1"


def test_tiny_sweep_and_auto_k_rollout(tiny_policy, random_draft, tmp_path):
    out = tmp_path / "sweep"
    args = ["sweep-k", "--model", str(tiny_policy), "--draft", str(random_draft), "--data", DATA, "--out", str(out),
            "--min-seconds", "0",
            "--k", "2", "--batch-sizes", "1,4", "--methods", "eagle3,ngram", "--max-tokens", "12", "--min-seqs", "2",
            "--repeats", "2"]
    r = spectool(*args)
    assert "batch 1: recommend" in r.stdout and "batch 4: recommend" in r.stdout
    progress = [line for line in r.stderr.splitlines() if "tokens/s" in line]  # live, per arm and batch size
    # two rounds of three engines (the second in reverse order), two batch sizes each
    assert len(progress) == 12 and all("batch 1:" in p or "batch 4:" in p for p in progress), r.stderr[-2000:]
    assert "6 engine runs to go (2 rounds of 3 engines): at least 0.0 min" in r.stderr and "round 2/2, plain decoding" in r.stderr
    assert r.stderr.index("round 2/2, ngram k=2") < r.stderr.index("round 2/2, plain decoding")
    s = json.loads((out / "sweep.json").read_text())
    arms = {(x["method"], x["k"], x["batch"]) for x in s["rows"]}
    assert arms == {(m, k, b) for m, k in [("none", 0), ("eagle3", 2), ("ngram", 2)] for b in (1, 4)}
    for x in s["rows"]:
        if x["method"] == "none":
            assert x["speedup"] == pytest.approx(1.0) and x["drift"] > 0 and len(x["waves"]) >= 8  # two rounds pooled
        else:
            assert len(x["waves"]) >= 8 and x["speedup_lo"] <= x["speedup"] <= x["speedup_hi"] and x["rounds"] == 2
        if x["method"] != "none" and x["mean_acceptance_length"]:  # (ngram may find nothing to propose on random text)
            assert x["speedup"] > 0 and x["ceiling"] >= x["speedup"] - 1e-9
        if x["method"] == "eagle3":
            assert len(x["per_position"]) == x["k"] and 1.0 <= x["mean_acceptance_length"] <= x["k"] + 1
    assert "speedup_lo" in (out / "sweep.csv").read_text().splitlines()[0]
    for rec in s["recommendation"].values():  # speculation recommended only beyond its bound, else said why not
        assert rec["method"] != "none" and rec["interval"][0] >= 1.03 or rec["method"] == "none" and rec["why"]
    for f in ("sweep.csv", "speedup_vs_k.png", "acceptance_by_position.png", "manifest.json", "rows.jsonl"):
        assert (out / f).stat().st_size > 0
    assert s["eagle3_schedule"][0][0] == 1

    # A rerun finds every arm measured and only re-renders (resume).
    r = spectool(*args)
    # (not "plain decoding" absent: the rendered contention note may name that arm)
    assert "engine runs to go" not in r.stderr and "lacks" not in r.stderr and "tokens/s" not in r.stderr, r.stderr[-2000:]
    assert json.loads((out / "sweep.json").read_text())["rows"] == s["rows"]

    # --k auto with a schedule that speculates (k=2) up to 4 sequences and not above.
    from spectool.schedule import write_schedule

    write_schedule(out, [(1, 4, 2), (5, 1024, 0)], "sweep", str(random_draft), "greedy")
    r = spectool("rollout", "--model", str(tiny_policy), "--data", DATA, "--k", "auto", "--sweep", str(out),
                 "--n-prompts", "3", "--max-tokens", "12", "--out", str(tmp_path / "ro"))
    ro = json.loads((tmp_path / "ro" / "manifest.json").read_text())
    acc = ro["summary"]["acceptance"]
    assert acc["num_drafts"] > 0  # 3 sequences: speculated

    r = spectool("rollout", "--model", str(tiny_policy), "--k", "auto", check=False)
    assert r.returncode == 2 and "--sweep=None: must name a sweep-k or forecast run directory with --k auto" in r.stderr


@pytest.mark.fast  # sweep-k's headline in the fast tier: 2 arms
def test_sweep_measures_draft_model_speculation(tiny_policy, tmp_path):
    """--methods draft_model: vLLM's draft-model speculation as a sweep arm. With the policy drafting
    for itself at T=0 every proposal is the policy's next token (the oracle), so acceptance is near
    k + 1 and every position is accepted almost always."""
    out = tmp_path / "sweep"
    spectool("sweep-k", "--model", str(tiny_policy), "--data", DATA, "--out", str(out), "--methods", "draft_model",
             "--min-seconds", "0",
             "--draft-model", "policy", "--k", "2", "--repeats", "1", "--batch-sizes", "2", "--max-tokens", "24",
             "--min-seqs", "2",
             "--temperature", "0", "--lengths", "fixed")
    rows = {x["method"]: x for x in json.loads((out / "sweep.json").read_text())["rows"]}
    assert set(rows) == {"none", "draft_model"}
    assert all(x["tokens"] == x["sequences"] * 24 for x in rows.values())  # --lengths: EOS ignored, equal tokens
    assert rows["draft_model"]["mean_acceptance_length"] > 2.5 and min(rows["draft_model"]["per_position"]) > 0.75
    r = spectool("sweep-k", "--model", str(tiny_policy), "--out", str(tmp_path / "x"), "--methods", "draft_model",
                 "--min-seconds", "0",
                 check=False)
    assert r.returncode == 2 and "--draft-model" in r.stderr

"""On a GPU with the GPU build of vLLM (skipped where CUDA is absent, as in CI): the tiny-model
pipeline through the CLI, train-rl included, with policy and draft sync and the engine check.
Run on a lent GPU machine: `. /tmp/site/env.sh && python3 -m pytest -m gpu tests/test_gpu.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DATA = "gym:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1"


def spectool(*args):
    env = {**os.environ, "SPECTOOL_ENFORCE_EAGER": "1"}
    r = subprocess.run([sys.executable, "-m", "spectool.cli", *args], capture_output=True, text=True, env=env,
                       timeout=1200)
    assert r.returncode == 0, f"spectool {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def test_tiny_pipeline_on_gpu(tiny_policy, tmp_path):
    draft, export = tmp_path / "draft", tmp_path / "export"
    spectool("init-draft", "--model", str(tiny_policy), "--data", DATA, "--out", str(draft), "--n-prompts", "40",
             "--samples", "2", "--max-tokens", "24", "--draft-vocab-size", "256", "--ttt-steps", "3", "--epochs", "2",
             "--batch-size", "8", "--gpu-memory-utilization", "0.3")
    metrics = [json.loads(x) for x in (draft / "metrics.jsonl").read_text().splitlines()]
    assert metrics and metrics[-1]["loss"] < metrics[0]["loss"]
    spectool("export", "--draft", str(draft), "--out", str(export), "--k", "2", "--min-acceptance", "1.0",
             "--gpu-memory-utilization", "0.3")
    assert json.loads((export / "draft.json").read_text())["ttt_steps"] == 3
    r = spectool("rollout", "--model", str(tiny_policy), "--data", DATA, "--draft", str(export), "--k", "2",
                 "--n-prompts", "8", "--max-tokens", "24", "--compare", "--gpu-memory-utilization", "0.3")
    assert "speedup" in r.stdout and "mean acceptance length (k=2)" in r.stdout
    out = tmp_path / "rl"
    sets = [f"model={tiny_policy}", f"data={DATA}", f"out={out}", f"speculation.draft={draft}", "speculation.k=2",
            "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_tokens=16", "rollout.eval_every=0",
            "policy.steps=3", "policy.lr=1e-4", "policy.logprob_check_every=1", "draft_refresh.every=1",
            "draft_refresh.steps_per_refresh=3", "draft_refresh.ttt_steps=2", "engine.gpu_memory_utilization=0.3",
            "checkpoint_every=3"]
    spectool("train-rl", *[a for s in sets for a in ("--set", s)])
    m = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in m] == [1, 2, 3]
    assert all("logprob_check_max_diff" in r and "draft_sync_diff" in r for r in m)

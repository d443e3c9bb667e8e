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


@pytest.mark.parametrize("family", ["eagle3", "peagle", "dflash"])
def test_a_push_into_cuda_graphs_serves_what_a_fresh_engine_serves(family, tiny_policy, tmp_path_factory, tmp_path):
    """With CUDA graphs on (no enforce_eager), a refreshed draft pushed into the running engine drafts what an
    engine started from the same weights drafts: the graphs read the pushed tensors where they captured them
    (vLLM 0.33 records DFlash's context step in a FULL graph; spectool writes DFlash's buffers in place). The
    runner that served it is the one compat predicts (P-EAGLE: V1; the others: V2)."""
    from spectool.draft.checkpoint import save_draft
    from spectool.draft.refresh import DraftRefresher
    from spectool.engine.compat import support
    from spectool.engine.engine import Engine, EngineConfig, Sampling
    from test_parallel_drafters import _draft

    from served import assert_addresses_kept

    policy, folder = _draft(tiny_policy, tmp_path_factory, family)
    refresher = DraftRefresher.from_folder(folder, policy)
    prompts = [[1, 7 + i, 42, 99, 100, 5, 17 + i] for i in range(16)]
    greedy = Sampling(max_tokens=32, temperature=0.0)
    common = dict(model_path=str(tiny_policy), method=family, k=3, dtype="float32", gpu_memory_utilization=0.3)
    with Engine(EngineConfig(draft_path=str(folder), enforce_eager=False, **common)) as engine:
        assert f"Model Runner {support().runner(family)}" in engine.served_by
        addresses = engine.draft_addresses()
        engine.generate(prompts, greedy)  # the graphs are captured and replayed before the push
        with torch.no_grad():
            for p in refresher.draft.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn_like(p))
        assert refresher.push(engine).has_power
        assert_addresses_kept(addresses, engine.draft_addresses())
        _, pushed = engine.generate(prompts, greedy)
    fresh_folder = tmp_path / "pushed"
    save_draft(refresher.draft, fresh_folder)
    with Engine(EngineConfig(draft_path=str(fresh_folder), enforce_eager=True, **common)) as fresh:
        _, started = fresh.generate(prompts, greedy)
    assert pushed.num_drafts > 0
    assert pushed.mean_acceptance_length == pytest.approx(started.mean_acceptance_length, abs=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_drafts_fused_attention_runs_on_cuda_kernels_and_matches_the_cpu(dtype):
    """prefix_attention on CUDA: restricted to the fused kernels (model.fused_kernels: a math fallback would be
    quadratic), equal to the CPU's float32 result within the dtype's rounding, gradients included, at a
    2,048-token record with a chain's 3 extra keys and GQA."""
    from spectool.draft.model import prefix_attention

    g = torch.Generator().manual_seed(0)
    B, hq, hk, T, hd, m = 1, 8, 2, 2048, 64, 3
    q, k, v = (torch.randn(B, h, T, hd, generator=g) * 0.1 for h in (hq, hk, hk))
    extra = torch.randn(B, hq, T, m, generator=g)
    rows = torch.arange(T)

    def run(device, dt):
        xs = [t.to(device, dt).requires_grad_() for t in (q, k, v, extra)]
        o, w = prefix_attention(*xs[:3], rows.to(device), xs[3])
        (o.float().square().sum() + w.float().sum()).backward()
        return [o.float().cpu(), w.float().cpu(), *(x.grad.float().cpu() for x in xs)]

    tol = dict(rtol=1e-3, atol=1e-4) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    for got, want in zip(run("cuda", dtype), run("cpu", torch.float32)):
        torch.testing.assert_close(got, want, **tol)

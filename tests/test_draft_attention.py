"""The drafts' attention without materialised scores (model.prefix_attention) against the
implementation it replaced, kept here as the reference: the attention that built float32 scores
[B, heads, n, T] per unroll step and layer (chain_attention) and [B, heads, n, S, T] per DFlash layer
(BlockAttention). Every family's TTT loss and gradients agree on batches of mixed lengths (padding,
prompt starts, sampled anchors) within float32 rounding: rtol 1e-4, atol 1e-5."""

from __future__ import annotations

import pytest
import torch

from spectool.draft import dflash, model, mtp
from spectool.draft.model import prefix_attention, rope
from spectool.draft.ttt import ttt_step_loss

TOL = {"rtol": 1e-4, "atol": 1e-5}  # float32; the docs state the same


# --- the reference: the materialised attention as it was --------------------------------------------


def reference_chain_attention(a, x, pos, kv, rows, inv_freq, out=slice(None), segments=None):
    """The former model.chain_attention (scores [B, nh, n, T] and a [T, T] causal mask)."""
    B, n, _ = x.shape
    if kv["k0"] is None:
        kv["T"] = n
    T = kv["T"]
    mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()[rows]  # [n, T]
    rep, scale = a.nh // a.nkv, a.hd**-0.5
    k = rope(a.k_proj(x).view(B, n, a.nkv, a.hd).transpose(1, 2), pos, inv_freq).repeat_interleave(rep, dim=1)
    v = a.v_proj(x).view(B, n, a.nkv, a.hd).transpose(1, 2).repeat_interleave(rep, dim=1)
    xq, mask = x[:, out], mask[out]
    n = xq.shape[1]
    q = rope(a.q_proj(xq).view(B, n, a.nh, a.hd).transpose(1, 2), pos[out], inv_freq)
    if kv["k0"] is None:
        kv["k0"], kv["v0"] = k, v
    else:
        kv["k"].append(k)
        kv["v"].append(v)
    s0 = ((q @ kv["k0"].transpose(-1, -2)) * scale).masked_fill(~mask, float("-inf"))
    diag = [(q * kk).sum(-1, keepdim=True) * scale for kk in kv["k"]]
    w = torch.softmax(torch.cat([s0, *diag], dim=-1), dim=-1)
    o = w[..., :T] @ kv["v0"]
    for i, vv in enumerate(kv["v"]):
        o = o + w[..., T + i : T + i + 1] * vv
    return a.o_proj(o.transpose(1, 2).reshape(B, n, a.nh * a.hd))


def reference_block_keys(self, x, pos, inv_freq):
    B, N, _ = x.shape
    rep = self.nh // self.nkv
    k = self.k_norm(self.k_proj(x).view(B, N, self.nkv, self.hd)).transpose(1, 2)
    k = rope(k, pos, inv_freq).repeat_interleave(rep, dim=1)
    v = self.v_proj(x).view(B, N, self.nkv, self.hd).transpose(1, 2).repeat_interleave(rep, dim=1)
    return k, v


def reference_block_attention(self, x, pos, k_ctx, v_ctx, rows, block_mask, inv_freq, segments=None):
    """The former BlockAttention.forward (scores [B, nh, n, S, T] and [B, nh, n, S, S])."""
    B, n, S, _ = x.shape
    T = k_ctx.shape[2]
    ctx_pos = torch.arange(T, device=x.device)
    ctx_mask = ctx_pos[None, :] <= ctx_pos[rows][:, None]  # [n, T]
    flat_pos = pos.reshape(-1)
    q = self.q_norm(self.q_proj(x).view(B, n * S, self.nh, self.hd)).transpose(1, 2)
    q = rope(q, flat_pos, inv_freq).view(B, self.nh, n, S, self.hd)
    kb, vb = self.keys(x.reshape(B, n * S, -1), flat_pos, inv_freq)
    kb, vb = kb.view(B, self.nh, n, S, self.hd), vb.view(B, self.nh, n, S, self.hd)
    scale = self.hd**-0.5
    s_ctx = torch.einsum("bhnsd,bhtd->bhnst", q, k_ctx) * scale
    s_ctx = s_ctx.masked_fill(~ctx_mask[:, None, :], float("-inf"))
    s_blk = torch.einsum("bhnsd,bhnrd->bhnsr", q, kb) * scale
    s_blk = s_blk.masked_fill(~block_mask, float("-inf"))
    w = torch.softmax(torch.cat([s_ctx, s_blk], dim=-1), dim=-1)
    o = torch.einsum("bhnst,bhtd->bhnsd", w[..., :T], v_ctx) + torch.einsum("bhnsr,bhnrd->bhnsd", w[..., T:], vb)
    return self.o_proj(o.permute(0, 2, 3, 1, 4).reshape(B, n, S, self.nh * self.hd))


def use_reference(monkeypatch):
    monkeypatch.setattr(model, "chain_attention", reference_chain_attention)
    monkeypatch.setattr(mtp, "chain_attention", reference_chain_attention)
    monkeypatch.setattr(dflash.BlockAttention, "keys", reference_block_keys)
    monkeypatch.setattr(dflash.BlockAttention, "forward", reference_block_attention)


# --- tiny drafts of every family ----------------------------------------------------------------------

H, V = 32, 64


def tiny_draft(family: str):
    """A draft of `family` whose attention is far from uniform (q, k projections of std 0.3), and
    the aux hidden states it reads per position."""
    torch.manual_seed(0)
    shape = {"hidden_size": H, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 8}
    if family == "mtp":
        d = mtp.MtpDraft(mtp.MtpConfig(**shape, vocab_size=V, target_num_layers=3))
        d.follow(torch.randn(V, H), torch.randn(V, H) * 0.1)
        return sharpen(d), 1
    base = {**shape, "vocab_size": V, "draft_vocab_size": V, "target_hidden_size": H, "aux_layer_ids": [1, 2, 3]}
    if family.startswith("dflash"):
        return sharpen(dflash.DFlashDraft(dflash.DFlashConfig(**base, mask_token_id=63,
                                                              causal=family == "dflash-causal"))), 3
    d = model.Eagle3Draft(model.DraftConfig(**base, family=family, ptd_token_id=63, num_hidden_layers=2))
    with torch.no_grad():
        d.embed_tokens.weight.normal_()
    return sharpen(d), 3


def sharpen(d):
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.normal_(std=0.3)
    return d


def mixed_batch(n_aux: int, lengths=(23, 9, 17), prompts=(6, 3, 8)):
    """Records of different lengths and prompt lengths: (ids [T], aux [T, n_aux * H], last [T, H])."""
    g = torch.Generator().manual_seed(1)
    items = [(torch.randint(0, V - 1, (L,), generator=g), torch.randn(L, n_aux * H, generator=g),
              torch.randn(L, H, generator=g)) for L in lengths]
    return items, list(prompts)


def loss_and_grads(d, items, prompts, fraction):
    d.zero_grad()
    loss, _ = ttt_step_loss(d, items, prompts, torch.randn(V, H, generator=torch.Generator().manual_seed(2)), 3, 0.8,
                            "cpu", "mix", anchor_fraction=fraction, generator=torch.Generator().manual_seed(3))
    loss.backward()
    return loss.detach(), {k: p.grad.clone() for k, p in d.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("fraction", [1.0, 0.4])
@pytest.mark.parametrize("family", ["eagle3", "peagle", "mtp", "dflash", "dflash-causal"])
def test_loss_and_gradients_equal_the_materialised_attentions(family, fraction, monkeypatch):
    d, n_aux = tiny_draft(family)
    items, prompts = mixed_batch(n_aux)
    loss, grads = loss_and_grads(d, items, prompts, fraction)
    with monkeypatch.context() as m:
        use_reference(m)
        ref_loss, ref_grads = loss_and_grads(d, items, prompts, fraction)
    torch.testing.assert_close(loss, ref_loss, **TOL)
    assert grads.keys() == ref_grads.keys() and len(grads) > 5
    for k in grads:
        torch.testing.assert_close(grads[k], ref_grads[k], **TOL, msg=lambda s, k=k: f"{k}: {s}")


def test_prefix_attention_is_softmax_over_the_prefix_and_the_extra_keys():
    """By hand: query i at key index rows[i] sees k[:rows[i] + 1] and its own extra scores (-inf masked)."""
    g = torch.Generator().manual_seed(0)
    B, hq, hk, T, hd, m = 2, 4, 2, 7, 8, 3
    q = torch.randn(B, hq, 4, hd, generator=g)
    k, v = torch.randn(B, hk, T, hd, generator=g), torch.randn(B, hk, T, hd, generator=g)
    extra = torch.randn(B, hq, 4, m, generator=g)
    extra[..., 2] = float("-inf")
    rows = torch.tensor([0, 2, 3, 6])
    o, w = prefix_attention(q, k, v, rows, extra)
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = (q @ kr.transpose(-1, -2)).masked_fill(torch.arange(T)[None, :] > rows[:, None], float("-inf"))
    p = torch.softmax(torch.cat([s, extra], -1), -1)
    torch.testing.assert_close(o, p[..., :T] @ vr, **TOL)
    torch.testing.assert_close(w, p[..., T:], **TOL)
    assert (w[..., 2] == 0).all()
    o2, w2 = prefix_attention(q[:, :, 1:], k, v, slice(4, None), None)  # a slice of rows, no extra keys
    s2 = (q[:, :, 1:] @ kr.transpose(-1, -2)).masked_fill(torch.arange(T)[None, :] > torch.arange(4, 7)[:, None],
                                                         float("-inf"))
    torch.testing.assert_close(o2, torch.softmax(s2, -1) @ vr, **TOL)
    assert w2 is None


# --- packing: records concatenated into one row train as the same records padded ------------------------------


@pytest.mark.parametrize("family", ["eagle3", "peagle", "mtp", "dflash", "dflash-causal"])
def test_a_packed_row_trains_as_its_records_padded(family):
    """ttt_step_loss(pack=True): positions restart per record and no record attends another, so loss and gradients
    equal the padded batch's (every anchor run; a record whose prompt starts earlier than the others included)."""
    d, n_aux = tiny_draft(family)
    items, prompts = mixed_batch(n_aux, lengths=(23, 9, 17, 12), prompts=(6, 3, 8, 1))
    W = torch.randn(V, H, generator=torch.Generator().manual_seed(2))
    out = []
    for pack in (False, True):
        d.zero_grad()
        loss, per_step = ttt_step_loss(d, items, prompts, W, 3, 0.8, "cpu", "mix", pack=pack)
        loss.backward()
        out.append((loss.detach(), per_step, {k: p.grad.clone() for k, p in d.named_parameters() if p.grad is not None}))
    (padded, steps_padded, g_padded), (packed, steps_packed, g_packed) = out
    torch.testing.assert_close(packed, padded, **TOL)
    assert steps_packed == pytest.approx(steps_padded, rel=1e-4)
    for k in g_padded:
        torch.testing.assert_close(g_packed[k], g_padded[k], **TOL, msg=lambda s, k=k: f"{k}: {s}")
    d.zero_grad()  # sampled anchors in a packed row: drawn among the anchors some record's loss reads
    loss, _ = ttt_step_loss(d, items, prompts, W, 3, 0.8, "cpu", "mix", anchor_fraction=0.4,
                            generator=torch.Generator().manual_seed(3), pack=True)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in d.parameters() if p.requires_grad)


def test_packed_anchors_and_masks_stay_inside_their_record():
    from spectool.draft.loss import step_mask
    from spectool.draft.ttt import collate_packed, sample_anchors

    items = [(torch.arange(n), torch.zeros(n, 2), torch.zeros(n, 1)) for n in (5, 4)]
    ids, aux, last, segments, P, L = collate_packed(items, [2, 3])
    assert segments == [0, 5, 9] and ids.shape == (1, 9) and aux.shape == (1, 9, 2)
    assert P.tolist() == [[2] * 5 + [8] * 4] and L.tolist() == [[5] * 5 + [9] * 4]
    # step 0 at t predicts position t + 1: record 0's response targets 1..4, record 1's 7..8 (not 5, 6: the anchor at
    # t = 4 is record 0's last position and its target 5 lies in record 1)
    assert step_mask(P, L, 9, 0)[0].nonzero().flatten().tolist() == [0, 1, 2, 3, 6, 7]
    drawn = sample_anchors(P, L, 2, 0, 9, 0.99, torch.Generator().manual_seed(0))  # all 7 of them (ceil 0.99 x 7)
    assert drawn.tolist() == [0, 1, 2, 3, 5, 6, 7]  # t = 4 reads nothing (its step-0 target is past its record)


@pytest.mark.parametrize("weights", ["decay", "reach"])
def test_recomputed_step_losses_equal_the_kept_ones_and_keep_fewer_bytes(weights):
    """init-draft --recompute-loss: the same loss and gradients, with fewer bytes kept for the backward (counted
    through autograd's saved-tensor hooks)."""
    d, n_aux = tiny_draft("eagle3")
    items, prompts = mixed_batch(n_aux)
    W = torch.randn(V, H, generator=torch.Generator().manual_seed(2))
    out = []
    for recompute in (False, True):
        d.zero_grad()
        kept = []

        def keep(t):
            kept.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            loss, _ = ttt_step_loss(d, items, prompts, W, 3, 0.8, "cpu", "mix", weights=weights, pack=True,
                                    recompute=recompute)
        loss.backward()
        out.append((loss.detach(), {k: p.grad.clone() for k, p in d.named_parameters() if p.grad is not None}, sum(kept)))
    (loss, grads, kept), (loss_r, grads_r, kept_r) = out
    torch.testing.assert_close(loss_r, loss, **TOL)
    for k in grads:
        torch.testing.assert_close(grads_r[k], grads[k], **TOL)
    assert kept_r < kept

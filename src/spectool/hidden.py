"""The policy's auxiliary hidden states, in the convention vLLM's EAGLE-3 drafter receives them.

vLLM's aux layer id i means "the residual stream entering decoder layer i" (LlamaModel.forward adds
`hidden_states + residual` before layer i when i is in `aux_hidden_state_layers`), which is
transformers' `output_hidden_states[i]`. tests/test_engine_e2e.py checks this against the engine:
it captures the input of the running drafter's `fc` and compares it to `policy_features`.
Other trainers number the same layers as "output of layer i-1" (SpecForge, speculators): the same layers, off by one in the number.
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
    `last` is the final-norm output the policy's lm_head reads (logits = lm_head(last)). Id N (the
    layer count) is the residual stream after the last layer, before the final norm: what an MTP
    layer reads (draft/mtp.py).
    """
    base = model.model
    N, pre_norm = len(base.layers), []
    hook = base.norm.register_forward_pre_hook(lambda _m, args: pre_norm.append(args[0])) if N in layer_ids else None
    try:
        out = base(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    finally:
        if hook is not None:
            hook.remove()
    hs = out.hidden_states  # N+1 tensors: [0] embeddings, [i] input of layer i, [N] final-normed
    aux = torch.cat([pre_norm[-1] if i == N else hs[i] for i in layer_ids], dim=-1)
    return aux, out.last_hidden_state


FeatureItem = tuple  # (ids [T] int64, aux [T, n_aux * H] float16, last [T, H] float16), host tensors


def feature_items(policy, seqs: list[list[int]], layer_ids: list[int], on_batch=None) -> list[FeatureItem]:
    """The policy's features of each token sequence, computed on the policy's device in
    right-padded batches of similar length (padding never changes the earlier positions of a
    causal model); `on_batch(n)` is called after each batch of n sequences (progress)."""
    dev = next(policy.parameters()).device
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    batch = 32 if dev.type == "cuda" else 4
    items: list = [None] * len(seqs)
    for b in range(0, len(order), batch):
        idx = order[b : b + batch]
        T = len(seqs[idx[-1]])
        ids = torch.zeros(len(idx), T, dtype=torch.int64)  # [B, T]
        mask = torch.zeros(len(idx), T, dtype=torch.int64)
        for j, i in enumerate(idx):
            ids[j, : len(seqs[i])], mask[j, : len(seqs[i])] = torch.tensor(seqs[i]), 1
        a, h = policy_features(policy, ids.to(dev), layer_ids, mask.to(dev))  # [B, T, n_aux * H], [B, T, H]
        a, h = a.half().cpu(), h.half().cpu()
        for j, i in enumerate(idx):
            n = len(seqs[i])
            items[i] = (ids[j, :n].clone(), a[j, :n].clone(), h[j, :n].clone())
        if on_batch:
            on_batch(len(idx))
    return items


def bytes_per_token(hidden_size: int, n_aux: int = 3) -> int:
    """Disk per token in the features format: ids (int64), n_aux aux layers and the last hidden (float16)."""
    return 8 + (n_aux + 1) * hidden_size * 2


def save_features(path: Path, items: list[FeatureItem]) -> int:
    """The one on-disk format of policy features (harvest --hidden-states shards, init-draft's
    cache): safetensors with ids, aux, last concatenated over sequences, and their lengths.
    Written atomically; returns bytes."""
    from safetensors.torch import save

    from spectool.runs import atomic_write_bytes

    blob = save({"ids": torch.cat([x[0] for x in items]).to(torch.int64).contiguous(),
                 "aux": torch.cat([x[1] for x in items]).to(torch.float16).contiguous(),
                 "last": torch.cat([x[2] for x in items]).to(torch.float16).contiguous(),
                 "lengths": torch.tensor([len(x[0]) for x in items], dtype=torch.int64)})
    atomic_write_bytes(path, blob)
    return len(blob)


def load_features(path: Path) -> list[FeatureItem]:
    from safetensors.torch import load_file

    d = load_file(str(path))
    lengths = d["lengths"].tolist()
    return list(zip(d["ids"].split(lengths), d["aux"].split(lengths), d["last"].split(lengths)))

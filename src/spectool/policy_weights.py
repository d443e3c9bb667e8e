"""The trainer's policy weights as others must read them: in the checkpoint layout vLLM loads, and
whole where a trainer shards them.

Layout. transformers 5 holds a mixture-of-experts layer's experts fused in memory
(`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I] for Qwen3-MoE), while
checkpoints, and so vLLM's loader, name them per expert (`mlp.experts.N.{gate,up,down}_proj.weight`).
A weight sync that sends the in-memory names leaves the engine on its old experts (measured: a tiny
Qwen3-MoE's engine logprobs 0.22 nats off the trainer's after one step). `checkpoint_layout` sends
what `save_pretrained` would write: transformers' own reverse conversion
(`core_model_loading.revert_weight_conversion`, the one its save uses), applied one decoder layer at
a time so a streamed sync never holds more than a layer's host copies. Models without conversions
pass through untouched.

Sharding. Under FSDP2 a parameter is a DTensor whose local piece is a slice ([256, 64] of a [512, 64]
lm_head on each of 2 ranks); under DeepSpeed ZeRO-3 it is an empty placeholder (shape [0]) outside a gather. The refresher needs
the policy's input embedding (the draft reads tokens with it, as vLLM's drafter shares it) and its
output embedding (the targets: softmax(lm_head(last hidden))). `embeddings(policy)` gathers those two
tensors whole, and nothing else: the policy's layers stay sharded. Gathering is a collective: every
rank calls it at the same point. Why gather rather than capture the logits in the forward: an 8B
Qwen3's lm_head in bfloat16 is 1.2 GiB, once per refresh, while the buffer's logits would be
V x 2 bytes = 297 KiB per token, 19 GiB for 64 sequences of 1,024 tokens (docs/rl.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def _base(model):
    """The transformers model under accelerate/DDP/FSDP and PEFT wrappers (its conversions live there)."""
    from accelerate.utils import extract_model_from_parallel  # noqa: PLC0415 (heavy, loaded only on this path)

    model = extract_model_from_parallel(model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def conversions(model) -> list:
    """transformers' weight conversions for this model (empty for a model stored as it is held)."""
    from transformers.conversion_mapping import get_model_conversion_mapping  # noqa: PLC0415 (heavy, loaded only on this path)

    model = _base(model)
    found = getattr(model, "_weight_conversions", None)
    return list(found) if found is not None else list(get_model_conversion_mapping(model, add_legacy=False))


def checkpoint_layout(model, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs as the model holds them -> as its checkpoint names them (and vLLM loads
    them). A decoder layer's tensors are reverted together (a fused tensor splits into several, several
    may join); tensors outside the layers one at a time. `weights` must come layer by layer, as
    `named_parameters` and `state_dict` give them (and TRL's walk, which gathers each in turn: a
    layer's tensors are copied while buffered). Models without conversions pass through untouched."""

    if not conversions(model):
        yield from weights
        return
    from transformers.core_model_loading import revert_weight_conversion  # noqa: PLC0415 (heavy, loaded only on this path)

    base = _base(model)
    group: dict[str, torch.Tensor] = {}
    layer = None
    for name, t in weights:
        m = _LAYER.search(name)
        here = m.group(1) if m else None
        if group and (here != layer or here is None):
            yield from revert_weight_conversion(base, group).items()
            group = {}
        group[name] = t.detach().clone()  # a walk's tensor may be valid only while yielded (ZeRO-3 gathers it)
        layer = here
    if group:
        yield from revert_weight_conversion(base, group).items()


def is_zero3(t: torch.Tensor) -> bool:
    """A DeepSpeed ZeRO-3 partitioned parameter (its data an empty placeholder outside a gather)."""
    return hasattr(t, "ds_id")


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a possibly sharded parameter, detached: a DTensor (FSDP2, tensor
    parallelism) all-gathered, a ZeRO-3 partition gathered into a copy (DeepSpeed's
    GatheredParameters). Both are collectives every rank must reach together."""
    if is_zero3(t):
        import deepspeed  # noqa: PLC0415 (only where DeepSpeed partitioned the policy)

        with deepspeed.zero.GatheredParameters([t], modifier_rank=None):
            return t.detach().clone()
    t = t.detach()
    full_tensor = getattr(t, "full_tensor", None)  # torch.distributed.tensor.DTensor
    return full_tensor() if full_tensor is not None else t


def is_sharded(policy) -> bool:
    """True when the policy's embedding is held in pieces (FSDP2 DTensor or ZeRO-3 partition)."""
    w = policy.get_input_embeddings().weight
    return is_zero3(w) or hasattr(w, "full_tensor")


def embeddings(policy) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's input embedding [V, H] and output embedding (lm_head) [V, H], whole, detached.
    A collective when sharded: every rank calls it together. Tied weights are gathered once."""
    emb, head = policy.get_input_embeddings().weight, policy.get_output_embeddings().weight
    e = full(emb)
    return e, (e if head is emb else full(head))

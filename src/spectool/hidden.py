"""The policy's auxiliary hidden states, in the convention vLLM's EAGLE-3 drafter receives them.

vLLM's aux layer id i means "the residual stream entering decoder layer i" (LlamaModel.forward adds
`hidden_states + residual` before layer i when i is in `aux_hidden_state_layers`), which is
transformers' `output_hidden_states[i]`. tests/test_engine_e2e.py checks this against the engine:
it captures the input of the running drafter's `fc` and compares it to `policy_features`.
Other trainers number the same layers as "output of layer i-1" (SpecForge, speculators): the same layers, off by one
in the number.
"""

from __future__ import annotations

from pathlib import Path

import torch

from spectool.runs import atomic_write_bytes


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """Low / middle / high layers (vLLM's defaults 2, N/2, N-3), kept distinct and in range."""
    ids = [min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)]
    if len(set(ids)) < 3:  # tiny policies: spread over what exists
        ids = sorted({0, max(num_layers // 2, 1) if num_layers > 1 else 0, num_layers - 1})
        while len(ids) < 3:
            ids.append(ids[-1])
    return ids


def decoder(model):
    """The backbone of a transformers causal LM (its `.layers` and final `.norm`)."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


def aux_sites(base, layer_ids: list[int]) -> dict:
    """Where each aux id is read, as a forward pre-hook's input: decoder layer i's, or (id N, the
    layer count) the final norm's, which is the trunk's output before that norm."""
    N = len(base.layers)
    return {i: base.norm if i == N else base.layers[i] for i in sorted(set(layer_ids))}


def hook_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden states a module was called with (positional or keyword)."""
    return args[0] if args else kwargs["hidden_states"]


F16_MAX = torch.finfo(torch.float16).max


def to_store(h: torch.Tensor) -> torch.Tensor:
    """A detached half-size copy of features for the cache: float16 (11-bit mantissa), or bfloat16
    where a value would overflow float16 (models with activations beyond 65504)."""
    h = h.detach()
    return h.to(torch.float16, copy=True) if h.abs().max() <= F16_MAX else h.to(torch.bfloat16, copy=True)


@torch.no_grad()
def policy_features(
    model, input_ids: torch.Tensor, layer_ids: list[int], attention_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the policy once over prompt + response.

    input_ids: [B, T] -> (aux [B, T, len(layer_ids) * H] in vLLM's order, last [B, T, H]), where
    `last` is the final-norm output the policy's lm_head reads (logits = lm_head(last)). Id N (the
    layer count) is the residual stream after the last layer, before the final norm: what an MTP
    layer reads (draft/mtp.py). Only the asked layers are kept (forward pre-hooks), not all N + 1.
    """
    base, seen = decoder(model), {}

    def keep(i: int):
        def hook(_module, args, kwargs) -> None:
            seen.setdefault(i, hook_input(args, kwargs))

        return hook

    hooks = [m.register_forward_pre_hook(keep(i), with_kwargs=True) for i, m in aux_sites(base, layer_ids).items()]
    try:
        out = base(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        for h in hooks:
            h.remove()
    return torch.cat([seen[i] for i in layer_ids], dim=-1), out.last_hidden_state


FeatureItem = tuple  # (ids [T] int64, aux [T, n_aux * H], last [T, H]) float16 or bfloat16 (to_store), host tensors
# (aux and last on the policy's device for feature_items(on_device=True))
CPU_BATCH_TOKENS = 2048  # padded tokens per policy forward on a CPU (about 4 records of the demo)


MIN_BATCH_TOKENS, MAX_BATCH_TOKENS = 512, 1 << 17  # a GPU feature forward's padded tokens, at least and at most


def forward_token_bytes(config, n_aux: int, value_bytes: int) -> int:
    """What one token holds during a no-grad feature forward: the kept aux layers and last, plus one layer's
    transient MLP and attention activations, `value_bytes` each (the policy's dtype)."""
    return value_bytes * ((n_aux + 1) * config.hidden_size + 3 * config.intermediate_size + 4 * config.hidden_size)


def batch_tokens(policy, n_aux: int) -> int:
    """Padded tokens per feature forward: on a GPU, half the free memory over what one token holds
    (forward_token_bytes, in the policy's dtype); CPU_BATCH_TOKENS elsewhere."""
    param = next(policy.parameters())
    if param.device.type != "cuda":
        return CPU_BATCH_TOKENS
    per_token = forward_token_bytes(policy.config, n_aux, param.element_size())
    free, _ = torch.cuda.mem_get_info(param.device)
    return max(MIN_BATCH_TOKENS, min(MAX_BATCH_TOKENS, int(0.5 * free / per_token)))


def token_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices in order of length, cut into batches whose padded size (count x longest) stays
    within max_tokens (a longer sequence goes alone)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * lengths[i] <= max_tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def feature_items(policy, seqs: list[list[int]], layer_ids: list[int], on_batch=None,
                  max_tokens: int | None = None, on_device: bool = False) -> list[FeatureItem]:
    """The policy's features of each token sequence, computed on the policy's device in
    right-padded batches of similar length within a padded-token budget (batch_tokens; padding
    never changes the earlier positions of a causal model); `on_batch(n)` is called after each
    batch of n sequences (progress). `on_device`: aux and last stay where they were computed (init-draft's
    `--features online` trains on them there: no copy to the host and back per batch)."""
    dev = next(policy.parameters()).device
    budget = max_tokens or batch_tokens(policy, len(layer_ids))
    items: list = [None] * len(seqs)
    for idx in token_batches([len(s) for s in seqs], budget):
        T = len(seqs[idx[-1]])
        ids = torch.zeros(len(idx), T, dtype=torch.int64)  # [B, T]
        mask = torch.zeros(len(idx), T, dtype=torch.int64)
        for j, i in enumerate(idx):
            ids[j, : len(seqs[i])], mask[j, : len(seqs[i])] = torch.tensor(seqs[i]), 1
        a, h = policy_features(policy, ids.to(dev), layer_ids, mask.to(dev))  # [B, T, n_aux * H], [B, T, H]
        a, h = to_store(a), to_store(h)
        if not on_device:
            a, h = a.cpu(), h.cpu()
        for j, i in enumerate(idx):
            n = len(seqs[i])
            items[i] = (ids[j, :n].clone(), a[j, :n].clone(), h[j, :n].clone())
        if on_batch:
            on_batch(len(idx))
    return items


def bytes_per_token(hidden_size: int, n_aux: int = 3) -> int:
    """Disk per token in the features format: ids (int64), n_aux aux layers and the last hidden (2 bytes each)."""
    return 8 + (n_aux + 1) * hidden_size * 2


CONTENT = "content_sha256"  # a features file's metadata key: tensors_digest of what it holds (checked on reuse)


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """Short sha256 over each tensor's name, dtype, shape and bytes, in name order (CPU tensors): a features file's
    content, whatever its header says. ~0.6 GiB/s (hashlib's sha256)."""
    import hashlib  # noqa: PLC0415 (used on this path only)

    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].contiguous()
        h.update(f"{k}\0{t.dtype}\0{list(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()[:16]


def content_misfit(path: Path, missing_ok: bool = False) -> str | None:
    """Why a features file's tensors are not what it was written with (its CONTENT digest), or None when they are;
    reads the whole file (tensors_digest's rate). A file without the digest (an older spectool's) is a misfit, or
    None with `missing_ok` (nothing to check it against)."""
    from safetensors import SafetensorError, safe_open  # noqa: PLC0415 (heavy, loaded only on this path)

    try:
        with safe_open(str(path), "pt") as f:
            want = (f.metadata() or {}).get(CONTENT)
            have = tensors_digest({k: f.get_tensor(k) for k in f.keys()}) if want else None  # noqa: SIM118
    except (SafetensorError, OSError) as e:
        return f"it cannot be read ({e})"
    if want is None:
        return None if missing_ok else f"it carries no {CONTENT} (an older spectool wrote it)"
    return None if have == want else f"its tensors changed after it was written ({CONTENT} {want}, now {have})"


def save_features(path: Path, items: list[FeatureItem], metadata: dict[str, str] | None = None) -> int:
    """The one on-disk format of policy features (harvest --hidden-states shards, init-draft's
    cache): safetensors with ids, aux, last concatenated over sequences, and their lengths; aux
    and last in float16, or bfloat16 when any item needed it (to_store); `metadata` in its header
    (features.write_shards: the records it holds), and CONTENT: the digest of its tensors (a file changed in place
    is told apart: content_misfit). Written atomically; returns bytes."""
    from safetensors.torch import save  # noqa: PLC0415 (heavy, loaded only on this path)

    half = torch.bfloat16 if any(x[1].dtype == torch.bfloat16 or x[2].dtype == torch.bfloat16 for x in items) \
        else torch.float16
    tensors = {"ids": torch.cat([x[0] for x in items]).to(torch.int64).contiguous(),
               "aux": torch.cat([x[1].to(half) for x in items]).contiguous(),
               "last": torch.cat([x[2].to(half) for x in items]).contiguous(),
               "lengths": torch.tensor([len(x[0]) for x in items], dtype=torch.int64)}
    blob = save(tensors, metadata={**(metadata or {}), CONTENT: tensors_digest(tensors)})
    atomic_write_bytes(path, blob)
    return len(blob)


def load_features(path: Path, pin: bool = False, resident: bool = False) -> list[FeatureItem]:
    """The items of a features file, mapped from it (safetensors maps the file: pages are read as they are
    touched); `pin`: copied into page-locked host memory (fast, asynchronous copies to a GPU); `resident`: copied
    into the process's memory."""
    from safetensors.torch import load_file  # noqa: PLC0415 (heavy, loaded only on this path)

    d = load_file(str(path))
    if pin or resident:
        d = {k: v.pin_memory() if pin else v.clone() for k, v in d.items()}
    lengths = d["lengths"].tolist()
    return list(zip(d["ids"].split(lengths), d["aux"].split(lengths), d["last"].split(lengths)))

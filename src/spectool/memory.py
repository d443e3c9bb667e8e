"""The built-in train-rl backend's GPU memory budget, checked before anything starts: one GPU
holds the float32 policy, its gradients, AdamW's two moments, activations, and the engine's
share. A budget that cannot fit is refused, naming the settings that would make it fit."""

from __future__ import annotations

from dataclasses import dataclass

from spectool.errors import SpectoolError

GIB = 1024**3
BYTES_PER_PARAM = 4 + 4 + 8  # float32 weights, gradients, AdamW exp_avg + exp_avg_sq
ACTIVATION_SHARE = 0.10  # of the GPU kept free for activations and the allocator (a first setting)


@dataclass
class Budget:
    params: int
    trainer_gib: float  # weights + gradients + optimizer state
    engine_gib: float  # the engine's share of the GPU
    activations_gib: float
    total_gib: float  # the GPU

    @property
    def fits(self) -> bool:
        return self.trainer_gib + self.engine_gib + self.activations_gib <= self.total_gib

    def lines(self) -> str:
        return (f"policy {self.params / 1e9:.2f}B params: weights + gradients + AdamW {self.trainer_gib:.1f} GiB, "
                f"engine share {self.engine_gib:.1f} GiB, activations {self.activations_gib:.1f} GiB; "
                f"GPU {self.total_gib:.1f} GiB")


def param_count(config) -> int:
    """Parameters of a decoder-only transformers config (attention, MLP, embeddings, norms)."""
    h, n, v, i = config.hidden_size, config.num_hidden_layers, config.vocab_size, config.intermediate_size
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    hd = getattr(config, "head_dim", None) or h // heads
    attn = h * heads * hd * 2 + h * kv * hd * 2
    per_layer = attn + 3 * h * i + 2 * h
    emb = v * h * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    return n * per_layer + emb + h


def budget(config, engine_share: float, total_bytes: int) -> Budget:
    p = param_count(config)
    total = total_bytes / GIB
    return Budget(p, p * BYTES_PER_PARAM / GIB, engine_share * total, ACTIVATION_SHARE * total, total)


def check_fits(b: Budget) -> None:
    if b.fits:
        return
    room = 1 - ACTIVATION_SHARE - b.trainer_gib / b.total_gib
    advice = (f"lower engine.gpu_memory_utilization to {room:.2f} or less" if room > 0.05 else
              "no engine share leaves the trainer enough room on this GPU")
    raise SpectoolError(f"train-rl's built-in backend cannot fit this on one GPU ({b.lines()}): {advice}, or run "
                        "`spectool train-rl --backend trl` (TRL's GRPOTrainer: DeepSpeed/FSDP sharding, LoRA, "
                        "several GPUs)")


def engine_share_beside(config, wanted: float, total_bytes: int, flag: str = "--gpu-memory-utilization") -> float:
    """The engine's share of a GPU that also holds the float32 policy for feature extraction
    (harvest --hidden-states): vLLM refuses to start unless share x total is free, so the share
    leaves room for the policy and its activations. Refuses when too little would be left."""
    policy = param_count(config) * 4 / total_bytes
    share = min(wanted, 1 - policy - ACTIVATION_SHARE)
    if share < 0.1:
        raise SpectoolError(
            f"the float32 policy ({param_count(config) / 1e9:.1f}B params, {policy:.0%} of the GPU) leaves the engine "
            f"{max(share, 0):.0%} of it next to it: harvest without --hidden-states (init-draft computes the features "
            f"from the records in a second pass), or use a larger GPU ({flag} was {wanted})")
    return share

"""init-draft's training: the draft's shape, its loss and optimizer, and where the policy's features come from.

Torch-free like every group; what they mean in a step is draft/training.py's and features.py's. The defaults are
measured (docs/results.md, docs/drafters.md), the online refresh's own are settings/refresh.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from spectool.constants import (
    DEFAULT_FEATURES,
    DEFAULT_LOSS,
    DEFAULT_POSITION_WEIGHTS,
    DRAFT_DTYPES,
    FEATURE_SOURCES,
    LOSSES,
    MAX_BATCH_TOKENS,
    POSITION_WEIGHTS,
)
from spectool.errors import check
from spectool.settings.spelling import Spell, flag

# The draft positions init-draft trains by default: sweep-k measures k up to it (sweep-k's default --k).
DEFAULT_TTT_STEPS = 5


@dataclass(kw_only=True)
class DraftTraining:
    """The draft's shape and how it trains."""

    draft_vocab_size: int = 4096
    """Draft vocabulary size (the most frequent tokens of the policy's responses)."""
    ttt_steps: int = DEFAULT_TTT_STEPS
    """Unroll length: trains draft positions 1..N (use >= the largest k you run)."""
    draft_layers: int = 1
    """Decoder layers of the draft (vLLM's EAGLE-3 and DFlash loaders serve any number); each costs about one more
    draft forward per drafted token (init-draft prints the measured draft/policy cost)."""
    step_decay: float = 0.8
    """Loss weight of unroll position j is step_decay^j."""
    anchor_fraction: float | None = None
    """Share of the anchors (response positions a draft proposes from) each step trains, drawn afresh per step, as
    speculators trains DFlash and P-EAGLE (512 per 2,048 tokens = 0.25): a step costs about that share, so more
    passes fit the same time. Default: the family's, as measured (dflash 0.25; eagle3, peagle and mtp 1, every
    anchor: docs/drafters.md, "Sampled anchors")."""
    loss: str = DEFAULT_LOSS
    """Per-position loss against the policy's distribution: ce (soft cross-entropy) | tv (1 - sum min(p, q),
    the rejection probability of a sampling draft) | mix (ce + tv; measured best of the three, docs/results.md) |
    tv-heavy (0.1 ce + 0.9 tv, the field's T=1 recipe: docs/results.md, "The T=1 recipe")."""
    position_weights: str = DEFAULT_POSITION_WEIGHTS
    """How each unroll step's positions are weighted: decay (--step-decay^j, all alike) | rejection (each position
    by the probability a sampling draft is rejected there, Draft-OPD's error positions) | reach (by the
    probability verification reaches that step from its anchor, in place of --step-decay^j). Measured:
    docs/results.md, "The T=1 recipe: position weights"."""
    epochs: int = 2
    """Passes over the harvested records."""
    max_steps: int | None = None
    """Stop after this many steps if --epochs would run longer (a budget for data larger than a run can pass over;
    the learning-rate schedule spans the steps that run)."""
    save_every: int = 50
    """Checkpoint + held-out eval every N steps."""
    eval_fraction: float = 0.05
    """Fraction of prompts held out (by hash of the prompt text)."""
    batch_size: int = 4
    """Records per step. Small: one epoch at batch 4 trained a better draft than at 8 or 16 on this machine
    (more steps for the same tokens; docs/results.md, "Draft quality")."""
    lr: float = 1e-3
    """AdamW learning rate (short runs on small harvests: higher than the 1e-4 of large-corpus recipes)."""
    warmup_steps: int = 20
    """Linear warm-up steps, then cosine decay."""
    max_batch_tokens: int = MAX_BATCH_TOKENS
    """Most tokens per training forward: a step's records are packed into micro-batches within it (no padding; a
    longer record alone), gradients accumulated; a step's memory (the draft's logits over its vocabulary, its activations, its
    fused attention) is linear in it. The default suits the demo's 128-token records; at reasoning lengths set it to
    the longest record (e.g. 16384 for 16k-token records): the GPU memory plan names the largest that fits."""
    draft_dtype: str = "auto"
    """The draft's training compute: auto (bfloat16 autocast on a GPU with bfloat16 units, compute capability 8.0+;
    float32 elsewhere, this CPU build's included) | float32 | bfloat16 (autocast: matmuls in bfloat16, the loss in
    float32). Its weights, gradients and AdamW moments stay float32 either way; the run's init_draft.json records the
    resolved value."""
    recompute_loss: bool = False
    """Recompute each unroll step's loss (softmax of the targets, log-softmax of the draft's logits) in the backward
    instead of keeping them: about 3 fewer [tokens x draft vocabulary] float32 copies a step, the same loss and
    gradients, more time. Measured on a tiny draft (one 8,192-token record, a 4,096-token vocabulary, this CPU): peak
    growth 2.0 -> 1.4 GiB, the step 1.5x slower (benchmarks/loss_recompute.py; docs/drafters.md)."""

    def validate(self, spell: Spell = flag) -> None:
        check(self.draft_vocab_size >= 2, spell("draft_vocab_size"), self.draft_vocab_size, "must be >= 2")
        check(self.ttt_steps >= 1, spell("ttt_steps"), self.ttt_steps, "must be >= 1 (use >= the largest k you run)")
        check(1 <= self.draft_layers <= 4, spell("draft_layers"), self.draft_layers, "must be in [1, 4]")
        check(0 < self.step_decay <= 1, spell("step_decay"), self.step_decay, "must be in (0, 1]")
        check(self.anchor_fraction is None or 0 < self.anchor_fraction <= 1, spell("anchor_fraction"),
              self.anchor_fraction, "must be in (0, 1] (1: every anchor)")
        check(self.loss in LOSSES, spell("loss"), self.loss, f"must be one of {', '.join(LOSSES)}")
        check(self.position_weights in POSITION_WEIGHTS, spell("position_weights"), self.position_weights,
              f"must be one of {', '.join(POSITION_WEIGHTS)}")
        check(self.epochs >= 1, spell("epochs"), self.epochs, "must be >= 1")
        check(self.max_steps is None or self.max_steps >= 1, spell("max_steps"), self.max_steps, "must be >= 1")
        check(self.max_batch_tokens >= 64, spell("max_batch_tokens"), self.max_batch_tokens, "must be >= 64")
        check(self.batch_size >= 1, spell("batch_size"), self.batch_size, "must be >= 1")
        check(0 < self.lr < 1, spell("lr"), self.lr, "must be in (0, 1)")
        check(self.draft_dtype in DRAFT_DTYPES, spell("draft_dtype"), self.draft_dtype,
              f"must be one of {', '.join(DRAFT_DTYPES)}")
        check(0 < self.eval_fraction < 0.5, spell("eval_fraction"), self.eval_fraction, "must be in (0, 0.5)")


@dataclass(kw_only=True)
class Features:
    """Where the policy's features (its hidden states, the draft's input) come from, and what they may take."""

    features: str = DEFAULT_FEATURES
    """Where the policy's features come from: stream (bounded shards on disk, read a shard at a time: memory flat in
    the data's size) | online (the policy's forward per training batch: no disk, a policy forward per record per
    epoch) | cache (one file loaded whole into memory: grows with the data). All three train the same draft;
    measured: docs/drafters.md, "Features at scale"."""
    shard_tokens: int = 32768
    """Tokens per feature shard (stream) and per shuffle group (every --features): with --shuffle-window, what one
    window holds in memory (shard_tokens x window x the features' bytes per token)."""
    shuffle_window: int = 4
    """Shards whose records are shuffled together each epoch (the shards' own order is shuffled too)."""
    disk_budget_gb: float | None = None
    """Most disk (GiB) the policy features may take (--features stream or cache); init-draft refuses to start above
    it, and stream checks again before each shard it writes. Default: the free space where --out lives. A harvest's
    --hidden-states shards are reused and cost none; --features online takes none."""

    def validate(self, spell: Spell = flag) -> None:
        check(self.features in FEATURE_SOURCES, spell("features"), self.features,
              f"must be one of {', '.join(FEATURE_SOURCES)}")
        check(self.shard_tokens >= 1, spell("shard_tokens"), self.shard_tokens,
              "must be >= 1 (a record longer than a shard has one to itself)")
        check(self.shuffle_window >= 1, spell("shuffle_window"), self.shuffle_window, "must be >= 1")
        check(self.disk_budget_gb is None or self.disk_budget_gb > 0, spell("disk_budget_gb"), self.disk_budget_gb,
              "must be > 0 (GiB)")

"""Project-wide constants and ranges: one place for each rule that settings, the TRL integration, the
refresher and the engine all read (the commands' settings are config.py's, train-rl's rl/config.py's).
Torch-free, like the settings, so `spectool --help` stays fast."""

from __future__ import annotations

from spectool.errors import check
from spectool.families import FAMILIES

DEFAULT_MODEL = "smollm2-135m"
# Two-term one-digit sums: SmolLM2-135M scores ~0.4 here, a real RL signal (measured).
DEFAULT_DATA = "gym:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1"
# The drafter families (families.py): a draft folder (eagle3, peagle, dflash, dspark) or the
# model's own MTP layers (mtp). What rollout, verify and train-rl draft with; init-draft trains all
# but dspark; dspark is served by GPU builds of vLLM only.
DRAFTERS = tuple(FAMILIES)
TRAINABLE = tuple(n for n, f in FAMILIES.items() if f.trainable)
METHODS = (*DRAFTERS, "ngram", "draft_model")  # sweep-k's speculative methods
CONTROLS = ("auto", "unpatched", "offbyone", "truncated", "temperature", "none")  # verify's lossy controls (engine/arms.py)
# How a drafter proposes (vLLM's draft_sample_method): auto (chosen per build by measurement,
# engine/proposals.py), its argmax, or a sample from it.
DRAFT_SAMPLING = ("auto", "greedy", "probabilistic")
# The engine's share of GPU memory when nothing else runs on the GPU (train-rl has its own default,
# engine.gpu_memory_utilization, that leaves the colocated trainer room). Ignored on the CPU build.
GPU_MEMORY_UTILIZATION = 0.9
# Draft tokens per verify step wherever a draft runs (rollout, verify, export, train-rl, TRL): 3, the
# field's measured best for EAGLE-3 in reasoning RL (NeMo RL: 1.77x at k=3 vs 1.44x at 5, 1.21x at 7).
DEFAULT_K = 3
# The engine's precision (precision.py: what "auto" picks per device, the logprob tolerance per dtype).
ENGINE_DTYPES = ("auto", "float32", "bfloat16", "float16")
DRAFT_DTYPES = ("auto", "float32", "bfloat16")  # init-draft --draft-dtype: the draft's compute (precision.draft_dtype)
# The drafter that is the policy's own MTP layers, where a draft folder would go (TRL: SpectoolSpeculation("mtp")).
OWN_MTP = "mtp"
# k, the draft tokens per verify step, wherever it is set (vLLM's own bound is larger; beyond 16 no
# drafter spectool knows is accepted often enough to pay)
K_MIN, K_MAX = 1, 16
# The per-position draft losses (draft/loss.py) as (CE weight, TV weight), and the default, init-draft's measured
# best (ce + tv: docs/results.md, "Draft loss"), also the online refresh's. "tv-heavy" is the field's T=1 recipe
# (DSpark; NeMo RL's DSpark recipe): 0.1 CE + 0.9 TV.
LOSS_WEIGHTS = {"ce": (1.0, 0.0), "tv": (0.0, 1.0), "mix": (1.0, 1.0), "tv-heavy": (0.1, 0.9)}
LOSSES = tuple(LOSS_WEIGHTS)
DEFAULT_LOSS = "mix"
MAX_BATCH_TOKENS = 8192  # tokens of one draft training forward (init-draft's --max-batch-tokens, the online refresh's)
# How the per-position losses of one unroll step are weighted (draft/loss.py, ttt_loss): "decay" step_decay^j, every
# position alike (EAGLE-3, SpecForge); "rejection" step_decay^j, each position by the probability that a sampling
# draft is rejected there (Draft-OPD's verification-exposed errors, offline); "reach" by the probability that
# verification reaches step j from that anchor at all (the product of the earlier steps' acceptance), in place of
# step_decay^j. Measured: docs/results.md, "The T=1 recipe: position weights".
POSITION_WEIGHTS = ("decay", "rejection", "reach")
DEFAULT_POSITION_WEIGHTS = "decay"
# Where init-draft's policy features come from (features.py): "stream" bounded shards on disk read a shard at a time,
# "online" the policy's forward per training batch (no disk), "cache" one file loaded whole (RAM grows with the
# data). The default: measured, docs/drafters.md "Features at scale".
FEATURE_SOURCES = ("stream", "online", "cache")
DEFAULT_FEATURES = "stream"
# The most sequences vLLM decodes at once on any device (its default on GPUs of 70 GiB or more, not A100s; 256
# elsewhere: engine/compat.batch_defaults). Every engine gets at most the device's own (engine/batch.py); a larger batch
# is queued by the scheduler. sweep-k measures no batch above this (its rows would be queued waves).
MAX_NUM_SEQS = 1024
# The largest share of GPU memory an engine may take (vLLM needs a little for itself).
GPU_SHARE_MAX = 0.98


def k_in_range(k: object) -> bool:
    return isinstance(k, int) and K_MIN <= k <= K_MAX


def check_k(k: object, name: str, auto: bool = False) -> None:
    """The one rule for k wherever it is set, in one wording: `name` as the caller spells it (--k, speculation.k, k);
    `auto`: 'auto' (k per batch size from a sweep) is allowed there."""
    check(k_in_range(k) or (auto and k == "auto"), name, k, f"must be an integer in [{K_MIN}, {K_MAX}]"
          + (" or 'auto'" if auto else ""))

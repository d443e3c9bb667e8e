"""How a drafter proposes (vLLM's `draft_sample_method`): "greedy", its argmax, accepted at T>0 with
probability p(token); "probabilistic", a sample from its own q, accepted with min(1, p/q), so a position
is accepted with probability sum_v min(p_v, q_v). Both are exact. "auto" (every command's default)
picks per build from measurement (docs/results.md, "Draft proposals"; benchmarks/draft_sampling.sh):

- CPU build: greedy. Probabilistic proposals raise acceptance at T=1 (+10-13% with the demo's draft at
  batch 1-8), but the draft's probabilities over the vocabulary travel to the rejection sampler on every
  step, making a speculative step 5-23% dearer. From batch 2 up (an RL rollout's batch) neither mode beat
  plain decoding, and greedy was ahead where they differed most (batch 4). At batch 1 probabilistic was
  ahead (1.16x, 1.07x and 1.04x against 1.07x, 0.90x and 0.95x at the policy's own lengths), which a user
  decoding one sequence at a time sets by hand (docs/results.md, "Draft proposals").
- GPU builds: probabilistic. On a GPU that transfer is a small share of a verify step; NeMo RL's
  co-trained DFlash / DSpark recipes propose this way, and the Qwen team's Bebop study kept an MTP
  head's acceptance through RL with it. Measured once (an H200, vLLM 0.26.0, the demo's EAGLE-3 draft at
  T=1, docs/gpu.md): acceptance length 1.36 -> 1.55 at batch 1 and 1.34 -> 1.59 at batch 8; the
  speedups' difference was inside that run's noise (`benchmarks/draft_sampling.sh`).
At T=0 both propose the argmax; the mode only matters at T>0.
"""

from __future__ import annotations

from spectool.constants import DRAFT_SAMPLING
from spectool.engine.compat import is_cpu_build

BY_BUILD = {"cpu": "greedy", "gpu": "probabilistic"}
WHY = {
    "cpu": "auto: the CPU build, where probabilistic proposals measured slower (docs/results.md)",
    "gpu": "auto: a GPU build, where they were accepted 14-19% more often at T=1 (an H200: docs/gpu.md)",
}


def resolve(setting: str) -> tuple[str, str]:
    """(greedy | probabilistic, why): the setting itself, or auto's choice for the installed vLLM build."""
    if setting not in DRAFT_SAMPLING:
        raise ValueError(setting)
    if setting != "auto":
        return setting, "set by the user"

    build = "cpu" if is_cpu_build() else "gpu"
    return BY_BUILD[build], WHY[build]


def describe(setting: str) -> str:
    """"draft proposals <mode> (<why>)" for a setting as the user gave it (auto stays auto): the line train-rl prints
    on either backend, and the TRL integration."""
    return "draft proposals {} ({})".format(*resolve(setting))

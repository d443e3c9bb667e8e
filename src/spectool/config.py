"""Typed configs shared by the workflows; `validate()` names the flag to change."""

from __future__ import annotations

from dataclasses import dataclass

from spectool.errors import SpectoolError

DEFAULT_MODEL = "smollm2-135m"
# Two-term one-digit sums: SmolLM2-135M scores ~0.4 here, a real RL signal (ENVIRONMENT.md).
DEFAULT_DATA = "gym:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1"
# How an EAGLE-3 draft proposes (vLLM's draft_sample_method): its argmax, or a sample from it.
DRAFT_SAMPLING = ("greedy", "probabilistic")
# The engine's share of GPU memory when nothing else runs on the GPU (train-rl has its own default,
# engine.gpu_memory_utilization, that leaves the colocated trainer room). Ignored on the CPU build.
GPU_MEMORY_UTILIZATION = 0.9


@dataclass
class SamplingConfig:
    n_prompts: int = 64  # prompts drawn from the split
    samples: int = 1  # completions per prompt (GRPO's group size)
    max_tokens: int = 128  # cap on generated tokens per completion
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0  # sampling seed (and data seed)

    def validate(self) -> None:
        check(self.n_prompts >= 1, "--n-prompts", self.n_prompts, "must be >= 1")
        check(self.samples >= 1, "--samples", self.samples, "must be >= 1")
        check(1 <= self.max_tokens <= 32768, "--max-tokens", self.max_tokens, "must be in [1, 32768]")
        check(0.0 <= self.temperature <= 10.0, "--temperature", self.temperature, "must be in [0, 10]")
        check(0.0 < self.top_p <= 1.0, "--top-p", self.top_p, "must be in (0, 1]")
        check(self.seed >= 0, "--seed", self.seed, "must be >= 0")
        check(self.temperature > 0 or self.samples == 1, "--samples", self.samples,
              "must be 1 at --temperature 0 (greedy completions of one prompt are identical)")


def check(ok: bool, name: str, value: object, rule: str) -> None:
    """The one validation helper: `name` is the flag (--k) or config key (rollout.group_size) to
    change, `rule` what it must be ("must be >= 1"). Message: "--k=0: must be >= 1"."""
    if not ok:
        raise SpectoolError(f"{name}={value!r}: {rule}")



def check_gpu_memory(value: float, flag: str = "--gpu-memory-utilization") -> None:
    check(0 < value <= 0.98, flag, value, "must be a fraction of the GPU's memory in (0, 0.98]")


def check_draft_sampling(value: str, flag: str = "--draft-sampling") -> None:
    check(value in DRAFT_SAMPLING, flag, value, f"must be one of {', '.join(DRAFT_SAMPLING)}")

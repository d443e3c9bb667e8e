"""verify's settings: the test that speculative sampling is the policy's own, and its lossy controls."""

from __future__ import annotations

from dataclasses import dataclass

from spectool.constants import CONTROLS
from spectool.errors import check
from spectool.settings.data import PolicyData, Rendering, Split
from spectool.settings.engine import EngineSettings, EngineShare
from spectool.settings.groups import validate_groups
from spectool.settings.speculation import Drafter, Proposals


@dataclass(kw_only=True)
class VerifyConfig(PolicyData, Rendering, Split, Drafter, Proposals, EngineSettings, EngineShare):
    draft_model: str | None = None
    """Instead of --draft: a smaller causal LM with the policy's tokenizer (vLLM's draft-model speculation); 'policy'
    drafts with the policy itself (the oracle: its proposals are accepted most, so the acceptance path runs most)."""
    n_prompts: int = 4
    """Prompts for the token-distribution test."""
    samples: int = 300
    """Completions per prompt and arm."""
    positions: int = 6
    """Tokens per completion (each position is tested)."""
    depth: int = 0
    """Test positions this deep into a response: each prompt is first extended by this many tokens of one plain sample
    of the policy (seeded, EOS ignored so every prefix reaches the depth), and the tested positions follow it (e.g.
    2100: past a 2,048-token context, where reasoning-length rollouts sample). 0: the response's first tokens."""
    temperature: float = 1.0
    """Sampling temperature."""
    alpha: float = 0.01
    """Family-wise level: the chance that exact sampling is called NOT LOSSLESS is at most this (Bonferroni over plain's
    and speculative's tests)."""
    logprob_tol: float | None = None
    """Largest |engine - policy| logprob that passes, in both arms: the max over tokens for a float32 engine (default
    1e-3), the mean for a bfloat16 one (default 0.1: its rounding gap, precision.py). Unset with a float32 engine on a
    GPU: 1e-3 where the plain engine is that exact, else the speculative engine's gap is held to the plain engine's
    (verify.LogprobRule, printed with the verdict)."""
    control: str = "auto"
    """Lossy controls, comma-separated (LOSSLESS needs the tests to reject each): auto (unpatched on the CPU build,
    truncated elsewhere) | unpatched (the stock CPU rejection sampler) | offbyone (an acceptance rule off by one; CPU
    build) | truncated (top-p 0.9) | temperature (sampled 10% hotter) | none (power not shown: INCONCLUSIVE at best)."""
    out: str | None = None
    """Run directory for the evidence (verify.json)."""
    seed: int = 0
    """Sampling and data seed."""
    dtype: str = "float32"
    """The engine's precision: float32 (the proof's default on every device: the policy's logprobs are a float32
    forward) | bfloat16 (the precision GPU rollouts serve) | auto."""
    def validate(self) -> None:
        validate_groups(self)
        if self.draft_model is not None:
            check(self.draft is None and self.method == "eagle3", "--draft-model", self.draft_model,
                  "is refused with --draft or --method mtp (one draft per run)")
        check(self.method == "mtp" or bool(self.draft) or self.draft_model is not None, "--draft", self.draft,
              "must name a draft folder (or --draft-model, or --method mtp)")
        check(self.n_prompts >= 1, "--n-prompts", self.n_prompts, "must be >= 1")
        check(self.samples >= 20, "--samples", self.samples, "must be >= 20 (the tests need counts)")
        check(self.positions >= 2, "--positions", self.positions, "must be >= 2 (position 1 is never speculated)")
        check(self.depth >= 0, "--depth", self.depth, "must be >= 0 (tokens of the policy's own sample before the tests)")
        check(0 < self.temperature <= 10, "--temperature", self.temperature, "must be in (0, 10]: greedy needs no test")
        check(0 < self.alpha < 0.5, "--alpha", self.alpha, "must be in (0, 0.5)")
        check(self.logprob_tol is None or self.logprob_tol > 0, "--logprob-tol", self.logprob_tol, "must be > 0")
        names = [c.strip() for c in self.control.split(",")]
        check(all(c in CONTROLS for c in names) and ("none" not in names or len(names) == 1), "--control", self.control,
              f"must be one of {', '.join(CONTROLS)}, or several of them comma-separated (none alone)")

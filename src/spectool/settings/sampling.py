"""How the policy samples: a value every generating stage takes whole (harvest's `sampling`, init-draft's `harvest`,
rollout's `sampling`), its fields flat flags on the command line."""

from __future__ import annotations

from dataclasses import dataclass

from spectool.errors import check
from spectool.settings.spelling import Spell, flag


@dataclass
class SamplingConfig:
    n_prompts: int = 64
    """Number of prompts drawn from the split."""
    samples: int = 1
    """Completions per prompt."""
    max_tokens: int = 128
    """Max generated tokens per completion. The default suits the embedded demo's short answers; reasoning policies
    (DAPO-style math and code) need 4096-16384, or their completions end at this cap (the run prints how many did)."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    seed: int = 0
    """Sampling and data seed."""

    def validate(self, spell: Spell = flag) -> None:
        check(self.n_prompts >= 1, spell("n_prompts"), self.n_prompts, "must be >= 1")
        check(self.samples >= 1, spell("samples"), self.samples, "must be >= 1")
        check(1 <= self.max_tokens <= 32768, spell("max_tokens"), self.max_tokens, "must be in [1, 32768]")
        check(0.0 <= self.temperature <= 10.0, spell("temperature"), self.temperature, "must be in [0, 10]")
        check(0.0 < self.top_p <= 1.0, spell("top_p"), self.top_p, "must be in (0, 1]")
        check(self.seed >= 0, spell("seed"), self.seed, "must be >= 0")
        check(self.temperature > 0 or self.samples == 1, spell("samples"), self.samples,
              f"must be 1 at {spell('temperature')} 0 (greedy completions of one prompt are identical)")

"""rollout's settings: the policy's rollouts on a data split, speculative with a drafter (or a draft model)."""

from __future__ import annotations

from dataclasses import dataclass, field

from spectool.errors import check
from spectool.settings.data import PolicyData, Rendering, Split
from spectool.settings.engine import EngineSettings, EngineShare
from spectool.settings.groups import validate_groups
from spectool.settings.sampling import SamplingConfig
from spectool.settings.speculation import Speculation


@dataclass(kw_only=True)
class RolloutConfig(PolicyData, Rendering, Split, Speculation, EngineSettings, EngineShare):
    out: str | None = None
    """Run directory for the records (optional)."""
    draft_model: str | None = None
    """Instead of --draft: a smaller causal LM with the policy's tokenizer (vLLM's draft-model speculation);
    'policy' drafts with the policy itself, the oracle whose T=1 greedy acceptance bounds every greedy draft's."""
    compare: bool = False
    """Also run plain decoding on the same prompts; print the speedup."""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(n_prompts=32))
    """How the policy samples."""
    acceptance_length: float | None = None
    """What-if timing: accept drafted tokens synthetically at this mean length (lossy; no --out)."""

    def validate(self) -> None:
        validate_groups(self)
        if self.acceptance_length is not None:
            check(self.out is None, "--out", self.out, "is refused with --acceptance-length: synthetic acceptance is "
                  "lossy by design (accepted tokens are the draft's, not the policy's), so its samples are not the "
                  "policy's rollouts and must not become records; drop --out (the speed figures are printed)")
            check((self.draft is not None or self.method == "mtp") and isinstance(self.k, int)
                  and 1 <= self.acceptance_length <= self.k + 1,
                  "--acceptance-length", self.acceptance_length, "needs --draft (or --method mtp) and a number in [1, k + 1]")
        if self.draft_model is not None:
            check(self.draft is None and self.k != "auto" and self.method == "eagle3", "--draft-model", self.draft_model,
                  "is refused with --draft, --method mtp or --k auto (one draft per rollout; a fixed --k)")
        check(not self.compare or self.draft is not None or self.draft_model is not None or self.sweep is not None
              or self.method == "mtp", "--compare", self.compare,
              "needs --draft, --draft-model or --method mtp (or --k auto --sweep RUN)")
        self.sampling.validate()

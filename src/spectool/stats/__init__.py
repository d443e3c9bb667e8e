"""spectool's statistics: what every decision it makes for a user rests on. Pure functions on numbers (no
engine, no model), one module a job:

- here, `AcceptanceStats`: the one definition of speculative acceptance, shared by every command;
- `stats.lossless`: verify's tests (is speculative sampling exactly the policy's?); the method is
  docs/lossless.md's;
- `stats.sweep`: sweep-k's decision (is an arm faster than plain decoding beyond the noise between engine
  runs?); the rows and their English are the command's (commands/sweep_k.py);
- `stats.refresh`: the `auto` refresh's ledger (did a refresh raise acceptance, against the previous draft on
  the same rollouts? what has staleness cost?);
- `stats.distributions`: the normal, chi-square, Student's t and binomial laws they share.

## Acceptance
Built from vLLM's own counters (deltas of `vllm:spec_decode_*` around a generate call), so the
numbers are the engine's, not a re-derivation. Mean acceptance length = 1 + accepted / drafts
(vllm/v1/spec_decode/metrics.py): tokens emitted per target verification step.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AcceptanceStats:
    num_drafts: int = 0  # verification steps that carried draft tokens
    num_draft_tokens: int = 0  # draft tokens proposed
    num_accepted_tokens: int = 0  # draft tokens accepted
    accepted_per_pos: list[int] = field(default_factory=list)  # [k] accepted count at each position

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else float("nan")

    @property
    def per_position_rate(self) -> list[float]:
        """Fraction of drafts whose token at position i (0-based) was accepted."""
        return [a / self.num_drafts if self.num_drafts else float("nan") for a in self.accepted_per_pos]

    def _combine(self, other: "AcceptanceStats", sign: int) -> "AcceptanceStats":
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        a = self.accepted_per_pos + [0] * (n - len(self.accepted_per_pos))
        b = other.accepted_per_pos + [0] * (n - len(other.accepted_per_pos))
        return AcceptanceStats(
            self.num_drafts + sign * other.num_drafts,
            self.num_draft_tokens + sign * other.num_draft_tokens,
            self.num_accepted_tokens + sign * other.num_accepted_tokens,
            [x + sign * y for x, y in zip(a, b)],
        )

    def __sub__(self, other: "AcceptanceStats") -> "AcceptanceStats":
        return self._combine(other, -1)

    def __add__(self, other: "AcceptanceStats") -> "AcceptanceStats":
        return self._combine(other, +1)


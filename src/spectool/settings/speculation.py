"""What drafts the rollouts: the drafter, how many tokens it proposes per verify step, and how.

`Proposals` (k and `DraftSampling`) is taken by every entry point that speculates: the commands, rl.yaml's
`speculation` section, SpectoolSpeculation (whose drafter is its draft's folder), the engine; sweep-k, which times
many k, takes `DraftSampling` alone. `Drafter` (method, draft folder) by verify; `Speculation` is both, with k's other
value, 'auto' (k per batch size from a sweep): rollout and rl.yaml. Which folder a hub id is, a folder's family, a
sweep's schedule: the library's (draft/checkpoint.py, families.py, schedule.py), not these groups'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from spectool.constants import DEFAULT_K, DRAFT_SAMPLING, DRAFTERS, TRAINABLE, check_k
from spectool.errors import check
from spectool.settings.spelling import Spell, flag


@dataclass(kw_only=True)
class DraftSampling:
    """How a draft picks the tokens it proposes (every choice exact: the policy's rejection sampling keeps its own)."""

    draft_sampling: str = "auto"
    """auto: chosen per build by measurement (greedy on the CPU build, probabilistic on GPU builds) | greedy: the
    draft proposes its argmax | probabilistic: it samples from its own distribution (more accepted at T>0). All exact."""

    def validate(self, spell: Spell = flag) -> None:
        check(self.draft_sampling in DRAFT_SAMPLING, spell("draft_sampling"), self.draft_sampling,
              f"must be one of {' | '.join(DRAFT_SAMPLING)}")


@dataclass(kw_only=True)
class Proposals(DraftSampling):
    """How many tokens a draft proposes per verify step, and how it picks them."""

    k: int = DEFAULT_K
    """Draft tokens per verify step (3: the field's measured best for EAGLE-3 in reasoning RL)."""

    auto_k: ClassVar[bool] = False  # whether k may be 'auto' (per batch size from a sweep) at this entry point

    def validate(self, spell: Spell = flag) -> None:
        check_k(self.k, spell("k"), auto=self.auto_k)
        DraftSampling.validate(self, spell)


@dataclass(kw_only=True)
class Drafter:
    """What drafts: a drafter family and its draft folder."""

    method: str = "eagle3"
    """The drafter's family (families.py): eagle3 | peagle | dflash | dspark (GPU builds) with a draft folder | mtp: the
    policy's own MTP layers draft (no draft folder)."""
    draft: str | None = None
    """A draft folder (init-draft or export output) of that family."""

    def validate(self, spell: Spell = flag) -> None:
        check(self.method in DRAFTERS, spell("method"), self.method, f"must be one of {' | '.join(DRAFTERS)}")
        check(self.method != "mtp" or self.draft is None, spell("draft"), self.draft,
              f"is refused with {spell('method')} mtp: the model's own MTP layers draft (its checkpoint holds them); "
              "drop it, or use an EAGLE-3 draft without mtp")


@dataclass(kw_only=True)
class Speculation(Drafter, Proposals):
    """The drafter and its proposals, k per batch size from a sweep too."""

    k: int | str = DEFAULT_K
    """Draft tokens per verify step, or 'auto': per batch size from the sweep (vLLM's dynamic speculation)."""
    sweep: str | None = None
    """A sweep-k or forecast run directory (for k auto)."""

    auto_k: ClassVar[bool] = True

    def validate(self, spell: Spell = flag) -> None:
        Proposals.validate(self, spell)
        Drafter.validate(self, spell)
        check(self.method != "mtp" or self.k != "auto", spell("k"), self.k, "auto reads a sweep's schedule for a draft "
              f"folder (eagle3, peagle, dflash); give a fixed {spell('k')} with {spell('method')} mtp")
        check(self.k != "auto" or self.sweep is not None, spell("sweep"), self.sweep,
              f"must name a sweep-k or forecast run directory with {spell('k')} auto")


def check_trainable(method: str, spell: Spell = flag) -> None:
    """The drafter families spectool trains (init-draft, and train-rl's online refresh): the one rule and its words."""
    check(method in TRAINABLE, spell("method"), method, f"must be one of {' | '.join(TRAINABLE)}"
          + (" (DSpark is trained by speculators on a GPU and served by GPU builds of vLLM)" if method == "dspark" else ""))

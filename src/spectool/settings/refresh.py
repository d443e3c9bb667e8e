"""The online draft refresh's settings: how and when a draft trains beside the policy (rl.yaml's draft_refresh section,
SpectoolSpeculation's `refresh`, DraftRefresher's `settings`). The rule that reads them is draft/refresh_policy.py's."""

from __future__ import annotations

from dataclasses import dataclass

from spectool.constants import DEFAULT_LOSS, LOSSES, MAX_BATCH_TOKENS
from spectool.errors import check
from spectool.settings.spelling import Spell, key

REFRESH_MODES = ("frozen", "online", "auto")


@dataclass
class RefreshSettings:
    """How and when a draft trains online: the one shape of these settings, held by rl.yaml's `draft_refresh`
    section, `SpectoolSpeculation(refresh=...)` in TRL, and `DraftRefresher`; one name and one default each. When a
    refresh is due is draft/refresh_policy.py's (`RefreshPolicy.of`)."""

    mode: str = "online"
    """frozen (the draft stays as loaded) | online (every `every` steps) | auto (when it pays: draft/refresh_policy.py)."""
    every: int = 5
    """online: refresh every N policy steps; auto: the first refresh's step (it measures a refresh's cost)."""
    drop: float = 0.25
    """auto: refresh when acceptance length's gain over 1 fell by this fraction since the last refresh;
    frozen: warn (once) when it fell by this fraction from its best."""
    steps_per_refresh: int = 20
    """Draft optimizer steps per refresh."""
    lr: float = 1e-4
    """The draft's own AdamW learning rate."""
    warmup_steps: int = 10
    """Linear learning-rate warm-up, in draft optimizer steps."""
    ttt_steps: int = 0
    """Draft positions unrolled in training (0: as many as the draft was trained for)."""
    batch_size: int = 16
    """Sequences per draft optimizer step."""
    max_batch_tokens: int = MAX_BATCH_TOKENS
    """Most tokens per forward of a draft optimizer step: its sequences packed into micro-batches within it (no
    padding; a longer one alone), gradients accumulated; the step's memory is linear in it (init-draft's
    --max-batch-tokens). At reasoning lengths, the longest sequence."""
    buffer_seqs: int = 256
    """Sequences of features kept on the host (newest last); the oldest go first."""
    loss: str = DEFAULT_LOSS
    """Per-position loss (draft/loss.py): ce | tv | mix | tv-heavy; init-draft's default."""

    def validate(self, spell: Spell | str = key("draft_refresh.")) -> None:
        """`spell`: how the caller's user spells a field (draft_refresh.mode in rl.yaml, refresh.mode in TRL), or the
        section's prefix as before the groups ("refresh.")."""
        spell = key(spell) if isinstance(spell, str) else spell
        check(self.mode in REFRESH_MODES, spell("mode"), self.mode, f"must be {' | '.join(REFRESH_MODES)}")
        check(self.every >= 1 and self.steps_per_refresh >= 1, spell("every/steps_per_refresh"),
              (self.every, self.steps_per_refresh), "must be >= 1")
        check(0 < self.drop < 1, spell("drop"), self.drop, "must be a fraction in (0, 1)")
        check(0 < self.lr < 1, spell("lr"), self.lr, "must be in (0, 1)")
        check(self.loss in LOSSES, spell("loss"), self.loss, f"must be one of {', '.join(LOSSES)}")
        check(self.max_batch_tokens >= 64, spell("max_batch_tokens"), self.max_batch_tokens, "must be >= 64")
        check(self.warmup_steps >= 0 and self.batch_size >= 1 and self.buffer_seqs >= 1 and self.ttt_steps >= 0,
              spell("warmup_steps/batch_size/buffer_seqs/ttt_steps"),
              (self.warmup_steps, self.batch_size, self.buffer_seqs, self.ttt_steps),
              "must be warmup_steps >= 0, batch_size >= 1, buffer_seqs >= 1, ttt_steps >= 0")

    @property
    def refreshes(self) -> bool:
        return self.mode != "frozen"

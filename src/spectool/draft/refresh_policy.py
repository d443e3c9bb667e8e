"""When to refresh an online draft: on a fixed cadence ("online": every N policy steps) or when it pays
("auto"). The policy moves under RL and its draft goes stale; a refresh costs draft training and a push.
"auto" refreshes after a step when
- acceptance fell: the acceptance length's gain over plain decoding (AL - 1) dropped by `drop` (a
  fraction) from its level on the first step after the last refresh; or
- the generation time lost to staleness since the last refresh reached the refresh's own measured cost.
  A step that generated for g seconds at acceptance length a, against a after the refresh, would have
  taken g * a / a_after with the fresh draft (a verify step emits a tokens, and costs the same), so it
  lost g * (1 - a / a_after). Refreshing when the summed loss equals the cost is the rent-or-buy rule:
  never more than twice the best schedule's cost in hindsight; or
- the last refresh paid for itself: the generation time it saved since (each step: g * (1 - a_before / a),
  a_before the acceptance on the step before it) reached its cost. The draft is still catching up with
  the policy (a draft from another task, a policy moving fast), so another refresh is bought.
Before the first refresh its cost is unknown: auto then also refreshes at step `every` (the fixed cadence's
first refresh), which measures it. A frozen draft is watched: `decayed()` says once when its acceptance gain
(a mean of DECAY_WINDOW steps) fell by `drop` from its best, and names `mode: auto`. Used by train-rl and the
TRL integration; measured against a fixed cadence and a frozen draft in benchmarks/drift.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spectool.constants import DEFAULT_LOSS, LOSSES
from spectool.errors import check

REFRESH_MODES = ("frozen", "online", "auto")
# the drop rule reads a gain (acceptance length - 1) of at least this: below it a step's acceptance is
# within the noise of one batch, and only the time rule applies
MIN_GAIN = 0.1
DECAY_WINDOW = 3  # steps averaged by a frozen draft's watch (one step's acceptance is one batch's)


@dataclass
class RefreshSettings:
    """How and when a draft trains online: the one shape of these settings, held by rl.yaml's `draft_refresh`
    section, `SpectoolSpeculation(refresh=...)` in TRL, and `DraftRefresher`; one name and one default each."""

    mode: str = "online"
    """frozen (the draft stays as loaded) | online (every `every` steps) | auto (when it pays: this module)."""
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
    buffer_seqs: int = 256
    """Sequences of features kept on the host (newest last); the oldest go first."""
    loss: str = DEFAULT_LOSS
    """Per-position loss (draft/loss.py): ce | tv | mix | tv-heavy; init-draft's default."""

    def validate(self, prefix: str = "draft_refresh.") -> None:
        """`prefix`: how the caller's user spells the section ("draft_refresh." in rl.yaml, "refresh." in TRL)."""
        check(self.mode in REFRESH_MODES, prefix + "mode", self.mode, f"must be {' | '.join(REFRESH_MODES)}")
        check(self.every >= 1 and self.steps_per_refresh >= 1, prefix + "every/steps_per_refresh",
              (self.every, self.steps_per_refresh), "must be >= 1")
        check(0 < self.drop < 1, prefix + "drop", self.drop, "must be a fraction in (0, 1)")
        check(0 < self.lr < 1, prefix + "lr", self.lr, "must be in (0, 1)")
        check(self.loss in LOSSES, prefix + "loss", self.loss, f"must be one of {', '.join(LOSSES)}")
        check(self.warmup_steps >= 0 and self.batch_size >= 1 and self.buffer_seqs >= 1 and self.ttt_steps >= 0,
              prefix + "warmup_steps/batch_size/buffer_seqs/ttt_steps",
              (self.warmup_steps, self.batch_size, self.buffer_seqs, self.ttt_steps),
              "must be warmup_steps >= 0, batch_size >= 1, buffer_seqs >= 1, ttt_steps >= 0")

    @property
    def refreshes(self) -> bool:
        return self.mode != "frozen"

    def policy(self) -> "RefreshPolicy":
        return RefreshPolicy(self.mode, self.every, self.drop)


@dataclass
class RefreshPolicy:
    mode: str  # "frozen" (never: watched for decay) | "online" (every `every` steps) | "auto"
    every: int = 5
    drop: float = 0.25
    after: float | None = None  # acceptance length on the first step after the last refresh (or the start)
    lost_s: float = 0.0  # generation seconds lost to staleness since then
    cost_s: float | None = None  # the last refresh's measured seconds (training + push)
    now: float | None = None  # the last step's acceptance length
    since: int = 0  # steps generated since the last refresh (the staleness curve's x: 0 = the fresh draft's)
    reason: str = ""
    before: float | None = None  # acceptance length on the last step before the last refresh
    saved_s: float = 0.0  # generation seconds the last refresh saved since, against `before`
    recent: list[float] = field(default_factory=list)  # the last DECAY_WINDOW steps' acceptance lengths
    best: float | None = None  # the best mean of DECAY_WINDOW steps (the frozen draft's watch)
    warned: bool = False

    def observe(self, acceptance_length: float | None, gen_s: float) -> int:
        """One step's rollouts: their acceptance length (None: nothing drafted) and generation seconds.
        Returns their staleness: the steps generated since the last refresh before them."""
        staleness, self.since = self.since, self.since + 1
        if acceptance_length is None:
            return staleness
        if self.after is None:
            self.after = acceptance_length
        else:
            self.lost_s += gen_s * max(0.0, 1.0 - acceptance_length / self.after)
        if self.before is not None:  # signed: a step that drew worse than before the refresh counts against it
            self.saved_s += gen_s * (1.0 - self.before / acceptance_length)
        self.now = acceptance_length
        self.recent = [*self.recent, acceptance_length][-DECAY_WINDOW:]
        if len(self.recent) == DECAY_WINDOW:
            level = sum(self.recent) / DECAY_WINDOW
            self.best = level if self.best is None else max(self.best, level)
        return staleness

    def due(self, step: int) -> bool:
        """Whether to refresh after policy step `step` (1-based); `reason` says why."""
        self.reason = ""
        if self.mode == "frozen":
            return False
        if self.mode == "online":
            self.reason = f"every {self.every} steps"
            return step % self.every == 0
        if self.cost_s is None and step >= self.every:
            self.reason = f"the first refresh (step {self.every}): measures a refresh's cost"
            return True
        now = self.now
        if self.after is not None and now is not None and self.after - 1 >= MIN_GAIN:
            fell = 1 - (now - 1) / (self.after - 1)
            if fell >= self.drop:
                self.reason = (f"acceptance gain fell {fell:.0%} (length {self.after:.2f} -> {now:.2f}; "
                               f"drop {self.drop:.0%})")
                return True
        if self.cost_s is not None and self.lost_s >= self.cost_s:
            self.reason = f"{self.lost_s:.1f} s of generation lost to staleness >= a refresh's {self.cost_s:.1f} s"
            return True
        if self.cost_s is not None and self.before is not None and self.saved_s >= self.cost_s:
            self.reason = (f"the last refresh saved {self.saved_s:.1f} s of generation >= its {self.cost_s:.1f} s "
                           f"(length {self.before:.2f} before it): the draft is still catching up")
            return True
        return False

    def refreshed(self, cost_s: float) -> None:
        self.before = self.now
        self.cost_s, self.after, self.now, self.lost_s, self.saved_s, self.since = cost_s, None, None, 0.0, 0.0, 0

    def decayed(self, key: str = "draft_refresh.mode") -> str | None:
        """A frozen draft's watch, once per run: the warning when its acceptance gain over plain decoding
        (a mean of DECAY_WINDOW steps) fell by `drop` from its best level, else None. `key`: how the
        caller's user spells the mode setting."""
        if self.mode != "frozen" or self.warned or self.best is None or self.best - 1 < MIN_GAIN:
            return None
        level = sum(self.recent) / len(self.recent)
        fell = 1 - (level - 1) / (self.best - 1)
        if fell < self.drop:
            return None
        self.warned = True
        return (f"the frozen draft's acceptance length fell from {self.best:.2f} to {level:.2f} (mean of "
                f"{DECAY_WINDOW} steps; its gain over plain decoding fell {fell:.0%} >= drop {self.drop:.0%}): the "
                f"policy is moving away from it. {key}: auto refreshes it when that pays")

"""When to refresh an online draft: on a fixed cadence ("online": every N policy steps) or when it pays
("auto"). The policy moves under RL and its draft goes stale; a refresh costs draft training and a push.
"auto" refreshes after a step when either
- acceptance fell: the acceptance length's gain over plain decoding (AL - 1) dropped by `drop` (a
  fraction) from its level on the first step after the last refresh; or
- the generation time lost to staleness since the last refresh reached the refresh's own measured cost.
  A step that generated for g seconds at acceptance length a, against a after the refresh, would have
  taken g * a / a_after with the fresh draft (a verify step emits a tokens, and costs the same), so it
  lost g * (1 - a / a_after). Refreshing when the summed loss equals the cost is the rent-or-buy rule:
  never more than twice the best schedule's cost in hindsight.
Before the first refresh its cost is unknown: auto then also refreshes at step `every` (the fixed cadence's
first refresh), which measures it. Used by train-rl and the
TRL integration; measured against a fixed cadence and a frozen draft in benchmarks/refresh_policy.py.
"""

from __future__ import annotations

from dataclasses import dataclass

REFRESH_MODES = ("frozen", "online", "auto")
# the drop rule reads a gain (acceptance length - 1) of at least this: below it a step's acceptance is
# within the noise of one batch, and only the time rule applies
MIN_GAIN = 0.1


@dataclass
class RefreshPolicy:
    mode: str  # "online" (every `every` steps) | "auto"
    every: int = 5
    drop: float = 0.25
    after: float | None = None  # acceptance length on the first step after the last refresh (or the start)
    lost_s: float = 0.0  # generation seconds lost to staleness since then
    cost_s: float | None = None  # the last refresh's measured seconds (training + push)
    now: float | None = None  # the last step's acceptance length
    since: int = 0  # steps generated since the last refresh (the staleness curve's x: 0 = the fresh draft's)
    reason: str = ""

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
        self.now = acceptance_length
        return staleness

    def due(self, step: int) -> bool:
        """Whether to refresh after policy step `step` (1-based); `reason` says why."""
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
        self.reason = ""
        return False

    def refreshed(self, cost_s: float) -> None:
        self.cost_s, self.after, self.now, self.lost_s, self.since = cost_s, None, None, 0.0, 0

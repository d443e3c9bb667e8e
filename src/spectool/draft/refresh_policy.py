"""When to refresh an online draft: on a fixed cadence ("online": every N policy steps) or when it pays
("auto"). The policy moves under RL and its draft goes stale; a refresh costs draft training, measuring and a push.
"auto" refreshes after a step when one of three rules holds. Rules 1 and 2 read a least-squares line through
the acceptance lengths of the steps since the last refresh (x = 0 on the fresh draft's first step): its level
there, and its slope (< 0: the draft is going stale).
1. acceptance fell: the acceptance length's gain over plain decoding (AL - 1) fell along the line by `drop` (a
   fraction) of its gain at the fresh draft's step, with the slope at its bound; or
2. the generation time lost to staleness since the last refresh reached a refresh's cost, at its bound. A step
   that generated for g seconds at x steps from the fresh draft ran at level + slope * x and would have run at
   `level` with the fresh draft (a verify step emits a tokens, and costs the same), so it lost
   g * (1 - (level + slope * x) / level); signed, so that a draft that holds its level books about 0 (the sum of
   only the steps below the first booked noise as staleness). Refreshing when the summed loss equals the cost is
   the rent-or-buy rule (measured exactly, never more than twice the best schedule's cost in hindsight; the bound
   waits for the loss to clear the noise); or
3. the last refresh paid for itself: the new draft against the previous one on the same newest rollouts (neither
   trained on them; the refresher measures both every step), so that the policy's own movement, which moves both
   drafts alike, is not booked as the refresh's. r = the previous draft's agreement-length gain over the new
   one's (at its upper bound); each step since the refresh would have run at b = 1 + (a - 1) * r with the
   previous draft, so the refresh saved g * (a / b - 1). When that reaches the refresh's cost plus the agreement
   measured every step since (auto's price for knowing it), the draft is still catching up with the policy (a
   draft from another task, a policy moving fast), and another refresh is bought.
The bounds come from stats/refresh.py ("the auto refresh"): one step's acceptance noise is estimated from the run's own
successive steps, rule 3's from the prompts it measured, and the looks at one cycle share a false-refresh budget
REFRESH_ALPHA, so a draft whose acceptance is only noise, or a refresh that bought nothing, refreshes again with
probability at most REFRESH_ALPHA per cycle (benchmarks/refresh_placebo.py measures it).
Before the first refresh its cost is unknown: auto then also refreshes at step `every` (the fixed cadence's
first refresh), which measures it. A frozen draft is watched: `decayed()` says once when its acceptance gain
(a mean of DECAY_WINDOW steps) fell by `drop` from its best, and names `mode: auto`. Used by train-rl and the
TRL integration; measured against a fixed cadence and a frozen draft in benchmarks/drift.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from spectool.settings.refresh import RefreshSettings
from spectool.stats import refresh as ledger
from spectool.stats.distributions import student_t_quantile

# the drop rule reads a gain (acceptance length - 1) of at least this: below it a step's acceptance is
# within the noise of one batch, and only the time rule applies
MIN_GAIN = 0.1
DECAY_WINDOW = 3  # steps averaged by a frozen draft's watch (one step's acceptance is one batch's)
MIN_LINE = 3  # auto's rules 1-2 read a line through at least this many steps of a cycle


@dataclass
class RefreshPolicy:
    mode: str  # "frozen" (never: watched for decay) | "online" (every `every` steps) | "auto"
    every: int = 5
    drop: float = 0.25
    alpha: float = ledger.REFRESH_ALPHA  # auto's false-refresh budget per refresh cycle (stats/refresh.py)
    steps: list[list[float]] = field(default_factory=list)  # [acceptance, generation s] of each step since the
    # last refresh (or the start) that drafted: the first is the fresh draft's
    segments: list[list[float]] = field(default_factory=lambda: [[]])  # acceptance per step, one list per draft
    gain: list[list[float]] = field(default_factory=list)  # [new, previous] agreement-length gain, per prompt
    cost_s: float | None = None  # the last refresh's measured seconds (training, measuring, push)
    watch_s: float = 0.0  # agreement seconds measured since the last refresh (charged to it by rule 3)
    now: float | None = None  # the last step's acceptance length
    since: int = 0  # steps generated since the last refresh (the staleness curve's x: 0 = the fresh draft's)
    reason: str = ""
    ledger: dict = field(default_factory=dict)  # the cycle's books at the last `due` (train-rl logs them)
    recent: list[float] = field(default_factory=list)  # the last DECAY_WINDOW steps' acceptance lengths
    best: float | None = None  # the best mean of DECAY_WINDOW steps (the frozen draft's watch)
    warned: bool = False

    @classmethod
    def of(cls, settings: RefreshSettings) -> "RefreshPolicy":
        """The rule as `settings` configure it, its books empty."""
        return cls(settings.mode, settings.every, settings.drop)

    @classmethod
    def restore(cls, state: dict | None, settings: RefreshSettings) -> "RefreshPolicy":
        """A checkpoint's saved state under the rule as configured now; what an older version saved under
        other names is dropped (its cycle's books start again)."""
        known = {f.name for f in fields(cls)}
        kept = {k: v for k, v in (state or {}).items() if k in known}
        return cls(**{**kept, "mode": settings.mode, "every": settings.every, "drop": settings.drop})

    def observe(self, acceptance_length: float | None, gen_s: float, agreement_s: float = 0.0,
                gain: list[list[float]] | None = None) -> int:
        """One step's rollouts: their acceptance length (None: nothing drafted), generation seconds, the seconds
        the draft's agreement took to measure, and (after a refresh) the new and the previous draft's
        agreement-length gain per prompt of the newest rollouts (DraftRefresher.gain). Returns their staleness:
        the steps generated since the last refresh before them."""
        staleness, self.since = self.since, self.since + 1
        self.watch_s += agreement_s
        self.gain += [list(x) for x in gain or []]
        if acceptance_length is None:
            return staleness
        self.steps.append([acceptance_length, gen_s])
        self.segments[-1] = [*self.segments[-1], acceptance_length][-(ledger.NOISE_WINDOW + 1):]
        self.now = acceptance_length
        self.recent = [*self.recent, acceptance_length][-DECAY_WINDOW:]
        if len(self.recent) == DECAY_WINDOW:
            level = sum(self.recent) / DECAY_WINDOW
            self.best = level if self.best is None else max(self.best, level)
        return staleness

    def books(self) -> ledger.Ledger:
        """The cycle's ledger now: each rule's measurement and its bound at this look (stats/refresh.py)."""
        books, noise = ledger.Ledger(self.cost_s, self.watch_s), ledger.step_noise(self.segments)
        p = ledger.look_alpha(self.alpha / 3, max(self.since, 1))  # each rule's share of this look's budget
        if noise is not None and len(self.steps) >= MIN_LINE:
            sd, df, rho = noise
            t, line = student_t_quantile(1 - p, df), ledger.fit_line([a for a, _ in self.steps], sd, rho)
            books.level, books.slope = line.level, line.slope
            if line.level - 1 >= MIN_GAIN:
                books.fell, books.fell_low = ledger.acceptance_fall(line, len(self.steps) - 1, t)
            books.lost_s, books.lost_low = ledger.staleness_loss(line, [g for _, g in self.steps], t)
        new, previous = [x[0] for x in self.gain], [x[1] for x in self.gain]
        if len(new) >= 2 and sum(new) > 0 and self.steps:
            ratio, se, n = ledger.ratio_of_gains(new, previous)
            books.ratio, books.ratio_high = ratio, ratio + student_t_quantile(1 - p, n - 1) * se
            books.saved_low = ledger.saved_by_refresh([(a, g) for a, g in self.steps], books.ratio_high)
        return books

    def due(self, step: int) -> bool:
        """Whether to refresh after policy step `step` (1-based); `reason` says why, `ledger` holds the books."""
        self.reason = ""
        if self.mode == "frozen":
            return False
        if self.mode == "online":
            self.reason = f"every {self.every} steps"
            return step % self.every == 0
        b = self.books()
        self.ledger = {k: v for k, v in asdict(b).items() if v is not None}
        if self.cost_s is None and step >= self.every:
            self.reason = f"the first refresh (step {self.every}): measures a refresh's cost"
            return True
        if b.fell_low is not None and b.fell_low >= self.drop:
            self.reason = (f"acceptance gain fell {b.fell:.0%}, at least {b.fell_low:.0%} beyond noise (length "
                           f"{b.level:.2f} -> {b.level + b.slope * (len(self.steps) - 1):.2f} along the line since the "
                           f"refresh; drop {self.drop:.0%})")
            return True
        if b.cost_s is not None and b.lost_low is not None and b.lost_low > 0 and b.lost_low >= b.cost_s:
            self.reason = (f"{b.lost_s:.1f} s of generation lost to staleness, at least {b.lost_low:.1f} s beyond "
                           f"noise, >= a refresh's {b.cost_s:.1f} s")
            return True
        if b.cost_s is not None and b.saved_low is not None and b.saved_low > 0 and b.saved_low >= b.cost_s + b.watch_s:
            self.reason = (f"the last refresh saved at least {b.saved_low:.1f} s of generation >= its {b.cost_s:.1f} s "
                           f"+ {b.watch_s:.1f} s of agreement measured since (the previous draft's gain {b.ratio:.2f} of "
                           "the new one's on the same rollouts): the draft is still catching up")
            return True
        return False

    def refreshed(self, cost_s: float) -> None:
        self.cost_s, self.now, self.since, self.watch_s = cost_s, None, 0, 0.0
        self.steps, self.gain = [], []
        self.segments = [*self.segments, []][-ledger.NOISE_WINDOW:]

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

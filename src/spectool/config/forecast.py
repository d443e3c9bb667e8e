"""forecast's settings: the cost model fitted on a sweep, and the RL batch it forecasts."""

from __future__ import annotations

from dataclasses import dataclass, field

from spectool.config.sweep_k import check_lengths
from spectool.errors import check


@dataclass
class ForecastConfig:
    sweep: str = ""
    """sweep-k run (real, or --dummy-weights with synthetic acceptance) to fit the cost model on."""
    method: str = "eagle3"
    """The sweep's speculation method to forecast: eagle3 | peagle | dflash | dspark | draft_model | mtp (the cost model
    charges a parallel drafter one draft forward per verify step; schedule.json: draft-folder families)."""
    out: str | None = None
    """Folder for forecast.json/.csv/.png and schedule.json."""
    acceptance_rates: list[float] | None = None
    """Per-position acceptance (unconditional); default: the sweep's measured (its largest-k rows)."""
    lengths: str = "long-tail"
    """RL batch output lengths: fixed | long-tail | a harvest run directory (at reasoning lengths, a harvest of the
    RL run's own responses: their tail sets the step's time)."""
    max_tokens: int = 1024
    """Cap on the simulated output lengths."""
    batch: int = 512
    """Sequences in one RL batch (prompts x group size)."""
    max_concurrency: int = 256
    """Sequences the engine runs at once."""
    prompt_len: int = 128
    """Prompt tokens of the simulated sequences (the default is a short gym prompt; a chat-templated reasoning
    prompt is several hundred)."""
    ks: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    """Draft lengths to consider."""
    generation_share: float | None = None
    """Generation's share of a synchronous RL step (default 0.66, NeMo RL's)."""
    rl_run: str | None = None
    """A train-rl run whose measured generation share is used."""
    min_gain: float = 0.03
    """Speculate at a batch size only above 1 + this predicted speedup."""

    def validate(self) -> None:
        check(bool(self.sweep), "--sweep", self.sweep, "must name a sweep-k run")
        check(self.method in ("eagle3", "peagle", "dflash", "dspark", "draft_model", "mtp"), "--method", self.method,
              "must be eagle3, peagle, dflash, dspark, draft_model or mtp")
        check(self.generation_share is None or 0 < self.generation_share < 1, "--generation-share",
              self.generation_share, "must be a fraction in (0, 1)")
        check(self.generation_share is None or self.rl_run is None, "--rl-run", self.rl_run,
              "and --generation-share exclude each other")
        r = self.acceptance_rates
        check(r is None or (all(0 <= x <= 1 for x in r) and all(x >= y for x, y in zip(r, r[1:]))),
              "--acceptance-rates", r, "must be non-increasing rates in [0, 1]")
        check(self.batch >= 1 and self.max_concurrency >= 1, "--batch/--max-concurrency",
              (self.batch, self.max_concurrency), "must be >= 1")
        check(self.max_tokens >= 1, "--max-tokens", self.max_tokens, "must be >= 1")
        check_lengths(self.lengths)

"""Where a training run's metrics go besides its metrics.jsonl: init-draft's flags and rl.yaml's top level."""

from __future__ import annotations

from dataclasses import dataclass

from spectool.settings.spelling import Spell, flag
from spectool.trackers import parse


@dataclass(kw_only=True)
class Tracking:
    """Experiment trackers."""

    report_to: str = "none"
    """Experiment trackers that get every metrics.jsonl line at its step, and these settings as the run's config,
    by TRL's report_to names: tensorboard (events in the run folder's tensorboard/) | trackio (project spectool) |
    wandb | none, or a comma-separated list (pip install 'spectool[trackers]' for the first two; docs/rl.md,
    "Experiment trackers"); train-rl's backend trl hands them to GRPOConfig."""

    def validate(self, spell: Spell = flag) -> None:
        parse(self.report_to, spell("report_to"))  # an unknown name or a missing package, before any work

"""Every settings group, and the one call that validates those an entry point's settings are made of."""

from __future__ import annotations

from spectool.settings.data import PolicyData, Rendering, Split
from spectool.settings.engine import EngineSettings, EngineShare
from spectool.settings.refresh import RefreshSettings
from spectool.settings.sampling import SamplingConfig
from spectool.settings.speculation import Drafter, DraftSampling, Proposals, Speculation
from spectool.settings.spelling import Spell, flag
from spectool.settings.tracking import Tracking
from spectool.settings.training import DraftTraining, Features

# the groups an entry point's settings inherit (flat: their fields are its own); SamplingConfig and RefreshSettings
# are taken whole, as one field (rollout's `sampling`, rl.yaml's `draft_refresh` section)
GROUPS = (PolicyData, Rendering, Split, DraftSampling, Proposals, Drafter, Speculation, EngineSettings, EngineShare,
          DraftTraining, Features, Tracking)
WHOLE = (SamplingConfig, RefreshSettings)


def validate_groups(settings: object, spell: Spell = flag) -> None:
    """Every group `settings` inherits, validated in the caller's spelling (a group that extends another validates
    it itself)."""
    for group in GROUPS:
        if isinstance(settings, group) and not any(g is not group and issubclass(g, group) and isinstance(settings, g)
                                                   for g in GROUPS):
            group.validate(settings, spell)

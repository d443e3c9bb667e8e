"""What a user sets to get speculative rollouts inside TRL's GRPOTrainer: the settings alone, validated
(settings.py adds the trainer they build; attach.py and preflight.py read these)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from spectool.constants import DEFAULT_K, DRAFT_SAMPLING, OWN_MTP, check_k
from spectool.draft.checkpoint import draft_folder
from spectool.draft.families import folder_family
from spectool.draft.refresh_policy import RefreshSettings
from spectool.engine.proposals import resolve
from spectool.errors import SpectoolError, check
from spectool.schedule import read_schedule
from spectool.settings import spelling
from spectool.settings.engine import EngineSettings

MTP = OWN_MTP  # SpectoolSpeculation(draft=MTP): the policy's own MTP layers draft


@dataclass
class SpeculationSettings(EngineSettings):
    """Speculative rollouts with a spectool draft inside TRL's GRPOTrainer (colocate mode). The engine's own settings
    (dtype, enforce_eager: settings/engine.EngineSettings, the engine commands' and rl.yaml's too) are keywords
    here; its GPU share and context are GRPOConfig's (vllm_gpu_memory_utilization, vllm_max_model_length)."""

    draft: str | None
    """A spectool draft or export folder (init-draft / export; EAGLE-3, P-EAGLE or DFlash: its family is
    read from the folder), a speculators-format EAGLE-3 folder, or a hub id ORG/NAME of one (read from
    huggingface_hub's cache, offline under HF_HUB_OFFLINE=1), made for the trained policy; "mtp":
    the policy's own MTP layers (a MiMo-layout model); None: plain decoding with spectool's engine
    settings, policy sync and logprob guard (a baseline)."""
    k: int = DEFAULT_K
    """Draft tokens per verify step."""
    draft_sampling: str = "auto"
    """auto (per build by measurement, engine/proposals.py) | greedy | probabilistic: how the draft proposes (all exact)."""
    k_schedule: list[tuple[int, int, int]] | None = None
    """Per batch size k, [(batch_from, batch_to, k)] (sweep-k / forecast's recommendation)."""
    refresh: RefreshSettings = field(default_factory=RefreshSettings)
    """How and when the draft refreshes (spectool.RefreshSettings, rl.yaml's draft_refresh section): mode frozen |
    online (every `every` optimizer steps) | auto, its steps, learning rate, unroll, batch, buffer and loss."""
    seed: int = 0
    """The refresher's sampling seed."""
    policy_sync: str = "auto"
    """auto (spectool's reload on the CPU build and for a mixture-of-experts policy, TRL's own otherwise on a GPU) |
    spectool | trl."""
    logprob_tolerance: float | None = None
    """Max |engine - trainer| logprob after a sync (None: by the engine's dtype, precision.py)."""

    @classmethod
    def from_sweep(cls, sweep: str, draft: str | None = None, draft_sampling: str = "auto",
                   **settings: Any) -> "SpeculationSettings":
        """k per batch size from a sweep-k run (with the draft it measured) or a forecast (give
        the draft); vLLM then picks k by the live batch size as TRL's batch shrinks into its tail."""

        schedule, folder = read_schedule(sweep, draft, resolve(draft_sampling)[0], flag="")
        if max(k for _, _, k in schedule) == 0:
            raise SpectoolError(f"sweep {sweep} recommends no speculation at any batch size; use draft=None")
        return cls(folder, k=max(k for _, _, k in schedule), draft_sampling=draft_sampling, k_schedule=schedule,
                   **settings)

    def resolved(self) -> "SpeculationSettings":
        """A copy whose `draft` is a local folder (a hub id resolved through huggingface_hub's cache,
        draft/checkpoint.draft_folder); the user's settings are not changed."""
        if self.draft in (None, MTP):
            return self
        return replace(self, draft=str(draft_folder(self.draft, "SpectoolSpeculation(draft=...)")))

    @property
    def method(self) -> str:
        """The drafter family: "mtp", the draft folder's (config.json), or eagle3 (also with no draft)."""
        if self.draft == MTP:
            return "mtp"
        return (self.draft and folder_family(self.draft)) or "eagle3"

    def validate(self) -> None:
        check_k(self.k, "k")
        check(self.draft_sampling in DRAFT_SAMPLING, "draft_sampling", self.draft_sampling,
              f"must be one of {', '.join(DRAFT_SAMPLING)}")
        self.refresh.validate("refresh.")
        EngineSettings.validate(self, spelling.keyword)
        check(self.policy_sync in ("auto", "spectool", "trl"), "policy_sync", self.policy_sync,
              "must be auto, spectool or trl")

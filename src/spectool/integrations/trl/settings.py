"""What a user sets to get speculative rollouts inside TRL's GRPOTrainer: the settings alone, validated (trainer.py
adds the trainer they build and how a sweep fills them in; attach.py and preflight.py read these)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

from spectool.constants import OWN_MTP
from spectool.errors import check
from spectool.families import drafter_of
from spectool.settings.engine import EngineSettings
from spectool.settings.refresh import RefreshSettings
from spectool.settings.speculation import Proposals
from spectool.settings.spelling import key, keyword

MTP = OWN_MTP  # SpectoolSpeculation(draft=MTP): the policy's own MTP layers draft


@dataclass
class SpeculationSettings(Proposals, EngineSettings):
    """Speculative rollouts with a spectool draft inside TRL's GRPOTrainer (colocate mode). The proposals (k,
    draft_sampling: settings/speculation.Proposals) and the engine's own settings (dtype, enforce_eager:
    settings/engine.EngineSettings) are the engine commands' and rl.yaml's groups, keywords here; the engine's GPU
    share and context are GRPOConfig's (vllm_gpu_memory_utilization, vllm_max_model_length)."""

    draft: str | None
    """A spectool draft or export folder (init-draft / export; EAGLE-3, P-EAGLE or DFlash: its family is
    read from the folder), a speculators-format EAGLE-3 folder, or a hub id ORG/NAME of one (read from
    huggingface_hub's cache, offline under HF_HUB_OFFLINE=1), made for the trained policy; "mtp":
    the policy's own MTP layers (a MiMo-layout model); None: plain decoding with spectool's engine
    settings, policy sync and logprob guard (a baseline)."""
    _: KW_ONLY  # every other setting by name (k and draft_sampling, the groups', are keywords too)
    k_schedule: list[tuple[int, int, int]] | None = None
    """Per batch size k, [(batch_from, batch_to, k)] (sweep-k / forecast's recommendation:
    SpectoolSpeculation.from_sweep)."""
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

    @property
    def method(self) -> str:
        """The drafter family the draft names (families.drafter_of: "mtp", the folder's, or eagle3)."""
        return drafter_of(self.draft)

    def validate(self) -> None:
        Proposals.validate(self, keyword)
        EngineSettings.validate(self, keyword)
        self.refresh.validate(key("refresh."))
        check(self.policy_sync in ("auto", "spectool", "trl"), "policy_sync", self.policy_sync,
              "must be auto, spectool or trl")

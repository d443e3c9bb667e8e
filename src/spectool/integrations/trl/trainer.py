"""`SpectoolSpeculation`: what a user sets to get speculative rollouts inside TRL's GRPOTrainer (settings.py),
`from_sweep`, which fills them in from a sweep, and `grpo_trainer`, which checks everything up front and builds the
trainer with spectool attached."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from spectool.context import LengthSettings
from spectool.draft.checkpoint import draft_folder
from spectool.engine.proposals import resolve
from spectool.errors import SpectoolError
from spectool.integrations.trl.attach import attach, speculative_llm
from spectool.integrations.trl.internals import check_trl_version
from spectool.integrations.trl.preflight import TRL_LENGTHS, check_args, check_draft, check_lengths, check_memory
from spectool.integrations.trl.settings import MTP, SpeculationSettings
from spectool.schedule import read_schedule

__all__ = ["MTP", "SpectoolSpeculation"]


class SpectoolSpeculation(SpeculationSettings):
    """Speculative rollouts with a spectool draft inside TRL's GRPOTrainer (colocate mode): the
    settings (SpeculationSettings, every field documented there) and the trainer they build."""

    @classmethod
    def from_sweep(cls, sweep: str, draft: str | None = None, draft_sampling: str = "auto",
                   **settings: Any) -> "SpectoolSpeculation":
        """k per batch size from a sweep-k run (with the draft it measured) or a forecast (give
        the draft); vLLM then picks k by the live batch size as TRL's batch shrinks into its tail."""
        schedule, folder = read_schedule(sweep, draft, resolve(draft_sampling)[0], flag="")
        if max(k for _, _, k in schedule) == 0:
            raise SpectoolError(f"sweep {sweep} recommends no speculation at any batch size; use draft=None")
        return cls(folder, k=max(k for _, _, k in schedule), draft_sampling=draft_sampling, k_schedule=schedule,
                   **settings)

    def grpo_trainer(self, trainer_cls=None, **trainer_kwargs):
        """Build TRL's GRPOTrainer (or a subclass) with speculative rollouts; refuses what cannot
        work before anything starts. Returns the trainer, ready for `train()`."""
        from trl import GRPOTrainer  # noqa: PLC0415 (TRL is the optional spectool[trl])

        spec = self.check(**trainer_kwargs)
        with speculative_llm(spec):
            trainer = (trainer_cls or GRPOTrainer)(**trainer_kwargs)
        attach(spec, trainer)
        return trainer

    def resolved(self) -> "SpectoolSpeculation":
        """These settings with a hub id's draft as its cached folder (`resolve_draft`); the user's are not changed."""
        return resolve_draft(self)

    def check(self, names: LengthSettings = TRL_LENGTHS, **trainer_kwargs) -> SpeculationSettings:
        """Everything grpo_trainer refuses, before anything starts (train-rl --backend trl asks it before claiming its
        run folder: a refused run writes nothing); `names`: the length settings the refusals name. Returns the
        settings resolved (a hub id's draft as its cached folder, for every check and the engine)."""
        check_trl_version()
        self.validate()
        spec = self.resolved()
        args = trainer_kwargs.get("args")
        check_args(args)
        if spec.draft is not None:
            check_draft(spec, trainer_kwargs.get("model"), args)
        check_lengths(spec, trainer_kwargs.get("model"), args, names, trainer_kwargs)  # against the context
        if torch.cuda.is_available():  # before TRL puts the policy or the engine on the GPU
            check_memory(spec, args, trainer_kwargs)
        return spec


def resolve_draft(spec: SpeculationSettings) -> SpeculationSettings:
    """A copy whose `draft` is a local folder (a hub id resolved through huggingface_hub's cache,
    draft/checkpoint.draft_folder); the user's settings are not changed."""
    if spec.draft in (None, MTP):
        return spec
    return replace(spec, draft=str(draft_folder(spec.draft, "SpectoolSpeculation(draft=...)")))

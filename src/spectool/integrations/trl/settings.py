"""`SpectoolSpeculation`: what a user sets to get speculative rollouts inside TRL's GRPOTrainer
(speculation.py), and `grpo_trainer`, which checks everything up front and builds the trainer with
spectool attached."""

from __future__ import annotations

import torch

from spectool.context import LengthSettings
from spectool.integrations.trl.attach import attach, speculative_llm
from spectool.integrations.trl.internals import check_trl_version
from spectool.integrations.trl.preflight import TRL_LENGTHS, check_args, check_draft, check_lengths, check_memory
from spectool.integrations.trl.speculation import MTP, SpeculationSettings

__all__ = ["MTP", "SpectoolSpeculation"]


class SpectoolSpeculation(SpeculationSettings):
    """Speculative rollouts with a spectool draft inside TRL's GRPOTrainer (colocate mode): the
    settings (SpeculationSettings, every field documented there) and the trainer they build."""

    def grpo_trainer(self, trainer_cls=None, **trainer_kwargs):
        """Build TRL's GRPOTrainer (or a subclass) with speculative rollouts; refuses what cannot
        work before anything starts. Returns the trainer, ready for `train()`."""
        from trl import GRPOTrainer  # noqa: PLC0415 (TRL is the optional spectool[trl])

        spec = self.check(**trainer_kwargs)
        with speculative_llm(spec):
            trainer = (trainer_cls or GRPOTrainer)(**trainer_kwargs)
        attach(spec, trainer)
        return trainer

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



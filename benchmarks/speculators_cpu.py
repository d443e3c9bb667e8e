"""speculators 0.9's own trainer (`speculators train`), run on a CPU-only machine.

Its Trainer moves the model and every batch to the local rank (an int: CUDA device 0) and autocasts
on "cuda" when torch reports no accelerator (speculators/train/trainer.py:221-228), and its step
timer synchronizes the accelerator (trainer.py:80). On a machine without one all three fail before
the first step. This runs the same `speculators.train.cli.main` with the local rank read as "cpu",
the autocast device "cpu" and the synchronize a no-op (there is nothing to wait for); nothing else
of the trainer changes (its loss, optimizer, scheduler, packing, checkpoints).

    .venv/bin/python benchmarks/speculators_cpu.py --verifier-name-or-path <policy> --data-path <data> \
        --speculator-type eagle3 --save-path <out> ...      # every flag of `speculators train`
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    import speculators.train.trainer as trainer
    import torch
    from speculators.train.cli import main as train
    from speculators.train.config import TrainConfig

    if torch.accelerator.is_available():
        raise SystemExit("an accelerator is present: run `speculators train` itself")
    torch.accelerator.synchronize = lambda *args, **kwargs: None
    trainer.get_local_rank = lambda: "cpu"
    init = trainer.Trainer.__init__

    def cpu_init(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self.device_type = "cpu"  # autocast's device (the model and batches follow the local rank)

    trainer.Trainer.__init__ = cpu_init
    train(TrainConfig.resolve(argv))


if __name__ == "__main__":
    main(sys.argv[1:])

"""Every name of TRL's that is not its public API, in one place, with the TRL releases they were read from
(TESTED_TRL; `missing()` checks them against the installed TRL, tests/test_trl_e2e.py runs it). Elsewhere the
integration uses TRL only through these functions and its public classes (GRPOConfig, GRPOTrainer,
TrainerCallback)."""

from __future__ import annotations

import inspect
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import Any

from spectool.engine.compat import parse_version
from spectool.errors import SpectoolError

TESTED_TRL = ("1.16.0", "1.17.0")  # [from, to): the releases this integration was run against
# trl.generation.vllm_generation.VLLMGeneration: the colocated engine's owner, and the methods spectool wraps
VLLM_GENERATION_METHODS = ("sync_weights", "generate", "_iter_named_params")


def check_trl_version(version: str | None = None) -> str:
    """The installed TRL, refused outside TESTED_TRL with the range and the install command."""

    try:
        version = version or dist_version("trl")
    except PackageNotFoundError:
        raise SpectoolError("TRL is not installed: pip install 'spectool[trl]'") from None
    lo, hi = (parse_version(v) for v in TESTED_TRL)
    if not lo <= parse_version(version) < hi:
        raise SpectoolError(f"TRL {version} is outside the versions spectool's TRL integration was tested with "
                            f"(>= {TESTED_TRL[0]}, < {TESTED_TRL[1]}): pip install 'spectool[trl]'")
    return version



def llm_module():
    """The module whose `LLM` name TRL calls to build its colocated engine (patched while the trainer is built)."""
    import trl.generation.vllm_generation as module  # noqa: PLC0415 (TRL is the optional spectool[trl])

    return module


def vllm_generation(trainer) -> Any:
    """The trainer's colocated-generation object (GRPOTrainer.vllm_generation): its `llm`, `sync_weights`, `generate`."""
    return trainer.vllm_generation


def named_params(generation) -> Any:
    """TRL's own walk over the policy's parameters for a weight sync (it gathers FSDP/DeepSpeed shards and merges PEFT
    adapters): (name, tensor) pairs, each valid while it is yielded."""
    return generation._iter_named_params()


def wrap_named_params(generation, fn) -> None:
    """Make TRL's parameter walk yield `fn(its pairs)`, for TRL's own sync and spectool's alike."""
    walk = generation._iter_named_params
    generation._iter_named_params = lambda: fn(walk())


def policy_model(generation) -> Any:
    """The policy VLLMGeneration syncs (`.model`: the trainer's, possibly wrapped by accelerate or PEFT)."""
    return generation.model


def log_metric(trainer, key: str, value: float) -> None:
    """Into TRL's own metrics (GRPOTrainer._metrics["train"]): averaged and logged with TRL's at its next log step."""
    trainer._metrics["train"][key].append(float(value))


def missing() -> list[str]:
    """The private names above that the installed TRL lacks (empty within TESTED_TRL)."""

    from trl import GRPOTrainer  # noqa: PLC0415 (TRL is the optional spectool[trl])

    gone = [f"VLLMGeneration.{m}" for m in VLLM_GENERATION_METHODS if not hasattr(llm_module().VLLMGeneration, m)]
    if not hasattr(llm_module(), "LLM"):
        gone.append("trl.generation.vllm_generation.LLM")
    init = inspect.getsource(GRPOTrainer.__init__)
    gone += [f"GRPOTrainer.{a}" for a in ("_metrics", "vllm_generation") if f"self.{a}" not in init]
    return gone

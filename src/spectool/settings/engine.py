"""The engine's settings: what every vLLM engine spectool starts is given, whichever entry point starts it.

`EngineSettings` is taken by all of them: the engine commands' flags, rl.yaml's `engine` section and
SpectoolSpeculation. `EngineShare` (the engine's GPU share and context) by the commands and rl.yaml; inside TRL's
GRPOTrainer those two are TRL's own (GRPOConfig's vllm_gpu_memory_utilization and vllm_max_model_length), so
SpectoolSpeculation does not repeat them. A field added here is a flag of every engine command, a key of rl.yaml's
engine section and (EngineSettings) a keyword of SpectoolSpeculation, and reaches engine.EngineConfig by its name
(`engine_kwargs`); the engine area says what vLLM makes of it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from spectool.constants import ENGINE_DTYPES, GPU_MEMORY_UTILIZATION, GPU_SHARE_MAX
from spectool.errors import check
from spectool.settings.spelling import Spell, flag


@dataclass(kw_only=True)
class EngineSettings:
    """How the engine computes: every entry point that starts an engine takes these."""

    dtype: str = "auto"
    """The engine's precision: auto (float32 on the CPU build; on a GPU bfloat16, float16 below compute
    capability 8.0) | float32 | bfloat16 | float16."""
    enforce_eager: bool = False
    """True: no torch.compile in the engine (a faster start, a slower decode: on 2 CPU cores a SmolLM2 engine starts
    in about 7 s instead of 35-110 s and decodes about 35% slower). False: the engine's default, compiled unless
    $SPECTOOL_ENFORCE_EAGER=1 (the engine reads it: every engine of the run, whichever entry point)."""

    def validate(self, spell: Spell = flag) -> None:
        check(self.dtype in ENGINE_DTYPES, spell("dtype"), self.dtype, f"must be one of {' | '.join(ENGINE_DTYPES)}")
        check(isinstance(self.enforce_eager, bool), spell("enforce_eager"), self.enforce_eager, "must be true or false")


@dataclass(kw_only=True)
class EngineShare:
    """What the engine may take: its share of the GPU's memory and its context."""

    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    """GPU only: the engine's share of GPU memory (weights + KV cache). Lower it if another process shares the GPU."""
    max_model_len: int | None = None
    """The engine's context (vLLM's max_model_len). Unset: derived, what the run needs (its longest prompt + the most
    tokens it generates: its max tokens; verify's depth + positions; export's check), refused before the engine
    starts when past the model's limit; a value shorter than the run needs is refused."""

    def validate(self, spell: Spell = flag) -> None:
        check(0 < self.gpu_memory_utilization <= GPU_SHARE_MAX, spell("gpu_memory_utilization"),
              self.gpu_memory_utilization, f"must be a fraction of the GPU's memory in (0, {GPU_SHARE_MAX}]")
        check(self.max_model_len is None or self.max_model_len >= 1, spell("max_model_len"), self.max_model_len,
              "must be >= 1 (or unset: what the run needs)")


def values(settings: object, group: type) -> dict[str, Any]:
    """`group`'s fields as `settings` (an entry point's settings that take the group) holds them, by name."""
    return {f.name: getattr(settings, f.name) for f in fields(group)}


def engine_kwargs(settings: object) -> dict[str, Any]:
    """engine.EngineConfig's keywords from `settings`' engine groups, by name: every field but the context, which
    the command first resolves against what the run needs (context.resolve_max_model_len), and enforce_eager unless
    it is asked for."""
    out = {k: v for group in (EngineSettings, EngineShare) if isinstance(settings, group)
           for k, v in values(settings, group).items()}
    out.pop("max_model_len", None)
    if not out.get("enforce_eager", True):
        out.pop("enforce_eager")  # not asked for: the engine's default ($SPECTOOL_ENFORCE_EAGER), as before the groups
    return out

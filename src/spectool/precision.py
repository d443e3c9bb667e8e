"""One dtype policy for the engine, the trainer and the draft (README, "Precision").

              engine (vLLM)   trainer (policy)                        draft training     logprob check
  CPU build   float32         float32                                 float32            |diff| <= 0.01
  GPU         bfloat16        float32 weights, bfloat16 autocast      float32            |diff| <= 0.25
                              forward (the engine's matmul precision)

On CPU bf16 is several times slower (no bf16 units here), so everything is float32 and the engine's
logprobs equal a transformers forward to ~1e-6. On a GPU the engine serves bfloat16 (vLLM's default
for these checkpoints); the trainer keeps float32 weights and optimizer state and runs its forward
under bfloat16 autocast, so its logprobs (the GRPO ratio and the engine check) are computed at the
precision the engine sampled with. `engine.dtype: float32` serves float32 on a GPU too (tolerance
0.01). Draft features are cached as float16 on both.
"""

from __future__ import annotations

import contextlib

import torch

ENGINE_DTYPES = ("auto", "float32", "bfloat16")
# max |engine - trainer| logprob of a sampled token when the weights are in sync, by engine dtype
LOGPROB_TOLERANCE = {"float32": 0.01, "bfloat16": 0.25}


def on_gpu() -> bool:
    return torch.cuda.is_available()


def engine_dtype(setting: str = "auto") -> str:
    """The dtype the engine serves: `setting`, or by device when "auto"."""
    if setting != "auto":
        return setting
    return "bfloat16" if on_gpu() else "float32"


def logprob_tolerance(setting: float | None, dtype: str) -> float:
    """The engine check's tolerance: the user's, or the one that goes with the engine's dtype."""
    return setting if setting is not None else LOGPROB_TOLERANCE[dtype]


def trainer_autocast(dtype: str, device: torch.device):
    """The trainer's forward context: bfloat16 autocast on a GPU whose engine serves bfloat16."""
    if dtype == "bfloat16" and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()

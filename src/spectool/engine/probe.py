"""The draft probe: a check that the engine's drafter holds the weights the trainer holds, in the
engine's own dtype (bfloat16 on a GPU, float32 on the CPU build).

Both sides apply every linear layer of the draft to the same fixed probe vector and sum the
output; other float parameters (norms) are summed directly. The engine side runs inside vLLM's
worker (worker_ext.spectool_draft_probe, vLLM module names, fused layers as vLLM fuses them); the
trainer side is `Eagle3Draft.vllm_probe`. A module's two sums agree within the rounding of the
engine's dtype: each output element is rounded once (eps/2 relative) on each side, and the
accumulation in float32 adds at most ~sqrt(K) float32 eps of the absolute terms. Pure torch: no
vLLM import here, so the trainer side can use it anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
F32_SLACK = 64  # float32 eps multiples of the absolute terms: accumulation order differs between kernels


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    return dtype if isinstance(dtype, torch.dtype) else DTYPES[str(dtype).removeprefix("torch.")]


def probe_input(in_features: int, dtype: str | torch.dtype, device="cpu") -> torch.Tensor:
    """The probe vector of a layer with `in_features` inputs: seeded by the width, so both sides
    draw the same one. [1, in_features] in `dtype`."""
    g = torch.Generator().manual_seed(7_919 + in_features)
    return torch.randn(1, in_features, generator=g).to(torch_dtype(dtype)).to(device)


@dataclass
class Expected:
    """The trainer side of one module: the sum the engine should report and its tolerance."""

    value: float
    tol: float


def linear_expected(weights: list[torch.Tensor], dtype: str | torch.dtype) -> Expected:
    """A (possibly fused: q,k,v or gate,up stacked on the output) linear layer without bias.
    weights: each [out_i, in] (the same input width)."""
    dt = torch_dtype(dtype)
    x = probe_input(weights[0].shape[1], dt)  # [1, in]
    value = tol = 0.0
    for w in weights:
        w = w.detach().cpu()
        y = torch.nn.functional.linear(x, w.to(dt)).double()  # [1, out_i]
        absolute = (x.double().abs() @ w.to(dt).double().abs().T).sum()  # sum of |w_ij x_j|
        value += float(y.sum())
        rounding = 2 * torch.finfo(dt).eps * float(y.abs().sum()) if dt != torch.float32 else 0.0
        tol += rounding + F32_SLACK * torch.finfo(torch.float32).eps * float(absolute)
    return Expected(value, tol)


def param_expected(p: torch.Tensor, dtype: str | torch.dtype) -> Expected:
    """A parameter the engine keeps as it is (norm weights), summed after rounding to `dtype`."""
    q = p.detach().cpu().to(torch_dtype(dtype)).double()
    return Expected(float(q.sum()), 1e-9 * float(q.abs().sum()) + 1e-12)


@dataclass
class ProbeCheck:
    ok: bool
    max_excess: float  # largest |engine - trainer| / tolerance over the modules (<= 1 when ok)
    modules: int  # modules compared
    mismatched: list[str] = field(default_factory=list)  # modules outside tolerance
    missing: list[str] = field(default_factory=list)  # trainer-side modules the engine did not report


def engine_sums(per_rank: list[dict]) -> dict[str, float]:
    """Combine the per-rank reports of worker_ext.spectool_draft_probe: shards of column-parallel
    outputs add up; replicated modules are read from rank 0."""
    total: dict[str, float] = {}
    for rank, report in enumerate(per_rank):
        for name, (value, kind) in report.items():
            if kind == "shard":
                total[name] = total.get(name, 0.0) + value
            elif rank == 0:
                total[name] = value
    return total


def compare(engine: dict[str, float], expected: dict[str, Expected]) -> ProbeCheck:
    """Every trainer-side module against the engine's sum (modules vLLM builds but never loads,
    such as a deeper layer's unused hidden_norm, are not compared)."""
    missing = sorted(n for n in expected if n not in engine)
    excess = {n: abs(engine[n] - e.value) / e.tol for n, e in expected.items() if n in engine}
    bad = sorted(n for n, x in excess.items() if not x <= 1.0)  # NaN counts as a mismatch
    worst = max(excess.values(), default=float("inf"))
    return ProbeCheck(not bad and not missing and bool(excess), worst, len(excess), bad, missing)


def distinguishes(old: dict[str, Expected], new: dict[str, Expected]) -> bool:
    """Whether the check could tell the old draft from the new one (it has power), i.e. some
    module's sums differ by more than the tolerance: else a reload that did not take would pass."""
    return any(abs(old[n].value - e.value) > e.tol for n, e in new.items() if n in old)

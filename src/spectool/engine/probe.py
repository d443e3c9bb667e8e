"""The draft probe: a check that the engine's drafter holds the weights the trainer holds, in the
engine's own dtype (bfloat16 on a GPU, float32 on the CPU build).

Both sides apply every linear layer of the draft to the same fixed probe vector and report two
statistics of the output y: sum(y) and sum(y^2) (the sum cancels, so in bfloat16 it only sees
large changes; the sum of squares does not cancel and sees a relative weight change of about the
dtype's eps). Other float parameters (norms) are reported the same way, directly. The engine side runs inside vLLM's
worker (worker_ext.spectool_draft_probe, vLLM module names, fused layers as vLLM fuses them); the
trainer side is `Eagle3Draft.vllm_probe`. A module's two sums agree within the rounding of the
engine's dtype: each output element is rounded once (eps/2 relative) on each side, and the
accumulation in float32 adds a few float32 eps of the absolute terms. Pure torch: no
vLLM import here, so the trainer side can use it anywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
F32_SLACK = 64  # float32 eps multiples of the absolute terms: accumulation order differs between kernels


# torch lets cuBLAS reduce split-K sums of bfloat16 and float16 matmuls in that precision (both True by default)
REDUCED_PRECISION_FLAGS = ("allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction")


@contextlib.contextmanager
def float32_reductions() -> Iterator[None]:
    """The engine side's matmuls with float32 reductions, as the probe's bound assumes: a bfloat16 or float16 (the
    engine's dtype below compute capability 8.0) reduction could exceed it on a draft that is in sync. Each flag is
    restored to what it was after."""
    matmul = torch.backends.cuda.matmul
    saved = {flag: getattr(matmul, flag) for flag in REDUCED_PRECISION_FLAGS}
    try:
        for flag in REDUCED_PRECISION_FLAGS:
            setattr(matmul, flag, False)
        yield
    finally:
        for flag, value in saved.items():
            setattr(matmul, flag, value)


def shared_lm_head(target: torch.nn.Module) -> torch.nn.Module | None:
    """The target's lm_head vLLM compares a draft's with, and serves the draft with when they are equal: a multimodal
    target's language model's (`get_language_model()`, as llm_base_proposer.load_model and the V2 runner take it;
    a `*ForConditionalGeneration` has no lm_head of its own), else the target's own; and where that language model
    has none, the target's top-level lm_head, as the V2 runner falls back to it (v1/worker/gpu/spec_decode/eagle/
    utils.py:28-33,83-89@0.26, :37-42,98-110@0.33; in 0.33 muse_glimmer.py's target is such a one). None when there
    is none. The worker compares by identity, so the fallback protects the policy's head on V2 and changes nothing
    on V1, whose draft never holds that head."""
    language = target.get_language_model() if callable(getattr(target, "get_language_model", None)) else target
    head = getattr(language, "lm_head", None)
    return head if head is not None else getattr(target, "lm_head", None)


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    return dtype if isinstance(dtype, torch.dtype) else DTYPES[str(dtype).removeprefix("torch.")]


def probe_input(in_features: int, dtype: str | torch.dtype, device="cpu") -> torch.Tensor:
    """The probe vector of a layer with `in_features` inputs: seeded by the width, so both sides
    draw the same one. [1, in_features] in `dtype`."""
    g = torch.Generator().manual_seed(7_919 + in_features)
    return torch.randn(1, in_features, generator=g).to(torch_dtype(dtype)).to(device)


def stats(y: torch.Tensor) -> list[float]:
    """The two statistics both sides report of a module's output (or a parameter)."""
    y = y.double()
    return [float(y.sum()), float((y * y).sum())]


@dataclass
class Expected:
    """The trainer side of one module: the statistics the engine should report, with tolerances."""

    value: list[float]  # [sum, sum of squares]
    tol: list[float]


def linear_expected(weights: list[torch.Tensor], dtype: str | torch.dtype,
                    biases: list[torch.Tensor] | None = None) -> Expected:
    """A (possibly fused: q,k,v or gate,up stacked on the output) linear layer, with or without
    biases. weights: each [out_i, in] (the same input width); biases: each [out_i]."""
    dt = torch_dtype(dtype)
    x = probe_input(weights[0].shape[1], dt)  # [1, in]
    eps = torch.finfo(dt).eps if dt != torch.float32 else 0.0  # output rounding beyond float32's
    value, tol = [0.0, 0.0], [0.0, 0.0]
    for i, w in enumerate(weights):
        w = w.detach().cpu().to(dt)
        b = None if biases is None else biases[i].detach().cpu().to(dt)
        y = torch.nn.functional.linear(x, w, b).double()  # [1, out_i]
        accum = F32_SLACK * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().T
                                                              + (0 if b is None else b.double().abs()))  # [1, out_i]
        err = eps * y.abs() + accum  # |engine y - trainer y| per element, bound
        for i, v in enumerate(stats(y)):
            value[i] += v
        tol[0] += float(err.sum())
        tol[1] += float((2 * y.abs() * err + err * err).sum())
    return Expected(value, tol)


def output_expected(w: torch.Tensor, x: torch.Tensor, dtype: str | torch.dtype) -> Expected:
    """A linear layer's output on a given input x [in] (not the probe vector), as the engine
    computed and kept it in `dtype`: w [out, in]. Same bounds as linear_expected."""
    dt = torch_dtype(dtype)
    w, x = w.detach().cpu().to(dt), x.detach().cpu().to(dt).reshape(1, -1)
    y = torch.nn.functional.linear(x, w).double()  # [1, out]
    eps = torch.finfo(dt).eps if dt != torch.float32 else 0.0
    err = eps * y.abs() + F32_SLACK * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().T)
    return Expected(stats(y), [float(err.sum()), float((2 * y.abs() * err + err * err).sum())])


def param_expected(p: torch.Tensor, dtype: str | torch.dtype) -> Expected:
    """A parameter the engine keeps as it is (norm weights), after rounding to `dtype`."""
    q = p.detach().cpu().to(torch_dtype(dtype)).double()
    return Expected(stats(q), [1e-9 * float(q.abs().sum()) + 1e-12, 1e-9 * float((q * q).sum()) + 1e-12])


@dataclass
class ProbeCheck:
    ok: bool
    max_excess: float  # largest |engine - trainer| / tolerance over the modules (<= 1 when ok)
    modules: int  # modules compared
    mismatched: list[str] = field(default_factory=list)  # modules outside tolerance
    missing: list[str] = field(default_factory=list)  # trainer-side modules the engine did not report


def engine_sums(per_rank: list[dict]) -> dict[str, list[float]]:
    """Combine the per-rank reports of worker_ext.spectool_draft_probe ({name: [sum, sum of
    squares, kind]}): shards of column-parallel outputs add up; replicated modules are read from
    rank 0."""
    total: dict[str, list[float]] = {}
    for rank, report in enumerate(per_rank):
        for name, (s1, s2, kind) in report.items():
            if kind == "shard":
                t = total.setdefault(name, [0.0, 0.0])
                t[0], t[1] = t[0] + s1, t[1] + s2
            elif rank == 0:
                total[name] = [s1, s2]
    return total


def _excess(got: list[float], e: Expected) -> float:
    return max(abs(g - v) / t for g, v, t in zip(got, e.value, e.tol))


def compare(engine: dict[str, list[float]], expected: dict[str, Expected]) -> ProbeCheck:
    """Every trainer-side module against the engine's statistics (modules vLLM builds but never
    loads, such as a deeper layer's unused hidden_norm, are not compared)."""
    missing = sorted(n for n in expected if n not in engine)
    excess = {n: _excess(engine[n], e) for n, e in expected.items() if n in engine}
    bad = sorted(n for n, x in excess.items() if not x <= 1.0)  # NaN counts as a mismatch
    worst = max(excess.values(), default=float("inf"))
    return ProbeCheck(not bad and not missing and bool(excess), worst, len(excess), bad, missing)


def distinguishes(old: dict[str, Expected], new: dict[str, Expected]) -> bool:
    """Whether the check could tell the old draft from the new one (it has power), i.e. some
    module's sums differ by more than the tolerance: else a reload that did not take would pass."""
    return any(_excess(old[n].value, e) > 1 for n, e in new.items() if n in old)

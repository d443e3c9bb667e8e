"""What a process does once before it forks engine processes on the CPU build: importing this module runs `warm()`.

A forkserver's preload can only import modules (`compat.warm_imports` names this one for sweep-k's arms and verify's
kernel control), and the test suite's CLI zygote imports it too. Each engine process forked afterwards inherits:
- the engine's worker modules, already imported (`vllm.v1.worker.cpu_worker` and everything it imports);
- torch's compiler stack (dynamo, inductor) loaded and used once: vLLM's `torch.compile`d sampler op
  (`batched_count_greater_than`, which ranks the sampled token's logprob at every step) is run once, called as vLLM's
  sampler calls it (batch dimension unbacked), and the compiled code is then dropped (`torch._dynamo.reset`): torch
  guards compiled code on the thread count, so a child at its own compiles the op anyway, and now compiles exactly
  what a cold engine compiles, without the cold stack;
- a frozen heap (`gc.freeze`), which the collections vLLM runs while it starts no longer walk.
Measured (`SPECTOOL_ENFORCE_EAGER=1 benchmarks/arm_starts.py`, docs/architecture.md "Engine processes"): an eager
engine run forked after this 8.9 s against 15.9 s forked after the imports alone and 25.6 s fresh (2026-11-29).

Fork safety: all of it runs at one thread with inductor compiling in-process, so the process forks with no OpenMP
worker thread and no compile pool: a child's OpenMP team is its own (the one native thread that appears, found with
gdb, is OpenCV's bundled OpenBLAS server, started when vLLM's worker imports load it, as in any process that imports
them). torch's random state is restored after the warm-up. Every step is an optimisation only: a vLLM that names these
otherwise is skipped.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import time

import torch
import torch._inductor.config as inductor

from spectool.engine.compat import is_cpu_build

log = logging.getLogger(__name__)

WORKER_MODULES = ("vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner")


def _ranks_args(logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """batched_count_greater_than's arguments as vLLM's sampler passes them: logprobs [batch, vocab] and the sampled
    token's [batch, 1], the batch dimension of both marked unbacked (vllm/v1/sample/sampler.py)."""
    token = logprobs[:, :1].clone()
    torch._dynamo.decorators.mark_unbacked(logprobs, 0)
    torch._dynamo.decorators.mark_unbacked(token, 0)
    return logprobs, token


# (module, op, its arguments from logprobs [batch, vocab] float32)
COMPILED_OPS = (("vllm.v1.sample.ops.logprobs", "batched_count_greater_than", _ranks_args),)


def warm(worker_modules: tuple[str, ...] = WORKER_MODULES, compiled_ops: tuple = COMPILED_OPS) -> float:
    """Import the worker modules and run each compiled op once at one thread (its compiled code then dropped), freeze
    the heap; the seconds it took."""
    started = time.monotonic()
    threads, compile_threads = torch.get_num_threads(), inductor.compile_threads
    torch.set_num_threads(1)
    inductor.compile_threads = 1
    try:
        for name in worker_modules:
            _try(importlib.import_module, name)
        with torch.random.fork_rng(devices=[]), torch.inference_mode():  # as the engine's sampler runs
            for module, attr, args in compiled_ops:
                op = _try(_op, module, attr)
                if op is not None:
                    _try(op, *args(torch.randn(3, 1000).log_softmax(-1)))
        torch._dynamo.reset()  # no compiled code inherited: a child compiles what a cold engine compiles
    finally:
        torch.set_num_threads(threads)
        inductor.compile_threads = compile_threads
    gc.collect()
    gc.freeze()
    return time.monotonic() - started


def _op(module: str, attr: str):
    return getattr(importlib.import_module(module), attr)


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - an optimisation: a build without this op starts as before
        log.debug("prefork: %s%s skipped: %r", getattr(fn, "__name__", fn), args[:1], e)
        return None


# SPECTOOL_PREFORK=0: no warm-up (to rule it out); a GPU build forks no engine process (compat.warm_imports)
SECONDS = warm() if os.environ.get("SPECTOOL_PREFORK") != "0" and is_cpu_build() else 0.0

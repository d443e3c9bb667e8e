"""What a process does once before it forks engine processes on the CPU build: importing this module runs `warm()`.

A forkserver's preload can only import modules (`compat.warm_imports` names this one for sweep-k's arms and verify's
kernel control), and the test suite's CLI zygote imports it too. Each engine process forked afterwards inherits:
- the engine's worker modules, already imported (`vllm.v1.worker.cpu_worker` and the ~2,000 modules it imports);
- vLLM's two `torch.compile`d sampler ops (`batched_count_greater_than`, `compiled_random_sample`) compiled once, with
  dynamo and inductor loaded and their caches warm: a child at its own thread count compiles each again (torch guards
  on the thread count) in ~0.2 s, once for every batch size, instead of a cold first compile;
- a frozen heap (`gc.freeze`), which the collections vLLM runs while it starts no longer walk.
Measured (`SPECTOOL_ENFORCE_EAGER=1 benchmarks/arm_starts.py`): an eager engine run forked with this 8.7 s against
16.8 s forked after the imports alone and 27.5 s fresh (median of 6 each, 2026-11-29).

Fork safety: all of it runs at one thread with inductor compiling in-process, so the process forks with no OpenMP
worker thread and no compile pool: a child's OpenMP team is its own (the OpenBLAS threads numpy and OpenCV start
when loaded stop themselves at a fork). Every step is an optimisation only: a vLLM that names these otherwise is
skipped, and nothing here changes what an engine computes.
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
# (module, op, its arguments from logits [batch, vocab] float32, as the engine's sampler passes them)
COMPILED_OPS = (("vllm.v1.sample.ops.logprobs", "batched_count_greater_than", lambda x: (x, x[:, :1])),  # values [batch, 1]
                ("vllm.v1.sample.ops.topk_topp_sampler", "compiled_random_sample", lambda x: (x,)))


def warm(worker_modules: tuple[str, ...] = WORKER_MODULES, compiled_ops: tuple = COMPILED_OPS) -> float:
    """Import the worker modules and run each compiled op once at one thread, freeze the heap; the seconds it took."""
    started = time.monotonic()
    threads, compile_threads = torch.get_num_threads(), inductor.compile_threads
    torch.set_num_threads(1)
    inductor.compile_threads = 1
    try:
        for name in worker_modules:
            _try(importlib.import_module, name)
        logits = torch.randn(3, 1000)  # [batch, vocab]: a child's other sizes make its compile dynamic (they differ)
        with torch.inference_mode():  # as the engine's sampler runs
            for module, attr, args in compiled_ops:
                op = _try(_op, module, attr)
                if op is not None:
                    _try(op, *args(logits))
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

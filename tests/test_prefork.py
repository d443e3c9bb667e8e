"""spectool.engine.prefork: a process that will fork engine processes (sweep-k's forkserver, the suite's CLI zygote)
imports the worker modules and runs vLLM's compiled sampler op once, at one thread, then forks: the op ran at one
thread (no OpenMP team left behind to break a child's), the thread count and torch's random state are as they were,
the heap is frozen, and a forked child runs the op at its own thread count. The unit test runs `warm` on stand-in ops
(torch.compile with the eager backend, in milliseconds; one that notes the thread count it ran at); the engine test
runs vLLM's op as its forkserver does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


@torch.compile(backend="eager")
def stand_in_op(x: torch.Tensor) -> torch.Tensor:  # x [batch, vocab] -> [batch]
    return x.sum(-1)


SEEN: list[int] = []


def threads_seen(x: torch.Tensor) -> torch.Tensor:
    """A stand-in op that notes the thread count it ran at (a team of more than one started before the fork)."""
    SEEN.append(torch.get_num_threads())
    return x.sum(-1)


CHILD = r"""
import gc, json, os
import torch
from torch._dynamo.utils import counters
from spectool.engine import prefork
from test_prefork import SEEN, stand_in_op  # noqa: F401
WORKER, OPS = %s
threads, rng = torch.get_num_threads(), torch.get_rng_state()
seconds = prefork.warm(WORKER, OPS + (("test_prefork", "threads_seen", lambda x: (x,)),))
parent = {"threads": threads, "seen": SEEN, "threads_after": torch.get_num_threads(),
          "rng_kept": bool(torch.equal(rng, torch.get_rng_state())),
          "frozen": gc.get_freeze_count(), "seconds": seconds, "graphs": counters["stats"]["unique_graphs"]}
r, w = os.pipe()
if os.fork() == 0:
    %s
    shapes = []
    with torch.inference_mode():
        for batch in (5, 9):
            x = torch.randn(batch, %d)
            shapes += [list(op(*args(x)).shape) for op, args in CALLS]
    os.write(w, json.dumps({"threads": torch.get_num_threads(), "shapes": shapes}).encode())
    os._exit(0)
os.close(w)
parent["child"] = json.loads(os.read(r, 1 << 16))
print(json.dumps(parent))
"""


def _run(setup: str, calls: str, vocab: int) -> dict:
    script = CHILD % (setup, calls, vocab)
    here = str(Path(__file__).parent)
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "SPECTOOL_PREFORK": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _check(got: dict, ops: int) -> None:
    assert got["seconds"] > 0 and got["frozen"] > 0 and got["rng_kept"], got
    assert got["seen"] == [1], got  # the ops ran at one thread: no OpenMP team started before the fork
    assert got["threads"] == 2 and got["threads_after"] == 2 and got["child"]["threads"] == 2, got
    assert got["graphs"] >= ops, got  # every op compiled (run through torch's compiler) in the parent
    assert got["child"]["shapes"] == [[5]] * ops + [[9]] * ops  # and runs in the child at its thread count


def test_warm_runs_each_op_at_one_thread_and_leaves_threads_and_random_state_as_they_were():
    got = _run('(), (("test_prefork", "stand_in_op", lambda x: (x,)),)', "CALLS = [(stand_in_op, lambda x: (x,))]", 700)
    _check(got, ops=1)


@pytest.mark.engine  # a child that imports vLLM (14-18 s measured)
def test_vllms_sampler_op_is_run_once_before_an_engine_process_is_forked():
    calls = ("from vllm.v1.sample.ops.logprobs import batched_count_greater_than as a\n"
             "    CALLS = [(a, prefork._ranks_args)]")
    got = _run("prefork.WORKER_MODULES, prefork.COMPILED_OPS", calls, 49152)  # SmolLM2's vocabulary
    _check(got, ops=1)

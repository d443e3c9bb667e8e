"""harvest at scale through vLLM's own parallelism: tensor parallelism passed through (on the CPU
build, worker processes bound to their share of the cores), data parallelism refused with the reason
(vLLM's offline engine runs it only as one process per replica)."""

from __future__ import annotations

import json
import os

import pytest

from clirun import spectool


@pytest.fixture(scope="module")
def sums(tmp_path_factory):
    from conftest import sums_with_answer

    return sums_with_answer(tmp_path_factory.mktemp("data"))


@pytest.mark.engine
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="tensor parallelism on the CPU build needs 2 cores")
def test_harvest_with_two_tensor_parallel_workers(tiny_policy, sums, tmp_path):
    out = tmp_path / "h"
    spectool("harvest", "--model", str(tiny_policy), "--data", str(sums), "--out", str(out), "--n-prompts", "4",
             "--max-tokens", "8", "--tensor-parallel-size", "2", env={"SPECTOOL_ENFORCE_EAGER": "1"})
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    assert json.loads((out / "config.json").read_text())["tensor_parallel_size"] == 2
    log = (out / "engine.log").read_text()  # two vLLM worker processes served it
    assert "VllmWorker-0" in log and "VllmWorker-1" in log


def test_harvest_data_parallel_is_refused_with_the_reason(tiny_policy, sums, tmp_path):
    r = spectool("harvest", "--model", str(tiny_policy), "--data", str(sums), "--out", str(tmp_path / "h"),
                 "--data-parallel-size", "2", check=False)
    assert r.returncode == 2 and "--data-parallel-size" in r.stderr and "one process per replica" in r.stderr
    assert not (tmp_path / "h").exists()

"""harvest at scale through vLLM's own parallelism: tensor parallelism passed through (on the CPU
build, worker processes bound to their share of the cores); data parallelism as one engine replica per
process of a launcher (torchrun), each on its share of the prompts, into one resumable run folder."""

from __future__ import annotations

import json
import os

import pytest

from clirun import free_port, spectool


@pytest.fixture(scope="module")
def sums(tmp_path_factory):
    from conftest import sums_with_answer

    return sums_with_answer(tmp_path_factory.mktemp("data"))


@pytest.mark.multiproc  # two tensor-parallel workers
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="tensor parallelism on the CPU build needs 2 cores")
def test_harvest_with_two_tensor_parallel_workers(tiny_policy, sums, tmp_path):
    out = tmp_path / "h"
    spectool("harvest", "--model", str(tiny_policy), "--data", str(sums), "--out", str(out), "--n-prompts", "4",
             "--max-tokens", "8", "--tensor-parallel-size", "2", env={"SPECTOOL_ENFORCE_EAGER": "1"})
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    assert json.loads((out / "config.json").read_text())["tensor_parallel_size"] == 2
    log = (out / "engine.log").read_text()  # two vLLM worker processes served it
    assert "VllmWorker-0" in log and "VllmWorker-1" in log


@pytest.mark.multiproc
def test_harvest_with_two_data_parallel_replicas_under_torchrun(tiny_policy, sums, tmp_path):
    import subprocess
    import sys

    from spectool.records import load_records, shard_paths

    out = tmp_path / "h"

    def launch(prompts: int):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
               "-m", "spectool.cli", "harvest", "--model", str(tiny_policy), "--data", str(sums), "--out", str(out),
               "--n-prompts", str(prompts), "--max-tokens", "8", "--hidden-states", "--data-parallel-size", "2"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "SPECTOOL_ENFORCE_EAGER": "1"})
        assert r.returncode == 0, r.stderr[-5000:]
        return r

    r = launch(33)  # 17 prompts for replica 0 (two shards), 16 for replica 1 (one)
    assert r.stdout.count("records (33 new)") == 1  # the main process reports the run, once
    # replica d writes shards d, d + 2, ...: shard 1 is replica 1's
    assert [p.stem for p in shard_paths(out)] == ["shard-00000", "shard-00001", "shard-00002"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["records"] == manifest["prompts"] == 33
    launch(40)  # a resume with more prompts: only the 7 new ones, in new shards after the old ones
    records = load_records(out)
    assert len(records) == len(set(records["prompt_id"])) == 40
    shards = [p.stem for p in shard_paths(out)]
    assert shards == [f"shard-{i:05d}" for i in range(5)]
    assert sorted(p.stem for p in (out / "hidden").glob("*.safetensors")) == shards  # each shard's features beside it


def test_harvest_data_parallel_without_a_launcher_is_refused(tiny_policy, sums, tmp_path):
    r = spectool("harvest", "--model", str(tiny_policy), "--data", str(sums), "--out", str(tmp_path / "h"),
                 "--data-parallel-size", "2", check=False)
    assert r.returncode == 2 and "--data-parallel-size" in r.stderr and "torchrun --nproc_per_node 2" in r.stderr
    assert not (tmp_path / "h").exists()

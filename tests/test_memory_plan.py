"""One-GPU memory plans (memory.py): parameter counts against real models; train-rl's refusals name
the setting that makes it fit (and the advised value does fit); harvest's engine share leaves room
for the policy; the TRL integration prints its plan and refuses only where the arithmetic is plain.
The plans are arithmetic on configs, so they run without a GPU (the commands call them when one is
present)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

TEMPLATES = Path(__file__).resolve().parents[1] / "templates" / "models"
GIB = 1024**3


def _config(name: str):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(TEMPLATES / name)


def _plan(config, share=0.5, total=80, tokens=8 * 384, kl_beta=0.0, draft=0):
    from spectool.memory import train_rl_plan

    return train_rl_plan(config, engine_share=share, total_bytes=total * GIB, micro_tokens=tokens, kl_beta=kl_beta,
                         autocast_bf16=True, draft_params=draft)


def test_param_count_matches_transformers(tiny_policy):
    from transformers import AutoConfig, AutoModelForCausalLM

    from spectool.memory import param_count

    model = AutoModelForCausalLM.from_pretrained(tiny_policy)
    assert param_count(AutoConfig.from_pretrained(tiny_policy)) == sum(p.numel() for p in model.parameters())


def test_an_8b_policy_is_refused_by_the_builtin_backend_on_80gb():
    from spectool.errors import SpectoolError
    from spectool.memory import check_train_rl

    big = _config("qwen3-8b")
    plan = _plan(big)
    rows = dict(plan.rows)
    assert rows["policy weights (float32)"] == pytest.approx(8.19e9 * 4 / GIB, rel=0.01)
    assert rows["AdamW moments (float32)"] == pytest.approx(2 * rows["gradients (float32)"])
    with pytest.raises(SpectoolError, match="no setting fits it") as e:
        check_train_rl(plan, big, 0.5)
    assert "--backend trl" in str(e.value) and "does NOT fit" in str(e.value)


def test_the_advised_engine_share_fits():
    from spectool.errors import SpectoolError
    from spectool.memory import check_train_rl

    small = _config("qwen3-0.6b")
    check_train_rl(_plan(small), small, 0.5)  # fits at the default share on 80 GB
    with pytest.raises(SpectoolError, match=r"engine.gpu_memory_utilization to 0\.\d\d") as e:
        check_train_rl(_plan(small, share=0.95, total=24), small, 0.95)
    advised = float(str(e.value).split("gpu_memory_utilization to ")[1][:4])
    assert 0.1 < advised < 0.95 and _plan(small, share=advised, total=24).fits
    assert not _plan(small, share=advised + 0.02, total=24).fits


def test_the_trainer_settings_are_named_when_no_share_helps():
    from spectool.errors import SpectoolError
    from spectool.memory import check_train_rl

    small = _config("qwen3-0.6b")
    plan = _plan(small, total=24, tokens=16 * 2048, kl_beta=0.1, draft=50_000_000)
    assert any(r.startswith("reference policy") for r, _ in plan.rows)
    with pytest.raises(SpectoolError) as e:
        check_train_rl(plan, small, 0.5)
    msg = str(e.value)
    assert "policy.micro_batch_size" in msg and "policy.kl_beta: 0" in msg and "draft_refresh.mode: frozen" in msg
    assert "gpu_memory_utilization to" not in msg
    assert _plan(small, total=24, tokens=16 * 2048).used_gib < plan.used_gib  # kl_beta 0 drops a row


def test_activations_grow_with_tokens_and_shrink_with_checkpointing():
    from spectool.memory import activation_bytes

    c = _config("qwen3-8b")
    one = activation_bytes(c, 1000)
    assert activation_bytes(c, 2000) == 2 * one and activation_bytes(c, 1000, 4) > one
    assert activation_bytes(c, 1000, checkpointing=True) < one / 3  # the float32 logits stay


def test_harvest_engine_share_leaves_room_for_the_policy():
    from spectool.errors import SpectoolError
    from spectool.memory import harvest_plan

    share, plan = harvest_plan(_config("qwen3-0.6b"), 0.9, 80 * GIB)
    assert 0.85 < share <= 0.9 and plan.fits  # 2.4 GB of fp32 policy: about as asked
    share, plan = harvest_plan(_config("qwen3-8b"), 0.9, 80 * GIB)  # 30 GiB of policy
    assert 0.45 < share < 0.55 and plan.fits and "lowered to" in plan.text()
    with pytest.raises(SpectoolError, match="without --hidden-states"):
        harvest_plan(_config("qwen3-32b"), 0.9, 80 * GIB)
    share, _ = harvest_plan(_config("qwen3-8b"), 0.9, 64 * GIB)  # 27 GiB for the engine: a bfloat16 one needs 17
    with pytest.raises(SpectoolError, match="without --hidden-states"):  # a float32 one 32.5
        harvest_plan(_config("qwen3-8b"), 0.9, 64 * GIB, "float32")


def test_trl_plan_is_printed_and_refused(tmp_path, caplog, monkeypatch):
    from trl import GRPOConfig

    from spectool.errors import SpectoolError
    from spectool.integrations.trl import SpectoolSpeculation, check_memory

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, use_vllm=True, vllm_mode="colocate",
                      per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=64, vllm_gpu_memory_utilization=0.3, report_to="none")
    # bfloat16 checkpoint: 2 B/param; the engine's dtype as "auto" picks it on these GPUs (the floor counts its weights)
    spec, model = SpectoolSpeculation(None, dtype="bfloat16"), str(TEMPLATES / "qwen3-8b")
    caplog.set_level(logging.INFO, logger="spectool")
    check_memory(spec, args, {"model": model}, total_bytes=141 * GIB)  # an H200
    out = caplog.text
    assert "TRL GRPOTrainer memory plan" in out and "(2 B/param)" in out and "(fits)" in out
    with pytest.raises(SpectoolError, match="vllm_gpu_memory_utilization") as e:
        check_memory(spec, args, {"model": model}, total_bytes=80 * GIB)  # 8B x (2 + 2 + 4) B + the 24 GiB engine share
    assert "DeepSpeed ZeRO-3" in str(e.value)
    caplog.clear()
    check_memory(spec, args, {"model": model, "peft_config": object()}, total_bytes=80 * GIB)
    assert "(fits)" in caplog.text and "a lower bound" in caplog.text  # LoRA: the frozen policy alone


@pytest.mark.parametrize(("model", "how", "gpu_gib", "share", "fits"), [
    ("qwen3-8b", "zero3", 80, 0.3, True), ("qwen3-8b", "ddp", 80, 0.3, False), ("qwen3-32b", "zero3", 80, 0.3, False),
    ("qwen3-30b-a3b", "fsdp", 141, 0.45, True), ("qwen3-32b", "fsdp", 141, 0.48, True)])
def test_trl_plan_per_rank_of_a_sharded_policy(model, how, gpu_gib, share, fits, random_draft, tmp_path, caplog,
                                               monkeypatch):
    """8 GPUs, accelerate launch with 8 processes, a refreshed draft: per rank the policy's shard, its
    gradients and AdamW over the ranks, two layers unsharded, the embedding and lm_head the refresh
    gathers, the whole draft; enforced. Unsharded (DDP) an 8B policy does not fit 80 GiB, and the
    refusal names sharding; a 32B engine's bfloat16 weights (61 GiB) do not fit 30% of 80 GiB."""
    from trl import GRPOConfig

    from spectool.errors import SpectoolError
    from spectool.integrations.trl import SpectoolSpeculation, check_memory

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, use_vllm=True, vllm_mode="colocate",
                      per_device_train_batch_size=4, num_generations=4, max_completion_length=1024,
                      vllm_gpu_memory_utilization=share, gradient_checkpointing=True, report_to="none")
    # what accelerate launch's config sets, after the arguments (one process here: GRPOConfig would start them)
    monkeypatch.setenv("WORLD_SIZE", "8")
    if how == "zero3":
        monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
        monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    if how == "fsdp":
        monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
        monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", "true")
    caplog.set_level(logging.INFO, logger="spectool")
    from spectool.draft.refresh import RefreshSettings

    # "auto" on these GPUs; refresh steps of one 1,024-token completion (the default 8,192 packs 8: 12.6 GiB more
    # for the 32B policy, which then no longer fits at all, before the engine floor below is reached)
    spec = SpectoolSpeculation(str(random_draft), dtype="bfloat16", refresh=RefreshSettings(max_batch_tokens=1024))
    if not fits:  # DDP: names sharding; 32B: the engine's 30% of 80 GiB cannot hold its 61 GiB of weights
        with pytest.raises(SpectoolError, match="shard the policy" if how == "ddp" else "cannot hold the policy's"):
            check_memory(spec, args, {"model": str(TEMPLATES / model)}, total_bytes=gpu_gib * GIB)
        return
    check_memory(spec, args, {"model": str(TEMPLATES / model)}, total_bytes=gpu_gib * GIB)
    out = caplog.text
    assert "over 8 ranks" in out and "/ 8 shards" in out and "gathered whole for the draft refresh" in out
    assert "(fits)" in out  # (a one-completion refresh step needs less than the policy's activations: no row)


def test_trl_plan_names_the_draft_optimizer_state_of_every_rank(random_draft, tmp_path, caplog, monkeypatch):
    """Under accelerate launch every rank holds the whole refreshed draft and its AdamW state (the
    draft is replicated, not sharded): the plan says so, with the rank count."""
    from trl import GRPOConfig

    from spectool.integrations.trl import SpectoolSpeculation, check_memory
    from spectool.memory import draft_params, trl_plan

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, use_vllm=True, vllm_mode="colocate",
                      per_device_train_batch_size=8, num_generations=4, max_completion_length=64, report_to="none")
    monkeypatch.setenv("WORLD_SIZE", "2")  # as accelerate launch sets it (after the arguments: one process here)
    caplog.set_level(logging.INFO, logger="spectool")
    check_memory(SpectoolSpeculation(str(random_draft)), args, {"model": str(TEMPLATES / "qwen3-8b")},
                 total_bytes=141 * GIB)
    assert "spectool draft AdamW state (2 float32 moments, whole on each of 2 ranks)" in caplog.text
    # the arithmetic, for a draft of 0.25B parameters (EAGLE-3 for an 8B policy): 2 GiB of moments on every rank
    from transformers import AutoConfig

    plan = trl_plan(AutoConfig.from_pretrained(TEMPLATES / "qwen3-8b"), param_bytes=2, engine_share=0.3,
                    total_bytes=141 * GIB, micro_tokens=1024, ref_model=False, shards=1, trainable_fraction=1.0,
                    checkpointing=True, draft_params=250_000_000, processes=2)
    rows = dict(plan.rows)
    assert rows["spectool draft AdamW state (2 float32 moments, whole on each of 2 ranks)"] == pytest.approx(
        8 * 250e6 / GIB)
    assert draft_params(random_draft, False) > 0


def test_trl_plan_reads_the_longest_prompt(tiny_policy, tmp_path, caplog, monkeypatch):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from spectool.integrations.trl import SpectoolSpeculation, check_memory

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, use_vllm=True, vllm_mode="colocate",
                      per_device_train_batch_size=8, num_generations=4, max_completion_length=64, report_to="none")
    tok = AutoTokenizer.from_pretrained(tiny_policy)
    texts = ["What is 2 + 2?", "Add the numbers from one to one hundred and say why " * 3]
    want = max(len(tok(t)["input_ids"]) for t in texts)
    for data, n in ((Dataset.from_dict({"prompt": texts}), want),
                    (Dataset.from_dict({"prompt": [[{"role": "user", "content": t}] for t in texts]}), None)):
        caplog.clear()
        caplog.set_level(logging.INFO, logger="spectool")
        check_memory(SpectoolSpeculation(None), args, {"model": str(tiny_policy), "train_dataset": data},
                     total_bytes=80 * GIB)
        out = caplog.text
        tokens = int(out.split("per_device_train_batch_size: ")[1].split(" tokens")[0])
        longest = int(out.split("the longest prompt (")[1].split(" tokens")[0])
        assert tokens == 8 * (longest + 64) and longest >= want
        if n is not None:
            assert longest == n


def test_train_rl_prints_its_plan_with_the_online_draft(tiny_policy, random_draft, capsys):
    from spectool.commands.train_rl import check_memory
    from spectool.memory import safetensors_params
    from spectool.rl.config import RLConfig

    cfg = RLConfig()
    spec = SimpleNamespace(method="eagle3", draft_path=str(random_draft), k=3, proposals="greedy")
    check_memory(cfg, str(tiny_policy), spec, 40, 80 * GIB)
    out = capsys.readouterr().out
    assert "online draft + AdamW" in out and "activations (policy.micro_batch_size: 1344 tokens)" in out
    assert "drafter logits" not in out  # greedy proposals: no buffer
    assert safetensors_params(random_draft) > 0


@pytest.mark.parametrize("version,value_bytes", [("0.26.0", 4), ("0.33.0", 2)])
def test_the_plans_hold_the_v2_runners_drafter_logits_at_the_runs_batch(tiny_policy, random_draft, capsys,
                                                                          monkeypatch, version, value_bytes):
    """On a GPU build with probabilistic proposals, the V2 runner preallocates [max_num_seqs, k, vocab] out of the
    engine's share: the plan shows it at max_num_seqs = the run's batch (the engine is given that batch), and the
    share's rows still add up to the share."""
    import json

    from spectool.commands.train_rl import check_memory, rollout_batch
    from spectool.engine import compat
    from spectool.memory import GIB as G
    from spectool.memory import train_rl_plan
    from spectool.rl.config import RLConfig

    monkeypatch.setattr(compat, "installed", lambda: (version, False))
    cfg = RLConfig()
    assert rollout_batch(cfg) == 16 * 8  # prompts_per_step x group_size (the eval's 32 x 1 is smaller)
    vocab = json.loads((Path(tiny_policy) / "config.json").read_text())["vocab_size"]
    spec = SimpleNamespace(method="eagle3", draft_path=str(random_draft), k=3, proposals="probabilistic")
    check_memory(cfg, str(tiny_policy), spec, 40, 80 * GIB)
    out = capsys.readouterr().out
    want = 128 * 3 * vocab * value_bytes
    row = next(line for line in out.splitlines() if "drafter logits" in line)
    assert float(row.split()[-1]) == pytest.approx(want / G, abs=0.06)
    from transformers import AutoConfig

    plan = train_rl_plan(AutoConfig.from_pretrained(tiny_policy), engine_share=0.5, total_bytes=80 * GIB,
                         micro_tokens=100, kl_beta=0.0, autocast_bf16=True, logits=want)
    rows = dict(plan.rows)
    share = sum(g for r, g in rows.items() if r.startswith("engine share"))
    assert share == pytest.approx(40) and rows["engine share: drafter logits [max_num_seqs x k x vocab]"] == want / G


def test_train_rl_refuses_an_engine_share_below_its_weights_logits_and_a_little_cache():
    """A plan whose rows fit is still refused when the engine's share cannot hold the policy's bfloat16 weights, the
    drafter logits and a little KV cache (vLLM would start with no KV blocks), naming the share that would."""
    from spectool.errors import SpectoolError
    from spectool.memory import GIB as G
    from spectool.memory import check_train_rl, engine_floor, param_count, train_rl_plan

    config = _config("qwen3-8b")
    logits = 1024 * 3 * config.vocab_size * 4  # vLLM's default max_num_seqs on a large GPU, 0.26's float32
    assert engine_floor(config, logits, "bfloat16") == pytest.approx((2 * param_count(config) + logits) / G + 2)

    def plan(share):
        return train_rl_plan(config, engine_share=share, total_bytes=1000 * GIB, micro_tokens=100, kl_beta=0.0,
                             autocast_bf16=True, logits=logits)

    assert plan(0.015).fits
    with pytest.raises(SpectoolError, match=r"cannot hold the policy's bfloat16 weights, the drafter logits .* raise "
                                            r"engine.gpu_memory_utilization to 0.02 or more"):
        check_train_rl(plan(0.015), config, 0.015, logits)
    check_train_rl(plan(0.15), config, 0.15, logits)  # 150 GiB holds it


def test_the_engine_floor_counts_the_policys_weights_in_the_engines_dtype():
    """A float32 engine (engine.dtype: float32, or the CPU build) holds 4 bytes a parameter, not bfloat16's 2: a share
    that holds a bfloat16 engine is refused for a float32 one, naming float32 and the share that would do."""
    from spectool.errors import SpectoolError
    from spectool.memory import GIB as G
    from spectool.memory import check_train_rl, engine_floor, param_count, train_rl_plan

    config = _config("qwen3-8b")
    p = param_count(config)
    assert engine_floor(config, 0, "float32") == pytest.approx(4 * p / G + 2)
    assert engine_floor(config, 0, "float16") == engine_floor(config, 0, "bfloat16") == pytest.approx(2 * p / G + 2)
    plan = train_rl_plan(config, engine_share=0.025, total_bytes=1000 * GIB, micro_tokens=100, kl_beta=0.0,
                         autocast_bf16=False)
    check_train_rl(plan, config, 0.025, dtype="bfloat16")  # 25 GiB: 15.3 of bfloat16 weights + 2
    with pytest.raises(SpectoolError, match=r"cannot hold the policy's float32 weights, .* \(32\.5 GiB\): raise "
                                            r"engine.gpu_memory_utilization to 0.04 or more"):
        check_train_rl(plan, config, 0.025, dtype="float32")


def test_the_draft_refresh_step_is_planned_at_its_largest_micro_batch(tiny_policy, random_draft, tmp_path, capsys,
                                                                      caplog, monkeypatch):
    """The online refresh's draft step (packed micro-batches of draft_refresh.max_batch_tokens) is in both plans,
    beyond the policy's activations (it runs between policy steps): linear in the micro-batch's tokens, a sequence
    longer than the budget alone, which the plan says. For Qwen3-8B's EAGLE-3 draft at 16k-token rollouts one step
    holds about 61 GiB (29 of it float32 logits over the 32k draft vocabulary), which a padded batch of 16 would
    multiply by 16."""
    from transformers import AutoConfig
    from trl import GRPOConfig

    from spectool.commands.train_rl import check_memory
    from spectool.draft.checkpoint import refresh_memory
    from spectool.draft.refresh import RefreshSettings
    from spectool.integrations.trl import SpectoolSpeculation
    from spectool.integrations.trl import check_memory as trl_check_memory
    from spectool.rl.config import RLConfig

    qwen = AutoConfig.from_pretrained(TEMPLATES / "qwen3-8b")
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000,
                                                   "num_hidden_layers": 1}))
    step = {b: refresh_memory(qwen, draft, None, RefreshSettings(max_batch_tokens=b, batch_size=16), 16384).nbytes / GIB
            for b in (8192, 16384, 65536)}
    assert step[8192] == step[16384] and 55 < step[16384] < 70  # a 16k-token rollout alone at any smaller budget
    assert step[65536] == pytest.approx(4 * step[16384], rel=0.01)  # linear in the micro-batch's tokens

    cfg = RLConfig()
    cfg.rollout.max_tokens, cfg.draft_refresh.max_batch_tokens = 4000, 1 << 16
    spec = SimpleNamespace(method="eagle3", draft_path=str(random_draft), k=3, proposals="greedy")
    check_memory(cfg, str(tiny_policy), spec, 40, 80 * GIB)
    out = capsys.readouterr().out
    assert ("draft refresh step beyond the policy's activations (64640 tokens packed: draft_refresh.max_batch_tokens "
            "shrinks it)") in out  # 16 rollouts of 40 + 4,000 tokens within 65,536
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, use_vllm=True, vllm_mode="colocate",
                      per_device_train_batch_size=8, num_generations=4, max_completion_length=4000, report_to="none")
    caplog.set_level(logging.INFO, logger="spectool")
    trl_check_memory(SpectoolSpeculation(str(random_draft), refresh=RefreshSettings(max_batch_tokens=1 << 16)), args,
                     {"model": str(tiny_policy)}, total_bytes=80 * GIB)
    assert "draft refresh step beyond the policy's activations (64000 tokens packed" in caplog.text  # 16 x 4,000
    # a sequence longer than the budget trains alone: no budget shrinks it, and the plan says so (Qwen3-8B, 16k tokens)
    from spectool.memory import trl_plan

    plan = trl_plan(qwen, param_bytes=2, engine_share=0.3, total_bytes=80 * GIB, micro_tokens=1024, ref_model=False,
                    shards=8, trainable_fraction=1.0, checkpointing=True, draft_params=250_000_000, processes=8,
                    refresh=refresh_memory(qwen, draft, None, RefreshSettings(), 16384))
    rows = dict(plan.rows)
    assert rows["draft refresh step beyond the policy's activations (one 16384-token sequence alone: no "
                "refresh.max_batch_tokens shrinks it)"] > 55 and not plan.fits

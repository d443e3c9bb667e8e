"""The shipped recipes in templates/ (templates/qwen3-8b-reasoning.yaml): the commands in their header and their
sections agree, every key is a real setting of its command (parsed by the real command line, then validate()), and
spectool's memory plans for them fit the GPUs they are written for (arithmetic on the weightless Qwen3-8B config in
templates/models; no weights, no engine)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "templates" / "qwen3-8b-reasoning.yaml"
COMMANDS = {"harvest": "harvest", "init-draft": "init_draft", "export": "export", "sweep-k": "sweep_k"}  # -> module
GIB = 1024**3
GPU_GIB, GPUS = 80, 8


def _recipe() -> dict:
    return yaml.safe_load(RECIPE.read_text())


def _header_commands() -> dict[str, list[str]]:
    """command -> its arguments, from the `#   ... spectool[.cli] COMMAND ...` lines at the top of the recipe."""
    out = {}
    for line in RECIPE.read_text().splitlines():
        if not line.startswith("#   "):
            continue
        words = shlex.split(line[1:], comments=True)
        for i, w in enumerate(words):
            if w in ("spectool", "spectool.cli") and i + 1 < len(words) and words[i + 1] in COMMANDS:
                out[words[i + 1]] = words[i + 2 :]
    return out


def _args(section: dict) -> list[str]:
    return [x for k, v in section.items() for x in (f"--{k}", str(v))]


def test_the_header_runs_every_section_with_its_settings():
    header, recipe = _header_commands(), _recipe()
    assert set(header) == set(COMMANDS) and set(recipe) == {*COMMANDS, "trl"}
    for name, args in header.items():
        pairs = dict(zip(args[::2], args[1::2]))
        assert len(pairs) * 2 == len(args), (name, args)  # flag, value, flag, value ...
        assert pairs == dict(zip(_args(recipe[name])[::2], _args(recipe[name])[1::2])), name


@pytest.mark.parametrize("command", COMMANDS)
def test_every_key_is_a_setting_of_its_command(command, monkeypatch):
    """The section through the real command line (the flags it generates from the settings dataclass) into the
    command's settings, stopped before it runs; they pass validate()."""
    import importlib

    from spectool.cli import app

    module = importlib.import_module(f"spectool.commands.{COMMANDS[command]}")
    seen = []

    def capture(cfg, **_):
        seen.append(cfg)
        raise SystemExit(0)

    monkeypatch.setattr(module, "run", capture)
    monkeypatch.setenv("WORLD_SIZE", "8")  # as torchrun / accelerate launch set it (harvest's data parallelism)
    result = CliRunner().invoke(app, [command, *_args(_recipe()[command])])
    assert seen, result.output  # an unknown key is "No such option" here
    cfg = seen[0]
    cfg.validate()
    for key, value in _recipe()[command].items():  # and each reached its field (nested: the sampling settings)
        name = key.replace("-", "_")
        owners = [cfg, *(v for v in vars(cfg).values() if dataclasses.is_dataclass(v))]
        got = next(getattr(o, n) for n in (name, name + "s") for o in owners if hasattr(o, n))
        want = yaml.safe_load(value) if key == "chat-template-kwargs" else value
        if isinstance(got, list):
            want = [type(got[0])(x) for x in str(value).split(",")]
        assert got == want, (command, key, got, value)


def test_the_grpo_config_is_trls():
    """The trl section builds TRL's own GRPOConfig, and its engine holds the longest prompt and completion."""
    trl = pytest.importorskip("trl")
    section = dict(_recipe()["trl"]["GRPOConfig"])
    args = trl.GRPOConfig(**{**section, "bf16": False, "use_cpu": True})  # bf16 as written needs a GPU to validate
    assert args.max_completion_length == _recipe()["harvest"]["max-tokens"]
    assert args.vllm_max_model_length == _recipe()["harvest"]["max-model-len"]
    assert args.chat_template_kwargs == {"enable_thinking": True}


def _qwen3_8b():
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(ROOT / "templates" / "models" / "qwen3-8b")


def test_its_memory_plans_fit_8_x_80_gib():
    """Per GPU of 8 x 80 GiB, by memory.py's plans: init-draft at the recipe's longest record (--max-model-len) with
    its flags, each rank training its share of --batch-size; the harvest's and sweep-k's engines; a TRL GRPOTrainer
    rank (ZeRO-3 over 8, the draft refreshed on every rank, the colocated engine's share)."""
    from spectool.constants import GPU_MEMORY_UTILIZATION, MAX_NUM_SEQS
    from spectool.draft.checkpoint import draft_shape
    from spectool.memory import (
        check_engine_floor,
        check_init_draft,
        drafter_logits,
        init_draft_plans,
        output_bin_counts,
        rollout_plan,
        trl_plan,
    )

    r, config, total = _recipe(), _qwen3_8b(), GPU_GIB * GIB
    d, h, s = r["init-draft"], r["harvest"], r["sweep-k"]
    longest = h["max-model-len"]
    assert longest >= h["max-tokens"]
    shape = draft_shape(config, "eagle3", d["draft-vocab-size"], 1, d["ttt-steps"], d["anchor-fraction"])

    def replan(policy_dtype="bfloat16", features=d["features"], max_batch_tokens=d["max-batch-tokens"]):
        return init_draft_plans(config, shape, total_bytes=total, policy_dtype=policy_dtype, features=features,
                                max_batch_tokens=max_batch_tokens, batch_size=-(-d["batch-size"] // GPUS),
                                longest=longest, group_tokens=32768, draft_dtype=d["draft-dtype"])

    plans = replan()
    check_init_draft(plans, config, replan, policy_dtype="bfloat16", features=d["features"],
                     max_batch_tokens=d["max-batch-tokens"])
    assert all(p.fits for p in plans)
    # the engines alone on a GPU: harvest (no draft), sweep-k at its largest batch with the draft's logits
    k, batch = max(int(x) for x in str(s["k"]).split(",")), max(int(x) for x in str(s["batch-sizes"]).split(","))
    for who, seqs, logits in (("harvest", MAX_NUM_SEQS, 0), ("sweep-k", batch, drafter_logits(batch, k, config.vocab_size, 4))):
        bins = output_bin_counts(seqs, config.vocab_size)
        plan = rollout_plan(config, engine_share=GPU_MEMORY_UTILIZATION, total_bytes=total, logits=logits, bins=bins,
                            dtype="bfloat16", who=who)
        assert plan.fits, plan.text()
        check_engine_floor(plan, config, GPU_MEMORY_UTILIZATION, logits + bins, "bfloat16", "--gpu-memory-utilization",
                           who, "")
    # a TRL rank: bfloat16 policy (model_init_kwargs), ZeRO-3 over 8, one micro-batch of the longest sequence
    g = r["trl"]["GRPOConfig"]
    seqs = g["generation_batch_size"] // GPUS  # TRL's max_num_seqs: per_device x steps_per_generation (tensor parallel 1)
    plan = trl_plan(config, param_bytes=2, engine_share=g["vllm_gpu_memory_utilization"], total_bytes=total,
                    micro_tokens=g["per_device_train_batch_size"] * g["vllm_max_model_length"], ref_model=g["beta"] != 0,
                    shards=GPUS, trainable_fraction=1.0, checkpointing=g["gradient_checkpointing"],
                    draft_params=shape.trainable, processes=GPUS, weights_sharded=True,
                    logits=drafter_logits(seqs, k, config.vocab_size, 4), bins=output_bin_counts(seqs, config.vocab_size))
    assert plan.fits, plan.text()
    check_engine_floor(plan, config, g["vllm_gpu_memory_utilization"], 0, "bfloat16", "vllm_gpu_memory_utilization",
                       "the colocated engine's share", "")


def test_the_plan_check_sees_a_recipe_that_does_not_fit():
    """The same init-draft plan with the draft vocabulary at the policy's whole 151,936 tokens does not fit 80 GiB:
    the check above can fail."""
    from spectool.draft.checkpoint import draft_shape
    from spectool.memory import init_draft_plans

    r, config = _recipe(), _qwen3_8b()
    d = r["init-draft"]
    shape = draft_shape(config, "eagle3", config.vocab_size, 1, d["ttt-steps"], d["anchor-fraction"])
    plans = init_draft_plans(config, shape, total_bytes=GPU_GIB * GIB, policy_dtype="bfloat16", features=d["features"],
                             max_batch_tokens=d["max-batch-tokens"], batch_size=-(-d["batch-size"] // GPUS),
                             longest=r["harvest"]["max-model-len"], group_tokens=32768, draft_dtype=d["draft-dtype"])
    assert not all(p.fits for p in plans)

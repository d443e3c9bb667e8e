"""The batch vLLM would pick (review 4, N11): every engine decodes at most the sequences vLLM's own per-device default
allows (1,024 on GPUs of 70 GiB or more but A100s, 256 elsewhere and per CPU worker), and on GPU builds before 0.33 a
parallel drafter's (k - 1) x max_num_seqs draft slots come on top of vLLM's token budget instead of out of it.
Stand-in devices and builds: nothing here starts an engine (engine/batch.py, engine/compat.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectool.errors import SpectoolError

GIB = 1024**3
TEMPLATES = Path(__file__).resolve().parents[1] / "templates" / "models"
H100 = ("NVIDIA H100 80GB HBM3", 80 * GIB)
A100_80 = ("NVIDIA A100-SXM4-80GB", 80 * GIB)
L40S = ("NVIDIA L40S", 45 * GIB)
GPU40 = ("a 40 GiB GPU", 40 * GIB)
V026, V033 = ("0.26.0", False), ("0.33.0", False)


@pytest.fixture(scope="module")
def qwen3_configs():
    """The Qwen3 template configs, loaded once: transformers' first AutoConfig load imports its config classes
    (about 5 s here), a module's cost rather than one test's."""
    from transformers import AutoConfig

    return {name: AutoConfig.from_pretrained(TEMPLATES / name) for name in ("qwen3-0.6b", "qwen3-8b")}


def _kwargs(device, build=V026, **cfg):
    from spectool.engine.batch import Device
    from spectool.engine.engine import EngineConfig, spectool_kwargs

    cfg.setdefault("model_path", "m")
    return spectool_kwargs(EngineConfig(**cfg), cpu=device is None, device=device and Device(*device), build=build)


def _scheduled(kw: dict, k: int, slots_per_seq: int) -> int:
    """vLLM 0.26's scheduler budget (config/vllm.py:1697-1716@0.26): max_num_batched_tokens (passed, else the
    device's default: 8,192 on a 40 GiB GPU) minus the draft slots of every sequence; <= 0 refuses to start."""
    return kw.get("max_num_batched_tokens", 8192) - slots_per_seq * kw["max_num_seqs"]


def test_the_cap_is_the_batch_vllm_itself_picks_on_the_device():
    from spectool.engine.compat import batch_defaults

    assert batch_defaults(False, *H100) == (1024, 16384)
    assert batch_defaults(False, *A100_80) == (256, 8192)  # 80 GB, but an A100: vLLM's small defaults
    assert batch_defaults(False, *L40S) == batch_defaults(False, *GPU40) == (256, 8192)
    assert batch_defaults(False) == (256, 8192)  # the device could not be read: vLLM's fallback
    assert batch_defaults(True, tensor_parallel_size=2) == (512, 8192)
    run = 4200 * 4  # rollout --n-prompts 4200 --samples 4
    assert _kwargs(H100, max_num_seqs=run)["max_num_seqs"] == 1024
    for device in (A100_80, L40S, GPU40, None):  # None: the CPU build
        assert _kwargs(device, max_num_seqs=run)["max_num_seqs"] == 256, device
        assert _kwargs(device, max_num_seqs=100)["max_num_seqs"] == 100  # a smaller batch is the run's own
    assert "max_num_seqs" not in _kwargs(GPU40)  # no batch given, nothing drafted: vLLM's own defaults


def test_dflash_at_k9_on_a_40gib_stand_in_starts_with_a_budget_that_fits():
    """The crash case: 1,024 sequences x 8 draft slots took all of an 8,192-token budget on vLLM 0.26 and the engine
    refused to start. Now the engine holds 256 sequences and the slots come on top of vLLM's budget."""
    dflash = dict(method="dflash", draft_path="draft", k=9, max_num_seqs=1024, draft_sampling="greedy")
    kw = _kwargs(GPU40, **dflash)
    assert kw["max_num_seqs"] == 256 and kw["max_num_batched_tokens"] == 8192 + 8 * 256
    assert _scheduled(kw, 9, 8) == 8192 >= 256 * (1 + 9)  # every sequence decodes each step
    assert _scheduled({"max_num_seqs": 1024}, 9, 8) == 0  # what spectool used to ask for: refused by vLLM
    for family in ("peagle", "dspark"):
        assert _kwargs(GPU40, **{**dflash, "method": family})["max_num_batched_tokens"] == 10240, family
    assert "max_num_batched_tokens" not in _kwargs(GPU40, V033, **dflash)  # 0.33 takes no slots out of the budget
    assert "max_num_batched_tokens" not in _kwargs(GPU40, **{**dflash, "method": "eagle3"})  # a chain takes none
    # no batch given: vLLM's own sequences, with the budget they need
    assert _kwargs(GPU40, **{**dflash, "max_num_seqs": None}) == {**kw, "max_num_seqs": 256}


def test_a_budget_the_caller_set_is_kept_and_the_sequences_cut_to_it_or_refused_naming_k():
    """TRL passes max_num_batched_tokens=4096: the engine then holds the sequences whose decode steps fit in it after
    their draft slots; a budget that holds not one is refused before vLLM starts, naming --k."""
    dflash = dict(method="dflash", draft_path="draft", k=9, max_num_seqs=512, draft_sampling="greedy")
    kw = _kwargs(H100, **dflash, extra={"max_num_batched_tokens": 4096})
    assert kw == {**kw, "max_num_seqs": 4096 // 18, "max_num_batched_tokens": 4096}
    assert _scheduled(kw, 9, 8) >= kw["max_num_seqs"] * 10
    with pytest.raises(SpectoolError, match=r"lower --k \(train-rl: speculation.k\)"):
        _kwargs(H100, **dflash, extra={"max_num_batched_tokens": 16})


def test_vllms_zero_token_budget_is_advice_naming_k_and_the_batch_not_the_export():
    from spectool.engine.engine import EngineConfig, _start_error_advice

    error = ValueError("max_num_scheduled_tokens is set to 0 based on the speculative decoding settings, which does not "
                       "allow any tokens to be scheduled. Increase max_num_batched_tokens to accommodate the additional "
                       "draft token slots, or decrease num_speculative_tokens.")
    advice = _start_error_advice(error, EngineConfig(model_path="m", draft_path="d", method="dflash", k=9), cpu=False)
    assert "Lower --k" in advice and "--n-prompts x --samples" in advice and "now 9" in advice, advice
    assert "exported" not in advice


def test_rollout_prints_its_plan_with_the_buffers_at_the_batch_the_engine_holds(qwen3_configs, monkeypatch, capsys):
    """rollout on a GPU prints its plan as train-rl and harvest do: the policy in the engine's dtype, the drafter
    logits and output_bin_counts at the engine's max_num_seqs (vLLM's 256 on a 40 GiB GPU, the batch of 1,024
    queued), and refuses a share that cannot hold them with a little KV cache, naming the flag."""
    import torch

    from spectool.commands import rollout
    from spectool.config.rollout import RolloutConfig
    from spectool.engine import batch as engine_batch
    from spectool.memory import drafter_logits, output_bin_counts

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(engine_batch, "this_device", lambda: engine_batch.Device(*GPU40))
    monkeypatch.setattr("spectool.engine.compat.installed", lambda: V026)
    model, vocab = str(TEMPLATES / "qwen3-8b"), 151936
    cfg = RolloutConfig(dtype="bfloat16")
    rollout.check_memory(cfg, model, "eagle3", 3, "probabilistic", 1024)
    text = capsys.readouterr().out
    rows = {line.rsplit(None, 1)[0].strip(): float(line.rsplit(None, 1)[1]) for line in text.splitlines()
            if line.startswith("  engine share:")}
    assert rows["engine share: drafter logits [max_num_seqs x k x vocab]"] == pytest.approx(
        drafter_logits(256, 3, vocab, 4) / GIB, abs=0.05)  # float32 on 0.26
    assert rows["engine share: output_bin_counts [max_num_seqs x vocab] int32"] == pytest.approx(
        output_bin_counts(256, vocab) / GIB, abs=0.05)
    assert "rollout memory plan: 8.19B" in text and "max_num_seqs 256 (the batch of 1024 is queued)" in text
    with pytest.raises(SpectoolError, match="raise --gpu-memory-utilization to"):
        rollout.check_memory(RolloutConfig(dtype="bfloat16", gpu_memory_utilization=0.4), model, "eagle3", 3,
                             "probabilistic", 1024)


def test_every_gpu_plan_counts_output_bin_counts(qwen3_configs):
    """[max_num_seqs, vocab] int32 in every V2 engine, drafting or not (penalties.py@0.26 and @0.33): 0.58 GiB at
    1,024 sequences of Qwen3's vocabulary; in the train-rl, harvest and TRL plans as a row of the engine's share."""
    from spectool.memory import harvest_plan, output_bin_counts, train_rl_plan, trl_plan

    assert output_bin_counts(1024, 151936) / GIB == pytest.approx(0.58, abs=0.005)
    config, bins = qwen3_configs["qwen3-0.6b"], output_bin_counts(256, 151936)
    row = "engine share: output_bin_counts [max_num_seqs x vocab] int32"
    plans = [train_rl_plan(config, engine_share=0.5, total_bytes=80 * GIB, micro_tokens=100, kl_beta=0.0,
                           autocast_bf16=True, bins=bins),
             harvest_plan(config, 0.5, 80 * GIB, bins=bins)[1],
             trl_plan(config, param_bytes=2, engine_share=0.3, total_bytes=80 * GIB, micro_tokens=100, ref_model=False,
                      shards=1, trainable_fraction=1.0, checkpointing=False, bins=bins)]
    for plan in plans:
        assert dict(plan.rows)[row] == pytest.approx(bins / GIB), plan.title

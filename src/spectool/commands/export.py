"""`spectool export`: write a draft folder that stock vLLM loads, verified on the real engine.

Formats: `vllm` (plain EAGLE-3: config.json with LlamaForCausalLMEagle3 + model.safetensors, used
with speculative_config method "eagle3") and `speculators` (self-describing: vLLM reads the
algorithm, default k and verifier from `speculators_config`). The folder is written next to the
destination, loaded into vLLM with the policy, and run on a few prompts; only if it loads and
reaches the acceptance floor (at T=0; T=1, with the proposals rollout uses, is measured on the same engine and
reported) is it moved into place, with a model card (commands/export_card.py); `--push-to-hub` then uploads it.
Nothing half-written is left behind.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from spectool.commands.export_card import CARD, Check, command_line, model_card, push, training_data
from spectool.config.export import ExportConfig
from spectool.context import LengthSettings, resolve_max_model_len
from spectool.data import load_source
from spectool.draft.checkpoint import DRAFT_JSON, WEIGHTS, check_tensors
from spectool.draft.dflash import MASK_EMBEDDING
from spectool.draft.guard import check_speculation
from spectool.draft.vocab import ids_from_d2t
from spectool.engine.engine import Engine, EngineConfig, Sampling
from spectool.engine.proposals import resolve as resolve_proposals
from spectool.errors import SpectoolError
from spectool.families import FAMILIES, folder_family
from spectool.frameworks import check_target, snippet
from spectool.models import HUB_IDS, resolve_model
from spectool.prompts import encode_tasks, rendering
from spectool.runs import atomic_write_bytes
from spectool.settings.engine import engine_kwargs
from spectool.ui import console


@dataclass
class ExportResult:
    out: str
    format: str
    mean_acceptance_length: float | None
    target: str = "vllm"
    snippet_file: str = ""  # the framework's config snippet, inside the export folder
    snippet: str = ""
    note: str = ""  # what that framework then does with the draft
    mean_acceptance_length_t1: float | None = None  # the check's T=1 pass, with `proposals`
    proposals: str = ""
    pushed_to: str = ""  # the hub repo's URL (--push-to-hub)


EXPORT_CONFIG = "export_config.json"  # the resolved settings (config.json is vLLM's)


def speculators_config(vllm_cfg: dict, k: int, verifier: str, verifier_cfg: dict) -> dict:
    """The speculators library's Eagle3SpeculatorConfig for a draft of `vllm_cfg` (its config.json): the draft layer is
    a Llama decoder layer; the verifier is named with its own architectures and dtype (`verifier_cfg`: the policy's
    config.json), which the weights are stored in, as the library's own converter stores them."""
    dtype = speculators_dtype(verifier_cfg)
    layer = {k2: v for k2, v in vllm_cfg.items() if k2 not in ("architectures", "eagle_config", "draft_vocab_size",
                                                                "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
                                                                "norm_before_residual")}
    layer["architectures"] = ["LlamaForCausalLM"]
    layer["torch_dtype"] = dtype
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": vllm_cfg["draft_vocab_size"],
        "target_hidden_size": vllm_cfg["target_hidden_size"],
        # written always: vLLM reads an absent one as True (spectool's own drafts are trained with False)
        "norm_before_residual": bool(vllm_cfg.get("norm_before_residual", False)),
        "eagle_aux_hidden_state_layer_ids": vllm_cfg["eagle_aux_hidden_state_layer_ids"],
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": verifier_cfg.get("architectures") or []},
        },
        "torch_dtype": dtype,
    }


def speculators_dtype(policy_cfg: dict) -> str:
    """The policy's dtype as its config.json names it (transformers 5 writes `dtype`, earlier ones `torch_dtype`); one
    that is no float type a draft's weights are stored in (absent, "auto"): float32, as the draft was trained."""
    dtype = policy_cfg.get("dtype") or policy_cfg.get("torch_dtype")
    return dtype if dtype in ("float32", "bfloat16", "float16") else "float32"


def run(cfg: ExportConfig) -> ExportResult:
    from spectool.runs import MANIFEST, atomic_dir, atomic_write_json, claim, make_manifest, read_json  # noqa: PLC0415 (binds a name this module uses otherwise)

    cfg.validate()
    src = Path(cfg.draft)
    if not (src / "config.json").exists() or not (src / WEIGHTS).exists():
        raise SpectoolError(f"--draft {src} is not a draft folder (needs config.json and {WEIGHTS}); make one with init-draft")
    meta = read_json(src / DRAFT_JSON) if (src / DRAFT_JSON).exists() else {}
    command = command_line(cfg)  # as the user gave it, for the model card
    cfg = draft_rendering(src, cfg)  # resolved: the verification prompts as the draft's harvest rendered them
    model_name = cfg.model or meta.get("policy")
    if not model_name:
        raise SpectoolError("the draft does not record its policy; pass --model")
    model = resolve_model(model_name)
    policy_cfg = read_json(Path(model.path) / "config.json")
    family = folder_family(src)
    if family in FAMILIES:  # else check_tensors names the families export takes
        check_speculation(model, family, str(src), cfg.k)
    check_tensors(src, model.path, family)
    if family != "eagle3" and cfg.format != "vllm":
        raise SpectoolError(f"--format {cfg.format}: spectool writes the speculators format for EAGLE-3 drafts only; a "
                            f"{family} draft folder is already what vLLM loads: use --format vllm")

    check_target(cfg.target, read_json(src / "config.json").get("eagle_aux_hidden_state_layer_ids") or [],
                 model.fingerprint["num_hidden_layers"], family)
    base = cfg.base_model or _portable_name(model_name)  # the verifier's name in the card and the configs
    snip = snippet(cfg.target, str(Path(cfg.out).resolve()), cfg.k, base, family)
    claim(Path(cfg.out), "export", cfg, saved_as=EXPORT_CONFIG, replace=True)  # replaced whole, never a foreign folder

    with atomic_dir(Path(cfg.out)) as tmp:  # loaded and verified before it is moved into place
        if cfg.format == "vllm":
            shutil.copy2(src / WEIGHTS, tmp / WEIGHTS)
            if (src / MASK_EMBEDDING).exists():  # DFlash's trained mask embedding, read by vLLM beside the weights
                shutil.copy2(src / MASK_EMBEDDING, tmp / MASK_EMBEDDING)
        else:
            _speculators_weights(src / WEIGHTS, tmp / WEIGHTS, read_json(src / "config.json")["vocab_size"],
                                 speculators_dtype(policy_cfg))
        vcfg = read_json(src / "config.json")
        conf = vcfg if cfg.format == "vllm" else speculators_config(vcfg, cfg.k, base, policy_cfg)
        atomic_write_json(tmp / "config.json", conf)
        if meta:  # the draft's metadata travels with it: every draft check applies to the export too
            atomic_write_json(tmp / DRAFT_JSON, {**meta, "export_format": cfg.format})
        verify_data = draft_data(src) or "chat"  # held-out prompts of the data the draft was trained on
        data = training_data(src)  # with its harvest's columns: a file or hub source read as it was harvested
        columns = {k: v for k in ("prompt_col", "answer_col") if (v := (data.get("harvest") or {}).get(k))}
        check = _verify(tmp, model.path, verify_data, cfg, family, columns) if cfg.verify else None
        acc, served_by = (check.t0, check.served_by) if check else (None, None)
        if acc is not None and acc < cfg.min_acceptance_length:
            raise SpectoolError(
                f"export refused: mean acceptance length {acc:.2f} < floor {cfg.min_acceptance_length} "
                "(wrong policy or vocabulary map?); nothing was written"
            )
        (tmp / snip.filename).write_text(snip.text)
        atomic_write_json(tmp / EXPORT_CONFIG, asdict(cfg))  # the resolved settings, next to the artifact
        atomic_write_json(tmp / MANIFEST, make_manifest(
            "export", format=cfg.format, target=cfg.target, snippet=snip.filename, model=model_name,
            model_identity=model.identity, k=cfg.k, source=str(src), family=family, verified_mean_acceptance_length=acc,
            verified_mean_acceptance_length_t1=check.t1 if check else None,
            verified_proposals=check.proposals if check else None, served_by=served_by, rendering=rendering(cfg),
            command=command, training_data=data))
        where = cfg.push_to_hub or str(Path(cfg.out).resolve())
        (tmp / CARD).write_text(model_card(
            base_model=base, library="speculators" if cfg.format == "speculators" else "vllm", family=family, k=cfg.k,
            fmt=cfg.format, check=check, floor=cfg.min_acceptance_length, data=data, command=command, where=where,
            serve=snippet("vllm", where, cfg.k, base, family).text))
    pushed = push(Path(cfg.out), cfg.push_to_hub, f"spectool export: {family} draft for {base}, k={cfg.k}, T=0 "
                  f"acceptance {acc:.2f}") if cfg.push_to_hub else ""  # validate(): a pushed export is a verified one
    return ExportResult(out=cfg.out, format=cfg.format, mean_acceptance_length=acc, target=cfg.target,
                        snippet_file=str(Path(cfg.out) / snip.filename), snippet=snip.text, note=_note(snip.note, base),
                        mean_acceptance_length_t1=check.t1 if check else None,
                        proposals=check.proposals if check else "", pushed_to=pushed)


def _speculators_weights(src: Path, dest: Path, vocab_size: int, dtype: str) -> None:
    """The weights as the speculators library names them: the decoder layer as `layers.0.*` (vLLM's
    loader maps `midlayer.*` to the same name), and with a reduced vocabulary a `t2d` mask [V] of
    the target ids in it beside `d2t` (vLLM skips t2d); the floating-point ones in `dtype`, the verifier's."""
    import torch  # noqa: PLC0415 (heavy, loaded only on this path)
    from safetensors.torch import load_file, save  # noqa: PLC0415 (heavy, loaded only on this path)

    dt = getattr(torch, dtype)
    sd = {k.replace("midlayer.", "layers.0.", 1): v.to(dt) if v.is_floating_point() else v
          for k, v in load_file(str(src)).items()}
    if "d2t" in sd:
        t2d = torch.zeros(vocab_size, dtype=torch.bool)
        t2d[ids_from_d2t(sd["d2t"])] = True
        sd["t2d"] = t2d
    atomic_write_bytes(dest, save(sd))


def _note(note: str, base: str) -> str:
    """The snippet's note, and what the card names a policy whose hub id export could not tell."""
    if "/" in base:
        return note
    return " ".join(x for x in (note, f"The model card and configs name the policy {base!r}, a local folder's name: "
                                      "--base-model ORG/NAME names its hub id.") if x)


def _portable_name(model_name: str) -> str:
    """The verifier named without this machine's paths: a hub id as given, the embedded default by its hub id, a
    folder in huggingface_hub's cache (.../models--ORG--NAME/snapshots/REVISION) by its repo id, another local
    folder by its own name (--base-model names it)."""

    if model_name in HUB_IDS:
        return HUB_IDS[model_name]
    path = Path(model_name)
    if not path.exists():
        return model_name
    repo = path.resolve().parent.parent.name
    if path.resolve().parent.name == "snapshots" and repo.startswith("models--") and repo.count("--") >= 2:
        return repo.removeprefix("models--").replace("--", "/", 1)
    return path.name


def draft_data(src: Path) -> str | None:
    """The data source the draft in `src` was trained on (export_card.training_data: an init-draft folder's or an
    export's), None when unknown or a file no longer there."""
    data = training_data(src).get("harvest_data")
    if not data:
        return None
    is_file = data.endswith((".jsonl", ".parquet"))
    return data if not is_file or Path(data).exists() else None


def draft_rendering(src: Path, cfg: ExportConfig) -> ExportConfig:
    """`cfg` with the draft's harvest's system prompt and chat template kwargs (export_card.training_data: init-draft's
    manifest, or the one an export keeps) where --system-prompt and --chat-template-kwargs are unset."""
    own = training_data(src).get("rendering") or {}
    return dataclasses.replace(
        cfg, system_prompt=cfg.system_prompt if cfg.system_prompt is not None else own.get("system_prompt"),
        chat_template_kwargs=cfg.chat_template_kwargs if cfg.chat_template_kwargs is not None
        else own.get("chat_template_kwargs") or None)


VERIFY_TOKENS = 32  # tokens per prompt export's check decodes, at T=0 and at T=1
VERIFY_PROMPTS = 8
VERIFY_SEED = 0  # the T=1 pass's sampling seed


def verify_split(data: str, columns: dict | None = None) -> str:
    """The held-out split of `data` (read with `columns`: load_source's prompt_col/answer_col), or its training split
    where it holds no held-out prompt (a small file whose every prompt hashes into train: its draft would otherwise
    not export at all; the card says which split was used)."""
    try:
        load_source(data, **(columns or {})).tasks("eval", 1)
        return "eval"
    except SpectoolError:
        return "train"


def _verify(folder: Path, model_path: str, data: str, cfg: ExportConfig, family: str, columns: dict) -> Check:
    """Mean acceptance length on 8 held-out prompts at T=0 (the floor's) and at T=1 (seeded), both on one engine whose
    draft proposes as rollout's does (engine/proposals.py "auto"; at T=0 every mode proposes the argmax)."""
    from transformers import AutoTokenizer  # noqa: PLC0415 (heavy, loaded only on this path)

    draft_arg = str(folder)
    tok = AutoTokenizer.from_pretrained(model_path)
    split = verify_split(data, columns)
    prompts = encode_tasks(tok, load_source(data, **columns).tasks(split, VERIFY_PROMPTS), cfg)
    context = resolve_max_model_len(model_path, max(map(len, prompts)), VERIFY_TOKENS, extra=cfg.k,
                                    user=cfg.max_model_len, names=LengthSettings(max_tokens="export's verification "
                                                                                "tokens"), draft_path=draft_arg,
                                    method=family)
    engine = Engine(EngineConfig(model_path=model_path, draft_path=draft_arg, k=cfg.k, kv_cache_gib=1, method=family,
                                 **engine_kwargs(cfg), max_model_len=context))
    _, greedy = engine.generate(prompts, Sampling(max_tokens=VERIFY_TOKENS, temperature=0.0))
    _, sampled = engine.generate(prompts, Sampling(max_tokens=VERIFY_TOKENS, temperature=1.0, seed=VERIFY_SEED))
    proposals, why = resolve_proposals(engine.cfg.draft_sampling)
    return Check(greedy.mean_acceptance_length, sampled.mean_acceptance_length, proposals, why, engine.served_by, data,
                 len(prompts), VERIFY_TOKENS, VERIFY_SEED, split)


def render(r: ExportResult) -> None:
    acc = f", verified on vLLM: mean acceptance length {r.mean_acceptance_length:.2f}" if r.mean_acceptance_length else ""
    if r.mean_acceptance_length_t1 is not None:
        acc += f" at T=0, {r.mean_acceptance_length_t1:.2f} at T=1 ({r.proposals} proposals)"
    con = console(soft_wrap=True)
    con.print(f"[bold]export[/] {r.format} draft -> {r.out}{acc}")
    if r.pushed_to:
        con.print(f"uploaded to {r.pushed_to}")
    if r.snippet:
        con.print(f"[bold]{r.target}[/] config ({r.snippet_file}):\n{r.snippet.rstrip()}\n[dim]{r.note}[/]", markup=True,
                  highlight=False)

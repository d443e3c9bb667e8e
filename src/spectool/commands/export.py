"""`spectool export`: write a draft folder that stock vLLM loads, verified on the real engine.

Formats: `vllm` (plain EAGLE-3: config.json with LlamaForCausalLMEagle3 + model.safetensors, used
with speculative_config method "eagle3") and `speculators` (self-describing: vLLM reads the
algorithm, default k and verifier from `speculators_config`). The folder is written next to the
destination, loaded into vLLM with the policy, and run on a few prompts; only if it loads and
reaches the acceptance floor is it moved into place. Nothing half-written is left behind.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from spectool.config import ExportConfig
from spectool.data import load_source
from spectool.draft.checkpoint import DRAFT_JSON, WEIGHTS, check_tensors
from spectool.draft.dflash import MASK_EMBEDDING
from spectool.draft.families import FAMILIES, folder_family
from spectool.draft.guard import check_speculation
from spectool.draft.vocab import ids_from_d2t
from spectool.engine.engine import Engine, EngineConfig, Sampling
from spectool.errors import SpectoolError
from spectool.frameworks import check_target, snippet
from spectool.models import HUB_IDS, resolve_model
from spectool.prompts import encode_prompt
from spectool.runs import atomic_write_bytes
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


EXPORT_CONFIG = "export_config.json"  # the resolved settings (config.json is vLLM's)


def speculators_config(vllm_cfg: dict, k: int, verifier: str) -> dict:
    layer = {k2: v for k2, v in vllm_cfg.items() if k2 not in ("architectures", "eagle_config", "draft_vocab_size",
                                                                "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
                                                                "norm_before_residual")}
    layer["architectures"] = ["LlamaForCausalLM"]
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": vllm_cfg["draft_vocab_size"],
        "target_hidden_size": vllm_cfg["target_hidden_size"],
        "norm_before_residual": False,  # the speculators default is True; spectool drafts use False
        "eagle_aux_hidden_state_layer_ids": vllm_cfg["eagle_aux_hidden_state_layer_ids"],
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
        "torch_dtype": "float32",
    }


def run(cfg: ExportConfig) -> ExportResult:
    from spectool.runs import MANIFEST, atomic_dir, atomic_write_json, claim, make_manifest, read_json  # noqa: PLC0415 (binds a name this module uses otherwise)

    cfg.validate()
    src = Path(cfg.draft)
    if not (src / "config.json").exists() or not (src / WEIGHTS).exists():
        raise SpectoolError(f"--draft {src} is not a draft folder (needs config.json and {WEIGHTS}); make one with init-draft")
    meta = read_json(src / DRAFT_JSON) if (src / DRAFT_JSON).exists() else {}
    model_name = cfg.model or meta.get("policy")
    if not model_name:
        raise SpectoolError("the draft does not record its policy; pass --model")
    model = resolve_model(model_name)
    family = folder_family(src)
    if family in FAMILIES:  # else check_tensors names the families export takes
        check_speculation(model, family, str(src), cfg.k)
    check_tensors(src, model.path, family)
    if family != "eagle3" and cfg.format != "vllm":
        raise SpectoolError(f"--format {cfg.format}: spectool writes the speculators format for EAGLE-3 drafts only; a "
                            f"{family} draft folder is already what vLLM loads: use --format vllm")

    check_target(cfg.target, read_json(src / "config.json").get("eagle_aux_hidden_state_layer_ids") or [],
                 model.fingerprint["num_hidden_layers"], family)
    snip = snippet(cfg.target, str(Path(cfg.out).resolve()), cfg.k, _portable_name(model_name), family)
    claim(Path(cfg.out), "export", cfg, saved_as=EXPORT_CONFIG, replace=True)  # replaced whole, never a foreign folder

    with atomic_dir(Path(cfg.out)) as tmp:  # loaded and verified before it is moved into place
        if cfg.format == "vllm":
            shutil.copy2(src / WEIGHTS, tmp / WEIGHTS)
            if (src / MASK_EMBEDDING).exists():  # DFlash's trained mask embedding, read by vLLM beside the weights
                shutil.copy2(src / MASK_EMBEDDING, tmp / MASK_EMBEDDING)
        else:
            _speculators_weights(src / WEIGHTS, tmp / WEIGHTS, read_json(src / "config.json")["vocab_size"])
        vcfg = read_json(src / "config.json")
        conf = vcfg if cfg.format == "vllm" else speculators_config(vcfg, cfg.k, _portable_name(model_name))
        atomic_write_json(tmp / "config.json", conf)
        if meta:  # the draft's metadata travels with it: every draft check applies to the export too
            atomic_write_json(tmp / DRAFT_JSON, {**meta, "export_format": cfg.format})
        verify_data = _draft_data(src) or "chat"  # held-out prompts of the data the draft was trained on
        acc, served_by = _verify(tmp, model.path, verify_data, cfg, family) if cfg.verify else (None, None)
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
            served_by=served_by))
    return ExportResult(out=cfg.out, format=cfg.format, mean_acceptance_length=acc, target=cfg.target,
                        snippet_file=str(Path(cfg.out) / snip.filename), snippet=snip.text, note=snip.note)


def _speculators_weights(src: Path, dest: Path, vocab_size: int) -> None:
    """The weights as the speculators library names them: the decoder layer as `layers.0.*` (vLLM's
    loader maps `midlayer.*` to the same name), and with a reduced vocabulary a `t2d` mask [V] of
    the target ids in it beside `d2t` (vLLM skips t2d)."""
    import torch  # noqa: PLC0415 (heavy, loaded only on this path)
    from safetensors.torch import load_file, save  # noqa: PLC0415 (heavy, loaded only on this path)

    sd = {k.replace("midlayer.", "layers.0.", 1): v for k, v in load_file(str(src)).items()}
    if "d2t" in sd:
        t2d = torch.zeros(vocab_size, dtype=torch.bool)
        t2d[ids_from_d2t(sd["d2t"])] = True
        sd["t2d"] = t2d
    atomic_write_bytes(dest, save(sd))


def _portable_name(model_name: str) -> str:
    """The verifier named without this machine's paths: a hub id as given, the embedded default by
    its hub id, a local folder by its own name."""

    if model_name in HUB_IDS:
        return HUB_IDS[model_name]
    return Path(model_name).name if Path(model_name).exists() else model_name


def _draft_data(src: Path) -> str | None:
    from spectool.runs import MANIFEST, read_json  # noqa: PLC0415 (binds a name this module uses otherwise)

    m = read_json(src / MANIFEST) if (src / MANIFEST).exists() else {}
    data = m.get("harvest_data")
    if not data:
        return None
    is_file = data.endswith((".jsonl", ".parquet"))
    return data if not is_file or Path(data).exists() else None


def _verify(folder: Path, model_path: str, data: str, cfg: ExportConfig, family: str) -> tuple[float, str]:
    """(mean acceptance length on 8 held-out prompts at T=0, the build and runner that served the draft)."""
    from transformers import AutoTokenizer  # noqa: PLC0415 (heavy, loaded only on this path)

    draft_arg = str(folder)
    engine = Engine(EngineConfig(model_path=model_path, draft_path=draft_arg, k=cfg.k, kv_cache_gib=1, method=family,
                                 gpu_memory_utilization=cfg.gpu_memory_utilization, dtype=cfg.dtype))
    tok = AutoTokenizer.from_pretrained(model_path)
    tasks = load_source(data).tasks("eval", 8)
    _, stats = engine.generate([encode_prompt(tok, t.prompt) for t in tasks], Sampling(max_tokens=32, temperature=0.0))
    return stats.mean_acceptance_length, engine.served_by


def render(r: ExportResult) -> None:
    acc = f", verified on vLLM: mean acceptance length {r.mean_acceptance_length:.2f}" if r.mean_acceptance_length else ""
    con = console(soft_wrap=True)
    con.print(f"[bold]export[/] {r.format} draft -> {r.out}{acc}")
    if r.snippet:
        con.print(f"[bold]{r.target}[/] config ({r.snippet_file}):\n{r.snippet.rstrip()}\n[dim]{r.note}[/]", markup=True,
                  highlight=False)

"""What init-draft trains on, checked before it is made: the harvest (run first when --data is a data source; its
model and rendering must be the run's), its split by prompt, the policy's features per --features (features.py), and
the memory and disk they would take (refused before anything is harvested or written)."""

from __future__ import annotations

import gc
import hashlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spectool.config.init_draft import InitDraftConfig
from spectool.data import load_source
from spectool.errors import SpectoolError
from spectool.families import FAMILIES
from spectool.features import (
    GIB,
    Groups,
    InMemory,
    OnTheFly,
    Streamed,
    check_harvest_contents,
    eval_sample,
    harvest_identity,
    harvest_shards,
    iter_column,
    misfit,
    record_lengths,
    resident,
    save_or_advise,
    token_groups,
    write_shards,
)
from spectool.harvesting import HarvestConfig, harvest
from spectool.hidden import bytes_per_token, content_misfit, default_aux_layer_ids
from spectool.models import fingerprint_mismatch
from spectool.precision import draft_dtype
from spectool.prompts import encode_tasks, rendering
from spectool.records import load_records
from spectool.runs import load_manifest
from spectool.settings.engine import EngineSettings, EngineShare, values


def _harvest_if_needed(cfg: InitDraftConfig) -> Path:
    """The harvest run to train on; harvests first when --data is a data source."""
    from spectool.runs import MANIFEST  # noqa: PLC0415 (binds a name this module uses otherwise)

    p = Path(cfg.data)
    if (p / MANIFEST).exists():
        return p

    run_dir = Path(cfg.out) / "harvest"
    harvest(_harvest_config(cfg))
    gc.collect()  # the harvest's engine goes before the policy and the draft take the device
    return run_dir


def _harvest_config(cfg: InitDraftConfig) -> HarvestConfig:
    """The harvest of --data (a data source) init-draft runs first, into --out/harvest."""
    return HarvestConfig(model=cfg.model, data=cfg.data, system_prompt=cfg.system_prompt,
                         chat_template_kwargs=cfg.chat_template_kwargs, out=str(Path(cfg.out) / "harvest"),
                         split="train", sampling=cfg.harvest, prompt_col=cfg.prompt_col, answer_col=cfg.answer_col,
                         **values(cfg, EngineSettings), **values(cfg, EngineShare))


MIN_RECORDS = 4  # a harvest with fewer cannot be split into training and held-out records (training_data)


def check_source_harvest(cfg: InitDraftConfig) -> None:
    """What the harvest of --data (a data source) would refuse, asked before --out is claimed (a refused run writes
    nothing, so a rerun with the settings the refusal names goes into the same --out): the harvest's own checks
    (harvesting.checked_inputs: the context past the model's limit or shorter than the run needs, a system prompt
    over the data's own) and a harvest too small to train on."""
    from spectool.harvesting import checked_inputs  # noqa: PLC0415 (binds a name this module uses otherwise)

    _, _, tasks, _ = checked_inputs(_harvest_config(cfg))
    records = len(tasks) * cfg.harvest.samples
    if records < MIN_RECORDS:
        raise SpectoolError(f"--data {cfg.data} gives {len(tasks)} prompt(s) x --samples {cfg.harvest.samples} = "
                            f"{records} harvest records; init-draft needs at least {MIN_RECORDS} (some are held out): "
                            "raise --n-prompts or --samples")


def check_harvest_rendering(cfg: InitDraftConfig, run_dir: Path, manifest: dict) -> None:
    """A harvest run given as --data keeps the prompts it rendered: --system-prompt or --chat-template-kwargs, when
    set, must be what it was rendered with (an older harvest recorded none: no system prompt, no kwargs)."""
    asked, own = rendering(cfg), {**rendering(None), **(manifest.get("rendering") or {})}
    for key in ("system_prompt", "chat_template_kwargs"):
        if getattr(cfg, key) is not None and asked[key] != own[key]:
            flag = "--" + key.replace("_", "-")
            raise SpectoolError(f"{flag} {asked[key]!r}: harvest run {run_dir} rendered its prompts with {own[key]!r}, "
                                f"and a harvest run keeps its records; drop {flag}, or harvest again with it (--data "
                                "a data source harvests with it first)")


@dataclass
class TrainingData:
    run_dir: Path
    manifest: dict
    records: object  # datasets.Dataset of harvest records
    train: np.ndarray  # [train records] int32 record indices
    heldout: list[int]  # the evaluated sample of whole prompts never trained on (features.eval_sample: bounded)
    prompt_lens: np.ndarray  # [records] int64
    lengths: np.ndarray  # [records] int64 prompt + response tokens
    model_path: str  # the policy's folder
    identity: str = ""  # features.harvest_identity: a resume over a changed harvest is refused
    weights: str = ""  # models.weights_digest of --model: features of other weights are not used

    def seq(self, i: int) -> list[int]:
        """Record i's prompt + response ids (read from the memory-mapped records, one record at a time)."""
        r = self.records[int(i)]
        return r["prompt_ids"] + r["response_ids"]


def _tokens_to_cache(cfg: InitDraftConfig, model) -> int:
    """Tokens whose features init-draft will cache: 0 when its cache exists or the harvest's
    --hidden-states shards hold them; a harvest run's exact count; for a data source still to be
    harvested, the most it can produce (n_prompts x samples x (longest prompt + max_tokens))."""
    from spectool.runs import MANIFEST, read_json  # noqa: PLC0415 (binds a name this module uses otherwise)

    if cfg.features == "online" or (cfg.features == "cache" and (Path(cfg.out) / ".train" / "features.safetensors").exists()):
        return 0
    p = Path(cfg.data)
    if (p / MANIFEST).exists():
        lengths = record_lengths(load_records(p))[1]
        ids = _layer_ids(cfg, model.fingerprint["num_hidden_layers"])  # what the draft reads (training_features)
        if _usable_shards(cfg, harvest_shards(p, ids, read_json(p / MANIFEST), lengths, weights=model.weights), lengths,
                          say=False):
            return 0
        return int(lengths.sum())
    tasks, longest_prompt = _source_prompts(cfg, model)
    return tasks * cfg.harvest.samples * (longest_prompt + cfg.harvest.max_tokens)


def _source_prompts(cfg: InitDraftConfig, model) -> tuple[int, int]:
    """(prompts, the longest prompt's tokens) of the data source --data harvests."""
    from transformers import AutoTokenizer  # noqa: PLC0415 (heavy, loaded only on this path)

    h = cfg.harvest
    tok = AutoTokenizer.from_pretrained(model.path)
    tasks = load_source(cfg.data, seed=h.seed, prompt_col=cfg.prompt_col, answer_col=cfg.answer_col).tasks(
        "train", h.n_prompts)
    return len(tasks), max(map(len, encode_tasks(tok, tasks, cfg)))


def _longest_record(cfg: InitDraftConfig, model) -> int:
    """Tokens of the longest training record: a harvest run's exact figure; for a data source still to be harvested
    the most it can produce (the longest prompt + --max-tokens)."""
    from spectool.runs import MANIFEST  # noqa: PLC0415 (binds a name this module uses otherwise)

    p = Path(cfg.data)
    if (p / MANIFEST).exists():
        return int(record_lengths(load_records(p))[1].max())
    return _source_prompts(cfg, model)[1] + cfg.harvest.max_tokens


def policy_dtype(cfg: InitDraftConfig) -> str:
    """The dtype the policy computes the draft's features in: bfloat16 where the engine serves it (the engine
    sampled the records in bfloat16 and the served draft reads its bfloat16 hidden states; the features are stored
    in half precision either way), else float32 (a float16 engine's included: precision.trainer_dtype); float32
    for --method mtp, whose layers read the policy's lm_head at every unroll step (a bfloat16 head would be
    widened each time)."""
    from spectool.precision import engine_dtype, trainer_dtype  # noqa: PLC0415 (reads the device)

    return "float32" if cfg.method == "mtp" else trainer_dtype(engine_dtype(cfg.dtype))


def check_memory(cfg: InitDraftConfig, model, total_bytes: int) -> list:
    """Print init-draft's one-GPU memory plans (memory.init_draft_plans: the policy in `policy_dtype`, the draft's
    weights, gradients and AdamW, a step's logits and attention at --max-batch-tokens, the feature forward) and
    refuse, naming --dtype, --features or --max-batch-tokens, what cannot fit on a GPU of `total_bytes`."""
    import os  # noqa: PLC0415 (binds a name this module uses otherwise)

    from transformers import AutoConfig  # noqa: PLC0415 (heavy, loaded only on this path)

    from spectool.draft.checkpoint import draft_shape  # noqa: PLC0415 (binds a name this module uses otherwise)
    from spectool.draft.mtp_folder import read_config  # noqa: PLC0415 (binds a name this module uses otherwise)
    from spectool.memory import check_init_draft, init_draft_plans  # noqa: PLC0415 (binds a name this module uses otherwise)

    config = AutoConfig.from_pretrained(model.path).get_text_config()
    anchors = cfg.anchor_fraction if cfg.anchor_fraction is not None else FAMILIES[cfg.method].anchor_fraction
    shape = draft_shape(config, cfg.method, cfg.draft_vocab_size, cfg.draft_layers, cfg.ttt_steps, anchors,
                        read_config(Path(model.path)) if cfg.method == "mtp" else None)
    longest, n_aux = _longest_record(cfg, model), len(_layer_ids(cfg, config.num_hidden_layers))
    dtype = policy_dtype(cfg)
    per_rank = -(-cfg.batch_size // int(os.environ.get("WORLD_SIZE", "1")))  # each process trains its share of a step

    def replan(policy_dtype: str = dtype, features: str = cfg.features, max_batch_tokens: int = cfg.max_batch_tokens):
        group = max(cfg.shard_tokens, longest) if features == "stream" else 1 << 40  # cache: every record at once
        return init_draft_plans(config, shape, total_bytes=total_bytes, policy_dtype=policy_dtype, features=features,
                                max_batch_tokens=max_batch_tokens, batch_size=per_rank, longest=longest,
                                group_tokens=group, n_aux=n_aux, draft_dtype=draft_dtype(cfg.draft_dtype))

    plans = replan()
    check_init_draft(plans, config, replan, policy_dtype=dtype, features=cfg.features, max_batch_tokens=cfg.max_batch_tokens,
                     dtype_flag=cfg.method != "mtp", draft_dtype=draft_dtype(cfg.draft_dtype))
    if os.environ.get("RANK", "0") == "0":  # one print under accelerate launch
        print("\n".join(p.text() for p in plans))
    return plans


def _layer_ids(cfg: InitDraftConfig, num_layers: int) -> list[int]:
    """The policy hidden states the draft reads: EAGLE-3's aux layers, or the MTP layer's one (the
    trunk's pre-norm output, id N)."""

    return [num_layers] if cfg.method == "mtp" else default_aux_layer_ids(num_layers)


def check_disk_budget(cfg: InitDraftConfig, model) -> None:
    """Refuse, before anything is written, policy features over --disk-budget-gb (default: the free space where
    --out will live); stream shards already written count as spent. (`stream` checks again per shard.)"""

    per_token = bytes_per_token(model.fingerprint["hidden_size"], len(_layer_ids(cfg, model.fingerprint["num_hidden_layers"])))
    written = sum(p.stat().st_size for p in (Path(cfg.out) / ".train" / "features").glob("shard-*.safetensors")
                  if cfg.features == "stream")
    need = _tokens_to_cache(cfg, model) * per_token - written
    if need <= 0:
        return
    where = next(q for q in [Path(cfg.out).absolute(), *Path(cfg.out).absolute().parents] if q.exists())
    free = shutil.disk_usage(where).free
    budget = cfg.disk_budget_gb * GIB - written if cfg.disk_budget_gb is not None else free
    if need > min(budget, free):
        limit = (f"--disk-budget-gb is {cfg.disk_budget_gb:g}" if cfg.disk_budget_gb is not None and budget <= free
                 else f"{where} has {free / GIB:.2f} GiB free")
        raise SpectoolError(
            f"the policy features would take up to {need / GIB:.2f} GiB more "
            f"({per_token / 1024:.1f} KiB per token) and {limit}; --features online computes them in the training "
            "loop and takes no disk (a policy forward per record per epoch), or put --out on a larger disk, or raise "
            "--disk-budget-gb")


def training_data(cfg: InitDraftConfig, model) -> TrainingData:
    """The harvest's records, split by prompt (deterministic hash): held-out prompts never train."""

    run_dir = _harvest_if_needed(cfg)
    hm = load_manifest(run_dir, "harvest")
    if hm["model_identity"] != model.identity:
        diff = fingerprint_mismatch(hm.get("model_fingerprint", {}), model.fingerprint)
        raise SpectoolError(f"harvest run {run_dir} was made with model {hm['model']}, not {cfg.model}"
                            + (f" ({'; '.join(diff)}: harvest's model vs this one)" if diff else ""))
    records = load_records(run_dir)
    if len(records) < MIN_RECORDS:
        raise SpectoolError(f"harvest run {run_dir} has {len(records)} records; at least {MIN_RECORDS} are needed")
    held = np.fromiter((int(hashlib.sha256(p.encode()).hexdigest()[:8], 16) % 1000 < cfg.eval_fraction * 1000
                        for p in iter_column(records, "prompt_id")), dtype=bool, count=len(records))  # [records]
    if held.all() or not held.any():  # too few prompts for a hash split: hold out the last record
        held = np.arange(len(held)) == len(held) - 1
    prompt_lens, lengths = record_lengths(records)
    heldout = eval_sample(np.flatnonzero(held), lengths, cfg.seed)  # bounded at any data size
    return TrainingData(run_dir, hm, records, np.flatnonzero(~held).astype(np.int32), heldout, prompt_lens, lengths,
                 model.path, harvest_identity(run_dir), model.weights)


def _usable_shards(cfg: InitDraftConfig, shards: list, lengths: list[int], say: bool = True) -> list:
    """A harvest's --hidden-states shards, when each holds at most --shard-tokens tokens (a GPU harvest's shard of
    1,024 reasoning-length sequences would not: a stream window must stay bounded), else [] (the features are then
    computed here)."""
    if any(lengths[idx].sum() > cfg.shard_tokens for _, idx in shards):
        if say:
            print(f"the harvest's --hidden-states shards hold more than --shard-tokens {cfg.shard_tokens} tokens each; "
                  "init-draft computes its own shards (raise --shard-tokens to read them as they are)")
        return []
    return shards


@dataclass
class TrainingFeatures:
    train: object  # features.InMemory | Streamed | OnTheFly: .items(record indices) -> FeatureItems
    heldout: object  # the held-out sample's items, in memory (cache: every record's)
    anywhere: object  # any training record's items, for the report's sample: cache's memory, stream's shards, online's
    # policy
    groups: Groups  # the training records' shuffle groups (features.epoch_order)
    disk_bytes: int  # disk the features took in --out (0: online, or a harvest's own shards)


def training_features(cfg: InitDraftConfig, policy, data: TrainingData, layer_ids: list[int], folder: Path) -> TrainingFeatures:
    """The policy's features per --features (features.py): `stream` from the harvest's --hidden-states shards
    when they hold these layers, else from shards written here (resumable, the disk budget checked per shard);
    `online` from the policy per batch; `cache` from one file loaded whole (the harvest's shards, or computed
    once and saved). The held-out sample's features (bounded: features.eval_sample) are read once and kept."""
    from rich.progress import Progress  # noqa: PLC0415 (binds a name this module uses otherwise)

    from spectool.hidden import feature_items, load_features  # noqa: PLC0415 (binds a name this module uses otherwise)

    pin = next(policy.parameters()).device.type == "cuda"  # training batches copy from here to the GPU
    shards = _usable_shards(cfg, harvest_shards(data.run_dir, layer_ids, data.manifest, data.lengths, weights=data.weights,
                                                say=True), data.lengths)
    check_harvest_contents(shards)  # read whole once per start: bytes changed under an intact header are refused
    groups = (Groups.of(idx for _, idx in shards).keep(data.train) if shards
              else token_groups(data.train, data.lengths, cfg.shard_tokens))
    identity = {"harvest": data.identity, "records": len(data.records), "shard_tokens": cfg.shard_tokens,
                "policy": data.manifest["model_identity"], "policy_weights": data.weights}
    # with the layer ids: what the features were computed from (the policy's shapes and its weights)
    online = OnTheFly(policy, data.seq, layer_ids)
    if cfg.features == "online":
        return TrainingFeatures(online, resident(online, data.heldout), online, groups, 0)
    if cfg.features == "stream":
        disk, harvest = 0, shards
        if not shards:
            tokens = int(data.lengths[data.train].sum())
            print(f"policy features: {tokens} tokens in {len(groups)} shards of <= {cfg.shard_tokens} tokens, "
                  f"{tokens * bytes_per_token(policy.config.hidden_size, len(layer_ids)) / GIB:.2f} GiB at "
                  f"{folder / 'features'}; {cfg.shuffle_window} in memory at a time")
            with Progress() as bar:
                job = bar.add_task("policy features", total=len(data.train))
                shards = write_shards(policy, groups, data.seq, layer_ids, folder / "features",
                                      cfg.disk_budget_gb * GIB if cfg.disk_budget_gb is not None else None,
                                      on_shard=lambda n: bar.advance(job, n), lengths=data.lengths, identity=identity)
            disk = sum(p.stat().st_size for p, _ in shards)
        heldout = resident(Streamed(harvest, 1) if harvest else online, data.heldout)
        # the report's training sample reads the shards too: the policy is freed once they are written (run)
        return TrainingFeatures(Streamed(shards, cfg.shuffle_window, pin), heldout, Streamed(shards, 1), groups, disk)
    cache = folder / "features.safetensors"  # held in memory whole, as the first release held it
    meta = {"features": json.dumps({**identity, "layer_ids": [int(x) for x in layer_ids]}, sort_keys=True)}
    if cache.exists() and (why := misfit(cache, meta) or content_misfit(cache)):
        print(f"the features cache {cache} is not used: {why}; it is a cache of the policy's forward: computing it "
              "again", file=sys.stderr)
        cache.unlink()
    if cache.exists():
        items = load_features(cache, pin, resident=True)
    elif shards:
        items = [x for p, _ in shards for x in load_features(p, pin, resident=True)]
    else:
        print(f"policy features: {data.lengths.sum()} tokens, a "
              f"{data.lengths.sum() * bytes_per_token(policy.config.hidden_size, len(layer_ids)) / GIB:.2f} GiB cache "
              f"at {cache}, loaded whole")
        with Progress() as bar:
            job = bar.add_task("policy hidden states", total=len(data.records))
            items = feature_items(policy, [data.seq(i) for i in range(len(data.records))], layer_ids,
                                  on_batch=lambda n: bar.advance(job, n))
        save_or_advise(cache, items, meta, "nothing else is written before it")
        items = load_features(cache, pin=True) if pin else items
    whole = InMemory(dict(enumerate(items)))
    return TrainingFeatures(whole, whole, whole, groups, cache.stat().st_size if cache.exists() else 0)

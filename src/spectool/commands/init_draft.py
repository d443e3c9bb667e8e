"""`spectool init-draft`: train a draft on the policy's own in-domain rollouts: EAGLE-3 (a chain),
P-EAGLE or DFlash (`--method peagle | dflash`: parallel drafters, every block position trained at
every anchor; families.py), or (`--method mtp`) fine-tune the policy's own MTP layers on
them, trunk frozen (draft/mtp.py). Every family trains through the same unroll contract and loss.

Workflow (`run`, phase by phase):
 1. data: a harvest run dir, or a data source that is harvested first (the draft must learn the
    policy's outputs, not reference answers);
 2. the frozen policy (transformers; bfloat16 on a GPU as the engine samples, float32 on a CPU:
    commands/init_draft_inputs.policy_dtype)
    supplies aux hidden states and target distributions, streamed from bounded shards on disk (written once; a
    resume keeps them), computed per batch and kept on the device (`--features online`), or held whole (`cache`):
    features.py; once they are written (stream, cache) the policy is freed but for its output embedding. On a GPU
    a memory plan for all of it is printed, and refused where it cannot fit, before anything is harvested
    (commands/init_draft_inputs.check_memory, memory.init_draft_plans);
 3. the draft vocabulary = most frequent response tokens (coverage printed); embedding and lm_head
    rows from the policy, or warm start from --init-from;
 4. training-time-test unroll over `ttt_steps` positions (>= the largest k you will run), the
    weighted per-position loss `--loss` (loss.py: ce, tv, their sum mix (the default), or tv-heavy; its
    positions weighted by `--position-weights`: decay (the default), rejection or reach), AdamW +
    cosine schedule, under `accelerate`;
 5. held-out per-position top-1 agreement and expected acceptance; metrics.jsonl; a checkpoint
    every `save_every` steps; a killed run resumes at the next step; final vLLM-loadable folder;
 6. the report: per position, on held-out prompts and on as many training records, the draft's
    acceptance proxies next to the greedy oracle's (ttt.METRICS), and the acceptance lengths they
    imply at T=0, T=1 greedy and T=1 probabilistic.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from spectool import ranks
from spectool.commands.init_draft_inputs import (
    TrainingData,
    TrainingFeatures,
    check_disk_budget,
    check_harvest_rendering,
    check_memory,
    check_source_harvest,
    policy_dtype,
    training_data,
    training_features,
)
from spectool.config.init_draft import InitDraftConfig
from spectool.draft.checkpoint import draft_metadata, save_draft
from spectool.draft.guard import Flags, check_speculation
from spectool.draft.mtp_folder import check_trainable, load_mtp, save_mtp_model
from spectool.draft.training import DraftTrainer
from spectool.draft.ttt import chain_length, heldout_metrics, micro_batches, ttt_step_loss
from spectool.draft.vocab import build_vocab, ids_from_d2t
from spectool.errors import SpectoolError
from spectool.families import FAMILIES
from spectool.features import GIB, Lazy, epoch_order, iter_column
from spectool.hidden import default_aux_layer_ids
from spectool.models import resolve_model
from spectool.precision import draft_autocast, draft_dtype
from spectool.runs import append_jsonl, claim, load_manifest, truncate_jsonl
from spectool.trackers import open_trackers
from spectool.ui import console

RUN_CONFIG = "init_draft.json"  # the resolved settings (config.json in a draft folder is vLLM's)
RESUME_MAY_CHANGE = {"save_every", "disk_budget_gb", "preset", "features", "harvest_identity", "draft_dtype",
                     "max_model_len", "recompute_loss", "report_to", "model_weights", "enforce_eager"}
# a rerun may change these and resume (harvest_identity: checked by check_harvest, which names what changed;
# model_weights: by check_weights;
# max_model_len: a context too short for the harvest is refused, so records never differ; recompute_loss: the same
# loss and gradients; enforce_eager: how the harvest engine starts, its samples the policy's either way)
# (every --features trains the same draft: a stream run short of disk resumes with --features online)
# the settings runs made before each was added are compared as: a resume goes on with them (an older run within one
# shuffle window, 131,072 tokens, and within 8,192 tokens a batch, as every earlier demo run was, draws as it drew)
OLDER_RUNS = {"anchor_fraction": 1.0, "position_weights": "decay", "features": "cache", "max_steps": None,
              "shard_tokens": 32768, "shuffle_window": 4, "max_batch_tokens": 8192, "draft_dtype": "float32",
              "recompute_loss": False}


@dataclass
class InitDraftResult:
    out: str
    steps: int
    coverage: float
    heldout: dict[str, list[float]]  # ttt.METRICS per draft position and ttt.WALKS per k, held-out prompts
    train: dict[str, list[float]]  # the same on as many training records: the gap says whether data limits
    train_tokens_per_s: float
    draft_to_policy_cost: float  # measured forward time ratio per drafted token
    feature_cache_bytes: int  # disk the policy features took (0: online, or a harvest's shards were reused)
    seconds: float
    main_process: bool = True  # False on the other ranks of `accelerate launch` (they print nothing)
    family: str = "eagle3"  # the drafter family trained (families.py)
    features: str = "cache"  # where the policy's features came from (--features)
    peak_memory_gib: float = 0.0  # GPU: the largest step's peak allocated; CPU: the process's peak RSS
    longest_sequence: int = 0  # tokens of the longest training record: positions beyond were never trained

    def context_free(self) -> bool:
        """A parallel draft whose held-out agreement is the same at every block position: it proposes
        a context-free guess (measured: DFlash at 246 steps from scratch, docs/drafters.md), where a
        draft that reads the policy's state agrees more at position 1 than further out."""

        top1 = self.heldout["top1"]
        return FAMILIES[self.family].parallel and len(top1) > 1 and max(top1) - min(top1) < 0.02

    def acceptance_lengths(self, which: str = "heldout", k: int | None = None) -> dict[str, float]:
        """Expected acceptance length at k (default: every trained position): T=1 greedy (draft and
        oracle) walked over the records as the engine drafts (exact, ttt.WALKS); T=0 and T=1
        probabilistic chained from the per-position proxies (no exact walk exists for them on T=1 paths)."""

        m = {key: v[:k] for key, v in getattr(self, which).items()}
        return {"T=0": chain_length(m["top1"]), "T=1 greedy": m["walk_greedy"][-1],
                "T=1 probabilistic": chain_length(m["p_accept_sampled"]),
                "T=1 greedy oracle": m["walk_oracle"][-1], "T=1 probabilistic oracle": len(m["top1"]) + 1.0}


def claim_out(cfg: InitDraftConfig) -> str | None:
    """Refuse an --out that holds anything but an init-draft run with these settings, before
    anything is written; then record the settings (a rerun of the same command resumes), keeping the
    harvest identity an earlier run recorded, which it returns (None: none yet)."""
    from spectool.runs import read_json  # noqa: PLC0415 (binds a name this module uses otherwise)

    saved = Path(cfg.out) / RUN_CONFIG
    before = read_json(saved) if saved.exists() else {}
    recorded = before.get("harvest_identity")
    claim(Path(cfg.out), "mtp-model" if cfg.method == "mtp" else "draft",
          {**dataclasses.asdict(cfg), "harvest_identity": recorded, "model_weights": before.get("model_weights")},
          saved_as=RUN_CONFIG,
          may_change=RESUME_MAY_CHANGE, defaults=OLDER_RUNS,
          hint=f" (--init-from {cfg.out} warm-starts a new draft from it)")
    return recorded


def check_harvest(cfg: InitDraftConfig, data: TrainingData, recorded: str | None) -> None:
    """Refuse a resume over a harvest that changed since the run recorded it (its records re-run, resumed or grown,
    its --hidden-states shards added or removed: the features and the epoch order would be another run's); a run
    that recorded none records this one's."""
    from spectool.runs import atomic_write_json, read_json  # noqa: PLC0415 (binds a name this module uses otherwise)

    if recorded not in (None, data.identity):
        raise SpectoolError(f"--out {cfg.out} was trained on harvest {data.run_dir} as it was then (identity "
                            f"{recorded}); it has changed since ({data.identity}: its records or --hidden-states "
                            f"shards differ). Pick a new --out to train on it as it is now (--init-from {cfg.out} "
                            "warm-starts from this draft), or restore the harvest to resume")
    if recorded is None:
        saved = Path(cfg.out) / RUN_CONFIG
        atomic_write_json(saved, {**read_json(saved), "harvest_identity": data.identity})


def check_weights(cfg: InitDraftConfig, weights: str) -> None:
    """Refuse a resume whose draft checkpoint was trained on features of other policy weights than --model holds now
    (an RL checkpoint saved over the folder since: the draft would go on from the old policy's features onto the new
    one's, a mix no single policy computes); without a checkpoint yet the run goes on (its features, a cache, are
    computed again: features.write_shards). Records the weights (models.weights_digest) in init_draft.json."""
    from spectool.runs import atomic_write_json, read_json  # noqa: PLC0415 (binds a name this module uses otherwise)

    saved = Path(cfg.out) / RUN_CONFIG
    recorded = read_json(saved).get("model_weights")
    if recorded not in (None, weights) and (Path(cfg.out) / ".train" / "checkpoint.pt").exists():
        raise SpectoolError(f"--out {cfg.out} holds a draft trained on the features of other weights of --model "
                            f"{cfg.model} (weights digest {recorded}; the folder holds {weights} now: another "
                            f"checkpoint). Pick a new --out to train on these weights (--init-from {cfg.out} "
                            "warm-starts from this draft), or restore the earlier weights to resume")
    if recorded != weights:
        atomic_write_json(saved, {**read_json(saved), "model_weights": weights})


def _setup(cfg: InitDraftConfig):
    """Checks, the accelerator, the claimed --out, the training data and the policy on its device."""
    from accelerate import Accelerator  # noqa: PLC0415 (heavy, loaded only on this path)
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 (heavy, loaded only on this path)

    model = resolve_model(cfg.model)
    if cfg.method == "mtp":  # fail before any harvesting or training
        check_trainable(Path(model.path))
    if cfg.init_from and not Path(cfg.init_from).exists():
        raise SpectoolError(f"--init-from {cfg.init_from} does not exist")
    # the family, the warm start, and whether the installed vLLM could serve such a draft for this policy at all
    check_speculation(model, cfg.method, cfg.init_from, 1, Flags(draft="--init-from"))
    # Every check that can refuse runs before --out is claimed: a refused run writes nothing, so the rerun its message
    # advises (other settings, the same --out) is no "run with other settings".
    data = None
    if (Path(cfg.data) / "manifest.json").exists():  # a harvest run: read and checked whole here
        check_harvest_rendering(cfg, Path(cfg.data), load_manifest(Path(cfg.data), "harvest"))
        data = training_data(cfg, model)
    else:  # a data source: what its harvest (run after the claim, into --out/harvest) would refuse
        check_source_harvest(cfg)
    if cfg.init_from:
        from spectool.draft.checkpoint import check_fits, load_draft  # noqa: PLC0415 (binds a name this module uses otherwise)

        # read as the policy will load it (_initial_draft): vLLM's default aux layers where the folder names none
        warm, _ = load_draft(Path(cfg.init_from), num_layers=model.fingerprint["num_hidden_layers"])
        check_fits(warm.config, model.fingerprint, Path(cfg.init_from))
        if warm.config.num_hidden_layers != cfg.draft_layers:
            raise SpectoolError(f"--init-from {cfg.init_from} has {warm.config.num_hidden_layers} decoder layer(s); "
                                f"pass --draft-layers {warm.config.num_hidden_layers} (a warm start keeps its depth)")
    if torch.cuda.is_available():  # before anything is harvested (hours on real data)
        check_memory(cfg, model, torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    # Under `accelerate launch`, the main process harvests and caches features; the others wait.
    check_disk_budget(cfg, model)  # before --out is claimed or anything is harvested
    acc = Accelerator(cpu=not torch.cuda.is_available())
    if acc.device.type == "cuda":  # the draft trains in float32: TF32 tensor cores for its matmuls
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if cfg.batch_size < acc.num_processes:
        raise SpectoolError(f"--batch-size {cfg.batch_size} is smaller than the {acc.num_processes} processes; "
                            f"use --batch-size >= {acc.num_processes} (each process takes a share of a batch)")
    if acc.num_processes > 1 and not (Path(cfg.data) / "manifest.json").exists():
        raise SpectoolError(f"--data {cfg.data} is a data source; under accelerate launch pass a harvest run "
                            "instead (spectool harvest --out H ..., then --data H): vLLM runs in one process")
    # one process claims --out (a refusal raised on every rank); every rank must see it (a launch across nodes:
    # a shared filesystem), as the feature cache and checkpoints the main process writes there are read by all
    recorded = ranks.claim_folder(Path(cfg.out), lambda: claim_out(cfg))
    if data is None:  # a data source, harvested here
        data = training_data(cfg, model)
    if acc.is_main_process:
        check_harvest(cfg, data, recorded)
        check_weights(cfg, data.weights)
    # The policy is loaded after the harvest's engine is gone: on a GPU it then has the memory to
    # itself, and features and training run there (accelerate's device).
    policy = AutoModelForCausalLM.from_pretrained(model.path, dtype=getattr(torch, policy_dtype(cfg)))
    policy = policy.eval().requires_grad_(False)
    policy.to(acc.device)
    if acc.is_main_process:
        (Path(cfg.out) / ".train").mkdir(parents=True, exist_ok=True)
    acc.wait_for_everyone()
    return model, acc, data, policy


def _initial_draft(cfg: InitDraftConfig, policy, data: TrainingData, main: bool):
    """(draft, target ids of its vocabulary [Vd], coverage of training responses): fresh, warm
    started with its vocabulary map kept, or warm started and remapped (--remap-vocab)."""
    from spectool.draft.checkpoint import load_draft, new_draft, remap_vocab  # noqa: PLC0415 (binds a name this module uses otherwise)

    def responses():  # the training records' response ids, a batch of records at a time (never all in memory)
        return iter_column(data.records.select(data.train), "response_ids")

    if cfg.method == "mtp":  # the model's own MTP layers over the full vocabulary, with its lm_head

        return load_mtp(data.model_path, policy), torch.arange(policy.config.vocab_size), 1.0
    vsize = min(cfg.draft_vocab_size, policy.config.vocab_size)
    if not cfg.init_from:
        target_ids, coverage = build_vocab(responses(), policy.config.vocab_size, vsize)
        torch.manual_seed(cfg.seed)
        layers = default_aux_layer_ids(policy.config.num_hidden_layers)
        return new_draft(policy, target_ids, layers, cfg.draft_layers, family=cfg.method), target_ids, coverage
    warm, _ = load_draft(Path(cfg.init_from), policy)
    if not cfg.remap_vocab:  # keep the warm start's vocabulary map
        target_ids = ids_from_d2t(warm.d2t)
        return warm, target_ids, _coverage(responses(), target_ids)
    old_coverage = _coverage(responses(), ids_from_d2t(warm.d2t))
    target_ids, coverage = build_vocab(responses(), policy.config.vocab_size, vsize)
    draft, kept = remap_vocab(warm, target_ids, policy)
    if main:
        print(f"--remap-vocab: draft vocabulary {warm.config.draft_vocab_size} -> {len(target_ids)} tokens, "
              f"{kept} lm_head rows kept from {cfg.init_from}; coverage of these responses "
              f"{old_coverage:.1%} -> {coverage:.1%}")
    return draft, target_ids, coverage


def train_step(cfg: InitDraftConfig, tr: DraftTrainer, items: list, prompt_lens: list[int], W_dv: torch.Tensor,
               draw: torch.Generator) -> tuple[float, list[float], float]:
    """One optimizer step over a batch, in micro-batches of at most --max-batch-tokens tokens, each packed into one
    row without padding (ttt.collate_packed: records apart in attention, the same loss as padded; a longer record
    alone; the whole batch at once when it fits), each micro-batch's loss weighted by its share of the batch's
    response tokens, gradients accumulated.
    (loss, per-unroll-step losses, the share of the forwards' tokens that were padding: 0 when packed)."""
    parts = micro_batches([len(x[0]) for x in items], prompt_lens, cfg.max_batch_tokens)
    loss_sum, per_step = 0.0, [0.0] * cfg.ttt_steps
    seen = [0.0] * cfg.ttt_steps
    for n, (mb, share) in enumerate(parts):
        # under accelerate launch only the last micro-batch's backward syncs gradients (ranks may run different counts)
        sync = contextlib.nullcontext() if n == len(parts) - 1 else tr.acc.no_sync(tr.draft)
        with sync:
            with draft_autocast(cfg.draft_dtype, tr.acc.device):  # --draft-dtype: the forward and loss (weights float32)
                loss, steps = ttt_step_loss(tr.draft, [items[i] for i in mb], [prompt_lens[i] for i in mb], W_dv,
                                            cfg.ttt_steps, cfg.step_decay, tr.acc.device, cfg.loss, cfg.anchor_fraction,
                                            draw, cfg.position_weights, pack=True, recompute=cfg.recompute_loss)
            tr.backward(loss * share)
        loss_sum += share * float(loss.detach())
        for j, x in enumerate(steps):
            if x == x:  # a step with no position in this micro-batch is nan
                per_step[j], seen[j] = per_step[j] + share * x, seen[j] + share
    tr.finish()
    return loss_sum, [x / w if w else float("nan") for x, w in zip(per_step, seen)], 0.0  # packed: no padding


def _peak_memory_gib(device: torch.device) -> float:
    """On a GPU the memory allocated at its peak since the last call; elsewhere the process's peak RSS so far (not
    reset: resetting Linux's high-water mark would also reset what the process reports as its peak at exit)."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return peak / GIB
    import resource  # noqa: PLC0415 (POSIX only, read only here)

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def _train(cfg: InitDraftConfig, tr: DraftTrainer, data: TrainingData, feats: TrainingFeatures, evaluate,
           W_dv: torch.Tensor) -> tuple[int, float, float]:
    """The loop: TTT steps, metrics.jsonl per step, a held-out eval and checkpoint every save_every.
    Returns (training tokens, training seconds, the largest peak memory of a step, GiB)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn  # noqa: PLC0415 (binds a name this module uses otherwise)

    metrics_path = Path(cfg.out) / "metrics.jsonl"
    truncate_jsonl(metrics_path, tr.step)  # steps logged after the last checkpoint are redone
    acc, tokens, seconds, peak = tr.acc, 0, 0.0, 0.0
    _peak_memory_gib(acc.device)  # each step's peak from here

    def order(seed: int, epoch: int) -> list[int]:
        return epoch_order(feats.groups, seed, epoch, cfg.shuffle_window)

    with Progress(TextColumn("init-draft"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                  TimeRemainingColumn(), disable=not acc.is_main_process) as bar, \
            open_trackers(cfg.report_to, "--report-to", cfg.out, dataclasses.asdict(cfg), tr.step,
                          main=acc.is_main_process) as trackers:  # --report-to: each metrics.jsonl line, at its step
        job = bar.add_task("", total=tr.total, completed=tr.step, info="")
        while tr.step < tr.total:
            epoch, idx = tr.batch(order)
            t0 = time.perf_counter()
            draw = torch.Generator().manual_seed(cfg.seed * 1_000_003 + tr.step)  # a resumed step draws the same anchors
            items = feats.train.items(idx)
            loss, per_step, padding = train_step(cfg, tr, items, data.prompt_lens[idx].tolist(), W_dv, draw)
            seconds += time.perf_counter() - t0
            tokens += sum(len(x[0]) for x in items) * acc.num_processes  # all processes (near-equal shares)
            rec = {"step": tr.step, "epoch": epoch, "loss": loss, "loss_per_step": per_step,
                   "lr": tr.sched.get_last_lr()[0], "tokens_per_s": tokens / seconds, "padding": padding,
                   "peak_memory_gib": _peak_memory_gib(acc.device)}  # this step's (with the eval and checkpoint before)
            peak = max(peak, rec["peak_memory_gib"])
            if tr.step % cfg.save_every == 0 or tr.step == tr.total:
                rec["eval"] = evaluate(walk=False)  # the proxies; the exact walk (a Python loop) runs at the end
                tr.save()
            if acc.is_main_process:
                append_jsonl(metrics_path, rec)
                trackers.log(rec["step"], rec)
            top1 = rec.get("eval", {}).get("top1")
            bar.update(job, completed=tr.step, info=f"loss {rec['loss']:.3f}" + (f" top1 {top1[0]:.2f}" if top1 else ""))
    return tokens, seconds, peak


def run(cfg: InitDraftConfig) -> InitDraftResult:
    from spectool.runs import MANIFEST, atomic_write_json, make_manifest  # noqa: PLC0415 (binds a name this module uses otherwise)

    cfg.validate()
    if cfg.anchor_fraction is None:  # the family's measured default, saved resolved with the run
        cfg = dataclasses.replace(cfg, anchor_fraction=FAMILIES[cfg.method].anchor_fraction)
    cfg = dataclasses.replace(cfg, draft_dtype=draft_dtype(cfg.draft_dtype))  # by device, saved resolved
    if cfg.init_from:  # a folder, or a hub id resolved through huggingface_hub's cache (saved resolved)
        from spectool.draft.checkpoint import draft_folder  # noqa: PLC0415 (binds a name this module uses otherwise)

        cfg = dataclasses.replace(cfg, init_from=str(draft_folder(cfg.init_from, "--init-from")))
    t_start = time.perf_counter()
    out = Path(cfg.out)
    # setup: the data, the policy's features, the draft and its optimizer
    model, acc, data, policy = _setup(cfg)
    draft, target_ids, coverage = _initial_draft(cfg, policy, data, acc.is_main_process)
    with acc.main_process_first():
        feats = training_features(cfg, policy, data, draft.config.aux_layer_ids, out / ".train")
    W = policy.get_output_embeddings().weight  # [V, H] in the policy's dtype: the targets
    target_on_device = target_ids.to(acc.device)  # [Vd]
    tr = DraftTrainer(acc, draft, len(data.train), out / ".train", batch_size=cfg.batch_size, epochs=cfg.epochs,
                      lr=cfg.lr, warmup_steps=cfg.warmup_steps, seed=cfg.seed, max_steps=cfg.max_steps)
    # the forward cost ratio needs the policy; the draft's forward costs the same trained or not
    cost = _cost_ratio(policy, tr.unwrapped, feats.anywhere.items(data.train[:1])[0])
    if cfg.features != "online":  # features written: from here on only W (and an MTP draft's embedding) is read
        del policy
        _release(acc.device)

    def evaluate(idx: list[int] | None = None, walk: bool = True) -> dict:
        source = feats.heldout if idx is None else feats.anywhere
        idx = data.heldout if idx is None else idx
        batch = max(1, min(cfg.batch_size, cfg.max_batch_tokens // int(data.lengths[idx].max())))  # bounded too
        return heldout_metrics(tr.unwrapped, Lazy(source, idx), data.prompt_lens[idx].tolist(),
                               W, target_on_device, cfg.ttt_steps, batch, acc.device, walk)

    # loop
    tokens, seconds, peak = _train(cfg, tr, data, feats, evaluate, W[target_ids].float())  # [Vd, H] float32
    # save: held-out and training-sample metrics, the vLLM-loadable folder with its metadata, the manifest
    g = torch.Generator().manual_seed(cfg.seed)
    train_sample = data.train[torch.randperm(len(data.train), generator=g)[: max(len(data.heldout), 32)].numpy()].tolist()
    result = InitDraftResult(
        out=str(out), steps=tr.step, coverage=coverage, heldout=evaluate(), train=evaluate(train_sample),
        train_tokens_per_s=tokens / seconds if seconds else 0.0,
        draft_to_policy_cost=cost,
        feature_cache_bytes=feats.disk_bytes, seconds=time.perf_counter() - t_start,
        main_process=acc.is_main_process, family=cfg.method, features=cfg.features,
        peak_memory_gib=peak, longest_sequence=int(data.lengths[data.train].max()),
    )
    if acc.is_main_process:
        meta = draft_metadata(model, cfg.ttt_steps, coverage=coverage)
        if cfg.method == "mtp":
            save_mtp_model(tr.unwrapped, model.path, out, meta)
        else:
            save_draft(tr.unwrapped, out, extra=meta)
        atomic_write_json(out / MANIFEST, make_manifest(
            "mtp-model" if cfg.method == "mtp" else "draft", model=model.name, model_identity=model.identity,
            model_weights=data.weights, family=cfg.method, harvest=str(data.run_dir),
            harvest_data=data.manifest.get("data"), rendering=data.manifest.get("rendering"), records=len(data.records),
            train_records=len(data.train),
            eval_records=len(data.heldout), ttt_steps=cfg.ttt_steps, result=result,
            acceptance_lengths={"heldout": result.acceptance_lengths(), "train": result.acceptance_lengths("train")}))
    return result


def _release(device: torch.device) -> None:
    """Return what was freed to the device (the policy's weights) before training allocates."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _coverage(responses: Iterable[list[int]], target_ids) -> float:
    """Fraction of response tokens inside the draft vocabulary."""
    keep, inside, total = set(target_ids.tolist()), 0, 0
    for r in responses:
        inside += sum(t in keep for t in r)
        total += len(r)
    return inside / max(total, 1)


@torch.no_grad()
def _cost_ratio(policy, draft, feat) -> float:
    """Forward time per token of one draft step vs the policy (transformers, same machine)."""
    dev = next(policy.parameters()).device
    ids, aux, _ = feat
    ids, aux = ids[None].to(dev), aux[None].float().to(dev)  # [1, T], [1, T, 3H]

    def timeit(fn, reps=5):
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t) / reps

    tp = timeit(lambda: policy(ids))
    td = timeit(lambda: draft.unroll(aux, ids, 1))
    return td / tp


def render(r: InitDraftResult) -> None:
    from rich.table import Table  # noqa: PLC0415 (heavy, loaded only on this path)

    if not r.main_process:
        return

    t = Table(title=f"init-draft -> {r.out}", show_header=False)
    t.add_row("steps", str(r.steps))
    t.add_row("draft vocab coverage of responses", f"{r.coverage:.1%}")
    t.add_row("training throughput", f"{r.train_tokens_per_s:.0f} tokens/s")
    t.add_row("draft / policy forward cost per drafted token", f"{r.draft_to_policy_cost:.3f}")
    t.add_row(f"policy features ({r.features})", f"{r.feature_cache_bytes / GIB:.2f} GiB on disk" if r.feature_cache_bytes
              else "none on disk (computed per batch)" if r.features == "online"
              else "none written (the harvest's --hidden-states shards)")
    t.add_row("peak memory", f"{r.peak_memory_gib:.2f} GiB" + (" (GPU, allocated by a training step)"
                                                                 if torch.cuda.is_available() else " (the process's RSS)"))
    t.add_row("longest training sequence", f"{r.longest_sequence} tokens (drafting past it uses untrained positions)")
    t.add_row("wall time", f"{r.seconds:.0f} s")
    console().print(t)
    k = len(r.heldout["top1"])
    ks = sorted({min(3, k), k})  # 3: the default k of rollout and train-rl
    m = Table(title=f"P(accept) by draft position 1..{k}, on the policy's own T=1 paths (T=0 paths accept more)",
              caption=f"AL at k = {' / '.join(map(str, ks))}: T=1 greedy walked over the records as the engine drafts "
                      "(exact); T=0 and probabilistic chained from the per-position rates, which average over every "
                      "position while the engine drafts more often right after a rejection")
    for col in ("", "held-out prompts", "training records"):
        m.add_column(col, no_wrap=True)
    rows = [("top-1 agreement (T=0 rule)", "top1"), ("T=1 greedy: p(draft's)", "p_accept"),
            ("T=1 probabilistic", "p_accept_sampled"), ("T=1 greedy oracle: max p", "oracle_greedy")]
    for label, key in rows:
        m.add_row(label, _fmt(r.heldout[key]), _fmt(r.train[key]))
    lengths = {which: [r.acceptance_lengths(which, kk) for kk in ks] for which in ("heldout", "train")}
    for name in lengths["heldout"][0]:
        m.add_row(f"AL {name}", *(" / ".join(f"{x[name]:.2f}" for x in lengths[w]) for w in ("heldout", "train")))
    console().print(m)
    if r.context_free():
        console(stderr=True, soft_wrap=True).print(
            f"[yellow]warning:[/] this {r.family} draft agrees with the policy equally at every block position "
            f"({r.heldout['top1'][0]:.2f}): it has not learned to read the policy's context yet and would slow "
            "rollouts. Train longer (--epochs) or deeper (--draft-layers 2); docs/drafters.md measured both.")


def _fmt(xs: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in xs)

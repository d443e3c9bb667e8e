"""`spectool init-draft`: train an EAGLE-3 draft on the policy's own in-domain rollouts.

Workflow (one visible loop):
 1. data: a harvest run dir, or a data source that is harvested first (the draft must learn the
    policy's outputs, not reference answers);
 2. the frozen policy (transformers, fp32) supplies aux hidden states and target distributions,
    computed once and cached in the run dir (resume does not recompute them);
 3. the draft vocabulary = most frequent response tokens (coverage printed); embedding and lm_head
    rows from the policy, or warm start from --init-from;
 4. training-time-test unroll over `ttt_steps` positions (>= the largest k you will run), weighted
    soft cross-entropy (loss.py), AdamW + cosine schedule, under `accelerate`;
 5. held-out per-position top-1 agreement and expected acceptance; metrics.jsonl; a checkpoint
    every `save_every` steps; a killed run resumes at the next step; final vLLM-loadable folder.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from spectool.config import DEFAULT_DATA, DEFAULT_MODEL, GPU_MEMORY_UTILIZATION, SamplingConfig, check, check_gpu_memory
from spectool.errors import SpectoolError

METRICS = ("top1", "p_accept", "p_accept_sampled")
RUN_CONFIG = "init_draft.json"  # the resolved settings (config.json in a draft folder is vLLM's)
RESUME_MAY_CHANGE = {"save_every"}  # held-out, per draft position (loss.acceptance_metrics)


@dataclass
class InitDraftConfig:
    out: str
    model: str = DEFAULT_MODEL
    data: str = DEFAULT_DATA  # data source (harvested first) or a harvest run directory
    init_from: str | None = None  # warm start from an existing EAGLE-3 draft folder
    remap_vocab: bool = False  # with init_from: rebuild the draft vocabulary from this data (rows kept where shared)
    draft_vocab_size: int = 4096
    ttt_steps: int = 5  # unroll length: trains draft positions 1..ttt_steps
    step_decay: float = 0.8
    epochs: int = 2
    batch_size: int = 16
    lr: float = 1e-3  # short runs on small harvests: higher than the 1e-4 of large-corpus EAGLE-3 recipes
    warmup_steps: int = 20
    save_every: int = 50
    eval_fraction: float = 0.05
    seed: int = 0
    harvest: SamplingConfig = field(default_factory=lambda: SamplingConfig(n_prompts=256, samples=4, max_tokens=128))
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION  # the harvest engine's share (it stops before training)

    def validate(self) -> None:
        check_gpu_memory(self.gpu_memory_utilization)
        check(self.ttt_steps >= 1, "--ttt-steps", self.ttt_steps, "must be >= 1 (use >= the largest k you run)")
        check(self.draft_vocab_size >= 2, "--draft-vocab-size", self.draft_vocab_size, "must be >= 2")
        check(not self.remap_vocab or self.init_from is not None, "--remap-vocab", self.remap_vocab,
              "needs --init-from (a fresh draft always builds its vocabulary from the data)")
        check(self.epochs >= 1, "--epochs", self.epochs, "must be >= 1")
        check(self.batch_size >= 1, "--batch-size", self.batch_size, "must be >= 1")
        check(0 < self.lr < 1, "--lr", self.lr, "must be in (0, 1)")
        check(0 < self.step_decay <= 1, "--step-decay", self.step_decay, "must be in (0, 1]")
        check(0 < self.eval_fraction < 0.5, "--eval-fraction", self.eval_fraction, "must be in (0, 0.5)")
        self.harvest.validate()


@dataclass
class InitDraftResult:
    out: str
    steps: int
    coverage: float
    eval_top1: list[float]
    eval_p_accept: list[float]  # T=1, greedy proposals
    eval_p_accept_sampled: list[float]  # T=1, proposals sampled from the draft
    expected_acceptance_length: float  # greedy proxy at k = ttt_steps, from top1 chain
    train_tokens_per_s: float
    draft_to_policy_cost: float  # measured forward time ratio per token
    seconds: float
    main_process: bool = True  # False on the other ranks of `accelerate launch` (they print nothing)


def _claim_out(cfg: InitDraftConfig, write: bool) -> None:
    """Refuse an --out that holds anything but an init-draft run with these settings, before
    anything is written; then record the settings (a rerun of the same command resumes)."""
    from dataclasses import asdict

    from spectool.runs import atomic_write_json, read_json

    out = Path(cfg.out)
    if (out / RUN_CONFIG).exists():
        old, new = read_json(out / RUN_CONFIG), asdict(cfg)
        diff = sorted(k for k in new if k not in RESUME_MAY_CHANGE and old.get(k) != new[k])
        if diff:
            raise SpectoolError(f"--out {out} holds a draft trained with other settings ({', '.join(diff)} differ); "
                                "rerun with the same settings to resume, or pick a new --out (--init-from "
                                f"{out} warm-starts a new draft from it)")
    elif out.exists() and any(out.iterdir()):
        what = "a draft without its init-draft settings (an older spectool, or another tool)" \
            if (out / "config.json").exists() else "other files"
        raise SpectoolError(f"--out {out} holds {what}; pick a new --out (--init-from {out} warm-starts from a draft)")
    if write:
        atomic_write_json(out / RUN_CONFIG, cfg)


def _harvest_if_needed(cfg: InitDraftConfig) -> Path:
    """The harvest run to train on; harvests first when --data is a data source."""
    from spectool.runs import MANIFEST

    p = Path(cfg.data)
    if (p / MANIFEST).exists():
        return p
    from spectool.harvest import HarvestConfig
    from spectool.harvest import run as harvest

    run_dir = Path(cfg.out) / "harvest"
    harvest(HarvestConfig(model=cfg.model, data=cfg.data, out=str(run_dir), split="train", sampling=cfg.harvest,
                          gpu_memory_utilization=cfg.gpu_memory_utilization))
    import gc

    gc.collect()  # the harvest's engine goes before the policy and the draft take the device
    return run_dir


def _features(policy, records, layer_ids: list[int], cache: Path):
    """Per record: ids [T], aux [T, 3H] fp16, last [T, H] fp16 (host); cached in `cache`.
    Computed on the policy's device in right-padded batches of similar length."""
    from safetensors.torch import load_file, save_file
    from rich.progress import Progress

    from spectool.hidden import policy_features

    if cache.exists():
        d = load_file(cache)
        lengths = d["lengths"].tolist()
        return list(zip(d["ids"].split(lengths), d["aux"].split(lengths), d["last"].split(lengths)))
    dev = next(policy.parameters()).device
    seqs = [torch.tensor(r["prompt_ids"] + r["response_ids"]) for r in records]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    batch = 32 if dev.type == "cuda" else 4
    feats: list = [None] * len(seqs)
    with Progress() as bar:
        job = bar.add_task("policy hidden states", total=len(records))
        for b in range(0, len(order), batch):
            idx = order[b : b + batch]
            T = len(seqs[idx[-1]])
            ids = torch.zeros(len(idx), T, dtype=torch.int64)  # [B, T] right-padded
            mask = torch.zeros(len(idx), T, dtype=torch.int64)
            for j, i in enumerate(idx):
                ids[j, : len(seqs[i])], mask[j, : len(seqs[i])] = seqs[i], 1
            a, h = policy_features(policy, ids.to(dev), layer_ids, mask.to(dev))  # [B, T, 3H], [B, T, H]
            a, h = a.half().cpu(), h.half().cpu()
            for j, i in enumerate(idx):
                n = len(seqs[i])
                feats[i] = (seqs[i], a[j, :n], h[j, :n])
            bar.advance(job, len(idx))
    tmp = cache.with_suffix(".tmp")
    save_file({"ids": torch.cat([f[0] for f in feats]), "aux": torch.cat([f[1] for f in feats]),
               "last": torch.cat([f[2] for f in feats]),
               "lengths": torch.tensor([len(f[0]) for f in feats])}, tmp)
    tmp.rename(cache)
    return feats


def collate_features(items, prompt_lens, device: torch.device | str = "cpu"):
    """Right-pad a list of (ids, aux, last) -> ids [B,T], aux [B,T,3H], last [B,T,H] on `device`;
    P [B], L [B] on the host."""
    T = max(len(x[0]) for x in items)
    B = len(items)
    ids = torch.zeros(B, T, dtype=torch.int64)
    aux = torch.zeros(B, T, items[0][1].shape[-1])
    last = torch.zeros(B, T, items[0][2].shape[-1])
    for i, (x, a, h) in enumerate(items):
        ids[i, : len(x)], aux[i, : len(x)], last[i, : len(x)] = x, a.float(), h.float()
    P, L = torch.tensor(prompt_lens), torch.tensor([len(x[0]) for x in items])
    return ids.to(device), aux.to(device), last.to(device), P, L


def run(cfg: InitDraftConfig) -> InitDraftResult:
    from accelerate import Accelerator
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import draft_metadata, load_draft, new_draft, remap_vocab, save_draft
    from spectool.draft.loss import acceptance_metrics, ttt_loss
    from spectool.draft.vocab import build_vocab, ids_from_d2t
    from spectool.hidden import default_aux_layer_ids
    from spectool.models import resolve_model
    from spectool.records import load_records
    from spectool.runs import MANIFEST, append_jsonl, atomic_write_json, load_manifest, make_manifest, truncate_jsonl

    cfg.validate()
    t_start = time.perf_counter()
    out = Path(cfg.out)
    model = resolve_model(cfg.model)
    if cfg.init_from:  # fail before any harvesting or training
        from spectool.draft.checkpoint import check_draft

        if not Path(cfg.init_from).exists():
            raise SpectoolError(f"--init-from {cfg.init_from} does not exist")
        check_draft(cfg.init_from, model, 1, flag="--init-from")
        load_draft(Path(cfg.init_from))
    # Under `accelerate launch`, the main process harvests and caches features; the others wait.
    acc = Accelerator(cpu=not torch.cuda.is_available())
    if cfg.batch_size < acc.num_processes:
        raise SpectoolError(f"--batch-size {cfg.batch_size} is smaller than the {acc.num_processes} processes; "
                            f"use --batch-size >= {acc.num_processes} (each process takes a share of a batch)")
    if acc.num_processes > 1 and not (Path(cfg.data) / "manifest.json").exists():
        raise SpectoolError(f"--data {cfg.data} is a data source; under accelerate launch pass a harvest run "
                            "instead (spectool harvest --out H ..., then --data H): vLLM runs in one process")
    _claim_out(cfg, write=acc.is_main_process)
    acc.wait_for_everyone()
    run_dir = _harvest_if_needed(cfg)
    hm = load_manifest(run_dir, "harvest")
    if hm["model_identity"] != model.identity:
        from spectool.models import fingerprint_mismatch

        diff = fingerprint_mismatch(hm.get("model_fingerprint", {}), model.fingerprint)
        raise SpectoolError(f"harvest run {run_dir} was made with model {hm['model']}, not {cfg.model}"
                            + (f" ({'; '.join(diff)}: harvest's model vs this one)" if diff else ""))
    records = load_records(run_dir)
    if len(records) < 4:
        raise SpectoolError(f"harvest run {run_dir} has {len(records)} records; at least 4 are needed")
    # The policy is loaded after the harvest's engine is gone: on a GPU it then has the memory to
    # itself, and features and training run there (accelerate's device).
    policy = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32).eval().requires_grad_(False)
    policy.to(acc.device)
    if cfg.init_from:
        warm, _ = load_draft(Path(cfg.init_from), policy)
    state_dir = out / ".train"
    if acc.is_main_process:
        state_dir.mkdir(parents=True, exist_ok=True)
    acc.wait_for_everyone()

    # Held-out split by prompt id (deterministic): whole prompts, never shared with training.
    import hashlib

    held = [int(hashlib.sha256(p.encode()).hexdigest()[:8], 16) % 1000 < cfg.eval_fraction * 1000
            for p in records["prompt_id"]]
    if all(held) or not any(held):  # too few prompts for a hash split: hold out the last record
        held = [i == len(held) - 1 for i in range(len(held))]
    ev = [i for i, h in enumerate(held) if h]
    tr = [i for i, h in enumerate(held) if not h]
    prompt_lens = [len(p) for p in records["prompt_ids"]]

    vsize = min(cfg.draft_vocab_size, policy.config.vocab_size)
    if cfg.init_from and not cfg.remap_vocab:
        draft = warm
        target_ids = ids_from_d2t(draft.d2t)  # keep the warm start's vocabulary map
        coverage = _coverage(records, tr, target_ids)
    elif cfg.init_from:
        old_coverage = _coverage(records, tr, ids_from_d2t(warm.d2t))
        target_ids, coverage = build_vocab((records[i]["response_ids"] for i in tr), policy.config.vocab_size, vsize)
        draft, kept = remap_vocab(warm, target_ids, policy)
        if acc.is_main_process:
            print(f"--remap-vocab: draft vocabulary {warm.config.draft_vocab_size} -> {len(target_ids)} tokens, "
                  f"{kept} lm_head rows kept from {cfg.init_from}; coverage of these responses "
                  f"{old_coverage:.1%} -> {coverage:.1%}")
    else:
        target_ids, coverage = build_vocab((records[i]["response_ids"] for i in tr), policy.config.vocab_size, vsize)
        torch.manual_seed(cfg.seed)
        draft = new_draft(policy, target_ids, default_aux_layer_ids(policy.config.num_hidden_layers))
    layer_ids = draft.config.aux_layer_ids
    with acc.main_process_first():
        feats = _features(policy, records, layer_ids, state_dir / "features.safetensors")
    W = policy.get_output_embeddings().weight  # [V, H]
    W_dv = W[target_ids]  # [Vd, H]
    target_on_device = target_ids.to(acc.device)  # [Vd]

    params = [p for n, p in draft.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    steps_per_epoch = math.ceil(len(tr) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
    )
    draft, opt = acc.prepare(draft, opt)
    step = 0
    ckpt = state_dir / "checkpoint.pt"
    if ckpt.exists():  # resume: weights, optimizer, schedule and step; batch order is seeded per epoch
        st = torch.load(ckpt, weights_only=False)
        acc.unwrap_model(draft).load_state_dict(st["draft"])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        step = st["step"]
    metrics_path = out / "metrics.jsonl"
    truncate_jsonl(metrics_path, step)  # steps logged after the last checkpoint are redone

    def evaluate() -> dict:
        d = acc.unwrap_model(draft).eval()
        sums: dict[str, list[float]] = {}
        with torch.no_grad():
            for b in range(0, len(ev), cfg.batch_size):
                idx = ev[b : b + cfg.batch_size]
                ids, aux, last, P, L = collate_features([feats[i] for i in idx], [prompt_lens[i] for i in idx], acc.device)
                s = first_anchor(P, cfg.ttt_steps)
                m = acceptance_metrics(d.unroll(aux, ids, cfg.ttt_steps, s), last[:, s:] @ W.T, target_on_device, P - s, L - s)
                for k in METRICS:
                    sums.setdefault(k, [0.0] * cfg.ttt_steps)
                    sums[k] = [s + (0 if math.isnan(v) else v) * c for s, v, c in zip(sums[k], m[k], m["count"])]
                sums.setdefault("count", [0] * cfg.ttt_steps)
                sums["count"] = [a + c for a, c in zip(sums["count"], m["count"])]
        d.train()
        return {k: [s / max(c, 1) for s, c in zip(sums[k], sums["count"])] for k in METRICS}

    train_tokens, train_s = 0, 0.0
    with Progress(TextColumn("init-draft"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                  TimeRemainingColumn(), disable=not acc.is_main_process) as bar:
        job = bar.add_task("", total=total, completed=step, info="")
        while step < total:
            epoch, pos = divmod(step, steps_per_epoch)
            g = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)
            order = [tr[i] for i in torch.randperm(len(tr), generator=g).tolist()]
            idx = order[pos * cfg.batch_size : (pos + 1) * cfg.batch_size]
            idx = idx[acc.process_index :: acc.num_processes] or idx[:1]  # this process's share
            t0 = time.perf_counter()
            ids, aux, last, P, L = collate_features([feats[i] for i in idx], [prompt_lens[i] for i in idx], acc.device)
            s = first_anchor(P, cfg.ttt_steps)
            logits = draft(aux, ids, cfg.ttt_steps, s)  # steps x [B, T - s, Vd]
            loss, per_step = ttt_loss(logits, last[:, s:] @ W_dv.T, P - s, L - s, cfg.step_decay)
            opt.zero_grad()
            acc.backward(loss)
            opt.step()
            sched.step()
            step += 1
            train_s += time.perf_counter() - t0
            train_tokens += int(L.sum()) * acc.num_processes  # all processes (shares are near-equal)
            rec = {"step": step, "epoch": epoch, "loss": float(loss.detach()), "loss_per_step": per_step,
                   "lr": sched.get_last_lr()[0], "tokens_per_s": train_tokens / train_s}
            if step % cfg.save_every == 0 or step == total:
                rec["eval"] = evaluate()
                if acc.is_main_process:
                    tmp = ckpt.with_suffix(".tmp")
                    torch.save({"draft": acc.unwrap_model(draft).state_dict(), "opt": opt.state_dict(),
                                "sched": sched.state_dict(), "step": step}, tmp)
                    tmp.rename(ckpt)
            if acc.is_main_process:
                append_jsonl(metrics_path, rec)
            top1 = rec.get("eval", {}).get("top1")
            bar.update(job, completed=step, info=f"loss {float(loss.detach()):.3f}" + (f" top1 {top1[0]:.2f}" if top1 else ""))

    final = evaluate()
    d = acc.unwrap_model(draft)
    cost = _cost_ratio(policy, d, feats[tr[0]])
    top1 = final["top1"]
    exp_len = chain_length(top1)
    result = InitDraftResult(
        out=str(out), steps=step, coverage=coverage, eval_top1=top1, eval_p_accept=final["p_accept"],
        eval_p_accept_sampled=final["p_accept_sampled"],
        expected_acceptance_length=exp_len, train_tokens_per_s=train_tokens / train_s if train_s else 0.0,
        draft_to_policy_cost=cost, seconds=time.perf_counter() - t_start, main_process=acc.is_main_process,
    )
    if acc.is_main_process:
        save_draft(d, out, extra=draft_metadata(model, cfg.ttt_steps, coverage=coverage))
        atomic_write_json(out / MANIFEST, make_manifest(
            "draft", model=model.name, model_identity=model.identity, harvest=str(run_dir),
            harvest_data=hm.get("data"), records=len(records), train_records=len(tr), eval_records=len(ev),
            ttt_steps=cfg.ttt_steps, result=result))
    return result


def chain_length(rates: list[float]) -> float:
    """Expected tokens per verify step when position j is accepted with probability rates[j] given
    its prefix was: 1 + r1 + r1 r2 + ... (the proxies are measured on the policy's own path)."""
    return 1 + sum(math.prod(rates[: i + 1]) for i in range(len(rates)))


def first_anchor(prompt_lens: torch.Tensor, steps: int) -> int:
    """First anchor any step's loss reads (step j needs t >= P - 2 - j): earlier ones only give keys."""
    return max(0, int(prompt_lens.min()) - 1 - steps)


def _coverage(records, idx, target_ids) -> float:
    keep = set(target_ids.tolist())
    toks = [t for i in idx for t in records[i]["response_ids"]]
    return sum(t in keep for t in toks) / max(len(toks), 1)


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
    from rich.console import Console
    from rich.table import Table

    if not r.main_process:
        return

    t = Table(title=f"init-draft -> {r.out}", show_header=False)
    t.add_row("steps", str(r.steps))
    t.add_row("draft vocab coverage of responses", f"{r.coverage:.1%}")
    t.add_row("held-out top-1 agreement by position", " ".join(f"{x:.2f}" for x in r.eval_top1))
    t.add_row("held-out P(accept), T=1, greedy draft", " ".join(f"{x:.2f}" for x in r.eval_p_accept))
    t.add_row("held-out P(accept), T=1, sampling draft", " ".join(f"{x:.2f}" for x in r.eval_p_accept_sampled))
    k = len(r.eval_top1)
    t.add_row(f"expected acceptance length, k={k}",
              f"T=0 {r.expected_acceptance_length:.2f}, T=1 greedy {chain_length(r.eval_p_accept):.2f}, "
              f"T=1 sampling {chain_length(r.eval_p_accept_sampled):.2f}")
    t.add_row("training throughput", f"{r.train_tokens_per_s:.0f} tokens/s")
    t.add_row("draft / policy forward cost", f"{r.draft_to_policy_cost:.3f}")
    t.add_row("wall time", f"{r.seconds:.0f} s")
    Console().print(t)

"""`spectool forecast`: what speculation gives a whole RL batch and an RL step, from a fitted sweep.

Workflow: fit the cost model (costmodel.py) on a sweep-k run (real or weightless with synthetic
acceptance) -> per batch size, the predicted speedup of every k at the given acceptance and the
best k (the schedule `rollout --k auto --sweep FORECAST_RUN` can use) -> one RL batch decoded from
all sequences live to its last one, with k per live batch size, against plain decoding -> the RL
step speedup at the generation share (given, or measured by a train-rl run), sync and async ->
forecast.json, forecast.csv, forecast.png, with the assumptions written out.
"""

from __future__ import annotations

from pathlib import Path

from spectool.config.forecast import ForecastConfig
from spectool.costmodel import batch_rollout, fit, k_schedule, output_lengths, rl_step_speedup
from spectool.errors import SpectoolError
from spectool.families import FAMILIES
from spectool.plots import pyplot, save
from spectool.runs import MANIFEST, atomic_write_bytes, atomic_write_json, claim, load_manifest, make_manifest, read_json
from spectool.schedule import write_schedule
from spectool.ui import console

ASSUMPTIONS = (
    "step time = a0 + a1*B*(k+1) + a2*B*context + [k>0]*(a5 + a6*B) + k*(a3 + a4*B), fitted on the sweep's rows",
    "acceptance per position is the given unconditional rate, the same at every batch size and step",
    "a batch decodes all sequences from the start, at most --max-concurrency at once, each gaining the "
    "expected acceptance length per step (variation between steps ignored)",
    "the rest of an RL step (training, weight sync) does not change with speculation; async overlaps "
    "the generation of step n+1 with the rest of step n completely",
)


def _sweep_rows(sweep_dir: Path, method: str) -> tuple[list[dict], dict]:
    """The sweep's plain rows and `method`'s rows, and the sweep."""

    path = sweep_dir / "sweep.json"
    if not path.exists():
        raise SpectoolError(f"--sweep {sweep_dir} has no sweep.json; run spectool sweep-k --out {sweep_dir} first")
    sweep = read_json(path)
    rows = [r for r in sweep["rows"] if r["method"] in ("none", method)]
    if not any(r["method"] == "none" for r in rows) or not any(r["method"] == method for r in rows):
        have = sorted({r["method"] for r in sweep["rows"]} - {"none"})
        raise SpectoolError(f"--sweep {sweep_dir} needs plain and {method} rows to fit a cost model (it has "
                            f"{', '.join(have) or 'none'}: set --method, or sweep with --methods {method})")
    if any("mean_context" not in r for r in rows):
        raise SpectoolError(f"--sweep {sweep_dir} was measured by an older spectool (rows lack mean_context); sweep again")
    return rows, sweep


def measured_rates(rows: list[dict], method: str = "eagle3") -> list[float]:
    """The per-position acceptance of the sweep's largest-k rows of `method` (pooled over batch sizes)."""
    k = max(r["k"] for r in rows if r["method"] == method)
    per = [r["per_position"] for r in rows if r["method"] == method and r["k"] == k and r["per_position"]]
    return [sum(p[j] for p in per) / len(per) for j in range(k)]


def generation_share(cfg: ForecastConfig) -> tuple[float, str]:
    if cfg.generation_share is not None:
        return cfg.generation_share, "given"
    if cfg.rl_run:
        m = load_manifest(Path(cfg.rl_run), "train-rl")
        share = (m.get("summary") or {}).get("mean_gen_share")
        if not share:
            raise SpectoolError(f"--rl-run {cfg.rl_run} recorded no generation share")
        return float(share), f"measured by {cfg.rl_run}"
    return 0.66, "NeMo RL's RL-Zero share (arXiv 2604.26779), no --generation-share or --rl-run given"


def run(cfg: ForecastConfig) -> dict:
    cfg.validate()
    rows, sweep = _sweep_rows(Path(cfg.sweep), cfg.method)
    if cfg.out:  # after the sweep is known to be readable: nothing is claimed for a run that cannot start

        claim(Path(cfg.out), "forecast", cfg)
    try:
        parallel = cfg.method in FAMILIES and FAMILIES[cfg.method].parallel
        model = fit([{**r, "k": r["k"] if r["method"] == cfg.method else 0} for r in rows], parallel=parallel)
    except ValueError as e:
        raise SpectoolError(f"--sweep {cfg.sweep}: {e}; sweep more batch sizes") from None
    rates = cfg.acceptance_rates or measured_rates(rows, cfg.method)
    ks = cfg.ks  # rates beyond the given positions continue geometrically (costmodel.acceptance_length)
    sizes = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, cfg.max_concurrency} | {r["batch"] for r in rows})
    sizes = [b for b in sizes if b <= cfg.max_concurrency]
    per_batch = []
    for b in sizes:
        best_k, best = model.best_k(b, rates, ks, cfg.min_gain)
        per_batch.append({"batch": b, "plain_tokens_per_s": model.tokens_per_s(0, b, rates),
                          "speedup_by_k": {str(k): model.speedup(k, b, rates) for k in ks},
                          "best_k": best_k, "best_speedup": best})
    schedule = k_schedule({p["batch"]: {"k": p["best_k"]} for p in per_batch}, max_batch=max(cfg.max_concurrency, 1024))
    lengths = output_lengths(cfg.lengths, cfg.batch, cfg.max_tokens, seed=0)

    def by_schedule(b: int) -> int:
        return next((k for lo, hi, k in schedule if lo <= b <= hi), 0)

    plain = batch_rollout(model, lengths, rates, lambda b: 0, cfg.prompt_len, cfg.max_concurrency)
    spec = batch_rollout(model, lengths, rates, by_schedule, cfg.prompt_len, cfg.max_concurrency)
    fixed = {k: batch_rollout(model, lengths, rates, lambda b, k=k: k, cfg.prompt_len, cfg.max_concurrency)
             for k in ks}
    share, share_src = generation_share(cfg)
    rollout_speedup = plain["seconds"] / spec["seconds"]
    result = {
        "sweep": cfg.sweep, "method": cfg.method, "model": sweep.get("model"), "synthetic_sweep": sweep.get("synthetic"),
        "cost_model": model.as_dict(), "acceptance_rates": rates,
        "acceptance_source": "given" if cfg.acceptance_rates else f"measured by sweep {cfg.sweep}",
        "per_batch": per_batch, "schedule": schedule, "draft_sampling": sweep.get("draft_sampling", "greedy"),
        "draft": (sweep.get("drafts") or {}).get(cfg.method, sweep.get("draft") if cfg.method == "eagle3" else None)
        if cfg.method != "draft_model" else sweep.get("draft_model"),
        "rl_batch": {"sequences": cfg.batch, "max_concurrency": cfg.max_concurrency, "lengths": cfg.lengths,
                     "mean_length": sum(lengths) / len(lengths), "max_length": max(lengths),
                     "plain_s": plain["seconds"], "speculative_s": spec["seconds"], "speedup": rollout_speedup,
                     "speedup_fixed_k": {str(k): plain["seconds"] / v["seconds"] for k, v in fixed.items()},
                     "plain_steps": plain["steps"], "speculative_steps": spec["steps"]},
        "rl_step": {"generation_share": share, "generation_share_source": share_src,
                    **rl_step_speedup(rollout_speedup, share)},
        "assumptions": list(ASSUMPTIONS) + model.notes,
    }
    if cfg.out:
        _write(Path(cfg.out), result, cfg, spec["trace"])
    return result


def _write(out: Path, result: dict, cfg: ForecastConfig, trace: list[tuple[int, int]]) -> None:
    atomic_write_json(out / "forecast.json", result)
    if result["method"] in ("eagle3", "peagle", "dflash"):  # rollout --k auto runs draft folders of that family
        write_schedule(out, result["schedule"], "forecast", None, result["draft_sampling"], result["method"])
    ks = list(result["per_batch"][0]["speedup_by_k"])
    lines = ["batch,plain_tokens_per_s," + ",".join(f"speedup_k{k}" for k in ks) + ",best_k,best_speedup"]
    for p in result["per_batch"]:
        lines.append(f"{p['batch']},{p['plain_tokens_per_s']:.2f}," + ",".join(f"{p['speedup_by_k'][k]:.4f}" for k in ks)
                     + f",{p['best_k']},{p['best_speedup']:.4f}")
    atomic_write_bytes(out / "forecast.csv", ("\n".join(lines) + "\n").encode())
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    bs = [p["batch"] for p in result["per_batch"]]
    for k in ks:
        ax1.plot(bs, [p["speedup_by_k"][k] for p in result["per_batch"]], marker="o", label=f"k={k}")
    ax1.axhline(1.0, color="grey", lw=1)
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("live batch size")
    ax1.set_ylabel("predicted speedup over plain decoding")
    ax1.set_title("speedup by k and batch size")
    ax2.plot(range(len(trace)), [b for b, _ in trace], color="C0", label="live sequences")
    ax2.set_xlabel("decode step (speculative, k per live batch)")
    ax2.set_ylabel("live sequences")
    ax2.set_title(f"one RL batch: {result['rl_batch']['speedup']:.2f}x rollout")
    ax3 = ax2.twinx()
    ax3.plot(range(len(trace)), [k for _, k in trace], color="C1", lw=1)
    ax3.set_ylabel("k", color="C1")
    save(fig, out / "forecast.png", ax1)
    atomic_write_json(out / MANIFEST, make_manifest("forecast", sweep=cfg.sweep, model=result["model"],
                                                    rollout_speedup=result["rl_batch"]["speedup"]))


def render(r: dict, out: str | None) -> None:
    from rich.table import Table  # noqa: PLC0415 (heavy, loaded only on this path)

    c = console()
    ks = list(r["per_batch"][0]["speedup_by_k"])
    t = Table(title=f"forecast for {r['model']}, {r['method']} (cost model fitted on {r['sweep']}, rel. RMSE "
                    f"{r['cost_model']['rel_rmse']:.1%})")
    for col in ("batch", "plain tok/s", *[f"k={k}" for k in ks], "best"):
        t.add_column(col, justify="right")
    for p in r["per_batch"]:
        t.add_row(str(p["batch"]), f"{p['plain_tokens_per_s']:.0f}", *[f"{p['speedup_by_k'][k]:.2f}x" for k in ks],
                  "none" if p["best_k"] == 0 else f"k={p['best_k']} {p['best_speedup']:.2f}x")
    c.print(t)
    rates = " ".join(f"{x:.2f}" for x in r["acceptance_rates"])
    c.print(f"acceptance per position: {rates} ({r['acceptance_source']})", highlight=False)
    b = r["rl_batch"]
    c.print(f"one RL batch ({b['sequences']} sequences, {b['lengths']} lengths, mean {b['mean_length']:.0f}, max "
            f"{b['max_length']}, {b['max_concurrency']} at once): rollout {b['plain_s']:.1f} s -> "
            f"{b['speculative_s']:.1f} s, [bold]{b['speedup']:.2f}x[/] with k per live batch "
            f"{r['schedule']}; fixed k: " + ", ".join(f"k={k} {v:.2f}x" for k, v in b["speedup_fixed_k"].items()))
    s = r["rl_step"]
    c.print(f"RL step at generation share {s['generation_share']:.0%} ({s['generation_share_source']}): "
            f"sync [bold]{s['sync']:.2f}x[/]; async (one-step overlap) {s['async_vs_sync_plain']:.2f}x over sync "
            f"plain, {s['async_vs_async_plain']:.2f}x over async plain")
    c.print("assumptions:", highlight=False)
    for a in r["assumptions"]:
        c.print(f"  - {a}", highlight=False)
    if out:
        c.print(f"forecast.json, forecast.csv, forecast.png in {out}", highlight=False)

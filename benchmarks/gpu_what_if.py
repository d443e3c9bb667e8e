"""A weightless what-if (sweep-k --dummy-weights) at one more acceptance length, against the plain decoding the sweep
already measured: one speculative engine instead of a second sweep's two.

sweep-k takes one synthetic acceptance length a run and measures plain decoding in an engine of its own each run.
The GPU plan (benchmarks/gpu_first_run.sh, docs/gpu.md) asks for the Qwen3-8B shape at two: the demo draft's (3.38,
measured on the CPU at T=0) and the paper's (3.32). Engine starts are what a lent machine's minutes go to, so the
second length is this: one eagle3 engine with the sweep's own settings (its config.json: the same random prompts,
output lengths, seed, batch sizes and dummy draft; only the acceptance length differs), measured as sweep-k measures an
arm (engine/arms.measure_arm, in a child process) and paired with the sweep's plain rows by sweep-k's own arithmetic
(sweep_k.sweep_speedups). It prints both lengths' speedups side by side and writes them to --out.

One round (the plan runs --repeats 1): the noise between engine runs is not measured, so each speedup is a point
estimate; on a GPU that noise was 4-16% between two engine starts (docs/gpu.md, the third GPU run).

  python benchmarks/gpu_what_if.py SWEEP_RUN --acceptance-length 3.38 [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path


def speedup_table(rows: list[dict], extra: list[dict], lengths: tuple[float, float], k: int) -> list[dict]:
    """Per batch size: plain tokens/s, and for each acceptance length its eagle3 tokens/s, speedup over the plain rows
    and measured acceptance length. rows: the sweep's rows.jsonl (plain decoding and its eagle3 arm at lengths[0]);
    extra: the eagle3 rows measured at lengths[1]. Each length is paired with the same plain rows."""
    from spectool.commands.sweep_k import sweep_speedups

    plain = [r for r in rows if r["method"] == "none"]
    arms = {lengths[0]: [r for r in rows if r["method"] == "eagle3" and r["k"] == k], lengths[1]: extra}
    table: dict[int, dict] = {}
    for length, spec in arms.items():
        for r in sweep_speedups(plain + [{**x, "run": x.get("run", 0)} for x in spec]):
            at = table.setdefault(r["batch"], {"batch": r["batch"], "arms": {}})
            if r["method"] == "none":
                at["plain_tokens_per_s"] = r["tokens_per_s"]
            else:
                at["arms"][str(length)] = {"tokens_per_s": r["tokens_per_s"], "speedup": r["speedup"],
                                           "acceptance_length": r["mean_acceptance_length"]}
    return [table[b] for b in sorted(table)]


def render(table: list[dict], model: str, k: int) -> str:
    lengths = sorted({a for row in table for a in row["arms"]}, key=float)
    head = f"{'batch':>5} {'plain tok/s':>11}" + "".join(
        f" | A={a}: {'eagle3 tok/s':>12} {'speedup':>7} {'measured A':>10}" for a in lengths)
    lines = [f"what-if {model}, eagle3 k={k}, synthetic acceptance, dummy weights (one round: point estimates)", head]
    for row in table:
        line = f"{row['batch']:>5} {row.get('plain_tokens_per_s', float('nan')):>11.1f}"
        for a in lengths:
            arm = row["arms"].get(a)
            pad = " " * (len(a) + 4)  # under the header's "A=<a>: "
            line += (f" | {pad}{arm['tokens_per_s']:>12.1f} {arm['speedup']:>6.2f}x {arm['acceptance_length']:>10.2f}"
                     if arm else f" | {pad}{'-':>12} {'-':>7} {'-':>10}")
        lines.append(line)
    return "\n".join(lines)


def measure(sweep: Path, length: float) -> tuple[list[dict], list[dict], float, int, str]:
    """One eagle3 engine at `length` with the sweep's settings: (the sweep's rows, the new rows, the sweep's length,
    k, the model's name)."""
    from spectool import subproc
    from spectool.commands import sweep_k
    from spectool.config.sweep_k import SweepConfig
    from spectool.costmodel import synthetic_acceptance
    from spectool.errors import SpectoolError

    saved = json.loads((sweep / "config.json").read_text())
    names = {f.name for f in dataclasses.fields(SweepConfig)}
    cfg = SweepConfig(**{key: v for key, v in saved.items() if key in names})
    if not cfg.dummy_weights or cfg.acceptance_length is None or "eagle3" not in cfg.methods:
        raise SpectoolError(f"{sweep}: not a weightless eagle3 what-if with --acceptance-length (sweep-k --dummy-weights "
                            "--acceptance-length A): nothing to pair a second acceptance length with")
    rows = [json.loads(x) for x in (sweep / sweep_k.ROWS).read_text().splitlines() if x.strip()]
    k = max(cfg.ks)
    cfg = dataclasses.replace(cfg, acceptance_length=length)
    cfg.validate()
    model, drafts, prompts, lengths = sweep_k._synthetic_inputs(cfg, sweep)  # the sweep's prompts: same seed
    context = sweep_k._context(cfg, model.path, drafts, prompts, lengths)
    extra = subproc.call("spectool.engine.arms", "measure_arm", dict(
        model_path=model.path, method="eagle3", k=k, drafts=drafts, prompts=prompts, batch_sizes=cfg.batch_sizes,
        max_tokens=cfg.max_tokens, temperature=cfg.temperature, min_seqs=cfg.min_seqs, seed=cfg.seed,
        draft_sampling=cfg.draft_sampling, gpu_memory_utilization=cfg.gpu_memory_utilization, dummy_weights=True,
        synthetic=synthetic_acceptance(cfg.acceptance_rates, cfg.acceptance_length, cfg.ks), lengths=lengths,
        log_path=str(sweep.parent / f"{sweep.name}-{length:g}-engine.log"),
        dtype=cfg.dtype, min_seconds=cfg.min_seconds, max_model_len=context),
        what=f"the eagle3 k={k} engine at acceptance length {length:g}", progress=print)
    return rows, extra, float(saved["acceptance_length"]), k, model.name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", type=Path, help="a finished sweep-k --dummy-weights --acceptance-length run folder")
    p.add_argument("--acceptance-length", type=float, required=True)
    p.add_argument("--out", type=Path, help="JSON of the table (default: beside the sweep, <sweep>-<A>.json)")
    a = p.parse_args()
    rows, extra, length, k, model = measure(a.sweep, a.acceptance_length)
    table = speedup_table(rows, extra, (length, a.acceptance_length), k)
    print(render(table, model, k))
    out = a.out or a.sweep.parent / f"{a.sweep.name}-{a.acceptance_length:g}.json"
    out.write_text(json.dumps({"model": model, "k": k, "lengths": [length, a.acceptance_length], "rows": table},
                              indent=2) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()

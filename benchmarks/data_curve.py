"""How much data does a draft need? The engine-measured T=1 acceptance length at k=3 against the number of
training records and the number of passes over them, so data and compute are told apart (issue 48).

One harvest of the embedded policy on the default task (the demo's settings: 4 samples a prompt, 128 tokens),
as large as the largest arm; each arm trains on its first N records (the harvest's first shards, hard-linked
into a harvest folder of their own: a harvest's shards are seeded one by one, so a prefix is exactly what a
smaller harvest would have drawn) for E epochs with init-draft's defaults. Each arm's draft is then measured on
the engine: `spectool rollout --split eval` (held-out prompts, never harvested) at T=1 with greedy and with
probabilistic proposals, k=3, reading vLLM's own acceptance counters. Per arm: training wall time, init-draft's
peak RSS (the process's own, from wait4) and the disk its run folder took.

Every arm is trained at each of --seeds (init-draft --seed: the draft's initial weights, the order of the records,
the anchors drawn), and every draft measured on the engine with the same rollout seed: a cell's spread over the
training seeds holds both the training's luck and the engine's sampling. Per cell the mean over the seeds and its 95%
Student-t interval on seeds-1 degrees of freedom, and each pair of arms' difference with its 95% Welch interval: two
arms differ only where that interval excludes 0.

    .venv/bin/python benchmarks/data_curve.py --out runs/curve                       # 750x3 750x12 3000x3 6000x3
    .venv/bin/python benchmarks/data_curve.py --out runs/curve --arms 750x3 --seeds 0 --samples 8  # one small arm

Resumable: a finished harvest, arm or cell is reused; an interrupted harvest or init-draft resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from spectool.stats.distributions import student_t_quantile  # noqa: E402

SPECTOOL = [sys.executable, "-m", "spectool.cli"]
RECORDS_PER_PROMPT = 4
CHUNK_PROMPTS = 16  # harvesting.CPU_CHUNK_PROMPTS: one shard on the CPU build
MODES = (("T=1 greedy", "greedy"), ("T=1 probabilistic", "probabilistic"))
GOAL = 2.5  # the goal for T=1 probabilistic acceptance at k=3


def run_measured(args: list[str], log: Path) -> dict:
    """Run `spectool args` with its output in `log`; its wall seconds and peak RSS (GiB, the child's own)."""
    print("$ spectool " + " ".join(args), file=sys.stderr, flush=True)
    t = time.perf_counter()
    with open(log, "a") as f:
        p = subprocess.Popen([*SPECTOOL, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"spectool {args[0]} failed: see {log}")
    return {"seconds": time.perf_counter() - t, "peak_rss_gib": usage.ru_maxrss / 1024**2}


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def harvest(out: Path, records: int) -> Path:
    """The one harvest, of at least `records` records (whole shards)."""
    h = out / "harvest"
    prompts = math.ceil(records / RECORDS_PER_PROMPT / CHUNK_PROMPTS) * CHUNK_PROMPTS
    done, asked = h / "manifest.json", h / "config.json"  # asked: a harvest may keep fewer prompts and records
    if not (done.exists() and json.loads(done.read_text()).get("status") == "complete"
            and json.loads(asked.read_text())["sampling"]["n_prompts"] >= prompts):
        out.mkdir(parents=True, exist_ok=True)
        m = run_measured(["harvest", "--out", str(h), "--n-prompts", str(prompts), "--samples", str(RECORDS_PER_PROMPT),
                          "--max-tokens", "128"], out / "harvest.log")
        old = json.loads((out / "harvest.json").read_text())["seconds"] if (out / "harvest.json").exists() else 0
        (out / "harvest.json").write_text(json.dumps({**m, "seconds": m["seconds"] + old}))
    return h


def subset(h: Path, records: int, dest: Path) -> Path:
    """A harvest folder holding the first shards of `h` with `records` records (whole shards, rounded up)."""
    shards = sorted((h / "records").glob("shard-*.parquet"))
    n = math.ceil(records / (RECORDS_PER_PROMPT * CHUNK_PROMPTS))
    if not (dest / "manifest.json").exists():
        (dest / "records").mkdir(parents=True, exist_ok=True)
        for s in shards[:n]:
            if not (dest / "records" / s.name).exists():
                os.link(s, dest / "records" / s.name)
        (dest / "manifest.json").write_text((h / "manifest.json").read_text())
    return dest


def cell(draft: Path, sampling: str, a) -> dict:
    out = draft.parent / f"{draft.name}-cell-{sampling}"
    if not (out / "manifest.json").exists():
        run_measured(["rollout", "--draft", str(draft), "--k", "3", "--split", "eval", "--temperature", "1",
                      "--draft-sampling", sampling, "--n-prompts", str(a.n_prompts), "--samples", str(a.samples),
                      "--max-tokens", "128", "--seed", "1", "--out", str(out)], draft.parent / f"{out.name}.log")
    acc = json.loads((out / "manifest.json").read_text())["summary"]["acceptance"]
    return {"acceptance_length": 1 + acc["num_accepted_tokens"] / max(acc["num_drafts"], 1), "drafts": acc["num_drafts"]}


def train(out: Path, n: int, epochs: int, seed: int) -> dict:
    """One arm at one training seed, trained once (a finished draft is reused); its row without the engine cells."""
    draft = out / f"{n}x{epochs}-s{seed}"
    if not (draft / "manifest.json").exists():
        data = subset(harvest(out, n), n, out / f"harvest-{n}")
        m = run_measured(["init-draft", "--data", str(data), "--out", str(draft), "--epochs", str(epochs),
                          "--seed", str(seed)], out / f"{draft.name}.log")
        m["disk_gib"] = du(draft) / 1024**3
        (out / f"{draft.name}.json").write_text(json.dumps(m))
    m = json.loads((out / f"{draft.name}.json").read_text())
    man = json.loads((draft / "manifest.json").read_text())
    return {"arm": f"{n}x{epochs}", "seed": seed, "draft": str(draft), "records": man["records"],
            "train_records": man["train_records"], "epochs": epochs, "steps": man["result"]["steps"], **m,
            "offline_heldout": man["acceptance_lengths"]["heldout"]}


def interval(values: list[float]) -> tuple[float, float, float]:
    """The mean of one cell's values over the training seeds and its 95% Student-t interval (seeds-1 df)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan"), float("nan")
    half = student_t_quantile(0.975, n - 1) * (sum((v - mean) ** 2 for v in values) / (n - 1) / n) ** 0.5
    return mean, mean - half, mean + half


def welch(a: list[float], b: list[float], intervals: int = 1) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its Welch interval (Satterthwaite's degrees of freedom) at 95% over `intervals`
    intervals read together (Bonferroni: each at 1 - 0.05 / intervals)."""
    va, vb = (sum((x - sum(v) / len(v)) ** 2 for x in v) / (len(v) - 1) / len(v) for v in (a, b))
    diff = sum(a) / len(a) - sum(b) / len(b)
    if va + vb == 0:
        return diff, float("nan"), float("nan")
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = student_t_quantile(1 - 0.025 / intervals, df) * (va + vb) ** 0.5
    return diff, diff - half, diff + half


def report(rows: list[dict]) -> None:
    """Per arm and mode the mean over the training seeds with its 95% t interval and each seed's value; then every
    pair of arms' differences with their Welch intervals."""
    print(f"\nengine-measured acceptance length at k=3, T=1, held-out prompts (goal {GOAL} probabilistic); per cell the "
          "mean over the training seeds [95% t interval] (each seed's)")
    print("| arm | seeds | records | epochs | steps | train s | peak RSS GiB | " + " | ".join(m for m, _ in MODES)
          + " | offline held-out T=1 probabilistic AL |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(MODES) + "---|")
    arms = {name: [r for r in rows if r["arm"] == name] for name in dict.fromkeys(r["arm"] for r in rows)}
    for name, rs in arms.items():
        cells = []
        for mode, _ in MODES:
            vals = [r[mode]["acceptance_length"] for r in rs]
            mean, lo, hi = interval(vals)
            cells.append(f"{mean:.2f} [{lo:.2f}, {hi:.2f}] ({', '.join(f'{v:.2f}' for v in vals)})")
        offline = ", ".join(f"{r['offline_heldout']['T=1 probabilistic']:.2f}" for r in rs)
        walls = ", ".join(f"{r['seconds']:.0f}" for r in rs)
        print(f"| {name} | {len(rs)} | {rs[0]['records']} | {rs[0]['epochs']} | {rs[0]['steps']} | {walls} | "
              f"{max(r['peak_rss_gib'] for r in rs):.2f} | " + " | ".join(cells) + f" | {offline} |")
    names = [n for n, rs in arms.items() if len(rs) >= 2]
    if len(names) >= 2:
        pairs = [(x, y) for i, x in enumerate(names) for y in names[i + 1:]]
        family = len(pairs) * len(MODES)  # the intervals read together: Bonferroni over all of them
        print("\n| arms compared | " + " | ".join(f"{m}: difference [95% Welch; 95% over all {family}]" for m, _ in MODES)
              + " |")
        print("|---|" + "---|" * len(MODES))
        for x, y in pairs:
            cells = []
            for mode, _ in MODES:
                a, b = ([r[mode]["acceptance_length"] for r in arms[n]] for n in (x, y))
                (d, lo, hi), (_, blo, bhi) = welch(a, b), welch(a, b, family)
                cells.append(f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}; {blo:+.2f}, {bhi:+.2f}]")
            print(f"| {x} - {y} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/curve")
    ap.add_argument("--arms", default="750x3,750x12,3000x3,6000x3", help="RECORDSxEPOCHS, comma-separated")
    ap.add_argument("--seeds", default="0,1", help="init-draft training seeds per arm, comma-separated")
    ap.add_argument("--n-prompts", type=int, default=32, help="held-out prompts (the eval split holds 13)")
    ap.add_argument("--samples", type=int, default=16, help="completions per held-out prompt")
    ap.add_argument("--report", help="print the tables of a saved summary.json (e.g. benchmarks/data's) and stop")
    a = ap.parse_args()
    if a.report:
        report(json.loads(Path(a.report).read_text()))
        return
    out = Path(a.out)
    arms = [tuple(map(int, x.split("x"))) for x in a.arms.split(",")]
    seeds = [int(x) for x in a.seeds.split(",")]
    rows = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else []
    for n, epochs in arms:  # the harvest grows as the arms need it (a harvest resumes with more prompts)
        for seed in seeds:
            row = train(out, n, epochs, seed)
            for mode, sampling in MODES:
                row[mode] = cell(Path(row["draft"]), sampling, a)
            rows = [r for r in rows if (r["arm"], r.get("seed", 0)) != (row["arm"], seed)] + [row]
            (out / "summary.json").write_text(json.dumps(rows, indent=2))
            print(f"{row['arm']} seed {seed}: {row['records']} records x {epochs} epochs, {row['steps']} steps, "
                  f"{row['seconds']:.0f} s, peak RSS {row['peak_rss_gib']:.2f} GiB, disk {row['disk_gib']:.2f} GiB; "
                  "engine AL k=3 " + ", ".join(f"{mode} {row[mode]['acceptance_length']:.2f}" for mode, _ in MODES),
                  flush=True)
    report(rows)
    hs = out / "harvest.json"
    if hs.exists():
        print(f"harvest: {json.loads(hs.read_text())['seconds']:.0f} s")


if __name__ == "__main__":
    main()

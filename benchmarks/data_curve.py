"""How much data does a draft need? The engine-measured T=1 acceptance length at k=3 against the number of
training records and the number of passes over them, so data and compute are told apart (issue 48).

One harvest of the embedded policy on the default task (the demo's settings: 4 samples a prompt, 128 tokens),
as large as the largest arm; each arm trains on its first N records (the harvest's first shards, hard-linked
into a harvest folder of their own: a harvest's shards are seeded one by one, so a prefix is exactly what a
smaller harvest would have drawn) for E epochs with init-draft's defaults. Each arm's draft is then measured on
the engine: `spectool rollout --split eval` (held-out prompts, never harvested) at T=1 with greedy and with
probabilistic proposals, k=3, reading vLLM's own acceptance counters. Per arm: training wall time, init-draft's
peak RSS (the process's own, from wait4) and the disk its run folder took.

    .venv/bin/python benchmarks/data_curve.py --out runs/curve                       # 750x3 750x12 3000x3 6000x3
    .venv/bin/python benchmarks/data_curve.py --out runs/curve --arms 750x3 --samples 8  # one small arm

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
    done = h / "manifest.json"
    if not (done.exists() and json.loads(done.read_text()).get("status") == "complete"
            and json.loads(done.read_text()).get("records", 0) >= records):
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/curve")
    ap.add_argument("--arms", default="750x3,750x12,3000x3,6000x3", help="RECORDSxEPOCHS, comma-separated")
    ap.add_argument("--n-prompts", type=int, default=32, help="held-out prompts (the eval split holds 13)")
    ap.add_argument("--samples", type=int, default=16, help="completions per held-out prompt")
    a = ap.parse_args()
    out = Path(a.out)
    arms = [tuple(map(int, x.split("x"))) for x in a.arms.split(",")]
    rows = []
    for n, epochs in arms:  # the harvest grows as the arms need it (a harvest resumes with more prompts)
        draft = out / f"{n}x{epochs}"
        if not (draft / "manifest.json").exists():
            data = subset(harvest(out, n), n, out / f"harvest-{n}")
            m = run_measured(["init-draft", "--data", str(data), "--out", str(draft), "--epochs", str(epochs)],
                             out / f"{draft.name}.log")
            m["disk_gib"] = du(draft) / 1024**3
            (out / f"{draft.name}.json").write_text(json.dumps(m))
        m = json.loads((out / f"{draft.name}.json").read_text())
        man = json.loads((draft / "manifest.json").read_text())
        row = {"arm": draft.name, "records": man["records"], "train_records": man["train_records"], "epochs": epochs,
               "steps": man["result"]["steps"], **m,
               "offline_heldout": man["acceptance_lengths"]["heldout"]}
        for mode, sampling in MODES:
            row[mode] = cell(draft, sampling, a)
        rows.append(row)
        (out / "summary.json").write_text(json.dumps(rows, indent=2))
        print(f"{row['arm']}: {row['records']} records x {epochs} epochs, {row['steps']} steps, "
              f"{m['seconds']:.0f} s, peak RSS {m['peak_rss_gib']:.2f} GiB, disk {m['disk_gib']:.2f} GiB; engine AL k=3 "
              + ", ".join(f"{mode} {row[mode]['acceptance_length']:.2f}" for mode, _ in MODES), flush=True)
    print(f"\nengine-measured acceptance length at k=3, T=1, held-out prompts (goal {GOAL} probabilistic)")
    print(f"{'arm':>8} {'records':>8} {'epochs':>6} {'steps':>6} {'train s':>8} {'RSS GiB':>8} {'disk GiB':>8} "
          f"{'greedy':>7} {'probabilistic':>13}")
    for r in rows:
        print(f"{r['arm']:>8} {r['records']:>8} {r['epochs']:>6} {r['steps']:>6} {r['seconds']:>8.0f} "
              f"{r['peak_rss_gib']:>8.2f} {r['disk_gib']:>8.2f} {r['T=1 greedy']['acceptance_length']:>7.2f} "
              f"{r['T=1 probabilistic']['acceptance_length']:>13.2f}")
    hs = out / "harvest.json"
    if hs.exists():
        print(f"harvest: {json.loads(hs.read_text())['seconds']:.0f} s")


if __name__ == "__main__":
    main()

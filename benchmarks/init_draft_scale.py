"""init-draft's peak RSS and training throughput against the data's size, for each --features source, side by side
in one run (issue 48): the first release's `cache` (every feature in memory) against `stream` (a window of shards)
and `online` (the policy's forward per batch).

The data: one harvest (the demo's: `runs/demo/draft/harvest`, or any) repeated 1x, 4x and 16x; a feature costs the
same per token whichever record it belongs to, so repeats measure what size does. The policy's features of the
base harvest are computed once and carried as the repeated harvest's --hidden-states shards, which `cache` loads
whole and `stream` reads a window at a time; `online` ignores them and runs the policy per batch. `--write` also
runs `stream` from no shards at the largest size (init-draft writes its own shards as it computes them).
Each run: `spectool init-draft --max-steps STEPS` in its own process; peak RSS is that process's own (wait4);
tokens/s is the training loop's (metrics.jsonl), wall includes loading, the final evaluation and the report.

    .venv/bin/python benchmarks/init_draft_scale.py --harvest runs/demo/draft/harvest --out runs/scale
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPECTOOL = [sys.executable, "-m", "spectool.cli"]
SOURCES = ("cache", "stream", "online")


def with_hidden(h: Path, out: Path) -> Path:
    """A copy of harvest `h` (records hard-linked) with its policy features as --hidden-states shards."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM

    from spectool.hidden import default_aux_layer_ids, feature_items, save_features
    from spectool.records import shard_paths

    dest = out / "base"
    if (dest / "manifest.json").exists():
        return dest
    m = json.loads((h / "manifest.json").read_text())
    policy = AutoModelForCausalLM.from_pretrained(m["model_path"], dtype=torch.float32).eval()
    layers = default_aux_layer_ids(policy.config.num_hidden_layers)
    (dest / "records").mkdir(parents=True, exist_ok=True)
    for n, p in enumerate(shard_paths(h)):
        os.link(p, dest / "records" / p.name)
        rows = datasets.Dataset.from_parquet(str(p))  # one shard at a time
        seqs = [a + b for a, b in zip(rows["prompt_ids"], rows["response_ids"])]
        save_features(dest / "hidden" / f"shard-{n:05d}.safetensors", feature_items(policy, seqs, layers))
    (dest / "manifest.json").write_text(json.dumps({**m, "aux_layer_ids": layers}))
    return dest


def repeated(base: Path, times: int, out: Path) -> Path:
    """`base` with its record and feature shards repeated `times` times (hard links)."""
    dest = out / f"x{times}"
    if (dest / "manifest.json").exists():
        return dest
    recs, feats = sorted((base / "records").glob("shard-*")), sorted((base / "hidden").glob("shard-*"))
    for sub in ("records", "hidden"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    n = 0
    for _ in range(times):
        for r, f in zip(recs, feats):
            os.link(r, dest / "records" / f"shard-{n:05d}.parquet")
            os.link(f, dest / "hidden" / f"shard-{n:05d}.safetensors")
            n += 1
    shutil.copy(base / "manifest.json", dest / "manifest.json")
    return dest


def init_draft(data: Path, out: Path, source: str, steps: int) -> dict:
    if out.exists():
        shutil.rmtree(out)
    args = ["init-draft", "--data", str(data), "--out", str(out), "--features", source, "--max-steps", str(steps),
            "--save-every", str(steps), "--epochs", "100"]
    print("$ spectool " + " ".join(args), file=sys.stderr, flush=True)
    t = time.perf_counter()
    with open(out.parent / f"{out.name}.log", "w") as f:
        p = subprocess.Popen([*SPECTOOL, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"init-draft failed: {out.parent / f'{out.name}.log'}")
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    man = json.loads((out / "manifest.json").read_text())
    disk = sum(p.stat().st_size for p in (out / ".train").rglob("*.safetensors"))
    return {"peak_rss_gib": usage.ru_maxrss / 1024**2, "tokens_per_s": last["tokens_per_s"],
            "wall_s": time.perf_counter() - t, "records": man["records"], "features_disk_gib": disk / 1024**3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--harvest", required=True, help="a harvest run folder (the demo's: runs/demo/draft/harvest)")
    ap.add_argument("--out", default="runs/scale")
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--steps", type=int, default=40, help="training steps per run")
    ap.add_argument("--sources", default=",".join(SOURCES), help="which of cache,stream,online to run")
    ap.add_argument("--write", action="store_true", help="also `stream` from no shards at the largest size")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = with_hidden(Path(a.harvest).resolve(), out)
    sizes = [int(x) for x in a.sizes.split(",")]
    summary = out / "summary.json"  # earlier rows are kept unless rerun here
    rows = {(r["source"], r["times"]): {k: v for k, v in r.items() if k not in ("source", "times")}
            for r in (json.loads(summary.read_text()) if summary.exists() else [])}
    for n in sizes:
        data = repeated(base, n, out)
        for s in a.sources.split(","):
            rows[(s, n)] = init_draft(data, out / f"{s}-x{n}", s, a.steps)
            print(f"{s} x{n}: {rows[(s, n)]}", file=sys.stderr, flush=True)
            summary.write_text(json.dumps([{"source": s, "times": n, **r} for (s, n), r in rows.items()], indent=2))
    if a.write:  # init-draft computing and writing its own shards, from records only
        n = sizes[-1]
        recs = out / f"x{n}-records"
        if not recs.exists():
            shutil.copytree(out / f"x{n}", recs, copy_function=os.link, ignore=shutil.ignore_patterns("hidden"))
            m = json.loads((recs / "manifest.json").read_text())
            m.pop("aux_layer_ids", None)
            (recs / "manifest.json").write_text(json.dumps(m))
        rows[("stream (writes)", n)] = init_draft(recs, out / f"stream-writes-x{n}", "stream", a.steps)
    summary.write_text(json.dumps([{"source": s, "times": n, **r} for (s, n), r in rows.items()], indent=2))

    print(f"\ninit-draft, {a.steps} steps, the base harvest repeated; peak RSS of the init-draft process")
    print(f"{'features':>16} {'data':>5} {'records':>8} {'peak RSS GiB':>13} {'tokens/s':>9} {'wall s':>7} "
          f"{'disk GiB':>9} {'RSS / 1x':>9} {'tok/s / cache':>14}")
    for (s, n), r in sorted(rows.items(), key=lambda x: (x[0][1], x[0][0])):
        one = rows.get((s, 1), r)
        cache = rows.get(("cache", n))
        print(f"{s:>16} {n:>4}x {r['records']:>8} {r['peak_rss_gib']:>13.2f} {r['tokens_per_s']:>9.0f} {r['wall_s']:>7.0f} "
              f"{r['features_disk_gib']:>9.2f} {r['peak_rss_gib'] / one['peak_rss_gib']:>9.2f} "
              f"{r['tokens_per_s'] / cache['tokens_per_s'] if cache else float('nan'):>14.2f}")


if __name__ == "__main__":
    main()

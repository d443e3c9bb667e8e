"""`spectool train-rl --backend trl` under `accelerate launch` with 1 and with N processes, the same
rl.yaml settings (the same sequences per optimizer step, split over the processes), one after the
other on this machine. Prints the step time side by side, and checks what scale-out promises: the
ranks' drafts identical after the run (every refresh is compared across ranks inside the run; this
reads the saved checkpoints too) and the pooled acceptance beside the lowest rank's.

  .venv/bin/python benchmarks/trl_processes.py                  # the tests' tiny policy + random draft
  .venv/bin/python benchmarks/trl_processes.py --processes 2 --steps 6 --prompts 4 --group 4

Each process has its own colocated engine and trainer, so on a 2-core CPU two processes share the
cores that one process had: the numbers measure the plumbing (gloo collectives, two engines), not a
GPU cluster's scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trl_arms import tiny  # noqa: E402  (the tests' tiny policy, a random draft, a sums dataset)


def launch(processes: int, out: Path, a: argparse.Namespace, policy: str, draft: str, data: str) -> float:
    """One run; returns its wall seconds."""
    import time

    sets = [f"model={policy}", f"data={data}", f"out={out}", f"speculation.draft={draft}", f"speculation.k={a.k}",
            f"rollout.prompts_per_step={a.prompts}", f"rollout.group_size={a.group}", f"rollout.max_tokens={a.max_tokens}",
            "rollout.eval_every=0", f"policy.steps={a.steps}", "policy.lr=1e-3", f"policy.micro_batch_size={a.group}",
            "draft_refresh.every=1", "draft_refresh.steps_per_refresh=4", "engine.enforce_eager=true",
            f"checkpoint_every={a.steps}"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes), "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", *(["--multi_gpu"] if processes > 1 else []),
           "-m", "spectool.cli", "train-rl", "--backend", "trl", *[x for s in sets for x in ("--set", s)]]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=open(out.with_suffix(".log"), "w"),
                   env={**os.environ, "MASTER_PORT": str(29600 + processes)})
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="trl_processes-"))
    out.mkdir(parents=True, exist_ok=True)
    policy, draft, data = tiny(out / "tiny")
    rows = {}
    for n in (1, a.processes):
        run = out / f"p{n}"
        wall = launch(n, run, a, policy, draft, data)
        m = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        steady = [r["step_time"] for r in m[1:]] or [m[0]["step_time"]]  # the first step carries compile/warm-up
        manifest = json.loads((run / "manifest.json").read_text())
        rows[n] = {"wall": wall, "step": statistics.mean(steady), "first": m[0]["step_time"],
                   "train": manifest["summary"]["seconds"] / len(m),  # TRL's train(): generation, update, refresh
                   "al": statistics.mean(r["spectool/acceptance_length"] for r in m),
                   "al_min": statistics.mean(r.get("spectool/acceptance_length_min", float("nan")) for r in m),
                   "refresh": statistics.mean(r.get("spectool/refresh_s", 0.0) for r in m),
                   "processes": manifest["processes"]}
    print(f"train-rl --backend trl, tiny policy, {a.steps} steps x {a.prompts} prompts x {a.group} samples (split over "
          f"the processes), max {a.max_tokens} tokens, k={a.k}, refresh every step; {os.cpu_count()} CPU cores")
    print("step s: TRL's step_time (steps 2..; step 1 carries the warm-up); train s/step: train()'s seconds over the "
          "steps, refreshes and syncs included")
    print(f"{'processes':>9} {'step s':>7} {'step 1 s':>8} {'train s/step':>12} {'refresh s':>9} {'accept len':>10} "
          f"{'lowest rank':>11} {'run wall s':>10} {'train vs 1':>10}")
    for n, r in rows.items():
        print(f"{r['processes']:>9} {r['step']:7.2f} {r['first']:8.2f} {r['train']:12.2f} {r['refresh']:9.2f} "
              f"{r['al']:10.2f} {r['al_min']:11.2f} {r['wall']:10.1f} {rows[1]['train'] / r['train']:9.2f}x")


if __name__ == "__main__":
    main()

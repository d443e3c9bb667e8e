"""Writes the recorded metrics the refresh rule is tested on (tests/data/drift_metrics.json) from `spectool
train-rl` run directories: each run's metrics.jsonl at full precision (the replay compares the rule's reasons,
numbers included, with the ones the run logged), the fields the rule and its checks read, and the settings of
its config.json that the rule and the benchmarks depend on.

  python benchmarks/drift_fixture.py --run frozen-seed1=runs/placebo/seed1/frozen \\
      --run frozen-seed2=runs/placebo/seed2/frozen --run auto-seed0=runs/placebo/auto/auto \\
      --out tests/data/drift_metrics.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FIELDS = ("step", "acceptance_length", "spec_counters", "gen_s", "staleness", "agreement_s", "draft_agreement",
          "draft_gain", "refresh_s", "refresh_reason", "refresh_train_s", "refresh_measure_s", "push_s", "probe_s",
          "refresh_ledger", "step_s", "update_s", "entropy", "response_len", "reward")
SETTINGS = ("seed", "data", "speculation.draft", "speculation.k", "policy.lr", "rollout.prompts_per_step",
            "rollout.group_size", "rollout.max_tokens", "rollout.temperature", "draft_refresh.mode",
            "draft_refresh.every", "draft_refresh.drop", "draft_refresh.steps_per_refresh", "draft_refresh.lr")


def setting(config: dict, dotted: str):
    for key in dotted.split("."):
        config = config.get(key, {}) if isinstance(config, dict) else {}
    return config if config != {} else None


def arm(run: Path) -> dict:
    config = json.loads((run / "config.json").read_text())
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"run": str(run), "config": {k: setting(config, k) for k in SETTINGS},
            "metrics": [{k: r[k] for k in FIELDS if k in r} for r in lines]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", required=True, help="NAME=RUN_DIR (a train-rl run directory)")
    ap.add_argument("--out", default="tests/data/drift_metrics.json")
    args = ap.parse_args()
    arms = {name: arm(Path(folder)) for name, folder in (x.split("=", 1) for x in args.run)}
    written_by = "python benchmarks/drift_fixture.py " + " ".join(sys.argv[1:])
    Path(args.out).write_text(json.dumps({"written_by": written_by, "arms": arms}, indent=1) + "\n")
    for name, a in arms.items():
        print(f"{name}: {len(a['metrics'])} steps from {a['run']}")


if __name__ == "__main__":
    main()

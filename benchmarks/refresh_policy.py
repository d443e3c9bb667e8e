"""When to refresh the draft, measured: a frozen draft, a fixed cadence (draft_refresh.mode online, every N
steps) and `auto` (draft/refresh_policy.py), on a policy that moves (a learning rate high enough that the
draft's acceptance drifts). Same config, same seeds, one arm after another on this machine; each arm is a
plain `spectool train-rl` run directory (a finished arm is reused).

Prints per arm: refreshes and the seconds they took, mean step and generation seconds, acceptance length
(first steps, last steps, mean), and the staleness curve (acceptance length by steps since the last refresh,
over the refreshed arms). Writes refresh_policy.png (acceptance over steps per arm) and summary.json.

  python benchmarks/refresh_policy.py --draft runs/parallel-drafters/eagle3 --out runs/refresh-policy
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rl_arms import mean, run_train_rl  # noqa: E402  (a sibling script)


def arms(args) -> dict[str, list[str]]:
    return {"frozen": ["draft_refresh.mode=frozen"],
            f"every-{args.every}": ["draft_refresh.mode=online", f"draft_refresh.every={args.every}"],
            "auto": ["draft_refresh.mode=auto", f"draft_refresh.drop={args.drop}"]}


def common(args) -> list[str]:
    return [f"speculation.draft={args.draft}", f"speculation.k={args.k}", f"policy.steps={args.steps}",
            f"policy.lr={args.lr}", f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
            f"rollout.max_tokens={args.max_tokens}", "rollout.eval_every=0", f"seed={args.seed}",
            f"checkpoint_every={args.steps}", f"draft_refresh.steps_per_refresh={args.refresh_steps}",
            f"draft_refresh.lr={args.draft_lr}", "draft_refresh.warmup_steps=0", f"draft_refresh.ttt_steps={max(args.k, 3)}",
            f"draft_refresh.buffer_seqs={5 * args.prompts * args.group}",  # the features of the last 5 steps
            f"engine.enforce_eager={str(args.eager).lower()}"]


def run_arm(name: str, sets: list[str], args) -> list[dict]:
    return run_train_rl(Path(args.out) / name, args.steps, [*common(args), *sets])


def main() -> None:
    from spectool.rl.report import staleness_curve

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--out", default="runs/refresh-policy")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--lr", type=float, default=5e-5, help="the policy's: high, so that the draft goes stale")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--drop", type=float, default=0.25)
    ap.add_argument("--refresh-steps", type=int, default=10)
    ap.add_argument("--draft-lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eager", action="store_true", help="engine.enforce_eager (faster start, slower decode)")
    args = ap.parse_args()

    results = {name: run_arm(name, sets, args) for name, sets in arms(args).items()}
    print("\n| arm | refreshes | refresh s (total) | step s | generation s | AL first 3 | AL last 3 | AL mean |")
    print("|---|---|---|---|---|---|---|---|")
    summary = {}
    for name, m in results.items():
        al = [r.get("acceptance_length") for r in m]
        refreshes = [r for r in m if "refresh_s" in r]
        row = dict(refreshes=len(refreshes), refresh_s=sum(r["refresh_s"] for r in refreshes),
                   step_s=mean([r["step_s"] for r in m]), gen_s=mean([r["gen_s"] for r in m]),
                   al_first=mean(al[:3]), al_last=mean(al[-3:]), al_mean=mean(al),
                   refresh_steps=[r["step"] for r in refreshes],
                   reasons=[r.get("refresh_reason", "") for r in refreshes],
                   staleness={str(k): v for k, v in staleness_curve(m).items()})
        summary[name] = row
        print(f"| {name} | {row['refreshes']} (steps {row['refresh_steps']}) | {row['refresh_s']:.1f} | "
              f"{row['step_s']:.1f} | {row['gen_s']:.1f} | {row['al_first']:.2f} | {row['al_last']:.2f} | "
              f"{row['al_mean']:.2f} |")
    for name, row in summary.items():
        for step, why in zip(row["refresh_steps"], row["reasons"]):
            if why:
                print(f"{name} step {step}: {why}")
    print("\nstaleness curve (acceptance length by steps since the last refresh; steps averaged):")
    for name, m in results.items():
        curve = staleness_curve(m)
        if len(curve) > 1:
            print(f"  {name}: " + ", ".join(f"{x}: {v['acceptance_length']:.2f} (n={v['steps']})" for x, v in curve.items()))
    out = Path(args.out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(results, out)


def plot(results: dict[str, list[dict]], out: Path) -> None:
    from spectool.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for name, m in results.items():
        acc = [r for r in m if "acceptance_length" in r]
        line, = ax.plot([r["step"] for r in acc], [r["acceptance_length"] for r in acc], "o-", label=name)
        for r in m:
            if "refresh_s" in r:
                ax.axvline(r["step"] + 0.5, color=line.get_color(), alpha=0.25, lw=2)
    ax.set_xlabel("policy step (bars: a refresh after that step)")
    ax.set_ylabel("mean acceptance length")
    save(fig, out / "refresh_policy.png", ax)


if __name__ == "__main__":
    main()

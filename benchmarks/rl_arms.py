"""train-rl side by side: no speculation vs a frozen in-domain draft vs the same draft refreshed
online vs a chat-initialised draft refreshed online (and, with --async, the online arm in async
mode). Same config, same seeds, one after another on this machine; each arm is a plain
`spectool train-rl` run directory (resumable: a finished arm is reused).

Prints per arm: generation tokens/s and seconds per step, end-to-end step time, and the ratios
against the no-speculation arm; mean acceptance length (first steps vs last steps); train and
held-out reward. Writes docs-ready plots: reward curves overlaid, acceptance over steps, stage times.

  python benchmarks/rl_arms.py --math-draft runs/draft-math2 --chat-draft runs/draft-chat --out runs/rl-arms
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def arm_settings(args) -> dict[str, list[str]]:
    arms = {
        "off": ["speculation.enabled=false"],
        "frozen-math": ["draft_refresh.mode=frozen", f"speculation.draft={args.math_draft}"],
        "online-math": ["draft_refresh.mode=online", f"speculation.draft={args.math_draft}"],
    }
    if args.chat_draft:
        arms["online-chat"] = ["draft_refresh.mode=online", f"speculation.draft={args.chat_draft}"]
        arms["frozen-chat"] = ["draft_refresh.mode=frozen", f"speculation.draft={args.chat_draft}"]
    if args.async_arm:
        arms["online-math-async"] = arms["online-math"] + ["rollout.mode=async"]
    return {k: v for k, v in arms.items() if not args.arms or k in args.arms.split(",")}


def common(args) -> list[str]:
    return [f"policy.steps={args.steps}", f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
            f"rollout.max_tokens={args.max_tokens}", f"policy.lr={args.lr}", f"rollout.eval_every={args.eval_every}",
            f"rollout.eval_prompts={args.eval_prompts}", f"draft_refresh.every={args.refresh_every}",
            f"speculation.k={args.k}", f"seed={args.seed}", f"checkpoint_every={args.steps}",
            f"draft_refresh.steps_per_refresh={args.refresh_steps}", f"draft_refresh.lr={args.draft_lr}",
            "draft_refresh.warmup_steps=0", f"draft_refresh.ttt_steps={max(args.k, 3)}"]


def run_arm(name: str, sets: list[str], args) -> list[dict]:
    return run_train_rl(Path(args.out) / name, args.steps, [*common(args), *sets])


def run_train_rl(out: Path, steps: int, sets: list[str]) -> list[dict]:
    """One `spectool train-rl` arm in its run folder (reused once it has `steps` metrics lines); its metrics."""
    metrics = out / "metrics.jsonl"
    done = metrics.exists() and len(metrics.read_text().splitlines()) >= steps
    if not done:
        cmd = [sys.executable, "-m", "spectool.cli", "train-rl"]
        for s in [*sets, f"out={out}"]:
            cmd += ["--set", s]
        print(f"== {out.name}: {' '.join(cmd[3:])}", flush=True)
        subprocess.run(cmd, check=True)
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--math-draft", required=True)
    ap.add_argument("--chat-draft")
    ap.add_argument("--async", dest="async_arm", action="store_true")
    ap.add_argument("--arms", help="comma-separated subset")
    ap.add_argument("--out", default="runs/rl-arms")
    ap.add_argument("--docs", help="copy the plots here (e.g. docs)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--refresh-every", type=int, default=2)
    ap.add_argument("--refresh-steps", type=int, default=10)
    ap.add_argument("--draft-lr", type=float, default=5e-4)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--eval-prompts", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    results = {name: run_arm(name, sets, args) for name, sets in arm_settings(args).items()}
    base = results.get("off")
    print(f"\n{'arm':<18} {'gen tok/s':>9} {'gen s/step':>10} {'step s':>7} {'gen x':>6} {'step x':>7} "
          f"{'AL first3':>9} {'AL last3':>8} {'reward':>7} {'held-out':>15}")
    rows = {}
    for name, m in results.items():
        gen_s, step_s = mean([r["gen_s"] for r in m]), mean([r["step_s"] for r in m])
        tps = sum(r["gen_tokens"] for r in m) / sum(r["gen_s"] for r in m)
        base_tps = sum(r["gen_tokens"] for r in base) / sum(r["gen_s"] for r in base) if base else float("nan")
        base_step = mean([r["step_s"] for r in base]) if base else float("nan")
        al = [r.get("acceptance_length") for r in m]
        ev = [r["eval_reward"] for r in m if "eval_reward" in r]
        rows[name] = dict(gen_tokens_per_s=tps, gen_s=gen_s, step_s=step_s, gen_speedup=tps / base_tps,
                          step_speedup=base_step / step_s, al_first=mean(al[:3]), al_last=mean(al[-3:]),
                          reward=mean([r["reward"] for r in m]), eval=ev)
        print(f"{name:<18} {tps:>9.1f} {gen_s:>10.1f} {step_s:>7.1f} {tps / base_tps:>6.2f} {base_step / step_s:>7.2f} "
              f"{mean(al[:3]):>9.2f} {mean(al[-3:]):>8.2f} {rows[name]['reward']:>7.3f} "
              f"{' -> '.join(f'{x:.3f}' for x in ev):>15}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "summary.json").write_text(json.dumps(rows, indent=2))
    plot(results, Path(args.out), args.docs)


def plot(results: dict[str, list[dict]], out: Path, docs: str | None) -> None:
    import shutil

    from spectool.plots import pyplot, save

    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, m in results.items():
        a1.plot([r["step"] for r in m], [r["reward"] for r in m], label=name, alpha=0.8)
        ev = [(r["step"], r["eval_reward"]) for r in m if "eval_reward" in r]
        if ev:
            a2.plot(*zip(*ev), "o-", label=name, alpha=0.8)
    a1.set_title("train reward (rollouts)")
    a2.set_title("held-out reward (greedy)")
    a1.set_xlabel("step")
    a2.set_xlabel("step")
    save(fig, out / "rl_reward_overlay.png", a1, a2)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, m in results.items():
        acc = [r for r in m if "acceptance_length" in r]
        if acc:
            a1.plot([r["step"] for r in acc], [r["acceptance_length"] for r in acc], "o-", label=name)
        a2.plot([r["step"] for r in m], [r["step_s"] for r in m], label=f"{name} step")
        a2.plot([r["step"] for r in m], [r["gen_s"] for r in m], "--", label=f"{name} generation")
    a1.set_title("mean acceptance length (k=3)")
    a2.set_title("seconds per step")
    a1.set_xlabel("step")
    a2.set_xlabel("step")
    save(fig, out / "rl_acceptance_and_time.png", a1, a2, legend_size=7)
    if docs:
        for f in ("rl_reward_overlay.png", "rl_acceptance_and_time.png"):
            shutil.copy(out / f, Path(docs) / f)


if __name__ == "__main__":
    main()

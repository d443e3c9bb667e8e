"""Does the online refresh pay? A draft trained on one task while GRPO trains the policy on another (or on
the same one, `--data` left at the draft's), arms one after another from the same config and seeds: a
frozen draft, a fixed cadence (draft_refresh.mode online, every N steps) and `auto` (draft/refresh_policy.py).
Each arm is a plain `spectool train-rl` run directory (a finished arm is reused).

Per step, from the runs' metrics.jsonl: acceptance length (the engine's counters), the draft's agreement
with the policy on that step's rollouts before it trained on them (refreshed arms: `draft_agreement`), the
policy's entropy per sampled token and its response length (how far it moves), generation seconds, and
each refresh's seconds by stage (draft steps, agreement measured, push, probe). Prints a table per arm,
each refresh of the fixed cadence with what it bought (acceptance before -> after, the generation seconds
it saved over the steps after it against its cost), auto's refreshes beside them, and the staleness curve.
Writes drift.png (acceptance, agreement and entropy over steps; refreshes marked) and summary.json.

The arms' policies diverge (each samples its own rollouts), so an arm's acceptance mixes what its draft
learned with where its policy went. `--same-policy` separates them: on each refreshed arm's final policy,
`spectool rollout` on held-out prompts with the draft the run started from and with the arm's refreshed
draft, same prompts and seeds.

  python benchmarks/drift.py --draft runs/demo/draft --data gym:letter_counting --out runs/drift
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rl_arms import mean, run_train_rl  # noqa: E402  (a sibling script)

STAGES = ("refresh_train_s", "refresh_measure_s", "push_s", "probe_s")


def arms(args) -> dict[str, list[str]]:
    every = ["draft_refresh.mode=online", f"draft_refresh.every={args.every}"]
    table = {"frozen": ["draft_refresh.mode=frozen"], f"every-{args.every}": every,
             "auto": ["draft_refresh.mode=auto", f"draft_refresh.every={args.every}", f"draft_refresh.drop={args.drop}"]}
    return {k: v for k, v in table.items() if not args.arms or k.split("-")[0] in args.arms.split(",")}


def common(args) -> list[str]:
    data = [f"data={args.data}"] if args.data else []
    return [*data, f"speculation.draft={args.draft}", f"speculation.k={args.k}", f"policy.steps={args.steps}",
            f"policy.lr={args.lr}", f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
            f"rollout.max_tokens={args.max_tokens}", "rollout.eval_every=0", f"seed={args.seed}",
            f"checkpoint_every={args.steps}", f"draft_refresh.steps_per_refresh={args.refresh_steps}",
            f"draft_refresh.lr={args.draft_lr}", "draft_refresh.warmup_steps=0", f"draft_refresh.ttt_steps={max(args.k, 3)}",
            f"draft_refresh.buffer_seqs={5 * args.prompts * args.group}",  # the features of the last 5 steps
            f"engine.enforce_eager={str(args.eager).lower()}"]


def first_last(m: list[dict], key: str, n: int = 3) -> tuple[float, float]:
    xs = [r[key] for r in m if r.get(key) is not None]
    return mean(xs[:n]), mean(xs[-n:])


def arm_row(m: list[dict]) -> dict:
    refreshes = [r for r in m if "refresh_s" in r]
    al = [r.get("acceptance_length") for r in m]
    return dict(refreshes=len(refreshes), refresh_steps=[r["step"] for r in refreshes],
                reasons=[r.get("refresh_reason", "") for r in refreshes],
                refresh_s=sum(r["refresh_s"] for r in refreshes),
                stages={k: sum(r.get(k, 0.0) for r in refreshes) for k in STAGES},
                agreement_s=sum(r.get("agreement_s", 0.0) for r in m), capture_s=sum(r.get("capture_s", 0.0) for r in m),
                step_s=mean([r["step_s"] for r in m]), gen_s=mean([r["gen_s"] for r in m]),
                al=first_last(m, "acceptance_length"), al_mean=mean(al),
                agreement=first_last(m, "draft_agreement"), entropy=first_last(m, "entropy"),
                response_len=first_last(m, "response_len"), reward=first_last(m, "reward"),
                warnings=[(r["step"], r["warning"]) for r in m if r.get("warning")])


def what_refreshes_bought(m: list[dict], horizon: int) -> list[dict]:
    """Each refresh of an arm: acceptance on the step before and the step after, and the generation seconds
    the next `horizon` steps saved against the step before (g * (1 - a_before / a)), beside its cost. A hindsight
    view across steps: it books the policy's own movement as the refresh's. `auto` no longer decides on it (its
    rule 3 compares the new draft with the previous one on the same rollouts: refresh_policy.py)."""
    by_step = {r["step"]: r for r in m}
    out = []
    for r in m:
        if "refresh_s" not in r or r.get("acceptance_length") is None:
            continue
        nxt = [by_step[s] for s in range(r["step"] + 1, r["step"] + 1 + horizon) if s in by_step]
        nxt = [x for x in nxt if x.get("acceptance_length")]
        saved = sum(x["gen_s"] * (1 - r["acceptance_length"] / x["acceptance_length"]) for x in nxt)
        out.append(dict(step=r["step"], before=r["acceptance_length"],
                        after=nxt[0]["acceptance_length"] if nxt else None, saved_s=saved, cost_s=r["refresh_s"],
                        steps=len(nxt)))
    return out


def rollout_acceptance(out: Path, policy: Path, draft: str, args) -> float:
    """Mean acceptance length of one `spectool rollout` (reused when its manifest exists)."""
    if not (out / "manifest.json").exists():
        cmd = [sys.executable, "-m", "spectool.cli", "rollout", "--model", str(policy), "--draft", draft,
               "--k", str(args.k), "--temperature", "1", "--n-prompts", str(args.prompts * 2), "--samples", "4",
               "--max-tokens", str(args.max_tokens), "--split", "eval", "--seed", "1", "--out", str(out)]
        cmd += ["--data", args.data] if args.data else []
        env = {**os.environ, "SPECTOOL_ENFORCE_EAGER": "1"} if args.eager else None
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    acc = json.loads((out / "manifest.json").read_text())["summary"]["acceptance"]
    return 1 + acc["num_accepted_tokens"] / acc["num_drafts"]


def same_policy(arm: Path, args) -> dict:
    """On the arm's final policy: the starting draft's acceptance against the arm's refreshed draft's."""
    ckpt = max((arm / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    return {"step": int(ckpt.name.split("-")[1]),
            "start_draft": rollout_acceptance(arm / "same-policy" / "start-draft", ckpt / "policy", args.draft, args),
            "refreshed_draft": rollout_acceptance(arm / "same-policy" / "refreshed-draft", ckpt / "policy",
                                                  str(ckpt / "draft"), args)}


def main() -> None:
    from spectool.rl.report import staleness_curve

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", required=True, help="a draft folder (init-draft's), trained on another task or the same")
    ap.add_argument("--data", help="the RL task (default: train-rl's, the demo draft's own task)")
    ap.add_argument("--out", default="runs/drift")
    ap.add_argument("--arms", help="comma-separated subset of frozen,every,auto")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--lr", type=float, default=5e-5, help="the policy's: high, so that it moves")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--drop", type=float, default=0.25)
    ap.add_argument("--refresh-steps", type=int, default=10)
    ap.add_argument("--draft-lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eager", action="store_true", help="engine.enforce_eager (faster start, slower decode)")
    ap.add_argument("--docs", help="copy drift.png here (e.g. docs)")
    ap.add_argument("--same-policy", action="store_true", help="each refreshed arm's final policy with both drafts")
    args = ap.parse_args()

    results = {name: run_train_rl(Path(args.out) / name, args.steps, [*common(args), *sets])
               for name, sets in arms(args).items()}
    summary = {name: arm_row(m) for name, m in results.items()}
    print("\n| arm | refreshes | refresh s: total (draft steps / agreement / push / probe) | step s | generation s "
          "| AL steps 1-3 -> last 3 (mean) | agreement | entropy | response tokens | reward |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, row in summary.items():
        st = row["stages"]
        print(f"| {name} | {row['refreshes']} {row['refresh_steps'] or ''} | {row['refresh_s']:.1f} ("
              f"{st['refresh_train_s']:.1f} / {st['refresh_measure_s']:.1f} / {st['push_s']:.1f} / {st['probe_s']:.1f}) | "
              f"{row['step_s']:.1f} | {row['gen_s']:.1f} | {row['al'][0]:.2f} -> {row['al'][1]:.2f} ({row['al_mean']:.2f}) | "
              + " | ".join(f"{row[k][0]:.2f} -> {row[k][1]:.2f}" for k in ("agreement", "entropy", "response_len", "reward"))
              + " |")
    for name, m in results.items():
        bought = what_refreshes_bought(m, args.every)
        summary[name]["bought"] = bought
        for b in bought:
            print(f"{name} refresh after step {b['step']}: acceptance {b['before']:.2f} -> "
                  f"{b['after'] if b['after'] is None else round(b['after'], 2)}; saved {b['saved_s']:+.1f} s of "
                  f"generation over {b['steps']} steps, cost {b['cost_s']:.1f} s")
        row = summary[name]
        for step, why in zip(row["refresh_steps"], row["reasons"]):
            if why and name == "auto":
                print(f"auto step {step}: {why}")
        for step, w in row["warnings"]:
            print(f"{name} step {step} warned: {w}")
    print("\nstaleness curve (acceptance length by steps since the last refresh; steps averaged):")
    for name, m in results.items():
        curve = staleness_curve(m)
        summary[name]["staleness"] = {str(k): v for k, v in curve.items()}
        print(f"  {name}: " + ", ".join(f"{x}: {v['acceptance_length']:.2f} (n={v['steps']})" for x, v in curve.items()))
    out = Path(args.out)
    if args.same_policy:
        print("\nthe same policy, two drafts (held-out prompts, T=1, `spectool rollout`):")
        for name in results:
            if name != "frozen":
                sp = summary[name]["same_policy"] = same_policy(out / name, args)
                print(f"  {name}'s policy at step {sp['step']}: the starting draft {sp['start_draft']:.2f}, "
                      f"its refreshed draft {sp['refreshed_draft']:.2f}")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(results, out, args.docs)


def plot(results: dict[str, list[dict]], out: Path, docs: str | None) -> None:
    import shutil

    from spectool.plots import pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = (("acceptance_length", "acceptance length (engine)"),
              ("draft_agreement", "draft agreement, position 1 (held out)"), ("entropy", "policy entropy, nats/token"))
    for ax, (key, label) in zip(axes, panels):
        for i, (name, m) in enumerate(results.items()):  # one colour per arm in every panel
            pts = [r for r in m if r.get(key) is not None]
            if not pts:
                continue
            line, = ax.plot([r["step"] for r in pts], [r[key] for r in pts], "o-", ms=3, label=name, color=f"C{i}")
            for r in m:
                if "refresh_s" in r and key == "acceptance_length":
                    ax.axvline(r["step"] + 0.5, color=line.get_color(), alpha=0.25, lw=2)
        ax.set_xlabel("policy step" + (" (bars: a refresh after it)" if key == "acceptance_length" else ""))
        ax.set_ylabel(label)
    save(fig, out / "drift.png", axes[0])
    if docs:
        shutil.copy(out / "drift.png", Path(docs) / "drift.png")


if __name__ == "__main__":
    main()

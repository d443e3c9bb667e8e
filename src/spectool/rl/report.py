"""train-rl's live view (rich) and end-of-run plots (matplotlib), both from the metrics records."""

from __future__ import annotations

from pathlib import Path

from spectool.plots import pyplot, save
from spectool.ui import console

STAGES = [("gen_s", "generation"), ("update_s", "policy update"), ("sync_s", "weight sync"),
          ("check_s", "logprob check"), ("refresh_s", "draft refresh"), ("eval_s", "held-out eval")]


class LiveView:
    """A progress bar plus a table of the last steps, redrawn after every step."""

    def __init__(self, cfg, start: int, history: list[dict], rows: int = 8):
        self.total, self.start, self.rows = cfg.policy.steps, start, rows
        self.history = list(history)
        self.console = console()
        self.live = None

    def __enter__(self):
        from rich.live import Live  # noqa: PLC0415 (heavy, loaded only on this path)

        self.live = Live(self._render(), console=self.console, refresh_per_second=2, transient=False)
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.__exit__(*exc)

    def update(self, rec: dict) -> None:
        self.history.append(rec)
        if rec.get("warning"):
            self.console.print(f"[yellow]step {rec['step']}: {rec['warning']}[/yellow]")
        self.live.update(self._render())

    def _render(self):
        from rich.console import Group  # noqa: PLC0415 (heavy, loaded only on this path)
        from rich.progress_bar import ProgressBar  # noqa: PLC0415 (heavy, loaded only on this path)
        from rich.table import Table  # noqa: PLC0415 (heavy, loaded only on this path)
        from rich.text import Text  # noqa: PLC0415 (heavy, loaded only on this path)

        done = self.history[-1]["step"] if self.history else self.start
        t = Table(title=f"train-rl  step {done}/{self.total}", expand=False)
        for col in ("step", "reward", "eval", "accept len", "per-position", "gen tok/s", "step s", "gen share",
                    "loss", "draft top1"):
            t.add_column(col, justify="right")
        for r in self.history[-self.rows :]:
            t.add_row(
                str(r["step"]), f"{r['reward']:.3f}", _f(r.get("eval_reward"), ".3f"), _f(r.get("acceptance_length"), ".2f"),
                " ".join(f"{x:.2f}" for x in r.get("acceptance_per_pos", [])) or "-", f"{r['gen_tokens_per_s']:.0f}",
                f"{r['step_s']:.1f}", f"{r['gen_share']:.0%}", f"{r['loss']:+.4f}",
                _f((r.get("draft_top1_after") or [None])[0], ".2f"))
        return Group(ProgressBar(total=self.total, completed=done, width=60), Text(""), t)


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def staleness_curve(history: list[dict]) -> dict[int, dict]:
    """Acceptance against steps since the last refresh: staleness -> {"steps", "acceptance_length",
    "per_position"} (means over the steps of that staleness; train-rl's `staleness` metric)."""
    groups: dict[int, list[dict]] = {}
    for r in history:
        if "staleness" in r and "acceptance_length" in r:
            groups.setdefault(r["staleness"], []).append(r)
    curve = {}
    for x, rs in sorted(groups.items()):
        k = max(len(r["acceptance_per_pos"]) for r in rs)
        per = [sum(r["acceptance_per_pos"][j] for r in rs if j < len(r["acceptance_per_pos"])) / len(rs) for j in range(k)]
        curve[x] = {"steps": len(rs), "acceptance_length": sum(r["acceptance_length"] for r in rs) / len(rs),
                    "per_position": per}
    return curve


def plot_run(history: list[dict], out: Path) -> list[str]:
    """reward.png, acceptance.png and staleness.png (when speculative, refreshed), stage_times.png; returns the
    file names."""

    plt = pyplot()
    if not history:
        return []
    steps = [r["step"] for r in history]
    written = []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [r["reward"] for r in history], label="train reward (rollouts)", alpha=0.6)
    ev = [(0, history[0]["eval_reward_initial"])] if "eval_reward_initial" in history[0] else []
    ev += [(r["step"], r["eval_reward"]) for r in history if "eval_reward" in r]
    if ev:
        ax.plot(*zip(*ev), "o-", label="held-out reward")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    save(fig, out / "reward.png", ax)
    written.append("reward.png")

    acc = [r for r in history if "acceptance_length" in r]
    if acc:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
        a1.plot([r["step"] for r in acc], [r["acceptance_length"] for r in acc], "o-")
        for r in history:
            if "refresh_s" in r:
                a1.axvline(r["step"], color="grey", alpha=0.3, lw=1)
        a1.set_xlabel("step (grey: draft refresh)")
        a1.set_ylabel("mean acceptance length")
        kmax = max(len(r["acceptance_per_pos"]) for r in acc)
        for j in range(kmax):
            a2.plot([r["step"] for r in acc], [r["acceptance_per_pos"][j] if j < len(r["acceptance_per_pos"]) else None
                                               for r in acc], label=f"position {j + 1}")
        a2.set_xlabel("step")
        a2.set_ylabel("acceptance rate")
        save(fig, out / "acceptance.png", a2)
        written.append("acceptance.png")
    stale = staleness_curve(history)
    if len(stale) > 1:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        xs = sorted(stale)
        kmax = max(len(v["per_position"]) for v in stale.values())
        for j in range(kmax):
            ax.plot(xs, [stale[x]["per_position"][j] if j < len(stale[x]["per_position"]) else None for x in xs], "o-",
                    label=f"position {j + 1}")
        ax.set_xlabel("steps since the last draft refresh (0: the fresh draft's rollouts)")
        ax.set_ylabel("acceptance rate")
        save(fig, out / "staleness.png", ax)
        written.append("staleness.png")

    fig, ax = plt.subplots(figsize=(7, 3.5))
    bottom = [0.0] * len(history)
    for key, label in STAGES:
        vals = [r.get(key, 0.0) for r in history]
        if any(vals):
            ax.bar(steps, vals, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.plot(steps, [r["step_s"] for r in history], "k.", label="step wall time")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    save(fig, out / "stage_times.png", ax)
    written.append("stage_times.png")
    return written


def render_summary(result) -> None:
    from rich.table import Table  # noqa: PLC0415 (heavy, loaded only on this path)

    h = result.metrics
    t = Table(title=f"train-rl: {result.out}", show_header=False)
    t.add_row("steps", f"{result.steps} (resumed from {result.resumed_from})" if result.resumed_from else str(result.steps))
    t.add_row("wall time", f"{result.seconds:.0f} s")
    if h:
        first, last = h[0], h[-1]
        t.add_row("train reward (first -> last step)", f"{first['reward']:.3f} -> {last['reward']:.3f}")
        ev = [h[0]["eval_reward_initial"]] if "eval_reward_initial" in h[0] else []
        ev += [r["eval_reward"] for r in h if "eval_reward" in r]
        if ev:
            t.add_row("held-out reward (first -> last eval)", f"{ev[0]:.3f} -> {ev[-1]:.3f}")
        acc = [r["acceptance_length"] for r in h if "acceptance_length" in r]
        if acc:
            t.add_row("acceptance length (first -> last step)", f"{acc[0]:.2f} -> {acc[-1]:.2f}")
        n = len(h)
        t.add_row("mean step time", f"{sum(r['step_s'] for r in h) / n:.1f} s")
        t.add_row("mean generation share", f"{sum(r['gen_share'] for r in h) / n:.0%}")
        t.add_row("stage means (s)", "  ".join(f"{label} {sum(r.get(k, 0.0) for r in h) / n:.1f}" for k, label in STAGES))
        if any("finish_length" in r for r in h):
            from spectool.context import describe_finish  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

            t.add_row("rollouts ended", describe_finish({"stop": sum(r.get("finish_stop", 0) for r in h),
                                                         "length": sum(r.get("finish_length", 0) for r in h)}))
    t.add_row("outputs", "metrics.jsonl, reward.png, acceptance.png, stage_times.png, checkpoints/")
    console().print(t)

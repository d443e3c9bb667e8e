"""Contention: what OTHER processes took of the machine's CPU while an arm was timed (sweep-k, rollout --compare).

A timing is only as true as the machine it ran on. Another job on the cores slows an arm, now and then by much (on
2 cores beside another job: plain decoding 9.3 tokens/s against 79.5 alone, a "4.94x speedup" at acceptance length
1.13; issue 68 item 4), and such skewed noise breaks sweep-k's bound (audit-2026-11c M3). The 1-minute load average
cannot tell: it lags (right after another job ended it still held that job's load, and sweep-k warned "another job
ran" alone) and it counts this run's own threads. So each timed window reads, at its start and its end:
- /proc/stat's `cpu` line: the machine's busy time (user, nice, system, irq, softirq), the time the hypervisor stole
  (steal) and the total, in clock ticks over all of its CPUs;
- this process tree's own CPU time: utime + stime + cutime + cstime of the measuring process and of every descendant
  (/proc/<pid>/stat, the same clock ticks). A child reaped during the window moves its time into its parent's
  cutime/cstime, so the sum over the live tree keeps it: an engine's worker processes count as the run's own,
  whether they live through the window or not.
Others' share = (busy - own) / total over the window; steal's = steal / total; `contention` is their sum, a share
of the machine's CPU time (x its CPUs: the cores others held on average).

OTHERS_LIMIT, a warning and not a calibrated test: others holding more than a tenth of the machine while an arm was
timed. A CPU engine runs its threads on every core, and one core taken from a parallel step stalls the step's other
threads at its barrier, so a small share slows the arm by more than its size (the 8x above was one job on 2 cores);
kernel threads and an idle desktop hold ~1%. Where /proc cannot be read (not Linux) nothing is judged (None).
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
OTHERS_LIMIT = 0.10  # others' + steal's share of the machine's CPU time during a timed arm that warns


def _cpu_ticks(proc: Path) -> tuple[list[int], int] | None:
    """([busy, steal, total] clock ticks since boot over all CPUs, the CPUs) from `proc`/stat; None where unreadable."""
    try:
        lines = (proc / "stat").read_text().splitlines()
    except OSError:
        return None
    fields = lines[0].split() if lines else []
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[1:9])  # guest time is in user
    cpus = sum(1 for x in lines[1:] if x.startswith("cpu") and x[3:4].isdigit())
    return [user + nice + system + irq + softirq, steal, user + nice + system + idle + iowait + irq + softirq + steal], cpus


def tree_ticks(root: int, proc: Path = PROC) -> int | None:
    """CPU clock ticks of process `root` and all its descendants (utime + stime + cutime + cstime of each); None
    where `root` cannot be read. A process that ends between the listing and its read is skipped."""
    parent, ticks = {}, {}
    try:
        entries = [d for d in proc.iterdir() if d.name.isdigit()]
    except OSError:
        return None
    for d in entries:
        try:
            text = (d / "stat").read_text()
        except OSError:
            continue
        f = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": the comm may hold spaces and parentheses
        pid = int(d.name)
        parent[pid], ticks[pid] = int(f[1]), sum(int(x) for x in f[11:15])  # fields 4 (ppid) and 14-17 of proc(5)
    if root not in ticks:
        return None
    children: dict[int, list[int]] = {}
    for pid, pp in parent.items():
        children.setdefault(pp, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks[pid]
        todo += children.get(pid, [])
    return total


def snapshot(root: int | None = None, proc: Path = PROC) -> dict:
    """The machine's CPU ticks and those of `root`'s process tree (default: this process) now; `between` takes two."""
    cpu = _cpu_ticks(proc)
    return {"cpu": cpu[0] if cpu else None, "cpus": cpu[1] if cpu else 0,
            "own": tree_ticks(os.getpid() if root is None else root, proc)}


def between(before: dict, after: dict) -> dict:
    """One timed window, as sweep-k records it per engine run and batch size and rollout --compare per arm: the share
    of the machine's CPU time that other processes took (`others`) and that the hypervisor stole (`steal`) in it,
    and the machine's CPUs. The shares are None where /proc could not be read."""
    if not (before.get("cpu") and after.get("cpu")) or before.get("own") is None or after.get("own") is None:
        return {"others": None, "steal": None, "cpus": after.get("cpus", 0)}
    busy, steal, total = (a - b for a, b in zip(after["cpu"], before["cpu"]))
    if total <= 0:
        return {"others": 0.0, "steal": 0.0, "cpus": after["cpus"]}
    others = max(0, busy - (after["own"] - before["own"]))  # tick sampling: own may pass busy by a tick or two
    return {"others": others / total, "steal": steal / total, "cpus": after["cpus"]}


def contention(window: dict) -> float | None:
    """Others' and steal's share of the machine's CPU time in a window (`between`); None where unmeasured (an old
    sweep's rows carry the 1-minute load instead, which says nothing about others)."""
    if window.get("others") is None:
        return None
    return window["others"] + (window.get("steal") or 0.0)


def busy_text(window: dict) -> str | None:
    """What others took in a window, in words, when more than OTHERS_LIMIT; else None."""
    share = contention(window)
    if share is None or share <= OTHERS_LIMIT:
        return None
    stolen = f", {window['steal']:.0%} of it stolen by the hypervisor" if (window.get("steal") or 0) >= 0.005 else ""
    cores = f" ({share * window['cpus']:.1f} of {window['cpus']} cores)" if window.get("cpus") else ""
    return f"other processes took {share:.0%} of the machine's CPU{cores}{stolen}"


def load_warning(loads: list[dict]) -> str | None:
    """loads: one per engine run and batch size ({"method", "k", "run", "batch", **`between`'s window}). The reason
    sweep-k's bound is not held (others took more than OTHERS_LIMIT while an engine was timed), or None."""
    busy = [(contention(x), x) for x in loads if (contention(x) or 0.0) > OTHERS_LIMIT]
    if not busy:
        return None
    worst = max(busy, key=lambda b: b[0])[1]
    what = "plain decoding" if worst["method"] == "none" else f"{worst['method']} k={worst['k']}"
    return (f"the machine was busy while the sweep timed its engines: {busy_text(worst)} during round "
            f"{worst.get('run', 0) + 1}'s {what} at batch {worst['batch']} ({len(busy)} of {len(loads)} timed runs "
            f"above {OTHERS_LIMIT:.0%}). The 5% bound on a false recommendation is not held under such contention (it "
            "slows runs now and then, which the bound's normal noise does not allow for); sweep again where nothing "
            "else runs")

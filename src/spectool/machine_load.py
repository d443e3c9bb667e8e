"""The machine's load while sweep-k times an engine, and when it says the speedup bound is not held.

sweep-k's bound (stats/sweep.py) takes each engine run's noise as normal. Contention is not: another job only ever
slows a run, now and then by much, and such skewed noise gave 12-28% false recommendations where the bound says 5%
(audit-2026-11c M3). A sweep cannot tell that noise from a gain, but it can see the machine: engine/arms.measure_arm
reads the 1-minute load average (os.getloadavg) and the CPU time stolen by the hypervisor (/proc/stat, where
readable) before and after each batch size's timed waves, and `load_warning` says when they moved.

The thresholds (a warning, not a calibrated test: no pool measured the rate under each load):
- LOAD_SPREAD: at one batch size, the 1-minute load at the end of the timed waves differs by more than 1 between the
  sweep's engine runs (one more runnable thread in some runs than in others), or the load before the sweep started
  any engine was above 1 (another job held a core; on a CPU engine, which uses every core, that job then competes
  with the sweep. A threshold on the load during a run would need the engine's own load, which varies by build);
- STEAL_LIMIT: more than 5% of a run's CPU time during its timed waves was stolen (a shared virtual machine).
"""

from __future__ import annotations

import os

LOAD_SPREAD = 1.0  # runnable threads: the load's spread between runs, or its excess over the cores, that warns
STEAL_LIMIT = 0.05  # the share of CPU time stolen during a run's timed waves that warns


def _cpu_jiffies() -> tuple[int, int] | None:
    """(steal, total) CPU time since boot from /proc/stat's `cpu` line; None where it cannot be read (not Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal (guest time is in user)
    return ticks[7], sum(ticks)


def snapshot() -> dict:
    """The machine now: the 1-minute load average and the CPU jiffies (None where unreadable)."""
    jiffies = _cpu_jiffies()
    return {"load1": os.getloadavg()[0], "jiffies": jiffies}


def cores() -> int:
    """The cores this process may run on (an engine on the CPU build uses them all)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def between(before: dict, after: dict) -> dict:
    """One timed window's load, as sweep-k records it per engine run and batch size: the 1-minute load average at
    its start and end, the share of CPU time stolen in it (None where /proc/stat is unreadable) and the cores."""
    steal = None
    if before["jiffies"] and after["jiffies"]:
        total = after["jiffies"][1] - before["jiffies"][1]
        steal = (after["jiffies"][0] - before["jiffies"][0]) / total if total > 0 else 0.0
    return {"load1": [before["load1"], after["load1"]], "steal": steal, "cores": cores()}


def load_warning(loads: list[dict], idle: float | None = None) -> str | None:
    """loads: one per engine run and batch size ({"batch", "load1": [start, end], "steal", "cores"}, as `between`
    gives with the batch added); idle: the 1-minute load before the sweep started an engine (None: not read, a
    resumed sweep's earlier part). The reason the sweep's bound is not held, or None when the load stayed put."""
    why = []
    if idle is not None and idle > LOAD_SPREAD:
        why.append(f"the 1-minute load average was {idle:.1f} before the sweep started an engine (another job ran)")
    for b in sorted({x["batch"] for x in loads}):
        ends = [x["load1"][1] for x in loads if x["batch"] == b]
        if max(ends) - min(ends) > LOAD_SPREAD:
            why.append(f"at batch {b} the 1-minute load average moved between {min(ends):.1f} and {max(ends):.1f} "
                       f"across the engine runs (more than {LOAD_SPREAD:g})")
    stolen = [x["steal"] for x in loads if x.get("steal") is not None]
    if stolen and max(stolen) > STEAL_LIMIT:
        why.append(f"the hypervisor took {max(stolen):.0%} of the CPU time in one run (more than {STEAL_LIMIT:.0%})")
    if not why:
        return None
    return ("the machine's load moved during the sweep: " + "; ".join(why) + ". The 5% bound on a false "
            "recommendation is not held under such contention (it slows runs now and then, which the bound's normal "
            "noise does not allow for); sweep again where nothing else runs")

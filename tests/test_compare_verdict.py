"""rollout --compare's verdict on made-up arm timings (a tie is no win, a speedup cheaper than a plain step is a
fault, a busy machine is not judged) and machine_load's measure of what other processes took of the CPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spectool import machine_load
from spectool.commands.rollout import MIN_PASSES, RolloutResult
from spectool.stats import AcceptanceStats

QUIET = {"others": 0.01, "steal": 0.0, "cpus": 2}  # a timed arm beside an idle desktop


def result(plain: list[float], spec: list[float], al: float = 1.58, load: dict | None = None) -> RolloutResult:
    """A --compare result whose arms timed these tokens/s, pass by pass (1,000 tokens a pass), at acceptance length
    `al` (k=3, 13 sequences)."""
    plain_passes, passes = [[1000, 1000 / r] for r in plain], [[1000, 1000 / r] for r in spec]
    rate = sum(t for t, _ in passes) / sum(s for _, s in passes)
    drafts = 1000
    return RolloutResult(n_prompts=13, n_completions=13, mean_reward=0.5, mean_response_len=80.0, tokens_per_s=rate,
                         seconds=sum(s for _, s in passes),
                         acceptance=AcceptanceStats(drafts, 3 * drafts, round((al - 1) * drafts), [0, 0, 0]), k=3,
                         plain_tokens_per_s=sum(t for t, _ in plain_passes) / sum(s for _, s in plain_passes),
                         plain_passes=plain_passes, passes=passes,
                         load=load if load is not None else {"plain": QUIET, "speculative": QUIET})


def test_a_tie_is_no_win():
    """The H200's 361.7 against 360.7 tokens/s (1.00x) printed "speculation won": passes that spread by ~1% give
    bounds around 1x, and the line says no difference beyond the noise."""
    r = result([360.1, 361.9, 359.8, 361.0], [362.5, 360.2, 363.1, 361.0])
    v = r.judge()
    assert v.word == "no difference beyond the noise" and v.lo < 1 < v.hi and v.pairs == 4
    assert r.why().startswith("speculation: no difference beyond the noise: 1.00x, 95% bounds ")
    assert "won" not in r.why()


def test_a_clear_win_and_a_clear_loss():
    win = result([100.0, 102.0, 99.0, 101.0], [140.0, 141.0, 142.0, 139.0], al=2.4)
    assert win.judge().word == "won" and win.judge().lo > 1.03
    assert win.why().startswith("speculation won: 1.40x, 95% bounds 1.3")
    assert "(3 draft forwards + the policy on 4 tokens, 13 sequences at once, float32)" in win.why()
    loss = result([100.0, 102.0, 99.0, 101.0], [71.0, 70.0, 72.5, 70.5], al=1.2)
    assert loss.judge().word == "lost" and loss.judge().hi < 1 / 1.03
    assert loss.why().startswith("speculation lost: 0.71x") and "more than the tokens it emitted" in loss.why()


def test_a_gain_within_the_passes_noise_or_the_margin_is_no_win():
    noisy = result([100.0, 130.0, 90.0], [125.0, 105.0, 140.0])  # 1.10x, passes spread by ~20%
    assert noisy.speedup > 1.05 and noisy.judge().word == "no difference beyond the noise"
    small = result([100.0, 100.2, 99.9, 100.1], [102.0, 102.1, 101.9, 102.0])  # 1.02x, tight: within the 3% margin
    assert small.judge().lo > 1 and small.judge().word == "no difference beyond the noise"
    slower = result([100.0, 130.0, 90.0], [110.0, 95.0, 85.0])  # 0.92x, as noisy: no loss either
    assert slower.speedup < 0.95 and slower.judge().word == "no difference beyond the noise"
    tight = result([100.0, 100.2, 99.9, 100.1], [98.0, 98.1, 97.9, 98.0])  # 0.98x, tight: within the margin
    assert tight.judge().hi < 1 and tight.judge().word == "no difference beyond the noise"
    one = result([100.0], [150.0], al=2.0)  # one pass each: no noise measured, no verdict from the point estimate
    assert one.judge().word == "no difference beyond the noise" and "no noise measured" in one.judge().reason
    assert MIN_PASSES >= 3  # what rollout times, so that a verdict can be reached at all


def test_a_verify_step_cheaper_than_a_plain_step_is_a_fault_not_a_win():
    """Issue 68's run beside another job: 9.3 against 45.8 tokens/s, "speedup 4.94x" at acceptance length 1.13, told
    as "each verify step cost 0.23 plain decoding steps". A verify step runs the policy at least once."""
    busy = {"others": 0.45, "steal": 0.0, "cpus": 2}
    r = result([9.2, 9.4, 9.3], [45.6, 45.9, 45.9], al=1.13, load={"plain": busy, "speculative": QUIET})
    v = r.judge()
    assert v.word == "measurement fault" and "cost 0.23 plain decoding steps, less than one" in v.reason
    assert "other processes took 45% of the machine's CPU (0.9 of 2 cores) while plain decoding was timed" in v.reason
    assert r.why().startswith("speculation: measurement fault: ") and "won" not in r.why()
    assert "cannot cost less than a plain decoding step" in r.why()
    quiet = result([9.2, 9.4, 9.3], [45.6, 45.9, 45.9], al=1.13)  # a fault even where nothing else ran
    assert quiet.judge().word == "measurement fault" and "no more than 10%" in quiet.judge().reason
    # a speedup past the acceptance length whose lower bound is not (the passes' noise) is judged, not a fault
    edge = result([100.0, 101.0, 99.0, 100.5], [150.0, 185.0, 140.0, 190.0], al=1.6)
    assert edge.speedup > 1.6 > edge.judge().lo and edge.judge().word == "won"


def test_a_busy_machine_is_not_judged():
    busy = {"others": 0.30, "steal": 0.05, "cpus": 2}
    r = result([100.0, 102.0, 99.0, 101.0], [140.0, 143.0, 139.0, 141.5], al=2.4,
               load={"plain": QUIET, "speculative": busy})
    v = r.judge()
    assert v.word == "not judged"
    assert "took 35% of the machine's CPU (0.7 of 2 cores), 5% of it stolen by the hypervisor while speculation was " \
           "timed" in v.reason
    edge = result([100.0, 102.0, 99.0, 101.0], [140.0, 143.0, 139.0, 141.5], al=2.4,
                  load={"plain": {"others": 0.09, "steal": 0.0, "cpus": 2}, "speculative": QUIET})
    assert edge.judge().word == "won"  # 9% is under machine_load.OTHERS_LIMIT
    unread = result([100.0, 102.0, 99.0, 101.0], [140.0, 143.0, 139.0, 141.5], al=2.4,
                    load={"plain": {"others": None, "steal": None, "cpus": 0}})
    assert unread.judge().word == "won"  # no /proc (not Linux): judged on the passes alone


# --- machine_load: others' CPU over a window -----------------------------------------------------------------


def _fake_proc(root, cpu: list[int], procs: dict[int, tuple[int, int]], cpus: int = 2):
    """A /proc with its `cpu` line (user nice system idle iowait irq softirq steal) and processes pid -> (ppid,
    ticks), the ticks split over utime, stime, cutime and cstime."""
    root.mkdir(exist_ok=True)
    lines = ["cpu " + " ".join(map(str, cpu + [0, 0]))] + [f"cpu{i} 0 0 0 0 0 0 0 0 0 0" for i in range(cpus)]
    (root / "stat").write_text("\n".join(lines) + "\nintr 1\n")
    for d in root.iterdir():
        if d.is_dir() and int(d.name) not in procs:
            (d / "stat").unlink()
            d.rmdir()
    for pid, (ppid, ticks) in procs.items():
        (root / str(pid)).mkdir(exist_ok=True)
        u, s, cu = ticks // 2, ticks // 4, ticks // 8
        (root / str(pid) / "stat").write_text(
            f"{pid} (py (thon) x) S {ppid} 1 1 0 -1 0 0 0 0 0 {u} {s} {cu} {ticks - u - s - cu} 20 0 4 0\n")


def test_others_are_the_machines_busy_time_less_this_process_tree(tmp_path):
    """Between two reads: the machine's busy ticks rose by 300 of a total 400 (2 CPUs); this tree (pid 10, its
    engine child 11 and the worker 12 that 11 reaped, whose ticks moved into 11's cutime) took 200, another job (pid
    20) the other 100: others 25%. 40 ticks stolen: 10%. An unrelated process's ticks never count as the tree's."""
    proc = tmp_path / "proc"
    _fake_proc(proc, [1000, 0, 200, 5000, 0, 0, 0, 10], {1: (0, 50), 10: (1, 100), 11: (10, 300), 12: (11, 40),
                                                          20: (1, 500)})
    before = machine_load.snapshot(10, proc)
    assert before == {"cpu": [1200, 10, 6210], "cpus": 2, "own": 440}
    # 300 busy: user +250, system +50; idle +60; steal +40. The tree: 10 +20, 11 +140 and 12's 40 reaped into it,
    # 12 gone; 20 +100; a new child of 10, pid 13, +40
    _fake_proc(proc, [1250, 0, 250, 5060, 0, 0, 0, 50], {1: (0, 50), 10: (1, 120), 11: (10, 480), 13: (10, 40),
                                                         20: (1, 600)})
    w = machine_load.between(before, machine_load.snapshot(10, proc))
    assert w["others"] == pytest.approx(100 / 400) and w["steal"] == pytest.approx(40 / 400) and w["cpus"] == 2
    assert machine_load.contention(w) == pytest.approx(0.35)
    assert machine_load.busy_text(w) == ("other processes took 35% of the machine's CPU (0.7 of 2 cores), 10% of it "
                                         "stolen by the hypervisor")
    assert machine_load.tree_ticks(20, proc) == 600 and machine_load.tree_ticks(99, proc) is None
    assert machine_load.busy_text({"others": 0.1, "steal": 0.0, "cpus": 2}) is None  # at the limit: quiet
    unreadable = machine_load.snapshot(10, tmp_path / "no-proc")
    assert machine_load.between(unreadable, unreadable)["others"] is None


# a process that, told to, forks a child that spins for 1 s, reaps it and says the CPU seconds it got
BURN_ONCE = """import os, sys, time
print("up", flush=True)
sys.stdin.readline()
pid = os.fork()
if pid == 0:
    t = time.time()
    while time.time() - t < 1:
        pass
    os._exit(0)
_, _, usage = os.wait4(pid, 0)
print(usage.ru_utime + usage.ru_stime, flush=True)
sys.stdin.readline()
"""


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux /proc")
def test_a_process_burning_cpu_is_ours_in_our_tree_and_others_outside_it():
    """A real window: a process forks a child that spins for ~1 s and reaps it. Measured from that process's tree
    the child's CPU is the tree's own (in its parent's cutime once reaped); measured from a sleeping process's tree
    (which it is not in) the same window's others hold it. The two readings differ by the child's CPU time, as much
    as the kernel gave it on a busy machine (its rusage). (The trees are processes of their own: pytest's tree
    holds whatever else the suite started, a zygote importing vLLM in the background.)"""
    def started(code: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline() == "up\n"  # its start before the window, not in it
        return p

    sleeper = started("import time; print('up', flush=True); time.sleep(30)")
    burner = started(BURN_ONCE)
    try:
        before = machine_load.snapshot(burner.pid), machine_load.snapshot(sleeper.pid)
        burner.stdin.write("\n")
        burner.stdin.flush()
        seconds = float(burner.stdout.readline())
        after = machine_load.snapshot(burner.pid), machine_load.snapshot(sleeper.pid)
    finally:
        for p in (burner, sleeper):
            p.kill()
            p.communicate()
    ticks = seconds * os.sysconf("SC_CLK_TCK")
    assert ticks > 10  # it ran: 0.1 s of CPU at least, whatever the machine's load
    ours = after[0]["own"] - before[0]["own"]
    assert ticks - 2 <= ours <= ticks + 3  # the reaped child, in its parent's cutime (+ the parent's few reads)
    total = after[0]["cpu"][2] - before[0]["cpu"][2]
    own_view, sleeper_view = machine_load.between(before[0], after[0]), machine_load.between(before[1], after[1])
    assert (sleeper_view["others"] - own_view["others"]) * total == pytest.approx(ticks, abs=0.1 * ticks + 4)


def test_each_arm_is_timed_in_passes_enough_for_a_verdict(monkeypatch):
    """An arm times passes until MIN_TIMED_S in all and at least `at_least` passes (the spread the verdict needs):
    5 s passes take 3 (not the 2 that reach 8 s); the speculative arm, given plain decoding's count, takes as many."""
    from spectool.commands import rollout

    timed = []

    def one_pass(*a, **kw):
        timed.append(1)
        return [], None, 100, 5.0

    monkeypatch.setattr(rollout, "rollout_tasks", one_pass)
    cfg = rollout.RolloutConfig(compare=True)
    assert rollout.timed_passes(None, None, None, [], cfg, [100, 5.0], MIN_PASSES) == [[100, 5.0]] * 3
    assert len(rollout.timed_passes(None, None, None, [], cfg, [100, 1.0], 5)) == 5  # plain decoding's 5 passes
    assert len(rollout.timed_passes(None, None, None, [], cfg, [100, 20.0], 1)) == 1  # one pass of 20 s: enough

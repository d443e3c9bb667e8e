"""The suite's cost accounting: tiers, cost markers checked against what each test starts, and every
run's durations held against a budget. The rule is docs/architecture.md, "Tests"; the numbers are
tests/budget.toml.

- Tiers. `--tier fast` (the default, `bash scripts/test.sh`) leaves out tests marked `e2e` or `multiproc`
  unless they are also marked `fast` (a command's headline proof); `--tier full` runs everything. A test
  named by its id (path::name) always runs. A whole fast run refuses a test file left with no test.
- Markers are checked, not trusted. An engine started in pytest's own process needs `engine` (or `e2e`),
  one started in a child (a CLI run, an arm, a rank) needs `e2e` or `multiproc`, a launcher (torchrun,
  accelerate launch) needs `multiproc`. Engines are counted through $SPECTOOL_ENGINE_START_LOG
  (spectool.engine.engine writes a line per start, in any process), launchers by the Popen they run.
- Budget. A whole tier run fails past its total. A test is held to its kind's limit (its setup and its
  teardown, less the shared fixtures it built or finalised, plus its call; engine starts it makes itself):
  past it the run names the test, and past `tolerance` x the limit the run fails. An allow-listed test
  (budget.toml [allow]: its measured seconds) fails past `margin` x its record (1.2 at most). A shared
  fixture (its setup and its finaliser) is held to the e2e limit. Limits scale with the host: a fixed
  micro-benchmark's CPU time (pure Python and one-thread torch, `host_benchmark`) timed as the run starts,
  against the reference host's (budget.toml [host]), never below 1 nor above its cap. CPU time, not wall
  time: waiting for a CPU other processes hold is load, not a slower host, and loosens no limit. Never the
  tests under judgment: a change that slows every CLI start is no slower host.
- Warm-up. Once the tests are collected and before any is timed, `pytest_costs_warm_up` (tests/conftest.py
  implements it) pays what only a first run pays (imports, caches kept between runs): its seconds count in
  the tier's total, in no test's. A run of a few tests warms up only what they use.
- Every run writes .pytest-costs/<tier>.json (per test: kind, seconds per phase, engine starts; per
  shared fixture; per file) and prints per-file totals.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest
import tomllib  # Python 3.11+: the suite runs on 3.11 (CPU) and 3.12 (the GPU machine)

ENGINE_START_LOG = "SPECTOOL_ENGINE_START_LOG"  # spectool.engine.engine's name for it (not imported: no torch here)
TIER_MARKS = ("e2e", "multiproc")
LAUNCHERS = ("torchrun", "torch.distributed.run", "deepspeed", "accelerate.commands.launch")
SHARED_SCOPES = ("session", "package", "module", "class")


@dataclass
class Spent:
    file: str
    kind: str  # unit | engine | e2e | multiproc: what its markers say it costs
    setup_s: float = 0.0  # less the shared fixtures this test's setup built
    call_s: float = 0.0
    teardown_s: float = 0.0
    shared_fixture_s: float = 0.0
    engines_here: int = 0  # engine starts in pytest's process (shared fixtures it built included)
    engines_children: int = 0  # in child processes: CLI runs, arms, ranks
    own_engines: int = 0  # started by the test itself, not by a shared fixture
    launchers: int = 0
    bf16: bool = False  # marked bf16: computes in bfloat16 (slower on a CPU without AVX512-BF16 or AMX)
    outcome: str = "passed"

    def count(self, here: int, children: int, own: bool = True) -> None:
        """Engine starts seen during this test (own: started by it, not by a shared fixture it built)."""
        self.engines_here += here
        self.engines_children += children
        self.own_engines += (here + children) if own else 0

    shared_teardown_s: float = 0.0  # shared fixtures finalised in this test's teardown (theirs, not its)

    @property
    def seconds(self) -> float:  # what the per-test rule reads
        return self.setup_s + self.call_s + self.teardown_s


@dataclass
class FixtureCost:
    file: str
    seconds: float = 0.0  # setup + teardown: what the rule reads
    engines: int = 0
    setup_s: float = 0.0
    teardown_s: float = 0.0  # its finaliser (the code after its yield, addfinalizer's)


@dataclass
class Host:
    """How much slower this machine is than the reference host, from `host_benchmark` (1 without a record)."""
    ratio: float = 1.0
    measured_s: float | None = None  # CPU seconds, best of the repeats, this run
    record_s: float | None = None  # budget.toml [host] benchmark_s
    wall_s: float | None = None  # the same repeat's wall time: above the CPU time, other processes held the CPU
    cap: float | None = None  # budget.toml [host] cap: the most the ratio may be

    @classmethod
    def read(cls, cpu_s: float, wall_s: float, record_s: float, cap: float | None) -> Host:
        """The ratio measured / record, never below 1 nor above `cap`."""
        ratio = max(1.0, cpu_s / record_s)
        return cls(min(ratio, cap) if cap else ratio, cpu_s, record_s, wall_s, cap)

    def describe(self) -> str:
        if self.measured_s is None:
            return "host: no [host] record in the budget, limits not scaled"
        text = (f"host: micro-benchmark (pure Python + torch on 1 CPU thread, CPU time, best of {HOST_REPEATS}) "
                f"{self.measured_s:.3g} s against {self.record_s:.3g} s on the reference host: limits x {self.ratio:.2f}")
        if self.cap and self.measured_s / self.record_s > self.cap:
            text += (f", capped (it read x {self.measured_s / self.record_s:.2f}: a machine that busy, or that slow, is "
                     "not one the budget plans for)")
        if self.wall_s is not None and self.wall_s > BUSY_WALL * self.measured_s:
            text += (f"; the machine was busy as the run began (the benchmark's wall time {self.wall_s:.3g} s): waiting "
                     "for the CPU loosens no limit")
        return text


BUSY_WALL = 1.5  # a benchmark whose wall time passes its CPU time this much waited for the CPU: the machine is busy
BUSY_SHARE = 0.25  # other processes' share of the machine's CPU over a run past which the report says so


def cpu_now() -> tuple[float, float, float] | None:
    """(wall clock, the machine's busy CPU seconds, this process's and its reaped children's CPU seconds), or None
    where /proc/stat is not there. Between two readings: what other processes took of the CPU."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0) + (ticks[7] if len(ticks) > 7 else 0)  # idle, iowait, steal
    busy = (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    own = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    return time.time(), busy, own


def others_share(before, after) -> float | None:
    """Other processes' share of the machine's CPU between two `cpu_now` readings (a child not yet reaped counts
    as another's: an upper bound)."""
    if before is None or after is None or after[0] - before[0] <= 0:
        return None
    others = (after[1] - before[1]) - (after[2] - before[2])
    return max(0.0, others) / ((after[0] - before[0]) * (os.cpu_count() or 1))


@dataclass
class Costs:
    tier: str
    budget_file: Path
    engine_log: Path
    whole_run: bool = False
    t0: float = field(default_factory=time.time)
    tests: dict[str, Spent] = field(default_factory=dict)
    fixtures: dict[str, FixtureCost] = field(default_factory=dict)
    current: str | None = None
    host: Host = field(default_factory=Host)
    cpu_at_start: tuple | None = field(default_factory=lambda: cpu_now())
    warm_up_s: float = 0.0  # pytest_costs_warm_up, before any test
    fixture_depth: int = 0
    finishing: dict[int, float] = field(default_factory=dict)  # id(fixturedef) -> when its finaliser began
    log_offset: int = 0
    launched: int = 0  # launchers run by the current test
    report: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # over a limit within its tolerance; allow entries not needed

    def drain(self) -> tuple[int, int]:
        """Engine starts logged since the last look: (in this process, in children)."""
        if not self.engine_log.exists():
            return 0, 0
        with open(self.engine_log) as f:
            f.seek(self.log_offset)
            lines = f.read().splitlines()
            self.log_offset = f.tell()
        here = sum(1 for pid in lines if pid.strip() == str(os.getpid()))
        return here, len(lines) - here


class WarmUpSpec:
    @pytest.hookspec
    def pytest_costs_warm_up(self, config, items, whole_run):
        """Pay what only a first run pays (heavy imports, caches kept between runs) before any test is timed: its
        seconds count in the tier's total, in no test's. `items`: the tests about to run (a run of a few may need
        less); `whole_run`: the tier as a whole."""


def pytest_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(WarmUpSpec)


def pytest_addoption(parser):
    group = parser.getgroup("spectool costs")
    group.addoption("--tier", choices=("fast", "full"), default=os.environ.get("SPECTOOL_TEST_TIER", "fast"),
                    help="fast: leave out e2e/multiproc tests not marked fast (default); full: everything")
    group.addoption("--budget-file", default=None, help="the budget (default: tests/budget.toml)")
    group.addoption("--test-budget-s", type=float, default=None,
                    help="this run's total budget in seconds, in place of budget.toml's (shows the check bite)")


def pytest_configure(config):
    budget_file = Path(config.getoption("--budget-file") or config.rootpath / "tests" / "budget.toml")
    folder = config.rootpath / ".pytest-costs"
    folder.mkdir(exist_ok=True)
    costs = Costs(tier=config.getoption("--tier"), budget_file=budget_file,
                  engine_log=folder / f"engines-{os.getpid()}-{id(config)}.log")
    config.pluginmanager.register(CostsPlugin(config, costs), "spectool-costs")


def _counting_popen(costs: Costs, base: type) -> type:
    class CountingPopen(base):  # subprocess.run looks Popen up at call time, so this counts its launches
        def __init__(self, args, *a, **kw):
            words = [os.path.basename(str(w)) for w in ([args] if isinstance(args, (str, bytes)) else args)]
            if any(w in LAUNCHERS for w in words) or ("accelerate" in words and "launch" in words):
                costs.launched += 1
            super().__init__(args, *a, **kw)

    CountingPopen.uncounted = base  # a run inside a run counts its own launches only
    return CountingPopen


def _is_named(item, config) -> bool:
    """Named by its id on the command line (path::name): always run, whatever the tier."""
    for arg in config.args:
        if "::" not in arg:
            continue
        path, _, rest = arg.partition("::")
        try:
            rel = Path(path).resolve().relative_to(config.rootpath).as_posix()
        except ValueError:
            continue
        want = f"{rel}::{rest}"
        if item.nodeid == want or item.nodeid.startswith((want + "[", want + "::")):
            return True
    return False


def _whole_run(config) -> bool:
    """The tier as a whole: no -k/-m selection, no paths but the test folder."""
    if config.getoption("keyword") or config.getoption("markexpr") or config.getoption("lf", False):
        return False
    tests = config.rootpath / "tests"
    return all(Path(a).resolve() in (tests, config.rootpath) for a in config.args)


def kind_of(item) -> str:
    for mark in ("multiproc", "e2e", "engine"):
        if item.get_closest_marker(mark):
            return mark
    return "unit"


class CostsPlugin:
    """One per pytest run (a run inside a run, as tests/test_costs.py makes, has its own)."""

    def __init__(self, config, costs: Costs):
        self.config, self.costs = config, costs
        self.finalised_in_setup = 0.0  # the current test's shared finalisers that ran in its setup
        costs.engine_log.write_text("")
        self.saved_env = os.environ.get(ENGINE_START_LOG)
        os.environ[ENGINE_START_LOG] = str(costs.engine_log)  # children inherit it
        self.saved_popen = subprocess.Popen
        subprocess.Popen = _counting_popen(costs, getattr(subprocess.Popen, "uncounted", subprocess.Popen))

    def pytest_unconfigure(self, config):
        subprocess.Popen = self.saved_popen
        if self.saved_env is None:
            os.environ.pop(ENGINE_START_LOG, None)
        else:
            os.environ[ENGINE_START_LOG] = self.saved_env
        self.costs.engine_log.unlink(missing_ok=True)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        costs = self.costs
        costs.whole_run = _whole_run(config)
        if costs.tier == "full":
            return
        keep, drop = [], []
        for item in items:
            costly = any(item.get_closest_marker(m) for m in TIER_MARKS)
            named = _is_named(item, config)
            (drop if costly and not item.get_closest_marker("fast") and not named else keep).append(item)
        bare = sorted({i.path.name for i in items} - {i.path.name for i in keep})
        if costs.whole_run and bare:
            raise pytest.UsageError(f"the fast tier must touch every test file; none of these keeps a test in it: {bare}. "
                                    "Mark one test in each `fast` (or make one cheaper).")
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_sessionstart(self, session):
        if self.config.option.collectonly:
            return
        host = tomllib.loads(self.costs.budget_file.read_text()).get("host", {})
        if "benchmark_s" in host:  # timed first, before the warm-up and any test: the machine, not the suite
            self.costs.host = Host.read(*host_benchmark(), host["benchmark_s"], host.get("cap"))

    def pytest_collection_finish(self, session):
        """The warm-up, once the tests to run are known (after the tier's selection), before the first is timed."""
        if self.config.option.collectonly or not session.items:
            return
        t = time.perf_counter()
        self.config.hook.pytest_costs_warm_up(config=self.config, items=session.items, whole_run=self.costs.whole_run)
        self.costs.warm_up_s = time.perf_counter() - t

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        costs = self.costs
        costs.current = item.nodeid
        costs.tests[item.nodeid] = Spent(file=item.path.name, kind=kind_of(item), bf16=bool(item.get_closest_marker("bf16")))
        costs.launched = 0
        costs.drain()  # anything before this test (another's late teardown) is not this test's

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        costs = self.costs
        if fixturedef.scope not in SHARED_SCOPES or costs.current not in costs.tests:
            yield
            return
        test = costs.tests[costs.current]
        if costs.fixture_depth == 0:  # what the test's setup started before this fixture is the test's own
            test.count(*costs.drain())
        costs.fixture_depth += 1
        t = time.perf_counter()
        try:
            outcome = yield
            if outcome.excinfo is None:  # finalisers run last-in first-out: this one runs first, before its own
                fixturedef.addfinalizer(lambda: costs.finishing.__setitem__(id(fixturedef), time.perf_counter()))
        finally:
            seconds = time.perf_counter() - t
            costs.fixture_depth -= 1
            name = f"{fixturedef.argname} ({fixturedef.scope}) {fixturedef.baseid or 'pytest'}"
            if seconds >= 0.01 or name in costs.fixtures:  # pytest's own (tmp_path_factory...) cost nothing
                fc = costs.fixtures.setdefault(name, FixtureCost(file=test.file))  # the file whose test built it
                fc.seconds += seconds
                fc.setup_s += seconds
            else:
                fc = FixtureCost(file=test.file)
            if costs.fixture_depth == 0:
                test.shared_fixture_s += seconds
                here, children = costs.drain()
                fc.engines += here + children
                test.count(here, children, own=False)  # the test that builds it asks for what it starts: its marker says so

    def pytest_fixture_post_finalizer(self, fixturedef, request):
        """A shared fixture's finaliser: the fixture's cost (as its setup is), not the test whose teardown ran it."""
        costs = self.costs
        began = costs.finishing.pop(id(fixturedef), None)
        if began is None:
            return
        seconds = time.perf_counter() - began
        test = costs.tests.get(costs.current)
        name = f"{fixturedef.argname} ({fixturedef.scope}) {fixturedef.baseid or 'pytest'}"
        if seconds >= 0.01 or name in costs.fixtures:
            fc = costs.fixtures.setdefault(name, FixtureCost(file=test.file if test else ""))
            fc.seconds += seconds
            fc.teardown_s += seconds
        if test is not None:
            test.shared_teardown_s += seconds

    def pytest_runtest_logreport(self, report):
        costs = self.costs
        test = costs.tests.get(report.nodeid)
        if test is None:
            return
        test.count(*costs.drain())
        if report.when == "setup":  # a shared fixture finalised here (a new parameter replaces it) is not its setup
            test.setup_s = max(0.0, report.duration - test.shared_fixture_s - test.shared_teardown_s)
            self.finalised_in_setup = test.shared_teardown_s
        elif report.when == "call":
            test.call_s = report.duration
            test.launchers = costs.launched
        else:
            test.teardown_s = max(0.0, report.duration - (test.shared_teardown_s - self.finalised_in_setup))
        if report.failed:
            test.outcome = "failed"
        elif report.skipped and test.outcome == "passed":
            test.outcome = "skipped"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        costs, config = self.costs, self.config
        if config.option.collectonly:
            return
        costs.drain()  # session fixtures' late starts: nobody's test
        total = time.time() - costs.t0
        budget = tomllib.loads(costs.budget_file.read_text())
        # the tier's total scales with the host as each test's limit does (the fixed micro-benchmark, never the tests)
        whole_total = config.getoption("--test-budget-s") or budget["budget"][f"{costs.tier}_s"] * costs.host.ratio
        problems = [v for n, t in costs.tests.items() for v in marker_violations(n, t)]
        over, costs.notes = over_limits(costs, budget)
        problems += over
        others = others_share(costs.cpu_at_start, cpu_now())
        if costs.whole_run and total > whole_total:
            problems.append(f"the {costs.tier} tier took {total / 60:.1f} min, over its budget of {whole_total / 60:.1f} min")
        out = config.rootpath / ".pytest-costs" / f"{costs.tier}.json"
        out.write_text(json.dumps({
            "tier": costs.tier, "whole_run": costs.whole_run, "total_s": round(total, 1), "budget_s": whole_total,
            "host_ratio": round(costs.host.ratio, 3), "host_benchmark_s": costs.host.measured_s,
            "host_record_s": costs.host.record_s, "host_benchmark_wall_s": costs.host.wall_s,
            "warm_up_s": round(costs.warm_up_s, 1), "others_cpu_share": None if others is None else round(others, 3),
            "python": sys.version.split()[0], "problems": problems, "notes": costs.notes,
            "files": {k: round(v, 1) for k, v in per_file(costs).items()},
            "tests": {n: asdict(t) | {"seconds": round(t.seconds, 2)} for n, t in costs.tests.items()},
            "fixtures": {n: asdict(f) for n, f in costs.fixtures.items()},
        }, indent=1))
        held = "" if costs.whole_run else ", not a whole run: the total is not held to it"
        scaled = f", {budget['budget'][f'{costs.tier}_s'] / 60:.0f} min x host {costs.host.ratio:.2f}" \
            if round(costs.host.ratio, 2) > 1 and not config.getoption("--test-budget-s") else ""
        costs.report = [f"durations: {out.relative_to(config.rootpath)} ({costs.tier} tier, {total / 60:.1f} min"
                        f" of a {whole_total / 60:.1f}-min budget{scaled}{held})", costs.host.describe(),
                        f"warm-up: {costs.warm_up_s:.1f} s before the first test (what a first run pays once: "
                        "tests/conftest.py), in the total, in no test's"]
        if others is not None and others > BUSY_SHARE:
            costs.report.append(f"other processes took {others:.0%} of the machine's CPU during the run: the tests' "
                                "times measure that load as well (no limit is loosened for it); judge them on a run alone")
        costs.problems = problems
        if problems and session.exitstatus in (0, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        costs, tr = self.costs, terminalreporter
        if not costs.report:
            return
        tr.section("seconds per test file (setup, call, teardown and the shared fixtures it built or finalised)")
        for name, s in per_file(costs).items():
            tr.write_line(f"{s:8.1f}  {name}")
        for line in costs.report:
            tr.write_line(line)
        if costs.notes:
            tr.section("test budget: over a limit, within its tolerance (make it cheaper, or record it)", yellow=True)
            for n in costs.notes:
                tr.write_line(n, yellow=True)
        if costs.problems:
            tr.section("test budget: FAILED", red=True)
            for p in costs.problems:
                tr.write_line(p, red=True)
            tr.write_line('The rule and its numbers: docs/architecture.md "Tests", tests/budget.toml.')


def marker_violations(name: str, t: Spent) -> list[str]:
    """What a test starts against what its markers say (marked more than it costs is no error)."""
    out = []
    if t.engines_here and t.kind == "unit":
        out.append(f"{name}: starts {t.engines_here} engine(s) in pytest's process: mark it engine")
    if t.engines_children and t.kind in ("unit", "engine"):
        out.append(f"{name}: starts {t.engines_children} engine(s) in child processes: mark it e2e")
    if t.launchers and t.kind != "multiproc":
        out.append(f"{name}: runs {t.launchers} launcher(s) (torchrun, accelerate launch): mark it multiproc")
    return out


HOST_REPEATS = 5


def host_benchmark(repeats: int = HOST_REPEATS) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of a fixed piece of work, the repeat of least CPU time: pure Python (integer
    arithmetic, a dict, a sort) and small torch ops on one thread, as the unit tests compute (0.056-0.058 s a repeat
    on the reference host; the whole call, torch's import aside, 0.55-0.61 s). CPU time: a process waiting for a CPU
    other processes hold spends no CPU time, so waiting does not read as a slower host (three busy processes on its
    CPU: its wall time several-fold, its CPU time at most half as much, tests/test_costs.py); others' use of the
    caches and memory still does, some (1.9x measured on a shared VM; budget.toml [host] cap). Fixed work: no test,
    no spectool code, so a slower suite never reads as a slower host."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(192, 192, generator=g), torch.randn(192, 192, generator=g)
        x = torch.randn(64, 256, generator=g)
        best, wall = float("inf"), float("inf")
        for i in range(repeats + 1):  # the first pass warms the allocator and the kernels up: not counted
            cpu0, t = time.process_time(), time.perf_counter()
            acc, table = 0, {}
            for j in range(300_000):
                acc = (acc * 31 + j) % 1_000_003
                table[j % 997] = acc
            sorted(table.values())
            for _ in range(200):
                c = a @ b
                y = torch.log_softmax(x @ x.T, -1).exp().sum() + c.tanh().mean()
            float(y)
            cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - t
            if i and cpu_s < best:
                best, wall = cpu_s, wall_s
        return best, wall
    finally:
        torch.set_num_threads(threads)


def bf16_native() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX): elsewhere bfloat16 runs several times slower
    than float32 (ENVIRONMENT.md), and a test marked bf16 gets `bf16_slowdown` x its limit. SPECTOOL_TEST_BF16_NATIVE
    (0/1) overrides the reading."""
    if os.environ.get("SPECTOOL_TEST_BF16_NATIVE") in ("0", "1"):
        return os.environ["SPECTOOL_TEST_BF16_NATIVE"] == "1"
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return True
    return bool(flags & {"avx512_bf16", "amx_bf16"})


MAX_MARGIN = 1.2  # an [allow] record is the test's measured seconds: it fails past this much of it at most


def over_limits(costs: Costs, budget: dict) -> tuple[list[str], list[str]]:
    """(what fails the run, notes): a test past `tolerance` x its kind's limit, or past `margin` x its [allow] record,
    or starting more engines than allowed, fails; one past its kind's limit but within the tolerance is a note, as is
    an [allow] entry the test no longer needs."""
    limits, allow = budget["limits"], budget.get("allow", {})
    margin, tolerance = budget["budget"]["margin"], budget["budget"].get("tolerance", 1.0)
    slow_bf16 = 1.0 if bf16_native() else limits.get("bf16_slowdown", 1.0)
    ran = {n: t for n, t in costs.tests.items() if t.outcome != "skipped"}
    seconds = {n: t.seconds for n, t in ran.items()} | {f"fixture: {n}": f.seconds for n, f in costs.fixtures.items()}
    ratio = costs.host.ratio
    host = f" x host {ratio:.2f}" if ratio > 1 else ""
    out, notes = [], []
    if margin > MAX_MARGIN:
        out.append(f"budget.toml: margin {margin:g} over {MAX_MARGIN}: a record is the test's measured seconds, and "
                   f"more than {MAX_MARGIN:g} x it hides a slowdown")
    for name, s in seconds.items():
        t = ran.get(name)
        kind = t.kind if t else "e2e"
        kind = "e2e" if kind == "multiproc" else kind
        bf16 = slow_bf16 if t is not None and t.bf16 else 1.0
        said = f" x {bf16:g} (bfloat16 on a CPU without AVX512-BF16 or AMX)" if bf16 > 1 else ""
        most = allow.get(name, {}).get("engines", limits.get(f"engines_{kind}"))
        if name in allow:
            record = allow[name]["seconds"]
            if s > margin * record * ratio * bf16:
                out.append(f"{name}: {s:.1f} s, over its record {record:g} s x {margin:g}{said}{host}")
            if record <= limits[kind] and "engines" not in allow[name]:
                notes.append(f"{name}: allow-listed at {record:g} s, within the {kind} limit {limits[kind]:g} s: "
                             "remove its entry")
        elif s > tolerance * limits[kind] * ratio * bf16:
            out.append(f"{name}: {s:.1f} s, over the {kind} limit {limits[kind]:g} s x tolerance {tolerance:g}{said}{host}")
        elif s > limits[kind] * ratio * bf16:
            notes.append(f"{name}: {s:.1f} s, over the {kind} limit {limits[kind]:g} s{said}{host} (fails past "
                         f"x {tolerance:g})")
        if t is not None and kind in ("engine", "e2e") and t.own_engines > most:
            out.append(f"{name}: starts {t.own_engines} engines itself, over {most} (share a fixture, or allow-list it)")
    return out, notes


def per_file(costs: Costs) -> dict[str, float]:
    files: dict[str, float] = {}
    for t in costs.tests.values():
        files[t.file] = files.get(t.file, 0.0) + t.setup_s + t.call_s + t.teardown_s
    for f in costs.fixtures.values():
        files[f.file] = files.get(f.file, 0.0) + f.seconds
    return dict(sorted(files.items(), key=lambda kv: -kv[1]))


def allow_entries(record: dict, budget: dict) -> str:
    """budget.toml [allow] entries for the tests and shared fixtures of a run's JSON over their kind's limit: each
    records its measured seconds (a limit is `margin` x the record; the reason says what it starts, to be read and
    edited by hand)."""
    limits, out = budget["limits"], []
    for name, t in record["tests"].items():
        kind = "e2e" if t["kind"] == "multiproc" else t["kind"]
        most = limits.get(f"engines_{kind}")
        if t["outcome"] == "skipped" or (t["seconds"] <= limits[kind] and (most is None or t["own_engines"] <= most)):
            continue
        what = f"{t['own_engines']} engine starts" + (f", {t['launchers']} launches" if t["launchers"] else "")
        engines = f"engines = {t['own_engines']}\n" if most is not None and t["own_engines"] > most else ""
        out.append(f'[allow."{name}"]\nseconds = {round(t["seconds"], 1):g}\n{engines}reason = "{t["kind"]}: {what}"\n')
    for name, f in record["fixtures"].items():
        if f["seconds"] > limits["e2e"]:
            out.append(f'[allow."fixture: {name}"]\nseconds = {round(f["seconds"], 1):g}\n'
                       f'reason = "shared fixture: {f["engines"]} engine starts"\n')
    return "\n".join(out)


if __name__ == "__main__":  # python tests/costs.py .pytest-costs/full.json: allow entries for what ran over
    root = Path(__file__).resolve().parent
    print(allow_entries(json.loads(Path(sys.argv[1]).read_text()), tomllib.loads((root / "budget.toml").read_text())))

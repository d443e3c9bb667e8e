"""benchmarks/mutation.py stays runnable and honest: every mutant still names source text that is in its file exactly
once (a refactor that moves it must rewrite the mutant, not leave the score counting a mutant that no longer applies);
main() runs the tests in a scratch copy of the working tree whose own code is what they import (a mutant in the copy
is seen, the working tree is never written, the copy is gone after); and a test that fails without the mutant kills
nothing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mutation():
    spec = importlib.util.spec_from_file_location("mutation", ROOT / "benchmarks" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutation"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_mutant_applies_to_the_source_as_it_is():
    m = _mutation()
    assert len(m.MUTANTS) == 19 and len(m.NEW_MUTANTS) >= 20  # the audit's, and issue 68's of the 11-27/28 code
    assert len({x.id for x in m.ALL}) == len(m.ALL) == len(m.MUTANTS) + len(m.NEW_MUTANTS)
    assert m.stale(m.ALL) == []
    assert all((ROOT / f.split("::")[0]).exists() for x in m.ALL for f in x.tests)  # a file, or one test in it
    assert all(x.old != x.new for x in m.ALL)


def test_a_mutant_is_applied_to_a_copy_and_the_copy_restored(tmp_path, monkeypatch):
    m = _mutation()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.py").write_text("x = 1 + 1\n")
    seen = []

    def run_tests(where, files):  # a test that fails on the mutant only
        seen.append(((where / "src/f.py").read_text(), files))
        return (["t::a"], "1 failed", 0.1) if "1 - 1" in seen[-1][0] else ([], "1 passed", 0.1)

    monkeypatch.setattr(m, "run_tests", run_tests)
    row = m.run(m.Mutant("Z", "src/f.py", "1 + 1", "1 - 1", ("tests",), "sign"), tmp_path, ("tests",))
    assert seen == [("x = 1 - 1\n", ("tests",)), ("x = 1 + 1\n", ("t::a",))]  # the killer rerun on the restored code
    assert row["killed_by"] == "t::a" and row["where"] == "src/f.py:1" and "fails_unmutated" not in row
    assert (tmp_path / "src" / "f.py").read_text() == "x = 1 + 1\n"
    assert m.stale((m.Mutant("Z", "src/f.py", "2 + 2", "", (), ""),), tmp_path) == ["Z: src/f.py has its text 0 times"]
    monkeypatch.setattr(m, "run_tests", lambda where, files: (["t::b"], "1 failed", 0.1))  # fails either way
    row = m.run(m.Mutant("Z", "src/f.py", "1 + 1", "1 - 1", ("tests",), "sign"), tmp_path, ("tests",))
    assert row["killed_by"] is None and row["fails_unmutated"] == "t::b"
    results = iter([(["t::c[a b]"], "1 failed", 0.1), ([], "no tests ran", 0.1)])  # its id not found on the rerun
    monkeypatch.setattr(m, "run_tests", lambda where, files: next(results))
    row = m.run(m.Mutant("Z", "src/f.py", "1 + 1", "1 - 1", ("tests",), "sign"), tmp_path, ("tests",))
    assert row["killed_by"] is None and row["fails_unmutated"] == "t::c[a b]"


PROBE = '''import os
from pathlib import Path

import probe


def test_probe():
    Path(os.environ["PROBE_SEEN"]).write_text(f"{os.getcwd()}\\n{probe.__file__}\\n")
    assert not probe.MUTATED
'''


def test_main_runs_the_copys_own_code_and_never_writes_the_working_tree(tmp_path, monkeypatch, capsys):
    """A stand-in project (git-tracked src/probe.py and its test, plus an untracked data file the test needs): the
    mutant flips a flag in the copy's src/probe.py and its test sees it, so the copy's code, not an installed one,
    was imported; the test ran in the copy, the project's files are unchanged, and the copy is removed."""
    m = _mutation()
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "tests").mkdir()
    (project / "src" / "probe.py").write_text("MUTATED = False\n")
    (project / "tests" / "test_probe.py").write_text(PROBE)
    (project / "conftest.py").write_text("def pytest_addoption(parser):\n    parser.addoption('--tier')\n")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "add", "src", "tests"], cwd=project, check=True)  # conftest.py untracked: copied as well
    before = {p: p.read_text() for p in project.rglob("*") if p.is_file() and ".git" not in p.parts}
    made = []
    scratch = m.scratch_copy
    monkeypatch.setattr(m, "scratch_copy", lambda: made.append(scratch()) or made[-1])
    monkeypatch.setattr(m, "ROOT", project)
    monkeypatch.setattr(m, "ALL", (m.Mutant("Z", "src/probe.py", "MUTATED = False", "MUTATED = True",
                                            ("tests/test_probe.py",), "the flag"),))
    monkeypatch.setenv("PROBE_SEEN", str(tmp_path / "seen"))
    out = tmp_path / "score.json"
    assert m.main(["--out", str(out)]) == 0
    assert "mutation score: 1/1 killed" in capsys.readouterr().out
    cwd, imported = (tmp_path / "seen").read_text().splitlines()  # the rerun on the restored copy wrote it last
    assert Path(cwd) == made[0] != project and Path(imported) == made[0] / "src" / "probe.py"
    assert not made[0].exists()
    assert {p: p.read_text() for p in project.rglob("*") if p.is_file() and ".git" not in p.parts} == before
    assert '"killed_by": "tests/test_probe.py::test_probe"' in out.read_text()

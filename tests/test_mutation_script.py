"""benchmarks/mutation.py stays runnable: every one of the audit's mutants still names source text that is in its file
exactly once (a refactor that moves it must rewrite the mutant, not leave the score counting a mutant that no longer
applies), and applying one writes the scratch copy, never the working tree."""

from __future__ import annotations

import importlib.util
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
    assert len(m.MUTANTS) == 19 and len({x.id for x in m.MUTANTS}) == 19
    assert m.stale(m.MUTANTS) == []
    assert all((ROOT / f).exists() for x in m.MUTANTS for f in x.tests)


def test_a_mutant_is_applied_to_a_copy_and_the_copy_restored(tmp_path, monkeypatch):
    m = _mutation()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.py").write_text("x = 1 + 1\n")
    seen = []
    monkeypatch.setattr(m, "run_tests", lambda where, files: (seen.append((where / "src/f.py").read_text()) or
                                                              (["t::a"], "1 failed", 0.1)))
    row = m.run(m.Mutant("Z", "src/f.py", "1 + 1", "1 - 1", ("tests",), "sign"), tmp_path, ("tests",))
    assert seen == ["x = 1 - 1\n"] and row["killed_by"] == "t::a" and row["where"] == "src/f.py:1"
    assert (tmp_path / "src" / "f.py").read_text() == "x = 1 + 1\n"
    assert m.stale((m.Mutant("Z", "src/f.py", "2 + 2", "", (), ""),), tmp_path) == ["Z: src/f.py has its text 0 times"]

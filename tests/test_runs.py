"""Run folders: the one atomic-folder helper."""

from __future__ import annotations

import pytest

from spectool.runs import atomic_dir


def test_atomic_dir_replaces_only_on_success_and_leaves_nothing_half_written(tmp_path):
    dest = tmp_path / "export"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_dir(dest) as tmp:
            (tmp / "new.txt").write_text("half")
            raise RuntimeError("killed mid-write")
    assert [p.name for p in dest.iterdir()] == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no partial folder left
    with atomic_dir(dest) as tmp:
        (tmp / "new.txt").write_text("whole")
    assert [p.name for p in dest.iterdir()] == ["new.txt"] and sorted(p.name for p in tmp_path.iterdir()) == ["export"]

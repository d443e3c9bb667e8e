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


def test_out_and_draft_guards_name_what_the_folder_is(tmp_path):
    """A run goes into a new or empty folder, or over its own kind; a run folder passed as a draft
    is named for what it is."""
    from types import SimpleNamespace

    from spectool.errors import SpectoolError
    from spectool.draft.checkpoint import check_draft
    from spectool.runs import MANIFEST, atomic_write_json, check_out, make_manifest

    check_out(tmp_path / "new", "rollout")
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "engine.log").write_text("...")
    check_out(crashed, "rollout")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(SpectoolError, match="files that are not a spectool run"):
        check_out(foreign, "rollout")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    atomic_write_json(sweep / MANIFEST, make_manifest("sweep"))
    atomic_write_json(sweep / "config.json", {})
    with pytest.raises(SpectoolError, match="holds a 'sweep' run"):
        check_out(sweep, "rollout")
    with pytest.raises(SpectoolError, match="is a 'sweep' run, not a draft folder"):
        check_draft(str(sweep), SimpleNamespace(fingerprint={}, name="m"), 3)
    atomic_write_json(sweep / MANIFEST, make_manifest("rollout"))
    check_out(sweep, "rollout")

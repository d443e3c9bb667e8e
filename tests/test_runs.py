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

    from spectool.draft.checkpoint import check_draft
    from spectool.errors import SpectoolError
    from spectool.runs import MANIFEST, atomic_write_json, claim, make_manifest

    claim(tmp_path / "new", "rollout", {})
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "engine.log").write_text("...")
    claim(crashed, "rollout", {})
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(SpectoolError, match="files that are not a spectool run"):
        claim(foreign, "rollout", {})
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    atomic_write_json(sweep / MANIFEST, make_manifest("sweep"))
    atomic_write_json(sweep / "config.json", {})
    with pytest.raises(SpectoolError, match="holds a 'sweep' run"):
        claim(sweep, "rollout", {})
    with pytest.raises(SpectoolError, match="is a 'sweep' run, not a draft folder"):
        check_draft(str(sweep), SimpleNamespace(fingerprint={}, name="m"), 3)
    atomic_write_json(sweep / MANIFEST, make_manifest("rollout"))
    claim(sweep, "rollout", {})


def test_claim_is_the_one_rule_for_an_out_folder(tmp_path):
    """New folders are claimed; a folder of the same kind resumes only with the same settings (the
    differing keys named, dotted); another kind of run or foreign files are refused and left as
    they are; a crashed run (its settings written, no manifest yet) resumes."""
    from spectool.config.rollout import RolloutConfig
    from spectool.errors import SpectoolError
    from spectool.runs import MANIFEST, atomic_write_json, claim, make_manifest

    out = tmp_path / "r"
    cfg = RolloutConfig(out=str(out))
    assert claim(out, "rollout", cfg) is False and (out / "config.json").exists()
    assert claim(out, "rollout", cfg) is True  # crashed before its manifest: resumes
    atomic_write_json(out / MANIFEST, make_manifest("rollout"))
    assert claim(out, "rollout", RolloutConfig(out="elsewhere")) is True  # the folder is the folder
    other = RolloutConfig(out=str(out), k=2)
    other.sampling.n_prompts = 5
    with pytest.raises(SpectoolError, match=r"other settings \(k, sampling.n_prompts differ\)"):
        claim(out, "rollout", other)
    assert claim(out, "rollout", other, may_change={"k", "sampling.n_prompts"}) is True
    with pytest.raises(SpectoolError, match="holds a 'rollout' run; a sweep run goes"):
        claim(out, "sweep", cfg)
    foreign = tmp_path / "f"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(SpectoolError, match="holds other files; pick a new --out"):
        claim(foreign, "rollout", cfg)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_export_never_replaces_a_folder_that_is_not_an_export(tmp_path, random_draft, tiny_policy):
    """export builds its folder beside --out and swaps it in whole: a folder of the user's own files
    there must be refused, not replaced."""
    from spectool.commands.export import run
    from spectool.config.export import ExportConfig
    from spectool.errors import SpectoolError

    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(SpectoolError, match="holds other files"):
        run(ExportConfig(draft=str(random_draft), out=str(mine), model=str(tiny_policy), verify=False))
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]

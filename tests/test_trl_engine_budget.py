"""TRL's colocated engine as spectool builds it (integrations/trl/attach.speculative_llm): the context stays TRL's,
and on the CPU build, which runs every prompt whole, TRL's fixed 4,096-token step budget is raised to the context
(vLLM refuses a budget below it), never lowered; on a GPU TRL's budget is kept. No engine starts: TRL's `LLM` is a
stand-in that records what it was given."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")


@pytest.fixture
def built(tmp_path, monkeypatch):
    """build(cpu, **TRL's LLM kwargs) -> the kwargs TRL's `LLM` receives through spectool's wrapper, for a model folder
    whose config.json serves 16,384 positions."""
    from spectool.integrations.trl import attach, internals
    from spectool.integrations.trl.settings import SpeculationSettings

    model = tmp_path / "policy"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                   "max_position_embeddings": 16384}))
    seen: list[dict] = []
    module = SimpleNamespace(LLM=lambda *a, **kw: seen.append(kw))
    monkeypatch.setattr(internals, "llm_module", lambda: module)
    monkeypatch.setattr(attach, "prepare_environment", lambda cfg: cfg is not None)  # no process environment changed
    monkeypatch.setattr(attach, "remove_truncated_kernels", lambda kwargs=None: [])  # no compile cache swept

    def build(cpu: bool, **kwargs) -> dict:
        monkeypatch.setattr(attach, "support", lambda: SimpleNamespace(cpu_build=cpu))
        real = module.LLM
        with attach.speculative_llm(SpeculationSettings(draft=None, dtype="float32")):
            module.LLM(model=str(model), **kwargs)
        assert module.LLM is real  # TRL's own name given back once the trainer is built
        return seen.pop()

    return build


def test_trls_step_budget_is_raised_to_the_context_on_the_cpu_build(built):
    # vllm_max_model_length given: the budget reaches it; TRL's context is passed on as given
    got = built(True, max_num_batched_tokens=4096, max_model_len=8192)
    assert got["max_num_batched_tokens"] == 8192 and got["max_model_len"] == 8192
    # unset: vLLM derives the model's own limit, and the budget follows it (the context is not set by spectool)
    got = built(True, max_num_batched_tokens=4096, max_model_len=None)
    assert got["max_num_batched_tokens"] == 16384 and got["max_model_len"] is None
    # a budget already above the context is kept
    assert built(True, max_num_batched_tokens=32768, max_model_len=8192)["max_num_batched_tokens"] == 32768


def test_trls_step_budget_is_kept_on_a_gpu(built):
    got = built(False, max_num_batched_tokens=4096, max_model_len=8192)
    assert got["max_num_batched_tokens"] == 4096 and got["max_model_len"] == 8192

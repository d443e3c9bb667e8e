"""A deeper draft (`init-draft --draft-layers 2`): vLLM's EAGLE-3 loader serves it, and it drafts
exactly as spectool trains it (one engine of its own: engines do not share a process well)."""

from __future__ import annotations

import pytest
import torch

from served import served_vs_trained

pytestmark = pytest.mark.engine


def test_two_layer_draft_is_served_as_trained(tiny_policy, tmp_path):
    """vLLM's EAGLE-3 loader takes a deeper draft (layers.1.*) and runs it as spectool trains it."""
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import new_draft, save_draft
    from spectool.engine.engine import Engine, EngineConfig
    from spectool.hidden import default_aux_layer_ids

    policy = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32).eval()
    torch.manual_seed(1)
    draft = new_draft(policy, torch.arange(0, policy.config.vocab_size, 2),
                      default_aux_layer_ids(policy.config.num_hidden_layers), num_layers=2)
    assert "layers.1.self_attn.q_proj.weight" in draft.export_state_dict()
    save_draft(draft, tmp_path / "draft2")
    with Engine(EngineConfig(model_path=str(tiny_policy), draft_path=str(tmp_path / "draft2"), k=2,
                             kv_cache_gib=1)) as engine:  # closed here, not held for the rest of the run
        served_vs_trained(engine, policy, tmp_path / "draft2", tmp_path)

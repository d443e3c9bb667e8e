"""TRL's lengths against the draft's position range (integrations/trl/preflight.check_lengths): a GRPO run whose
sequences pass the positions the draft was made for is refused before the trainer is built, naming TRL's setting,
as every spectool engine command refuses it; one that stays within them passes. Config-only folders, no weights."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from spectool.errors import SpectoolError


def _folder(path, config: dict) -> str:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_trls_sequences_past_the_drafts_positions_are_refused(tmp_path):
    from spectool.integrations.trl.preflight import check_lengths
    from spectool.integrations.trl.settings import SpeculationSettings

    model = _folder(tmp_path / "policy", {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                          "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                                          "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 8192})
    draft = _folder(tmp_path / "draft", {"architectures": ["LlamaForCausalLMEagle3"], "max_position_embeddings": 2048})
    args = SimpleNamespace(max_completion_length=2100, vllm_max_model_length=None, chat_template_kwargs=None)
    with pytest.raises(SpectoolError, match=r"draft's position range is 2048 tokens .* reach 2100 .*"
                                            r"Lower GRPOConfig.max_completion_length"):
        check_lengths(SpeculationSettings(draft), model, args)
    check_lengths(SpeculationSettings(None), model, args)  # plain decoding: the policy's 8192 positions hold it
    args.max_completion_length = 2000
    check_lengths(SpeculationSettings(draft), model, args)  # within the draft's range

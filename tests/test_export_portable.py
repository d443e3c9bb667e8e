"""What an export says about itself holds on another machine: its model card names the data files it was trained and
checked on by their names, never this machine's folders (a .jsonl and a .parquet alike, each part of a mix), and a
speculators export is stored and declared in the dtype the verifier's config.json names, as transformers 5 writes it
(`dtype`) and as earlier releases did (`torch_dtype`)."""

from __future__ import annotations

import json

from spectool.commands.export import speculators_config, speculators_dtype
from spectool.commands.export_card import Check, model_card

SERVE = json.dumps({"speculative_config": {"method": "eagle3", "model": "Org/draft", "num_speculative_tokens": 3}})


def test_the_card_names_local_data_files_without_their_folders():
    mix = "/home/me/data/qa.parquet@2+/srv/x/gsm.jsonl+openai/gsm8k"
    check = Check(t0=2.5, t1=2.1, proposals="greedy", proposals_why="measured", served_by="vLLM", data=mix,
                  prompts=8, tokens=32, seed=0)
    data = {"harvest_data": mix, "records": 100, "train_records": 90, "eval_records": 10,
            "rendering": {"system_prompt": None, "chat_template_kwargs": {}}}
    card = model_card(base_model="Org/Policy", library="vllm", family="eagle3", k=3, fmt="vllm", check=check, floor=1.2,
                      data=data, command="spectool export ...", serve=SERVE, where="Org/draft")
    assert "/home/me" not in card and "/srv/x" not in card
    assert "- data: `qa.parquet@2+gsm.jsonl+openai/gsm8k`" in card  # a hub id is kept whole, a file by its name
    assert "prompts of `qa.parquet@2+gsm.jsonl+openai/gsm8k`" in card


def test_a_speculators_export_takes_the_verifiers_dtype_from_either_key():
    vcfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "draft_vocab_size": 96,
            "target_hidden_size": 64, "eagle_aux_hidden_state_layer_ids": [1, 2, 3]}
    for policy in ({"dtype": "bfloat16"}, {"torch_dtype": "bfloat16"}, {"dtype": "bfloat16", "torch_dtype": "float32"}):
        assert speculators_dtype(policy) == "bfloat16", policy  # transformers 5's `dtype` first
        conf = speculators_config(vcfg, 3, "Org/Policy", {**policy, "architectures": ["LlamaForCausalLM"]})
        assert conf["torch_dtype"] == conf["transformer_layer_config"]["torch_dtype"] == "bfloat16"
    assert speculators_dtype({"dtype": "auto"}) == speculators_dtype({}) == "float32"  # as the draft was trained

"""Pre-flight draft checks (draft/preflight.py; the position range: positions.py), each with a crafted bad folder:
what vLLM would load without a word and then serve with collapsed acceptance. The refusal names the field and the fix."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from spectool.errors import SpectoolError


@pytest.fixture(scope="module")
def reduced_draft(tiny_policy, tmp_path_factory):
    """A draft with a reduced vocabulary (so it ships d2t), for the tiny policy."""
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import draft_metadata, new_draft, save_draft
    from spectool.hidden import default_aux_layer_ids
    from spectool.models import resolve_model

    policy = AutoModelForCausalLM.from_pretrained(tiny_policy)
    torch.manual_seed(0)
    d = new_draft(policy, torch.arange(0, policy.config.vocab_size, 2), default_aux_layer_ids(policy.config.num_hidden_layers))
    out = tmp_path_factory.mktemp("reduced_draft")
    save_draft(d, out, extra=draft_metadata(resolve_model(str(tiny_policy)), 3))
    return out


def _copy(folder, tmp_path, name="bad"):
    dst = tmp_path / name
    shutil.copytree(folder, dst)
    return dst


def _edit_config(folder, **changes):
    p = folder / "config.json"
    cfg = json.loads(p.read_text())
    for key, value in changes.items():
        target = cfg
        *path, leaf = key.split("__")
        for part in path:
            target = target.setdefault(part, {})
        target[leaf] = value
    p.write_text(json.dumps(cfg))


def _check(folder, tiny_policy, method=None):
    from spectool.draft.checkpoint import check_draft
    from spectool.models import resolve_model

    return check_draft(str(folder), resolve_model(str(tiny_policy)), 2, method=method)


def test_the_good_folder_passes(reduced_draft, tiny_policy):
    assert _check(reduced_draft, tiny_policy) == str(reduced_draft)


def test_aux_layer_ids_past_the_policy_are_refused(reduced_draft, tiny_policy, tmp_path):
    bad = _copy(reduced_draft, tmp_path)
    _edit_config(bad, eagle_aux_hidden_state_layer_ids=[1, 2, 9])  # the tiny policy has 4 layers
    with pytest.raises(SpectoolError, match=r"eagle_aux_hidden_state_layer_ids \[1, 2, 9\] has \[9\] outside \[0, 4\]"):
        _check(bad, tiny_policy)
    _edit_config(bad, eagle_aux_hidden_state_layer_ids=[3, 1, 2])
    with pytest.raises(SpectoolError, match="distinct and increasing"):
        _check(bad, tiny_policy)


def test_dflash_target_layer_ids_count_layer_outputs(tiny_policy):
    """DFlash's target_layer_ids are aux ids - 1: the EAGLE-3 spelling (L) is one past the last layer."""
    from spectool.draft.preflight import check_aux_ids

    check_aux_ids({"dflash_config": {"target_layer_ids": [-1, 1, 3]}}, "dflash", 4, "cfg")  # -1: the embeddings
    with pytest.raises(SpectoolError, match=r"dflash_config.target_layer_ids \[1, 2, 4\] has \[4\] outside \[-1, 3\]"):
        check_aux_ids({"dflash_config": {"target_layer_ids": [1, 2, 4]}}, "dflash", 4, "cfg")


def test_a_vocabulary_map_out_of_range_is_refused(reduced_draft, tiny_policy, tmp_path):
    from safetensors.torch import load_file, save_file

    bad = _copy(reduced_draft, tmp_path)
    sd = load_file(str(bad / "model.safetensors"))
    sd["d2t"] = sd["d2t"] + 300  # draft token 255 -> 255 + 255 + 300, past the 512-token vocabulary
    save_file(sd, str(bad / "model.safetensors"))
    with pytest.raises(SpectoolError, match=r"d2t sends \d+ draft tokens outside the policy's vocabulary \[0, 512\)"):
        _check(bad, tiny_policy)


def test_the_wrong_method_is_refused(reduced_draft, tiny_policy, tmp_path):
    with pytest.raises(SpectoolError, match="eagle3"):
        _check(reduced_draft, tiny_policy, method="dflash")
    bad = _copy(reduced_draft, tmp_path)
    _edit_config(bad, architectures=["LlamaForCausalLMEagle"])  # an EAGLE-1/2 folder
    with pytest.raises(SpectoolError, match="EAGLE-1/2"):
        _check(bad, tiny_policy, method="eagle3")


def test_position_range_reads_rope_scaling():
    from spectool.positions import check_positions, position_range

    assert position_range({"max_position_embeddings": 2048}) == 2048
    yarn = {"max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                               "original_max_position_embeddings": 32768}}
    assert position_range(yarn) == 131072
    assert position_range({"max_position_embeddings": 4096, "rope_scaling": {"type": "default"}}) == 4096
    check_positions(2048, 2048, "d")
    with pytest.raises(SpectoolError, match=r"position range is 2048 tokens .* reach 2049 .* Lower the max tokens"):
        check_positions(2049, 2048, "d")


def test_an_mtp_drafter_does_not_inherit_a_rope_override(tmp_path):
    """vLLM #58080: rope scaling given to the policy as an override does not reach its MTP drafter, so the
    drafter's range is the checkpoint's own; in config.json it is read by both."""
    from spectool.positions import draft_position_range

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    assert draft_position_range(None, str(tmp_path), "mtp", {"rope_scaling": {"rope_type": "yarn", "factor": 4}}) == 4096
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096,
                                                      "rope_scaling": {"rope_type": "yarn", "factor": 4}}))
    assert draft_position_range(None, str(tmp_path), "mtp", None) == 16384
    assert draft_position_range(None, str(tmp_path), "eagle3", None) is None  # no drafter


def test_a_refresh_push_checks_the_vocabulary_map():
    from spectool.draft.preflight import check_vocab_map

    check_vocab_map(torch.tensor([0, 5, 9]), 12, "x")
    with pytest.raises(SpectoolError, match=r"draft token 2 -> 12"):
        check_vocab_map(torch.tensor([0, 5, 10]), 12, "x")


def test_a_short_position_range_is_refused_before_the_rollout(reduced_draft, tiny_policy, tmp_path):
    """A draft shipped with max_position_embeddings 40 (the NeMo RL #3960 shape, scaled down): a rollout whose
    prompt + max tokens pass it is refused with the field and the fix, and nothing is written."""
    from clirun import spectool

    bad = _copy(reduced_draft, tmp_path)
    _edit_config(bad, max_position_embeddings=40)
    data = "gym:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1"
    r = spectool("rollout", "--model", str(tiny_policy), "--data", data, "--draft", str(bad), "--k", "2",
                 "--n-prompts", "2", "--max-tokens", "64", "--out", str(tmp_path / "ro"), check=False)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "position range is 40 tokens" in r.stderr and "max_position_embeddings" in r.stderr and "--max-tokens" in r.stderr
    assert not (tmp_path / "ro").exists()  # refused before the run folder is claimed


@pytest.mark.engine
def test_the_engine_refuses_a_generation_past_the_draft_range(reduced_draft, tiny_policy, tmp_path):
    """The engine's own check (train-rl, sweep-k, verify and every other caller), before vLLM generates."""
    from spectool.engine.engine import Engine, EngineConfig, Sampling

    bad = _copy(reduced_draft, tmp_path)
    _edit_config(bad, max_position_embeddings=40)
    engine = Engine(EngineConfig(model_path=str(tiny_policy), draft_path=str(bad), k=2, kv_cache_gib=1))
    try:
        engine.generate([[1, 2, 3]], Sampling(max_tokens=37, temperature=0))  # 40: fits
        with pytest.raises(SpectoolError, match="position range is 40 tokens .* reach 41"):
            engine.generate([[1, 2, 3], [1, 2, 3, 4]], Sampling(max_tokens=37, temperature=0))
    finally:
        engine.close()


def test_trls_length_check_measures_every_prompt_of_the_dataset(tiny_policy):
    """TRL 1.16 has no max_prompt_length: every prompt is as long as the data makes it, so the check measures them
    all. A long prompt at index 900 of 1,000 (past the 256 once measured) sets the longest sequence: a completion
    that fits every other prompt within the tiny policy's 1,024 positions is refused with it."""
    from types import SimpleNamespace

    from datasets import Dataset
    from transformers import AutoTokenizer

    from spectool.integrations.trl.preflight import _longest_prompt, check_lengths
    from spectool.integrations.trl.settings import SpeculationSettings

    short = [{"role": "user", "content": "What is 1 + 2?"}]
    long = [{"role": "user", "content": " ".join(f"word{i}" for i in range(150))}]
    ds = Dataset.from_dict({"prompt": [long if i == 900 else short for i in range(1000)]})
    tok = AutoTokenizer.from_pretrained(tiny_policy)
    rendered = tok.apply_chat_template(long, add_generation_prompt=True, tokenize=True)  # transformers' own, as TRL's
    want = len(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    shortest = len(tok.apply_chat_template(short, add_generation_prompt=True, tokenize=False))  # chars: an upper bound
    assert want > shortest + 100  # the long prompt alone decides
    assert _longest_prompt({"train_dataset": ds}, str(tiny_policy)) == want
    args = SimpleNamespace(max_completion_length=1024 - want, vllm_max_model_length=None, chat_template_kwargs=None)
    with pytest.raises(SpectoolError, match=rf"needs a 1024-token context \(the longest prompt, {want} tokens"):
        check_lengths(SpeculationSettings(None), str(tiny_policy), args, trainer_kwargs={"train_dataset": ds})
    args.max_completion_length = 1023 - want  # one position spare past the long prompt's sequence: it fits
    check_lengths(SpeculationSettings(None), str(tiny_policy), args, trainer_kwargs={"train_dataset": ds})


def test_a_prompt_length_measured_once_is_not_reused_for_another_rendering(tiny_policy):
    """The longest prompt is measured once per dataset, tokenizer and template kwargs: the same dataset with a
    tokenizer whose chat template writes more (a processing_class of the user's) is measured again."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from spectool.integrations.trl.preflight import _longest_prompt

    ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What is {i} + 1?"}] for i in range(300)]})
    tok = AutoTokenizer.from_pretrained(tiny_policy)
    plain = _longest_prompt({"train_dataset": ds, "processing_class": tok}, str(tiny_policy))
    tok.chat_template = "Think step by step before you answer. " + tok.chat_template
    longer = _longest_prompt({"train_dataset": ds, "processing_class": tok}, str(tiny_policy))
    assert longer > plain


@pytest.fixture(scope="module")
def mapless_draft(reduced_draft, tmp_path_factory):
    """The reduced-vocabulary draft as a converter in the field writes it: a public folder (no draft.json), the aux
    layer ids left to vLLM's defaults, and weights without d2t (vLLM 0.32 would serve it with its map at zeros)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("mapless") / "draft"
    shutil.copytree(reduced_draft, folder, ignore=shutil.ignore_patterns("draft.json"))
    weights = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if k != "d2t"}
    save_file(weights, str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)
    (cfg.get("eagle_config") or {}).pop("eagle_aux_hidden_state_layer_ids", None)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _no_map(tiny_policy) -> str:
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(tiny_policy).vocab_size
    return rf"the draft's vocabulary is {vocab // 2} of the policy's {vocab} but its weights hold no d2t map"


def test_a_reduced_vocabulary_without_its_map_is_refused_by_every_reader_of_a_draft_folder(mapless_draft, reduced_draft,
                                                                                         tiny_policy):
    """The one reading: check_speculation's (every command: rollout, sweep-k, verify, export, train-rl, TRL,
    init-draft --init-from), the refresher's, export's tensor check and load_draft (a warm start) refuse it by name;
    the same weights with their map pass."""
    from transformers import AutoConfig

    from spectool.draft.checkpoint import check_tensors, load_draft
    from spectool.draft.guard import check_refreshable, check_speculation
    from spectool.models import resolve_model

    policy, config = resolve_model(str(tiny_policy)), AutoConfig.from_pretrained(tiny_policy)
    layers = config.num_hidden_layers
    readers = {"check_speculation": lambda d: check_speculation(policy, "eagle3", str(d), 2),
               "check_refreshable": lambda d: check_refreshable(d, config),
               "check_tensors": lambda d: check_tensors(d, str(tiny_policy), "eagle3"),
               "load_draft": lambda d: load_draft(d, num_layers=layers)}
    for name, read in readers.items():
        with pytest.raises(SpectoolError, match=_no_map(tiny_policy)):
            read(mapless_draft)
        read(reduced_draft)  # with its map: served as trained


def _command_runs(tmp_path, tiny_policy, draft, gym):
    from spectool.commands import export, init_draft, rollout, sweep_k, train_rl, train_rl_trl, verify
    from spectool.config.export import ExportConfig
    from spectool.config.init_draft import InitDraftConfig
    from spectool.config.rollout import RolloutConfig
    from spectool.config.sweep_k import SweepConfig
    from spectool.config.verify import VerifyConfig
    from spectool.rl.config import RLConfig, SpeculationSection

    m, d, out = str(tiny_policy), str(draft), str(tmp_path / "out")

    def rl(backend):
        return RLConfig(model=m, data=str(gym), out=out, speculation=SpeculationSection(draft=d, k=2),
                        prompt_col="question", answer_col="solution", backend=backend)

    return {"rollout": lambda: rollout.run(RolloutConfig(model=m, draft=d, k=2, out=out)),
            "sweep-k": lambda: sweep_k.run(SweepConfig(model=m, draft=d, ks=[1, 2], out=out)),
            "verify": lambda: verify.run(VerifyConfig(model=m, draft=d, k=2, out=out)),
            "export": lambda: export.run(ExportConfig(model=m, draft=d, k=2, out=out)),
            "init-draft --init-from": lambda: init_draft.run(InitDraftConfig(model=m, init_from=d, out=out)),
            "train-rl": lambda: train_rl.run(rl("builtin")),
            "train-rl --backend trl": lambda: train_rl_trl.run(rl("trl"))}


@pytest.mark.parametrize("command", ["rollout", "sweep-k", "verify", "export", "init-draft --init-from", "train-rl",
                                     "train-rl --backend trl"])
def test_every_command_refuses_a_reduced_vocabulary_without_its_map_before_anything_starts(
        command, mapless_draft, tiny_policy, gym_jsonl, tmp_path):
    if command.endswith("trl"):
        pytest.importorskip("trl")
    with pytest.raises(SpectoolError, match=_no_map(tiny_policy)):
        _command_runs(tmp_path, tiny_policy, mapless_draft, gym_jsonl)[command]()
    assert not (tmp_path / "out").exists()  # refused before the run folder is claimed, and before any engine


def test_init_draft_refuses_a_warm_start_that_does_not_fit_the_policy_before_the_claim(reduced_draft, tiny_policy,
                                                                                     tmp_path, monkeypatch):
    """A public folder (no draft.json) mapping into another vocabulary size than the policy's is refused by init-draft
    --init-from as the later load with the policy would refuse it (check_fits), but before --out is claimed or
    anything is harvested."""
    from spectool.commands import init_draft
    from spectool.config.init_draft import InitDraftConfig

    folder = tmp_path / "warm"
    shutil.copytree(reduced_draft, folder, ignore=shutil.ignore_patterns("draft.json"))
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    _edit_config(folder, vocab_size=vocab + 64)  # its map still lands inside the policy's vocabulary

    def past_the_claim(*_):
        raise AssertionError("refused after --out was claimed")

    monkeypatch.setattr(init_draft, "training_data", past_the_claim)
    with pytest.raises(SpectoolError, match=rf"does not fit this policy: vocab_size: draft maps into {vocab + 64}"):
        init_draft.run(InitDraftConfig(model=str(tiny_policy), init_from=str(folder), out=str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()

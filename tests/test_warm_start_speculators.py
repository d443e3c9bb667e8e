"""Warm starts from the field's drafts: an EAGLE-3 draft written by the speculators library itself (0.9.0, a test
dependency), with either norm_before_residual, loads through --init-from with the library's own logits, trains,
exports; a hub id resolves through huggingface_hub's cache, offline."""

from __future__ import annotations

import json

import pytest
import torch

from spectool.errors import SpectoolError

STEPS = 3


@pytest.fixture(scope="module", params=[False, True], ids=["residual-h", "norm-before-residual"])
def speculators_draft(tiny_policy, tmp_path_factory, request):
    """(the library's model, its saved folder) for the tiny policy: one Llama layer, a 96-token draft vocabulary,
    every weight random (norms too, so hidden_norm is no identity)."""
    pytest.importorskip("speculators", reason="scripts/setup.sh installs speculators 0.9.0")
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import AutoConfig

    layer = AutoConfig.from_pretrained(tiny_policy)
    layer.num_hidden_layers = 1
    layer._attn_implementation = "eager"  # the library's float mask (its flex attention is for GPUs)
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=96, norm_before_residual=request.param,
        eagle_aux_hidden_state_layer_ids=[0, 2, 3],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=STEPS)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=str(tiny_policy), architectures=["LlamaForCausalLM"])))
    model = Eagle3DraftModel(config)
    V = layer.vocab_size
    ids = torch.arange(0, V, 2)[:96]
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    model.load_vocab_mappings(t2d, ids - torch.arange(96))
    model.load_verifier_weights()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("embed_tokens", "verifier_")):
                continue
            p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g) if name.endswith("norm.weight")
                    else 0.05 * torch.randn(p.shape, generator=g))
    folder = tmp_path_factory.mktemp("speculators") / "draft"
    model.save_pretrained(str(folder))
    return model.eval(), folder, request.param


def _library_logits(model, aux: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
    """The library's forward (no loss: it returns tokens), its lm_head's outputs captured per TTT step. Its step 0 reads
    the next token at each position (input_ids shifted), as spectool's unroll does."""
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    shifted = torch.cat([x[:, 1:], x.new_zeros(1, 1)], 1)
    try:
        with torch.no_grad():
            model(hidden_states=aux, input_ids=shifted, document_ids=torch.zeros_like(x), ttt_steps=STEPS)
    finally:
        hook.remove()
    return seen


def test_a_speculators_draft_loads_with_the_librarys_logits(tiny_policy, speculators_draft):
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import draft_folder, load_draft

    model, folder, nbr = speculators_draft
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and "transformer_layer_config" in cfg  # the library's format
    policy = AutoModelForCausalLM.from_pretrained(tiny_policy)
    draft, _ = load_draft(draft_folder(str(folder)), policy)
    assert draft.config.norm_before_residual is nbr and draft.config.draft_vocab_size == 96
    assert draft.draft_to_target_ids().tolist() == torch.arange(0, policy.config.vocab_size, 2)[:96].tolist()
    torch.manual_seed(0)
    x = torch.randint(0, policy.config.vocab_size, (1, 20))
    aux = torch.randn(1, 20, 3 * policy.config.hidden_size)
    with torch.no_grad():
        ours = draft.eval().unroll(aux, x, STEPS)
    theirs = _library_logits(model, aux, x)
    assert len(theirs) == len(ours) == STEPS
    for j, (a, b) in enumerate(zip(ours, theirs)):
        assert a.shape == b.shape, j
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=f"step {j}")
    if nbr:  # the other residual gives other logits: the setting is read, not ignored
        import dataclasses

        other = type(draft)(dataclasses.replace(draft.config, norm_before_residual=False))
        other.load_state_dict(draft.state_dict())
        with torch.no_grad():
            assert not torch.allclose(other.eval().unroll(aux, x, STEPS)[0], theirs[0], atol=1e-3)


def test_a_speculators_draft_trains_and_exports_with_its_residual(tiny_policy, speculators_draft, fake_harvest,
                                                                   tmp_path):
    from spectool.commands.export import run as export
    from spectool.commands.init_draft import InitDraftConfig, run
    from spectool.config.export import ExportConfig
    from spectool.draft.checkpoint import load_draft

    _, folder, nbr = speculators_draft
    warm = load_draft(folder)[0]
    r = run(InitDraftConfig(out=str(tmp_path / "d"), model=str(tiny_policy), data=str(fake_harvest),
                            init_from=str(folder), ttt_steps=STEPS, epochs=1, batch_size=4, lr=1e-3, warmup_steps=1))
    assert r.steps >= 1
    trained = load_draft(tmp_path / "d")[0]
    assert trained.config.norm_before_residual is nbr  # kept through save and load
    assert trained.draft_to_target_ids().tolist() == warm.draft_to_target_ids().tolist()
    assert not torch.equal(trained.fc.weight, warm.fc.weight)  # it trained from the warm start
    assert json.loads((tmp_path / "d" / "config.json").read_text())["norm_before_residual"] is nbr  # as vLLM reads it
    for fmt in ("vllm", "speculators"):
        export(ExportConfig(draft=str(tmp_path / "d"), out=str(tmp_path / fmt), format=fmt, model=str(tiny_policy),
                            k=STEPS, verify=False))
        assert json.loads((tmp_path / fmt / "config.json").read_text())["norm_before_residual"] is nbr
        again = load_draft(tmp_path / fmt)[0]
        assert again.config.norm_before_residual is nbr
        assert torch.equal(again.midlayer.hidden_norm.weight, trained.midlayer.hidden_norm.weight)


def test_a_speculators_config_without_the_residual_setting_computes_as_vllm_reads_it(speculators_draft, tmp_path):
    """A speculators config that leaves norm_before_residual out (one written by hand or by an older converter):
    vLLM 0.32's update_eagle3 reads it as true, so the draft loads computing what the same weights with true compute,
    not what they compute with false."""
    from spectool.draft.checkpoint import load_draft

    _, folder, _ = speculators_draft
    cfg = json.loads((folder / "config.json").read_text())
    torch.manual_seed(0)
    x, aux, logits = torch.randint(0, 96, (1, 12)), None, {}
    for name, setting in (("absent", None), ("true", True), ("false", False)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
        written = {k: v for k, v in cfg.items() if k != "norm_before_residual"}
        (tmp_path / name / "config.json").write_text(json.dumps(
            written if setting is None else {**written, "norm_before_residual": setting}))
        draft = load_draft(tmp_path / name)[0].eval()
        aux = torch.randn(1, 12, 3 * draft.config.target_hidden_size) if aux is None else aux
        with torch.no_grad():
            logits[name] = draft.unroll(aux, x, STEPS)
    assert all(torch.equal(a, b) for a, b in zip(logits["absent"], logits["true"]))
    assert not torch.allclose(logits["absent"][0], logits["false"][0], atol=1e-3)


def test_speculators_options_spectool_lacks_are_refused(speculators_draft, tmp_path):
    from spectool.draft.checkpoint import load_draft

    _, folder, _ = speculators_draft
    cfg = json.loads((folder / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "norm_before_fc": True}))
    with pytest.raises(SpectoolError, match="norm_before_fc"):
        load_draft(tmp_path)
    layer = {**cfg["transformer_layer_config"], "model_type": "qwen3"}
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "transformer_layer_config": layer}))
    with pytest.raises(SpectoolError, match="model_type is 'qwen3'"):
        load_draft(tmp_path)


def _offline_hub_with(folder, home, monkeypatch) -> str:
    """`folder` as the hub's someorg/eagle3-tiny in a cache under `home`, that cache the process's (HF_HOME), offline;
    the snapshot's path."""
    snap = _hub_cache(home, "someorg/eagle3-tiny", folder)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snap


def _hub_cache(home, repo: str, src) -> str:
    """`src`'s files as huggingface_hub lays out a downloaded repo under HF_HOME: blobs, a snapshot of links, refs/main."""
    import hashlib
    import os

    rev = "0123456789abcdef0123456789abcdef01234567"
    root = home / "hub" / f"models--{repo.replace('/', '--')}"
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(rev)
    snap = root / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in src.iterdir():
        data = f.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / f.name)
    return str(snap)


def test_a_hub_id_resolves_from_the_cache_offline_and_a_missing_one_says_how(speculators_draft, tmp_path,
                                                                             monkeypatch):
    from spectool.draft.checkpoint import draft_folder, load_draft

    _, folder, nbr = speculators_draft
    snap = _offline_hub_with(folder, tmp_path / "hf", monkeypatch)
    found = draft_folder("someorg/eagle3-tiny")
    assert str(found) == snap
    assert load_draft(found)[0].config.norm_before_residual is nbr
    with pytest.raises(SpectoolError, match=r"--init-from someorg/missing.*HF_HUB_OFFLINE.*hf download someorg/missing"):
        draft_folder("someorg/missing")
    with pytest.raises(SpectoolError, match="does not exist"):
        draft_folder(str(tmp_path / "no" / "such" / "folder"))


def test_trl_takes_a_hub_ids_draft_from_the_cache(speculators_draft, tiny_policy, tmp_path, monkeypatch):
    """SpectoolSpeculation(draft="ORG/NAME") resolves through the same cache as --init-from: the draft checks pass
    on the cached folder (a run past the policy's context is then refused, before any engine), the user's settings
    keep the hub id, and a missing id offline says how to fetch it, naming the setting."""
    pytest.importorskip("trl")
    from trl import GRPOConfig

    from spectool.integrations.trl import SpectoolSpeculation, task_data

    from conftest import sums_with_answer

    _, folder, _ = speculators_draft
    snap = _offline_hub_with(folder, tmp_path / "hf", monkeypatch)
    ds, reward = task_data(str(sums_with_answer(tmp_path)), 4)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=10**6, report_to="none", use_vllm=True,
                      vllm_mode="colocate", save_strategy="no")
    spec = SpectoolSpeculation("someorg/eagle3-tiny", k=2)
    with pytest.raises(SpectoolError, match=r"GRPOConfig.max_completion_length 1000000"):
        spec.grpo_trainer(args=args, model=str(tiny_policy), reward_funcs=reward, train_dataset=ds)
    assert spec.draft == "someorg/eagle3-tiny"
    assert spec.resolved().draft == snap and spec.resolved().method == "eagle3"
    with pytest.raises(SpectoolError, match=r"SpectoolSpeculation\(draft=\.\.\.\) someorg/missing.*HF_HUB_OFFLINE"):
        SpectoolSpeculation("someorg/missing").grpo_trainer(args=args, model=str(tiny_policy), reward_funcs=reward,
                                                            train_dataset=ds)


@pytest.mark.engine
def test_vllm_serves_a_speculators_folder_as_spectool_computes_it(speculators_draft, tiny_policy, tmp_path):
    """The speculators folder as written (no export), served by the real engine: its drafter's first proposal round
    equals spectool's unroll of the same folder, with either norm_before_residual (vLLM's llama_eagle3.py applies
    it as spectool does, not only as the library does)."""
    from transformers import AutoModelForCausalLM

    from spectool.engine.engine import Engine, EngineConfig

    from served import served_vs_trained

    _, folder, _ = speculators_draft
    policy = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32).eval()
    with Engine(EngineConfig(model_path=str(tiny_policy), draft_path=str(folder), k=2, kv_cache_gib=1)) as engine:
        served_vs_trained(engine, policy, folder, tmp_path)

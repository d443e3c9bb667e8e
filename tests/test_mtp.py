"""The native MTP path on a tiny random MiMo-architecture model the tests build (a Qwen2 trunk plus
one MTP layer, vLLM's `MiMoForCausalLM`): the engine drafts with `method: mtp`, spectool's PyTorch
MTP layer predicts the engine's acceptance exactly, weights pushed into the running drafter are
checked there, init-draft --method mtp changes only the MTP tensors, verify says LOSSLESS with power,
train-rl refreshes the MTP layer online, and bad inputs are named."""

from __future__ import annotations

import json

import pytest
import torch

from clirun import free_port, spectool
from served import assert_addresses_kept


@pytest.fixture(scope="module")
def tiny_mimo(tiny_policy, tmp_path_factory):
    from mimo import add_mtp_layers

    return add_mtp_layers(tiny_policy, tmp_path_factory.mktemp("tiny_mimo"))


@pytest.fixture(scope="module")
def sums(tmp_path_factory):
    from conftest import sums_with_answer

    return sums_with_answer(tmp_path_factory.mktemp("data"))


def _safetensors(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


# --- without an engine ------------------------------------------------------------------------------


def test_the_trunk_served_as_mimo_is_the_source_model(tiny_policy, tiny_mimo):
    from transformers import AutoModelForCausalLM

    ids = torch.randint(0, 400, (2, 17))
    with torch.no_grad():
        a = AutoModelForCausalLM.from_pretrained(tiny_policy)(ids).logits
        b = AutoModelForCausalLM.from_pretrained(tiny_mimo)(ids).logits
    assert torch.equal(a, b)  # zero q/k/v biases: a Llama decoder is a Qwen2 decoder
    cfg = json.loads((tiny_mimo / "config.json").read_text())
    assert cfg["architectures"] == ["MiMoForCausalLM"] and cfg["num_nextn_predict_layers"] == 1


def test_a_model_without_mtp_layers_is_refused_naming_the_fields(tiny_policy):
    from spectool.draft.mtp_folder import k_note, require_mtp
    from spectool.errors import SpectoolError

    with pytest.raises(SpectoolError, match="num_nextn_predict_layers, mtp_num_hidden_layers, num_mtp_modules"):
        require_mtp(tiny_policy)
    assert k_note(1, 1) is None and "runs the MTP layer again" in k_note(3, 1)
    r = spectool("rollout", "--model", str(tiny_policy), "--method", "mtp", check=False)
    assert r.returncode != 0 and "num_nextn_predict_layers" in r.stderr
    r = spectool("init-draft", "--model", str(tiny_policy), "--method", "mtp", "--out", "never", check=False)
    assert r.returncode != 0 and "has no MTP layers" in r.stderr


def test_mtp_with_a_draft_folder_is_refused(tiny_mimo, random_draft):
    r = spectool("rollout", "--model", str(tiny_mimo), "--method", "mtp", "--draft", str(random_draft), check=False)
    assert r.returncode != 0 and "--draft" in r.stderr and "own MTP" in r.stderr


def test_the_mtp_unroll_trains_only_the_mtp_layer(tiny_mimo):
    """Gradients of the TTT loss reach the MTP layer and nothing of the trunk (it is read detached)."""
    from transformers import AutoModelForCausalLM

    from spectool.draft.mtp_folder import load_mtp
    from spectool.draft.ttt import ttt_step_loss
    from spectool.hidden import feature_items

    policy = AutoModelForCausalLM.from_pretrained(tiny_mimo)
    draft = load_mtp(tiny_mimo, policy)
    items = feature_items(policy, [list(range(5, 30)), list(range(40, 60))], draft.config.aux_layer_ids)
    W = policy.get_output_embeddings().weight.detach()
    loss, per_step = ttt_step_loss(draft, items, [6, 6], W, 3, 0.8, "cpu", "mix")
    loss.backward()
    assert len(per_step) == 3 and all(p.grad is not None for p in draft.parameters())
    assert all(p.grad is None for p in policy.parameters())


# --- on the real engine ------------------------------------------------------------------------------


@pytest.mark.engine
def test_engine_drafts_with_mtp_and_spectool_predicts_its_acceptance(tiny_mimo):
    """vLLM's MTP proposer and spectool's unroll are the same computation: at T=0 the greedy walk
    over the engine's own completions gives the engine's acceptance length. Then new MTP weights
    reach the running drafter (probe check with power), and the refresher does the same from a
    training forward without touching the trunk."""
    from transformers import AutoModelForCausalLM

    from spectool.draft.mtp_folder import load_mtp
    from spectool.draft.refresh import DraftRefresher, RefreshSettings
    from spectool.draft.ttt import heldout_metrics
    from spectool.engine.engine import Engine, EngineConfig, Sampling
    from spectool.engine.probe import compare
    from spectool.hidden import feature_items

    policy = AutoModelForCausalLM.from_pretrained(tiny_mimo)
    draft = load_mtp(tiny_mimo, policy)
    prompts = [[1, 5 + i, 6, 7 + i, 8, 9] for i in range(12)]
    # float32 on every build: the expectations below are float32 ("auto" is bfloat16 on a GPU, where the first
    # lent H200 failed this probe on exactly that, docs/gpu.md)
    with Engine(EngineConfig(model_path=str(tiny_mimo), method="mtp", k=3, dtype="float32")) as eng:
        assert compare(eng.draft_probe(), draft.vllm_probe("float32")).ok
        outs, st = eng.generate(prompts, Sampling(max_tokens=32, temperature=0.0))
        assert st.num_drafts > 0 and st.num_accepted_tokens > 0 and len(st.accepted_per_pos) == 3
        seqs = [p + o[0].response_ids for p, o in zip(prompts, outs)]
        W = policy.get_output_embeddings().weight.detach()
        m = heldout_metrics(draft, feature_items(policy, seqs, draft.config.aux_layer_ids), [6] * 12, W,
                            torch.arange(W.shape[0]), 3, 12, "cpu")
        assert m["walk_greedy"][2] == pytest.approx(st.mean_acceptance_length, abs=0.02)

        old, addresses = eng.draft_probe(), eng.draft_addresses()
        with torch.no_grad():
            for p in draft.parameters():
                p.mul_(1.25)
        eng.update_draft(draft.export_state_dict())
        want = draft.vllm_probe("float32")
        assert not compare(old, want).ok and compare(eng.draft_probe(), want).ok  # it took, and the check could tell

        policy.train()
        ref = DraftRefresher.from_mtp(tiny_mimo, policy, RefreshSettings(lr=1e-2, batch_size=4, ttt_steps=3))
        n = min(map(len, seqs))
        ids = torch.tensor([s[:n] for s in seqs])  # [12, n]
        with ref.capture([6] * len(seqs)):
            policy(input_ids=ids).logits.logsumexp(-1).mean().backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters()}
        trunk = {n: p.detach().clone() for n, p in policy.named_parameters()}
        rep = ref.refresh(5)
        assert ref.captured == 12 and rep.steps == 5
        assert all(torch.equal(p.grad, grads[n]) and torch.equal(p, trunk[n]) for n, p in policy.named_parameters())
        push = ref.push(eng)
        assert push.max_excess <= 1 and push.has_power and push.modules == 10
        assert_addresses_kept(addresses, eng.draft_addresses())  # what a CUDA graph captured stays live


@pytest.mark.e2e
def test_init_draft_mtp_changes_only_the_mtp_tensors_and_is_served(tiny_mimo, sums, tmp_path):
    out = tmp_path / "mtp"
    spectool("init-draft", "--model", str(tiny_mimo), "--method", "mtp", "--data", str(sums), "--out", str(out),
             "--n-prompts", "24", "--samples", "2", "--max-tokens", "24", "--epochs", "1", "--ttt-steps", "2",
             "--lr", "3e-3")
    before, after = _safetensors(tiny_mimo), _safetensors(out)
    assert set(before) == set(after)
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert changed and all(k.startswith("model.mtp_layers.0.") for k in changed)  # the trunk is bit-identical
    assert json.loads((out / "manifest.json").read_text())["kind"] == "mtp-model"

    r = spectool("rollout", "--model", str(out), "--method", "mtp", "--k", "2", "--n-prompts", "4", "--max-tokens",
                 "16", "--data", str(sums), "--split", "train", "--compare")
    assert "mean acceptance length (k=2)" in r.stdout and "speedup" in r.stdout
    # the trained layer served at k=1 (once) and k=2 (run again), each measured
    spectool("sweep-k", "--model", str(out), "--methods", "mtp", "--k", "1,2", "--batch-sizes", "2", "--min-seqs", "2",
             "--min-seconds", "0", "--repeats", "1",
             "--max-tokens", "12", "--data", str(sums), "--out", str(tmp_path / "sweep"))
    rows = [x for x in json.loads((tmp_path / "sweep" / "sweep.json").read_text())["rows"] if x["method"] == "mtp"]
    assert [x["k"] for x in rows] == [1, 2] and all(x["mean_acceptance_length"] >= 1 for x in rows)
    r = spectool("rollout", "--draft", str(out), "--model", str(tiny_mimo), check=False)
    assert r.returncode != 0 and "--method mtp" in r.stderr  # the folder is named for what it is


@pytest.mark.e2e
def test_verify_mtp_is_lossless_with_power(tiny_mimo, tmp_path):
    r = spectool("verify", "--model", str(tiny_mimo), "--method", "mtp", "--data", "chat", "--n-prompts", "3",
                 "--samples", "200", "--positions", "5", "--k", "2", "--out", str(tmp_path))
    assert "verdict: LOSSLESS" in r.stdout, r.stdout[-3000:]
    v = json.loads((tmp_path / "verify.json").read_text())
    assert any(x.startswith("lossy control rejected: ") for x in v["reasons"])
    plain, spec, lossy = v["arms"]
    assert spec["mean_acceptance_length"] > 1.0 and spec["logprob_max_abs_diff"] < 1e-3


@pytest.mark.e2e
def test_weightless_mtp_sweep_then_forecast(tiny_mimo, tmp_path):
    cfg_only = tmp_path / "cfg"
    cfg_only.mkdir()
    (cfg_only / "config.json").write_text((tiny_mimo / "config.json").read_text())
    out = tmp_path / "sweep"
    r = spectool("sweep-k", "--model", str(cfg_only), "--dummy-weights", "--methods", "mtp", "--acceptance-rates",
                 "0.9,0.6", "--min-seconds", "0", "--repeats", "1", "--k", "1,2", "--batch-sizes", "2", "--max-tokens", "16",
                 "--min-seqs", "2", "--prompt-len", "8", "--out", str(out))
    assert "runs the MTP layer again" in r.stderr  # k=2 with one MTP layer
    rows = [x for x in json.loads((out / "sweep.json").read_text())["rows"] if x["method"] == "mtp"]
    assert len(rows) == 2 and all(x["per_position"][0] == pytest.approx(0.9, abs=0.2) for x in rows)
    spectool("forecast", "--sweep", str(out), "--method", "mtp", "--batch", "8", "--max-concurrency", "4",
             "--max-tokens", "32", "--generation-share", "0.66", "--out", str(tmp_path / "f"))
    assert json.loads((tmp_path / "f" / "forecast.json").read_text())["method"] == "mtp"


@pytest.mark.e2e
def test_train_rl_refreshes_the_mtp_layer_online_and_resumes(tiny_mimo, sums, tmp_path):
    out = tmp_path / "rl"
    sets = [f"model={tiny_mimo}", f"data={sums}", f"out={out}", "speculation.method=mtp", "speculation.k=2",
            "rollout.prompts_per_step=3", "rollout.group_size=4", "rollout.max_tokens=16", "rollout.eval_every=0",
            "policy.lr=1e-3", "policy.logprob_check_every=1", "policy.logprob_tolerance=1e-3", "draft_refresh.every=1",
            "draft_refresh.steps_per_refresh=3", "draft_refresh.ttt_steps=2", "draft_refresh.warmup_steps=0",
            "draft_refresh.lr=1e-2", "engine.kv_cache_gib=1", "checkpoint_every=2"]

    def run(steps):
        return spectool("train-rl", *[a for s in [*sets, f"policy.steps={steps}"] for a in ("--set", s)])

    run(2)
    run(3)  # resumes from the step-2 checkpoint: its policy folder carries the refreshed MTP layer
    m = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in m] == [1, 2, 3]
    for r in m:
        assert r["logprob_check_max_diff"] < 1e-3 and len(r["acceptance_per_pos"]) == 2
        assert r["draft_check_excess"] <= 1 and r["draft_check_power"]  # pushed into the drafter and checked there
    ck = out / "checkpoints" / "step-000003" / "policy"
    cfg = json.loads((ck / "config.json").read_text())
    assert cfg["architectures"] == ["MiMoForCausalLM"] and (ck / "model-mtp.safetensors").exists()
    saved = _safetensors(ck)
    base = _safetensors(tiny_mimo)
    assert not torch.equal(saved["model.mtp_layers.0.input_proj.weight"], base["model.mtp_layers.0.input_proj.weight"])


@pytest.mark.e2e
def test_train_rl_backend_trl_refreshes_the_mtp_layer_and_resumes_it(tiny_mimo, sums, tmp_path):
    """The same through TRL's GRPOTrainer: the refreshed MTP layer goes into TRL's checkpoint and a
    longer rerun goes on training it (its optimizer steps continue)."""
    out = tmp_path / "rl"
    sets = [f"model={tiny_mimo}", f"data={sums}", f"out={out}", "speculation.method=mtp", "speculation.k=2",
            "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_tokens=16", "rollout.eval_every=0",
            "policy.lr=1e-3", "policy.micro_batch_size=4", "draft_refresh.every=1", "draft_refresh.steps_per_refresh=3",
            "draft_refresh.ttt_steps=2", "engine.enforce_eager=true", "checkpoint_every=2"]

    def run(steps):
        return spectool("train-rl", "--backend", "trl", *[a for s in [*sets, f"policy.steps={steps}"] for a in ("--set", s)],
                        env={"MASTER_PORT": str(free_port())})

    run(2)
    assert (out / "trl" / "checkpoint-2" / "spectool-draft" / "refresher.pt").exists()
    run(3)
    m = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in m] == [1, 2, 3] and [r["spectool/draft_steps"] for r in m] == [3, 6, 9]
    assert all(r["spectool/draft_check_excess"] <= 1 for r in m)

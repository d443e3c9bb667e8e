"""train-rl without the engine: the draft refresh never touches the policy's gradients; the pieces
a resumed run relies on (prompts per step, metrics truncation); the CLI's config handling."""

from __future__ import annotations

import json

import pytest
import torch

from clirun import spectool


def _rollouts(policy_dir, n=6, seed=0):
    from spectool.rl.policy import Rollout

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(10, 500, (5 + i % 3,), generator=g).tolist()
        resp = torch.randint(10, 500, (4 + i % 4,), generator=g).tolist()
        out.append(Rollout(prompt, resp, [-6.0] * len(resp), reward=float(i % 2), advantage=1.0 if i % 2 else -1.0))
    return out


def _trainer(policy_dir):
    from spectool.rl.policy import PolicyTrainer

    return PolicyTrainer(str(policy_dir), lr=1e-3, temperature=1.0, eps_low=0.2, eps_high=0.2, kl_beta=0.1,
                         micro_batch_size=4, max_grad_norm=1.0, seed=0)


def test_policy_gradients_are_bit_identical_with_draft_refresh_on_and_off(tiny_policy, random_draft):
    """The refresher's hooks ride on the trainer's own forward (as in any outside trainer) and
    never change the policy's gradients or weights; the draft does train."""
    from spectool.draft.refresh import DraftRefresher, RefreshSettings

    on, off = _trainer(tiny_policy), _trainer(tiny_policy)
    refresher = DraftRefresher.from_folder(random_draft, on.model, RefreshSettings(lr=1e-2, warmup_steps=0, batch_size=4))
    before = {k: v.clone() for k, v in refresher.draft.state_dict().items()}
    grads = {}
    for name, trainer, capture in (("on", on, refresher.capture), ("off", off, None)):
        for step in range(2):
            rep = trainer.update(_rollouts(tiny_policy, seed=step), capture=capture)
            assert rep.grad_norm > 0
            if capture:
                assert refresher.captured == 6 * (step + 1)
                assert not refresher.online.buffer[-1].aux.requires_grad
                assert refresher.refresh(3).loss > 0  # the draft trains between policy steps
        grads[name] = {n: p.grad.clone() for n, p in trainer.unwrapped.named_parameters()}
        grads[name + "_w"] = {n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters()}
    for n in grads["on"]:
        assert torch.equal(grads["on"][n], grads["off"][n]), n
        assert torch.equal(grads["on_w"][n], grads["off_w"][n]), n
    changed = [k for k, v in refresher.draft.state_dict().items() if k != "embed_tokens.weight"
               and not torch.equal(before[k], v.cpu())]
    assert changed


def test_trainer_logprobs_match_a_plain_forward(tiny_policy):
    from transformers import AutoModelForCausalLM

    t = _trainer(tiny_policy)
    rs = _rollouts(tiny_policy, n=2)
    got = t.logprobs([r.prompt_ids for r in rs], [r.response_ids for r in rs])
    m = AutoModelForCausalLM.from_pretrained(tiny_policy)
    for r, g in zip(rs, got):
        ids = torch.tensor([r.prompt_ids + r.response_ids])
        with torch.no_grad():
            lp = torch.log_softmax(m(ids).logits[0], -1)
        want = [float(lp[len(r.prompt_ids) - 1 + i, tok]) for i, tok in enumerate(r.response_ids)]
        assert g == pytest.approx(want, abs=1e-5)


def test_prompts_of_a_step_are_a_function_of_the_step(tmp_path):
    from spectool.rl.tasks import StepPrompts
    from spectool.runs import truncate_jsonl

    class Src:
        def tasks(self, split, n):
            from spectool.data.sources import Task

            return [Task(str(i), f"q{i}", "1") for i in range(min(n, 10))]

    class Tok:
        chat_template = None

        def __call__(self, text):
            return {"input_ids": [1, 2]}

    from spectool.rl.config import load_config

    cfg = load_config(None, ["rollout.prompts_per_step=4", "policy.steps=20", "speculation.enabled=false"])
    a, b = StepPrompts(Src(), Tok(), cfg), StepPrompts(Src(), Tok(), cfg)
    assert [a.for_step(s) for s in range(6)] == [b.for_step(s) for s in range(6)]
    assert a.for_step(0) != a.for_step(1) and len(set(a.for_step(0) + a.for_step(1))) == 8  # no repeats in an epoch
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 6)))
    assert [r["step"] for r in truncate_jsonl(path, 3)] == [1, 2, 3]
    assert len(path.read_text().splitlines()) == 3


def test_cli_print_config_and_bad_keys(tmp_path):
    r = spectool("train-rl", "--print-config", "--set", "policy.lr=2e-6", "--set", "draft_refresh.mode=frozen",
                 "--set", "speculation.enabled=false")
    assert "lr: 2.0e-06" in r.stdout and "mode: frozen" in r.stdout
    r = spectool("train-rl", "--set", "policy.lrr=1", check=False)
    assert r.returncode == 2 and "policy.lrr" in r.stderr
    r = spectool("train-rl", "--set", "rollout.group_size=1", check=False)
    assert r.returncode == 2 and "rollout.group_size" in r.stderr
    r = spectool("train-rl", "--set", "draft_refresh.mode=online", "--set", "speculation.draft=null", check=False)
    assert r.returncode == 2 and "speculation.draft" in r.stderr


def test_stale_engine_weights_stop_the_job(tiny_policy):
    from spectool.errors import SpectoolError
    from spectool.rl.policy import check_engine_logprobs

    t = _trainer(tiny_policy)
    rs = _rollouts(tiny_policy, n=3)

    class Engine:  # answers with the trainer's logprobs, shifted by `shift` nats
        def __init__(self, shift):
            self.shift = shift

        def sequence_logprobs(self, prompts, responses):
            return [[x + self.shift for x in row] for row in t.logprobs(prompts, responses)]

    assert check_engine_logprobs(Engine(0.0), t, rs, 1e-3, 1)["logprob_check_max_diff"] < 1e-6
    with pytest.raises(SpectoolError, match="policy.logprob_tolerance"):
        check_engine_logprobs(Engine(0.05), t, rs, 1e-3, 7)

    class Spike(Engine):  # in sync but one token off, as bfloat16 rounding does to a token with close logits
        def sequence_logprobs(self, prompts, responses):
            rows = super().sequence_logprobs(prompts, responses)
            rows[0][0] += 0.5
            return rows

    got = check_engine_logprobs(Spike(0.0), t, rs, 0.1, 2)  # the mean decides, the max is reported
    assert got["logprob_check_max_diff"] == pytest.approx(0.5, abs=1e-4) and got["logprob_check_mean_diff"] < 0.1
    with pytest.raises(SpectoolError, match="on average"):
        check_engine_logprobs(Engine(0.15), t, rs, 0.1, 3)

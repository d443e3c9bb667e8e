"""DraftRefresher without an engine: what its hooks capture from a trainer's own forward (right-
padded with prompt lengths, TRL's left-padded rows with labels), when they stay silent (no-grad
passes, eval mode, gradient-checkpointing recomputes), duplicates, guards, the dead-drafter test,
and the trainer side of the draft probe in float32 and bfloat16."""

from __future__ import annotations

import re

import pytest
import torch


@pytest.fixture()
def policy(tiny_policy):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_policy)
    return m.train()


def _refresher(random_draft, policy, **kw):
    from spectool.draft.refresh import DraftRefresher, RefreshSettings

    return DraftRefresher.from_folder(random_draft, policy, RefreshSettings(batch_size=4, warmup_steps=0, **kw))


def _want(policy, seq, layer_ids):
    from spectool.hidden import policy_features

    aux, last = policy_features(policy, torch.tensor([seq]), layer_ids)  # [1, T, 3H], [1, T, H]
    return aux[0], last[0]


def test_right_padded_capture_equals_the_policy_features(random_draft, policy):
    r = _refresher(random_draft, policy)
    seqs = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14]]
    ids = torch.zeros(2, 6, dtype=torch.long)
    mask = torch.zeros(2, 6, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    with r.capture([3, 2]):
        policy(input_ids=ids, attention_mask=mask).logits.sum().backward()
    assert r.captured == 2
    for f, s, p in zip(r.online.buffer, seqs, [3, 2]):
        aux, last = _want(policy, s, r.draft.config.aux_layer_ids)
        assert f.ids.tolist() == s and f.prompt_len == p
        assert torch.allclose(f.aux.float(), aux, atol=2e-3) and torch.allclose(f.last.float(), last, atol=2e-3)
        assert not f.aux.requires_grad


def test_left_padded_rows_with_labels_as_trl_passes_them(random_draft, policy):
    """TRL: prompts left-padded, completions right-padded, labels -100 outside the completions."""
    r = _refresher(random_draft, policy)
    prompt = [[0, 0, 21, 22], [31, 32, 33, 34]]  # 0: padding
    comp = [[23, 24, 25], [35, 0, 0]]
    ids = torch.tensor([p + c for p, c in zip(prompt, comp)])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]])
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :4] = -100
    policy(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    got = {tuple(f.ids.tolist()): f for f in r.online.buffer}
    assert set(got) == {(21, 22, 23, 24, 25), (31, 32, 33, 34, 35)}
    assert got[(21, 22, 23, 24, 25)].prompt_len == 2 and got[(31, 32, 33, 34, 35)].prompt_len == 4
    aux, last = _want(policy, [21, 22, 23, 24, 25], r.draft.config.aux_layer_ids)
    f = got[(21, 22, 23, 24, 25)]
    assert torch.allclose(f.last.float(), last, atol=5e-3) and torch.allclose(f.aux.float(), aux, atol=5e-3)


def test_no_capture_without_grad_in_eval_or_without_response_info(random_draft, policy):
    r = _refresher(random_draft, policy)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad(), r.capture([2]):  # a logprob pass
        policy(input_ids=ids)
    policy.eval()
    with r.capture([2]):
        policy(input_ids=ids)
    policy.train()
    policy(input_ids=ids)  # neither prompt lengths nor labels: nothing says what the response is
    assert r.captured == 0 and not r.online.buffer
    with pytest.raises(Exception, match="holds no features"):
        r.refresh(1)


def test_gradient_checkpointing_and_reused_batches_capture_once(random_draft, policy):
    policy.gradient_checkpointing_enable()
    policy.config.use_cache = False
    r = _refresher(random_draft, policy)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    for _ in range(2):  # a trainer that trains twice on one generation (num_iterations = 2)
        with r.capture([2]):
            policy(input_ids=ids).logits.sum().backward()  # the backward recomputes the layers
    assert r.captured == 1 and r.duplicates == 1 and len(r.online.buffer) == 1


def test_a_draft_for_another_policy_is_refused(random_draft, tmp_path):
    from transformers import AutoModelForCausalLM

    from spectool.errors import SpectoolError

    from conftest import make_policy

    other = AutoModelForCausalLM.from_pretrained(make_policy(tmp_path / "wide", hidden=256))
    with pytest.raises(SpectoolError, match="hidden_size"):
        _refresher(random_draft, other)


def test_dead_drafter_is_told_from_a_weak_one(random_draft, policy):
    """Zero acceptance is judged against the pushed draft's agreement on the rollouts the engine
    generated after the push (captured from the next training forward), never in-sample."""
    from spectool.draft.refresh import DraftNotLive
    from spectool.stats import AcceptanceStats

    r = _refresher(random_draft, policy)
    r.expected_rate = lambda feats, W=None: 0.3  # the pushed draft agrees with the policy on 30% of position-1 tokens
    dead = AcceptanceStats(num_drafts=100, num_draft_tokens=300, num_accepted_tokens=0)
    r._pushed_at = 0
    r.check_acceptance(dead)  # nothing captured since the push: no evidence, no verdict
    with r.capture([2]):
        policy(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits.sum().backward()
    r.check_acceptance(AcceptanceStats(num_drafts=10, num_draft_tokens=30, num_accepted_tokens=0))  # 0.7^10: chance
    r.check_acceptance(AcceptanceStats(num_drafts=100, num_draft_tokens=300, num_accepted_tokens=4))
    with pytest.raises(DraftNotLive, match="accepted 0 of 100"):
        r.check_acceptance(dead)


def test_the_per_step_agreement_reads_only_the_newest_rollouts_and_a_refresh_starts_from_it(random_draft, policy):
    """fresh_agreement: the draft's position-1 agreement on the sequences captured since its last call (None when
    nothing was); a refresh right after it reuses that measurement as its `before` (one measure saved), and one
    after a capture measures again."""
    from spectool.draft.refresh import AGREEMENT_SEQS

    r = _refresher(random_draft, policy)
    assert r.fresh_agreement() is None
    g = torch.Generator().manual_seed(0)
    with r.capture([3] * 12):
        policy(input_ids=torch.randint(3, 60, (12, 10), generator=g)).logits.sum().backward()
    measured = []
    r.online.metrics = lambda feats, W, real=r.online.metrics: measured.append(len(feats)) or real(feats, W)
    a = r.fresh_agreement()
    assert 0 <= a <= 1 and measured == [min(12, AGREEMENT_SEQS)]
    assert r.fresh_agreement() is None  # nothing new
    rep = r.refresh(2)
    assert rep.top1_before[0] == a and measured == [min(12, AGREEMENT_SEQS), 4]  # only `after` measured
    with r.capture([3] * 2):
        policy(input_ids=torch.randint(3, 60, (2, 10), generator=g)).logits.sum().backward()
    r.refresh(1)
    assert measured[2:] == [4, 4]  # new rollouts since: before and after


def test_after_a_refresh_auto_measures_the_previous_draft_on_the_same_rollouts(random_draft, policy):
    """mode auto: after a refresh, fresh_agreement also measures the draft that refresh replaced, on the same newest
    sequences, per prompt (`gain`: [new, previous] agreement-length gain over 1), and leaves the new draft's weights
    as they were. A refresh that changed nothing (lr ~0) measures exactly equal pairs: the placebo books nothing."""
    from spectool.draft.ttt import chain_length

    def step(r, g):  # 2 prompts x 4 samples (a GRPO group each): 3 prompt tokens, 5 sampled
        ids = torch.randint(3, 60, (8, 8), generator=g)
        ids[:, :3] = torch.tensor([[5, 6, 7]] * 4 + [[8, 9, 10]] * 4)
        with r.capture([3] * 8):
            policy(input_ids=ids).logits.sum().backward()

    g = torch.Generator().manual_seed(0)
    r = _refresher(random_draft, policy, mode="auto", lr=5e-2)
    W = r.policy.get_output_embeddings().weight
    step(r, g)
    assert r.fresh_agreement() is not None and r.gain is None  # no refresh yet: nothing to compare
    for lr, equal in ((5e-2, False), (0.0, True)):  # lr 0: the refresh changes nothing
        for group in r.online.opt.param_groups:
            group["lr"] = lr
        r.online.sched.base_lrs = [lr]
        r.refresh(2)
        weights = {k: v.clone() for k, v in r.draft.state_dict().items()}
        step(r, g)
        newest = r.online.buffer[-8:]
        whole, per_prompt = r.online.metrics(newest, W)["top1"], [r.online.metrics(newest[i:i + 4], W) for i in (0, 4)]
        a = r.fresh_agreement()
        assert all(torch.equal(v, r.draft.state_dict()[k]) for k, v in weights.items())  # the new draft, back
        assert a == pytest.approx(whole[0])  # the pooled figure, as without the comparison
        assert [x[0] for x in r.gain] == pytest.approx([chain_length(m["top1"]) - 1 for m in per_prompt])
        assert ([x[0] for x in r.gain] == [x[1] for x in r.gain]) == equal, r.gain
    r.settings.mode, r._previous = "online", None  # the fixed cadence reads no gain: it keeps no baseline
    r.refresh(1)
    step(r, g)
    r.fresh_agreement()
    assert r.gain is None and r._previous is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_probe_tells_a_changed_draft_in_the_engine_dtype(random_draft, dtype):
    """The trainer side of the engine check: the same weights pass, trained weights are told
    apart (the check has power), and a bfloat16 copy of the weights passes a bfloat16 check."""
    import copy

    from spectool.draft.checkpoint import load_draft
    from spectool.engine.probe import compare, distinguishes

    d, _ = load_draft(random_draft)
    want = d.vllm_probe(dtype)
    assert compare({n: e.value for n, e in want.items()}, want).ok
    rounded = copy.deepcopy(d).to(torch.bfloat16).float() if dtype == "bfloat16" else d
    assert compare({n: e.value for n, e in rounded.vllm_probe(dtype).items()}, want).ok
    moved = copy.deepcopy(d)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05 * torch.randn_like(p) * p.abs().mean())  # about one refresh of movement
    new = moved.vllm_probe(dtype)
    assert distinguishes(want, new)
    stale = compare({n: e.value for n, e in want.items()}, new)
    assert not stale.ok and stale.mismatched


def test_a_checkpoint_gives_back_the_draft_its_optimizer_and_the_callers_state(random_draft, policy, tmp_path):
    """checkpoint -> restore continues training exactly where it was; a checkpoint for another
    policy or another draft shape is refused and the refresher stays as it was."""
    from spectool.draft.refresh import CHECKPOINT_STATE
    from spectool.errors import SpectoolError

    r = _refresher(random_draft, policy)
    with r.capture([3, 3]):
        policy(input_ids=torch.tensor([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17, 18]])).logits.sum().backward()
    r.refresh(3)
    folder = tmp_path / "ckpt" / "spectool-draft"
    r.checkpoint(folder, {"history": [1, 2]}, rl_step=7)
    r.checkpoint(folder, {"history": [1, 2, 3]}, rl_step=8)  # over an earlier one: replaced whole
    assert (folder / "config.json").exists() and not list(folder.parent.glob("*.tmp")) and not list(folder.parent.glob("*.old"))
    saved = {k: v.clone() for k, v in r.draft.state_dict().items()}
    moments = {i: {k: v.clone() for k, v in s.items()} for i, s in r.online.opt.state_dict()["state"].items()}
    r.refresh(2)  # trained on: weights, optimizer and step count move on
    assert r.online.steps == 5

    assert r.restore(folder) == {"history": [1, 2, 3]}
    assert all(torch.equal(v, saved[k]) for k, v in r.draft.state_dict().items()) and r.online.steps == 3
    assert all(torch.equal(v, moments[i][k]) for i, s in r.online.opt.state_dict()["state"].items() for k, v in s.items())

    st = torch.load(folder / CHECKPOINT_STATE, weights_only=False)
    for field, change, said in (("policy_fingerprint", {"vocab_size": 999}, "made for another policy (vocab_size: 999"),
                                ("weights", {"fc.weight": torch.zeros(3, 3)}, "another shape")):
        torch.save({**st, field: {**st[field], **change}}, folder / CHECKPOINT_STATE)
        with pytest.raises(SpectoolError, match=re.escape(said)):
            r.restore(folder)
        assert r.online.steps == 3


def test_a_draft_served_with_the_policys_lm_head_keeps_it(random_draft, policy):
    """vLLM serves a draft whose lm_head equals the policy's with the policy's own lm_head module: the
    refresher then freezes it and follows the policy's (never trains or pushes its own); a draft
    with its own lm_head trains it."""
    from spectool.draft.checkpoint import load_draft
    from spectool.draft.refresh import DraftRefresher, RefreshSettings

    r = _refresher(random_draft, policy)
    assert r.draft.shares_head and not r.draft.lm_head.weight.requires_grad
    assert all(p is not r.draft.lm_head.weight for p in r.online.params)
    with torch.no_grad():
        policy.lm_head.weight.mul_(1.5)  # the policy moves
    ids = torch.randint(3, policy.config.vocab_size, (2, 20))
    with r.capture([6, 6]):
        policy(input_ids=ids).logits.sum().backward()
    r.refresh(2)
    assert torch.equal(r.draft.lm_head.weight, policy.lm_head.weight)

    draft, meta = load_draft(random_draft, policy)
    with torch.no_grad():
        draft.lm_head.weight.add_(0.01)
    own = DraftRefresher(draft, policy, RefreshSettings(batch_size=4, warmup_steps=0), meta)
    assert not own.draft.shares_head and any(p is own.draft.lm_head.weight for p in own.online.params)


def test_a_reduced_vocabulary_draft_never_shares_the_policys_head(policy):
    """vLLM shares the target's lm_head only when the whole [V, H] tensors are equal (torch.equal at load): a draft
    over half the vocabulary whose rows were copied from the policy's (new_draft does) keeps its own head there, so
    the refresher trains and pushes it (it used to freeze it for nothing and drop its probe entry)."""
    from spectool.draft.checkpoint import new_draft
    from spectool.draft.refresh import DraftRefresher, RefreshSettings
    from spectool.hidden import default_aux_layer_ids

    rows = torch.arange(0, policy.config.vocab_size, 2)
    draft = new_draft(policy, rows, default_aux_layer_ids(policy.config.num_hidden_layers))
    assert torch.equal(draft.lm_head.weight, policy.lm_head.weight[rows])  # the rows are the policy's
    r = DraftRefresher(draft, policy, RefreshSettings(batch_size=4, warmup_steps=0))
    assert not r.draft.shares_head and r.draft.lm_head.weight.requires_grad
    assert any(p is r.draft.lm_head.weight for p in r.online.params)


def test_the_worker_compares_a_multimodal_targets_language_model_head():
    """vLLM shares a multimodal target's language model's lm_head (get_language_model()); a *ForConditionalGeneration
    has none of its own, so the worker's guard against writing the policy's head must look there too."""
    from spectool.engine.probe import shared_lm_head

    class Language(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = torch.nn.Linear(4, 8, bias=False)

    class Multimodal(torch.nn.Module):  # as vLLM's *ForConditionalGeneration: the head lives in the language model
        def __init__(self):
            super().__init__()
            self.language_model = Language()

        def get_language_model(self):
            return self.language_model

    mm, text = Multimodal(), Language()
    assert shared_lm_head(mm) is mm.language_model.lm_head
    assert shared_lm_head(text) is text.lm_head
    assert shared_lm_head(torch.nn.Module()) is None


def test_a_target_whose_language_model_has_no_head_shares_its_top_level_one(monkeypatch):
    """The V2 runner falls back to the target's top-level lm_head when get_language_model() has none (review 4, N15;
    0.33's muse_glimmer target): the worker's guard must find that head, or a push would write the policy's."""
    from spectool.engine.probe import shared_lm_head

    class Headless(torch.nn.Module):  # a language model without an lm_head of its own
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(4)

    class Target(torch.nn.Module):  # the head sits on the target, beside the language model
        def __init__(self):
            super().__init__()
            self.language_model, self.lm_head = Headless(), torch.nn.Linear(4, 8, bias=False)

        def get_language_model(self):
            return self.language_model

    target = Target()
    assert shared_lm_head(target) is target.lm_head
    shared = type("Draft", (), {"lm_head": target.lm_head})()  # vLLM served the draft with the target's head
    own = type("Draft", (), {"lm_head": torch.nn.Linear(4, 8, bias=False)})()  # a draft with a head of its own
    assert "lm_head.weight" not in _weights_the_guard_lets_through(target, shared, monkeypatch)
    assert "lm_head.weight" in _weights_the_guard_lets_through(target, own, monkeypatch)


class _Reached(Exception):
    """Raised where spectool_reload_draft would hand the weights to vLLM's loader: the guard has run."""


def _weights_the_guard_lets_through(target, draft, monkeypatch) -> dict:
    """The real worker_ext.spectool_reload_draft on a stand-in worker serving `draft` beside `target`, stopped where
    it would call vLLM's loader (its vllm_config): the weights it would load. vllm.config is a stand-in module here
    (importing vLLM takes ~5 s); the file's tensors come from a stand-in load_file, so what the guard popped shows."""
    import sys
    import types

    import safetensors.torch

    from spectool.engine.worker_ext import SpectoolWorkerExtension

    weights = {"lm_head.weight": torch.zeros(8, 4), "fc.weight": torch.zeros(4, 4)}
    monkeypatch.setattr(safetensors.torch, "load_file", lambda path: weights)
    fake = types.ModuleType("vllm.config")
    fake.set_current_vllm_config = None
    monkeypatch.setitem(sys.modules, "vllm", sys.modules.get("vllm") or types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.config", fake)

    class Worker(SpectoolWorkerExtension):
        model_runner = types.SimpleNamespace(get_draft_model=lambda: draft, get_model=lambda: target)

        @property
        def vllm_config(self):
            raise _Reached

    with pytest.raises(_Reached):
        Worker().spectool_reload_draft("draft.safetensors")
    return weights


@pytest.mark.engine
def test_a_push_never_changes_the_policy_in_the_engine(tiny_policy, random_draft, policy):
    """The push of a refreshed draft that vLLM serves with the policy's lm_head leaves the engine's
    policy as it was (before the fix one push moved its logprobs by 21 nats: the draft's trained
    lm_head was written into the policy's), and the push is still found in the drafter."""
    from spectool.engine.engine import Engine, EngineConfig

    from conftest import transformers_logprobs
    from served import assert_addresses_kept

    r = _refresher(random_draft, policy)
    ids = torch.randint(3, policy.config.vocab_size, (4, 24))
    with r.capture([8] * 4):
        policy(input_ids=ids).logits.sum().backward()
    r.refresh(3)
    prompt, resp = [5, 17, 33, 80, 9], [40, 41, 42, 100, 7, 8, 9, 120]
    with Engine(EngineConfig(str(tiny_policy), draft_path=str(random_draft), k=2, kv_cache_gib=1)) as engine:
        before = torch.tensor(engine.sequence_logprobs([prompt], [resp])[0])
        addresses = engine.draft_addresses()
        report = r.push(engine)
        after = torch.tensor(engine.sequence_logprobs([prompt], [resp])[0])
        assert_addresses_kept(addresses, engine.draft_addresses())  # what a CUDA graph captured stays live
    assert report.max_excess <= 1 and report.modules > 0
    assert torch.equal(before, after)
    policy.eval()
    assert (after - transformers_logprobs(policy, prompt, resp)).abs().max() < 1e-4


def test_a_refresh_step_trains_in_packed_micro_batches_the_whole_padded_batchs_gradient(random_draft, policy,
                                                                                          monkeypatch):
    """The online refresh packs a step's sequences into micro-batches of at most draft_refresh.max_batch_tokens (no
    padding: a step's memory is linear in one micro-batch, whatever the rollouts' lengths), no forward past the
    budget but a sequence longer alone, gradients accumulated. A batch within the budget trains in one packed forward,
    the padded step's gradient to float32 rounding (the refresh before); split, within a few percent of it."""
    from spectool.draft import online
    from spectool.draft.ttt import ttt_step_loss

    lengths, prompts = [40, 12, 33, 25], [5, 4, 9, 6]
    g = torch.Generator().manual_seed(0)
    r = _refresher(random_draft, policy, max_batch_tokens=64)
    ids, mask = torch.zeros(4, max(lengths), dtype=torch.long), torch.zeros(4, max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n], mask[i, :n] = torch.randint(3, 60, (n,), generator=g), 1
    with r.capture(prompts):
        policy(input_ids=ids, attention_mask=mask).logits.sum().backward()
    o, batch = r.online, r.online.buffer
    _, W = online.embeddings(policy)
    W_dv = W[o.target_ids].detach()

    def grads(step) -> list[torch.Tensor]:
        o.opt.zero_grad()
        step()
        return [p.grad.clone() for p in o.params]

    widths = []
    real = online.ttt_step_loss
    monkeypatch.setattr(online, "ttt_step_loss", lambda d, items, *a, **k: widths.append(sum(len(x[0]) for x in items))
                        or real(d, items, *a, **k))
    micro = grads(lambda: o._step_gradients(batch, W_dv))
    assert len(widths) > 1 and max(widths) <= 64 and sum(widths) == sum(lengths)  # micro-batches within the budget
    o.max_batch_tokens = 1 << 20
    whole = grads(lambda: o._step_gradients(batch, W_dv))
    padded = grads(lambda: ttt_step_loss(o.draft, [(f.ids, f.aux, f.last) for f in batch], [f.prompt_len for f in batch],
                                         W_dv, o.ttt_steps, o.step_decay, o.device, o.loss)[0].backward())
    for b, c in zip(whole, padded):  # one packed forward: the padded step's gradient
        torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-6)
    # micro-batches weighted by their response tokens: the TTT loss averages each unroll step over its own positions,
    # which a record's share weights a little otherwise (measured 1.1-1.8% of each tensor's norm here)
    off = [float((a - b).norm() / b.norm()) for a, b in zip(micro, whole)]
    assert max(off) < 0.05, off
    rep = r.refresh(1)  # and the refresh runs on it
    assert rep.steps == 1 and rep.loss == rep.loss

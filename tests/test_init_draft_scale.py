"""init-draft at data sizes that do not fit in memory (features.py): the three feature sources train the same
draft, the stream holds at most its window of shards, resumes mid-epoch and mid-write, keeps to its disk budget
shard by shard, and a step's records go through in micro-batches within a token budget."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from spectool.errors import SpectoolError

SMALL = dict(shard_tokens=64, shuffle_window=2)  # the fake harvest's 24 records in several shards and windows


def _cfg(tiny_policy, data, out, **kw):
    from spectool.commands.init_draft import InitDraftConfig

    base = dict(out=str(out), model=str(tiny_policy), data=str(data), draft_vocab_size=128, ttt_steps=3,
                epochs=2, batch_size=4, save_every=2, lr=1e-3, warmup_steps=1, **SMALL)
    base.update(kw)
    return InitDraftConfig(**base)


def _losses(folder) -> list[float]:
    return [json.loads(x)["loss"] for x in (folder / "metrics.jsonl").read_text().splitlines()]


def _weights(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _list_epoch_order(groups: list[list[int]], seed: int, epoch: int, window: int) -> list[int]:
    """epoch_order as it was written over Python lists (commit b1d9d6b): a resumed older run draws the same order."""
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    if len(groups) > window:
        groups = [groups[i] for i in torch.randperm(len(groups), generator=g).tolist()]
    order: list[int] = []
    for w in range(0, len(groups), window):
        members = sorted(i for grp in groups[w : w + window] for i in grp)
        order += [members[i] for i in torch.randperm(len(members), generator=g).tolist()]
    return order


def test_epoch_order_is_a_seeded_permutation_shuffled_within_windows():
    from spectool.features import epoch_order, token_groups

    lengths = [10] * 40
    groups = token_groups(list(range(40)), np.array(lengths), 50)  # 8 groups of 5
    assert [len(g) for g in groups] == [5] * 8 and groups.members.tolist() == list(range(40))
    a = epoch_order(groups, seed=0, epoch=1, window=2).tolist()
    assert sorted(a) == list(range(40)) and a == epoch_order(groups, 0, 1, 2).tolist()
    assert a != epoch_order(groups, 0, 2, 2).tolist()
    for w in range(4):  # each window of 10 records holds exactly two whole groups
        window = set(a[10 * w : 10 * (w + 1)])
        assert sum(set(g.tolist()) <= window for g in groups) == 2
    # one window: the whole-data permutation the first release drew (old runs resume in their own order)
    g = torch.Generator().manual_seed(0 * 1000 + 3)
    assert epoch_order(groups, 0, 3, window=8).tolist() == torch.randperm(40, generator=g).tolist()
    # more groups than the window: the order the list-based epoch_order drew before the indexes became arrays
    assert epoch_order(groups, 0, 1, 2).tolist() == _list_epoch_order([g.tolist() for g in groups], 0, 1, 2)


def test_a_stream_holds_at_most_its_window_of_shards(tiny_policy, fake_harvest, tmp_path):
    from transformers import AutoModelForCausalLM

    from spectool.features import Streamed, epoch_order, token_groups, write_shards
    from spectool.hidden import default_aux_layer_ids
    from spectool.records import load_records

    policy = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32).eval()
    recs = load_records(fake_harvest)
    seqs = [p + r for p, r in zip(recs["prompt_ids"], recs["response_ids"])]
    groups = token_groups(list(range(len(seqs))), np.array([len(s) for s in seqs]), 64)
    layers = default_aux_layer_ids(policy.config.num_hidden_layers)
    shards = write_shards(policy, groups, seqs.__getitem__, layers, tmp_path / "f", None)
    assert len(shards) == len(groups) >= 4
    s = Streamed(shards, window=2)
    for b in range(0, len(seqs), 4):
        items = s.items(epoch_order(groups, 0, 0, 2)[b : b + 4])
        assert len(s.loaded) <= 2 and all(len(x[0]) > 0 for x in items)
    assert s.reads == len(groups)  # each shard read once an epoch


def test_every_feature_source_trains_the_same_draft(tiny_policy, fake_harvest, tmp_path):
    from spectool.commands.init_draft import run

    runs = {m: run(_cfg(tiny_policy, fake_harvest, tmp_path / m, features=m)) for m in ("cache", "stream", "online")}
    assert len(list((tmp_path / "stream" / ".train" / "features").glob("shard-*.safetensors"))) >= 2
    assert not (tmp_path / "online" / ".train" / "features").exists() and runs["online"].feature_cache_bytes == 0
    assert (tmp_path / "cache" / ".train" / "features.safetensors").exists()
    base = _weights(tmp_path / "cache")
    for m in ("stream", "online"):
        assert _losses(tmp_path / m) == pytest.approx(_losses(tmp_path / "cache"), rel=1e-4)
        w = _weights(tmp_path / m)
        assert all(torch.allclose(w[k].float(), base[k].float(), atol=1e-4) for k in base)
        assert runs[m].heldout["top1"] == pytest.approx(runs["cache"].heldout["top1"], abs=1e-3)


def test_a_stream_resumes_mid_epoch_and_mid_write_as_if_never_stopped(tiny_policy, fake_harvest, tmp_path, monkeypatch):
    import spectool.draft.ttt as ttt
    import spectool.features as features
    from spectool.commands.init_draft import run

    whole = run(_cfg(tiny_policy, fake_harvest, tmp_path / "whole", epochs=3))

    saves = {"n": 0}
    orig_save = features.save_features

    def dies_on_third_shard(*a, **k):
        saves["n"] += 1
        if saves["n"] == 3:
            raise KeyboardInterrupt
        return orig_save(*a, **k)

    monkeypatch.setattr(features, "save_features", dies_on_third_shard)
    out = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        run(_cfg(tiny_policy, fake_harvest, out, epochs=3))
    assert len(list((out / ".train" / "features").glob("shard-*"))) == 2  # whole shards only, kept
    monkeypatch.setattr(features, "save_features", orig_save)

    calls = {"n": 0}
    orig_loss = ttt.ttt_loss

    def dies_in_step_10(*a, **k):  # mid-epoch 2 (steps 7-12), after the checkpoint at step 8
        calls["n"] += 1
        if calls["n"] == 10:
            raise KeyboardInterrupt
        return orig_loss(*a, **k)

    monkeypatch.setattr(ttt, "ttt_loss", dies_in_step_10)
    with pytest.raises(KeyboardInterrupt):
        run(_cfg(tiny_policy, fake_harvest, out, epochs=3))
    monkeypatch.setattr(ttt, "ttt_loss", orig_loss)
    assert len(_losses(out)) == 9  # steps 1-9 logged; 9 is redone from the checkpoint at 8
    resumed = run(_cfg(tiny_policy, fake_harvest, out, epochs=3))
    assert resumed.steps == whole.steps and whole.steps // 3 == 6  # 6 steps an epoch: step 9 is mid-epoch 2
    assert _losses(out) == pytest.approx(_losses(tmp_path / "whole"), rel=1e-5)


def test_the_disk_budget_holds_shard_by_shard_and_online_finishes_the_run(tiny_policy, fake_harvest, tmp_path,
                                                                          monkeypatch):
    import shutil

    import spectool.features as features
    from spectool.commands.init_draft import run

    real = shutil.disk_usage
    writes = {"n": 0}
    orig_save = features.save_features

    def counted(*a, **k):
        writes["n"] += 1
        return orig_save(*a, **k)

    def shrinking(path):  # the disk fills up (another job) after the second shard
        u = real(path)
        return u._replace(free=u.free if writes["n"] < 2 else 100)

    monkeypatch.setattr(features, "save_features", counted)
    monkeypatch.setattr(features.shutil, "disk_usage", shrinking)
    out = tmp_path / "d"
    with pytest.raises(SpectoolError, match=r"feature shard 3 of \d+ .* would go past the 0.00 GiB free .* "
                                            r"kept for a resume\); --features online"):
        run(_cfg(tiny_policy, fake_harvest, out))
    assert len(list((out / ".train" / "features").glob("shard-*"))) == 2
    monkeypatch.setattr(features.shutil, "disk_usage", real)
    r = run(_cfg(tiny_policy, fake_harvest, out, features="online"))  # the same run resumes without disk
    assert r.features == "online" and [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] \
        == list(range(1, r.steps + 1))


def test_micro_batches_bound_every_forward_and_train_like_the_whole_batch(tiny_policy, tmp_path, monkeypatch):
    import spectool.commands.init_draft as init_draft

    from conftest import write_fake_harvest

    data = write_fake_harvest(tiny_policy, tmp_path / "h", n=24, max_new_tokens=12, prompt_pad=20)  # 16..56 tokens
    whole = init_draft.run(_cfg(tiny_policy, data, tmp_path / "whole", features="cache", epochs=1))
    shapes = []
    orig = init_draft.ttt_step_loss

    def seen(draft, items, *a, **k):
        shapes.append((len(items), sum(len(x[0]) for x in items), k.get("pack")))  # the packed row's records, tokens
        return orig(draft, items, *a, **k)

    monkeypatch.setattr(init_draft, "ttt_step_loss", seen)
    split = init_draft.run(_cfg(tiny_policy, data, tmp_path / "split", features="cache", epochs=1, max_batch_tokens=64))
    assert len(shapes) > split.steps and all((n <= 64 or b == 1) and pack for b, n, pack in shapes)
    a, b = _losses(tmp_path / "whole"), _losses(tmp_path / "split")
    assert b == pytest.approx(a, rel=0.05) and b[-1] < b[0]
    assert split.heldout["top1"] == pytest.approx(whole.heldout["top1"], abs=0.05)


def test_bad_scale_settings_are_refused_by_name(tiny_policy, fake_harvest, tmp_path):
    from spectool.commands.init_draft import run

    for kw, flag in ((dict(features="ram"), "--features"), (dict(shard_tokens=0), "--shard-tokens"),
                     (dict(shuffle_window=0), "--shuffle-window"), (dict(max_batch_tokens=1), "--max-batch-tokens"),
                     (dict(max_steps=0), "--max-steps")):
        with pytest.raises(SpectoolError, match=flag):
            run(_cfg(tiny_policy, fake_harvest, tmp_path / "d", **kw))
        assert not (tmp_path / "d").exists()


def test_a_harvest_of_1000_token_records_trains_in_bounded_forwards(tiny_policy, tmp_path, monkeypatch):
    """Reasoning-length records (1,104 and 1,404 tokens; random ids: the tiny policy's own generate is slow) train
    with every forward within --max-batch-tokens, no padding in the one-record micro-batches, and the report
    names the longest sequence."""
    import spectool.commands.init_draft as init_draft
    from spectool.models import resolve_model
    from spectool.records import write_shard
    from spectool.runs import MANIFEST, atomic_write_json, make_manifest

    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(12):
        n = 1100 + 300 * (i % 2)
        resp = torch.randint(5, 500, (n,), generator=g).tolist()
        rows.append(dict(prompt_id=f"{i:016x}", sample_idx=0, prompt="p", answer="", prompt_ids=[1, 3 + i, 40, 4],
                         response_ids=resp, logprobs=[0.0] * n, reward=0.0, finish_reason="length", response=""))
    run_dir = tmp_path / "harvest"
    write_shard(run_dir, 0, rows)
    m = resolve_model(str(tiny_policy))
    atomic_write_json(run_dir / MANIFEST, make_manifest("harvest", model=m.name, model_identity=m.identity, data="x"))
    shapes = []
    orig = init_draft.ttt_step_loss

    def seen(draft, items, *a, **k):
        shapes.append((len(items), max(len(x[0]) for x in items)))
        return orig(draft, items, *a, **k)

    monkeypatch.setattr(init_draft, "ttt_step_loss", seen)
    r = init_draft.run(_cfg(tiny_policy, run_dir, tmp_path / "d", epochs=1, max_batch_tokens=2048,
                            shard_tokens=4096))
    assert r.longest_sequence == 1404 and r.steps >= 2
    assert shapes and all(b == 1 and t >= 1104 for b, t in shapes)  # each record alone: 2 x 1,104 > 2,048
    lines = [json.loads(x) for x in (tmp_path / "d" / "metrics.jsonl").read_text().splitlines()]
    assert all(x["padding"] == 0 and x["peak_memory_gib"] > 0 and x["loss"] == x["loss"] for x in lines)


def test_a_steps_micro_batches_add_up_to_the_whole_batchs_loss_and_gradient(monkeypatch):
    """train_step's weighting, exactly: with a loss that is a mean over the batch's response tokens (a stand-in for
    the TTT loss, whose anchors move with the micro-batch's prompts, so only the test above can compare that one),
    the micro-batches' weighted losses and accumulated gradient equal the whole batch's. Fails on an unweighted or
    equally weighted accumulation."""
    import contextlib
    import types

    import torch

    import spectool.commands.init_draft as init_draft

    w = torch.nn.Parameter(torch.tensor([0.5, -1.0, 0.25]))

    def response_mean(draft, items, prompt_lens, *a, **k):  # items: (ids [T], features [T, 3])
        per = torch.cat([(x[1][p:] @ w) ** 2 for x, p in zip(items, prompt_lens)])  # [response tokens]
        return per.mean(), [float(per.mean())]

    class Trainer:  # DraftTrainer's surface that train_step uses
        draft = None
        acc = types.SimpleNamespace(device=torch.device("cpu"), no_sync=lambda d: contextlib.nullcontext())

        def backward(self, loss):
            loss.backward()

        def finish(self):
            pass

    g = torch.Generator().manual_seed(0)
    lengths, prompts = [9, 40, 17, 61, 12, 33], [3, 5, 4, 6, 2, 7]  # response tokens 6..55: unequal shares
    items = [(torch.zeros(n, dtype=torch.long), torch.randn(n, 3, generator=g)) for n in lengths]
    results, calls = [], []
    monkeypatch.setattr(init_draft, "ttt_step_loss", lambda *a, **k: calls.append(1) or response_mean(*a, **k))
    for budget in (4096, 64):  # the whole batch in one forward; then micro-batches of <= 64 tokens
        w.grad = None
        cfg = types.SimpleNamespace(max_batch_tokens=budget, ttt_steps=1, step_decay=0.8, loss="ce", anchor_fraction=1.0,
                                    position_weights="decay", draft_dtype="float32",
                                    recompute_loss=False)
        loss, _, _ = init_draft.train_step(cfg, Trainer(), items, prompts, None, g)
        results.append((loss, w.grad.clone(), len(calls)))
    (whole, g_whole, n_whole), (split, g_split, n_split) = results
    assert n_whole == 1 and n_split - n_whole > 2  # the budget did split the batch
    assert split == pytest.approx(whole, rel=1e-6)
    torch.testing.assert_close(g_split, g_whole, rtol=1e-5, atol=1e-7)

"""Features that cannot be mixed up (features.py, issue 55 H2 and L5): a stream's shards carry the records they hold
and sit beside a manifest of what they were computed from, so a shard of another harvest is computed again, never
trained on; a truncated shard and a full disk meet a message naming the fix with nothing half-written; a resumed
init-draft over a changed harvest is refused; the per-record indexes are arrays. No policy, no engine: the
features are stand-ins whose ids are the records' tokens (what a stale shard would get wrong)."""

from __future__ import annotations

import errno
import json
import os
import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from spectool.errors import SpectoolError

H = 4
POLICY = SimpleNamespace(config=SimpleNamespace(hidden_size=H))  # write_shards reads the hidden size only
LAYERS = [1, 2, 3]


def _item(ids: list[int]):
    """A stand-in FeatureItem: (ids [T], aux [T, 3H], last [T, H])."""
    return torch.tensor(ids), torch.zeros(len(ids), 3 * H), torch.zeros(len(ids), H)


@pytest.fixture
def computed(monkeypatch) -> list[list[int]]:
    """The policy's forward replaced by stand-in items; returns the sequences each call computed."""
    import spectool.features as features

    calls: list[list[int]] = []

    def fake(policy, seqs, layer_ids, **k):
        calls.append([len(s) for s in seqs])
        return [_item(s) for s in seqs]

    monkeypatch.setattr(features, "feature_items", fake)
    return calls


def _ids(shards, records) -> list[list[int]]:
    from spectool.features import Streamed

    return [x[0].tolist() for x in Streamed(shards, 1).items(records)]


def test_a_shard_left_by_an_earlier_harvest_is_not_trained_on(tmp_path, computed):
    """The audit's stale_shard.py: a shard an earlier harvest left under the same name was reused for whatever
    records the group now holds (before: record 0 -> [1, 2, 3], the old record's tokens)."""
    from spectool.features import write_shards
    from spectool.hidden import save_features

    d = tmp_path / "features"
    d.mkdir()
    save_features(d / "shard-00000.safetensors", [_item([1, 2, 3]), _item([4, 5])])  # an older harvest's records
    now = {0: [9, 9, 9, 9, 9, 9], 1: [8, 8]}  # the harvest as it is now
    shards = write_shards(POLICY, [[0, 1]], now.__getitem__, LAYERS, d, None)
    assert _ids(shards, [0, 1]) == [now[0], now[1]]


def test_shards_of_records_with_the_same_lengths_are_told_apart_by_the_manifest(tmp_path, computed):
    """Same record indices and lengths, another harvest (a re-run whose responses all stopped at max_tokens): only
    the manifest's harvest identity tells them apart; every shard is computed again, and a resume with the same
    inputs keeps them all."""
    from spectool.features import MANIFEST, Groups, write_shards

    d, groups = tmp_path / "features", Groups.of([[0, 1], [2]])
    old, new = {0: [1, 2, 3], 1: [4, 5], 2: [6]}, {0: [7, 7, 7], 1: [8, 8], 2: [9]}
    ident = {"harvest": "aaaa", "records": 3, "shard_tokens": 5, "policy": "p"}
    lengths = np.array([3, 2, 1])
    write_shards(POLICY, groups, old.__getitem__, LAYERS, d, None, lengths=lengths, identity=ident)
    assert json.loads((d / MANIFEST).read_text()) == {"kind": "features", **ident, "layer_ids": LAYERS,
                                                      "groups": groups.digest()}
    meta = {"records": "[0, 1]", "lengths": "[3, 2]"}
    from safetensors import safe_open

    with safe_open(str(d / "shard-00000.safetensors"), "pt") as f:
        assert f.metadata() == meta
    computed.clear()
    shards = write_shards(POLICY, groups, new.__getitem__, LAYERS, d, None, lengths=lengths,
                          identity={**ident, "harvest": "bbbb"})
    assert _ids(shards, [0, 1, 2]) == [[7, 7, 7], [8, 8], [9]] and len(computed) == 2
    computed.clear()
    write_shards(POLICY, groups, new.__getitem__, LAYERS, d, None, lengths=lengths, identity={**ident, "harvest": "bbbb"})
    assert computed == []  # a resume with the same inputs reads what is there


def test_a_shard_of_other_records_or_a_truncated_one_is_computed_again(tmp_path, computed, capsys):
    from spectool.features import write_shards

    d, seqs = tmp_path / "features", {0: [1, 2], 1: [3], 2: [4, 5, 6], 3: [7]}
    groups = [[0, 1], [2], [3]]
    write_shards(POLICY, groups, seqs.__getitem__, LAYERS, d, None)
    (d / "shard-00001.safetensors").write_bytes((d / "shard-00000.safetensors").read_bytes())  # records 0, 1
    blob = (d / "shard-00002.safetensors").read_bytes()
    (d / "shard-00002.safetensors").write_bytes(blob[: len(blob) // 2])  # a truncated file
    computed.clear()
    shards = write_shards(POLICY, groups, seqs.__getitem__, LAYERS, d, None)
    assert computed == [[3], [1]]  # shard 1 and shard 2, each computed again; shard 0 kept
    assert _ids(shards, [0, 1, 2, 3]) == [[1, 2], [3], [4, 5, 6], [7]]
    out = capsys.readouterr().out
    assert "shard-00001.safetensors does not fit: its lengths, records differ" in out
    assert "shard-00002.safetensors does not fit: it cannot be read" in out


def test_a_shard_that_breaks_during_training_names_the_fix(tmp_path, computed):
    from spectool.features import Streamed, write_shards

    d = tmp_path / "features"
    shards = write_shards(POLICY, [[0], [1]], {0: [1, 2], 1: [3]}.__getitem__, LAYERS, d, None)
    (d / "shard-00001.safetensors").write_bytes(b"\x08\x00")  # truncated after the check
    s = Streamed(shards, 1)
    assert s.items([0])[0][0].tolist() == [1, 2]
    with pytest.raises(SpectoolError, match=r"shard-00001.safetensors cannot be read .*: delete it and rerun the same "
                                            r"command .* or resume with --features online"):
        s.items([1])


def test_a_harvest_shard_that_cannot_be_read_names_the_fix(tmp_path):
    from spectool.features import harvest_shards
    from spectool.hidden import save_features

    (tmp_path / "hidden").mkdir()
    save_features(tmp_path / "hidden" / "shard-00000.safetensors", [_item([1, 2]), _item([3])])
    assert len(harvest_shards(tmp_path, LAYERS, {"aux_layer_ids": LAYERS}, np.array([2, 1]))) == 1
    p = tmp_path / "hidden" / "shard-00000.safetensors"
    p.write_bytes(p.read_bytes()[:-8])
    with pytest.raises(SpectoolError, match=r"--hidden-states shard .* cannot be read .*: harvest again with "
                                            r"--hidden-states into a new --out, or move .*hidden away"):
        harvest_shards(tmp_path, LAYERS, {"aux_layer_ids": LAYERS}, np.array([2, 1]))


def test_a_full_disk_keeps_nothing_of_the_shard_and_names_the_fix(tmp_path, computed, monkeypatch):
    """The disk fills during the third shard's write (the budget check passed: another job took the space). The
    real atomic writer runs: the shard's temporary file goes, the two before it stay, and a rerun finishes."""
    import spectool.features as features

    real_fsync, real_save, writes = os.fsync, features.save_features, {"n": 0}

    def counted(*a, **k):
        writes["n"] += 1
        return real_save(*a, **k)

    def fsync(fd):
        if writes["n"] == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(features, "save_features", counted)
    monkeypatch.setattr(os, "fsync", fsync)
    d, seqs = tmp_path / "features", {i: [i + 1] * (i + 1) for i in range(4)}
    with pytest.raises(SpectoolError, match=r"the disk filled while writing .*shard-00002.safetensors \(No space "
                                            r"left on device\): nothing of it was kept, the 2 shards before it were "
                                            r".*; --features online .* takes no disk"):
        features.write_shards(POLICY, [[0], [1], [2], [3]], seqs.__getitem__, LAYERS, d, None)
    assert sorted(p.name for p in d.iterdir()) == ["manifest.json", "shard-00000.safetensors", "shard-00001.safetensors"]
    monkeypatch.setattr(os, "fsync", real_fsync)
    computed.clear()
    shards = features.write_shards(POLICY, [[0], [1], [2], [3]], seqs.__getitem__, LAYERS, d, None)
    assert computed == [[3], [4]] and _ids(shards, [3]) == [[4, 4, 4, 4]]


def _hand_made_harvest(run, prompts: int, model_identity: str = "m"):
    """A harvest run dir whose records are written by hand (no policy): prompt i has i + 1 response tokens."""
    from spectool.records import write_shard
    from spectool.runs import MANIFEST, atomic_write_json, make_manifest

    rows = [dict(prompt_id=f"{i:016x}", sample_idx=0, prompt="p", answer="", prompt_ids=[1, 2], response_ids=[5] * (i + 1),
                 logprobs=[0.0] * (i + 1), reward=0.0, finish_reason="length", response="") for i in range(prompts)]
    write_shard(run, len(list((run / "records").glob("*.parquet"))) if (run / "records").exists() else 0, rows)
    atomic_write_json(run / MANIFEST, make_manifest("harvest", model="m", model_identity=model_identity, data="x"))
    return run


def test_a_resumed_init_draft_over_a_changed_harvest_is_refused(tmp_path):
    """init_draft.json records the harvest's identity; a rerun of the same command over the harvest grown in its
    folder is refused (and stays refused: the claim keeps the recorded identity), over the harvest as it was it
    resumes. The steps of init-draft's setup that decide it, without a policy."""
    from spectool.commands.init_draft import InitDraftConfig, check_harvest, claim_out, training_data

    harvest, out = _hand_made_harvest(tmp_path / "h", 8), tmp_path / "d"
    cfg = InitDraftConfig(out=str(out), model="m", data=str(harvest))
    model = SimpleNamespace(identity="m", path="m", fingerprint={})

    def setup():  # what _setup does on the main process, in its order
        recorded = claim_out(cfg)
        check_harvest(cfg, training_data(cfg, model), recorded)

    setup()
    first = json.loads((out / "init_draft.json").read_text())["harvest_identity"]
    assert first and len(first) == 16
    setup()  # the same harvest: resumes
    kept = (harvest / "records" / "shard-00000.parquet").read_bytes()
    _hand_made_harvest(harvest, 4)  # the harvest grown in its folder (a second records shard)
    for _ in range(2):
        with pytest.raises(SpectoolError, match=r"--out .* was trained on harvest .* as it was then .*; it has "
                                                r"changed since .*Pick a new --out"):
            setup()
    (harvest / "records" / "shard-00001.parquet").unlink()
    assert (harvest / "records" / "shard-00000.parquet").read_bytes() == kept
    setup()  # restored: resumes
    assert json.loads((out / "init_draft.json").read_text())["harvest_identity"] == first


def test_the_indexes_take_tens_of_bytes_a_record():
    """The per-record indexes init-draft holds (lengths, prompt lengths, the training split, the shuffle groups,
    Streamed's where-is-it with a path a shard, one epoch's order) at 100,000 records: arrays, 49 bytes a record
    here, held under 64 (Python lists and dicts took 255 a record at 1,000,000: benchmarks/index_memory.py)."""
    from spectool.features import Streamed, epoch_order, token_groups

    n, g = 100_000, np.random.default_rng(0)
    tracemalloc.start()
    try:
        lengths = g.integers(200, 8000, n).astype(np.int64)
        prompt_lens = lengths // 4
        train = np.arange(n, dtype=np.int32)
        groups = token_groups(train, lengths, 32768)
        s = Streamed([(f"/runs/draft/.train/features/shard-{k:05d}.safetensors", grp) for k, grp in enumerate(groups)], 4)
        order = epoch_order(groups, 0, 0, 4)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert sorted(order.tolist()) == train.tolist() and s.shard_of[order[0]] >= 0 and prompt_lens.dtype == np.int64
    assert held / n < 64, f"{held / n:.0f} bytes a record"


@pytest.mark.parametrize("source", ["stream", "cache"])
def test_init_drafts_features_of_a_changed_harvest_are_computed_again(tmp_path, monkeypatch, source, capsys):
    """init-draft's own feature handling (`training_features`) over a harvest re-run in its folder with the same lengths: the
    stream's manifest and the cache's metadata carry the harvest's identity, so the old features are computed again,
    not read for the new records (a record's features hold its own tokens). Checked below the resume refusal, as a
    run that recorded no harvest identity (an older spectool's) would meet it."""
    import spectool.features as features
    import spectool.hidden as hidden
    from spectool.commands.init_draft import InitDraftConfig, training_data, training_features

    def fake(policy, seqs, layer_ids, **k):
        return [_item(s) for s in seqs]

    monkeypatch.setattr(features, "feature_items", fake)
    monkeypatch.setattr(hidden, "feature_items", fake)
    policy = SimpleNamespace(config=POLICY.config, parameters=lambda: iter([torch.zeros(1)]))
    model = SimpleNamespace(identity="m", path="m", fingerprint={})
    harvest = _hand_made_harvest(tmp_path / "h", 8)
    cfg = InitDraftConfig(out=str(tmp_path / "d"), model="m", data=str(harvest), features=source, shard_tokens=8)

    def ids(data) -> list[list[int]]:
        feats = training_features(cfg, policy, data, LAYERS, tmp_path / "d" / ".train")
        return [x[0].tolist() for x in feats.train.items(data.train)]

    before = training_data(cfg, model)
    assert ids(before) == [before.seq(i) for i in before.train]
    capsys.readouterr()
    from spectool.records import write_shard

    # the harvest re-run in its folder: other tokens, the same lengths (only its identity tells them apart)
    write_shard(harvest, 0, [dict(prompt_id=f"{i:016x}", sample_idx=0, prompt="p", answer="", prompt_ids=[3, 3],
                                  response_ids=[6] * (i + 1), logprobs=[0.0] * (i + 1), reward=0.0,
                                  finish_reason="length", response="") for i in range(8)])
    after = training_data(cfg, model)
    assert after.identity != before.identity and list(after.train) == list(before.train)
    assert ids(after) == [after.seq(i) for i in after.train]
    assert " not used: " in capsys.readouterr().out

"""Features that cannot be mixed up (features.py, issue 55 H2 and L5): a stream's shards carry the records they hold
and sit beside a manifest of what they were computed from, so a shard of another harvest is computed again, never
trained on; a truncated shard and a full disk meet a message naming the fix with nothing half-written; a resumed
init-draft over a changed harvest is refused; the per-record indexes are arrays. No policy, no engine: the
features are stand-ins whose ids are the records' tokens (what a stale shard would get wrong)."""

from __future__ import annotations

import errno
import json
import os
import re
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

    from spectool.hidden import CONTENT

    with safe_open(str(d / "shard-00000.safetensors"), "pt") as f:
        have = f.metadata()
    assert {k: v for k, v in have.items() if k != CONTENT} == meta and len(have[CONTENT]) == 16
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
    out = capsys.readouterr().err
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
    manifest = {"aux_layer_ids": LAYERS, "model_weights": "w"}
    assert len(harvest_shards(tmp_path, LAYERS, manifest, np.array([2, 1]), weights="w")) == 1
    p = tmp_path / "hidden" / "shard-00000.safetensors"
    p.write_bytes(p.read_bytes()[:-8])
    with pytest.raises(SpectoolError, match=r"--hidden-states shard .* cannot be read .*: harvest again with "
                                            r"--hidden-states into a new --out, or move .*hidden away"):
        harvest_shards(tmp_path, LAYERS, manifest, np.array([2, 1]), weights="w")


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
    from spectool.commands.init_draft import InitDraftConfig, check_harvest, claim_out
    from spectool.commands.init_draft_inputs import training_data

    harvest, out = _hand_made_harvest(tmp_path / "h", 8), tmp_path / "d"
    cfg = InitDraftConfig(out=str(out), model="m", data=str(harvest))
    model = SimpleNamespace(identity="m", path="m", fingerprint={}, weights="w")

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
    from spectool.commands.init_draft import InitDraftConfig
    from spectool.commands.init_draft_inputs import training_data, training_features

    def fake(policy, seqs, layer_ids, **k):
        return [_item(s) for s in seqs]

    monkeypatch.setattr(features, "feature_items", fake)
    monkeypatch.setattr(hidden, "feature_items", fake)
    policy = SimpleNamespace(config=POLICY.config, parameters=lambda: iter([torch.zeros(1)]))
    model = SimpleNamespace(identity="m", path="m", fingerprint={}, weights="w")
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
    assert " not used: " in capsys.readouterr().err


# --- features tied to the policy's weights (issue 63: the audit 2026-11c's H1, F4 and L4) ---------------------------


def _weights_folder(folder, tensors: dict, files: int = 1, metadata: dict | None = None):
    """A policy folder's weights by hand: `tensors` split over `files` safetensors files, in reverse name order."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for p in folder.glob("*.safetensors"):
        p.unlink()
    names = sorted(tensors, reverse=True)
    for n in range(files):
        save_file({k: tensors[k] for k in names[n::files]}, str(folder / f"model-{n:05d}-of-{files:05d}.safetensors"),
                  metadata=metadata)
    return folder


def test_the_weights_digest_changes_with_any_dense_tensor_change_and_not_with_a_rewrite(tmp_path):
    """models.weights_digest: another checkpoint's weights (one tensor changed densely, or one small tensor's one
    element) give another digest; the same tensors written again in other files, order and metadata give the same.
    Its stated limit holds too: one element between the sampled windows of a large tensor goes unseen."""
    from spectool.models import WEIGHT_WINDOWS, WINDOW_BYTES, weights_digest

    g = torch.Generator().manual_seed(0)
    t = {"model.embed_tokens.weight": torch.randn(512, 256, generator=g),  # 512 KiB: read in windows
         "model.norm.weight": torch.ones(256), "lm_head.weight": torch.randn(512, 256, generator=g)}
    d = _weights_folder(tmp_path / "p", t)
    base = weights_digest(d)
    assert len(base) == 16
    assert weights_digest(_weights_folder(d, t, files=2, metadata={"format": "pt"})) == base  # rewritten, resharded
    step = {**t, "lm_head.weight": t["lm_head.weight"] + 1e-3 * torch.randn(512, 256, generator=g)}  # a dense step
    assert weights_digest(_weights_folder(d, step)) != base
    norm = {**t, "model.norm.weight": t["model.norm.weight"].clone().index_fill_(0, torch.tensor([7]), 2.0)}
    assert weights_digest(_weights_folder(d, norm)) != base  # a small tensor is read whole
    # the limit (its docstring, docs/drafters.md): a sparse edit between the windows keeps the digest
    size = 512 * 256 * 4
    gap = (size - WINDOW_BYTES) // (WEIGHT_WINDOWS - 1)  # window i starts at i * gap
    sparse = t["lm_head.weight"].clone()
    sparse.view(-1)[(WINDOW_BYTES + gap // 2) // 4] += 1.0  # inside the gap after window 0
    assert weights_digest(_weights_folder(d, {**t, "lm_head.weight": sparse})) == base
    for i in (1, WEIGHT_WINDOWS // 2, WEIGHT_WINDOWS - 1):  # each window is read: one element in it is seen
        one = t["lm_head.weight"].clone()
        one.view(-1)[(i * gap + WINDOW_BYTES // 2) // 4] += 1.0
        assert weights_digest(_weights_folder(d, {**t, "lm_head.weight": one})) != base, i
    # a pytorch_model.bin folder (no header): its bytes' windows; none at all: refused
    b = tmp_path / "bin"
    b.mkdir()
    torch.save(t, b / "pytorch_model.bin")
    first = weights_digest(b)
    torch.save(step, b / "pytorch_model.bin")
    assert weights_digest(b) != first
    with pytest.raises(SpectoolError, match=r"--model .*empty: no weights files \(\*.safetensors or "
                                            r"pytorch_model\*.bin\) .*save the model there with save_pretrained"):
        weights_digest((tmp_path / "empty"))


def test_the_weights_digest_tells_the_same_bytes_in_another_dtype_apart(tmp_path):
    """A tensor whose bytes, name and shape are another checkpoint's but whose dtype is not (float16 read as bfloat16:
    other numbers, other features) is other weights."""
    from spectool.models import weights_digest

    half = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)).half()
    as_half = weights_digest(_weights_folder(tmp_path / "f16", {"w": half}))
    as_bf16 = weights_digest(_weights_folder(tmp_path / "bf16", {"w": half.view(torch.bfloat16)}))
    assert as_half != as_bf16 and as_half == weights_digest(_weights_folder(tmp_path / "again", {"w": half.clone()}))


def test_a_harvests_identity_reads_its_hidden_state_shards_contents(tmp_path):
    """features.harvest_identity over a harvest's --hidden-states shards: one added, one rewritten at the same size
    with other features (another checkpoint's), one removed: each gives another identity (the audit's F4 mutant,
    which hashes none of them, and its L4: name and size only, keeps it)."""
    from spectool.features import harvest_identity
    from spectool.hidden import save_features

    harvest = _hand_made_harvest(tmp_path / "h", 4)
    bare = harvest_identity(harvest)
    (harvest / "hidden").mkdir()
    p = harvest / "hidden" / "shard-00000.safetensors"
    save_features(p, [_item([1, 2]), _item([3])])
    added = harvest_identity(harvest)
    size = p.stat().st_size
    ones = [(x[0], x[1] + 1, x[2] + 1) for x in (_item([1, 2]), _item([3]))]  # same shapes, other values
    save_features(p, ones)
    assert p.stat().st_size == size
    rewritten = harvest_identity(harvest)
    p.unlink()
    assert len({bare, added, rewritten}) == 3 and harvest_identity(harvest) == bare


def test_a_feature_shard_changed_in_place_is_computed_again(tmp_path, computed, capsys):
    """The audit's E5: a shard's feature bytes zeroed in place, its header (records, lengths) intact, was reused. Its
    tensors' digest (hidden.CONTENT, in its metadata) tells; the shard is computed again, the others kept."""
    from spectool.features import write_shards

    d, seqs = tmp_path / "features", {0: [1, 2], 1: [3], 2: [4, 5, 6]}
    write_shards(POLICY, [[0, 1], [2]], seqs.__getitem__, LAYERS, d, None)
    p = d / "shard-00000.safetensors"
    blob = bytearray(p.read_bytes())
    blob[-16:] = bytes([0xFF]) * 16  # the tail of the feature data (the stand-ins' zeros become NaNs)
    p.write_bytes(bytes(blob))
    computed.clear()
    write_shards(POLICY, [[0, 1], [2]], seqs.__getitem__, LAYERS, d, None)
    assert computed == [[2, 1]]  # shard 0 only
    assert "shard-00000.safetensors does not fit: its tensors changed after it was written" in capsys.readouterr().err
    assert p.read_bytes() != bytes(blob)


@pytest.mark.parametrize("source", ["stream", "cache"])
def test_features_of_other_policy_weights_are_computed_again(tmp_path, monkeypatch, source, capsys):
    """The same harvest, the same policy shapes, other weights (--model's folder holds the next RL checkpoint):
    init-draft's features (a cache of the policy's forward) are computed again, with a line on stderr saying why;
    the same weights read them as they are. A features cache changed in place is computed again too."""
    import spectool.features as features
    import spectool.hidden as hidden
    from spectool.commands.init_draft import InitDraftConfig
    from spectool.commands.init_draft_inputs import training_data, training_features

    def fake(policy, seqs, layer_ids, **k):
        return [(torch.tensor(s), torch.full((len(s), 3 * H), policy.w), torch.full((len(s), H), policy.w)) for s in seqs]

    monkeypatch.setattr(features, "feature_items", fake)
    monkeypatch.setattr(hidden, "feature_items", fake)
    harvest = _hand_made_harvest(tmp_path / "h", 8)
    cfg = InitDraftConfig(out=str(tmp_path / "d"), model="m", data=str(harvest), features=source, shard_tokens=8)

    def last(weights: str) -> list[float]:
        """The features' value per training record, the policy of these weights (stand-in features hold it)."""
        policy = SimpleNamespace(config=POLICY.config, parameters=lambda: iter([torch.zeros(1)]), w=float(weights[-1]))
        data = training_data(cfg, SimpleNamespace(identity="m", path="m", fingerprint={}, weights=weights))
        feats = training_features(cfg, policy, data, LAYERS, tmp_path / "d" / ".train")
        return [float(x[2][0, 0]) for x in feats.train.items(data.train)]

    def written() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in (tmp_path / "d" / ".train").rglob("*.safetensors")}

    assert set(last("w1")) == {1.0}
    kept = written()
    assert set(last("w1")) == {1.0} and written() == kept  # the same weights: read as they are
    assert "computing" not in capsys.readouterr().err
    assert set(last("w2")) == {2.0}  # before: the w1 features, the policy now w2
    err = capsys.readouterr().err
    assert "not used: " in err and "policy_weights" in err and "a cache of the policy's forward" in err
    if source == "cache":
        p = tmp_path / "d" / ".train" / "features.safetensors"
        p.write_bytes(p.read_bytes()[:-4] + b"\0\0\0\0")
        assert set(last("w2")) == {2.0}
        assert "its tensors changed after it was written" in capsys.readouterr().err


def test_a_harvests_hidden_states_of_other_weights_are_not_read(tmp_path, capsys):
    """features.harvest_shards reads a harvest's --hidden-states shards only when the weights that computed them (each
    shard's metadata, else the manifest's model_weights) are --model's now; other or unrecorded weights: [] and a
    line saying why (init-draft computes its own)."""
    from spectool.features import harvest_shards
    from spectool.hidden import save_features

    (tmp_path / "hidden").mkdir()
    p = tmp_path / "hidden" / "shard-00000.safetensors"
    lengths, m = np.array([2, 1]), {"aux_layer_ids": LAYERS}
    save_features(p, [_item([1, 2]), _item([3])], {"model_weights": "A"})
    assert len(harvest_shards(tmp_path, LAYERS, m, lengths, weights="A")) == 1
    assert harvest_shards(tmp_path, LAYERS, m, lengths, weights="B", say=True) == []
    assert "shard-00000.safetensors was computed by other weights (A) than --model holds now (B)" in capsys.readouterr().err
    save_features(p, [_item([1, 2]), _item([3])])  # no record in the shard: the manifest's, else none
    assert len(harvest_shards(tmp_path, LAYERS, {**m, "model_weights": "A"}, lengths, weights="A")) == 1
    assert harvest_shards(tmp_path, LAYERS, {**m, "model_weights": "A"}, lengths, weights="B") == []
    assert harvest_shards(tmp_path, LAYERS, m, lengths, weights="A", say=True) == []
    assert "weights the harvest did not record" in capsys.readouterr().err


def test_a_harvests_hidden_state_shard_changed_in_place_is_refused(tmp_path):
    """The audit's L4 for a harvest's --hidden-states shard: bytes changed in place under an intact header keep its
    identity (harvest_identity reads headers), so init-draft checks each shard's tensors against the digest written
    with it before training on them (features.check_harvest_contents), and refuses a changed one naming the fix."""
    from safetensors.torch import save

    from spectool.features import check_harvest_contents, harvest_identity
    from spectool.hidden import save_features

    harvest = _hand_made_harvest(tmp_path / "h", 2)
    (harvest / "hidden").mkdir()
    p = harvest / "hidden" / "shard-00000.safetensors"
    save_features(p, [_item([1, 2]), _item([3])], {"model_weights": "A"})
    shards = [(p, np.arange(2))]  # what harvest_shards returns for it
    check_harvest_contents(shards)  # as written: passes
    before, blob = harvest_identity(harvest), bytearray(p.read_bytes())
    blob[-8:] = bytes([0x7F]) * 8  # the tail of the feature data, header intact
    p.write_bytes(bytes(blob))
    assert harvest_identity(harvest) == before  # the identity's stated limit: the check below is what sees it
    with pytest.raises(SpectoolError, match=r"--hidden-states shard .*shard-00000.safetensors is not what the harvest "
                                            r"wrote: its tensors changed after it was written .*Harvest again with "
                                            r"--hidden-states into a new --out, or move .*hidden away"):
        check_harvest_contents(shards)
    p.write_bytes(save({"ids": torch.tensor([1, 2, 3])}))  # a shard with no digest to check against (by hand)
    check_harvest_contents(shards)


def test_a_resumed_draft_trained_on_other_weights_is_refused(tmp_path):
    """init_draft.json records --model's weights digest; a rerun whose draft checkpoint was trained on other weights'
    features is refused naming --out (and stays refused: the claim keeps the recorded digest); with no checkpoint yet
    it goes on and records the new weights (its features are computed again)."""
    from spectool.commands.init_draft import InitDraftConfig, check_weights, claim_out

    out = tmp_path / "d"
    cfg = InitDraftConfig(out=str(out), model="m", data=str(tmp_path / "h"))

    def setup(weights):
        claim_out(cfg)
        check_weights(cfg, weights)

    setup("w1")
    setup("w2")  # no checkpoint yet: goes on
    assert json.loads((out / "init_draft.json").read_text())["model_weights"] == "w2"
    (out / ".train").mkdir()
    (out / ".train" / "checkpoint.pt").write_bytes(b"")
    for _ in range(2):
        with pytest.raises(SpectoolError, match=r"--out .*d holds a draft trained on the features of other weights of "
                                                r"--model m \(weights digest w2; the folder holds w3 now.*Pick a new "
                                                r"--out .*--init-from .*or restore the earlier weights"):
            setup("w3")
    setup("w2")  # the weights restored: resumes


def _cli(*args) -> tuple[int, str]:
    """spectool's CLI in this process (typer's runner: no interpreter start): exit code, stdout + stderr."""
    from typer.testing import CliRunner

    from spectool.cli import app

    r = CliRunner().invoke(app, [str(a) for a in args])
    return r.exit_code, r.output


STREAM = ["--features", "stream", "--ttt-steps", "2", "--draft-vocab-size", "64", "--epochs", "1", "--batch-size", "4"]


@pytest.mark.e2e
def test_new_weights_saved_over_the_model_folder_are_not_trained_on_old_features(tmp_path):
    """The audit's E1 through the CLI: init-draft, then the next checkpoint (same shapes, other weights) saved over
    the --model folder, then the same command. Before: it resumed on the old weights' shards (off by up to 4.25),
    exit 0. Now the draft trained on them is refused naming --out; a run with no checkpoint yet computes its features
    again (stderr says why), equal to the policy's now."""
    import hashlib
    import shutil

    from transformers import AutoModelForCausalLM

    from spectool.hidden import default_aux_layer_ids, feature_items, load_features

    from conftest import make_policy, write_fake_harvest

    a, b = make_policy(tmp_path / "A", seed=0), make_policy(tmp_path / "B", seed=1)
    harvest = write_fake_harvest(a, tmp_path / "h", n=16)
    policy, out = tmp_path / "policy", tmp_path / "d"
    shutil.copytree(a, policy)
    cmd = ["init-draft", "--model", policy, "--data", harvest, "--out", out, *STREAM, "--shard-tokens", "64"]
    assert _cli(*cmd)[0] == 0
    shards = sorted((out / ".train" / "features").glob("shard-*.safetensors"))
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in shards}
    shutil.copy(b / "model.safetensors", policy / "model.safetensors")  # the next checkpoint, same shapes
    code, said = _cli(*cmd)
    assert code == 2 and re.search(r"--out \S+ holds a draft trained on the features of other weights of --model", said)
    (out / ".train" / "checkpoint.pt").unlink()  # as if killed before its first checkpoint
    code, said = _cli(*cmd)
    assert code == 0 and "the policy's weights changed" in said and "computing them again" in said
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in shards}
    assert set(after) == set(before) and all(after[k] != before[k] for k in before)
    import safetensors

    with safetensors.safe_open(str(shards[0]), "pt") as f:
        first = json.loads(f.metadata()["records"])[0]
    from spectool.records import load_records

    rec = load_records(harvest)[first]
    now = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    want = feature_items(now, [rec["prompt_ids"] + rec["response_ids"]], default_aux_layer_ids(4))[0]
    assert torch.allclose(load_features(shards[0])[0][2].float(), want[2].float(), atol=1e-2)


@pytest.mark.e2e
def test_init_draft_does_not_read_hidden_states_another_checkpoint_computed(tmp_path):
    """The audit's E2 through the CLI: a harvest whose --hidden-states shards checkpoint A computed, init-draft
    --model B (same shapes). Before: it trained on A's hidden states with B's lm_head, exit 0, no own shards. Now it
    computes its own and says why; a harvest that records A's weights (as harvest now does) is read by --model A."""
    import shutil

    from transformers import AutoModelForCausalLM

    from spectool.hidden import default_aux_layer_ids, feature_items, save_features
    from spectool.records import load_records

    from conftest import make_policy, write_fake_harvest

    a, b = make_policy(tmp_path / "A", seed=0), make_policy(tmp_path / "B", seed=1)
    h = write_fake_harvest(a, tmp_path / "h", n=16)
    layers = default_aux_layer_ids(4)
    (h / "hidden").mkdir()
    recs = load_records(h)
    save_features(h / "hidden" / "shard-00000.safetensors",
                  feature_items(AutoModelForCausalLM.from_pretrained(a, dtype=torch.float32).eval(),
                                [p + r for p, r in zip(recs["prompt_ids"], recs["response_ids"])], layers))
    m = json.loads((h / "manifest.json").read_text())
    (h / "manifest.json").write_text(json.dumps({**m, "aux_layer_ids": layers}))

    def own_shards(model, out) -> tuple[bool, str]:
        code, said = _cli("init-draft", "--model", model, "--data", h, "--out", out, *STREAM, "--shard-tokens", "4096")
        assert code == 0, said
        return any((out / ".train" / "features").glob("shard-*")), said

    own, said = own_shards(b, tmp_path / "d-unrecorded")
    assert own and "--hidden-states shards in" in said and "weights the harvest did not record" in said
    from spectool.models import weights_digest  # (after the audit's case: it runs on the code before too)

    shutil.copytree(h, tmp_path / "h-recorded")
    h = tmp_path / "h-recorded"
    (h / "manifest.json").write_text(json.dumps({**m, "aux_layer_ids": layers, "model_weights": weights_digest(a)}))
    own, said = own_shards(b, tmp_path / "d-b")
    assert own and "was computed by other weights" in said
    own, said = own_shards(a, tmp_path / "d-a")
    assert not own and "not used" not in said  # A's own hidden states: read as they are

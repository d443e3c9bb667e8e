"""Where init-draft's policy features come from, and the order its records are drawn in.

Three sources of the same items (hidden.FeatureItem: ids, aux, last), one switch (`--features`, FEATURE_SOURCES):
  cache   every training token's features in one file (`.train/features.safetensors`), held whole in memory (pinned
          on a GPU host): RAM and disk grow with the data (the first release's way, kept for comparison);
  stream  bounded shards on disk (`.train/features/shard-NNNNN.safetensors`, or a harvest's own --hidden-states
          shards), mapped a shard at a time: RAM holds at most `window` shards of features, whatever the data's
          size; the disk budget is checked before each shard is written; a killed run keeps its finished shards;
  online  the policy's forward over each training batch, on the training device: nothing cached, no disk.
Held-out evaluation reads a fixed sample of the held-out records (`eval_sample`: at most EVAL_RECORDS records and
EVAL_TOKENS tokens), whose features every source holds in memory: bounded, whatever the data's size.

What does grow with the data is the per-record indexes (lengths, the training split, the shuffle groups, where each
record's features are, one epoch's order): numpy arrays, 50 MiB per million records of 200-8,000 tokens (53 bytes a
record, the shard paths included), where Python lists and dicts took 244 MiB (benchmarks/index_memory.py,
docs/drafters.md).

Features carry their identity, so none is reused for other records or another checkpoint's weights, as far as
those are checked: the stream folder holds `manifest.json` (the harvest's identity (`harvest_identity`), its record
count, the layer ids, --shard-tokens, the policy's identity (shapes and tokenizer), the policy's weights digest
(models.weights_digest: headers and sampled windows of every tensor, so a sparse edit that misses every window goes
unseen) and a digest of the shuffle groups), each shard its record indices, lengths and weights digest in its
safetensors metadata with a digest of its own tensors (hidden.CONTENT), and the cache file the manifest in its own.
Reused features are checked against all of them, the tensors once per run that reuses them; a shard that does not
fit, was changed in place, or cannot be read (a truncated file), is computed again (features are a cache of the
policy's forward: a line on stderr says so). A harvest's --hidden-states shards are read only when the weights that
computed them (their metadata, else the harvest manifest's `model_weights`) are --model's now. A disk that fills
during a write keeps nothing of that shard and says what to change.

One order for all three (`epoch_order`): the training records are cut into groups (a harvest's --hidden-states
shards when it has them for these layers, else consecutive records up to `shard_tokens` tokens: the stream shards),
each epoch shuffles the groups, then the records inside each window of `window` consecutive groups (a shuffle
buffer, as WebDataset-style loaders do). The same records meet in the same batches whichever source feeds them, so
the three train the same draft (tests/test_init_draft_scale.py). While the data fits one window the order is a full
permutation, the same one the first release drew.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from spectool.errors import SpectoolError
from spectool.hidden import (
    CONTENT,
    FeatureItem,
    bytes_per_token,
    content_misfit,
    feature_items,
    load_features,
    save_features,
)
from spectool.records import shard_paths
from spectool.runs import atomic_write_json

EVAL_RECORDS = 256  # held-out records evaluated at most (a fixed, seeded sample of them beyond)
EVAL_TOKENS = 65536  # and their tokens at most: 0.28 GiB of SmolLM2's features, 2 GiB of Qwen3-8B's
GIB = 1024**3
MANIFEST = "manifest.json"  # in a stream's features folder: what its shards were computed from
INDEX = np.int32  # record indices (a harvest of up to 2**31 records)
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
ONLINE_ADVICE = "--features online computes the policy's features in the training loop and takes no disk"


def record_lengths(records) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths [N], prompt + response lengths [N]) of a datasets.Dataset of harvest records, int64, from
    Arrow's list offsets: no record's ids become Python objects."""
    import pyarrow.compute as pc  # noqa: PLC0415 (heavy, loaded only on this path)

    table = records.data
    p = pc.list_value_length(table.column("prompt_ids")).to_numpy().astype(np.int64)
    r = pc.list_value_length(table.column("response_ids")).to_numpy().astype(np.int64)
    return p, p + r


def harvest_identity(run_dir: Path) -> str:
    """What init-draft's features depend on in a harvest run: a sha256 over its records' files byte for byte (which
    tokens, in which order; 0.63 GiB/s here, docs/drafters.md: seconds) and its --hidden-states shards (whether they
    are there decides the shuffle groups, and which weights computed them what is trained on). A hidden-state shard
    counts by its header, which holds the digest of its tensors (hidden.CONTENT) and the weights that computed them,
    written with it: a shard rewritten in place (by another checkpoint, at the same size) changes it, and a harvest of
    terabytes of hidden states is not read whole at every start. A shard without that digest (an older spectool's) is
    read whole. A harvest re-run, resumed or grown in its folder has another identity."""
    h = hashlib.sha256()
    for p in shard_paths(run_dir):
        with open(p, "rb") as f:
            h.update(f"{p.name}\0".encode() + hashlib.file_digest(f, "sha256").digest())
    for p in sorted((Path(run_dir) / "hidden").glob("shard-*.safetensors")):
        h.update(f"{p.name}\0".encode() + _shard_digest(p))
    return h.hexdigest()[:16]


def _shard_digest(path: Path) -> bytes:
    """A hidden-state shard's identity: its safetensors header (tensor names, shapes, offsets, and metadata with the
    tensors' CONTENT digest) where it carries that digest, else the sha256 of the whole file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = f.read(n) if 0 < n < 100_000_000 else b""
        if CONTENT.encode() in header:
            return hashlib.sha256(header).digest()
        f.seek(0)
        return hashlib.file_digest(f, "sha256").digest()


def eval_sample(heldout: Sequence[int], lengths: np.ndarray, seed: int) -> list[int]:
    """The held-out records evaluated: all of them while within EVAL_RECORDS and EVAL_TOKENS, else a seeded sample
    up to both (at least one), in index order. lengths: [records] tokens."""
    heldout = np.asarray(heldout, dtype=INDEX)
    if len(heldout) <= EVAL_RECORDS and int(lengths[heldout].sum()) <= EVAL_TOKENS:
        return heldout.tolist()
    g = torch.Generator().manual_seed(seed)
    out, tokens = [], 0
    for i in (int(heldout[j]) for j in torch.randperm(len(heldout), generator=g).tolist()):
        if out and (len(out) == EVAL_RECORDS or tokens + lengths[i] > EVAL_TOKENS):
            break
        out.append(i)
        tokens += int(lengths[i])
    return sorted(out)


def resident(source, idx: list[int]) -> InMemory:
    """The items of `idx` read once from `source` and held in host memory (copies: no shard stays mapped for them,
    and features an online source computed on the GPU do not stay there)."""
    return InMemory({i: tuple(t.to("cpu", copy=True) for t in x) for i, x in zip(idx, source.items(idx))})


def iter_column(records, column: str, batch: int = 4096):
    """Each record's `column` (a list of ids), read `batch` records at a time."""
    for chunk in records.select_columns([column]).iter(batch_size=batch):
        yield from chunk[column]


@dataclass(frozen=True)
class Groups:
    """Record indices cut into groups, as two arrays: group g is members[starts[g] : starts[g + 1]].
    members: [N] INDEX; starts: [G + 1] int64."""

    members: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, groups: Iterable[Sequence[int]]) -> Groups:
        """From a list of index lists (empty ones dropped)."""
        groups = [np.asarray(g, dtype=INDEX) for g in groups if len(g)]
        starts = np.zeros(len(groups) + 1, dtype=np.int64)
        np.cumsum([len(g) for g in groups], out=starts[1:])
        return cls(np.concatenate(groups) if groups else np.zeros(0, INDEX), starts)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, g: int) -> np.ndarray:
        return self.members[self.starts[g] : self.starts[g + 1]]

    def __iter__(self):
        return (self[g] for g in range(len(self)))

    def keep(self, records: np.ndarray) -> Groups:
        """Each group's members that are in `records`, in order; groups left empty dropped."""
        inside = np.isin(self.members, records)
        sizes = np.bincount(np.repeat(np.arange(len(self)), np.diff(self.starts))[inside], minlength=len(self))
        starts = np.zeros(int((sizes > 0).sum()) + 1, dtype=np.int64)
        np.cumsum(sizes[sizes > 0], out=starts[1:])
        return Groups(self.members[inside], starts)

    def digest(self) -> str:
        """A short hash of which records are in which group (the features manifest's `groups`)."""
        return hashlib.sha256(self.members.astype(np.int64).tobytes() + self.starts.tobytes()).hexdigest()[:16]


def token_groups(indices: Sequence[int], lengths: np.ndarray, shard_tokens: int) -> Groups:
    """`indices` in order, cut into consecutive groups of at most `shard_tokens` tokens (a longer record alone)."""
    indices = np.asarray(indices, dtype=INDEX)
    starts, size = [], 0
    for k0 in range(0, len(indices), 65536):  # the lengths as Python ints a chunk at a time
        for k, n in enumerate(lengths[indices[k0 : k0 + 65536]].tolist(), k0):
            if starts and size + n <= shard_tokens:
                size += n
            else:
                starts.append(k)
                size = n
    return Groups(indices, np.array([*starts, len(indices)], dtype=np.int64))


def epoch_order(groups: Groups, seed: int, epoch: int, window: int) -> np.ndarray:
    """The records of one epoch [N] INDEX: groups shuffled, then the records inside each window of `window` groups.
    Deterministic in (seed, epoch), so a resumed run draws what an uninterrupted one would."""
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    picks = torch.randperm(len(groups), generator=g).numpy() if len(groups) > window else np.arange(len(groups))
    order, at = np.empty(len(groups.members), dtype=INDEX), 0
    for w in range(0, len(groups), window):
        members = np.sort(np.concatenate([groups[s] for s in picks[w : w + window]]))
        order[at : at + len(members)] = members[torch.randperm(len(members), generator=g).numpy()]
        at += len(members)
    return order


class InMemory:
    """`cache`: every record's items held in memory (index -> item)."""

    def __init__(self, items: dict[int, FeatureItem]):
        self._items = items

    def items(self, idx: Sequence[int]) -> list[FeatureItem]:
        return [self._items[int(i)] for i in idx]


class Streamed:
    """`stream`: items read from shard files, at most `window` shards in memory at once (least recently used
    goes first). shards: (path, the record indices it holds, in its order)."""

    def __init__(self, shards: Sequence[tuple[Path, Sequence[int]]], window: int, pin: bool = False):
        idx = [np.asarray(i, dtype=INDEX) for _, i in shards]
        sizes = np.array([len(i) for i in idx], dtype=np.int64)
        members = np.concatenate(idx) if idx else np.zeros(0, INDEX)  # [records held] INDEX
        self.shard_of = np.full(int(members.max(initial=-1)) + 1, -1, dtype=np.int32)  # [records]: i's shard, -1: none
        self.row = np.zeros(len(self.shard_of), dtype=np.int32)  # [records]: its position there
        self.shard_of[members] = np.repeat(np.arange(len(shards), dtype=np.int32), sizes)
        self.row[members] = np.arange(len(members)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        self.paths = [str(p) for p, _ in shards]
        self.window, self.pin = window, pin
        self.loaded: OrderedDict[int, list[FeatureItem]] = OrderedDict()
        self.reads = 0  # shard loads so far (the benchmark's disk reads)

    def _shard(self, s: int) -> list[FeatureItem]:
        if s in self.loaded:
            self.loaded.move_to_end(s)
            return self.loaded[s]
        while len(self.loaded) >= self.window:
            self.loaded.popitem(last=False)
        self.loaded[s] = read_shard(Path(self.paths[s]), self.pin)
        self.reads += 1
        return self.loaded[s]

    def items(self, idx: Sequence[int]) -> list[FeatureItem]:
        return [self._shard(int(self.shard_of[i]))[int(self.row[i])] for i in idx]


def read_shard(path: Path, pin: bool = False) -> list[FeatureItem]:
    """A features file's items (hidden.load_features); one that cannot be read is refused with the fix."""
    from safetensors import SafetensorError  # noqa: PLC0415 (heavy, loaded only on this path)

    try:
        return load_features(path, pin)
    except (SafetensorError, OSError) as e:
        raise SpectoolError(f"feature shard {path} cannot be read ({e}): delete it and rerun the same command "
                            f"(init-draft computes a missing shard of its own again), or resume with {ONLINE_ADVICE} "
                            "from them") from None


class OnTheFly:
    """`online`: the policy's forward over the asked records, nothing kept. seq(i): record i's prompt + response ids."""

    def __init__(self, policy, seq: Callable[[int], list[int]], layer_ids: list[int]):
        self.policy, self.seq, self.layer_ids = policy, seq, layer_ids

    def items(self, idx: Sequence[int]) -> list[FeatureItem]:
        """On the policy's device: the training step reads them there (no GPU -> host -> GPU copy per batch)."""
        return feature_items(self.policy, [self.seq(int(i)) for i in idx], self.layer_ids, on_device=True)


class Lazy(Sequence):
    """A list of items read from a source as it is sliced (held-out evaluation reads a batch at a time)."""

    def __init__(self, source, idx: list[int]):
        self.source, self.idx = source, idx

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return self.source.items(self.idx[k])
        return self.source.items([self.idx[k]])[0]


def misfit(path: Path, want: dict[str, str]) -> str | None:
    """Why the features file at `path` does not hold what `want` (its safetensors metadata) says, or None when it
    does. Reads the header only; a truncated or unreadable file is a misfit."""
    from safetensors import SafetensorError, safe_open  # noqa: PLC0415 (heavy, loaded only on this path)

    try:
        with safe_open(str(path), "pt") as f:
            have = f.metadata() or {}
    except (SafetensorError, OSError) as e:
        return f"it cannot be read ({e})"
    diff = sorted(k for k in want if have.get(k) != want[k])
    return f"its {', '.join(_what_differs(k, have.get(k), want[k]) for k in diff)} differ" if diff else None


def _what_differs(key: str, have: str | None, want: str) -> str:
    """`key`, with the fields that differ when both values are JSON objects (the cache's "features": which input)."""
    try:
        h, w = json.loads(have), json.loads(want)
    except (TypeError, ValueError):
        return key
    if not (isinstance(h, dict) and isinstance(w, dict)):
        return key
    return f"{key} ({', '.join(sorted(k for k in {*h, *w} if h.get(k) != w.get(k)))})"


def save_or_advise(path: Path, items: list[FeatureItem], metadata: dict[str, str], done: str) -> int:
    """hidden.save_features, a full disk refused with what to change (the write is atomic: nothing of it stays).
    done: what is kept, for the message. Returns bytes."""
    try:
        return save_features(path, items, metadata)
    except OSError as e:
        if e.errno not in FULL_DISK:
            raise
        raise SpectoolError(f"the disk filled while writing {path} ({e.strerror}): nothing of it was kept, {done}; "
                            f"{ONLINE_ADVICE}, or free space there, or put --out on a larger disk") from None


def _features_manifest(folder: Path, want: dict) -> None:
    """Write the features manifest `want` in `folder`; shards made for another one (or before there was one) go
    first, with a line saying why."""
    path, shards = folder / MANIFEST, sorted(folder.glob("shard-*.safetensors"))
    try:
        have = json.loads(path.read_text()) if path.exists() else None
    except (OSError, json.JSONDecodeError):
        have = {}
    if have == want:
        return
    if shards:
        diff = sorted(k for k in {*(have or {}), *want} if (have or {}).get(k) != want.get(k))
        why = ("they have no manifest (an older spectool wrote them)" if have is None
               else f"they were computed from other inputs ({', '.join(diff)} differ)")
        if "policy_weights" in diff:
            why += (f"; the policy's weights changed ({(have or {}).get('policy_weights')} then, "
                    f"{want.get('policy_weights')} now: --model holds another checkpoint)")
        print(f"the {len(shards)} feature shards in {folder} are not used: {why}; they are a cache of the policy's "
              "forward: computing them again", file=sys.stderr)
        for p in shards:
            p.unlink()
    atomic_write_json(path, want)


def write_shards(policy, groups: Groups | list[list[int]], seq: Callable[[int], list[int]], layer_ids: list[int], folder: Path,
                 budget_bytes: float | None, on_shard: Callable[[int], None] | None = None, *,
                 lengths: np.ndarray | None = None, identity: dict | None = None) -> list[tuple[Path, np.ndarray]]:
    """One features shard per group under `folder` (shard-NNNNN.safetensors), each with its record indices, lengths,
    the policy's weights digest and its tensors' digest in its metadata, beside a manifest: `identity` (what the
    features were computed from: harvest, records, shard_tokens, policy, policy_weights), the layer ids and the
    groups' digest. A shard is kept only when the manifest and its own metadata fit and its tensors are what it was
    written with (read whole once per call: a resume reads every kept shard at ~0.6 GiB/s; a killed run resumes at
    the first missing one); one that does not, or cannot be read, is computed again. Before each is written: it
    must fit `budget_bytes` with the shards already there (None: no budget) and the disk's free space, else a
    refusal that names the way without disk; a disk that fills during the write keeps nothing of it.
    lengths: [records] prompt + response tokens (None: read through `seq`)."""
    groups = groups if isinstance(groups, Groups) else Groups.of(groups)
    per_token = bytes_per_token(policy.config.hidden_size, len(layer_ids))
    folder.mkdir(parents=True, exist_ok=True)
    _features_manifest(folder, {"kind": "features", **(identity or {}), "layer_ids": [int(x) for x in layer_ids],
                                "groups": groups.digest()})
    used = sum(p.stat().st_size for p in folder.glob("shard-*.safetensors"))
    out = []
    for n, grp in enumerate(groups):
        path = folder / f"shard-{n:05d}.safetensors"
        seqs = None if lengths is not None else [seq(int(i)) for i in grp]
        tokens = lengths[grp].tolist() if lengths is not None else [len(s) for s in seqs]
        meta = {"records": json.dumps(grp.tolist()), "lengths": json.dumps(tokens),
                **({"policy_weights": identity["policy_weights"]} if identity and "policy_weights" in identity else {})}
        why = (misfit(path, meta) or content_misfit(path)) if path.exists() else None
        if why:
            print(f"feature shard {path} does not fit: {why}; computing it again", file=sys.stderr)
            used -= path.stat().st_size
            path.unlink()
        if not path.exists():
            seqs = seqs or [seq(int(i)) for i in grp]
            need = sum(tokens) * per_token
            free = shutil.disk_usage(folder).free
            if (budget_bytes is not None and used + need > budget_bytes) or need > free:
                limit = (f"--disk-budget-gb {budget_bytes / GIB:g}" if budget_bytes is not None and used + need > budget_bytes
                         else f"the {free / GIB:.2f} GiB free on {folder}")
                raise SpectoolError(
                    f"feature shard {n + 1} of {len(groups)} ({need / GIB:.2f} GiB) would go past {limit} "
                    f"({used / GIB:.2f} GiB written, kept for a resume); {ONLINE_ADVICE}, or raise --disk-budget-gb")
            used += save_or_advise(path, feature_items(policy, seqs, layer_ids), meta,
                                   f"the {n} shards before it were (a resume goes on from them)")
        out.append((path, grp))
        if on_shard:
            on_shard(len(grp))
    return out


def harvest_shards(run_dir: Path, layer_ids: list[int], manifest: dict, lengths: np.ndarray, *, weights: str,
                   say: bool = False) -> list[tuple[Path, np.ndarray]]:
    """A harvest's --hidden-states shards as (path, record indices), when they hold these layers and every record
    (their lengths checked against the records', read from each shard's header and lengths only) and were computed
    by the policy weights `weights` (models.weights_digest of --model now: each shard's metadata `model_weights`, else
    the manifest's); else []. Shards of other weights, or of weights nobody recorded (an older spectool), are not
    read: init-draft computes the features itself (`say`: a line on stderr says why); the records still train. One
    that cannot be read is refused with the fix."""
    from safetensors import SafetensorError, safe_open  # noqa: PLC0415 (heavy, loaded only on this path)

    paths = sorted((run_dir / "hidden").glob("shard-*.safetensors"))
    if not paths or manifest.get("aux_layer_ids") != list(layer_ids):
        return []
    out, start = [], 0
    for p in paths:
        try:
            with safe_open(str(p), "pt") as f:
                n = f.get_tensor("lengths").numpy()
                made_by = (f.metadata() or {}).get("model_weights", manifest.get("model_weights"))
        except (SafetensorError, OSError) as e:
            raise SpectoolError(f"the harvest's --hidden-states shard {p} cannot be read ({e}): harvest again with "
                                f"--hidden-states into a new --out, or move {run_dir / 'hidden'} away and init-draft "
                                "computes the features itself (a new init-draft --out)") from None
        if made_by != weights:
            if say:
                by = (f"other weights ({made_by}) than --model holds now ({weights})" if made_by
                      else "weights the harvest did not record (an older spectool)")
                print(f"the harvest's --hidden-states shards in {run_dir / 'hidden'} are not used: {p.name} was computed "
                      f"by {by}; init-draft computes the policy's features itself (training on the harvest's records "
                      "is fine; its features must be --model's)", file=sys.stderr)
            return []
        out.append((p, np.arange(start, start + len(n), dtype=INDEX)))
        if len(n) > len(lengths) - start or not np.array_equal(n, lengths[start : start + len(n)]):
            return []
        start += len(n)
    return out if start == len(lengths) else []


def check_harvest_contents(shards: list[tuple[Path, np.ndarray]]) -> None:
    """Refuse a harvest's --hidden-states shard whose tensors are not what it was written with (its CONTENT digest,
    written with it: bytes changed in place under an intact header, which harvest_identity, reading headers only,
    does not see), naming the fix. Reads every shard whole (~0.6 GiB/s, hidden.tensors_digest), once per init-draft
    start that trains on them: a shard holds at most --shard-tokens tokens then (init-draft's _usable_shards). A
    shard without the digest (written by hand, or an older spectool) is not checked."""
    for p, _ in shards:
        if why := content_misfit(p, missing_ok=True):
            raise SpectoolError(f"the harvest's --hidden-states shard {p} is not what the harvest wrote: {why}. Harvest "
                                f"again with --hidden-states into a new --out, or move {p.parent} away and init-draft "
                                "computes the features itself (a new init-draft --out)")

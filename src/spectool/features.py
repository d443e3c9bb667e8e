"""Where init-draft's policy features come from, and the order its records are drawn in.

Three sources of the same items (hidden.FeatureItem: ids, aux, last), one switch (`--features`, FEATURE_SOURCES):
  cache   every training token's features in one file (`.train/features.safetensors`), held whole in memory (pinned
          on a GPU host): RAM and disk grow with the data (the first release's way, kept for comparison);
  stream  bounded shards on disk (`.train/features/shard-NNNNN.safetensors`, or a harvest's own --hidden-states
          shards), mapped a shard at a time: RAM holds at most `window` shards, whatever the data's size; the disk
          budget is checked before each shard is written; a killed run keeps its finished shards;
  online  the policy's forward over each training batch, on the training device: nothing cached, no disk.
Held-out evaluation reads a fixed sample of the held-out records (`eval_sample`: at most EVAL_RECORDS records and
EVAL_TOKENS tokens), whose features every source holds in memory: bounded, whatever the data's size.

One order for all three (`epoch_order`): the training records are cut into groups (a harvest's --hidden-states
shards when it has them for these layers, else consecutive records up to `shard_tokens` tokens: the stream shards),
each epoch shuffles the groups, then the records inside each window of `window` consecutive groups (a shuffle
buffer, as WebDataset-style loaders do). The same records meet in the same batches whichever source feeds them, so
the three train the same draft (tests/test_init_draft_scale.py). While the data fits one window the order is a full
permutation, the same one the first release drew.
"""

from __future__ import annotations

import shutil
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from spectool.errors import SpectoolError
from spectool.hidden import FeatureItem, bytes_per_token, feature_items, load_features, save_features

EVAL_RECORDS = 256  # held-out records evaluated at most (a fixed, seeded sample of them beyond)
EVAL_TOKENS = 65536  # and their tokens at most: 0.28 GiB of SmolLM2's features, 2 GiB of Qwen3-8B's
GIB = 1024**3


def record_lengths(records) -> tuple[list[int], list[int]]:
    """(prompt lengths, prompt + response lengths) of a datasets.Dataset of harvest records, from Arrow's list
    offsets: no record's ids become Python objects."""
    import pyarrow.compute as pc  # noqa: PLC0415 (heavy, loaded only on this path)

    table = records.data
    p = pc.list_value_length(table.column("prompt_ids")).to_pylist()
    r = pc.list_value_length(table.column("response_ids")).to_pylist()
    return p, [a + b for a, b in zip(p, r)]


def eval_sample(heldout: list[int], lengths: Sequence[int], seed: int) -> list[int]:
    """The held-out records evaluated: all of them while within EVAL_RECORDS and EVAL_TOKENS, else a seeded sample
    up to both (at least one), in index order."""
    if len(heldout) <= EVAL_RECORDS and sum(lengths[i] for i in heldout) <= EVAL_TOKENS:
        return heldout
    g = torch.Generator().manual_seed(seed)
    out, tokens = [], 0
    for i in (heldout[j] for j in torch.randperm(len(heldout), generator=g).tolist()):
        if out and (len(out) == EVAL_RECORDS or tokens + lengths[i] > EVAL_TOKENS):
            break
        out.append(i)
        tokens += lengths[i]
    return sorted(out)


def resident(source, idx: list[int]) -> InMemory:
    """The items of `idx` read once from `source` and held in host memory (copies: no shard stays mapped for them,
    and features an online source computed on the GPU do not stay there)."""
    return InMemory({i: tuple(t.to("cpu", copy=True) for t in x) for i, x in zip(idx, source.items(idx))})


def iter_column(records, column: str, batch: int = 4096):
    """Each record's `column` (a list of ids), read `batch` records at a time."""
    for chunk in records.select_columns([column]).iter(batch_size=batch):
        yield from chunk[column]


def token_groups(indices: list[int], lengths: Sequence[int], shard_tokens: int) -> list[list[int]]:
    """`indices` in order, cut into consecutive groups of at most `shard_tokens` tokens (a longer record alone)."""
    groups: list[list[int]] = []
    size = 0
    for i in indices:
        if groups and size + lengths[i] <= shard_tokens:
            groups[-1].append(i)
            size += lengths[i]
        else:
            groups.append([i])
            size = lengths[i]
    return groups


def epoch_order(groups: list[list[int]], seed: int, epoch: int, window: int) -> list[int]:
    """The records of one epoch: groups shuffled, then the records inside each window of `window` groups.
    Deterministic in (seed, epoch), so a resumed run draws what an uninterrupted one would."""
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    if len(groups) > window:
        groups = [groups[i] for i in torch.randperm(len(groups), generator=g).tolist()]
    order: list[int] = []
    for w in range(0, len(groups), window):
        members = sorted(i for grp in groups[w : w + window] for i in grp)
        order += [members[i] for i in torch.randperm(len(members), generator=g).tolist()]
    return order


class InMemory:
    """`cache`: every record's items held in memory (index -> item)."""

    def __init__(self, items: dict[int, FeatureItem]):
        self._items = items

    def items(self, idx: list[int]) -> list[FeatureItem]:
        return [self._items[i] for i in idx]


class Streamed:
    """`stream`: items read from shard files, at most `window` shards in memory at once (least recently used
    goes first). shards: (path, the record indices it holds, in its order)."""

    def __init__(self, shards: list[tuple[Path, list[int]]], window: int, pin: bool = False):
        self.where = {i: (s, j) for s, (_, idx) in enumerate(shards) for j, i in enumerate(idx)}
        self.paths = [p for p, _ in shards]
        self.window, self.pin = window, pin
        self.loaded: OrderedDict[int, list[FeatureItem]] = OrderedDict()
        self.reads = 0  # shard loads so far (the benchmark's disk reads)

    def _shard(self, s: int) -> list[FeatureItem]:
        if s in self.loaded:
            self.loaded.move_to_end(s)
            return self.loaded[s]
        while len(self.loaded) >= self.window:
            self.loaded.popitem(last=False)
        self.loaded[s] = load_features(self.paths[s], self.pin)
        self.reads += 1
        return self.loaded[s]

    def items(self, idx: list[int]) -> list[FeatureItem]:
        return [self._shard(self.where[i][0])[self.where[i][1]] for i in idx]


class OnTheFly:
    """`online`: the policy's forward over the asked records, nothing kept. seq(i): record i's prompt + response ids."""

    def __init__(self, policy, seq: Callable[[int], list[int]], layer_ids: list[int]):
        self.policy, self.seq, self.layer_ids = policy, seq, layer_ids

    def items(self, idx: list[int]) -> list[FeatureItem]:
        """On the policy's device: the training step reads them there (no GPU -> host -> GPU copy per batch)."""
        return feature_items(self.policy, [self.seq(i) for i in idx], self.layer_ids, on_device=True)


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


def write_shards(policy, groups: list[list[int]], seq: Callable[[int], list[int]], layer_ids: list[int], folder: Path,
                 budget_bytes: float | None, on_shard: Callable[[int], None] | None = None) -> list[tuple[Path, list[int]]]:
    """One features shard per group under `folder` (shard-NNNNN.safetensors; one that exists is kept: a killed run
    resumes at the first missing one). Before each is written: it must fit `budget_bytes` with the shards already
    there (None: no budget) and the disk's free space, else a refusal that names the way without disk."""
    per_token = bytes_per_token(policy.config.hidden_size, len(layer_ids))
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for n, grp in enumerate(groups):
        path = folder / f"shard-{n:05d}.safetensors"
        if not path.exists():
            seqs = [seq(i) for i in grp]
            need = sum(map(len, seqs)) * per_token
            used = sum(p.stat().st_size for p in folder.glob("shard-*.safetensors"))
            free = shutil.disk_usage(folder).free
            if (budget_bytes is not None and used + need > budget_bytes) or need > free:
                limit = (f"--disk-budget-gb {budget_bytes / GIB:g}" if budget_bytes is not None and used + need > budget_bytes
                         else f"the {free / GIB:.2f} GiB free on {folder}")
                raise SpectoolError(
                    f"feature shard {n + 1} of {len(groups)} ({need / GIB:.2f} GiB) would go past {limit} "
                    f"({used / GIB:.2f} GiB written, kept for a resume); --features online computes the policy's "
                    "features in the training loop and takes no disk, or raise --disk-budget-gb")
            save_features(path, feature_items(policy, seqs, layer_ids))
        out.append((path, grp))
        if on_shard:
            on_shard(len(grp))
    return out


def harvest_shards(run_dir: Path, layer_ids: list[int], manifest: dict, lengths: list[int]) -> list[tuple[Path, list[int]]]:
    """A harvest's --hidden-states shards as (path, record indices), when they hold these layers and every record
    (their lengths checked against the records', read from each shard's header and lengths only); else []."""
    from safetensors import safe_open  # noqa: PLC0415 (heavy, loaded only on this path)

    paths = sorted((run_dir / "hidden").glob("shard-*.safetensors"))
    if not paths or manifest.get("aux_layer_ids") != list(layer_ids):
        return []
    out, start = [], 0
    for p in paths:
        with safe_open(str(p), "pt") as f:
            n = f.get_tensor("lengths").tolist()
        out.append((p, list(range(start, start + len(n)))))
        if n != list(lengths[start : start + len(n)]):
            return []
        start += len(n)
    return out if start == len(lengths) else []

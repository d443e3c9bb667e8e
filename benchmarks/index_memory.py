"""What init-draft's per-record indexes take in memory under --features stream, per million records.

    PYTHONPATH=src nice -n 19 python benchmarks/index_memory.py [--records 1000000]

The indexes as init-draft holds them through training (features.py): the records' lengths and prompt lengths
(`record_lengths`), the training split, the shuffle groups (`token_groups`, --shard-tokens 32768), where each
record's features are (`Streamed`), and one epoch's order (`epoch_order`, what the trainer keeps), measured with
tracemalloc (numpy's buffers included). Record lengths are drawn uniformly from 200-8000 tokens, as the audit's
audit-2026-11b-sims/index_memory.py drew them (about 7 records a 32768-token shard, so the per-shard share counts).
The records themselves stay in Arrow (memory-mapped, not counted). Run against an older
checkout (PYTHONPATH=<that checkout>/src) it measures that version's lists and dicts: the "before" of
docs/drafters.md.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa

import spectool.features as features


def records_like(prompt: np.ndarray, response: np.ndarray) -> SimpleNamespace:
    """A stand-in for the harvest's datasets.Dataset with list columns of these lengths and no values (null-typed
    lists: Arrow stores their offsets only), which is all `record_lengths` reads."""

    def column(lengths: np.ndarray) -> pa.Array:
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.nulls(int(offsets[-1])))

    return SimpleNamespace(data=pa.table({"prompt_ids": column(prompt), "response_ids": column(response)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--shard-tokens", type=int, default=32768)
    a = ap.parse_args()
    n, arrays = a.records, hasattr(features, "Groups")
    g = np.random.default_rng(0)
    total = g.integers(200, 8001, n)
    prompt = g.integers(20, 200, n)
    recs = records_like(prompt, total - prompt)
    held = (np.arange(n) % 100) == 0  # 1% held out (init-draft splits by a hash of the prompt id)

    tracemalloc.start()
    t0 = time.perf_counter()
    prompt_lens, lengths = features.record_lengths(recs)
    train = np.flatnonzero(~held).astype(np.int32) if arrays else [i for i, h in enumerate(held.tolist()) if not h]
    a1 = tracemalloc.get_traced_memory()[0]
    groups = features.token_groups(train, lengths, a.shard_tokens)
    a2 = tracemalloc.get_traced_memory()[0]
    shards = [(Path(f"features/shard-{k:05d}.safetensors"), grp) for k, grp in enumerate(groups)]
    stream = features.Streamed(shards, 4)
    del shards  # init-draft keeps the Streamed, not the list it was built from
    a3 = tracemalloc.get_traced_memory()[0]
    order = features.epoch_order(groups, 0, 0, 4)
    a4, peak = tracemalloc.get_traced_memory()
    seconds = time.perf_counter() - t0
    tracemalloc.stop()
    assert len(order) == len(train) and stream.window == 4
    mib = 2**20
    print(f"{n:,} records, {len(groups):,} shards of <= {a.shard_tokens} tokens ({'arrays' if arrays else 'lists'}, "
          f"{seconds:.1f} s): lengths+prompt lengths+train {a1 / mib:.0f} MiB, groups {(a2 - a1) / mib:.0f} MiB, "
          f"Streamed {(a3 - a2) / mib:.0f} MiB, one epoch order {(a4 - a3) / mib:.0f} MiB; held {a4 / mib:.0f} MiB "
          f"({a4 / n:.0f} bytes a record), peak {peak / mib:.0f} MiB")


if __name__ == "__main__":
    main()

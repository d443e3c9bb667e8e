"""Rollout records: one row per completion, stored as Parquet shards readable with `datasets`.

Shards are written atomically (temp file + rename), so a killed job leaves only whole shards and
a resumed job skips the prompts they hold.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from spectool.runs import atomic_write_bytes

RECORDS_DIR = "records"
COLUMNS = (
    "prompt_id", "sample_idx", "prompt", "answer", "prompt_ids", "response_ids", "logprobs",
    "reward", "finish_reason", "response",
)


def _features():
    import datasets as ds  # noqa: PLC0415 (heavy, loaded only on this path)

    return ds.Features(
        {
            "prompt_id": ds.Value("string"),
            "sample_idx": ds.Value("int32"),
            "prompt": ds.Value("string"),
            "answer": ds.Value("string"),
            "prompt_ids": ds.Sequence(ds.Value("int32")),
            "response_ids": ds.Sequence(ds.Value("int32")),
            "logprobs": ds.Sequence(ds.Value("float32")),  # policy logprob of each sampled token
            "reward": ds.Value("float32"),
            "finish_reason": ds.Value("string"),
            "response": ds.Value("string"),
        }
    )


def shard_paths(run_dir: Path) -> list[Path]:
    return sorted((Path(run_dir) / RECORDS_DIR).glob("shard-*.parquet"))


def next_shard_index(run_dir: Path) -> int:
    """One past the highest shard index (shards of parallel replicas may leave gaps after a crash)."""
    return max((int(p.stem.split("-")[1]) for p in shard_paths(run_dir)), default=-1) + 1


def write_shard(run_dir: Path, index: int, rows: list[dict[str, Any]]) -> Path:
    import datasets as ds  # noqa: PLC0415 (heavy, loaded only on this path)

    ds.disable_progress_bars()
    buf = io.BytesIO()
    ds.Dataset.from_list(rows, features=_features()).to_parquet(buf)
    path = Path(run_dir) / RECORDS_DIR / f"shard-{index:05d}.parquet"
    atomic_write_bytes(path, buf.getvalue())
    return path


def load_records(run_dir: Path):
    """All records of a run as one `datasets.Dataset` (empty run -> empty dataset)."""
    import datasets as ds  # noqa: PLC0415 (heavy, loaded only on this path)

    ds.disable_progress_bars()
    paths = shard_paths(run_dir)
    if not paths:
        return ds.Dataset.from_dict({k: [] for k in COLUMNS}, features=_features())
    return ds.concatenate_datasets([ds.Dataset.from_parquet(str(p)) for p in paths])

"""Versioned run directories: manifest, resolved config, atomic writes.

Every stage writes into a run directory holding `manifest.json` (what produced it, from which
inputs, schema version, hashes) and `config.json` (the resolved config). A later stage reads the
manifest and refuses inputs that do not fit (wrong model, other settings) before doing any work.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spectool.errors import SpectoolError
from spectool.version import __version__

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
CONFIG = "config.json"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temp file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_dir(dest: Path):
    """Build a folder beside `dest` and move it into place only when the block succeeds; an existing
    `dest` is replaced at the very end. On any error the partial folder goes and `dest` is untouched.

        with atomic_dir(out / "export") as tmp:
            write files into tmp
    """
    dest = Path(dest)
    tmp, old = dest.with_name(f".{dest.name}.partial"), dest.with_name(f".{dest.name}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def atomic_torch_save(obj: Any, path: Path) -> None:
    """torch.save through a temp file and a rename (a checkpoint is whole or absent)."""
    import torch  # noqa: PLC0415 (heavy, loaded only on this path)

    tmp = Path(path).with_name(f".{Path(path).name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(_jsonable(obj), indent=2, sort_keys=True) + "\n").encode())


def append_jsonl(path: Path, obj: Any) -> None:
    """Append one JSON line and fsync it (metrics logs survive a crash line by line)."""
    with open(path, "a") as f:
        f.write(json.dumps(_jsonable(obj)) + "\n")
        f.flush()
        os.fsync(f.fileno())


def truncate_jsonl(path: Path, step: int) -> list[dict]:
    """Keep the lines of a per-step log with "step" <= `step` (a resume redoes the rest); returns them."""
    if not Path(path).exists():
        return []
    kept = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    kept = [r for r in kept if r["step"] <= step]
    atomic_write_bytes(path, "".join(json.dumps(r) + "\n" for r in kept).encode())
    return kept


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpectoolError(f"{path} does not exist") from None
    except json.JSONDecodeError as e:
        raise SpectoolError(f"{path} is not valid JSON ({e}); the file is corrupt") from None


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def make_manifest(kind: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "schema_version": SCHEMA_VERSION, "spectool_version": __version__, **fields}


def load_manifest(run_dir: Path, kind: str) -> dict[str, Any]:
    """Read a run's manifest and check it is a `kind` run of a schema this version reads."""
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        raise SpectoolError(f"{run_dir} is not a spectool {kind} run (no {MANIFEST})")
    m = read_json(path)
    if m.get("kind") != kind:
        raise SpectoolError(f"{run_dir} is a '{m.get('kind')}' run, expected a '{kind}' run")
    if m.get("schema_version") != SCHEMA_VERSION:
        raise SpectoolError(
            f"{run_dir} has schema version {m.get('schema_version')}; this spectool reads "
            f"version {SCHEMA_VERSION}. Re-create it with this version."
        )
    return m


def claim(out: Path, kind: str, settings: Any, *, saved_as: str = CONFIG, may_change: frozenset[str] | set[str] = frozenset(),
          defaults: Any = None, flag: str = "--out", hint: str = "", replace: bool = False) -> bool:
    """The one rule for a command's output folder, applied before anything is written there:
    - a new or empty folder (a crashed run may leave just its engine.log) is claimed;
    - a folder holding another kind of run, or files that are no spectool run, is refused,
      named for what it holds;
    - a folder holding a `kind` run (its manifest says so, or a crashed one left its settings in
      `saved_as`) resumes only with the same settings: other settings are refused, naming the keys
      (dotted; `may_change`: keys a resumed run may change; `defaults`: the settings a run from an
      older version lacked).
    Then the resolved settings are written as `saved_as`. With `replace` (a caller that builds a
    new folder and swaps it in whole, as export does) only the first two rules apply and nothing
    is written. Returns whether a run of this kind is there."""
    out = Path(out)
    files = {f.name for f in out.iterdir()} if out.exists() else set()
    new = flatten_keys(settings)
    resumed = not files <= {"engine.log"}
    if resumed:
        found = read_json(out / MANIFEST).get("kind") if MANIFEST in files else None
        old = flatten_keys(read_json(out / saved_as)) if saved_as in files else None
        if found is None and not (old and set(old) >= set(new) - {*may_change, "out"}):
            raise SpectoolError(f"{flag} {out} holds other files; pick a new {flag}: files that are not a spectool run "
                                f"stay as they are, and a {kind} run goes into a new or empty folder or over an earlier "
                                f"{kind} run")
        if found not in (None, kind):
            raise SpectoolError(f"{flag} {out} holds a '{found}' run; a {kind} run goes into a new or empty folder, or "
                                f"over an earlier {kind} run")
        if replace:
            return True
        old = {**flatten_keys(defaults or {}), **(old or {})}
        diff = sorted(k for k in set(old) | set(new) if k not in {*may_change, "out"} and old.get(k) != new.get(k))
        if diff:
            raise SpectoolError(f"{flag} {out} holds a {kind} run with other settings ({', '.join(diff)} differ); rerun "
                                f"with the same settings to resume, or pick a new {flag}{hint}")
    if not replace:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / saved_as, settings)
    return resumed


def flatten_keys(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Settings (a dataclass or a dict tree) as {dotted key: leaf value}, JSON-normalised:
    {"a": {"b": 1}} -> {"a.b": 1}."""
    flat: dict[str, Any] = {}
    for k, v in _jsonable(tree).items():
        flat.update(flatten_keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return flat

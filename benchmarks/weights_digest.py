"""What models.weights_digest costs against a full sha256 of the weights (docs/drafters.md, "Features with an
identity"): each folder timed with its files' page cache dropped first (posix_fadvise, cold) and again warm.

    PYTHONPATH=src python benchmarks/weights_digest.py ~/.cache/spectool/models/smollm2-135m make:/tmp/wd:400:10

`make:FOLDER:N:MIB` first writes FOLDER/model.safetensors with N random bf16 tensors of MIB MiB each (400 tensors:
a 16 GB Qwen3-8B checkpoint's count; the digest reads the same windows whatever a tensor's size).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from spectool.models import weights_digest


def drop(folder: Path) -> None:
    """The files' pages out of the page cache (clean pages: no root needed)."""
    for p in folder.glob("*.safetensors"):
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def make(folder: Path, n: int, mib: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    p, size = folder / "model.safetensors", mib << 20
    if p.exists():
        return
    header = {f"model.layers.{i}.w": {"dtype": "BF16", "shape": [size // 2], "data_offsets": [i * size, (i + 1) * size]}
              for i in range(n)}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    rng = np.random.default_rng(0)
    with open(p, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h)
        for _ in range(n):
            f.write(rng.integers(0, 255, size, dtype=np.uint8).tobytes())
    os.sync()


def full_sha256(folder: Path) -> None:
    h = hashlib.sha256()
    for p in sorted(folder.glob("*.safetensors")):
        with open(p, "rb") as f:
            h.update(hashlib.file_digest(f, "sha256").digest())


def main() -> None:
    for arg in sys.argv[1:]:
        if arg.startswith("make:"):
            _, name, n, mib = arg.split(":")
            make(Path(name), int(n), int(mib))
            arg = name
        folder = Path(arg).expanduser()
        gib = sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 2**30
        for cold in (True, False):
            if cold:
                drop(folder)
            t = time.perf_counter()
            weights_digest(folder)
            digest_s = time.perf_counter() - t
            if cold:
                drop(folder)
            t = time.perf_counter()
            full_sha256(folder)
            print(f"{folder}: {gib:.2f} GiB, {'cold' if cold else 'warm'}: weights_digest {digest_s:.3f} s, "
                  f"full sha256 {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main()

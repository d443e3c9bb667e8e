"""Compiled kernels a killed run leaves broken, found before an engine starts and named when one fails.

torch inductor compiles a kernel straight to its final path (`<key>.main.so`) and skips the compile whenever
that file exists (torch 2.13 torch/_inductor/codecache.py `_worker_compile_cpp`). A run killed while the compiler
writes leaves a zero-byte or cut-short .so, and every later start that needs the same kernel loads it and fails:
"InductorError: ImportError: ... main.so: file too short". Two folders hold such kernels: torch inductor's cache
(TORCHINDUCTOR_CACHE_DIR, else torch's default /tmp/torchinductor_<user>) and vLLM's compile cache
(VLLM_CACHE_ROOT/torch_compile_cache, whose inductor_cache folders vLLM points torch at while it compiles).
Both are caches: a deleted kernel is compiled again on the next start.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import time
from pathlib import Path

# A zero-byte kernel older than this is no compile in progress (a linker writes its output within seconds of
# creating it), so it can never become valid: removed before an engine starts.
STALE_S = 120
# What the dynamic loader says of a cut-short shared object: "<path>: file too short" / "invalid ELF header"
CUT_SHORT = re.compile(r"(/[^\s:'\"]+\.so): (?:file too short|invalid ELF header)")


def cache_dirs() -> list[Path]:
    """Where an engine start's compiled kernels lie: torch inductor's cache (as torch's cache_dir() picks it,
    without creating it) and vLLM's compile cache."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # noqa: PLC0415 (torch: engine starts only)

    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    vllm_root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm")
    return [Path(inductor).expanduser().resolve(), (Path(vllm_root).expanduser() / "torch_compile_cache").resolve()]


def remove_truncated_kernels() -> list[Path]:
    """Delete the zero-byte compiled kernels (*.so, older than STALE_S) under cache_dirs(), saying so; returns them."""
    cutoff = time.time() - STALE_S
    removed = []
    for root in cache_dirs():
        for so in root.rglob("*.so") if root.is_dir() else ():
            try:
                stat = so.stat()
                if stat.st_size == 0 and stat.st_mtime < cutoff:
                    so.unlink()
                    removed.append(so)
            except OSError:  # gone meanwhile, or not ours to delete
                continue
    if removed:
        logging.getLogger(__name__).warning(
            f"removed {len(removed)} zero-byte compiled kernel(s) a killed run left in the compile cache (they can "
            f"never load; compiled again on this start): {', '.join(map(str, removed))}")
    return removed


def cut_short_advice(text: str) -> str | None:
    """The fix for an engine start that failed loading a cut-short compiled kernel (`text`: the error and the
    engine log written during the start); None when that is not what failed."""
    found = CUT_SHORT.search(text)
    if found is None and "file too short" not in text:
        return None
    roots = cache_dirs()
    kernel = Path(found.group(1)).resolve() if found else None
    if kernel is None:  # the path did not survive in the text: every cache folder there is
        delete, where = [r for r in roots if r.is_dir()] or roots, "a compiled .so: file too short"
    else:
        delete, where = [r for r in roots if kernel.is_relative_to(r)], f"{kernel}: file too short"
        if not delete:
            return None  # a library outside the compile caches: the error itself says which
    return (f"vLLM could not start: a compiled kernel in torch inductor's cache is cut short ({where}), as a run "
            "killed while it compiled leaves it, and every start that needs that kernel loads it again. Delete the "
            "cache (a cache only: its kernels are compiled again on the next start): "
            f"rm -rf {' '.join(shlex.quote(str(r)) for r in delete)}")

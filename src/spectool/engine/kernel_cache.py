"""Compiled kernels a killed run leaves broken, found before an engine starts and named when one fails.

torch inductor compiles a kernel straight to its final path (`<key>.main.so`) and skips the compile whenever
that file exists (torch 2.13 torch/_inductor/codecache.py `_worker_compile_cpp`). A run killed while the compiler
writes leaves a zero-byte or cut-short .so, and every later start that needs the same kernel loads it and fails:
"InductorError: ImportError: ... main.so: file too short". Two folders hold such kernels: torch inductor's cache
(TORCHINDUCTOR_CACHE_DIR, else torch's default /tmp/torchinductor_<user>) and vLLM's compile cache
(VLLM_CACHE_ROOT/torch_compile_cache, whose inductor_cache folders vLLM points torch at while it compiles).
Both are caches: a deleted kernel is compiled again on the next start. A user's `compilation_config.cache_dir`, which
vLLM uses verbatim instead of its own folder (compilation/backends.py:1058@0.26), and a caller's TRITON_CACHE_DIR (kept
by 0.33: compiler_interface.py:35-40@0.33) are scanned too.

Age is judged by the cache's own file system clock (the mtime of a file touched there now): on a cache shared over
NFS, mtimes are the server's, and a host clock ahead of it would take a kernel another node is linking right now for
an old one. Where nothing can be touched, this host's clock with a 10-minute floor.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

# A zero-byte kernel older than this is no compile in progress (a linker writes its output within seconds of
# creating it), so it can never become valid: removed before an engine starts. Judged by the file system's clock.
STALE_S = 120
# The age required where the file system's clock cannot be read (a read-only cache): this host's clock may be minutes
# off a shared file system's.
STALE_HOST_CLOCK_S = 600
# What the dynamic loader says of a cut-short shared object: "<path>: file too short" / "invalid ELF header"
CUT_SHORT = re.compile(r"(/[^\s:'\"]+\.so): (?:file too short|invalid ELF header)")
log = logging.getLogger(__name__)


def cache_dirs(llm_kwargs: dict[str, Any] | None = None) -> list[Path]:
    """Where an engine start's compiled kernels lie: torch inductor's cache (as torch's cache_dir() picks it,
    without creating it), vLLM's compile cache, and the `compilation_config.cache_dir` in the `LLM`'s kwargs and a
    caller's TRITON_CACHE_DIR when set."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # noqa: PLC0415 (torch: engine starts only)

    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    vllm_root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm")
    roots = [Path(inductor), Path(vllm_root) / "torch_compile_cache"]
    configured = _configured_cache_dir((llm_kwargs or {}).get("compilation_config"))
    roots += [Path(d) for d in (configured, os.environ.get("TRITON_CACHE_DIR")) if d]
    out: list[Path] = []
    for root in roots:
        resolved = root.expanduser().resolve()
        if resolved not in out:
            out.append(resolved)
    return out


def _configured_cache_dir(compilation_config: Any) -> str | None:
    """A `compilation_config`'s cache_dir, given as a dict or a CompilationConfig (an int or str is a level)."""
    if isinstance(compilation_config, dict):
        return compilation_config.get("cache_dir") or None
    return getattr(compilation_config, "cache_dir", None) or None


def _cutoff(root: Path) -> float:
    """The mtime below which a zero-byte kernel under `root` is no compile in progress: STALE_S before "now" on the
    root's own file system (a file touched there), else STALE_HOST_CLOCK_S before this host's clock."""
    try:
        with tempfile.NamedTemporaryFile(dir=root, prefix=".spectool-clock-") as probe:
            return os.fstat(probe.fileno()).st_mtime - STALE_S
    except OSError:
        return time.time() - STALE_HOST_CLOCK_S


def remove_truncated_kernels(llm_kwargs: dict[str, Any] | None = None) -> list[Path]:
    """Delete the zero-byte compiled kernels (*.so, stale by their file system's clock) under cache_dirs(llm_kwargs),
    saying so; returns them. The roots scanned are logged."""
    removed = []
    roots = [r for r in cache_dirs(llm_kwargs) if r.is_dir()]
    log.info(f"compile caches scanned for cut-short kernels: {', '.join(map(str, roots)) or 'none present'}")
    for root in roots:
        cutoff = _cutoff(root)
        for so in root.rglob("*.so"):
            try:
                stat = so.stat()
                if stat.st_size == 0 and stat.st_mtime < cutoff:
                    so.unlink()
                    removed.append(so)
            except OSError:  # gone meanwhile, or not ours to delete
                continue
    if removed:
        log.warning(
            f"removed {len(removed)} zero-byte compiled kernel(s) a killed run left in the compile cache (they can "
            f"never load; compiled again on this start): {', '.join(map(str, removed))}")
    return removed


def cut_short_advice(text: str, llm_kwargs: dict[str, Any] | None = None) -> str | None:
    """The fix for an engine start that failed loading a cut-short compiled kernel (`text`: the error and the
    engine log written during the start; `llm_kwargs`: the `LLM`'s, for a configured cache); None when that is not
    what failed."""
    found = CUT_SHORT.search(text)
    if found is None and "file too short" not in text:
        return None
    roots = cache_dirs(llm_kwargs)
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

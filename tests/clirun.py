"""The spectool CLI in a subprocess, as a user runs it (vLLM starts worker processes)."""

from __future__ import annotations

import os
import subprocess
import sys


def spectool(*args, env=None, check=True):
    e = {**os.environ, **(env or {})}
    if os.environ.get("SPECTOOL_TEST_FORK") == "1":  # an experiment, off by default: tests/zygote.py
        r = _forked([str(a) for a in args], e)
    else:
        r = subprocess.run([sys.executable, "-m", "spectool.cli", *args], capture_output=True, text=True, env=e,
                           timeout=900)
    if check and r.returncode != 0:
        raise AssertionError(f"spectool {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def free_port() -> int:
    """A TCP port free now (for a launcher's or TRL's rendezvous: runs of one session must not share one)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_ZYGOTE: dict = {}


def _forked(args: list[str], env: dict) -> subprocess.CompletedProcess:
    """The CLI run forked from tests/zygote.py's server (started on first use, with vLLM imported once)."""
    import json
    import socket
    import tempfile
    from pathlib import Path

    if "path" not in _ZYGOTE:
        folder = Path(tempfile.mkdtemp(prefix="spectool-zygote-"))
        path = str(folder / "socket")
        proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zygote.py")), path],
                                stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        assert proc.stdout.readline().strip() == "ready", "the CLI zygote did not start"
        _ZYGOTE.update(path=path, proc=proc, folder=folder)
        import atexit

        atexit.register(proc.kill)
    out, err = _ZYGOTE["folder"] / "stdout", _ZYGOTE["folder"] / "stderr"
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(_ZYGOTE["path"])
        s.settimeout(900)
        with s.makefile("rw") as f:
            f.write(json.dumps({"args": args, "env": env, "cwd": os.getcwd(), "stdout": str(out),
                                "stderr": str(err)}) + "\n")
            f.flush()
            code = json.loads(f.readline())["returncode"]
    return subprocess.CompletedProcess(["spectool", *args], code, out.read_text(), err.read_text())

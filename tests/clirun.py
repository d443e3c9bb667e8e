"""The spectool CLI in a subprocess, as a user runs it (vLLM starts worker processes)."""

from __future__ import annotations

import os
import subprocess
import sys


def spectool(*args, env=None, check=True):
    e = {**os.environ, **(env or {})}
    r = subprocess.run([sys.executable, "-m", "spectool.cli", *args], capture_output=True, text=True, env=e, timeout=900)
    if check and r.returncode != 0:
        raise AssertionError(f"spectool {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def free_port() -> int:
    """A TCP port free now (for a launcher's or TRL's rendezvous: runs of one session must not share one)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

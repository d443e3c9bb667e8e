"""The spectool CLI in a subprocess, as a user runs it (vLLM starts worker processes)."""

from __future__ import annotations

import os
import subprocess
import sys


def forking() -> bool:
    """CLI runs are forked from tests/zygote.py (vLLM, torch and transformers imported once) unless
    SPECTOOL_TEST_FORK=0: each run still has its own process, environment, folder and engines; only the 9-11 s
    import of a fresh interpreter is not paid again (docs/architecture.md, "Tests"). The runs that must start
    fresh say so with `subprocess` (test_train_rl_e2e's killed and resumed runs, the launchers, --help)."""
    return os.environ.get("SPECTOOL_TEST_FORK", "1") != "0"


def spectool(*args, env=None, check=True):
    e = {**os.environ, **(env or {})}
    if forking():
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


def nodes(commands: list[list[str]], cwds: list | None = None, env: dict | None = None,
          timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Launchers started side by side, as a launch across nodes starts one per node (here all on this machine, on
    loopback), each in its own working directory (`cwds`); their results once all have ended. One still running at
    `timeout` is killed, so a launch whose nodes wait for each other forever fails the test instead of hanging it."""
    import signal
    import tempfile
    import time

    e = {**os.environ, **(env or {})}
    logs = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in commands]  # no pipe fills up
    procs = [subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, text=True, env=e, start_new_session=True)
             for cmd, cwd, (out, err) in zip(commands, cwds or [None] * len(commands), logs)]
    deadline = time.monotonic() + timeout
    try:
        codes = [p.wait(timeout=max(deadline - time.monotonic(), 0.1)) for p in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in procs:
            if p.poll() is None:  # the launcher and the ranks it started (its own session)
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    results = []
    for cmd, p, (out, err) in zip(commands, procs, logs):
        out.seek(0), err.seek(0)
        results.append(subprocess.CompletedProcess(cmd, p.returncode, out.read(), err.read()))
        out.close(), err.close()
    assert codes is not None, f"the nodes did not end within {timeout} s:\n" + "\n".join(r.stderr[-2000:] for r in results)
    return results


_ZYGOTE: dict = {}


def start_zygote() -> None:
    """Start tests/zygote.py's server once a test run, without waiting for its imports (the warm-up in
    tests/conftest.py starts it first, so its imports overlap the others; `zygote_ready` waits for "ready")."""
    import atexit
    import tempfile
    from pathlib import Path

    if "proc" in _ZYGOTE:
        return
    folder = Path(tempfile.mkdtemp(prefix="spectool-zygote-"))
    path = str(folder / "socket")
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zygote.py")), path],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    _ZYGOTE.update(path=path, proc=proc, folder=folder)
    atexit.register(proc.kill)


def zygote_ready() -> None:
    """Start the zygote if need be and wait for its imports (the suite's warm-up does, before any test is timed:
    tests/conftest.py pytest_costs_warm_up)."""
    start_zygote()
    if not _ZYGOTE.get("ready"):
        line = _ZYGOTE["proc"].stdout.readline().strip()
        assert line == "ready", f"the CLI zygote did not start ({line!r})"
        _ZYGOTE["ready"] = True


def _forked(args: list[str], env: dict) -> subprocess.CompletedProcess:
    """The CLI run forked from tests/zygote.py's server (vLLM imported once; started here if the warm-up did not)."""
    import json
    import socket

    zygote_ready()
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

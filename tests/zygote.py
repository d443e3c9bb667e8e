"""A CLI run forked from a process that has already imported vLLM (the suite's default; SPECTOOL_TEST_FORK=0 turns it off).

`python -m spectool.cli ...` pays 9-11 s to import vLLM, torch and transformers before it does anything;
the suite runs the CLI about 80 times. tests/clirun.py asks this server instead (unless SPECTOOL_TEST_FORK=0):
it imports the heavy libraries once and runs `spectool.engine.prefork` (its torch ops at one thread, so no OpenMP
pool exists to be broken by fork), then forks a child per CLI run, in which the run's environment, folder and argv
are set and stdout/stderr go to files, exactly as in a fresh process. Still one process per command, and every
engine it starts is its own. Children that spawn (vLLM workers, launchers) start fresh; sweep-k's arms and
verify's lossy control fork from one forkserver the zygote started for every run (a user's run starts its own).

Protocol: one JSON line per request on a Unix socket, {"args", "env", "cwd", "stdout", "stderr"}; the
answer is one JSON line {"returncode"}.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def _share_the_forkserver() -> None:
    """Let this forked CLI run use the forkserver the zygote started (`_start_the_forkserver`): the server is the
    zygote's child, not this process's, so the liveness check multiprocessing makes (waitpid on its pid) cannot run
    here; the resource tracker's own check (a write to its pipe) still does."""
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    multiprocessing.forkserver._forkserver.ensure_running = multiprocessing.resource_tracker.ensure_running


def _start_the_forkserver() -> None:
    """The forkserver sweep-k's arms and verify's lossy control fork from, started once for the whole suite instead of
    once per CLI run (a fresh interpreter importing vLLM and running prefork: about 10 s each time, measured). The
    product's own start (spectool.subproc, a CLI run as a user makes it) runs under SPECTOOL_TEST_FORK=0 and in
    tests/test_subproc.py and tests/test_prefork.py."""
    from spectool import subproc
    from spectool.engine.compat import warm_imports

    if warm_imports():
        subproc.start_forkserver(warm_imports())


def _child(req: dict) -> None:
    os.setsid()
    _share_the_forkserver()
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    sys.argv = ["spectool", *req["args"]]
    code = 0
    try:
        from spectool.cli import main

        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends a fresh interpreter
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve(path: str) -> None:
    import torch  # noqa: F401 - what every CLI run would import, imported once
    import transformers  # noqa: F401
    import vllm  # noqa: F401

    import spectool.cli  # noqa: F401
    import spectool.engine.prefork  # noqa: F401 - as sweep-k's forkserver does: worker modules, compiled sampler ops

    _start_the_forkserver()
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(8)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        with conn, conn.makefile("rw") as f:
            req = json.loads(f.readline())
            pid = os.fork()
            if pid == 0:
                server.close()
                _child(req)
            _, status = os.waitpid(pid, 0)
            f.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
            f.flush()


if __name__ == "__main__":
    serve(sys.argv[1])

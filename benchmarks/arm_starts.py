"""What an engine run in its own process costs from the call to its result, three ways: a fresh interpreter (vLLM,
torch and transformers imported again by each); forked from a forkserver that imported them once; and forked from
one that also ran `spectool.engine.prefork` (the worker modules imported, vLLM's compiled sampler ops compiled, the
heap frozen): `compat.warm_imports()`, what sweep-k's arms and verify's kernel control use on the CPU build. The
same tiny measure_arm each time (plain decoding, batch 1, T=1 with logprobs).

    SPECTOOL_ENFORCE_EAGER=1 .venv/bin/python benchmarks/arm_starts.py [--model smollm2-135m] [--runs 3] [--max-tokens 8]

(eager engines: with torch.compile on, the model's compile, 30-60 s an arm on 2 cores, drowns the difference)

A process has one forkserver, so each way runs as a block in its own child process; the blocks run in one order,
then in reverse (drift cancels), in one run. Prints each call's seconds, the medians and the ratios. A forkserver's
own start (its imports and warm-up, once per sweep) is paid by the block's first call, which is left out of the
forked medians (a fresh call has no server: all its calls count).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from spectool.constants import DEFAULT_MODEL

WAYS = ("fresh", "imports", "prefork")


def _block(way: str, model: str, runs: int, max_tokens: int) -> list[float]:
    """Run in the child: `runs` + 1 engine runs the given way (the first pays the forkserver's start)."""
    from spectool import subproc
    from spectool.engine.compat import warm_imports
    from spectool.models import resolve_model

    warm = warm_imports()
    if not warm:
        raise SystemExit("this vLLM build starts every arm fresh (compat.warm_imports() is empty): nothing to compare")
    modules = {"fresh": (), "imports": tuple(m for m in warm if m != "spectool.engine.prefork"), "prefork": warm}[way]
    path = resolve_model(model).path
    log = tempfile.mkdtemp(prefix="arm-starts-") + "/engine.log"
    seconds = []
    for _ in range(runs + 1):
        t = time.perf_counter()
        subproc.call("spectool.engine.arms", "measure_arm", dict(
            model_path=path, method="none", k=0, drafts={}, prompts=[[1, 2, 3, 4]], batch_sizes=[1],
            max_tokens=max_tokens, temperature=1.0, min_seqs=1, seed=0, log_path=log), warm=modules)
        seconds.append(time.perf_counter() - t)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--runs", type=int, default=3, help="engine runs per block (two blocks a way)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--block", choices=WAYS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if os.environ.get("SPECTOOL_PREFORK") == "0":
        raise SystemExit("SPECTOOL_PREFORK=0 makes prefork the same as imports: unset it to compare")
    if a.block:
        print(json.dumps(_block(a.block, a.model, a.runs, a.max_tokens)))
        return
    seconds: dict[str, list[float]] = {w: [] for w in WAYS}
    first: dict[str, list[float]] = {w: [] for w in WAYS}
    for order in (WAYS, WAYS[::-1]):
        for way in order:
            r = subprocess.run([sys.executable, __file__, "--block", way, "--model", a.model, "--runs", str(a.runs),
                                "--max-tokens", str(a.max_tokens)], capture_output=True, text=True, check=True)
            got = json.loads(r.stdout.strip().splitlines()[-1])
            first[way].append(got[0])
            seconds[way] += got[1:] if way != "fresh" else got  # a fresh call has no server to start
            print(f"{way:>8}: " + ", ".join(f"{s:.1f}" for s in got) + " s", flush=True)
    med = {w: statistics.median(s) for w, s in seconds.items()}
    print("median per engine run: " + ", ".join(f"{w} {med[w]:.1f} s (of {len(seconds[w])})" for w in WAYS))
    print(f"forked with imports vs fresh: {med['fresh'] / med['imports']:.2f}x ({med['fresh'] - med['imports']:.1f} s saved)")
    print(f"forked with prefork vs imports only: {med['imports'] / med['prefork']:.2f}x "
          f"({med['imports'] - med['prefork']:.1f} s saved); vs fresh {med['fresh'] / med['prefork']:.2f}x")
    print("a block's first forked call (its forkserver's start plus one engine run): " + ", ".join(
        f"{w} {statistics.median(first[w]):.1f} s" for w in ("imports", "prefork")))


if __name__ == "__main__":
    main()

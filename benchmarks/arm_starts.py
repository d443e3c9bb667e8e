"""What an engine run in its own process costs from the call to its result: a fresh interpreter (vLLM, torch and
transformers imported again by each) against a process forked from a forkserver that imported them once
(`subproc.call(..., warm=compat.warm_imports())`, what sweep-k's arms and verify's kernel control use on the CPU
build). Side by side in one run, alternating, the same tiny measure_arm each time (plain decoding, batch 1).

    .venv/bin/python benchmarks/arm_starts.py [--model smollm2-135m] [--runs 3] [--max-tokens 8]

Prints each call's seconds per arm, their medians and the ratio. The forkserver's own start (its imports, once)
is paid inside the first warm call, as a sweep pays it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from spectool import subproc
from spectool.config import DEFAULT_MODEL
from spectool.engine.compat import warm_imports


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8)
    a = ap.parse_args()

    from spectool.models import resolve_model

    warm = warm_imports()
    if not warm:
        raise SystemExit("this vLLM build starts every arm fresh (compat.warm_imports() is empty): nothing to compare")
    model = resolve_model(a.model)
    log = tempfile.mkdtemp(prefix="arm-starts-") + "/engine.log"
    seconds: dict[str, list[float]] = {"fresh": [], "forked": []}
    for i in range(a.runs):
        for arm, modules in (("fresh", ()), ("forked", warm)) if i % 2 == 0 else (("forked", warm), ("fresh", ())):
            t = time.perf_counter()
            subproc.call("spectool.engine.arms", "measure_arm", dict(
                model_path=model.path, method="none", k=0, drafts={}, prompts=[[1, 2, 3, 4]], batch_sizes=[1],
                max_tokens=a.max_tokens, temperature=1.0, min_seqs=1, seed=0, log_path=log), warm=modules)
            seconds[arm].append(time.perf_counter() - t)
            print(f"run {i} {arm:>6}: {seconds[arm][-1]:.1f} s", flush=True)
    fresh, forked = statistics.median(seconds["fresh"]), statistics.median(seconds["forked"])
    print(f"median per engine run: fresh interpreter {fresh:.1f} s, forked {forked:.1f} s: "
          f"{fresh / forked:.2f}x, {fresh - forked:.1f} s saved per arm (the first forked call paid the server's imports: "
          f"{seconds['forked'][0]:.1f} s)")


if __name__ == "__main__":
    main()

"""Plain-decoding throughput of the embedded policy at batch 1 / 8 / 32: torch.compile vs eager,
side by side in one run (each arm in its own process and engine, same prompts and settings).

    .venv/bin/python benchmarks/engine_throughput.py [--model smollm2-135m] [--max-tokens 64]

Prints tokens/s per batch size for both arms and their ratio.
"""

from __future__ import annotations

import argparse

from spectool import subproc
from spectool.constants import DEFAULT_DATA, DEFAULT_MODEL


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()

    from transformers import AutoTokenizer

    from spectool.data import load_source
    from spectool.models import resolve_model
    from spectool.prompts import encode_prompt

    model = resolve_model(a.model)
    batches = [int(x) for x in a.batch_sizes.split(",")]
    tok = AutoTokenizer.from_pretrained(model.path)
    prompts = [encode_prompt(tok, t.messages) for t in load_source(a.data).tasks("eval", max(batches))]
    res = {}
    for arm, eager in (("compiled", "0"), ("eager", "1")):
        rows = subproc.call("spectool.engine.arms", "measure_arm", dict(
            model_path=model.path, method="none", k=0, draft=None, prompts=prompts, batch_sizes=batches,
            max_tokens=a.max_tokens, temperature=1.0, min_seqs=8, seed=0), env={"SPECTOOL_ENFORCE_EAGER": eager})
        res[arm] = {r["batch"]: r["tokens_per_s"] for r in rows}
    print(f"{'batch':>6} {'compiled tok/s':>15} {'eager tok/s':>12} {'compiled/eager':>15}")
    for b in batches:
        c, e = res["compiled"][b], res["eager"][b]
        print(f"{b:>6} {c:>15.1f} {e:>12.1f} {c / e:>14.2f}x")


if __name__ == "__main__":
    main()

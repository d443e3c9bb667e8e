"""In-domain vs general-chat draft initialisation, same budget, on held-out math (the seed's claim).

Trains (or reuses) two drafts for the embedded policy with identical settings except the data:
`--data <math task>` and `--data chat` (built-in general prompts), with the number of harvested
samples chosen so both see about the same number of response tokens; then, for each draft and
temperature, `spectool rollout --compare` on the same held-out math prompts (plain decoding
measured in the same invocation). Prints acceptance length, per-position acceptance, speedup.

    .venv/bin/python benchmarks/draft_domain.py --math-draft runs/draft-math2 --chat-draft runs/draft-chat
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from spectool.stats import AcceptanceStats

ROOT = Path(__file__).resolve().parents[1]
SPECTOOL = [sys.executable, "-m", "spectool.cli"]


def sh(*args: str) -> None:
    print("$ spectool " + " ".join(args), file=sys.stderr)
    subprocess.run([*SPECTOOL, *args], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--math-draft", required=True)
    ap.add_argument("--chat-draft", required=True)
    ap.add_argument("--train-args", default="--n-prompts 192 --epochs 4 --lr 1e-3 --batch-size 16",
                    help="init-draft flags shared by both drafts")
    ap.add_argument("--math-samples", type=int, default=8)
    ap.add_argument("--chat-samples", type=int, default=2, help="fewer: chat responses are ~4x longer")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--n-prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--out", default="runs/draft-domain")
    a = ap.parse_args()

    for d, data, samples in ((a.math_draft, None, a.math_samples), (a.chat_draft, "chat", a.chat_samples)):
        if not (Path(d) / "manifest.json").exists():
            sh("init-draft", "--out", d, *(["--data", data] if data else []), "--samples", str(samples),
               *a.train_args.split())
    rows = []
    for name, d in (("in-domain (math)", a.math_draft), ("general (chat)", a.chat_draft)):
        man = json.loads((Path(d) / "manifest.json").read_text())
        recs = man.get("records")
        for t in (0.0, 1.0):
            out = Path(a.out) / f"{Path(d).name}-t{t:g}"
            samples = a.samples if t > 0 else 1  # greedy samples of one prompt are identical
            if not (out / "manifest.json").exists():  # a rerun reuses finished measurements
                sh("rollout", "--draft", d, "--k", str(a.k), "--compare", "--temperature", str(t), "--n-prompts",
                   str(a.n_prompts), "--samples", str(samples), "--max-tokens", "128", "--out", str(out))
            s = json.loads((out / "manifest.json").read_text())["summary"]
            acc = AcceptanceStats(**s["acceptance"])
            rows.append((name, recs, t, acc.mean_acceptance_length, acc.per_position_rate,
                         s["tokens_per_s"] / s["plain_tokens_per_s"]))
    print(f"held-out math, k={a.k}, {a.n_prompts} prompts x {a.samples} samples, speedup vs plain in the same run")
    print(f"{'draft':>18} {'records':>8} {'T':>4} {'accept. len':>11} {'per position':>18} {'speedup':>8}")
    for name, recs, t, al, pp, sp in rows:
        print(f"{name:>18} {recs!s:>8} {t:>4g} {al:>11.2f} {' '.join(f'{x:.2f}' for x in pp):>18} {sp:>7.2f}x")


if __name__ == "__main__":
    main()

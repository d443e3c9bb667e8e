"""The lifecycle at reasoning length on this CPU (issue 60): harvest -> init-draft -> export -> rollout --compare ->
verify past a 2,048-token context, and the engine's acceptance by how deep into a long response a token lies.

Every stage runs as a user runs it (`spectool ...` in a child process; its wall seconds and peak RSS recorded);
the context of each engine is derived by the commands themselves (prompt + --max-tokens, within the model's limit).

1. harvest: the embedded policy at T=1 on 12 prompts that ask for long answers (all in the train split:
   benchmarks/data/long_prompts_4k.jsonl), 2 samples each, --max-tokens 4608; the table counts the responses of at
   least 4,096 tokens and the stop reasons (EOS or cap).
2. init-draft on that harvest (EAGLE-3, k <= 3), 3. export (checked on the engine), 4. rollout --compare at the
   same lengths (2 prompts: plain and speculative decoding, the same prompts and seeds), 5. verify --depth D: each prompt is
   first extended by D tokens of the policy's own sample, so the tested positions lie past D (D > 2,048).
6. Acceptance by depth: for each harvested response of at least --min-depth-tokens tokens and each offset P of
   DEPTHS, the engine (the exported draft, k) continues prompt + response[:P] for --window tokens at T=1; vLLM's
   own counters per bucket of P (0-512, 512-2k, 2k-4k, 4k+) give the acceptance length there. The continuation of
   the policy's own prefix is what a rollout samples at that depth.

    .venv/bin/python benchmarks/long_lifecycle.py --out runs/long-life      # ~1 h on 2 cores
    .venv/bin/python benchmarks/long_lifecycle.py --report benchmarks/data/long_lifecycle_2026-11-28.json

Resumable: a stage whose run folder holds a manifest is reused.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SPECTOOL = [sys.executable, "-m", "spectool.cli"]
PROMPTS = ROOT / "benchmarks" / "data" / "long_prompts_4k.jsonl"
BUCKETS = ((0, 512), (512, 2048), (2048, 4096), (4096, 1 << 30))  # response positions, [from, to)
DEPTHS = (0, 256, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096)  # prefix lengths P, each continued for --window


def run_measured(args: list[str], log: Path) -> dict:
    """Run `spectool args` with its output in `log`; its wall seconds and peak RSS (GiB, the child's own)."""
    print("$ spectool " + " ".join(args), file=sys.stderr, flush=True)
    t = time.perf_counter()
    with open(log, "a") as f:
        p = subprocess.Popen([*SPECTOOL, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return {"seconds": time.perf_counter() - t, "peak_rss_gib": usage.ru_maxrss / 1024**2, "exit_code": code}


def stage(out: Path, name: str, args: list[str], done: Path, ok_codes=(0,)) -> dict:
    """One stage, run once: its measurement is kept in out/stages.json (a finished stage is not run again)."""
    path = out / "stages.json"
    stages = json.loads(path.read_text()) if path.exists() else {}
    if name in stages and done.exists():
        return stages[name]
    m = run_measured(args, out / f"{name}.log")
    if m["exit_code"] not in ok_codes:
        sys.exit(f"spectool {args[0]} exited {m['exit_code']}: see {out / (name + '.log')}")
    stages[name] = m
    path.write_text(json.dumps(stages, indent=2))
    return m


def harvested(h: Path) -> list[dict]:
    """The harvest's records: prompt ids, response ids, finish reason."""
    from spectool.records import load_records  # noqa: PLC0415 (datasets loads only here)

    return [{"prompt_ids": list(r["prompt_ids"]), "response_ids": list(r["response_ids"]),
             "finish_reason": r["finish_reason"]} for r in load_records(h)]


def bucket_of(p: int) -> str:
    lo, hi = next(b for b in BUCKETS if b[0] <= p < b[1])
    return f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+"


def acceptance_by_depth(records: list[dict], export: Path, k: int, window: int, min_tokens: int, seed: int) -> dict:
    """Per bucket of prefix length P: vLLM's acceptance counters over continuations of prompt + response[:P]."""
    from spectool.engine.engine import Engine, EngineConfig, Sampling  # noqa: PLC0415 (vLLM loads only here)
    from spectool.models import resolve_model  # noqa: PLC0415

    long = [r for r in records if len(r["response_ids"]) >= min_tokens]
    if not long:
        sys.exit(f"no harvested response reaches {min_tokens} tokens: harvest more prompts or longer")
    model = resolve_model("smollm2-135m").path
    longest = max(len(r["prompt_ids"]) + len(r["response_ids"]) for r in long) + window
    engine = Engine(EngineConfig(model_path=model, draft_path=str(export), k=k, seed=seed, max_model_len=longest))
    cells: dict[str, dict] = {}
    try:
        for p in DEPTHS:
            prompts = [r["prompt_ids"] + r["response_ids"][:p] for r in long if len(r["response_ids"]) >= p + window]
            if not prompts:
                continue
            t = time.perf_counter()
            outs, stats = engine.generate(prompts, Sampling(max_tokens=window, temperature=1.0, seed=seed + p))
            c = cells.setdefault(bucket_of(p), {"offsets": [], "sequences": 0, "tokens": 0, "drafts": 0,
                                                "accepted": 0, "seconds": 0.0})
            c["offsets"].append(p)
            c["sequences"] += len(prompts)
            c["tokens"] += sum(len(o[0].response_ids) for o in outs)
            c["drafts"] += stats.num_drafts
            c["accepted"] += stats.num_accepted_tokens
            c["seconds"] += time.perf_counter() - t
            print(f"depth {p}: {len(prompts)} sequences, acceptance length "
                  f"{1 + stats.num_accepted_tokens / max(stats.num_drafts, 1):.2f}", file=sys.stderr, flush=True)
    finally:
        engine.close()
    for c in cells.values():
        c["acceptance_length"] = 1 + c["accepted"] / max(c["drafts"], 1)
    return cells


def report(s: dict) -> None:
    print(f"\nLong lifecycle on {s['machine']} ({s['date']}); prompts: {s['prompts']}")
    h = s["harvest"]
    print(f"harvest: {h['records']} records, responses {h['min_len']}-{h['max_len']} tokens (mean {h['mean_len']:.0f}), "
          f"{h['at_least_4096']} of at least 4,096; stopped at EOS {h['stop']}, at the cap {h['length']}")
    print("\n| stage | wall s | peak RSS GiB | result |\n|---|---|---|---|")
    for name, m in s["stages"].items():
        print(f"| {name} | {m['seconds']:.0f} | {m['peak_rss_gib']:.2f} | {s['results'].get(name, '')} |")
    print(f"\nengine acceptance length by depth into the response (k={s['k']}, T=1, continuations of {s['window']} "
          "tokens from the policy's own prefix)")
    print("| response positions | prefix offsets | sequences | drafts | acceptance length |\n|---|---|---|---|---|")
    for name, c in s["depth"].items():
        print(f"| {name} | {', '.join(map(str, c['offsets']))} | {c['sequences']} | {c['drafts']} | "
              f"{c['acceptance_length']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/long-life")
    ap.add_argument("--n-prompts", type=int, default=12)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=4608)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--depth", type=int, default=2100, help="verify's --depth (past 2,048)")
    ap.add_argument("--window", type=int, default=128, help="tokens continued at each depth offset")
    ap.add_argument("--min-depth-tokens", type=int, default=2048, help="responses this long enter the depth table")
    ap.add_argument("--report", help="print a saved summary's tables and stop")
    a = ap.parse_args()
    if a.report:
        report(json.loads(Path(a.report).read_text()))
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    h, d, e = out / "harvest", out / "draft", out / "export"
    common = ["--data", str(PROMPTS), "--split", "train"]
    stage(out, "harvest", ["harvest", "--out", str(h), *common, "--n-prompts", str(a.n_prompts), "--samples",
                           str(a.samples), "--max-tokens", str(a.max_tokens), "--temperature", "1"], h / "manifest.json")
    stage(out, "init-draft", ["init-draft", "--data", str(h), "--out", str(d), "--epochs", str(a.epochs),
                              "--ttt-steps", str(a.k), "--batch-size", "2", "--save-every", "1000"], d / "manifest.json")
    stage(out, "export", ["export", "--draft", str(d), "--out", str(e), "--k", str(a.k), "--min-acceptance", "1.0"],
          e / "config.json")
    rollout = out / "rollout"
    stage(out, "rollout --compare", ["rollout", "--draft", str(e), "--k", str(a.k), *common, "--n-prompts", "2",
                                     "--max-tokens", str(a.max_tokens), "--temperature", "1", "--compare", "--out",
                                     str(rollout)], rollout / "manifest.json")
    verify = out / "verify"
    stage(out, f"verify --depth {a.depth}", ["verify", "--draft", str(e), "--k", str(a.k), *common, "--n-prompts", "2",
                                              "--samples", "200", "--positions", "4", "--depth", str(a.depth), "--out",
                                              str(verify)], verify / "verify.json", ok_codes=(0, 1))
    records = harvested(h)
    lens = [len(r["response_ids"]) for r in records]
    rm = json.loads((rollout / "manifest.json").read_text())["summary"]
    vj = json.loads((verify / "verify.json").read_text())
    t = time.perf_counter()
    depth = acceptance_by_depth(records, e, a.k, a.window, a.min_depth_tokens, seed=1)
    import platform  # noqa: PLC0415

    summary = {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "prompts": str(PROMPTS.relative_to(ROOT)), "k": a.k, "window": a.window,
        "harvest": {"records": len(records), "min_len": min(lens), "max_len": max(lens), "mean_len": sum(lens) / len(lens),
                    "at_least_4096": sum(n >= 4096 for n in lens),
                    "stop": sum(r["finish_reason"] == "stop" for r in records),
                    "length": sum(r["finish_reason"] == "length" for r in records)},
        "stages": {**json.loads((out / "stages.json").read_text()),
                   "acceptance by depth": {"seconds": time.perf_counter() - t, "peak_rss_gib": float("nan")}},
        "results": {
            "rollout --compare": f"{rm.get('plain_tokens_per_s', 0):.1f} -> {rm.get('tokens_per_s', 0):.1f} tokens/s, "
                                 f"mean response {rm.get('mean_response_len', 0):.0f} tokens",
            f"verify --depth {a.depth}": vj.get("verdict", "?"),
        },
        "depth": depth,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    report(summary)


if __name__ == "__main__":
    main()

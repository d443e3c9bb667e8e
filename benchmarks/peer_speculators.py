"""spectool's draft trainer against the field's own, speculators 0.9 (the vLLM project's trainer), on
one harvest of the embedded policy: the same records, the same number of passes, the same draft
sizes, each draft served by the same engine and scored by its own acceptance counters.

Per family (eagle3, peagle, dflash):
  - spectool: `spectool init-draft --method F --data <harvest> --epochs E` (its defaults otherwise);
  - speculators: the harvest's records written as speculators-format rows (input_ids = prompt +
    response, loss_mask on the response), `speculators prepare-data` over them (pass-through, with
    its token frequencies), the policy's hidden states per row in its file layout
    (`hidden_states/hs_<i>.safetensors`: [seq, aux + 1, H], the last the residual before the final
    norm), then `speculators train` (benchmarks/speculators_cpu.py: its trainer on a CPU) with its
    documented defaults (loss, optimizer, lr, scheduler, TTT steps, packing, anchors) except where
    this CPU or the comparison needs another value: sdpa attention and the eager loss (no flex
    attention or fused kernels here), float32, `--total-seq-len 2048` (eager TTT attention at 8192
    would not fit), no dataloader workers, the epochs E, 95% of rows for training (spectool holds
    out 5%), and spectool's sizes (layers, draft vocabulary, block size) so that the recipe differs
    and the architecture does not;
  - both drafts served: `spectool rollout --split eval` (held-out prompts, never harvested) at
    k = 3 and 7, T = 0, and T = 1 with greedy and probabilistic proposals.

Every step is kept under --out and reused on a rerun (delete a folder to redo it). Training wall
time includes each trainer's own feature work (spectool computes the policy's features in
init-draft; speculators reads the files written before it, whose time is printed apart).

    .venv/bin/python benchmarks/peer_speculators.py --harvest runs/demo/draft/harvest --out runs/peer \
        --peer-arms "e6:--epochs 6"
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_quality import ROOT, SPECTOOL, measure  # noqa: E402 (one rollout's engine acceptance)

FAMILIES = ("eagle3", "peagle", "dflash")
MODES = (("T=0", 0.0, "greedy"), ("T=1 greedy", 1.0, "greedy"), ("T=1 prob", 1.0, "probabilistic"))


def _run(cmd: list[str], log: Path) -> float:
    """Run a command with its output in `log`; its wall seconds."""
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with log.open("w") as f:
        r = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}; its output: {log}")
    return time.perf_counter() - t0


def speculators_data(harvest: Path, out: Path, policy_path: str) -> dict:
    """The harvest as speculators' offline dataset: rows, prepare-data, hidden-state files."""
    done = out / "done.json"
    if done.exists():
        return json.loads(done.read_text())
    import torch
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from spectool.hidden import default_aux_layer_ids, feature_items
    from spectool.records import load_records

    out.mkdir(parents=True, exist_ok=True)
    recs = load_records(harvest)
    with (out / "rows.jsonl").open("w") as f:
        for p, r in zip(recs["prompt_ids"], recs["response_ids"]):
            f.write(json.dumps({"input_ids": p + r, "loss_mask": [0] * len(p) + [1] * len(r)}) + "\n")
    prep = _run([sys.executable, "-m", "speculators", "prepare-data", "--model", policy_path,
                 "--data", str(out / "rows.jsonl"), "--output", str(out / "data"), "--no-skip-token-freq",
                 "--num-preprocessing-workers", "1"], out / "prepare-data.log")
    rows = load_from_disk(str(out / "data"))
    policy = AutoModelForCausalLM.from_pretrained(policy_path, dtype=torch.float32).eval()
    N = policy.config.num_hidden_layers
    layers = [*default_aux_layer_ids(N), N]  # speculators' defaults [2, N/2, N-3], then the last (pre-norm)
    t0 = time.perf_counter()
    seqs = [list(x) for x in rows["input_ids"]]
    items = feature_items(policy, seqs, layers)
    (out / "data" / "hidden_states").mkdir(exist_ok=True)
    for i, (ids, aux, _last) in enumerate(items):
        hs = aux.reshape(len(ids), len(layers), -1).contiguous()  # [seq, aux + 1, H]
        save_file({"hidden_states": hs, "token_ids": ids}, str(out / "data" / "hidden_states" / f"hs_{i}.safetensors"))
    info = {"rows": len(seqs), "tokens": sum(map(len, seqs)), "prepare_data_s": round(prep, 1),
            "features_s": round(time.perf_counter() - t0, 1), "layers": layers}
    done.write_text(json.dumps(info, indent=2))
    return info


def _draft_shape(draft: Path) -> dict:
    """spectool's draft sizes, read back from its manifest: what speculators' draft is given."""
    cfg = json.loads((draft / "init_draft.json").read_text())
    return {"layers": cfg["draft_layers"], "vocab": cfg["draft_vocab_size"], "positions": cfg["ttt_steps"]}


def train_spectool(family: str, harvest: Path, out: Path, a, extra: dict[str, str] | None = None,
                   tag: str = "") -> dict:
    """spectool's draft of `family`: init-draft's defaults, the passes and k of this run, and `extra` flags."""
    name = f"spectool-{family}{tag}"
    draft, info_path = out / name, out / f"{name}.json"
    flags = {"--epochs": str(a.epochs), "--ttt-steps": str(max(a.ks)), **(extra or {})}  # serves k <= --ttt-steps
    if not info_path.exists():
        wall = _run([*SPECTOOL, "init-draft", "--method", family, "--data", str(harvest), "--out", str(draft),
                     *(x for kv in flags.items() for x in kv)], out / f"{name}.log")
        info_path.write_text(json.dumps({"wall_s": round(wall, 1), **_draft_shape(draft)}))
    return {"draft": draft, "epochs": int(flags["--epochs"]), **json.loads(info_path.read_text())}


def speculators_flags(family: str, shape: dict, epochs: int) -> dict[str, str]:
    """speculators train's flags for this comparison (see the module docstring), by flag."""
    flags = {"--speculator-type": family, "--epochs": str(epochs), "--num-layers": str(shape["layers"]),
             "--draft-vocab-size": str(shape["vocab"]), "--draft-attn-impl": "sdpa", "--loss-implementation": "eager",
             "--hidden-states-dtype": "float32", "--total-seq-len": "2048", "--num-workers": "0",
             "--train-data-ratio": "0.95", "--checkpoint-freq": "1", "--seed": "0"}
    if family == "dflash":  # its block holds the anchor (the bonus token) and the drafted positions
        flags["--block-size"] = str(shape["positions"] + 1)
    if family == "peagle":
        flags["--num-depths"] = str(shape["positions"])
    return flags


def train_speculators(family: str, data: Path, policy_path: str, out: Path, flags: dict[str, str],
                      tag: str = "") -> dict:
    """speculators' draft of `family` trained with `flags` (an extra arm's folders carry its `tag`)."""
    name = f"speculators-{family}{tag}"
    save, info_path = out / name, out / f"{name}.json"
    if not info_path.exists():
        args = ["--verifier-name-or-path", policy_path, "--data-path", str(data), "--save-path", str(save),
                "--log-dir", str(out / f"{name}-logs"), *(x for kv in flags.items() for x in kv)]
        wall = _run([sys.executable, str(ROOT / "benchmarks" / "speculators_cpu.py"), *args], out / f"{name}.log")
        info_path.write_text(json.dumps({"wall_s": round(wall, 1), "flags": flags}))
    last = max((p for p in save.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return {"draft": last, "epochs": int(flags["--epochs"]), **json.loads(info_path.read_text())}


def parse_arms(spec: str) -> dict[str, dict[str, str]]:
    """--peer-arms / --spectool-arms "e6:--epochs 6;s512:--total-seq-len 512" -> {"e6": {"--epochs": "6"}, ...}."""
    arms = {}
    for arm in filter(None, spec.split(";")):
        name, _, words = arm.partition(":")
        w = words.split()
        if not name or len(w) % 2 or not all(f.startswith("--") for f in w[::2]):
            raise SystemExit(f"an arm, {arm!r}, must read name:--flag value [--flag value ...]")
        arms[name.strip()] = dict(zip(w[::2], w[1::2]))
    return arms


def acceptance(draft: Path, family: str, k: int, mode: tuple, out: Path, a) -> dict:
    name, temperature, sampling = mode
    cell = out / f"k{k}-{name.replace(' ', '-').replace('=', '')}"
    mk = argparse.Namespace(k=k, n_prompts=a.n_prompts, samples=a.samples, max_tokens=a.max_tokens)
    s = measure(cell, ["--draft", str(draft), "--method", family], temperature, sampling, mk)
    return {"al": round(s.mean_acceptance_length, 3), "per_position": [round(x, 3) for x in s.per_position_rate]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--harvest", required=True, help="a harvest run of the embedded policy")
    ap.add_argument("--out", default="runs/peer")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--k", default="3,7")
    ap.add_argument("--peer-arms", default="", help='more speculators arms, "name:--flag value ..." separated by ";" '
                    '(e.g. "e6:--epochs 6": its draft at about spectool\'s wall time)')
    ap.add_argument("--spectool-arms", default="", help='more spectool arms, the same form (init-draft flags, e.g. '
                    '"ce:--loss ce")')
    ap.add_argument("--n-prompts", type=int, default=32, help="held-out prompts (the eval split has about 20)")
    ap.add_argument("--samples", type=int, default=4, help="completions per prompt at T=1")
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    a.ks = [int(k) for k in a.k.split(",")]
    a.peer_arms, a.spectool_arms = parse_arms(a.peer_arms), parse_arms(a.spectool_arms)

    from spectool.models import resolve_model

    out, harvest = Path(a.out), Path(a.harvest)
    policy_path = str(resolve_model("smollm2-135m").path)
    data = speculators_data(harvest, out / "speculators-data", policy_path)
    print(f"speculators data: {data['rows']} rows, {data['tokens']} tokens; prepare-data {data['prepare_data_s']} s, "
          f"hidden states {data['features_s']} s", flush=True)
    summary = out / "summary.json"  # a run over some families keeps the others' results
    results = json.loads(summary.read_text())["results"] if summary.exists() else {}
    for family in a.families.split(","):
        results[family] = {}
        ours = train_spectool(family, harvest, out, a)
        shape, sdata = {k: ours[k] for k in ("layers", "vocab", "positions")}, out / "speculators-data" / "data"
        flags = speculators_flags(family, shape, a.epochs)
        arms = {"spectool": ours, "speculators": train_speculators(family, sdata, policy_path, out, flags)}
        for name, extra in a.spectool_arms.items():  # spectool with one of speculators' recipe choices
            arms[f"spectool {name}"] = train_spectool(family, harvest, out, a, extra, f"-{name}")
        for name, extra in a.peer_arms.items():  # e.g. more passes: speculators' draft at spectool's wall time
            arms[f"speculators {name}"] = train_speculators(family, sdata, policy_path, out, {**flags, **extra}, f"-{name}")
        for trainer, arm in arms.items():
            cells = {f"k={k} {m[0]}": acceptance(arm["draft"], family, k, m,
                                                 out / "engine" / f"{trainer.replace(' ', '-')}-{family}", a)
                     for k in a.ks for m in MODES if not (k != a.ks[0] and m[1] > 0)}
            results[family][trainer] = {
                "wall_s": arm["wall_s"], "epochs": arm["epochs"], "draft": str(arm["draft"]),
                "tokens_per_s": round(arm["epochs"] * data["tokens"] / arm["wall_s"], 1), **cells}  # passes x tokens / wall
        summary.write_text(json.dumps({"harvest": str(harvest), "epochs": a.epochs, "data": data, "results": results},
                                      indent=2))
    _print(results, data)


def _print(results: dict, data: dict) -> None:
    cols = [c for c in next(iter(next(iter(results.values())).values())) if c.startswith("k=")]
    print(f"\nengine acceptance length on held-out prompts; training wall time (tokens: {data['tokens']} a pass)")
    print(f"{'family':8}{'trainer':16}{'wall s':>8}{'tok/s':>8}" + "".join(f"{c:>18}" for c in cols))
    for family, arms in results.items():
        for trainer, r in arms.items():
            print(f"{family:8}{trainer:16}{r['wall_s']:>8.0f}{r['tokens_per_s']:>8.0f}"
                  + "".join(f"{r[c]['al']:>18.2f}" for c in cols))
        s = arms["spectool"]
        for trainer, p in arms.items():
            if trainer != "spectool":
                print(f"{'':8}{'/ spectool':16}{p['wall_s'] / s['wall_s']:>8.2f}{p['tokens_per_s'] / s['tokens_per_s']:>8.2f}"
                      + "".join(f"{p[c]['al'] / s[c]['al']:>18.2f}" for c in cols) + f"   ({trainer})")


if __name__ == "__main__":
    main()

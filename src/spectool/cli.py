"""spectool's command line: parse flags, build a config, call the workflow's `run`, render.

Heavy libraries (torch, vllm, transformers) are imported inside the commands so `--help` is fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from spectool.config import DEFAULT_DATA, DEFAULT_MODEL, SamplingConfig
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


def _sampling(n_prompts: int, samples: int, max_tokens: int, temperature: float, top_p: float, seed: int) -> SamplingConfig:
    s = SamplingConfig(n_prompts, samples, max_tokens, temperature, top_p, seed)
    s.validate()
    return s


def _fail(e: SpectoolError) -> None:
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]error:[/] {e}", highlight=False)
    raise typer.Exit(2)


@app.command()
def harvest(
    out: Path = typer.Option(..., "--out", help="Run directory to create (or resume)."),
    model: str = MODEL,
    data: str = DATA,
    split: str = typer.Option("train", help="train | eval (deterministic, never overlapping)."),
    n_prompts: int = typer.Option(64, "--n-prompts", help="Number of prompts."),
    samples: int = typer.Option(1, "--samples", help="Completions per prompt."),
    max_tokens: int = typer.Option(128, "--max-tokens", help="Max generated tokens per completion."),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass."),
    seed: int = typer.Option(0, "--seed", help="Sampling and data seed."),
    hidden_states: bool = typer.Option(False, "--hidden-states", help="Also store the policy's EAGLE-3 aux hidden states."),
    prompt_col: str = typer.Option("prompt", "--prompt-col", help="Prompt column of a file source."),
    answer_col: str = typer.Option("answer", "--answer-col", help="Answer column of a file source."),
) -> None:
    """Run the policy on in-domain prompts (vLLM) and store its rollouts: the draft's training data."""
    try:
        from spectool.harvest import HarvestConfig, run, render

        cfg = HarvestConfig(
            model=model, data=data, out=str(out), split=split, hidden_states=hidden_states,
            prompt_col=prompt_col, answer_col=answer_col,
            sampling=_sampling(n_prompts, samples, max_tokens, temperature, top_p, seed),
        )
        render(run(cfg))
    except SpectoolError as e:
        _fail(e)


@app.command("init-draft")
def init_draft() -> None:
    """Build and train an EAGLE-3 draft for the policy on in-domain data."""
    _not_built("init-draft", 3)


@app.command("sweep-k")
def sweep_k() -> None:
    """Measure acceptance and throughput per draft length k (and batch size); recommend k."""
    _not_built("sweep-k", 4)


@app.command()
def rollout(
    model: str = MODEL,
    data: str = DATA,
    split: str = typer.Option("eval", help="train | eval."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory for the records (optional)."),
    n_prompts: int = typer.Option(32, "--n-prompts", help="Number of prompts."),
    samples: int = typer.Option(1, "--samples", help="Completions per prompt."),
    max_tokens: int = typer.Option(128, "--max-tokens", help="Max generated tokens per completion."),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass."),
    seed: int = typer.Option(0, "--seed", help="Sampling and data seed."),
    prompt_col: str = typer.Option("prompt", "--prompt-col", help="Prompt column of a file source."),
    answer_col: str = typer.Option("answer", "--answer-col", help="Answer column of a file source."),
) -> None:
    """Rollouts with vLLM (speculative with a draft): records with target logprobs and rewards."""
    try:
        from spectool.rollout import RolloutConfig, render, run

        cfg = RolloutConfig(
            model=model, data=data, split=split, out=str(out) if out else None,
            prompt_col=prompt_col, answer_col=answer_col,
            sampling=_sampling(n_prompts, samples, max_tokens, temperature, top_p, seed),
        )
        render(run(cfg))
    except SpectoolError as e:
        _fail(e)


@app.command()
def export() -> None:
    """Write a draft that vLLM (and RL frameworks) load: plain EAGLE-3 or speculators format."""
    _not_built("export", 3)


@app.command("train-rl")
def train_rl() -> None:
    """Online GRPO with speculative rollouts and a draft refreshed from the policy's hidden states."""
    _not_built("train-rl", 5)


def _not_built(name: str, issue: int) -> None:
    typer.echo(f"spectool {name} is not built yet (tracked in issue {issue}); nothing was run.", err=True)
    raise typer.Exit(3)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

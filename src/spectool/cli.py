"""spectool's command line: parse flags, build a config, call the command's `run`, render.

Every option's default and help come from the command's settings dataclass in config.py (`option`),
so they are written once. Heavy libraries (torch, vllm, transformers) are imported inside the
commands so `--help` is fast.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from spectool.config import (ExportConfig, ForecastConfig, HarvestConfig, InitDraftConfig, RolloutConfig,
                             SamplingConfig, SweepConfig, VerifyConfig, field_default, field_docs)
from spectool.errors import SpectoolError

app = typer.Typer(
    help="Speculative-decoding drafts for RL post-training: harvest, train, sweep, roll out, export, forecast.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _options(verbose: bool = typer.Option(
        False, "--verbose", help="Show vLLM's and the libraries' log lines here (default: engine.log in the run folder).")
) -> None:
    import os

    if verbose:
        os.environ["SPECTOOL_VERBOSE"] = "1"
    else:  # the libraries' info lines and progress bars stay off the terminal (read before they are imported)
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def option(cls, name: str, *flags: str, required: bool = False):
    """A Typer option for field `name` of the settings dataclass `cls` (`section.field` for a nested
    SamplingConfig): its default, and its docstring as help. Lists are comma-separated strings."""
    if "." in name:
        section, leaf = name.split(".")
        default, doc = getattr(field_default(cls, section), leaf), field_docs(SamplingConfig)[leaf]
    else:
        leaf, default, doc = name, field_default(cls, name), field_docs(cls)[name]
    if isinstance(default, list):
        default = ",".join(str(x) for x in default)
    flags = flags or ("--" + leaf.replace("_", "-"),)
    return typer.Option(... if required else default, *flags, help=doc)


def _parse_list(text: str, flag: str, cast, what: str, example: str) -> list:
    try:
        vals = [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpectoolError(f"{flag}={text!r} is not a comma-separated list of {what} (e.g. {example})") from None
    if not vals:
        raise SpectoolError(f"{flag}={text!r} is empty; give at least one value (e.g. {example})")
    return vals


def parse_float_list(text: str | None, flag: str) -> list[float] | None:
    """Comma-separated numbers, in the order given (acceptance rates per position); None stays None."""
    return None if text is None else _parse_list(text, flag, float, "numbers", "0.8,0.6,0.45")


def parse_int_list(text: str, flag: str) -> list[int]:
    """Comma-separated integers, sorted and deduplicated (k values, batch sizes)."""
    return sorted(set(_parse_list(text, flag, int, "integers", "1,8,32")))


def _fail(e: SpectoolError) -> None:
    from rich.console import Console

    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {e}", highlight=False)
    raise typer.Exit(2)


H = HarvestConfig


@app.command()
def harvest(
    out: str = option(H, "out", required=True),
    model: str = option(H, "model"),
    data: str = option(H, "data"),
    split: str = option(H, "split"),
    n_prompts: int = option(H, "sampling.n_prompts"),
    samples: int = option(H, "sampling.samples"),
    max_tokens: int = option(H, "sampling.max_tokens"),
    temperature: float = option(H, "sampling.temperature"),
    top_p: float = option(H, "sampling.top_p"),
    seed: int = option(H, "sampling.seed"),
    hidden_states: bool = option(H, "hidden_states"),
    prompt_col: str = option(H, "prompt_col"),
    answer_col: str = option(H, "answer_col"),
    gpu_memory_utilization: float = option(H, "gpu_memory_utilization"),
) -> None:
    """Run the policy on in-domain prompts (vLLM) and store its rollouts: the draft's training data."""
    try:
        from spectool.commands.harvest import render, run

        render(run(HarvestConfig(
            model=model, data=data, out=out, split=split, hidden_states=hidden_states, prompt_col=prompt_col,
            answer_col=answer_col, gpu_memory_utilization=gpu_memory_utilization,
            sampling=SamplingConfig(n_prompts, samples, max_tokens, temperature, top_p, seed))))
    except SpectoolError as e:
        _fail(e)


I = InitDraftConfig  # noqa: E741


def _presets_help() -> str:
    from spectool.config import INIT_DRAFT_PRESETS, field_docs

    sets = "; ".join(f"{name}: " + ", ".join(f"{k}={v}" for k, v in vals.items())
                     for name, vals in INIT_DRAFT_PRESETS.items())
    return f"{field_docs(InitDraftConfig)['preset']} {sets}"


@app.command("init-draft")
def init_draft(
    ctx: typer.Context,
    out: str = option(I, "out", required=True),
    model: str = option(I, "model"),
    data: str = option(I, "data"),
    method: str = option(I, "method"),
    init_from: Optional[str] = option(I, "init_from"),
    remap_vocab: bool = option(I, "remap_vocab"),
    draft_vocab_size: int = option(I, "draft_vocab_size"),
    ttt_steps: int = option(I, "ttt_steps"),
    draft_layers: int = option(I, "draft_layers"),
    loss: str = option(I, "loss"),
    epochs: int = option(I, "epochs"),
    batch_size: int = option(I, "batch_size"),
    lr: float = option(I, "lr"),
    save_every: int = option(I, "save_every"),
    n_prompts: int = option(I, "harvest.n_prompts"),
    samples: int = option(I, "harvest.samples"),
    max_tokens: int = option(I, "harvest.max_tokens"),
    temperature: float = option(I, "harvest.temperature"),
    seed: int = option(I, "seed"),
    gpu_memory_utilization: float = option(I, "gpu_memory_utilization"),
    disk_budget_gb: Optional[float] = option(I, "disk_budget_gb"),
    preset: Optional[str] = typer.Option(None, "--preset", help=_presets_help()),
) -> None:
    """Build and train an EAGLE-3 draft for the policy on in-domain data (--method mtp: fine-tune the model's
    own MTP layers)."""
    try:
        from spectool.commands.init_draft import render, run
        from spectool.config import apply_preset

        cfg = InitDraftConfig(
            out=out, model=model, data=data, method=method, init_from=init_from, remap_vocab=remap_vocab,
            draft_vocab_size=draft_vocab_size, ttt_steps=ttt_steps, draft_layers=draft_layers, loss=loss, epochs=epochs,
            batch_size=batch_size, lr=lr, save_every=save_every, seed=seed,
            gpu_memory_utilization=gpu_memory_utilization, disk_budget_gb=disk_budget_gb, preset=preset,
            harvest=SamplingConfig(n_prompts, samples, max_tokens, temperature, 1.0, seed))
        render(run(apply_preset(cfg, _given(ctx))))
    except SpectoolError as e:
        _fail(e)


def _given(ctx: typer.Context) -> set[str]:
    """Settings set on the command line (not defaulted), as config field names; SamplingConfig's
    flags name the nested harvest settings ("harvest.<field>")."""
    from dataclasses import fields

    from click.core import ParameterSource

    sampling = {f.name for f in fields(SamplingConfig)} - {"seed"}  # --seed sets both; the preset names neither
    given = {name for name in ctx.params if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE}
    return {f"harvest.{n}" if n in sampling else n for n in given}


S = SweepConfig


@app.command("sweep-k")
def sweep_k(
    out: str = option(S, "out", required=True),
    draft: Optional[str] = option(S, "draft"),
    model: str = option(S, "model"),
    data: str = option(S, "data"),
    split: str = option(S, "split"),
    k: str = option(S, "ks", "--k"),
    batch_sizes: str = option(S, "batch_sizes"),
    methods: str = option(S, "methods"),
    draft_model: Optional[str] = option(S, "draft_model"),
    max_tokens: int = option(S, "max_tokens"),
    temperature: float = option(S, "temperature"),
    min_seqs: int = option(S, "min_seqs"),
    min_gain: float = option(S, "min_gain"),
    seed: int = option(S, "seed"),
    draft_sampling: str = option(S, "draft_sampling"),
    gpu_memory_utilization: float = option(S, "gpu_memory_utilization"),
    dummy_weights: bool = option(S, "dummy_weights"),
    acceptance_rates: Optional[str] = option(S, "acceptance_rates"),
    acceptance_length: Optional[float] = option(S, "acceptance_length"),
    lengths: Optional[str] = option(S, "lengths"),
    prompt_len: int = option(S, "prompt_len"),
) -> None:
    """Measure acceptance and throughput per draft length k (and batch size); recommend k.
    With --dummy-weights and synthetic acceptance: what speculation gives a model known by its config."""
    try:
        from spectool.commands.sweep_k import render, run

        cfg = SweepConfig(
            out=out, draft=draft, model=model, data=data, split=split, ks=parse_int_list(k, "--k"),
            batch_sizes=parse_int_list(batch_sizes, "--batch-sizes"),
            methods=[m.strip() for m in methods.split(",") if m.strip()], draft_model=draft_model, max_tokens=max_tokens,
            temperature=temperature, min_seqs=min_seqs, min_gain=min_gain, seed=seed, draft_sampling=draft_sampling,
            gpu_memory_utilization=gpu_memory_utilization, dummy_weights=dummy_weights,
            acceptance_rates=parse_float_list(acceptance_rates, "--acceptance-rates"),
            acceptance_length=acceptance_length, lengths=lengths, prompt_len=prompt_len)
        render(run(cfg, progress=lambda m: typer.echo(m, err=True)), out)
    except SpectoolError as e:
        _fail(e)


R = RolloutConfig


@app.command()
def rollout(
    model: str = option(R, "model"),
    data: str = option(R, "data"),
    split: str = option(R, "split"),
    out: Optional[str] = option(R, "out"),
    n_prompts: int = option(R, "sampling.n_prompts"),
    samples: int = option(R, "sampling.samples"),
    max_tokens: int = option(R, "sampling.max_tokens"),
    temperature: float = option(R, "sampling.temperature"),
    top_p: float = option(R, "sampling.top_p"),
    seed: int = option(R, "sampling.seed"),
    prompt_col: str = option(R, "prompt_col"),
    answer_col: str = option(R, "answer_col"),
    draft: Optional[str] = option(R, "draft"),
    method: str = option(R, "method"),
    draft_model: Optional[str] = option(R, "draft_model"),
    k: str = option(R, "k"),
    sweep: Optional[str] = option(R, "sweep"),
    compare: bool = option(R, "compare"),
    draft_sampling: str = option(R, "draft_sampling"),
    gpu_memory_utilization: float = option(R, "gpu_memory_utilization"),
    acceptance_length: Optional[float] = option(R, "acceptance_length"),
) -> None:
    """Rollouts with vLLM (speculative with a draft): records with target logprobs and rewards."""
    try:
        from spectool.commands.rollout import render, run

        k = str(k)
        if k != "auto" and not k.isdigit():
            raise SpectoolError(f"--k={k!r} must be an integer in [1, 16] or 'auto'")
        render(run(RolloutConfig(
            model=model, data=data, split=split, out=out, prompt_col=prompt_col, answer_col=answer_col, draft=draft,
            method=method, draft_model=draft_model, k=k if k == "auto" else int(k), sweep=sweep, compare=compare,
            draft_sampling=draft_sampling,
            gpu_memory_utilization=gpu_memory_utilization, acceptance_length=acceptance_length,
            sampling=SamplingConfig(n_prompts, samples, max_tokens, temperature, top_p, seed))))
    except SpectoolError as e:
        _fail(e)


E = ExportConfig


@app.command()
def export(
    draft: str = option(E, "draft", required=True),
    out: str = option(E, "out", required=True),
    format: str = option(E, "format"),
    target: str = option(E, "target", "--for"),
    model: Optional[str] = option(E, "model"),
    k: int = option(E, "k"),
    verify: bool = option(E, "verify", "--verify/--no-verify"),
    min_acceptance: float = option(E, "min_acceptance_length", "--min-acceptance"),
    gpu_memory_utilization: float = option(E, "gpu_memory_utilization"),
) -> None:
    """Write a draft that vLLM (and RL frameworks) load: plain EAGLE-3 or speculators format."""
    try:
        from spectool.commands.export import render, run

        render(run(ExportConfig(draft=draft, out=out, format=format, target=target, model=model, k=k, verify=verify,
                                min_acceptance_length=min_acceptance, gpu_memory_utilization=gpu_memory_utilization)))
    except SpectoolError as e:
        _fail(e)


V = VerifyConfig


@app.command()
def verify(
    draft: Optional[str] = option(V, "draft"),
    method: str = option(V, "method"),
    model: str = option(V, "model"),
    data: str = option(V, "data"),
    split: str = option(V, "split"),
    k: int = option(V, "k"),
    n_prompts: int = option(V, "n_prompts"),
    samples: int = option(V, "samples"),
    positions: int = option(V, "positions"),
    temperature: float = option(V, "temperature"),
    alpha: float = option(V, "alpha"),
    logprob_tol: float = option(V, "logprob_tol"),
    control: str = option(V, "control"),
    out: Optional[str] = option(V, "out"),
    seed: int = option(V, "seed"),
    draft_sampling: str = option(V, "draft_sampling"),
    gpu_memory_utilization: float = option(V, "gpu_memory_utilization"),
) -> None:
    """Prove on the real engine that speculative sampling equals the policy's own sampling."""
    try:
        from spectool.commands.verify import render, run

        r = run(VerifyConfig(draft=draft, method=method, model=model, data=data, split=split, k=k, n_prompts=n_prompts,
                             samples=samples, positions=positions, temperature=temperature, alpha=alpha,
                             logprob_tol=logprob_tol, control=control, out=out, seed=seed,
                             draft_sampling=draft_sampling, gpu_memory_utilization=gpu_memory_utilization),
                progress=lambda m: typer.echo(m, err=True))
        render(r)
    except SpectoolError as e:
        _fail(e)
    if not r.ok:
        raise typer.Exit(1)


F = ForecastConfig


@app.command()
def forecast(
    sweep: str = option(F, "sweep", required=True),
    method: str = option(F, "method"),
    acceptance_rates: Optional[str] = option(F, "acceptance_rates"),
    lengths: str = option(F, "lengths"),
    max_tokens: int = option(F, "max_tokens"),
    batch: int = option(F, "batch"),
    max_concurrency: int = option(F, "max_concurrency"),
    prompt_len: int = option(F, "prompt_len"),
    k: str = option(F, "ks", "--k"),
    generation_share: Optional[float] = option(F, "generation_share"),
    rl_run: Optional[str] = option(F, "rl_run"),
    min_gain: float = option(F, "min_gain"),
    out: Optional[str] = option(F, "out"),
) -> None:
    """Forecast rollout and RL-step speedups at any batch size and acceptance from a fitted sweep."""
    try:
        from spectool.commands.forecast import render, run

        cfg = ForecastConfig(sweep=sweep, method=method, out=out, lengths=lengths, max_tokens=max_tokens, batch=batch,
                             acceptance_rates=parse_float_list(acceptance_rates, "--acceptance-rates"),
                             max_concurrency=max_concurrency, prompt_len=prompt_len, ks=parse_int_list(k, "--k"),
                             generation_share=generation_share, rl_run=rl_run, min_gain=min_gain)
        render(run(cfg), cfg.out)
    except SpectoolError as e:
        _fail(e)


@app.command("train-rl")
def train_rl(
    config: Optional[str] = typer.Option(None, "--config", help="YAML config (start from templates/rl.yaml)."),
    set_: list[str] = typer.Option([], "--set", help="Override one key: section.key=value (repeatable)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
    backend: Optional[str] = typer.Option(None, "--backend", help="builtin | trl (the config's `backend` key)."),
) -> None:
    """Online GRPO with speculative rollouts and a draft refreshed from the policy's hidden states."""
    try:
        from spectool.rl.config import load_config, to_yaml

        cfg = load_config(config, [*set_, *([f"backend={backend}"] if backend else [])])
        if print_config:
            typer.echo(to_yaml(cfg))
            return
        if cfg.backend == "trl":
            from spectool.commands.train_rl_trl import run as run_trl

            summary = run_trl(cfg)
            typer.echo(f"train-rl (TRL) -> {cfg.out}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                                   for k, v in summary.items()))
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

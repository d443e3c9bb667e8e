"""spectool's command line: parse flags, build a config, call the command's `run`, render.

Every command's options are generated from its settings dataclass in config/ (`settings_command`):
a field is a flag with the field's default, its attribute docstring as help and its type, so a
setting is written once, where its owner lives. `CLI` says only what the command line spells
differently (a renamed flag, a field left off, a required one). Heavy libraries (torch, vllm,
transformers) are imported inside the commands so `--help` is fast. train-rl reads rl.yaml instead.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import os
import sys
import textwrap
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from functools import lru_cache
from typing import Any, Callable, Optional

import typer

from spectool.config.export import ExportConfig
from spectool.config.forecast import ForecastConfig
from spectool.config.init_draft import InitDraftConfig
from spectool.config.rollout import RolloutConfig
from spectool.config.sweep_k import SweepConfig
from spectool.config.verify import VerifyConfig
from spectool.errors import SpectoolError, check
from spectool.harvesting import HarvestConfig
from spectool.settings.sampling import SamplingConfig
from spectool.settings.spelling import TYPE_WORDS

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
    import logging  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    import os  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    # spectool's library logs through `logging` (logger "spectool"); the command line shows its info lines on
    # stderr, and its debug lines too with --verbose
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("spectool")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.propagate = False
    if verbose:
        os.environ["SPECTOOL_VERBOSE"] = "1"
    else:  # the libraries' info lines and progress bars stay off the terminal (read before they are imported)
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


# --- reflection on the settings dataclasses (the flags, their defaults and help) ---


def field_docs(cls) -> dict[str, str]:
    """The docstring under each field of a settings dataclass (the CLI's help text)."""
    return dict(_field_docs(cls))


@lru_cache(maxsize=None)
def _field_docs(cls) -> tuple[tuple[str, str], ...]:
    """In the dataclass's field order; a field's docstring is the one of the class that last declares it (a command's
    settings may restate a group's field with its own default and words: settings/)."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for a, b in zip(body, body[1:]):
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
                docs[a.target.id] = " ".join(str(b.value.value).split())
    return tuple((f.name, docs[f.name]) for f in fields(cls) if f.name in docs)


def field_default(cls, name: str):
    """A field's default (MISSING when it has none)."""
    f = next(f for f in fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not MISSING else f.default


@dataclass(frozen=True)
class CliSpec:
    """How one command's settings dataclass appears on the command line (what differs from the default
    of one `--field-name` flag per field, with the field's default and docstring)."""

    cls: type
    sampling: str | None = None  # the nested SamplingConfig field whose leaves are flat flags (--n-prompts ...)
    renamed: dict[str, str] = field(default_factory=dict)  # field path -> flag ("ks" -> "--k")
    hidden: frozenset[str] = frozenset()  # field paths left off the command line (their default applies)
    required: frozenset[str] = frozenset()
    linked: dict[str, str] = field(default_factory=dict)  # hidden field path -> the flag's field that sets it too
    help: dict[str, str] = field(default_factory=dict)  # field path -> help, where the docstring is not enough


def _presets_help() -> str:
    from spectool.config.init_draft import INIT_DRAFT_PRESETS  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    sets = "; ".join(f"{name}: " + ", ".join(f"{k}={v}" for k, v in vals.items())
                     for name, vals in INIT_DRAFT_PRESETS.items())
    return f"{field_docs(InitDraftConfig)['preset']} {sets}"


CLI = {
    "harvest": CliSpec(HarvestConfig, sampling="sampling", required=frozenset({"out"})),
    "init-draft": CliSpec(InitDraftConfig, sampling="harvest", required=frozenset({"out"}),
                          hidden=frozenset({"step_decay", "warmup_steps", "eval_fraction", "harvest.top_p",
                                            "harvest.seed"}),
                          linked={"harvest.seed": "seed"}, help={"preset": _presets_help()}),
    "sweep-k": CliSpec(SweepConfig, renamed={"ks": "--k"}, required=frozenset({"out"})),
    "rollout": CliSpec(RolloutConfig, sampling="sampling"),
    "export": CliSpec(ExportConfig, renamed={"target": "--for", "min_acceptance_length": "--min-acceptance",
                                             "verify": "--verify/--no-verify"}, required=frozenset({"draft", "out"})),
    "verify": CliSpec(VerifyConfig),
    "forecast": CliSpec(ForecastConfig, renamed={"ks": "--k"}, required=frozenset({"sweep"})),
}


def _leaves(spec: CliSpec) -> list[tuple[str, type, Any, str]]:
    """(field path, type, default, help) of every flag of the command: the command's own settings in its dataclass's
    order, then those of the settings groups it takes (settings/: the engine's)."""
    out = []
    hints, docs = typing.get_type_hints(spec.cls), field_docs(spec.cls)
    own = spec.cls.__dict__.get("__annotations__", {})
    for f in sorted(dataclasses.fields(spec.cls), key=lambda f: f.name not in own):
        if f.name == spec.sampling:
            sub = field_default(spec.cls, f.name)
            sub_hints, sub_docs = typing.get_type_hints(SamplingConfig), field_docs(SamplingConfig)
            out += [(f"{f.name}.{g.name}", sub_hints[g.name], getattr(sub, g.name), sub_docs[g.name])
                    for g in dataclasses.fields(SamplingConfig)]
        else:
            out.append((f.name, hints[f.name], field_default(spec.cls, f.name), docs[f.name]))
    return [x for x in out if x[0] not in spec.hidden]


def _flag(spec: CliSpec, path: str) -> str:
    return spec.renamed.get(path) or "--" + path.rpartition(".")[2].replace("_", "-")


def _cli_type(tp) -> tuple[Any, Callable[[Any, str], Any] | None]:
    """The type the command line reads for a field type, and how its text becomes the field's value."""
    if tp in (str, int, float, bool):
        return tp, None
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            inner, parse = _cli_type(rest[0])
            return Optional[inner], (None if parse is None else lambda v, flag: None if v is None else parse(v, flag))
        if set(rest) == {int, str}:  # a number or a word ("3" or "auto")
            return str, lambda v, flag: int(v) if str(v).isdigit() else str(v)
    if tp is dict:  # a JSON object ('{"enable_thinking": false}')
        return str, parse_json_object
    if typing.get_origin(tp) is list:
        elem = args[0]
        if elem is int:
            return str, lambda v, flag: parse_int_list(str(v), flag)
        if elem is float:
            return str, lambda v, flag: parse_float_list(str(v), flag)
        return str, lambda v, flag: [x.strip() for x in str(v).split(",") if x.strip()]
    raise TypeError(f"no command-line form for {tp}")


def _param(spec: CliSpec, path: str, tp, default, doc: str) -> inspect.Parameter:
    cli_type, _ = _cli_type(tp)
    if isinstance(default, list):
        default = ",".join(str(x) for x in default)
    required = " (required: a flag, or a key of --config)" if path in spec.required else ""
    opt = typer.Option(default, *_flag(spec, path).split(" "), help=spec.help.get(path, doc) + required)
    return inspect.Parameter(path.replace(".", "__"), inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=cli_type)


def _build(spec: CliSpec, values: dict[str, Any]):
    """The settings object from the flags' values (keyed by field path); hidden fields keep their
    defaults, linked ones follow their flag."""
    flat = {}
    for path, tp, _, _ in _leaves(spec):
        _, parse = _cli_type(tp)
        v = values[path]
        flat[path] = parse(v, _flag(spec, path).split("/")[0]) if parse else v
    for hidden, source in spec.linked.items():
        flat[hidden] = flat[source]
    top = {k: v for k, v in flat.items() if "." not in k}
    if spec.sampling:
        sub = {k.split(".", 1)[1]: v for k, v in flat.items() if k.startswith(spec.sampling + ".")}
        top[spec.sampling] = dataclasses.replace(field_default(spec.cls, spec.sampling), **sub)
    return spec.cls(**top)


def _file_value(tp, value: Any, key: str) -> Any:
    """A --config value in the form its flag's value takes (lists and objects as the flag's text, parsed as a flag's),
    type-checked against the field; the error names the file's key."""
    import json  # noqa: PLC0415 (kept beside its one use)

    cli_type, parse = _cli_type(tp)
    if value is None:
        check(typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp), key, value,
              "must be set (null is not a value of this setting)")
        return None
    if parse is not None and not isinstance(value, str):  # a list or an object: its flag's text
        ok = isinstance(value, dict) if tp is dict or dict in typing.get_args(tp) else isinstance(value, (list, int, float))
        check(ok, key, value, "must be " + ("a mapping" if "dict" in str(tp) else "a list or a comma-separated text"))
        return json.dumps(value) if isinstance(value, dict) else ",".join(map(str, value if isinstance(value, list) else [value]))
    want = typing.get_args(cli_type)[0] if typing.get_origin(cli_type) is typing.Union else cli_type
    if want is float and not isinstance(value, bool) and isinstance(value, (int, str)):
        with contextlib.suppress(ValueError):
            value = float(value)  # YAML 1.1 reads 1e-3 (no dot) as a text
    check(isinstance(value, want) and (want is bool or not isinstance(value, bool)), key, value,
          f"must be {TYPE_WORDS[want]}")
    return value


def settings_file(spec: CliSpec, path: str) -> dict[str, Any]:
    """--config FILE: {field path: value} from a YAML mapping keyed as the command's flags are named (--max-tokens:
    max_tokens; a field's own name too: ks for --k); unknown keys are refused, naming the known ones."""
    import yaml  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    file = os.path.expanduser(path)
    check(os.path.isfile(file), "--config", path, "must be a YAML file of this command's settings")
    try:
        tree = yaml.safe_load(open(file).read()) or {}
    except yaml.YAMLError as e:
        raise SpectoolError(f"--config {path} is not valid YAML: {e}") from None
    check(isinstance(tree, dict), "--config", path, "must hold a mapping of settings to values")
    keys: dict[str, tuple[str, Any]] = {}
    for leaf, tp, _, _ in _leaves(spec):
        for k in (_flag(spec, leaf).split("/")[0].lstrip("-").replace("-", "_"), leaf, leaf.rpartition(".")[2]):
            keys.setdefault(k, (leaf, tp))
    out = {}
    for k, v in tree.items():
        check(k in keys, f"--config {path}: key", k, "is no setting of this command (its keys: "
              + ", ".join(sorted({_flag(spec, leaf).split("/")[0].lstrip("-").replace("-", "_") for leaf, *_ in _leaves(spec)}))
              + ")")
        leaf, tp = keys[k]
        out[leaf] = _file_value(tp, v, f"--config {path}: {k}")
    return out


def settings_command(name: str):
    """Decorate `fn(cfg)` (or `fn(cfg, given)`: the field paths set on the command line) as the
    command `name`, its options generated from CLI[name]; a SpectoolError ends it with exit code 2."""
    spec = CLI[name]

    def decorate(fn):
        leaves = _leaves(spec)
        wants_given = "given" in inspect.signature(fn).parameters

        def command(ctx: typer.Context, config: Optional[str] = None, **kw: Any) -> None:
            values = {p.replace("__", "."): v for p, v in kw.items()}
            # by name: typer ships its own copy of click, whose ParameterSource is not click's
            given = {p.replace("__", ".") for p in kw if getattr(ctx.get_parameter_source(p), "name", "") == "COMMANDLINE"}
            try:
                if config:  # the file's settings under the flags given
                    from_file = settings_file(spec, config)
                    values.update({p: v for p, v in from_file.items() if p not in given})
                    given |= set(from_file)
                for path in sorted(spec.required):
                    check(values[path] not in (None, ""), _flag(spec, path), values[path], "must be given (a flag, or a "
                          "key of --config)")
                cfg = _build(spec, values)
                cfg.validate()  # before the command's module imports torch and vLLM: a refused run starts neither
                fn(cfg, given) if wants_given else fn(cfg)
            except SpectoolError as e:
                _fail(e)

        ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
        config_param = inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str], default=typer.Option(
            None, "--config", help="A YAML file of this command's settings, keyed as the flags are named (max_tokens: 512, "
            "k: 3, drafts: [A, B]); a flag given on the command line overrides it. The resolved settings are saved "
            "with the run as always."))
        command.__signature__ = inspect.Signature([ctx_param, config_param, *(_param(spec, *leaf) for leaf in leaves)])
        command.__name__, command.__doc__ = fn.__name__, fn.__doc__
        return app.command(name)(command)

    return decorate


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


def parse_json_object(text: str, flag: str) -> dict:
    """A JSON object (the chat template's keyword arguments); the error names the flag (prompts.template_kwargs)."""
    from spectool.prompts import template_kwargs  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    return template_kwargs(text, flag)


def parse_int_list(text: str, flag: str) -> list[int]:
    """Comma-separated integers, sorted and deduplicated (k values, batch sizes)."""
    return sorted(set(_parse_list(text, flag, int, "integers", "1,8,32")))


def _fail(e: SpectoolError) -> None:
    from spectool.ui import console  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {e}", highlight=False)
    raise typer.Exit(2)


@settings_command("harvest")
def harvest(cfg: HarvestConfig) -> None:
    """Run the policy on in-domain prompts (vLLM) and store its rollouts: the draft's training data."""
    from spectool.commands.harvest import render, run  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    result = run(cfg)
    if os.environ.get("RANK", "0") == "0":  # --data-parallel-size under a launcher: the main process reports
        render(result)


@settings_command("init-draft")
def init_draft(cfg: InitDraftConfig, given: set[str]) -> None:
    """Build and train a draft for the policy on in-domain data: EAGLE-3 (default), P-EAGLE or DFlash (--method),
    or fine-tune the model's own MTP layers (--method mtp). Refused first if the installed vLLM cannot serve it."""
    from spectool.commands.init_draft import render, run  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
    from spectool.config.init_draft import apply_preset  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    render(run(apply_preset(cfg, given)))


@settings_command("sweep-k")
def sweep_k(cfg: SweepConfig) -> None:
    """Measure acceptance and throughput per draft length k (and batch size); recommend k.
    With --dummy-weights and synthetic acceptance: what speculation gives a model known by its config."""
    from spectool.commands.sweep_k import render, run  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    render(run(cfg, progress=lambda m: typer.echo(m, err=True)), cfg.out)


@settings_command("rollout")
def rollout(cfg: RolloutConfig) -> None:
    """Rollouts with vLLM (speculative with a draft): records with target logprobs and rewards."""
    from spectool.commands.rollout import render, run  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    render(run(cfg))


@settings_command("export")
def export(cfg: ExportConfig) -> None:
    """Write a draft that vLLM (and RL frameworks) load: an EAGLE-3, P-EAGLE or DFlash folder as vLLM reads it
    (EAGLE-3 also in the speculators format), checked on the engine, with the framework's config snippet."""
    from spectool.commands.export import render, run  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    render(run(cfg))


@settings_command("verify")
def verify(cfg: VerifyConfig) -> None:
    """Test on the real engine that speculative sampling equals the policy's own sampling (to a stated resolution)."""
    from spectool.commands.verify import render, run  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    r = run(cfg, progress=lambda m: typer.echo(m, err=True))
    render(r)
    if not r.ok:
        raise typer.Exit(1)


@settings_command("forecast")
def forecast(cfg: ForecastConfig) -> None:
    """Forecast rollout and RL-step speedups at any batch size and acceptance from a fitted sweep."""
    from spectool.commands.forecast import render, run  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

    render(run(cfg), cfg.out)


def rl_keys() -> list[tuple[str, Any, str]]:
    """(key, default, docstring) of every rl.yaml setting, sections' keys dotted: what `train-rl --help` lists."""
    from spectool.rl.config import RLConfig  # noqa: PLC0415 (torch-free; read when the command is built)

    def walk(cls, prefix: str) -> list[tuple[str, Any, str]]:
        out = []
        docs = field_docs(cls)
        for f in fields(cls):
            default = field_default(cls, f.name)
            if dataclasses.is_dataclass(default):
                out += walk(type(default), f"{prefix}{f.name}.")
            else:
                out.append((prefix + f.name, default, docs[f.name]))
        return out

    return walk(RLConfig, "")


def _rl_help() -> str:
    shown = {None: "null", True: "true", False: "false"}
    lines = [f"{key} ({shown.get(default, default) if isinstance(default, (bool, type(None))) else default}): {doc}"
             for key, default, doc in rl_keys()]
    return "Keys of rl.yaml (--config), each also a --set section.key=value:\n\n" + "\n\n".join(lines)


@app.command("train-rl", epilog=_rl_help())
def train_rl(
    config: Optional[str] = typer.Option(None, "--config", help="YAML config (start from templates/rl.yaml)."),
    set_: list[str] = typer.Option([], "--set", help="Override one key: section.key=value (repeatable)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the resolved config and exit."),
    backend: Optional[str] = typer.Option(None, "--backend", help="builtin | trl (the config's `backend` key)."),
    report_to: Optional[str] = typer.Option(None, "--report-to", help="tensorboard | trackio | wandb | all | none, or "
                                            "a comma-separated list (the config's `report_to` key)."),
) -> None:
    """Online GRPO with speculative rollouts and a draft refreshed from the policy's hidden states."""
    try:
        from spectool.rl.config import load_config, to_yaml  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

        cfg = load_config(config, [*set_, *([f"backend={backend}"] if backend else []),
                                   *([f"report_to={report_to}"] if report_to else [])])
        if print_config:
            typer.echo(to_yaml(cfg))
            return
        if cfg.backend == "trl":
            from spectool.commands.train_rl_trl import run as run_trl  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

            summary = run_trl(cfg)
            if os.environ.get("RANK", "0") == "0":  # under accelerate launch: the main process says it
                    typer.echo(f"train-rl (TRL) -> {cfg.out}: " + ", ".join(
                    f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in summary.items()))
            return
        from spectool.commands.train_rl import run  # noqa: PLC0415 (a torch-free, fast `spectool --help`)
        from spectool.rl.report import render_summary  # noqa: PLC0415 (a torch-free, fast `spectool --help`)

        render_summary(run(cfg))
    except SpectoolError as e:
        _fail(e)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

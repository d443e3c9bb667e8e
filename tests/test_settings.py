"""One source of truth for settings: every CLI option's default and help come from the command's settings dataclass
(config/), made of the settings groups (settings/) that rl.yaml and SpectoolSpeculation take too; every field a user
may set has an option."""

from __future__ import annotations

import re

import pytest
import typer

from spectool.cli import CLI, app, field_default, field_docs
from spectool.config.export import ExportConfig
from spectool.config.init_draft import InitDraftConfig
from spectool.config.rollout import RolloutConfig
from spectool.config.sweep_k import SweepConfig

SAMPLING = {"n_prompts", "samples", "max_tokens", "temperature", "top_p", "seed"}


def _default(cls, path: str):
    if "." in path:
        section, leaf = path.split(".")
        return getattr(field_default(cls, section), leaf)
    return field_default(cls, path)


@pytest.mark.parametrize("command", sorted(CLI))
def test_cli_defaults_are_the_dataclass_defaults_and_every_setting_has_a_flag(command):
    """The options are generated from the dataclass (cli.settings_command); this reads the click
    command back and checks it against the dataclass itself: every field has a flag unless CLI
    hides it, with the field's default and a help text."""
    spec = CLI[command]
    cls = spec.cls
    click_cmd = typer.main.get_command(app).commands[command]
    seen = set()
    for p in click_cmd.params:
        if p.name in ("ctx", "config"):  # --config FILE: every command's, no setting of its own
            continue
        path = p.name.replace("__", ".")
        seen.add(path)
        want = _default(cls, path)
        if isinstance(want, list):
            want = ",".join(map(str, want))
        if p.required:
            assert want in ("", None), f"{command} --{p.name}: required, but the dataclass has a default {want!r}"
        else:
            assert p.default == want, f"{command} --{p.name}: CLI default {p.default!r} != dataclass {want!r}"
        assert p.help, f"{command} --{p.name} has no help"
    fields = {f for f in field_docs(cls) if f != spec.sampling}
    if spec.sampling:
        fields |= {f"{spec.sampling}.{x}" for x in SAMPLING}
    assert fields - seen - spec.hidden == set(), f"{command}: settings without a flag"
    assert seen <= fields


def test_flags_parse_into_the_settings():
    """Generated flags build the settings object: lists, optional numbers, a number-or-word, a
    renamed flag, a boolean pair, nested sampling flags and a linked hidden field."""
    from spectool.cli import _build

    kw = {p: _default(SweepConfig, p) for p in ("out", "draft", "drafts", "model", "data", "split", "draft_model", "max_tokens",
                                                 "temperature", "min_seqs", "min_seconds", "min_gain", "repeats", "seed",
                                                 "draft_sampling", "system_prompt", "chat_template_kwargs",
                                                 "gpu_memory_utilization", "dummy_weights", "acceptance_length",
                                                 "lengths", "prompt_len", "dtype", "max_model_len", "prompt_col",
                                                 "answer_col", "enforce_eager")}
    cfg = _build(CLI["sweep-k"], {**kw, "ks": "3,1,3", "batch_sizes": "8", "methods": "eagle3, mtp",
                                  "acceptance_rates": "0.9,0.5"})
    assert cfg.ks == [1, 3] and cfg.methods == ["eagle3", "mtp"] and cfg.acceptance_rates == [0.9, 0.5]
    r = {f"sampling.{x}": getattr(field_default(RolloutConfig, "sampling"), x) for x in SAMPLING}
    r.update({f: field_default(RolloutConfig, f) for f in field_docs(RolloutConfig) if f != "sampling"})
    assert _build(CLI["rollout"], {**r, "k": "auto", "sampling.n_prompts": 5}).k == "auto"
    assert _build(CLI["rollout"], {**r, "k": "2"}).k == 2
    i = {f"harvest.{x}": getattr(field_default(InitDraftConfig, "harvest"), x) for x in SAMPLING}
    i.update({f: field_default(InitDraftConfig, f) for f in field_docs(InitDraftConfig) if f != "harvest"})
    cfg = _build(CLI["init-draft"], {**i, "seed": 7, "harvest.n_prompts": 9})
    assert cfg.harvest.seed == 7 and cfg.harvest.n_prompts == 9 and cfg.step_decay == field_default(InitDraftConfig,
                                                                                                    "step_decay")


# Each entry point and the settings groups (settings/) it is made of. A group's field is the entry point's own: the same
# default and docstring wherever it shows (a flag, an rl.yaml key, a keyword), except where the entry point restates it
# (RESTATED: its own default or words, for a reason of its own). A group dropped, taken, or restated anew fails here.
ENTRY_POINTS = {
    "harvest": {"PolicyData", "Rendering", "Split", "EngineSettings", "EngineShare"},
    "init-draft": {"PolicyData", "Rendering", "EngineSettings", "EngineShare", "DraftTraining", "Features", "Tracking"},
    "sweep-k": {"PolicyData", "Rendering", "Split", "DraftSampling", "EngineSettings", "EngineShare"},
    "rollout": {"PolicyData", "Rendering", "Split", "DraftSampling", "Proposals", "Drafter", "Speculation", "EngineSettings",
                "EngineShare"},
    "export": {"Rendering", "EngineSettings", "EngineShare"},
    "verify": {"PolicyData", "Rendering", "Split", "DraftSampling", "Proposals", "Drafter", "EngineSettings", "EngineShare"},
    "forecast": set(),
    "rl.yaml": {"PolicyData", "Tracking"},
    "rl.yaml rollout": {"Rendering"},
    "rl.yaml speculation": {"DraftSampling", "Proposals", "Drafter", "Speculation"},
    "rl.yaml engine": {"EngineSettings", "EngineShare"},
    "SpectoolSpeculation": {"DraftSampling", "Proposals", "EngineSettings"},
    "EngineConfig": {"DraftSampling", "Proposals", "EngineSettings"},
}
RESTATED = {
    "harvest": {"split"},  # harvests the train split
    "init-draft": {"data", "dtype", "system_prompt"},  # a harvest run too; the features' precision; a harvest's own
    "sweep-k": {"model"},  # a config.json folder with --dummy-weights
    "export": {"system_prompt", "chat_template_kwargs"},  # default: the draft's harvest's
    "verify": {"dtype"},  # float32: the proof's precision
    "rl.yaml": {"data"},  # prompts with answers: GRPO's rewards need them
    "rl.yaml speculation": {"draft"},  # a hub id too (rl/speculation.py resolves it)
    "rl.yaml engine": {"gpu_memory_utilization"},  # 0.5: the colocated trainer's share left to it
    "EngineConfig": {"enforce_eager"},  # the engine's default: $SPECTOOL_ENFORCE_EAGER
}


def _entry_points() -> dict[str, tuple[type, object]]:
    """name -> (its settings class, {field: (default, docstring)} as a user sees it: the flags, rl.yaml's keys (train-rl
    --help), a Python call's keywords)."""
    from spectool.cli import _flag, _leaves, rl_keys
    from spectool.engine.engine import EngineConfig
    from spectool.integrations.trl.settings import SpeculationSettings
    from spectool.rl import config as rl

    out = {}
    for name, spec in CLI.items():
        shown = {path: (default, spec.help.get(path, doc)) for path, _, default, doc in _leaves(spec) if "." not in path}
        assert all(_flag(spec, p) == "--" + p.replace("_", "-") for p in shown if p not in spec.renamed)
        out[name] = (spec.cls, shown)
    keys = {key: (default, doc) for key, default, doc in rl_keys()}
    for name, cls, prefix in (("rl.yaml", rl.RLConfig, ""), ("rl.yaml rollout", rl.RolloutSection, "rollout."),
                              ("rl.yaml speculation", rl.SpeculationSection, "speculation."),
                              ("rl.yaml engine", rl.EngineSection, "engine.")):
        out[name] = (cls, {k[len(prefix):]: v for k, v in keys.items() if k.startswith(prefix) and "." not in k[len(prefix):]})
    for cls in (SpeculationSettings, EngineConfig):
        docs = field_docs(cls)
        out[cls.__name__ if cls is EngineConfig else "SpectoolSpeculation"] = (
            cls, {f: (getattr(cls(None) if cls is SpeculationSettings else cls("m"), f), docs.get(f)) for f in docs})
    return out


def test_every_entry_point_reads_back_against_the_groups():
    """Every entry point takes the groups the table says, and shows each of their fields with the group's default and
    docstring, unless it restates the field (RESTATED); so a default or a docstring is one field in one file."""
    from dataclasses import MISSING, fields

    from spectool.settings.groups import GROUPS

    entry_points = _entry_points()
    assert set(entry_points) == set(ENTRY_POINTS)
    for name, (cls, shown) in entry_points.items():
        groups = [g for g in GROUPS if issubclass(cls, g)]
        assert {g.__name__ for g in groups} == ENTRY_POINTS[name], name
        own = set(vars(cls).get("__annotations__", {}))
        group_fields = {f.name: (g, f) for g in groups for f in fields(g)}
        assert own & set(group_fields) == RESTATED.get(name, set()), name
        spec = CLI.get(name)
        for field_name, (group, f) in group_fields.items():
            if field_name in own or (spec and field_name in spec.hidden):  # restated, or left off the command line
                continue
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            assert field_name in shown, (name, field_name)
            got_default, got_doc = shown[field_name]
            if isinstance(got_default, list):
                default = list(default)
            assert got_default == default, (name, field_name, got_default, default)
            if not (spec and field_name in spec.help):  # the command line's own words
                assert " ".join(str(got_doc).split()) == field_docs(group)[field_name], (name, field_name)
    # what an entry point declares outside the groups but means as one of them
    from spectool.settings.refresh import RefreshSettings
    from spectool.settings.speculation import Proposals

    assert field_default(ExportConfig, "k") == field_default(Proposals, "k")  # export records the k everyone runs
    assert RefreshSettings().ttt_steps == 0  # the draft's own trained positions, which check_draft holds >= k


def test_no_group_restates_another_and_every_field_is_documented_once():
    """The groups are disjoint (a field belongs to one group, or one extends another) and every field has a docstring;
    the refresh and sampling settings, taken whole, too."""
    from dataclasses import fields

    from spectool.settings.groups import GROUPS, WHOLE

    owner: dict[str, type] = {}
    for group in GROUPS:
        for f in fields(group):
            first = owner.setdefault(f.name, group)
            assert first is group or issubclass(group, first) or issubclass(first, group), (f.name, first, group)
    for group in (*GROUPS, *WHOLE):
        assert set(field_docs(group)) == {f.name for f in fields(group)}, group


def test_weights_are_sent_in_layer_aligned_chunks_each_tensor_once():
    """colocated.send_weights streams (name, tensor) pairs into files of about chunk_bytes that
    never split a decoder layer (a fused q/k/v or gate/up module reloads whole), sends a tied
    tensor once per file, and reads each tensor only when its file is written."""
    import torch
    from safetensors.torch import load_file

    from spectool.engine import colocated

    files: list[dict] = []

    class FakeLLM:
        def collective_rpc(self, method, args=()):
            files.append(load_file(args[0]))
            return [len(files[-1])]

    emb = torch.randn(8, 4)
    state = {"model.embed_tokens.weight": emb}
    for i in range(3):
        for part in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[f"model.layers.{i}.self_attn.{part}.weight"] = torch.randn(4, 4)
    state["model.norm.weight"] = torch.ones(4)
    state["lm_head.weight"] = emb  # tied
    pulled = []
    n = colocated.send_weights(FakeLLM(), "m", ((k, pulled.append(k) or v) for k, v in state.items()), chunk_bytes=100)
    assert n == len(state) and len(files) == 5  # embedding, one file per layer, then norm and lm_head
    assert pulled == list(state)  # every tensor read once, in order
    layer_of = [{k.split(".")[2] for k in f if ".layers." in k} for f in files]
    assert all(len(s) <= 1 for s in layer_of)
    sent = {k: v for f in files for k, v in f.items()}
    assert set(sent) == set(state) and all(torch.equal(sent[k], state[k]) for k in sent)
    files.clear()  # one file: the tied lm_head goes once (safetensors refuses two views of one tensor)
    assert colocated.send_weights(FakeLLM(), "m", state) == len(state) - 1 and len(files) == 1


@pytest.mark.parametrize("command", sorted(CLI))
def test_every_engine_command_takes_the_engine_precision(command):
    """--dtype auto | float32 | bfloat16 | float16 on every command that starts an engine (forecast starts none),
    refused with the flag named otherwise."""
    from spectool.errors import SpectoolError

    cls = CLI[command].cls
    if command == "forecast":
        assert "dtype" not in field_docs(cls)
        return
    assert "dtype" in field_docs(cls)
    if command == "verify":  # its own default and words over the engine group's
        assert field_docs(cls)["dtype"].startswith("The engine's precision: float32 (the proof's default")
    required = {"out": "x", "draft": "d", "sweep": "s"}
    cfg = cls(**{f: v for f, v in required.items() if f in field_docs(cls)}, dtype="float64")
    with pytest.raises(SpectoolError, match=r"--dtype='float64': must be one of auto \| float32 \| bfloat16 \| float16"):
        cfg.validate()


ENGINE_COMMANDS = ("harvest", "init-draft", "sweep-k", "rollout", "export", "verify")


def test_a_new_engine_setting_is_one_field_in_one_file_and_reaches_every_entry_point(tmp_path):
    """A field added to settings/engine.EngineSettings in a scratch copy of the package, and nothing else edited: a
    flag of every engine command with its docstring as help, a key of rl.yaml's engine section (validated, printed by
    --print-config), a keyword of SpectoolSpeculation, and a keyword engine.EngineConfig takes from each of them."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import spectool

    copy = tmp_path / "src" / "spectool"
    shutil.copytree(Path(spectool.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    engine = copy / "settings" / "engine.py"
    text = engine.read_text()
    anchor = "    def validate(self, spell: Spell = flag) -> None:\n        check(self.dtype in ENGINE_DTYPES"
    assert text.count(anchor) == 1
    engine.write_text(text.replace(anchor, '    swap_space_gib: float = 4.0\n    """A scratch engine setting."""\n\n'
                                           + anchor))
    code = f"""
import json, typer
from spectool.cli import app
from spectool.config.rollout import RolloutConfig
from spectool.engine.engine import EngineConfig
from spectool.integrations.trl.settings import SpeculationSettings
from spectool.rl.config import load_config, to_yaml
from spectool.settings.engine import engine_kwargs
commands = typer.main.get_command(app).commands
flags = {{c: [(p.opts, p.default, p.help) for p in commands[c].params if p.name == "swap_space_gib"]
         for c in {ENGINE_COMMANDS!r}}}
rl = load_config(None, ["speculation.draft=x", "engine.swap_space_gib=2"])
trl = SpeculationSettings(None, swap_space_gib=3.0)
print(json.dumps({{"flags": flags, "rl": rl.engine.swap_space_gib, "yaml": "swap_space_gib: 2.0" in to_yaml(rl),
                  "trl": trl.swap_space_gib, "engine": [EngineConfig(model_path="m", **engine_kwargs(s)).swap_space_gib
                                                        for s in (RolloutConfig(swap_space_gib=5.0), rl.engine, trl)]}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(copy.parent)})
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for command in ENGINE_COMMANDS:
        assert got["flags"][command] == [[["--swap-space-gib"], 4.0, "A scratch engine setting."]], command
    assert got["rl"] == 2.0 and got["yaml"] and got["trl"] == 3.0
    assert got["engine"] == [5.0, 2.0, 3.0]


def test_train_rl_help_lists_every_rl_yaml_key_with_its_docstring():
    """Every leaf of rl.yaml (RLConfig, its sections dotted) is listed by `train-rl --help` with its default and its
    docstring: the keys a user may write are the ones the config reads."""
    from dataclasses import asdict

    from typer.testing import CliRunner

    from spectool.cli import rl_keys
    from spectool.rl.config import RLConfig
    from spectool.runs import flatten_keys

    keys = rl_keys()
    assert [k for k, _, _ in keys] == list(flatten_keys(asdict(RLConfig())))
    assert all(doc.strip() for _, _, doc in keys)
    shown = " ".join(CliRunner().invoke(app, ["train-rl", "--help"], terminal_width=400).output.split())
    for key, _, doc in keys:
        assert f"{key} (" in shown and " ".join(doc.split())[:60] in shown, key


def test_config_file_settings_sit_under_the_flags_and_are_checked_by_key(tmp_path, monkeypatch):
    """--config FILE on a flag command: its keys are the flags' names (or the fields'), typed as the flags are; a flag
    given on the command line wins; a file value reaches the settings (a bad one is refused by the settings' own
    rule, before anything runs); an unknown key or a wrong type is refused naming the file's key."""
    from typer.testing import CliRunner

    from spectool.cli import settings_file
    from spectool.errors import SpectoolError

    monkeypatch.chdir(tmp_path)  # out: runs/s, relative: a refused run writes nothing there
    f = tmp_path / "sweep.yaml"
    f.write_text("out: runs/s\nk: [1, 2]\nbatch_sizes: '1,8'\nmethods: [ngram]\nmax_tokens: 12\ntemperature: 1\n"
                 "enforce_eager: true\nmin_gain: 5e-2\n")
    assert settings_file(CLI["sweep-k"], str(f)) == {
        "out": "runs/s", "ks": "1,2", "batch_sizes": "1,8", "methods": "ngram", "max_tokens": 12, "temperature": 1.0,
        "enforce_eager": True, "min_gain": 0.05}
    runner = CliRunner()
    bad = tmp_path / "bad.yaml"
    bad.write_text("out: runs/s\nmethods: [ngram]\nbatch_sizes: [0]\n")
    r = runner.invoke(app, ["sweep-k", "--config", str(bad)])
    assert r.exit_code == 2 and "--batch-sizes=[0]" in r.output  # the file's value reached the settings
    bad.write_text("out: runs/s\nmethods: [ngram]\nbatch_sizes: [0]\nmax_tokens: 0\n")
    r = runner.invoke(app, ["sweep-k", "--config", str(bad), "--batch-sizes", "4"])  # refused either way: nothing runs
    assert r.exit_code == 2 and "--max-tokens=0" in r.output and "--batch-sizes" not in r.output  # the flag won
    for text, words in (("max_tokens: twelve\n", "max_tokens='twelve': must be an integer"),
                        ("batch: 4\n", "key='batch': is no setting of this command (its keys: "),
                        ("[1, 2]\n", "must hold a mapping")):
        bad.write_text(text)
        with pytest.raises(SpectoolError, match=re.escape(words)):
            settings_file(CLI["sweep-k"], str(bad))
    assert not (tmp_path / "runs").exists()


def test_every_engine_setting_reaches_the_engine_from_every_entry_point(monkeypatch):
    """engine_kwargs: each engine-group field a command, rl.yaml or SpectoolSpeculation holds becomes the engine's (an
    enforce_eager left false leaves the engine's default, $SPECTOOL_ENFORCE_EAGER, as before the groups); the context
    alone is left for the command to resolve first."""
    from spectool.engine.engine import EngineConfig
    from spectool.integrations.trl.settings import SpeculationSettings
    from spectool.rl.config import load_config
    from spectool.settings.engine import engine_kwargs

    monkeypatch.delenv("SPECTOOL_ENFORCE_EAGER")  # the suite's (conftest.py): the engine's default is compiled here
    given = dict(dtype="bfloat16", enforce_eager=True)
    rl = load_config(None, ["speculation.draft=x", "engine.dtype=bfloat16", "engine.enforce_eager=true",
                            "engine.gpu_memory_utilization=0.3", "engine.max_model_len=99"])
    for settings in (RolloutConfig(**given, gpu_memory_utilization=0.3, max_model_len=99), rl.engine,
                     SpeculationSettings(None, **given)):
        engine = EngineConfig(model_path="m", **engine_kwargs(settings))
        assert (engine.dtype, engine.enforce_eager) == ("bfloat16", True), type(settings)
        assert engine.max_model_len is None and "max_model_len" not in engine_kwargs(settings)
        if not isinstance(settings, SpeculationSettings):  # TRL's own GPU share (GRPOConfig)
            assert engine.gpu_memory_utilization == 0.3
    assert not EngineConfig(model_path="m", **engine_kwargs(RolloutConfig())).enforce_eager
    monkeypatch.setenv("SPECTOOL_ENFORCE_EAGER", "1")
    assert EngineConfig(model_path="m", **engine_kwargs(RolloutConfig())).enforce_eager  # not asked: the environment


def test_rl_yaml_keeps_its_old_spelling_of_a_derived_context():
    """engine.max_model_len: 0 (an older rl.yaml's "derived") still reads as derived, null now; below that is refused
    in the one wording every entry point uses."""
    from spectool.errors import SpectoolError
    from spectool.rl.config import load_config

    assert load_config(None, ["speculation.draft=x", "engine.max_model_len=0"]).engine.max_model_len is None
    assert load_config(None, ["speculation.draft=x"]).engine.max_model_len is None
    with pytest.raises(SpectoolError, match=re.escape("engine.max_model_len=-1: must be >= 1 (or unset: what the run")):
        load_config(None, ["speculation.draft=x", "engine.max_model_len=-1"])
    with pytest.raises(SpectoolError, match=re.escape("--max-model-len=-1: must be >= 1 (or unset: what the run")):
        RolloutConfig(max_model_len=-1).validate()


@pytest.mark.parametrize("field,value", [("k", 0), ("draft_sampling", "sometimes"), ("dtype", "float64"),
                                         ("enforce_eager", "maybe"), ("method", "medusa"), ("prompt_col", " "),
                                         ("system_prompt", "")])
def test_one_rule_one_wording_at_every_entry_point(field, value):
    """A group's rule refuses the same value in the same words at every entry point that takes the group, only the
    field's spelling differs: a flag (rollout, verify), an rl.yaml key, a SpectoolSpeculation keyword. And the trained
    families' rule, init-draft's and rl.yaml's."""
    from spectool.config.verify import VerifyConfig
    from spectool.errors import SpectoolError
    from spectool.integrations.trl.settings import SpeculationSettings
    from spectool.rl.config import load_config

    section = {"dtype": "engine.", "enforce_eager": "engine.", "prompt_col": "", "system_prompt": "rollout."}.get(
        field, "speculation.")
    attempts = {"--" + field.replace("_", "-"): lambda: RolloutConfig(draft="d", **{field: value}).validate(),
                "--" + field.replace("_", "-") + " ": lambda: VerifyConfig(draft="d", **{field: value}).validate(),
                section + field: lambda: load_config(None, ["speculation.draft=x", f"{section}{field}={value!r}"])}
    if field not in ("method", "prompt_col", "system_prompt"):  # SpectoolSpeculation's drafter is its folder's
        attempts[field] = lambda: SpeculationSettings(None, **{field: value}).validate()
    words = set()
    for spelling, attempt in attempts.items():
        with pytest.raises(SpectoolError) as e:
            attempt()
        message = str(e.value)
        assert message.startswith(f"{spelling.strip()}={value!r}: "), message
        words.add(message.split(": ", 1)[1].replace(" or 'auto'", ""))  # k: 'auto' too where a sweep may set it
    assert len(words) == 1, words


def test_the_trained_families_rule_is_one_wording_in_init_draft_and_rl_yaml():
    """dspark is served (GPU builds) but not trained: init-draft and train-rl refuse it in the same words."""
    from spectool.errors import SpectoolError
    from spectool.rl.config import load_config

    words = set()
    for spelling, attempt in (("--method", lambda: InitDraftConfig(out="d", method="dspark").validate()),
                              ("speculation.method", lambda: load_config(None, ["speculation.draft=x",
                                                                                "speculation.method=dspark"]))):
        with pytest.raises(SpectoolError) as e:
            attempt()
        assert str(e.value).startswith(f"{spelling}='dspark': must be one of eagle3 | peagle | dflash | mtp"), e.value
        words.add(str(e.value).split(": ", 1)[1])
    assert len(words) == 1, words

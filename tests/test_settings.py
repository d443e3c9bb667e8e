"""One source of truth for settings: every CLI option's default and help come from the command's
settings dataclass (config.py), and every field a user may set has an option."""

from __future__ import annotations

import pytest
import typer

from spectool.cli import CLI, app, field_default, field_docs
from spectool.config import ExportConfig, InitDraftConfig, RolloutConfig, SweepConfig, VerifyConfig

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
        if p.name == "ctx":
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
                                                 "answer_col")}
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


def test_defaults_that_must_agree_do():
    """Settings of different owners that describe one thing agree (no literal restated here: a
    change to one owner's default that breaks the agreement fails)."""
    from spectool.draft.refresh_policy import RefreshSettings
    from spectool.engine.engine import EngineConfig
    from spectool.integrations.trl import SpectoolSpeculation
    from spectool.rl.config import RLConfig, SpeculationSection

    ks = {field_default(c, "k") for c in (RolloutConfig, VerifyConfig, ExportConfig)} | {SpeculationSection().k}
    ks |= {EngineConfig(model_path="m").k, SpectoolSpeculation(None).k}
    assert len(ks) == 1, ks  # one default k wherever a draft is run
    assert RLConfig().draft_refresh == RefreshSettings()  # rl.yaml's section is the refresher's settings, defaults and all
    assert RefreshSettings().loss == field_default(InitDraftConfig, "loss")  # online refresh = init-draft's loss
    assert max(field_default(SweepConfig, "ks")) <= field_default(InitDraftConfig, "ttt_steps")  # swept ks are trained
    assert RefreshSettings().ttt_steps == 0  # the draft's own trained positions, which check_draft holds >= k


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
    required = {"out": "x", "draft": "d", "sweep": "s"}
    cfg = cls(**{f: v for f, v in required.items() if f in field_docs(cls)}, dtype="float64")
    with pytest.raises(SpectoolError, match=r"--dtype='float64': must be one of auto \| float32 \| bfloat16 \| float16"):
        cfg.validate()

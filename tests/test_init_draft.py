"""init-draft training without the engine: a harvest run made by hand, tiny policy, resume."""

from __future__ import annotations

import json
import re

import pytest
import torch

from spectool.errors import SpectoolError


def _cfg(tiny_policy, data, out, **kw):
    from spectool.commands.init_draft import InitDraftConfig

    base = dict(out=str(out), model=str(tiny_policy), data=str(data), draft_vocab_size=128, ttt_steps=3,
                epochs=2, batch_size=4, save_every=2, lr=1e-3, warmup_steps=1)
    base.update(kw)
    return InitDraftConfig(**base)


def test_training_learns_and_writes_a_loadable_draft(tiny_policy, fake_harvest, tmp_path):
    from spectool.commands.init_draft import run
    from spectool.draft.checkpoint import load_draft

    r = run(_cfg(tiny_policy, fake_harvest, tmp_path / "d", epochs=6))
    lines = [json.loads(x) for x in (tmp_path / "d" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, r.steps + 1))
    assert lines[-1]["loss"] < lines[0]["loss"]
    assert len(r.heldout["top1"]) == 3 and 0 <= r.coverage <= 1
    # The report: the oracle proposes the policy's argmax, so no greedy draft's P(accept) is above it.
    for m in (r.heldout, r.train):
        assert all(0 <= g <= o + 1e-6 for g, o in zip(m["p_accept"], m["oracle_greedy"]))
    lengths = r.acceptance_lengths()
    assert 1 <= lengths["T=1 greedy"] <= 4 and 1 <= lengths["T=1 greedy oracle"] <= 4
    assert lengths["T=1 probabilistic oracle"] == 4 and len(r.heldout["walk_greedy"]) == 3
    from transformers import AutoModelForCausalLM

    draft, meta = load_draft(tmp_path / "d", AutoModelForCausalLM.from_pretrained(tiny_policy))
    assert meta["ttt_steps"] == 3 and draft.config.draft_vocab_size == 128


def test_resume_after_kill_has_no_lost_or_repeated_steps(tiny_policy, fake_harvest, tmp_path, monkeypatch):
    import spectool.commands.init_draft as train
    import spectool.draft.ttt as loss_mod  # the TTT step's loss, as the step calls it

    calls = {"n": 0}
    orig = loss_mod.ttt_loss

    def dying(*a, **k):
        calls["n"] += 1
        if calls["n"] == 6:  # killed during step 6 (checkpoint at step 4; step 5 logged)
            raise KeyboardInterrupt
        return orig(*a, **k)

    monkeypatch.setattr(loss_mod, "ttt_loss", dying)
    with pytest.raises(KeyboardInterrupt):  # reach weights: the setting resumes with the run
        train.run(_cfg(tiny_policy, fake_harvest, tmp_path / "d", position_weights="reach"))
    monkeypatch.setattr(loss_mod, "ttt_loss", orig)
    r = train.run(_cfg(tiny_policy, fake_harvest, tmp_path / "d", position_weights="reach"))
    steps = [json.loads(x)["step"] for x in (tmp_path / "d" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, r.steps + 1))
    saved = json.loads((tmp_path / "d" / "init_draft.json").read_text())
    assert saved["position_weights"] == "reach"
    assert saved["draft_dtype"] == "float32"  # --draft-dtype auto, recorded as it resolved on this CPU


def test_init_from_another_policys_draft_fails_before_training(tiny_policy, fake_harvest, tmp_path):
    from spectool.commands.init_draft import run
    from spectool.draft.checkpoint import save_draft
    from spectool.draft.model import DraftConfig, Eagle3Draft

    other = DraftConfig(hidden_size=64, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
                        head_dim=32, vocab_size=512, draft_vocab_size=512, target_hidden_size=64, aux_layer_ids=[0, 1, 2])
    save_draft(Eagle3Draft(other), tmp_path / "other")
    with pytest.raises(SpectoolError, match="does not fit this policy"):
        run(_cfg(tiny_policy, fake_harvest, tmp_path / "d", init_from=str(tmp_path / "other")))
    assert not (tmp_path / "d").exists()


def test_corrupt_draft_weights(tiny_policy, tmp_path):
    from spectool.draft.checkpoint import load_draft, save_draft
    from spectool.draft.model import DraftConfig, Eagle3Draft

    c = DraftConfig(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                    vocab_size=32, draft_vocab_size=16, target_hidden_size=16, aux_layer_ids=[0, 1, 2])
    save_draft(Eagle3Draft(c), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage" * 10)
    with pytest.raises(SpectoolError, match="corrupt"):
        load_draft(tmp_path)


def _accelerate(args: list, machines: int, port: int) -> list[list[str]]:
    """`accelerate launch --multi_gpu --num_processes 2` on a CPU-only machine (torchrun + gloo DDP; `--cpu` would
    start one process): on one machine, or one process on each of 2 machines (node ranks 0 and 1) whose main
    process listens on loopback, as a cluster's first node would."""
    import os
    import shutil
    import sys

    launcher = shutil.which("accelerate", path=os.path.dirname(sys.executable))
    return [[launcher, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", str(machines),
             "--machine_rank", str(i), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
             "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "spectool.cli", "init-draft", *map(str, args)]
            for i in range(machines)]


@pytest.mark.multiproc
def test_accelerate_launch_with_two_processes_trains_the_same_draft_on_one_node_or_two(tiny_policy, fake_harvest,
                                                                                      tmp_path):
    """Each process takes half of every batch, only the main process writes, and the result is a complete,
    loadable draft; two launchers side by side (node ranks 0 and 1, one process each) train the same draft, bit
    for bit, through the same losses."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import load_draft

    from clirun import free_port, nodes

    def run(out, machines: int) -> list[dict]:
        args = ["--model", tiny_policy, "--data", fake_harvest, "--out", out, "--draft-vocab-size", "128",
                "--ttt-steps", "3", "--epochs", "2", "--batch-size", "4", "--save-every", "2"]
        done = nodes(_accelerate(args, machines, free_port()), env={"OMP_NUM_THREADS": "1"}, timeout=300)
        assert all(r.returncode == 0 for r in done), "\n".join(r.stderr[-3000:] for r in done)
        # rank 0 renders; both trained (DDP would hang otherwise)
        assert sum(r.stdout.count("init-draft ->") for r in done) == 1
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        steps = json.loads((out / "manifest.json").read_text())["result"]["steps"]
        assert [x["step"] for x in lines] == list(range(1, steps + 1))  # one writer: no duplicated lines
        return [{k: x[k] for k in ("step", "loss", "loss_per_step", "eval") if k in x} for x in lines]

    one, two = tmp_path / "one", tmp_path / "two"
    assert run(one, 1) == run(two, 2)
    load_draft(two, AutoModelForCausalLM.from_pretrained(tiny_policy))
    a, b = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    assert not list(two.glob(".spectool-rank-*"))  # the shared-folder check leaves nothing behind


@pytest.mark.multiproc
def test_a_machine_that_does_not_see_the_run_folder_is_refused(tiny_policy, fake_harvest, tmp_path):
    """Two machines whose --out is not one folder (a relative `run`, each launcher in its own directory, as two
    machines' local disks) are refused on both before any feature or step, naming the one that does not see it
    and the shared filesystem it needs."""
    from clirun import free_port, nodes

    here = [tmp_path / "node0", tmp_path / "node1"]
    for d in here:
        d.mkdir()
    args = ["--model", tiny_policy, "--data", fake_harvest, "--out", "run", "--draft-vocab-size", "128",
            "--ttt-steps", "3", "--epochs", "1", "--batch-size", "4"]
    done = nodes(_accelerate(args, 2, free_port()), cwds=here, env={"OMP_NUM_THREADS": "1"}, timeout=180)
    for r in done:
        assert r.returncode != 0
        assert "on a filesystem every node shares (e.g. NFS or Lustre)" in r.stderr, r.stderr[-3000:]
        assert "rank 1 (node 1, host " in r.stderr and f"{here[1] / 'run'}" in r.stderr  # machine rank 1: rank 1
    assert sorted(p.name for p in (here[0] / "run").iterdir()) == ["init_draft.json"]  # claimed, nothing trained
    assert not (here[1] / "run").exists()


def test_remap_vocab_keeps_shared_rows_and_fills_new_ones_from_the_policy(tiny_policy):
    from transformers import AutoModelForCausalLM

    from spectool.draft.checkpoint import new_draft, remap_vocab

    policy = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32)
    torch.manual_seed(0)
    old = new_draft(policy, torch.tensor([3, 5, 9, 20]), [0, 1, 2])
    with torch.no_grad():
        old.lm_head.weight.add_(1.0)  # trained rows differ from the policy's
        old.fc.weight.mul_(3.0)
    new, kept = remap_vocab(old, torch.tensor([1, 5, 20, 33, 40]), policy)
    assert kept == 2 and new.config.draft_vocab_size == 5
    assert new.draft_to_target_ids().tolist() == [1, 5, 20, 33, 40]  # d2t round trip
    torch.testing.assert_close(new.lm_head.weight[1], old.lm_head.weight[1])  # token 5
    torch.testing.assert_close(new.lm_head.weight[2], old.lm_head.weight[3])  # token 20
    W = policy.get_output_embeddings().weight
    torch.testing.assert_close(new.lm_head.weight[3], W[33])  # new token: the policy's row
    torch.testing.assert_close(new.fc.weight, old.fc.weight)  # everything else as is


def test_init_from_keeps_the_map_or_remaps_it_explicitly(tiny_policy, fake_harvest, tmp_path, capsys):
    from spectool.commands.init_draft import run
    from spectool.draft.checkpoint import load_draft

    run(_cfg(tiny_policy, fake_harvest, tmp_path / "warm", draft_vocab_size=64, epochs=1))
    warm_ids = load_draft(tmp_path / "warm")[0].draft_to_target_ids().tolist()
    run(_cfg(tiny_policy, fake_harvest, tmp_path / "keep", init_from=str(tmp_path / "warm"), epochs=1))
    assert load_draft(tmp_path / "keep")[0].draft_to_target_ids().tolist() == warm_ids
    r = run(_cfg(tiny_policy, fake_harvest, tmp_path / "remap", init_from=str(tmp_path / "warm"), remap_vocab=True,
                 draft_vocab_size=96, epochs=1))
    remapped = load_draft(tmp_path / "remap")[0].draft_to_target_ids().tolist()
    assert len(remapped) == 96 and set(warm_ids) <= set(remapped)  # the 64 most frequent are among the 96
    printed = capsys.readouterr().out
    assert "draft vocabulary 64 -> 96 tokens, 64 lm_head rows kept" in printed
    before, after = (float(x) for x in re.search(r"coverage of these responses ([\d.]+)% -> ([\d.]+)%", printed).groups())
    assert after > before and r.coverage == pytest.approx(after / 100, abs=1e-3)  # 96 tokens cover more than 64
    with pytest.raises(SpectoolError, match="--remap-vocab"):
        run(_cfg(tiny_policy, fake_harvest, tmp_path / "x", remap_vocab=True))


def test_an_existing_draft_refuses_other_settings_and_stays_intact(tiny_policy, fake_harvest, tmp_path):
    from spectool.commands.init_draft import run

    out = tmp_path / "d"
    run(_cfg(tiny_policy, fake_harvest, out, epochs=1))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    for change, key in [({"draft_vocab_size": 64}, "draft_vocab_size"), ({"ttt_steps": 5}, "ttt_steps")]:
        with pytest.raises(SpectoolError, match=f"other settings \\({key} differ\\)"):
            run(_cfg(tiny_policy, fake_harvest, out, epochs=1, **change))
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # vLLM's config.json too
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    run(_cfg(tiny_policy, fake_harvest, out, epochs=1, save_every=7))  # same settings: resumes, nothing to do
    other = tmp_path / "not-a-draft"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(SpectoolError, match="holds other files; pick a new --out"):
        run(_cfg(tiny_policy, fake_harvest, other))
    assert (other / "notes.txt").read_text() == "mine" and len(list(other.iterdir())) == 1


def test_a_harvests_hidden_state_shards_are_trained_on_without_a_policy_forward(tiny_policy, fake_harvest, tmp_path,
                                                                                monkeypatch):
    """One features format: the harvest's --hidden-states shards are what init-draft reads, and
    training from them gives the same batches as training from a fresh forward."""
    import shutil

    from transformers import AutoModelForCausalLM

    import spectool.hidden as hidden
    from spectool.commands.init_draft import run
    from spectool.models import weights_digest
    from spectool.records import load_records
    from spectool.runs import MANIFEST, atomic_write_json, read_json

    fresh = run(_cfg(tiny_policy, fake_harvest, tmp_path / "fresh", epochs=1, features="cache"))
    assert (tmp_path / "fresh" / ".train" / "features.safetensors").exists()

    with_shards = tmp_path / "harvest-with-hidden"
    shutil.copytree(fake_harvest, with_shards)
    policy = AutoModelForCausalLM.from_pretrained(tiny_policy, dtype=torch.float32).eval()
    recs = load_records(with_shards)
    layer_ids = hidden.default_aux_layer_ids(policy.config.num_hidden_layers)
    items = hidden.feature_items(policy, [p + r for p, r in zip(recs["prompt_ids"], recs["response_ids"])], layer_ids)
    hidden.save_features(with_shards / "hidden" / "shard-00000.safetensors", items)
    atomic_write_json(with_shards / MANIFEST, {**read_json(with_shards / MANIFEST), "aux_layer_ids": layer_ids,
                                            "model_weights": weights_digest(tiny_policy)})  # as harvest records it

    def no_forward(*a, **k):
        raise AssertionError("the policy's features were recomputed")

    monkeypatch.setattr(hidden, "feature_items", no_forward)
    reused = run(_cfg(tiny_policy, with_shards, tmp_path / "reused", epochs=1, features="cache"))
    assert not (tmp_path / "reused" / ".train" / "features.safetensors").exists()
    # streamed from the same shards, a shard at a time: the same batches, and nothing written
    streamed = run(_cfg(tiny_policy, with_shards, tmp_path / "streamed", epochs=1, features="stream"))
    assert not (tmp_path / "streamed" / ".train" / "features").exists() and streamed.feature_cache_bytes == 0
    losses = [[json.loads(x)["loss"] for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
              for d in ("fresh", "reused", "streamed")]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5) and losses[0] == pytest.approx(losses[2], rel=1e-5)
    assert all(reused.heldout[k] == pytest.approx(v) for k, v in fresh.heldout.items())


def test_disk_budget_refuses_before_anything_is_written(tiny_policy, fake_harvest, tmp_path):
    from spectool.commands.init_draft import run

    out = tmp_path / "d"
    with pytest.raises(SpectoolError, match=r"features would take up to .* GiB .*--disk-budget-gb is 1e-06; "
                                            r"--features online .* takes no disk"):
        run(_cfg(tiny_policy, fake_harvest, out, disk_budget_gb=1e-6))
    assert not out.exists()
    r = run(_cfg(tiny_policy, fake_harvest, out, disk_budget_gb=1.0, epochs=1))  # the same run within budget
    assert 0 < r.feature_cache_bytes < 1024**3


def test_two_layer_draft_trains_and_a_warm_start_keeps_its_depth(tiny_policy, fake_harvest, tmp_path):
    from transformers import AutoModelForCausalLM

    from spectool.commands.init_draft import run
    from spectool.draft.checkpoint import load_draft

    run(_cfg(tiny_policy, fake_harvest, tmp_path / "d2", epochs=1, draft_layers=2))
    draft, _ = load_draft(tmp_path / "d2", AutoModelForCausalLM.from_pretrained(tiny_policy))
    assert draft.config.num_hidden_layers == 2 and json.loads((tmp_path / "d2" / "config.json").read_text())[
        "num_hidden_layers"] == 2
    with pytest.raises(SpectoolError, match="has 2 decoder layer.*pass --draft-layers 2"):
        run(_cfg(tiny_policy, fake_harvest, tmp_path / "d3", init_from=str(tmp_path / "d2")))
    assert not (tmp_path / "d3").exists()


def test_preset_fills_what_the_command_line_did_not_set():
    from spectool.config.init_draft import INIT_DRAFT_PRESETS, InitDraftConfig, apply_preset

    cfg = InitDraftConfig(out="o", preset="quality", epochs=7)
    got = apply_preset(cfg, {"epochs", "out", "preset"})
    q = INIT_DRAFT_PRESETS["quality"]
    assert got.epochs == 7 and got.data == q["data"] and got.harvest.samples == q["harvest.samples"]
    assert got.harvest.n_prompts == q["harvest.n_prompts"] and got.harvest.seed == cfg.harvest.seed
    assert cfg.data == InitDraftConfig().data  # the given config is not changed
    with pytest.raises(SpectoolError, match="--preset='fast': must be one of quality"):
        apply_preset(InitDraftConfig(out="o", preset="fast"), set())


def test_a_harvest_run_keeps_the_prompts_it_rendered(tiny_policy, fake_harvest, tmp_path):
    """--system-prompt / --chat-template-kwargs render the harvest init-draft makes from a data source; a harvest run
    given as --data keeps its own, and other settings are refused before --out is claimed."""
    from spectool.commands.init_draft import run

    out = tmp_path / "d"
    with pytest.raises(SpectoolError, match=r"--system-prompt 'Be brief.': harvest run .* rendered its prompts with None"):
        run(_cfg(tiny_policy, fake_harvest, out, system_prompt="Be brief."))
    m = json.loads((fake_harvest / "manifest.json").read_text())
    m["rendering"] = {"system_prompt": "Be brief.", "chat_template_kwargs": {"enable_thinking": False}}
    (fake_harvest / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(SpectoolError, match=r"--chat-template-kwargs \{'enable_thinking': True\}: .* with "
                                            r"\{'enable_thinking': False\}"):
        run(_cfg(tiny_policy, fake_harvest, out, system_prompt="Be brief.", chat_template_kwargs={"enable_thinking": True}))
    assert not out.exists()

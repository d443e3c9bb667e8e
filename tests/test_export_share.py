"""An export ready to share: its model card (hub metadata, the check's T=0 and T=1 acceptance, the data, the command
that made it, the vLLM snippet) and `--push-to-hub`, which uploads the verified folder once it is in place and never
a refused one. The engine here is a stand-in reporting chosen acceptance (the real engine's run of the same path:
tests/test_export_speculators.py, tests/test_pipeline_e2e.py); the hub client is a recording fake (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectool.errors import SpectoolError


class FakeEngine:
    """Stands in for engine.Engine: mean acceptance length 1 + `ACCEPTED[T]` (accepted tokens per draft of k=2) at
    temperature T, whatever the prompts."""

    ACCEPTED = {0.0: 0.75, 1.0: 0.5}

    def __init__(self, cfg):
        self.cfg, self.served_by = cfg, "a stand-in engine"

    def generate(self, prompts, sampling):
        from spectool.stats import AcceptanceStats

        drafts = 10 * len(prompts)
        return [], AcceptanceStats(drafts, 2 * drafts, int(self.ACCEPTED[sampling.temperature] * drafts))


class RecordingHub:
    """huggingface_hub.HfApi's two calls export makes, recorded with what the folder held when uploaded."""

    calls: list = []
    fail = False

    def create_repo(self, repo_id, repo_type=None, exist_ok=False):
        RecordingHub.calls.append(("create_repo", repo_id, exist_ok))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, folder_path, repo_id, repo_type=None, commit_message=""):
        if RecordingHub.fail:
            raise OSError("401 Client Error: Unauthorized")
        files = sorted(p.name for p in Path(folder_path).iterdir())
        RecordingHub.calls.append(("upload_folder", folder_path, repo_id, files,
                                   (Path(folder_path) / "README.md").read_text()))


@pytest.fixture
def fakes(monkeypatch):
    import huggingface_hub

    import spectool.commands.export as export

    monkeypatch.setattr(export, "Engine", FakeEngine)
    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingHub)
    monkeypatch.setattr(RecordingHub, "calls", [])
    monkeypatch.setattr(RecordingHub, "fail", False)
    return RecordingHub


def test_a_verified_export_carries_its_card_and_is_uploaded_in_place(random_draft, tiny_policy, tmp_path, fakes):
    from spectool.commands.export import run
    from spectool.config.export import ExportConfig

    out = tmp_path / "share"
    cfg = ExportConfig(draft=str(random_draft), out=str(out), model=str(tiny_policy), k=2, min_acceptance_length=1.5,
                       push_to_hub="someone/tiny-eagle3")
    r = run(cfg)
    assert (r.mean_acceptance_length, r.mean_acceptance_length_t1) == (1.75, 1.5) and r.proposals == "greedy"
    m = json.loads((out / "manifest.json").read_text())
    assert m["verified_mean_acceptance_length"] == 1.75 and m["verified_mean_acceptance_length_t1"] == 1.5
    assert m["verified_proposals"] == "greedy"  # auto on the CPU build: what rollout's engines propose with
    card = (out / "README.md").read_text()
    front = card.split("---")[1]
    assert f"base_model: {tiny_policy.name}" in front and "library_name: vllm" in front
    assert "- speculative-decoding" in front and "- eagle3" in front and "- spectool" in front
    assert "| 0 (greedy) | 1.75 |" in card and "| 1 (seed 0) | 1.50 | greedy (auto: the CPU build" in card
    assert "refused below 1.5 at T=0" in card and "a stand-in engine" in card
    assert f"spectool export --draft {random_draft} --out {out} --model {tiny_policy} --k 2 --min-acceptance 1.5 " \
           "--push-to-hub someone/tiny-eagle3" in card
    assert '"method": "eagle3", "model": "someone/tiny-eagle3", "num_speculative_tokens": 2' in card
    # uploaded once verified and moved in place: the folder at --out, card included, nothing else left beside it
    assert fakes.calls[0] == ("create_repo", "someone/tiny-eagle3", True)
    _, folder, repo, files, uploaded_card = fakes.calls[1]
    assert (folder, repo, uploaded_card) == (str(out), "someone/tiny-eagle3", card)
    assert {"README.md", "config.json", "model.safetensors", "manifest.json"} <= set(files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["share"] and r.pushed_to.endswith("someone/tiny-eagle3")


def test_a_refused_export_is_not_uploaded_and_a_failed_upload_keeps_the_export(random_draft, tiny_policy, tmp_path,
                                                                              fakes):
    from spectool.commands.export import run
    from spectool.config.export import ExportConfig

    cfg = ExportConfig(draft=str(random_draft), out=str(tmp_path / "no"), model=str(tiny_policy), k=2,
                       min_acceptance_length=1.8, push_to_hub="someone/tiny-eagle3")
    with pytest.raises(SpectoolError, match="refused: mean acceptance length 1.75 < floor 1.8"):
        run(cfg)
    assert fakes.calls == [] and not list(tmp_path.iterdir())
    fakes.fail = True
    out = tmp_path / "kept"
    with pytest.raises(SpectoolError) as e:
        run(ExportConfig(draft=str(random_draft), out=str(out), model=str(tiny_policy), k=2,
                         min_acceptance_length=1.0, push_to_hub="someone/tiny-eagle3"))
    assert "Unauthorized" in str(e.value) and "hf auth login" in str(e.value) and f"kept at {out}" in str(e.value)
    assert (out / "README.md").exists() and (out / "model.safetensors").exists()


def test_push_settings_are_checked_before_anything_runs():
    from spectool.config.export import ExportConfig

    with pytest.raises(SpectoolError, match="--push-to-hub.*verified export only"):
        ExportConfig(draft="d", out="o", verify=False, push_to_hub="a/b").validate()
    with pytest.raises(SpectoolError, match="--push-to-hub.*ORG/NAME"):
        ExportConfig(draft="d", out="o", push_to_hub="no-namespace").validate()


def test_the_cards_command_line_gives_back_the_same_settings(monkeypatch):
    """The command a card shows, run through the CLI, builds the settings it was made from."""
    import shlex

    from typer.testing import CliRunner

    import spectool.commands.export as export
    from spectool.cli import app
    from spectool.commands.export_card import command_line
    from spectool.config.export import ExportConfig

    cfg = ExportConfig(draft="d", out="o x", format="speculators", target="nemo-rl", k=3, verify=True,
                       min_acceptance_length=1.4, chat_template_kwargs={"enable_thinking": False},
                       system_prompt="Be brief.", push_to_hub="a/b")
    seen = []
    monkeypatch.setattr(export, "run", seen.append)
    monkeypatch.setattr(export, "render", lambda r: None)
    argv = shlex.split(command_line(cfg))
    assert argv[:2] == ["spectool", "export"]
    r = CliRunner().invoke(app, argv[1:])
    assert r.exit_code == 0, r.output
    assert seen == [cfg]
    assert "--no-verify" in command_line(ExportConfig(draft="d", out="o", verify=False))


def test_a_draft_whose_data_has_no_held_out_prompt_is_checked_on_its_training_prompts(tmp_path):
    """A small file whose every prompt hashes into train (benchmarks/data/long_prompts_4k.jsonl) once made export
    refuse every draft trained on it ("yielded no prompts for split 'eval'"); the check now uses the training split
    and the card says so."""
    from spectool.commands.export import verify_split

    only_train = tmp_path / "train_only.jsonl"
    only_train.write_text(Path("benchmarks/data/long_prompts_4k.jsonl").read_text())
    assert verify_split(str(only_train)) == "train"
    many = tmp_path / "many.jsonl"
    many.write_text("".join(json.dumps({"prompt": f"What is {a} + {b}?"}) + "\n" for a in range(10) for b in range(10)))
    assert verify_split(str(many)) == "eval"  # 100 prompts: about 10 held out


def test_a_draft_harvested_from_other_columns_is_checked_on_them(random_draft, tiny_policy, tmp_path, fakes):
    """A file (or hub) source harvested with --prompt-col/--answer-col: export's check reads it with the harvest's
    columns (from the harvest's config.json), not the defaults, which the file does not have."""
    import shutil

    from spectool.commands.export import run
    from spectool.config.export import ExportConfig

    draft, data, harvest = tmp_path / "draft", tmp_path / "qa.jsonl", tmp_path / "harvest"
    shutil.copytree(random_draft, draft)
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "solution": str(i + 1)}) + "\n"
                            for i in range(100)))
    harvest.mkdir()
    (harvest / "config.json").write_text(json.dumps({"prompt_col": "question", "answer_col": "solution",
                                                     "sampling": {}}))
    m = json.loads((draft / "manifest.json").read_text()) if (draft / "manifest.json").exists() else {}
    (draft / "manifest.json").write_text(json.dumps({**m, "harvest_data": str(data), "harvest": str(harvest)}))
    r = run(ExportConfig(draft=str(draft), out=str(tmp_path / "out"), model=str(tiny_policy), k=2))
    assert r.mean_acceptance_length == 1.75
    card = (tmp_path / "out" / "README.md").read_text()
    assert "question" in card
    # the card names the data file, not this machine's folders (the command line it records is the user's own)
    assert "- data: `qa.jsonl`" in card and "prompts of `qa.jsonl`" in card
    assert str(tmp_path) not in card.split("## Serving")[0]  # the snippet names the folder it is in, where it is
    assert f"name the policy {tiny_policy.name!r}, a local folder's name: --base-model ORG/NAME" in r.note


def test_the_card_names_the_policys_hub_id(random_draft, tiny_policy, tmp_path, fakes):
    """--base-model names the policy in the card, the snippet and the speculators config; without it a folder in
    huggingface_hub's cache is named by its repo id."""
    import shutil

    from spectool.commands.export import run
    from spectool.config.export import ExportConfig

    hub = tmp_path / "hub" / "models--SomeOrg--Tiny-Policy" / "snapshots" / "0123abc"
    shutil.copytree(tiny_policy, hub)
    for name, given, want in (("named", dict(base_model="Org/Policy-8B"), "Org/Policy-8B"),
                              ("cached", {}, "SomeOrg/Tiny-Policy")):
        out = tmp_path / name
        r = run(ExportConfig(draft=str(random_draft), out=str(out), model=str(hub), k=2, format="speculators", **given))
        card = (out / "README.md").read_text()
        assert f"base_model: {want}\n" in card and f"LLM(model={want!r}" in card and f"vllm serve {want} " in card
        assert json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"] == want
        assert "--base-model" not in r.note
    with pytest.raises(SpectoolError, match="--base-model"):
        run(ExportConfig(draft=str(random_draft), out=str(tmp_path / "bad"), base_model="not a repo id"))

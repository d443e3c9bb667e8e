"""Data sources: determinism, disjoint splits, verifiers, and clear errors."""

from __future__ import annotations

import json

import pytest

from spectool.data import load_source
from spectool.data.rewards import extract_answer, math_equal
from spectool.errors import SpectoolError

GYM = "gym:chain_sum:min_terms=2,max_terms=2,min_digits=1,max_digits=1"


def test_gym_is_deterministic_and_splits_are_disjoint():
    a = load_source(GYM, seed=0).tasks("train", 30)
    b = load_source(GYM, seed=0).tasks("train", 30)
    assert [t.id for t in a] == [t.id for t in b]
    ev = load_source(GYM, seed=0).tasks("eval", 10)
    assert not {t.prompt for t in a} & {t.prompt for t in ev}
    # Drawing more keeps the first ones (prefix-stable): a resumed harvest sees the same prompts.
    assert [t.id for t in load_source(GYM, seed=0).tasks("train", 40)][:30] == [t.id for t in a]


def test_gym_verifier_scores_right_and_wrong():
    src = load_source(GYM, seed=0)
    t = src.tasks("train", 1)[0]
    assert src.score(t, f"The answer is {t.answer}.") == 1.0
    assert src.score(t, "I do not know") == 0.0
    assert src.score(t, f"{int(t.answer) + 1}") == 0.0


def test_gym_errors_name_the_problem():
    with pytest.raises(SpectoolError, match="unknown reasoning-gym task"):
        load_source("gym:no_such_task")
    with pytest.raises(SpectoolError, match="key=value"):
        load_source("gym:chain_sum:max_terms")


def test_unknown_source():
    with pytest.raises(SpectoolError, match="unknown data source"):
        load_source("imagenet")


@pytest.fixture
def hub_caches(tmp_path, monkeypatch):
    """Empty datasets and hub caches (what HF_HOME=tmp gives a fresh process), offline (conftest sets
    HF_DATASETS_OFFLINE=1 and HF_HUB_OFFLINE=1 for the session). (datasets cache, hub cache)."""
    import datasets
    import huggingface_hub

    assert datasets.config.HF_HUB_OFFLINE  # datasets' own reading of HF_DATASETS_OFFLINE / HF_HUB_OFFLINE
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    return tmp_path / "hf" / "datasets", tmp_path / "hf" / "hub"


def _warm_datasets_cache(cache, repo: str, splits: dict[str, dict]) -> None:
    """`repo` as a first online `datasets.load_dataset(repo)` leaves it in datasets' cache
    (ORG___NAME/default/0.0.0/<hash>/NAME-<split>.arrow): the parquet builder datasets uses for a hub repo, prepared
    from local parquet files of `splits` ({split: columns})."""
    import datasets
    from datasets.packaged_modules.parquet.parquet import Parquet

    files = {}
    for split, columns in splits.items():
        files[split] = str(cache.parent / f"{repo.replace('/', '--')}-{split}.parquet")
        datasets.Dataset.from_dict(columns).to_parquet(files[split])
    b = Parquet(dataset_name=repo.split("/")[1], config_id="default", data_files=files, hash="0" * 16,
                cache_dir=str(cache))
    b.repo_id = repo  # the hub repo it came from names the folder (set after: its data files are local here)
    b._cache_dir = b._build_cache_dir()
    b.download_and_prepare()


def _warm_hub_cache(hub, repo: str, columns: dict, split: str = "train") -> None:
    """`repo` as `hf download REPO --repo-type dataset` leaves it in huggingface_hub's file cache."""
    import datasets

    rev = "a" * 40
    folder = hub / f"datasets--{repo.replace('/', '--')}"
    (folder / "snapshots" / rev / "data").mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(rev)
    datasets.Dataset.from_dict(columns).to_parquet(str(folder / "snapshots" / rev / "data" / f"{split}-00000.parquet"))


SUMS = {"question": [f"What is {a} + {b}?" for a in range(10) for b in range(10)],
        "solution": [str(a + b) for a in range(10) for b in range(10)]}


def test_a_hub_dataset_is_read_offline_from_a_warm_cache(hub_caches):
    cache, hub = hub_caches
    # standard format (a text prompt), as datasets' cache holds it; the split and the columns chosen
    _warm_datasets_cache(cache, "org/sums", {"train": {"question": ["never read"], "solution": ["0"]}, "test": SUMS})
    src = load_source("hub:org/sums:split=test", prompt_col="question", answer_col="solution")
    t = src.tasks("train", 5)[0]
    assert t.prompt in SUMS["question"] and t.answer == str(eval(t.prompt[8:-1]))  # noqa: S307 (our own sums)
    assert src.verifiable and src.score(t, f"Answer: {t.answer}") == 1.0 and src.score(t, "Answer: 99") == 0.0
    with pytest.raises(SpectoolError, match="no column 'prompt'.*--prompt-col"):
        load_source("hub:org/sums:split=test")
    with pytest.raises(SpectoolError, match="Unknown split.*split=S"):
        load_source("hub:org/sums:split=validation", prompt_col="question")
    # conversational format (every turn kept), as `hf download` leaves it in the hub's file cache; no answer column
    chats = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Tell me about {x}."}]
             for x in range(40)]
    _warm_hub_cache(hub, "org/chats", {"prompt": chats})
    src = load_source("hub:org/chats")
    t = src.tasks("train", 3)[0]
    assert [m["role"] for m in t.messages] == ["system", "user"] and not src.verifiable and t.answer is None


def test_dapo_is_the_hub_path_with_its_answers(hub_caches):
    from spectool.data.sources import DAPO_HUB_ID

    cache, _ = hub_caches
    rows = {"prompt": [[{"role": "user", "content": f"Solve {a} * 7."}] for a in range(30)],
            "reward_model": [{"ground_truth": str(a * 7), "style": "rule"} for a in range(30)]}
    _warm_datasets_cache(cache, DAPO_HUB_ID, {"train": rows})
    src = load_source("dapo")
    t = src.tasks("train", 4)[1]
    assert t.answer == str(int(t.prompt.split()[1]) * 7) and src.score(t, f"Answer: {t.answer}") == 1.0


def test_a_hub_dataset_missing_from_the_caches_offline_says_what_to_do(hub_caches):
    cache, hub = hub_caches
    for spec, repo in (("hub:org/absent", "org/absent"), ("dapo", "BytedTsinghua-SIA/DAPO-Math-17k")):
        with pytest.raises(SpectoolError) as e:
            load_source(spec)
        msg = str(e.value)
        assert "HF_DATASETS_OFFLINE=1" in msg and str(cache) in msg and str(hub) in msg and repo in msg
        assert "gym:chain_sum" in msg and "hf download" in msg
    with pytest.raises(SpectoolError, match="hub:ORG/NAME"):
        load_source("hub:no-namespace")
    with pytest.raises(SpectoolError, match="options: split, config"):
        load_source("hub:org/sums:splt=test")
    with pytest.raises(SpectoolError, match="written hub:org/sums"):
        load_source("org/sums")


def test_file_source_columns_and_verifier(gym_jsonl):
    src = load_source(str(gym_jsonl), prompt_col="question", answer_col="solution")
    t = src.tasks("train", 5)[0]
    assert src.score(t, f"Answer: {t.answer}") == 1.0
    with pytest.raises(SpectoolError, match="no column 'prompt'"):
        load_source(str(gym_jsonl))


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    with pytest.raises(SpectoolError, match="has no rows"):
        load_source(str(empty))
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": "b",}\n')
    with pytest.raises(SpectoolError, match=r"b.jsonl, line 2: not valid JSON \(Expecting property name"):
        load_source(str(bad))
    with pytest.raises(SpectoolError, match="does not exist"):
        load_source(str(tmp_path / "missing.jsonl"))


def test_chat_messages_prompt_cells(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"prompt": [{"role": "user", "content": "What is 2+2?"}], "answer": "4"}) + "\n")
    src = load_source(str(p))
    split = "eval" if __import__("spectool.data.sources", fromlist=["x"]).in_eval_split("What is 2+2?") else "train"
    assert src.tasks(split, 1)[0].prompt == "What is 2+2?"
    assert load_source("chat").tasks("train", 5)


def test_answer_extraction_and_math_equivalence():
    assert extract_answer("so <answer>42</answer>") == "42"
    assert extract_answer("Work... Answer: \\frac{1}{2}") == "\\frac{1}{2}"
    assert extract_answer("3 + 4 = 7") == "7"
    assert extract_answer("no digits") is None
    assert math_equal("0.5", "\\frac{1}{2}") == 1.0
    assert math_equal("3", "4") == 0.0


WIDE = "gym:chain_sum:min_terms=2,max_terms=3,min_digits=1,max_digits=2"


def test_mix_follows_weights_and_scores_with_each_sources_verifier(tmp_path):
    from spectool.data.sources import mix_counts

    f = tmp_path / "products.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"What is {a} * {b}?", "answer": str(a * b)}) + "\n"
                         for a in range(20) for b in range(20)))
    spec = f"{GYM}@3+{f}@1"
    src = load_source(spec, seed=0)
    tasks = src.tasks("train", 40)
    assert mix_counts(spec, tasks, src) == {GYM: 30, str(f): 10}
    assert [t.id for t in load_source(spec, seed=0).tasks("train", 40)] == [t.id for t in tasks]  # deterministic
    for t in tasks[:8]:  # each task is scored by the verifier of the source it came from
        assert src.score(t, f"The answer is {t.answer}.") == 1.0
        assert src.score(t, "no idea") == 0.0


def test_mix_keeps_train_and_eval_prompts_apart_across_sources():
    # The narrow task's prompts are also prompts of the wide one: a shared prompt is drawn once,
    # and the split by prompt text puts it on the same side whichever source drew it.
    spec = f"{GYM}@1+{WIDE}@1"
    src = load_source(spec, seed=0)
    train, ev = src.tasks("train", 400), src.tasks("eval", 40)
    assert len({t.prompt for t in train}) == len(train)
    assert not {t.prompt for t in train} & {t.prompt for t in ev}
    narrow_eval = {t.prompt for t in load_source(GYM, seed=0).tasks("eval", 100)}
    assert narrow_eval and not narrow_eval & {t.prompt for t in train}


def test_mix_errors_name_the_part():
    with pytest.raises(SpectoolError, match="weight 'x'"):
        load_source(f"{GYM}@x+{WIDE}")
    with pytest.raises(SpectoolError, match="weight > 0"):
        load_source(f"{GYM}@0+{WIDE}")
    with pytest.raises(SpectoolError, match="appears twice"):
        load_source(f"{GYM}+{GYM}@2")
    with pytest.raises(SpectoolError, match="unknown reasoning-gym task"):
        load_source(f"{GYM}+gym:no_such_task")


def test_every_command_reads_the_columns_it_is_given(gym_jsonl, tiny_policy, tmp_path):
    """sweep-k, verify and train-rl (both backends) read a file by --prompt-col/--answer-col (rl.yaml's prompt_col,
    answer_col), as harvest, init-draft and rollout do: a file without a `prompt` column is refused naming the
    columns it has, and with its columns named it gets as far as the context check (an 8-token context is short
    for every prompt here), before any engine starts or any run folder is claimed."""
    from spectool.commands import sweep_k, train_rl, train_rl_trl, verify
    from spectool.config.sweep_k import SweepConfig
    from spectool.config.verify import VerifyConfig
    from spectool.integrations.trl import task_data

    file = dict(model=str(tiny_policy), data=str(gym_jsonl), max_model_len=8)
    named = dict(prompt_col="question", answer_col="solution")
    runs = {"sweep-k": lambda **c: sweep_k.run(SweepConfig(out=str(tmp_path / "s"), methods=["ngram"], **file, **c)),
            "verify": lambda **c: verify.run(VerifyConfig(out=str(tmp_path / "v"), draft_model="policy", **file, **c)),
            "train-rl": lambda **c: train_rl.run(_rl_config(tmp_path / "rl", **file, **c)),
            "train-rl --backend trl": lambda **c: train_rl_trl.run(_rl_config(tmp_path / "trl", **file, **c, backend="trl"))}
    for name, run in runs.items():
        with pytest.raises(SpectoolError, match=r"no column 'prompt' \(columns: \['question', 'solution'\]\); pick one "
                           r"with --prompt-col, or prompt_col in rl.yaml"):
            run()
        with pytest.raises(SpectoolError, match="max.model.len") as refused:
            run(**named)
        assert "column" not in str(refused.value), name
    assert not [p for p in tmp_path.iterdir()]  # nothing claimed

    ds, reward = task_data(str(gym_jsonl), 4, **named)  # what TRL users' own runs (and the trl backend) train on
    by_id = {t.id: t for t in load_source(str(gym_jsonl), **named).tasks("train", 4)}
    assert [m[-1]["content"] for m in ds["prompt"]] == [by_id[i].prompt for i in ds["task_id"]]
    assert reward(ds["prompt"], [f"The answer is {by_id[i].answer}." for i in ds["task_id"]], ds["task_id"]) == [1.0] * 4


def _rl_config(out, model: str, data: str, max_model_len: int, **columns):
    from spectool.rl.config import RLConfig, SpeculationSection

    cfg = RLConfig(model=model, data=data, out=str(out), speculation=SpeculationSection(enabled=False), **columns)
    cfg.engine.max_model_len = max_model_len
    return cfg

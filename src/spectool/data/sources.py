"""Data sources: `dapo`, `gym:<task>[:k=v,...]`, a hub dataset `hub:ORG/NAME[:split=S,config=C]`, a local
.jsonl/.parquet file, `chat`, and a weighted mix of them: `SOURCE[@WEIGHT]+SOURCE[@WEIGHT]...` (e.g.
`gym:chain_sum@2+gym:products@1`).

Every source yields `Task`s (a prompt and, when verifiable, its answer) and scores a completion.
A prompt is a text (one user turn) or a conversation (a list of {role, content} messages, every turn
kept: TRL's conversational format); prompts.py renders either with the model's chat template.
Splits are decided by a hash of the prompt text (a conversation's: its canonical JSON; about 10%
held out as "eval"), so they are deterministic, independent of how many items are drawn, and can
never overlap.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from spectool.data.chat_prompts import chat_prompts
from spectool.data.rewards import extract_answer, math_equal
from spectool.errors import SpectoolError

EVAL_PERCENT = 10
SPLITS = ("train", "eval")
OFFLINE_ALTERNATIVES = "gym:chain_sum, gym:products, a local .jsonl/.parquet file, or chat"
HUB_PREFIX = "hub:"  # a hub dataset id is always marked: a bare ORG/NAME could be a local folder
DAPO_HUB_ID = "BytedTsinghua-SIA/DAPO-Math-17k"
DAPO_ANSWER_COL = "reward_model.ground_truth"  # verl's layout: the answer nested in the reward_model cell


@dataclass(frozen=True)
class Task:
    id: str  # stable id: hash of the source name and the prompt text
    prompt: str  # the user message, or a conversation's canonical JSON (the chat template is applied later, per model)
    answer: str | None  # reference answer; None for unverifiable sources
    conversation: tuple[dict, ...] | None = field(default=None, hash=False)  # every turn, when the data gives several
    # the data gave a list of messages (TRL's conversational format), one user turn included: TRL renders it through
    # the chat template where it tokenizes a text raw (prompts.py, --text-prompts raw)
    conversational: bool = field(default=False, hash=False, compare=False)

    @property
    def messages(self) -> list[dict]:
        """The conversation to render: every turn the data gave, or the prompt text as one user turn."""
        return [dict(m) for m in self.conversation] if self.conversation else [{"role": "user", "content": self.prompt}]


@dataclass
class TaskSource:
    """A named stream of tasks plus the verifier that turns a completion into a reward."""

    spec: str
    verifiable: bool
    _draw: Callable[[], Any]  # yields (prompt: a text or a conversation, answer, payload) in a fixed order
    _score: Callable[[Any, str], float] | None = None
    _payloads: dict[str, Any] = field(default_factory=dict)

    def tasks(self, split: str, n: int) -> list[Task]:
        """The first `n` tasks of `split` ("train" or "eval"), always the same ones."""
        if split not in SPLITS:
            raise SpectoolError(f"split must be one of {SPLITS}, got {split!r}")
        out: list[Task] = []
        seen: set[str] = set()
        for value, answer, payload in self._draw():
            prompt, conversation = prompt_key(value)
            if prompt in seen or in_eval_split(prompt) != (split == "eval"):
                continue
            seen.add(prompt)
            task = Task(id=_task_id(self.spec, prompt), prompt=prompt, answer=answer, conversation=conversation,
                        conversational=not isinstance(value, str))
            self._payloads[task.id] = payload
            out.append(task)
            if len(out) == n:
                break
        if not out:
            raise SpectoolError(f"data source {self.spec!r} yielded no prompts for split {split!r}")
        return out

    def score(self, task: Task, completion: str) -> float:
        """Reward of `completion` for `task`; 0.0 for unverifiable sources."""
        if self._score is None:
            return 0.0
        payload = self._payloads.get(task.id)
        return float(self._score(task if payload is None else payload, completion))


def prompt_key(value: str | list[dict]) -> tuple[str, tuple[dict, ...] | None]:
    """(the text the split and the task id hash, the conversation or None) of a prompt a source drew. A text, and a
    conversation of one user turn, are that text (the ids of plain-text prompts never change); a longer
    conversation is its canonical JSON."""
    if isinstance(value, str):
        return value, None
    if len(value) == 1 and value[0]["role"] == "user":
        return value[0]["content"], None
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")), tuple(value)


def in_eval_split(prompt: str) -> bool:
    return int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16) % 100 < EVAL_PERCENT


def _task_id(spec: str, prompt: str) -> str:
    return hashlib.sha256(f"{spec}\x00{prompt}".encode()).hexdigest()[:16]


PROMPT_COL = "--prompt-col, or prompt_col in rl.yaml"  # how the prompt column is named, on the command line and in rl.yaml


def load_source(spec: str, *, seed: int = 0, prompt_col: str = "prompt", answer_col: str = "answer") -> TaskSource:
    """Parse a `--data` value into a TaskSource; errors name the accepted forms."""
    spec = spec.strip()
    if MIX_SEPARATOR in spec:
        return _mix_source(spec, seed, prompt_col, answer_col)
    if spec == "dapo":  # DAPO-Math-17k, its prompt a conversation, its answer in reward_model.ground_truth
        return _hub_source("dapo", DAPO_HUB_ID, "", "prompt", DAPO_ANSWER_COL)
    if spec.startswith(HUB_PREFIX):
        repo, _, options = spec[len(HUB_PREFIX):].partition(":")
        return _hub_source(spec, repo, options, prompt_col, answer_col)
    if spec.startswith("gym:"):
        return _gym_source(spec, seed)
    if spec == "chat":
        prompts = chat_prompts()
        return TaskSource(spec, False, lambda: ((p, None, None) for p in prompts))
    if spec.endswith((".jsonl", ".parquet")):
        return _file_source(spec, prompt_col, answer_col)
    hint = f" (a hub dataset is written hub:{spec})" if spec.count("/") == 1 and not Path(spec).exists() else ""
    raise SpectoolError(
        f"unknown data source {spec!r}{hint}: use 'dapo', 'gym:<task>[:key=value,...]' (e.g. gym:chain_sum), "
        "'hub:ORG/NAME[:split=train,config=NAME]' (a hub dataset), a .jsonl/.parquet file, or 'chat'"
    )


# --- weighted mixes -------------------------------------------------------------------------------

MIX_SEPARATOR = "+"


def parse_mix(spec: str) -> list[tuple[str, float]]:
    """`A@2+B@1+C` -> [(A, 2.0), (B, 1.0), (C, 1.0)]; errors name the bad part."""
    parts = []
    for part in spec.split(MIX_SEPARATOR):
        part = part.strip()
        name, _, weight = part.rpartition("@") if "@" in part else (part, "", "1")
        try:
            w = float(weight)
        except ValueError:
            raise SpectoolError(f"--data {spec!r}: weight {weight!r} of {name!r} is not a number "
                                "(a mix is SOURCE@WEIGHT+SOURCE@WEIGHT, e.g. gym:chain_sum@2+gym:products@1)") from None
        if not name or w <= 0:
            raise SpectoolError(f"--data {spec!r}: each part of a mix needs a source and a weight > 0, got {part!r}")
        if MIX_SEPARATOR in name or name in (n for n, _ in parts):
            raise SpectoolError(f"--data {spec!r}: {name!r} appears twice; give it one weight")
        parts.append((name, w))
    return parts


def _mix_source(spec: str, seed: int, prompt_col: str, answer_col: str) -> TaskSource:
    """Tasks drawn from several sources in proportion to their weights (deterministic smooth
    weighted round-robin; an exhausted source leaves the rest to the others). A prompt text that
    two sources share is drawn once, so the split by prompt text keeps train and eval apart."""
    parts = parse_mix(spec)
    sources = [load_source(name, seed=seed, prompt_col=prompt_col, answer_col=answer_col) for name, _ in parts]

    def draw():
        streams = [iter(src._draw()) for src in sources]
        live = list(range(len(streams)))
        drawn = [0] * len(streams)
        while live:
            i = min(live, key=lambda s: ((drawn[s] + 1) / parts[s][1], s))  # the most behind its share
            try:
                prompt, answer, payload = next(streams[i])
            except StopIteration:
                live.remove(i)
                continue
            drawn[i] += 1
            yield prompt, answer, (i, payload if payload is not None else Task("", prompt_key(prompt)[0], answer))

    def score(payload: tuple[int, Any], completion: str) -> float:
        i, inner = payload
        return float(sources[i]._score(inner, completion)) if sources[i]._score else 0.0

    return TaskSource(spec, all(s.verifiable for s in sources), draw, score)


def mix_counts(spec: str, tasks: list[Task], source: TaskSource) -> dict[str, int]:
    """How many of `tasks` (drawn from `source`) came from each part of the mix `spec`."""
    names = [n for n, _ in parse_mix(spec)]
    counts = dict.fromkeys(names, 0)
    for t in tasks:
        counts[names[source._payloads[t.id][0]]] += 1
    return counts


# --- reasoning-gym ------------------------------------------------------------------------------


def _gym_source(spec: str, seed: int) -> TaskSource:
    parts = spec.split(":", 2)
    name = parts[1]
    params = _parse_params(parts[2]) if len(parts) == 3 and parts[2] else {}
    import reasoning_gym  # noqa: PLC0415 (heavy, loaded only on this path)
    from reasoning_gym.factory import DATASETS  # noqa: PLC0415 (heavy, loaded only on this path)

    if name not in DATASETS:
        close = [n for n in sorted(DATASETS) if name[:4] in n][:8] or sorted(DATASETS)[:8]
        raise SpectoolError(f"unknown reasoning-gym task {name!r} in --data {spec!r}; e.g. {', '.join(close)}")
    # 12x the largest request keeps enough items for the 10% eval split; generation is lazy.
    size = int(os.environ.get("SPECTOOL_GYM_POOL", "20000"))
    try:
        ds = reasoning_gym.create_dataset(name, size=size, seed=seed, **params)
    except (TypeError, ValueError, AssertionError) as e:
        raise SpectoolError(f"bad parameters for gym task {name!r} in --data {spec!r}: {e}") from None

    def draw():
        for i in range(len(ds)):
            entry = ds[i]
            yield entry["question"], str(entry["answer"]), entry

    def score(entry: Any, completion: str) -> float:
        answer = extract_answer(completion)
        if answer is None:
            return 0.0
        try:  # some checkers raise on non-numeric text
            return float(ds.score_answer(answer, entry))
        except Exception:  # noqa: BLE001
            return 0.0

    return TaskSource(spec, True, draw, score)


def _parse_params(text: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in text.split(","):
        if "=" not in item:
            raise SpectoolError(f"gym parameter {item!r} must look like key=value (e.g. max_terms=2)")
        key, value = item.split("=", 1)
        try:
            params[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            params[key.strip()] = value
    return params


# --- local files ----------------------------------------------------------------------------------


def _check_jsonl(path: Path) -> None:
    """Say which line is wrong (the JSON reader's own error names none), or that there are no rows."""

    rows = 0
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SpectoolError(f"data file {path}, line {n}: not valid JSON ({e.msg} at column {e.colno}); "
                                    "a .jsonl file holds one JSON object per line") from None
            if not isinstance(row, dict):
                raise SpectoolError(f"data file {path}, line {n}: a JSON {type(row).__name__}, not an object "
                                    "with named columns")
            rows += 1
    if rows == 0:
        raise SpectoolError(f"data file {path} has no rows")


def _file_source(spec: str, prompt_col: str, answer_col: str) -> TaskSource:
    path = Path(spec)
    if not path.exists():
        raise SpectoolError(f"data file {path} does not exist")
    import datasets  # noqa: PLC0415 (heavy, loaded only on this path)

    datasets.disable_progress_bars()
    kind = "json" if path.suffix == ".jsonl" else "parquet"
    if kind == "json":
        _check_jsonl(path)
    try:
        ds = datasets.Dataset.from_json(str(path)) if kind == "json" else datasets.Dataset.from_parquet(str(path))
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types on bad files
        raise SpectoolError(f"could not read {path} as {kind}: {e}") from None
    if len(ds) == 0:
        raise SpectoolError(f"data file {path} has no rows")
    if prompt_col not in ds.column_names:
        raise SpectoolError(
            f"data file {path} has no column {prompt_col!r} (columns: {ds.column_names}); "
            f"pick one with {PROMPT_COL}"
        )
    has_answer = answer_col in ds.column_names

    def draw():
        for n, row in enumerate(ds, 1):
            yield (prompt_value(row[prompt_col], f"data file {path}, row {n}, column {prompt_col!r} ({PROMPT_COL})"),
                   str(row[answer_col]) if has_answer else None, None)

    def score(task: Task, completion: str) -> float:
        return math_equal(extract_answer(completion), task.answer or "")

    return TaskSource(spec, has_answer, draw, score if has_answer else None)


def prompt_value(value: Any, where: str) -> str | list[dict]:
    """A prompt cell: a text, or a conversation (TRL's conversational format: a list of {role, content} messages),
    every turn kept, system turns included, as {role, content} (other keys are not rendered)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise SpectoolError(f"{where}: a prompt must be a text or a non-empty list of chat messages "
                        f"({{\"role\": ..., \"content\": text}}), got {str(value)[:120]}")


# --- hub datasets (DAPO-Math-17k is one) -----------------------------------------------------------

HUB_OPTIONS = ("split", "config")


def _hub_source(spec: str, repo: str, options: str, prompt_col: str, answer_col: str) -> TaskSource:
    """A dataset on the Hugging Face hub in TRL's prompt formats (standard: a text prompt column; conversational: a
    list of messages), read with `datasets.load_dataset`: its cache, HF_HOME / HF_DATASETS_CACHE and offline mode
    (HF_DATASETS_OFFLINE=1 / HF_HUB_OFFLINE=1) work as they do for `datasets`. `answer_col` may name a nested field
    (`reward_model.ground_truth`); without an answer the prompts are unverifiable (reward 0)."""
    pairs = [item.partition("=") for item in options.split(",") if item.strip()]
    opts = {k.strip(): v.strip() for k, _, v in pairs}
    if repo.count("/") != 1 or not all(repo.split("/")) or any(not eq or k.strip() not in HUB_OPTIONS or not v.strip()
                                                                for k, eq, v in pairs):
        raise SpectoolError(f"--data {spec!r}: a hub dataset is hub:ORG/NAME[:split=S,config=C] (options: "
                            f"{', '.join(HUB_OPTIONS)}; e.g. hub:{DAPO_HUB_ID}:split=train)")
    split = opts.get("split", "train")
    ds = _load_hub(spec, repo, opts.get("config"), split)
    if prompt_col not in ds.column_names:
        raise SpectoolError(f"--data {spec!r} has no column {prompt_col!r} (columns: {ds.column_names}); pick one "
                            f"with {PROMPT_COL}")
    has_answer = answer_col.split(".")[0] in ds.column_names

    def draw():
        for n, row in enumerate(ds, 1):
            answer = _nested(row, answer_col) if has_answer else None
            yield (prompt_value(row[prompt_col], f"{repo} ({split}), row {n}, column {prompt_col!r} ({PROMPT_COL})"),
                   None if answer is None else str(answer), None)

    def score(task: Task, completion: str) -> float:
        # DAPO's convention (and the files'): the response ends with "Answer: <expr>"; math-verify checks equality.
        return math_equal(extract_answer(completion), task.answer or "")

    return TaskSource(spec, has_answer, draw, score if has_answer else None)


def _nested(row: dict, path: str) -> Any:
    for key in path.split("."):
        row = row.get(key) if isinstance(row, dict) else None
    return row


def _load_hub(spec: str, repo: str, config: str | None, split: str):
    """The split as `datasets.load_dataset` gives it; offline (or the hub unreachable) a copy in the hub's file cache
    (`hf download REPO --repo-type dataset`) is read too. Missing from both caches: an error naming the caches, the
    offline settings and the offline sources."""
    import datasets  # noqa: PLC0415 (heavy, loaded only on this path)
    import huggingface_hub  # noqa: PLC0415 (heavy, loaded only on this path)

    datasets.disable_progress_bars()
    try:
        try:
            return datasets.load_dataset(repo, config, split=split)
        except ConnectionError as e:  # offline, or the hub unreachable, and not in datasets' own cache
            try:
                snapshot = huggingface_hub.snapshot_download(repo, repo_type="dataset", local_files_only=True)
            except (OSError, ValueError):
                offline = datasets.config.HF_HUB_OFFLINE
                why = ("offline mode is on (HF_DATASETS_OFFLINE=1 or HF_HUB_OFFLINE=1)" if offline else
                       f"the hub is not reachable from this machine ({e})")
                raise SpectoolError(
                    f"--data {spec}: {why} and {repo} is in neither the datasets cache ({datasets.config.HF_DATASETS_CACHE})"
                    f" nor the hub cache ({huggingface_hub.constants.HF_HUB_CACHE}). Load it once where the hub is "
                    f"reachable, with the same HF_HOME (python -c \"import datasets; datasets.load_dataset('{repo}', "
                    f"split='{split}')\" or hf download {repo} --repo-type dataset), or use an offline source: "
                    f"{OFFLINE_ALTERNATIVES}.") from None
            return datasets.load_dataset(snapshot, config, split=split)
    except (FileNotFoundError, ValueError) as e:  # no such dataset (or gated), no such split or config
        raise SpectoolError(f"--data {spec}: {e} (the split and config are hub:{repo}:split=S,config=C; a gated "
                            "dataset needs `hf auth login` or HF_TOKEN)") from None

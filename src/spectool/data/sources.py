"""Data sources: `dapo`, `gym:<task>[:k=v,...]`, a local .jsonl/.parquet file, `chat`, and a
weighted mix of them: `SOURCE[@WEIGHT]+SOURCE[@WEIGHT]...` (e.g. `gym:chain_sum@2+gym:products@1`).

Every source yields `Task`s (a prompt and, when verifiable, its answer) and scores a completion.
Splits are decided by a hash of the prompt text (about 10% held out as "eval"), so they are
deterministic, independent of how many items are drawn, and can never overlap.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from spectool.data.chat_prompts import chat_prompts
from spectool.data.rewards import extract_answer, math_equal
from spectool.errors import SpectoolError

EVAL_PERCENT = 10
SPLITS = ("train", "eval")
OFFLINE_ALTERNATIVES = "gym:chain_sum, gym:products, a local .jsonl/.parquet file, or chat"
DAPO_HUB_ID = "BytedTsinghua-SIA/DAPO-Math-17k"


@dataclass(frozen=True)
class Task:
    id: str  # stable id: hash of the source name and the prompt text
    prompt: str  # the user message (the chat template is applied later, per model)
    answer: str | None  # reference answer; None for unverifiable sources


@dataclass
class TaskSource:
    """A named stream of tasks plus the verifier that turns a completion into a reward."""

    spec: str
    verifiable: bool
    _draw: Callable[[], Any]  # yields (prompt, answer, payload) in a fixed order
    _score: Callable[[Any, str], float] | None = None
    _payloads: dict[str, Any] = field(default_factory=dict)

    def tasks(self, split: str, n: int) -> list[Task]:
        """The first `n` tasks of `split` ("train" or "eval"), always the same ones."""
        if split not in SPLITS:
            raise SpectoolError(f"split must be one of {SPLITS}, got {split!r}")
        out: list[Task] = []
        seen: set[str] = set()
        for prompt, answer, payload in self._draw():
            if prompt in seen or in_eval_split(prompt) != (split == "eval"):
                continue
            seen.add(prompt)
            task = Task(id=_task_id(self.spec, prompt), prompt=prompt, answer=answer)
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


def in_eval_split(prompt: str) -> bool:
    return int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16) % 100 < EVAL_PERCENT


def _task_id(spec: str, prompt: str) -> str:
    return hashlib.sha256(f"{spec}\x00{prompt}".encode()).hexdigest()[:16]


def load_source(spec: str, *, seed: int = 0, prompt_col: str = "prompt", answer_col: str = "answer") -> TaskSource:
    """Parse a `--data` value into a TaskSource; errors name the accepted forms."""
    spec = spec.strip()
    if MIX_SEPARATOR in spec:
        return _mix_source(spec, seed, prompt_col, answer_col)
    if spec == "dapo":
        return _dapo_source()
    if spec.startswith("gym:"):
        return _gym_source(spec, seed)
    if spec == "chat":
        prompts = chat_prompts()
        return TaskSource(spec, False, lambda: ((p, None, None) for p in prompts))
    if spec.endswith((".jsonl", ".parquet")):
        return _file_source(spec, prompt_col, answer_col)
    raise SpectoolError(
        f"unknown data source {spec!r}: use 'dapo', 'gym:<task>[:key=value,...]' "
        "(e.g. gym:chain_sum), a .jsonl/.parquet file, or 'chat'"
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
            yield prompt, answer, (i, payload if payload is not None else Task("", prompt, answer))

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
            "pick one with --prompt-col"
        )
    has_answer = answer_col in ds.column_names

    def draw():
        for row in ds:
            yield _prompt_text(row[prompt_col]), (str(row[answer_col]) if has_answer else None), None

    def score(task: Task, completion: str) -> float:
        return math_equal(extract_answer(completion), task.answer or "")

    return TaskSource(spec, has_answer, draw, score if has_answer else None)


def _prompt_text(value: Any) -> str:
    """A prompt cell may be a string or a chat (list of {role, content}); take the user turn."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        users = [m["content"] for m in value if m.get("role") == "user"]
        return users[-1] if users else value[-1]["content"]
    raise SpectoolError(f"prompt cell must be text or a list of chat messages, got {type(value).__name__}")


# --- DAPO-Math-17k (hub only) ---------------------------------------------------------------------


def _hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _dapo_source() -> TaskSource:
    if not _hub_reachable():
        raise SpectoolError(
            f"--data dapo needs the Hugging Face hub ({DAPO_HUB_ID}) and it is not reachable from "
            f"this machine. Offline alternatives: {OFFLINE_ALTERNATIVES}."
        )
    import datasets  # noqa: PLC0415 (heavy, loaded only on this path)

    ds = datasets.load_dataset(DAPO_HUB_ID, split="train")

    def draw():
        for row in ds:
            yield _prompt_text(row["prompt"]), str(row["reward_model"]["ground_truth"]), None

    def score(task: Task, completion: str) -> float:
        # DAPO's convention: the response ends with "Answer: <expr>"; math-verify checks equality.
        return math_equal(extract_answer(completion), task.answer or "")

    return TaskSource("dapo", True, draw, score)

"""Experiment trackers, by TRL's `report_to` names: what a command writes to metrics.jsonl goes, step for step,
to TensorBoard, Trackio or Weights & Biases too, with the run's resolved settings as the tracker run's config.
init-draft (`--report-to`) and train-rl's own loop (rl.yaml `report_to`) log through `open_trackers`; train-rl's
`--backend trl` hands the same names to TRL's GRPOConfig, whose own callbacks log.

What goes in: every number of a metrics.jsonl line, nested ones flattened by "/" (a list by position from 1:
`loss_per_step/1`, `eval/top1/2`); text, null and the step itself are left out.

Where it goes:
  tensorboard  events under <out>/tensorboard, flushed after every step (`tensorboard --logdir <out>`);
  trackio      trackio's local store ($TRACKIO_DIR, default $HF_HOME/trackio), project "spectool", one run per run
               folder (`trackio show --project spectool`); written by trackio's thread within 0.5 s, and whole at close;
  wandb        W&B's project $WANDB_PROJECT (default "spectool"), its files under <out>/wandb (WANDB_MODE=offline:
               nothing leaves the machine).
A resume redoes the steps after its checkpoint (metrics.jsonl drops them first); no tracker then holds a step twice:
TensorBoard purges the events from the resumed step on (SummaryWriter's purge_step) and keeps the redone values, as
metrics.jsonl does; Trackio and W&B resume the same run and keep the values they already hold (neither rewrites a
step), logging only the steps after them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import uuid
from pathlib import Path
from typing import Callable

from spectool.errors import SpectoolError

PACKAGES = {"trackio": "trackio", "wandb": "wandb", "tensorboard": "tensorboard"}  # TRL's name -> the pip package
PROJECT = "spectool"  # trackio's project (W&B's: $WANDB_PROJECT, else this)
TENSORBOARD_DIR = "tensorboard"  # in the run folder


def parse(report_to: str, key: str) -> list[str]:
    """The trackers `report_to` names: TRL's names, comma-separated ("tensorboard,trackio"), "all" (every one
    installed) or "none". An unknown
    name, or one whose package is not installed, is refused here, before any work, naming `key` (the flag or the
    rl.yaml key) and the pip line."""
    names = [x.strip() for x in str(report_to).split(",") if x.strip()]
    if names == ["none"]:
        return []
    if names == ["all"]:  # TRL's (transformers') "all": every installed one
        return [n for n, package in PACKAGES.items() if importlib.util.find_spec(package) is not None]
    allowed = f"{', '.join(PACKAGES)}, a comma-separated list of them, all (those installed) or none (TRL's report_to names)"
    for name in names:
        if name not in PACKAGES:
            raise SpectoolError(f"{key}={report_to!r}: {name!r} is not a tracker spectool reports to; use {allowed}")
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise SpectoolError(f"{key}={report_to!r}: {name} is not installed; pip install {PACKAGES[name]}"
                                + ("" if name == "wandb" else " (or pip install 'spectool[trackers]')"))
    if not names:
        raise SpectoolError(f"{key}={report_to!r}: name a tracker; use {allowed}")
    return list(dict.fromkeys(names))


def run_name(out: str | Path) -> str:
    """The tracker run's name for a run folder: its name and a digest of its absolute path (two folders both called
    `draft` are two runs; a resumed run finds its own)."""
    path = Path(out).resolve()
    return f"{path.name}-{hashlib.sha1(str(path).encode()).hexdigest()[:6]}"


def scalars(record: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics.jsonl line, flattened: {"eval": {"top1": [0.5, 0.3]}} -> {"eval/top1/1": 0.5,
    "eval/top1/2": 0.3}; booleans as 0/1; text, null and "step" left out."""
    out: dict[str, float] = {}
    items = record.items() if isinstance(record, dict) else ((str(i), v) for i, v in enumerate(record, 1))
    for key, value in items:
        if not prefix and key == "step":
            continue
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list, tuple)):
            out.update(scalars(value, name + "/"))
        elif isinstance(value, (bool, int, float)):
            out[name] = float(value)
    return out


class Trackers:
    """The open trackers of one run: `log(step, record)` after each metrics.jsonl line, `close()` at the end (also
    when the run fails: what was logged stays). No tracker: both do nothing."""

    def __init__(self, sinks: list[tuple[Callable[[int, dict], None], Callable[[], None]]]):
        self._sinks = sinks

    def log(self, step: int, record: dict) -> None:
        numbers = scalars(record)
        for log, _ in self._sinks:
            log(step, numbers)

    def close(self) -> None:
        sinks, self._sinks = self._sinks, []
        for _, close in sinks:
            close()

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_trackers(report_to: str, key: str, out: str | Path, config: dict, start: int, main: bool = True) -> Trackers:
    """The trackers `report_to` names for the run in `out`, which resumes after step `start` (0: a new run) and logs
    steps start + 1, ... (`main`: False on the other processes of a launch, which log nothing). `config`: the run's
    resolved settings."""
    names = parse(report_to, key)
    if not main:
        return Trackers([])
    out, name = Path(out), run_name(out)
    config = {**json.loads(json.dumps(config, default=str)), "out": str(out.resolve())}
    sinks = []
    try:
        for tracker in names:
            sinks.append({"tensorboard": _tensorboard, "trackio": _trackio, "wandb": _wandb}[tracker](
                out, name, config, start))
    except BaseException:
        Trackers(sinks).close()
        raise
    return Trackers(sinks)


def _tensorboard(out: Path, name: str, config: dict, start: int):
    from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 (the optional tensorboard, only on this path)

    # purge_step: TensorBoard hides the events an earlier attempt wrote from this step on (the steps a resume redoes)
    writer = SummaryWriter(log_dir=str(out / TENSORBOARD_DIR), purge_step=start + 1)
    writer.add_text("config", "    " + json.dumps(config, indent=1).replace("\n", "\n    "), global_step=start)
    writer.flush()
    print(f"tensorboard: {out / TENSORBOARD_DIR} (tensorboard --logdir {out})")

    def log(step: int, numbers: dict) -> None:
        for k, v in numbers.items():
            writer.add_scalar(k, v, global_step=step)
        writer.flush()  # a crash loses no logged step

    return log, writer.close


def _trackio(out: Path, name: str, config: dict, start: int):
    import trackio  # noqa: PLC0415 (the optional trackio, only on this path)

    with contextlib.redirect_stdout(io.StringIO()):  # its banner would break into the progress bar
        # a resumed run continues the trackio run of this folder; a new one (step 0) starts another of the same name
        run = trackio.init(project=PROJECT, name=name, config=config, resume="allow" if start else "never",
                           embed=False)
    first = _trackio_next_step(run)
    print(f"trackio: run {name} in project {PROJECT} (trackio show --project {PROJECT})")

    def log(step: int, numbers: dict) -> None:
        if step >= first:  # a step the run holds already is not written twice
            run.log(numbers, step=step)  # nan as "NaN" in trackio's JSON

    def close() -> None:
        with contextlib.redirect_stdout(io.StringIO()):  # waits for trackio's writer: everything logged is on disk
            if trackio.context_vars.current_run.get() is run:
                trackio.finish()  # and forgets the run (trackio would finish it again at exit)
            else:
                run.finish()

    return log, close


def _trackio_next_step(run) -> int:
    """The first step a resumed trackio run does not hold yet (0: a new run). Trackio has no public read of it; a
    Run sets `_next_step` to its last stored step + 1 when it starts (trackio 0.43.0, run.py)."""
    return int(getattr(run, "_next_step", 0) or 0)


def _wandb(out: Path, name: str, config: dict, start: int):
    import wandb  # noqa: PLC0415 (the optional wandb, only on this path)

    # the run's id lives in the run folder: a resume continues that W&B run, a new run (step 0) starts another
    saved = out / "wandb" / "spectool-run-id"
    run_id = saved.read_text().strip() if start and saved.exists() else uuid.uuid4().hex[:12]
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(run_id)
    run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=name, id=run_id, resume="allow",
                     config=config, dir=str(out))
    first = int(run.step or 0)  # W&B ignores a step below the run's current one: left out, not warned about

    def log(step: int, numbers: dict) -> None:
        if step >= first:
            run.log(numbers, step=step)

    return log, run.finish

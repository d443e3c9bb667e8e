"""k per batch size for vLLM's dynamic speculation (`num_speculative_tokens_per_batch_size`): the
hand-off file `schedule.json` that sweep-k and forecast write and rollout / train-rl read
(`--k auto --sweep RUN`, `speculation.k: auto`). This module alone knows its format."""

from __future__ import annotations

from pathlib import Path

from spectool.errors import SpectoolError
from spectool.runs import atomic_write_json, read_json

SCHEDULE = "schedule.json"


def write_schedule(run_dir: Path, schedule: list[tuple[int, int, int]], kind: str, draft: str | None,
                   draft_sampling: str, method: str = "eagle3", false_recommendations: str | None = None) -> None:
    """kind "sweep": measured with `draft` (a drafter family `method`) and `draft_sampling`, which
    a run must then use; kind "forecast": predicted for an acceptance, usable with any draft of
    that family. `false_recommendations`: sweep-k's level for the schedule as a whole (one recommendation per
    batch size, each bounded alone)."""

    atomic_write_json(Path(run_dir) / SCHEDULE, {"kind": kind, "method": method, "schedule": [list(r) for r in schedule],
                                                 "draft": draft, "draft_sampling": draft_sampling}
                      | ({"false_recommendations": false_recommendations} if false_recommendations else {}))


def schedule_method(run_dir: str) -> str:
    """The drafter family a schedule was made for (eagle3 for files written before families)."""

    path = Path(run_dir) / SCHEDULE
    return read_json(path).get("method", "eagle3") if path.exists() else "eagle3"


def read_schedule(run_dir: str, draft: str | None, draft_sampling: str,
                  flag: str = "--") -> tuple[list[tuple[int, int, int]], str]:
    """The schedule in `run_dir` and the draft to run it with (a sweep's own, which `draft` and
    `draft_sampling` must match). `flag` prefixes option names in errors ("--" or "speculation.")."""

    path = Path(run_dir) / SCHEDULE
    legacy = Path(run_dir) / "sweep.json"  # sweeps written before schedule.json existed
    if not path.exists() and not legacy.exists():
        raise SpectoolError(f"{flag}sweep {run_dir} has no {SCHEDULE}; run spectool sweep-k (or forecast) --out "
                            f"{run_dir} first")
    s = read_json(path) if path.exists() else {"kind": "sweep", **read_json(legacy)}
    rows = s.get("schedule") or s.get("eagle3_schedule")  # the key before drafter families: eagle3_schedule
    if not rows:
        raise SpectoolError(f"{flag}sweep {run_dir} measured no draft-folder arms (eagle3, peagle, dflash); sweep "
                            "with one of them in --methods")
    schedule = [tuple(r) for r in rows]
    if s["kind"] == "forecast":
        if draft is None:
            raise SpectoolError(f"{flag}sweep {run_dir} is a forecast; give the draft to run with {flag}draft")
        return schedule, draft
    if draft is not None and Path(draft).resolve() != Path(s["draft"]).resolve():
        raise SpectoolError(f"{flag}draft {draft} is not the draft {s['draft']} that {flag}sweep {run_dir} measured")
    measured = s.get("draft_sampling", "greedy")
    if draft_sampling != measured:
        sep = "-" if flag == "--" else "_"
        raise SpectoolError(f"{flag}draft{sep}sampling={draft_sampling} but {flag}sweep {run_dir} measured "
                            f"{measured} drafting; set {flag}draft{sep}sampling={measured} or sweep again")
    return schedule, draft or s["draft"]

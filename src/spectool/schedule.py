"""k per batch size for vLLM's dynamic speculation, read from a sweep-k run (sweep.json, written
by sweep.py) or a forecast run (forecast.json, written by forecast.py); used by rollout and train-rl."""

from __future__ import annotations

from pathlib import Path

from spectool.errors import SpectoolError


def read_schedule(sweep_dir: str, draft: str | None, draft_sampling: str,
                  flag: str = "--") -> tuple[list[tuple[int, int, int]], str]:
    """The eagle3 batch-size schedule a sweep-k run recommends, and its draft (the given `draft`
    and `draft_sampling` must be the ones it measured). `flag` prefixes the option names in errors
    ("--" or "speculation.")."""
    from spectool.runs import read_json

    forecast = Path(sweep_dir) / "forecast.json"
    if forecast.exists():  # a fitted cost model's schedule: it forecasts for acceptance, not for one draft
        if draft is None:
            raise SpectoolError(f"{flag}sweep {sweep_dir} is a forecast; give the draft to run with {flag}draft")
        return [tuple(r) for r in read_json(forecast)["eagle3_schedule"]], draft
    path = Path(sweep_dir) / "sweep.json"
    if not path.exists():
        raise SpectoolError(f"{flag}sweep {sweep_dir} has no sweep.json; run spectool sweep-k --out {sweep_dir} first")
    sweep = read_json(path)
    if not sweep.get("eagle3_schedule"):
        raise SpectoolError(f"{flag}sweep {sweep_dir} measured no eagle3 arms; sweep with --methods eagle3")
    if draft is not None and Path(draft).resolve() != Path(sweep["draft"]).resolve():
        raise SpectoolError(f"{flag}draft {draft} is not the draft {sweep['draft']} that {flag}sweep {sweep_dir} measured")
    measured = sweep.get("draft_sampling", "greedy")
    if draft_sampling != measured:
        sep = "-" if flag == "--" else "_"
        raise SpectoolError(f"{flag}draft{sep}sampling={draft_sampling} but {flag}sweep {sweep_dir} measured "
                            f"{measured} drafting; set {flag}draft{sep}sampling={measured} or sweep again")
    return [tuple(r) for r in sweep["eagle3_schedule"]], draft or sweep["draft"]

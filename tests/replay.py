"""Shared by the refresh-rule tests: `auto` replayed over a run's recorded metrics."""

from __future__ import annotations

import pytest


def replay_auto(metrics: list[dict], every: int, drop: float, bounds: bool = True):
    """The rule (draft/refresh_policy.py) as written now, fed each recorded step's acceptance, generation seconds,
    agreement seconds and the two drafts' gain pairs, and each recorded refresh's cost. Checks every step's logged
    staleness, books (`refresh_ledger`) and every refresh's reason against it; returns the policy as it ends and
    the steps it refreshed after. `bounds=False`: metrics logged before the rule's noise changed (issue 55: steps
    correlated at lag 1): the books' lines-based bounds (`fell_low`, `lost_low`) are not compared, the rest is."""
    from spectool.draft.refresh_policy import RefreshPolicy

    replay, took = RefreshPolicy("auto", every=every, drop=drop), []
    for r in metrics:
        assert r["staleness"] == replay.observe(r.get("acceptance_length"), r["gen_s"], r.get("agreement_s", 0.0),
                                                r.get("draft_gain"))
        due = replay.due(r["step"])
        skip = set() if bounds else {"fell_low", "lost_low"}
        logged = {k: v for k, v in r.get("refresh_ledger", {}).items() if k not in skip}
        assert logged == pytest.approx({k: v for k, v in replay.ledger.items() if k not in skip}), r["step"]
        if due:
            took.append(r["step"])
            assert r["refresh_reason"] == replay.reason
            replay.refreshed(r["refresh_s"])
    return replay, took

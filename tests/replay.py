"""Shared by the refresh-rule tests: `auto` replayed over a run's recorded metrics."""

from __future__ import annotations

import pytest


def replay_auto(metrics: list[dict], every: int, drop: float):
    """The rule (draft/refresh_policy.py) as written now, fed each recorded step's acceptance, generation seconds,
    agreement seconds and the two drafts' gain pairs, and each recorded refresh's cost. Checks every step's logged
    staleness, books (`refresh_ledger`) and every refresh's reason against it; returns the policy as it ends and
    the steps it refreshed after."""
    from spectool.draft.refresh_policy import RefreshPolicy

    replay, took = RefreshPolicy("auto", every=every, drop=drop), []
    for r in metrics:
        assert r["staleness"] == replay.observe(r.get("acceptance_length"), r["gen_s"], r.get("agreement_s", 0.0),
                                                r.get("draft_gain"))
        due = replay.due(r["step"])
        assert r.get("refresh_ledger", {}) == pytest.approx(replay.ledger), r["step"]
        if due:
            took.append(r["step"])
            assert r["refresh_reason"] == replay.reason
            replay.refreshed(r["refresh_s"])
    return replay, took

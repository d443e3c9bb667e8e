"""Shared by the refresh-rule tests: `auto` replayed over a run's recorded metrics."""

from __future__ import annotations


def replay_auto(metrics: list[dict], every: int, drop: float):
    """The rule (draft/refresh_policy.py) as written now, fed each recorded step's acceptance and generation
    seconds and each recorded refresh's cost. Checks every step's logged staleness and every refresh's reason
    against it; returns the policy as it ends and the steps it refreshed after."""
    from spectool.draft.refresh_policy import RefreshPolicy

    replay, took = RefreshPolicy("auto", every=every, drop=drop), []
    for r in metrics:
        assert r["staleness"] == replay.observe(r.get("acceptance_length"), r["gen_s"])
        if replay.due(r["step"]):
            took.append(r["step"])
            assert r["refresh_reason"] == replay.reason
            replay.refreshed(r["refresh_s"])
    return replay, took

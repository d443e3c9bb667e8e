#!/usr/bin/env bash
# Set up (idempotent) and run the tests.
#   bash scripts/test.sh          the fast tier: every test file; rollout, verify, sweep-k, train-rl and TRL on the real engine
#                                 (8-10 min of pytest measured on 2 cores; its budget is 15 x the host ratio)
#   bash scripts/test.sh --full   everything (what .ci/run runs: 26.5 min measured), held to a 45-minute budget
# Other arguments go to pytest. Tiers, cost markers and the budget: docs/architecture.md, "Tests".
set -euo pipefail
cd "$(dirname "$0")/.."
TIER=fast
ARGS=()
for a in "$@"; do
  if [ "$a" = --full ]; then TIER=full; else ARGS+=("$a"); fi
done
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks   # lint and import order (pyproject.toml [tool.ruff])
set +e
# --durations: the slowest 30; per-file totals and .pytest-costs/<tier>.json come from tests/costs.py
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 --tier "$TIER" "${ARGS[@]}"
rc=$?
set -e
[ "$rc" = 5 ] && { echo "pytest collected no tests"; exit 1; }  # "no tests ran" must not pass silently
exit "$rc"

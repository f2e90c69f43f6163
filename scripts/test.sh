#!/usr/bin/env bash
# The whole test suite, as README.md gives it: installs what it needs, then lint, types, tests.
# Starts its own Redis server and workers (tests/integration fixtures); needs no services.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest"
# Exit code 5 (no tests collected) is a failure here, as any non-zero code is.
exec .venv/bin/pytest "$@"

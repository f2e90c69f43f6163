#!/usr/bin/env bash
# The whole test suite, as README.md gives it: installs what it needs, then lint, types, tests.
# Starts its own Redis server and workers (tests/integration fixtures); needs no services.
set -euo pipefail
cd "$(dirname "$0")/.."

# Run by a user who is not root: everything that user can run, and one line per part left
# out. The tests that need a root worker (containers, networks, snapshots, images) are
# skipped and counted (tests/privilege.py); without this variable they would fail.
if [ "$(id -u)" != 0 ]; then
  export BASHFLEET_TEST_UNPRIVILEGED=1
  echo "not root: the tests that need a root worker (containers, networks, snapshots, images) are left out (BASHFLEET_TEST_UNPRIVILEGED=1); run as root for all of them" >&2
fi
./scripts/bootstrap.sh

# The deploy tests validate docker-compose.yml and the systemd units with the real
# tools, Flower's pages are looked at in headless Chromium (those tests skip, visibly,
# where a tool is missing), and the TypeScript SDK's MCP client needs node and npm. As
# root with apt-get: Debian's.
missing=()
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v chromium >/dev/null || missing+=(chromium)
command -v npm >/dev/null || missing+=(nodejs npm)
# The compose worker's image is built and run under podman, with runc (crun refuses
# hybrid cgroups): tests/integration/test_compose_worker.py.
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing ${missing[*]} (Debian) for the deploy, Flower and MCP client tests" >&2
  { apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null; } ||
    echo "could not install ${missing[*]}; the tests that need them say so" >&2
fi

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy --strict"
.venv/bin/mypy
# The frameworks' environments first: tests/integration/test_benchmarks.py runs
# bench_environments with .venv-frameworks' interpreter (it drives inspect-ai).
./scripts/frameworks.sh
echo "== pytest: unit and integration (tests/e2e runs next, against the installed package)"
# Exit code 5 (no tests collected) is a failure here, as any non-zero code is.
.venv/bin/pytest --ignore=tests/e2e --ignore=tests/frameworks "$@"
echo "== the framework adapters, each against its framework from PyPI (environments of their own)"
.venv-frameworks/bin/pytest tests/frameworks --ignore=tests/frameworks/test_harbor.py -q
# No .venv-harbor: scripts/frameworks.sh found no Python 3.12 in a run that is not root,
# and said so.
if [ -x .venv-harbor/bin/pytest ] || [ "$(id -u)" = 0 ]; then
  .venv-harbor/bin/pytest tests/frameworks/test_harbor.py -q
fi
# The installed package on the newest Python this machine has (the suite above ran on
# .venv's: the system's own where it is new enough, see bootstrap.sh).
newest=""
for version in 3.14 3.13 3.12; do
  for candidate in "$(command -v "python$version" 2>/dev/null || true)" \
      "$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$version".*/bin/python3 2>/dev/null | tail -1)"; do
    if [ -n "$candidate" ] && "$candidate" -c 'import venv' 2>/dev/null; then
      newest=$candidate
      break 2
    fi
  done
done
echo "== the end-to-end tests against the installed package ($("${newest:-.venv/bin/python}" --version))"
PYTHON="${newest:-.venv/bin/python}" ./scripts/test_installed.sh -q

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
# podman's --init (a container's pid 1, what bench/bench_idle.py measures beside its
# idle workspaces): only recommended by podman, which is installed without recommends.
[ -x /usr/libexec/podman/catatonit ] || missing+=(catatonit)
if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing ${missing[*]} (Debian) for the deploy, Flower and MCP client tests and the benchmarks' podman baselines" >&2
  { apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null; } ||
    echo "could not install ${missing[*]}; the tests that need them say so" >&2
fi

# The installed package's end-to-end tests run on the newest Python this machine has (the
# suite runs on .venv's: the system's own where it is new enough, see bootstrap.sh).
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
newest="${newest:-.venv/bin/python}"

# What waits on pip or on one core runs beside the tests, each in a session of its own
# with its output in a log, shown when it is waited for: the frameworks' environments
# (scripts/frameworks.sh) and the installed package's virtualenv (scripts/test_installed.sh
# --prepare) beside pytest, ruff beside mypy. A part that fails still fails the run. The
# parts still running when the run stops (a failure, ^C) are ended with it.
parts=$(mktemp -d "${TMPDIR:-/tmp}/bashfleet-test.XXXXXX")
declare -A part_pid=()
end_parts() {
  local pid
  for pid in "${part_pid[@]}"; do
    kill -- "-$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$parts"
}
trap end_parts EXIT
start_part() {  # start_part NAME COMMAND...: NAME's exit status lands in $parts/NAME.status
  local name=$1
  shift
  setsid bash -c '"${@:2}" >"$1.log" 2>&1; echo $? >"$1.status.new"; mv "$1.status.new" "$1.status"' \
    _ "$parts/$name" "$@" &
  part_pid[$name]=$!
}
finish_part() {  # finish_part NAME: wait for it, show its output, fail the run if it failed
  local name=$1 status
  wait "${part_pid[$name]}" || true
  unset "part_pid[$name]"
  cat "$parts/$name.log"
  status=$(cat "$parts/$name.status" 2>/dev/null || echo 1)
  if [ "$status" != 0 ]; then
    echo "$name failed (exit status $status)" >&2
    exit 1
  fi
}

start_part frameworks ./scripts/frameworks.sh
# tests/integration/test_benchmarks.py runs bench_environments with .venv-frameworks'
# interpreter: that test runs last and waits for this file (tests/conftest.py).
export BASHFLEET_TEST_FRAMEWORKS_STATUS="$parts/frameworks.status"
installed="$parts/installed"
mkdir "$installed"
start_part installed env PYTHON="$newest" BASHFLEET_INSTALLED_WORK="$installed" \
  ./scripts/test_installed.sh --prepare

# Exit code 5 (no tests collected) is a failure here, as any non-zero code is.
pytest_status=0
if [ $# -gt 0 ]; then
  echo "== mypy --strict (ruff beside it)"
  start_part ruff .venv/bin/ruff check .
  mypy_status=0
  .venv/bin/mypy || mypy_status=$?
  echo "== ruff"
  finish_part ruff
  [ "$mypy_status" = 0 ] || exit "$mypy_status"
  echo "== pytest $* (tests/e2e runs next, against the installed package)"
  .venv/bin/pytest --ignore=tests/e2e --ignore=tests/frameworks "$@" || pytest_status=$?
else
  # The unit tests are pure and CPU-bound (hypothesis): on every core (pytest-xdist), and
  # first, beside the pip installs above. The rest start Redis servers and workers, and
  # wait on them more than they compute: two modules at a time (each module's fixtures
  # start its own), with ruff and mypy beside them (their verdict is shown, and fails
  # the run, right after).
  echo "== pytest: unit, on every core"
  .venv/bin/pytest tests/unit -n auto || pytest_status=$?
  start_part ruff .venv/bin/ruff check .
  start_part mypy .venv/bin/mypy
  echo "== pytest: integration and hardening, two modules at a time (ruff and mypy beside it; tests/e2e runs next, against the installed package)"
  .venv/bin/pytest --ignore=tests/unit --ignore=tests/e2e --ignore=tests/frameworks \
    -n auto --maxprocesses 2 --dist loadfile || pytest_status=$?
  echo "== ruff (run beside pytest)"
  finish_part ruff
  echo "== mypy --strict (run beside pytest)"
  finish_part mypy
fi
# Shown whatever pytest said: a test that waited for the frameworks' environment points here.
echo "== the frameworks' environments (scripts/frameworks.sh, run beside pytest)"
finish_part frameworks
[ "$pytest_status" = 0 ] || exit "$pytest_status"
echo "== the installed package's virtualenv (made beside pytest)"
finish_part installed
echo "== the framework adapters, each against its framework from PyPI (environments of their own)"
.venv-frameworks/bin/pytest tests/frameworks --ignore=tests/frameworks/test_harbor.py -q
# No .venv-harbor: scripts/frameworks.sh found no Python 3.12 in a run that is not root,
# and said so.
if [ -x .venv-harbor/bin/pytest ] || [ "$(id -u)" = 0 ]; then
  .venv-harbor/bin/pytest tests/frameworks/test_harbor.py -q
fi
# Each of their modules brings up a fleet of its own (`bashfleet up`, in a private state
# directory): a module a worker, on both cores (pytest-xdist).
echo "== the end-to-end tests against the installed package ($("$newest" --version)), a module per core"
PYTHON="$newest" BASHFLEET_INSTALLED_WORK="$installed" ./scripts/test_installed.sh -q \
  -n auto --dist loadfile

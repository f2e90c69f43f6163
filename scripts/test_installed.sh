#!/usr/bin/env bash
# The end-to-end tests against what users install, not against the source tree.
#
# Installs exactly the files deploy/Dockerfile COPYs (as its `pip install .` does) into a
# fresh virtualenv outside the checkout, checks that every module of the installed
# packages imports from there, then runs tests/e2e (the CLI, `bashfleet up`, the MCP
# server over stdio with the SDK's client) from a copy of the tests, with that
# environment's `bashfleet`. Run by ./scripts/test.sh after the main suite.
#
#   scripts/test_installed.sh [PYTEST ARGS]   all of it, in a directory of its own
#   BASHFLEET_INSTALLED_WORK=DIR scripts/test_installed.sh --prepare
#                                             only the virtualenv, made in DIR (an empty
#                                             directory the caller made and removes);
#                                             ./scripts/test.sh makes it beside pytest
#   BASHFLEET_INSTALLED_WORK=DIR scripts/test_installed.sh [PYTEST ARGS]
#                                             the rest, with the virtualenv made in DIR
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
python="${PYTHON:-python3}"
work="${BASHFLEET_INSTALLED_WORK:-}"
if [ -z "$work" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/bashfleet-installed.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
pip=("$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check)

# Made by --prepare: the package installed, and nothing else yet.
if [ ! -f "$work/prepared" ]; then
  # The Dockerfile's build context, file by file: `COPY SRC... DEST` lines (no --from).
  mkdir -p "$work/src"
  grep -E '^COPY ' deploy/Dockerfile | grep -v -- '--from' | while read -r _ args; do
    read -ra parts <<<"$args"
    for src in "${parts[@]:0:${#parts[@]}-1}"; do
      cp -r "$src" "$work/src/"
    done
  done
  find "$work/src" -name __pycache__ -prune -exec rm -rf {} +

  echo "== installed package: pip install . (the Dockerfile's files) into a fresh virtualenv"
  "$python" -m venv "$work/venv"
  "${pip[@]}" "$work/src"
  touch "$work/prepared"
fi
if [ "${1:-}" = --prepare ]; then
  exit 0
fi
# The wheel alone, before any test tool lands beside it (pytest pulls `packaging`, which
# once hid that kombu's Redis transport needs it): a local fleet starts from this
# environment and runs a call through its worker.
echo "== installed package alone: bashfleet up, a call through the worker, bashfleet down"
smoke_state=$(mktemp -d "${TMPDIR:-/tmp}/bashfleet-smoke.XXXXXX")
smoke() {
  env -u BASHFLEET_SIGNING_KEY -u BASHFLEET_REDIS_URL BASHFLEET_STATE_DIR="$smoke_state" \
    XDG_STATE_HOME="$smoke_state/xdg" "$work/venv/bin/bashfleet" "$@"
}
smoke_status=0
if smoke up --no-flower --detach >"$smoke_state/up.log" 2>&1; then
  answer=$(smoke run 'echo installed-ok' 2>>"$smoke_state/up.log") || smoke_status=$?
  [ "$answer" = installed-ok ] || { echo "the call answered: $answer" >&2; smoke_status=1; }
else
  smoke_status=1
fi
smoke down >>"$smoke_state/up.log" 2>&1 || true
if [ "$smoke_status" != 0 ]; then
  echo "the installed package could not run a call through a local fleet:" >&2
  cat "$smoke_state/up.log" >&2
  rm -rf "$smoke_state"
  exit 1
fi
rm -rf "$smoke_state"

# The test tools only; the package's own dependencies came with it.
"${pip[@]}" pytest pytest-timeout pytest-xdist

cp -r tests "$work/tests"
# pytest's settings (timeout, markers); README and docs/, whose examples the README test runs.
cp -r pyproject.toml README.md docs "$work/"
cd "$work"
"$work/venv/bin/python" - <<'PY'
import importlib, pkgutil, sys
from pathlib import Path
prefix = Path(sys.prefix).resolve()
count = 0
# The framework adapters need their extra (`pip install 'bashfleet[inspect]'`...): here
# only the framework itself may be what is missing.
extras = {"inspect_ai", "harbor", "agents", "swerex", "minisweagent"}
needs_extra = []
# One import name: the wheel puts `bashfleet` into site-packages and nothing else, so a
# user's own client.py or worker.py shadows nothing of ours.
import importlib.util
for generic in ("client", "worker"):
    assert importlib.util.find_spec(generic) is None, f"a top-level {generic} is installed"
for name in ("bashfleet.worker", "bashfleet.client"):
    package = importlib.import_module(name)
    origin = Path(package.__file__).resolve()
    assert prefix in origin.parents, f"{name} loaded from {origin}, not from {prefix}"
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as exc:
            top = (exc.name or "").split(".")[0]
            if not (info.name.startswith("bashfleet.client.integrations.") and top in extras):
                raise
            needs_extra.append(f"{info.name} ({top})")
            continue
        count += 1
print(f"installed packages import from {prefix}: {count} modules; "
      f"{len(needs_extra)} need their framework's extra: {', '.join(needs_extra)}")
PY
status=0
"$work/venv/bin/python" -m pytest -p no:cacheprovider "$work/tests/e2e" "$@" || status=$?
exit "$status"

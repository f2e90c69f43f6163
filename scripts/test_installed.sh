#!/usr/bin/env bash
# The end-to-end tests against what users install, not against the source tree.
#
# Installs exactly the files deploy/Dockerfile COPYs (as its `pip install .` does) into a
# fresh virtualenv outside the checkout, checks that every module of the installed
# packages imports from there, then runs tests/e2e (the CLI, `bashfleet up`, the MCP
# server over stdio with the SDK's client) from a copy of the tests, with that
# environment's `bashfleet`. Run by ./scripts/test.sh after the main suite.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
python="${PYTHON:-python3}"
work=$(mktemp -d "${TMPDIR:-/tmp}/bashfleet-installed.XXXXXX")
trap 'rm -rf "$work"' EXIT

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
pip=("$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" "$work/src"
# The test tools only; the package's own dependencies came with it.
"${pip[@]}" pytest pytest-timeout

cp -r tests "$work/tests"
cp pyproject.toml "$work/"  # pytest's settings (timeout, markers), read from there
cd "$work"
"$work/venv/bin/python" - <<'PY'
import importlib, pkgutil, sys
from pathlib import Path
prefix = Path(sys.prefix).resolve()
count = 0
for name in ("worker", "client"):
    package = importlib.import_module(name)
    origin = Path(package.__file__).resolve()
    assert prefix in origin.parents, f"{name} loaded from {origin}, not from {prefix}"
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
        importlib.import_module(info.name)
        count += 1
print(f"installed packages import from {prefix}: {count} modules")
PY
status=0
"$work/venv/bin/python" -m pytest -p no:cacheprovider "$work/tests/e2e" "$@" || status=$?
exit "$status"

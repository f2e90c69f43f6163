#!/usr/bin/env bash
# The framework adapters' test environments, installed once and kept apart from .venv:
# the frameworks pull many packages of their own, and Harbor needs Python 3.12 while
# bashfleet's own suite keeps 3.11.
#
#   .venv-frameworks  Python 3.11: bashfleet[dev] and tests/frameworks/requirements.txt
#                     (inspect-ai, openai-agents, swe-rex, mini-swe-agent)
#   .venv-harbor      Python 3.12: bashfleet[dev] and tests/frameworks/requirements-harbor.txt
#
# Idempotent: a venv is installed again only when its requirements changed. Run by
# ./scripts/test.sh; `PYTHON312=...` names a 3.12 interpreter (default: python3.12 on
# PATH, else pyenv's).
set -euo pipefail
cd "$(dirname "$0")/.."

install_venv() {  # install_venv DIR PYTHON REQUIREMENTS
  local dir=$1 python=$2 requirements=$3 stamp="$1/.bashfleet-installed"
  if [ ! -x "$dir/bin/python" ]; then
    "$python" -m venv "$dir"
  fi
  if [ ! -f "$stamp" ] || [ "$requirements" -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "installing $dir (its frameworks: $requirements)" >&2
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]' \
      -r "$requirements"
    touch "$stamp"
  fi
}

python311="${PYTHON:-python3}"
install_venv .venv-frameworks "$python311" tests/frameworks/requirements.txt

python312="${PYTHON312:-}"
if [ -z "$python312" ]; then
  python312=$(command -v python3.12 || true)
  # A pyenv shim is on PATH even where pyenv's selected version is not 3.12: it must run.
  if [ -n "$python312" ] && ! "$python312" -c '' 2>/dev/null; then
    python312=""
  fi
fi
if [ -z "$python312" ] && command -v pyenv >/dev/null; then
  python312=$(ls -d "$(pyenv root)"/versions/3.12*/bin/python 2>/dev/null | tail -1 || true)
fi
if [ -z "$python312" ]; then
  echo "no Python 3.12 (Harbor needs one): set PYTHON312" >&2
  exit 1
fi
install_venv .venv-harbor "$python312" tests/frameworks/requirements-harbor.txt

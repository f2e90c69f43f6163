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

# What pip says (its build backends' warnings, a mirror's notes) is shown only when it fails.
quietly() {  # quietly WHAT COMMAND...
  local what=$1 log
  shift
  log=$(mktemp "${TMPDIR:-/tmp}/bashfleet-frameworks.XXXXXX")
  if ! "$@" >"$log" 2>&1; then
    echo "$what failed:" >&2
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

install_venv() {  # install_venv DIR PYTHON REQUIREMENTS
  local dir=$1 python=$2 requirements=$3 stamp="$1/.bashfleet-installed"
  if [ ! -x "$dir/bin/python" ]; then
    "$python" -m venv "$dir"
  fi
  if [ ! -f "$stamp" ] || [ "$requirements" -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "installing $dir (its frameworks: $requirements)" >&2
    quietly "upgrading pip in $dir" \
      "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    quietly "installing $dir" \
      "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]' \
      -r "$requirements"
    touch "$stamp"
  fi
}

python311="${PYTHON:-python3}"
install_venv .venv-frameworks "$python311" tests/frameworks/requirements.txt

# PYTHON312, else the first that runs of: python3.12 on PATH (a pyenv shim is on PATH even
# where pyenv's selected version is not 3.12), pyenv's 3.12 (another user's pyenv may be
# unreadable), the interpreter of a .venv-harbor made earlier.
python312="${PYTHON312:-}"
if [ -z "$python312" ]; then
  pyenv_312=""
  if command -v pyenv >/dev/null; then
    pyenv_312=$(ls -d "$(pyenv root)"/versions/3.12*/bin/python 2>/dev/null | tail -1 || true)
  fi
  for candidate in "$(command -v python3.12 || true)" "$pyenv_312" .venv-harbor/bin/python; do
    if [ -n "$candidate" ] && "$candidate" -c 'import venv' 2>/dev/null; then
      python312=$candidate
      break
    fi
  done
fi
if [ -z "$python312" ]; then
  # A run as root (CI) runs every framework's tests or fails; a user's own run goes on
  # without Harbor's, and says so.
  if [ "$(id -u)" = 0 ]; then
    echo "no Python 3.12 (Harbor needs one): set PYTHON312=/path/to/python3.12" >&2
    exit 1
  fi
  echo "left out: Harbor's tests (tests/frameworks/test_harbor.py), which need a Python 3.12: none found (set PYTHON312=/path/to/python3.12)" >&2
  exit 0
fi
install_venv .venv-harbor "$python312" tests/frameworks/requirements-harbor.txt

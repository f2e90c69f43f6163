"""What the deployment files' tests share: where the files are, the Compose file,
the commands and probes both Compose and Kubernetes give Redis, and what a
worker's container is granted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bashfleet.worker.wire import acl

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "deploy" / "systemd"
K8S = ROOT / "deploy" / "k8s"
PLACEHOLDER = "CHANGE-ME"


@pytest.fixture(name="compose", scope="module")
def _compose_fixture() -> dict[str, Any]:
    """The Compose file, parsed."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def _command(service: dict[str, Any]) -> list[str]:
    command: list[str] = service["command"]
    return command


#: Redis's probe in Kubernetes: as the workers' user, its password from REDISCLI_AUTH.
PROBE = f"redis-cli --user {acl.WORKER_USER} ping | grep -q PONG"


def _acl_script(command: list[str]) -> str:
    """The shell script of a `sh -ec SCRIPT` command (the ACL file's writer)."""
    assert command[:2] == ["sh", "-ec"], command
    return command[2]


#: What bubblewrap needs of a worker's container (Docker's and containerd's default
#: seccomp profiles allow namespaces and mounts only with CAP_SYS_ADMIN in the bounding
#: set), and what the root worker's own work needs; nothing more.
WORKER_CAPS = {"SYS_ADMIN", "SYS_CHROOT", "SETUID", "SETGID", "SETPCAP", "NET_ADMIN", "KILL",
               "SYS_PTRACE", "CHOWN", "FOWNER", "DAC_OVERRIDE", "MKNOD"}
RUN_USER = "bashfleet-run"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]

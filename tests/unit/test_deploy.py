"""docker-compose.yml and the Dockerfile, validated without a Docker engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def _command(service: dict[str, Any]) -> list[str]:
    command: list[str] = service["command"]
    return command


def test_redis_has_password_persistence_and_noeviction(compose: dict[str, Any]) -> None:
    command = _command(compose["services"]["redis"])
    assert "--requirepass" in command
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"


def test_two_workers_with_distinct_host_ids(compose: dict[str, Any]) -> None:
    workers = {
        name: svc for name, svc in compose["services"].items() if "worker" in _command(svc)
    }
    assert len(workers) == 2
    hosts = {svc["environment"]["BASHFLEET_HOST"] for svc in workers.values()}
    assert len(hosts) == 2
    for svc in workers.values():
        command = _command(svc)
        assert command[command.index("--host") + 1] == svc["environment"]["BASHFLEET_HOST"]
        assert svc["environment"]["BASHFLEET_REDIS_URL"].startswith("redis://:")


def test_flower_requires_auth_and_is_published_on_loopback(compose: dict[str, Any]) -> None:
    flower = compose["services"]["flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"].startswith("admin:${FLOWER_PASSWORD")
    assert all(port.startswith("127.0.0.1:") for port in flower["ports"])


def test_images_come_from_the_project_dockerfile(compose: dict[str, Any]) -> None:
    built = [svc for svc in compose["services"].values() if "build" in svc]
    assert built and built[0]["build"]["dockerfile"] == "deploy/Dockerfile"
    image = built[0]["image"]
    for name, svc in compose["services"].items():
        if name != "redis":
            assert svc["image"] == image


def test_dockerfile_runs_as_non_root_with_a_healthcheck() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert "HEALTHCHECK" in text
    assert "pip install" in text

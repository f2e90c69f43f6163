"""A single-tenant host asked for an image, with a real worker: it says so, at once.

A root worker whose run user has no subordinate ids gives every workspace the same uid:
it is single-tenant (`bashfleet hosts`), and an image's files cannot be given to a
workspace's own ids there. `bashfleet run --image` on such a host used to pull the image
first (minutes, for nothing), then fail with a message unrelated to the cause (on a
user's machine: "the registry refused this host's credentials" for a local permission
denied, `\\n\\t` shown as written), and a worker's `unavailable` answer became
FleetUnavailable, to which the CLI added "is the fleet up?". Now the host refuses
before anything is pulled, says it is single-tenant and what to do; a host's
`unavailable` answer is the host's word (HostUnavailable), not a fleet that is down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bashfleet.client import Fleet, HostUnavailable, ImageError
from bashfleet.client.redis_server import RedisServer

from .conftest import WorkerFactory, WorkerProcess
from .registry import Registry

pytestmark = pytest.mark.timeout(600)

HOST = "onetenant"
#: A run user with no subordinate ids (/etc/subuid names none for it): single-tenant.
RUN_AS = "nobody"


@pytest.fixture(name="host", scope="module")
def _host_fixture(session_workers: WorkerFactory, image_registry: Registry
                  ) -> Iterator[WorkerProcess]:
    yield from session_workers.module_host(HOST, env={
        "BASHFLEET_RUN_AS": RUN_AS,
        "BASHFLEET_REGISTRY_AUTH_FILE": str(image_registry.auth_file),
        "BASHFLEET_REGISTRY_CERTS_DIR": str(image_registry.certs_dir)})


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BASHFLEET_REDIS_URL": url}
    return subprocess.run([sys.executable, "-m", "bashfleet.client.cli", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_host_is_single_tenant(host: WorkerProcess, fleet: Fleet) -> None:
    """What the rest stands on: `hosts` says this host is single-tenant, and it runs
    calls (it is up)."""
    (info,) = [info for info in fleet.hosts() if info.host == HOST]
    assert info.sandbox is not None and info.sandbox.tenancy == "single", info
    assert fleet.run("echo up", host=HOST).stdout == "up\n"


def test_an_image_is_refused_before_any_pull_saying_why(
    host: WorkerProcess, fleet: Fleet, registry_images: dict[str, str]
) -> None:
    ref = registry_images["nobash"]
    said: list[str] = []
    started = time.monotonic()
    with pytest.raises(ImageError) as refused:
        fleet.pull_image(ref, host=HOST, progress=said.append)
    took = time.monotonic() - started
    message = refused.value.message
    assert refused.value.kind == "unavailable"
    assert f"host {HOST} is single-tenant" in message and "cannot take images" in message
    assert "/etc/subuid" in message and "--host" in message  # what to do about it
    assert "refused" not in message and "\\n" not in message, message
    assert not any("pulling" in line for line in said), said  # nothing was pulled
    assert fleet.images(host=HOST) == [] and took < 5.0, took


def test_run_image_on_a_single_tenant_host_says_so_plainly(
    host: WorkerProcess, redis_server: RedisServer, registry_images: dict[str, str]
) -> None:
    done = _cli(redis_server.url, "run", "--host", HOST, "--image",
                registry_images["nobash"], "true")
    assert done.returncode != 0, done
    assert "is single-tenant" in done.stderr and "cannot take images" in done.stderr, done
    assert "is the fleet up" not in done.stderr, done.stderr
    assert "refused" not in done.stderr and "\\n" not in done.stderr, done.stderr
    listed = _cli(redis_server.url, "images", "ls", "--host", HOST, "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed


def test_a_hosts_unavailable_answer_is_not_a_fleet_that_is_down(
    host: WorkerProcess, fleet: Fleet, redis_server: RedisServer, tmp_path: Path
) -> None:
    """The host answers `unavailable` (a build on a single-tenant host): the host's word,
    not FleetUnavailable, and the CLI does not ask whether the fleet is up."""
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(HostUnavailable) as refused:
        fleet.workspace(host=HOST, build=context)
    assert "single-tenant" in str(refused.value)
    done = _cli(redis_server.url, "workspace", "create", "--host", HOST, "--build",
                str(context))
    assert done.returncode != 0 and "single-tenant" in done.stderr, done
    assert "is the fleet up" not in done.stderr, done.stderr

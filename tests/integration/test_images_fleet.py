"""Images through a real fleet: a worker (its own registry credentials, the admin key)
pulls from the real test registry for `Fleet.pull_image`, `images`, `remove_image` and
`bashfleet images pull|ls|rm`; a pull runs on a thread of its own, so the host's
control calls are answered while it runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bashfleet.client import Fleet, ImageError, Unauthorized
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker import retention
from bashfleet.worker.engine.images import images
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import ImageInfo
from bashfleet.worker.wire.owner_keys import OwnerKey

from .conftest import WorkerFactory, WorkerProcess
from .registry import Registry

pytestmark = pytest.mark.timeout(600)

HOST = "imgs"
ADMIN_KEY = "admin-key-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def worker(
    redis_server: RedisServer, redis_client: redis.Redis, image_registry: Registry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    """A host that pulls from the test registry with its credentials, and accepts the
    admin key."""
    factory = WorkerFactory(redis_server.url, redis_client, tmp_path_factory.mktemp("imgs"))
    env = {"BASHFLEET_REGISTRY_AUTH_FILE": str(image_registry.auth_file),
           "BASHFLEET_REGISTRY_CERTS_DIR": str(image_registry.certs_dir),
           "BASHFLEET_ADMIN_KEY": ADMIN_KEY}
    yield from factory.module_host(HOST, env=env)


@pytest.fixture
def admin(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    monkeypatch.setenv("BASHFLEET_ADMIN_KEY", ADMIN_KEY)
    with Fleet(redis_server.url, admin=True) as client:
        assert client.admin
        yield client


@pytest.fixture
def tenant(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    """A client holding an owner's key only (no fleet key)."""
    key = OwnerKey.issue(os.environ["BASHFLEET_SIGNING_KEY"], "tenant")
    monkeypatch.setenv("BASHFLEET_OWNER_KEY", key.text)
    monkeypatch.delenv("BASHFLEET_SIGNING_KEY")
    monkeypatch.delenv("BASHFLEET_ADMIN_KEY", raising=False)
    with Fleet(redis_server.url) as client:
        assert not client.admin
        yield client


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BASHFLEET_REDIS_URL": url, "BASHFLEET_ADMIN_KEY": ADMIN_KEY}
    return subprocess.run([sys.executable, "-m", "bashfleet.client.cli", "images", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_pull_list_and_remove_through_the_fleet(
    worker: WorkerProcess, fleet: Fleet, admin: Fleet, tenant: Fleet,
    registry_images: dict[str, str],
) -> None:
    said: list[str] = []
    ref = registry_images["nobash"]
    (info,) = fleet.pull_image(ref, host=HOST, progress=said.append)
    assert info.host == HOST and info.shell == "sh" and info.ref == ref
    assert any(line.startswith(f"{HOST}: pulling ") for line in said)
    said.clear()
    (again,) = fleet.pull_image(ref, host=HOST, progress=said.append)
    assert again.digest == info.digest and not any("pulling" in line for line in said)
    assert [i.digest for i in fleet.images(host=HOST)] == [info.digest]
    with pytest.raises(Unauthorized, match="admin key"):
        tenant.remove_image(ref, host=HOST)  # an owner's key: the images are every owner's
    assert admin.remove_image(ref, host=HOST) == [HOST]
    assert admin.remove_image(ref, host=HOST) == []
    assert fleet.images(host=HOST) == []


def test_the_fleet_key_removes_images_as_the_admin_key_does(
    worker: WorkerProcess, fleet: Fleet, tenant: Fleet, registry_images: dict[str, str]
) -> None:
    """The fleet key is the operator's, the admin's (docs/security.md, owners): it used to
    be refused "needs the admin key"; an owner's key still is."""
    ref = registry_images["nobash"]
    fleet.pull_image(ref, host=HOST)
    with pytest.raises(Unauthorized, match="admin key"):
        tenant.remove_image(ref, host=HOST)
    assert [i.ref for i in fleet.images(host=HOST)] == [ref]  # still there
    assert not fleet.admin  # the fleet key alone, no admin key
    assert fleet.remove_image(ref, host=HOST) == [HOST]
    assert fleet.images(host=HOST) == []


def test_a_failed_pull_is_an_image_error_of_its_kind(
    worker: WorkerProcess, fleet: Fleet, image_registry: Registry
) -> None:
    with pytest.raises(ImageError) as caught:
        fleet.pull_image(f"{image_registry.url}/bashfleet/debian:no-such-tag", host=HOST)
    assert caught.value.kind == "not_found" and "no-such-tag" in caught.value.message
    with pytest.raises(ImageError) as bad:
        fleet.pull_image("-rf", host=HOST)
    assert bad.value.kind == "invalid"


def test_the_host_answers_control_calls_while_it_pulls(
    worker: WorkerProcess, fleet: Fleet, admin: Fleet, registry_images: dict[str, str]
) -> None:
    said: list[str] = []
    pulled: list[ImageInfo] = []
    ref = registry_images["debian"]
    thread = threading.Thread(target=lambda: pulled.extend(
        fleet.pull_image(ref, host=HOST, progress=said.append)))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not any("pulling" in line for line in said):
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.05)  # polling a condition, with a deadline
        started = time.monotonic()
        listed = fleet.images(host=HOST)
        assert time.monotonic() - started < 3.0  # not queued behind the pull
        assert ref not in [info.ref for info in listed] or pulled
    finally:
        thread.join(300)
    assert pulled and pulled[0].shell == "bash"
    assert admin.remove_image(ref, host=HOST) == [HOST]


def test_the_images_cli(
    worker: WorkerProcess, redis_server: RedisServer, registry_images: dict[str, str]
) -> None:
    ref = registry_images["user"]
    pulled = _cli(redis_server.url, "pull", ref, "--host", HOST, "--json")
    assert pulled.returncode == 0, pulled.stderr
    (info,) = json.loads(pulled.stdout)
    assert (info["host"], info["user"], info["workdir"]) == (HOST, "1000", "/work")
    text = _cli(redis_server.url, "pull", ref, "--host", HOST)
    assert text.returncode == 0 and f"{HOST}: {ref} {info['digest']}" in text.stdout
    listed = _cli(redis_server.url, "ls", "--host", HOST)
    assert listed.returncode == 0 and ref in listed.stdout and "1000" in listed.stdout
    # This host alone: other tests' hosts share the session's Redis.
    as_json = _cli(redis_server.url, "ls", "--host", HOST, "--json")
    assert json.loads(as_json.stdout)[0]["digest"] == info["digest"], as_json.stderr
    missing = _cli(redis_server.url, "pull", ref + "-nope", "--host", HOST)
    assert missing.returncode == 125 and "no such image" in missing.stderr
    removed = _cli(redis_server.url, "rm", info["digest"], "--host", HOST)
    assert removed.returncode == 0 and f"removed from {HOST}" in removed.stderr
    again = _cli(redis_server.url, "rm", ref, "--host", HOST)
    assert again.returncode == 1 and "no host held" in again.stderr


def test_gc_collects_the_images_no_workspace_uses(
    image_registry: Registry, registry_images: dict[str, str], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = image_registry.settings(tmp_path / "state").model_copy(
        update={"images_max_age_s": 0.0, "retention_min_age_s": 0.0})
    kept, _ = images.ensure(registry_images["nobash"], settings)
    gone, _ = images.ensure(registry_images["user"], settings)
    _use(settings, kept)
    assert retention.gc_command(settings, dry_run=True, as_json=True) == 0
    planned = json.loads(capsys.readouterr().out)["images"]
    assert [item["digest"] for item in planned["remove"]] == [gone.digest]
    assert planned["removed"] == [] and planned["in_use"] == 1
    assert len(images.held(settings)) == 2
    assert retention.gc_command(settings, dry_run=False, as_json=False) == 0
    assert "images: removed 1" in capsys.readouterr().out
    assert [info.digest for info in images.held(settings)] == [kept.digest]


def _use(settings: Settings, image: ImageInfo) -> None:
    """A workspace record of the host naming `image` (as the engine keeps one)."""
    folder = settings.workspaces_dir
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "w0123456789abcde.json").write_text(json.dumps({"id": "w0123456789abcde",
                                                             "image": image.model_dump()}))

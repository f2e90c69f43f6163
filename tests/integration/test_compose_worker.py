"""The compose stack's worker, in its image (deploy/Dockerfile), under podman, driven
from the host through the client: a call, a host-root workspace, a session, an image
workspace from the test registry, a snapshot and forks.

In such a container `/` is an overlay, which cannot be idmapped: while host-root
workspaces showed the host's directories through idmapped mounts, no call without an
image ran there at all ("idmapped mount of /etc: Invalid argument"), though the worker
started and said it was fine. `test_the_tree_before_the_host_view_*` builds the image
from the tree before that change and shows the failure; the other tests show every
kind of work succeeding on the tree under test.

Here rather than in tests/e2e: the image is built from this source tree (not from the
installed package e2e drives), and the test stands on the integration fixtures (the
session's Redis, the real registry and its images). The worker runs with the compose
file's worker service's options (`compose_worker.run_options`) except its network: the
container is on the host's network, since the test's Redis and registry listen on the
host's 127.0.0.1 (the registry's certificate and the image references name that
address). The workspaces' own network namespaces are made by the worker either way;
what this leaves untested is only compose's bridge between the worker and Redis.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bashfleet.client import Fleet
from bashfleet.client.redis_server import RedisServer

from .compose_worker import (
    HANDLED,
    ROOT,
    PodmanError,
    WorkerContainer,
    _seconds,
    build_image,
    compose_service,
    copied_sources,
    nodev_image,
    podman,
    run_options,
)
from .conftest import wait_for
from .registry import Registry

# A first run builds the base and the image (minutes on a loaded 2-core machine); a
# later one finds both and takes well under a minute.
pytestmark = pytest.mark.timeout(2400)

#: The tree before host-root workspaces stopped idmapping the host's directories.
BEFORE_HOST_VIEW = "ecd708e"
#: Seconds the container's worker gets to be live in the fleet.
READY_TIMEOUT_S = 120.0
#: Where the registry's credentials and CA are mounted in the container.
AUTH_IN = "/run/bashfleet-test/registry-auth.json"
CERTS_IN = "/run/bashfleet-test/registry-certs"


def _need_tools() -> None:
    """What building and running the image needs; a precise failure where it is absent."""
    missing = [tool for tool in ("podman", "runc", "mmdebstrap", "newuidmap")
               if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: this test builds deploy/Dockerfile "
                    "and runs its worker under podman with runc (scripts/test.sh installs "
                    "podman, runc, mmdebstrap and uidmap as root with apt-get)")


def _worker_env(service: str, redis_url: str, registry: Registry) -> dict[str, str]:
    """The service's environment with the test's values (its own Redis, the suite's
    key), and where the registry's credentials are: a variable the file gains that the
    test does not know fails here rather than being left out."""
    given = compose_service(service)["environment"]
    ours = {"BASHFLEET_REDIS_URL": redis_url,
            "BASHFLEET_SIGNING_KEY": os.environ["BASHFLEET_SIGNING_KEY"],
            "BASHFLEET_HOST": str(given["BASHFLEET_HOST"])}
    unknown = sorted(set(given) - set(ours))
    assert not unknown, f"the compose worker's environment has variables unknown here: {unknown}"
    return {**ours, "BASHFLEET_REGISTRY_AUTH_FILE": AUTH_IN,
            "BASHFLEET_REGISTRY_CERTS_DIR": CERTS_IN}


def _start(image: str, service: str, base: Path, redis_server: RedisServer,
           registry: Registry) -> WorkerContainer:
    container = WorkerContainer(
        image, service, base, _worker_env(service, redis_server.url, registry),
        {registry.auth_file: AUTH_IN, registry.certs_dir: CERTS_IN},
    )
    return container.start()


def _wait_live(container: WorkerContainer, url: str) -> None:
    """Until the container's worker is a live host of the fleet; its log if it never is."""
    with Fleet(url) as fleet:
        def live() -> bool:
            state = podman("inspect", "--format", "{{.State.Status}}",
                           str(container.id)).strip()
            if state != "running":
                raise AssertionError(f"the worker container is {state}")
            return any(h.host == container.host and h.alive for h in fleet.hosts())

        try:
            wait_for(live, READY_TIMEOUT_S, f"host {container.host} live", interval=0.5)
        except AssertionError as error:
            raise AssertionError(
                f"{error}\n--- the container's log:\n{container.logs()}") from None


@pytest.fixture(scope="module")
def worker_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    _need_tools()
    return build_image(ROOT, tmp_path_factory.mktemp("compose-build"))


@pytest.fixture(scope="module")
def worker(
    worker_image: str, redis_server: RedisServer,
    image_registry: Registry, tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerContainer]:
    """The compose file's `worker-a`, started from the image, live in the fleet."""
    container = _start(worker_image, "worker-a", tmp_path_factory.mktemp("compose-a"),
                       redis_server, image_registry)
    try:
        _wait_live(container, redis_server.url)
        yield container
    finally:
        container.remove()


# ------------------------------------------------------------------- the options, pure


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("2m", 120), ("1h", 3600),
                                               ("45", 45)])
def test_compose_durations(text: str, seconds: int) -> None:
    assert _seconds(text) == seconds


@pytest.mark.parametrize(("text", "sources"), [
    ("COPY a b ./\nRUN x\nCOPY worker ./worker", ["a", "b", "worker"]),
    ("COPY --chown=1:1 a /x\nCOPY --from=build /y /z", ["a"]),
    ("FROM x\n  # COPY nothing", []),
])
def test_what_a_dockerfile_copies(text: str, sources: list[str]) -> None:
    assert copied_sources(text) == sources


def test_the_image_is_made_of_what_the_dockerfile_copies() -> None:
    text = (ROOT / "deploy/Dockerfile").read_text()
    assert set(copied_sources(text)) >= {"pyproject.toml", "worker", "client"}


def test_the_worker_services_options_come_from_the_compose_file() -> None:
    service = compose_service("worker-a")
    options = run_options(service, {"worker-a-state": "vol"})
    pairs = list(zip(options[::2], options[1::2], strict=True))
    assert ("--cap-drop", "ALL") in pairs
    assert sorted(v for k, v in pairs if k == "--cap-add") == sorted(service["cap_add"])
    assert "SYS_ADMIN" in service["cap_add"]  # what bubblewrap needs: the file's own list
    assert ("--security-opt", "apparmor=unconfined") in pairs
    assert ("--volume", "vol:/var/lib/bashfleet") in pairs
    # The machine's id locks, shared with every other worker of the machine.
    assert ("--volume", "/run/bashfleet/ids:/run/bashfleet/ids") in pairs
    assert ("--stop-timeout", "30") in pairs
    with pytest.raises(ValueError, match="privileged"):
        run_options({**service, "privileged": True}, {"worker-a-state": "vol"})
    assert set(HANDLED) >= set(compose_service("worker-b"))


# ------------------------------------------------------------------ the running worker


def test_the_container_root_is_an_overlay(worker: WorkerContainer) -> None:
    """What made host-root calls fail there: the worker's `/` is overlayfs."""
    found = worker.exec("stat", "-f", "-c", "%T", "/")
    assert found.stdout.strip() == "overlayfs", found


def test_the_container_host_says_how_it_isolates(worker: WorkerContainer, fleet: Fleet) -> None:
    """Ids per workspace and an overlay of its own over the container's root, as on a
    machine: what the calls below stand on."""
    (info,) = [h for h in fleet.hosts() if h.host == worker.host]
    assert info.sandbox is not None
    assert (info.sandbox.tenancy, info.sandbox.layers) == ("multi", "overlay"), info.sandbox


def test_a_call_on_the_container_host(worker: WorkerContainer, fleet: Fleet) -> None:
    result = fleet.run("echo hi; ls /opt/bashfleet/pyproject.toml", host=worker.host)
    assert result.exit_code == 0, result
    assert result.host == worker.host
    # The call sees the container's root (the image's WORKDIR), not this machine's.
    assert result.stdout == "hi\n/opt/bashfleet/pyproject.toml\n", result
    assert not Path("/opt/bashfleet").exists()


def test_a_host_root_workspace(worker: WorkerContainer, fleet: Fleet) -> None:
    ws = fleet.workspace(host=worker.host)
    try:
        assert ws.run("mkdir sub && echo kept > sub/f").exit_code == 0
        again = ws.run("cat sub/f; pwd")
        assert again.stdout == f"kept\n{ws.path}\n", again
        # Files to and from the client (`bashfleet cp`).
        assert ws.read_file("sub/f") == b"kept\n"
        ws.write_file("up.txt", "from the client\n")
        assert ws.run("cat up.txt").stdout == "from the client\n"
        # The container's /etc/shadow is there (its root, the worker, reads it) but not
        # for the workspace's commands: they read what a local account could.
        assert worker.exec("head", "-c", "5", "/etc/shadow").stdout == "root:"
        seen = ws.run("test -e /etc/shadow && echo there; cat /etc/shadow", check=False)
        assert seen.stdout == "there\n", seen
        assert seen.exit_code != 0 and "Permission denied" in seen.stderr, seen
        # A fork has the file of that instant; a change in it is its own.
        (fork,) = ws.fork(1)
        try:
            assert fork.run("cat sub/f; echo forked > sub/f").stdout == "kept\n"
            assert ws.run("cat sub/f").stdout == "kept\n"
        finally:
            fork.delete()
    finally:
        ws.delete()


def test_an_allow_list_workspace(worker: WorkerContainer, fleet: Fleet) -> None:
    """`allow=` starts its guard with the compose file's capabilities (no
    NET_BIND_SERVICE), and refuses what the list does not name."""
    ws = fleet.workspace(host=worker.host, network="allow=pypi.org")
    try:
        result = ws.run("echo up; (exec 3<>/dev/tcp/127.0.0.1/9) 2>&1 || echo refused",
                        check=False)
        assert result.stdout.startswith("up\n") and result.stdout.endswith("refused\n"), result
    finally:
        ws.delete()


def test_a_session_on_the_container_host(worker: WorkerContainer, fleet: Fleet) -> None:
    session = f"py-{uuid.uuid4().hex[:10]}"
    first = fleet.run("mkdir -p deep && cd deep && export KEPT=yes", session=session,
                      host=worker.host)
    assert first.exit_code == 0, first
    second = fleet.run('pwd; echo "$KEPT"', session=session)
    assert second.host == worker.host
    assert second.stdout.endswith("/deep\nyes\n"), second


def test_an_image_workspace_its_snapshot_and_forks(
    worker: WorkerContainer, fleet: Fleet, image_registry: Registry
) -> None:
    ws = fleet.workspace(host=worker.host, image=nodev_image(image_registry))
    made: list[object] = []
    try:
        first = ws.run("id -u; grep CODENAME /etc/os-release; echo v1 > /root/state; "
                       "touch /usr/local/bin/mine && echo wrote")
        assert first.stdout == "0\nVERSION_CODENAME=bookworm\nwrote\n", first
        snap = ws.snapshot()
        assert ws.run("echo v2 > /root/state").exit_code == 0
        restored = fleet.workspace(snapshot=snap)
        made.append(restored)
        assert restored.host == worker.host
        assert restored.run("cat /root/state; ls /usr/local/bin").stdout == "v1\nmine\n"
        forks = ws.fork(2)
        made.extend(forks)
        assert [f.run("cat /root/state").stdout for f in forks] == ["v2\n", "v2\n"]
        assert forks[0].run("echo mine > /root/state").exit_code == 0
        assert forks[1].run("cat /root/state").stdout == "v2\n"
        assert ws.run("cat /root/state").stdout == "v2\n"
        assert fleet.delete_snapshot(snap)
    finally:
        for other in made:
            other.delete()  # type: ignore[attr-defined]
        ws.delete()


def test_an_image_with_device_files(
    worker: WorkerContainer, fleet: Fleet, registry_images: dict[str, str]
) -> None:
    """mmdebstrap's roots (the registry's `debian`) carry /dev/console, /dev/null...:
    umoci unpacks them as root, which needs CAP_MKNOD in the compose file's list (before
    it: `mknod: operation not permitted`, and no such image could be a workspace)."""
    ws = fleet.workspace(host=worker.host, image=registry_images["debian"])
    try:
        assert ws.run("echo hi; test -c /dev/null && echo dev").stdout == "hi\ndev\n"
    finally:
        ws.delete()


# ------------------------------------------------------------- the tree before the change


def test_the_tree_before_the_host_view_change_failed_every_host_root_call(
    worker: WorkerContainer, redis_server: RedisServer,
    image_registry: Registry, fleet: Fleet, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The same image built from the tree before host-root workspaces stopped idmapping
    the host's directories, as the compose file's second worker: it starts and is live,
    and its host-root call fails on `/etc`, the overlay it could not idmap (while the
    tree under test runs the same call: `test_a_call_on_the_container_host`)."""
    tree = tmp_path_factory.mktemp("before-host-view")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", BEFORE_HOST_VIEW,
         "deploy/Dockerfile", "pyproject.toml", "setup.py", "README.md", "worker", "client"],
        capture_output=True, check=False)
    if archive.returncode != 0:
        pytest.skip(f"commit {BEFORE_HOST_VIEW} is not in this clone's history "
                    f"({archive.stderr.decode()[-200:].strip()})")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    image = build_image(tree, tmp_path_factory.mktemp("before-build"))
    old = _start(image, "worker-b", tmp_path_factory.mktemp("compose-b"), redis_server,
                 image_registry)
    try:
        _wait_live(old, redis_server.url)
        result = fleet.run("echo hi", host=old.host, check=False)
        said = f"{result.error} {result.stderr}"
        assert result.exit_code != 0 and "hi" not in result.stdout, result
        assert "idmapped mount of /etc" in said and "Invalid argument" in said, result
    finally:
        with contextlib.suppress(PodmanError):
            old.remove()

"""A Dockerfile's RUN steps run in namespaces of their own: never the host's loopback
(where the fleet's Redis and the host's services listen), never the host's /proc (every
tenant's command lines). Real buildah, the session's registry (`registry.py`).

Each probe is shown to work first: the same Dockerfile built by buildah as the worker
built it before (chroot isolation, the host's network and PID namespaces) reads both
secrets; through `images.build` it reads neither, and the image holds neither."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from privilege import needs_root

from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import workspaces
from bashfleet.worker.engine.images import image_tools as tools
from bashfleet.worker.engine.images import images
from bashfleet.worker.engine.images.image_meta import ImageError
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceSpec
from bashfleet.worker.wire.network import NetworkPolicy

from .conftest import WorkerFactory, WorkerProcess
from .engine_helpers import (
    Engine,
    Janitor,
    _janitor_fixture,  # noqa: F401 - the `janitor` fixture
    engine_with,
)
from .registry import Registry

pytestmark = [pytest.mark.timeout(900),
              needs_root("builds need a root worker")]

#: The RUN step's script (bash: /dev/tcp is bash's): the loopback server's answer, every
#: process's command line it can see, the interfaces of its namespace and DNS, written
#: into the image and printed.
PROBE = """\
(exec 3<>/dev/tcp/127.0.0.1/{port} && timeout 5 cat <&3) > /loopback.txt 2>&1
cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' > /cmdlines.txt
ls /proc | grep -c '^[0-9]' > /nprocs.txt
cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' ' > /ifaces.txt
getent hosts deb.debian.org > /dns.txt 2>&1; echo $? > /dns-status.txt
cat /loopback.txt /cmdlines.txt
"""


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def settings(image_registry: Registry, state: Path, tmp_path: Path) -> Iterator[Settings]:
    """Settings that build under `tmp_path`; buildah's storage emptied afterwards."""
    made = image_registry.settings(state, workspace_allow=(str(tmp_path),))
    try:
        yield made
    finally:
        assert images.sweep(made, buildah=True)


@pytest.fixture
def loopback_secret() -> Iterator[tuple[int, str]]:
    """A server on the host's 127.0.0.1 that tells each client a secret: (port, secret)."""
    secret = f"loopback-{secrets.token_hex(8)}"
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(secret.encode() + b"\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], secret
    finally:
        done.set()
        thread.join()
        server.close()


@pytest.fixture
def cmdline_secret() -> Iterator[str]:
    """A host process whose command line holds a secret (as `mysql -pSECRET` would)."""
    secret = f"cmdline-{secrets.token_hex(8)}"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", secret],
                            stdin=subprocess.PIPE)
    try:
        yield secret
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)


def _context(tmp_path: Path, name: str, base: str, port: int) -> Path:
    """A context whose Dockerfile runs the probe (`name` in a comment: contexts of
    different names are different builds, none served from another's cache)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "Dockerfile").write_text(
        f"FROM {base}\nCOPY probe.sh /probe.sh\nRUN bash /probe.sh  # {name}\n")
    (folder / "probe.sh").write_text(PROBE.format(port=port))
    return folder


def _old_build(settings: Settings, context: Path, tmp_path: Path) -> str:
    """What buildah prints building `context` as the worker did before: chroot
    isolation in the worker's own network and PID namespaces (the same command line)."""
    storage = tmp_path / "old-buildah"
    argv = tools.buildah_argv(storage, "vfs", *tools.bud_args(
        settings, context, context / "Dockerfile", tmp_path / "old-iid"))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout
    finally:
        subprocess.run(tools.buildah_argv(storage, "vfs", "rmi", "--all", "--force"),
                       capture_output=True, check=False)
        tools.unmount_under(storage)


def test_run_steps_reach_neither_the_hosts_loopback_nor_its_processes(
    settings: Settings, registry_images: dict[str, str], tmp_path: Path,
    loopback_secret: tuple[int, str], cmdline_secret: str,
) -> None:
    port, answer = loopback_secret
    context = _context(tmp_path, "probe", registry_images["debian"], port)
    # Before: the probe works. buildah's chroot isolation, as the worker ran it, gave
    # the step the host's loopback and the host's /proc.
    before = _old_build(settings, context, tmp_path)
    # (Never shown whole: it holds every command line of the host.)
    reached, read = answer in before, cmdline_secret in before
    assert reached, "the loopback probe did not work"
    assert read, "the /proc probe did not work"

    said: list[str] = []
    _, root = images.build(str(context), settings, said.append)  # egress by default
    shown = "\n".join(said)
    assert answer not in shown, "the step reached the host's loopback"
    assert cmdline_secret not in shown, "the step read the host's /proc"
    assert answer not in (root / "loopback.txt").read_text()
    assert cmdline_secret not in (root / "cmdlines.txt").read_text()
    # A namespace of its own: a handful of processes (buildah's and the step's), and the
    # workspace link (eth0) beside its own loopback, not the host's interfaces.
    assert int((root / "nprocs.txt").read_text()) < 20
    assert sorted((root / "ifaces.txt").read_text().split()) == ["eth0", "lo"]
    # The step's refusal was immediate, not a timeout (a reset, as for a workspace),
    # while the internet's DNS, through the workspaces' rules, answered.
    assert "refused" in (root / "loopback.txt").read_text().lower()
    assert (root / "dns-status.txt").read_text().strip() == "0"


@pytest.fixture
def images_engine(tmp_path: Path, janitor: Janitor, image_registry: Registry
                  ) -> Iterator[Engine]:
    """An engine whose workspaces pull from the session's registry; buildah's storage
    emptied afterwards."""
    with engine_with(tmp_path, janitor, registry_auth_file=image_registry.auth_file,
                     registry_certs_dir=image_registry.certs_dir) as engine:
        try:
            yield engine
        finally:
            assert images.sweep(engine.settings, buildah=True)


def test_a_workspace_built_without_network_had_only_its_loopback(
    images_engine: Engine, registry_images: dict[str, str],
    loopback_secret: tuple[int, str], cmdline_secret: str,
) -> None:
    """`build_network` of a workspace's spec reaches its build: under `none` the steps
    had their own loopback alone, and nothing resolved."""
    port, answer = loopback_secret
    engine = images_engine
    context = _context(engine.tmp, "none", registry_images["debian"], port)
    record = workspaces.create(WorkspaceSpec(build=str(context), build_network="none"),
                               engine.settings)
    try:
        result = engine.run("cat /ifaces.txt /dns-status.txt /loopback.txt /cmdlines.txt",
                            workspace=record.id, cwd=None)
        assert result.error is None, result
        lines = result.stdout.splitlines()
        assert lines[0] == "lo" and lines[1] != "0", lines[:2]  # nothing resolved
        assert answer not in result.stdout, "the step reached the host's loopback"
        assert cmdline_secret not in result.stdout, "the step read the host's /proc"
    finally:
        workspaces.delete(record.id, engine.settings)


def test_a_build_network_is_checked(settings: Settings, tmp_path: Path) -> None:
    folder = tmp_path / "ctx"
    folder.mkdir()
    (folder / "Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(ImageError) as caught:
        images.build(str(folder), settings, network=NetworkPolicy(mode="host"))
    assert caught.value.kind == "invalid" and "NETWORK_HOST_OK" in caught.value.message
    with pytest.raises(ImageError) as caught:
        images.build(str(folder), settings,
                     network=NetworkPolicy(mode="allow", allow=("example.com",)))
    assert caught.value.kind == "invalid"


# ------------------------------------------------------------------ through a fleet

BUILD_HOST = "builds"


@pytest.fixture(scope="module")
def build_worker(
    redis_server: RedisServer, redis_client: redis.Redis, image_registry: Registry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    """A host that pulls bases from the test registry with its credentials."""
    factory = WorkerFactory(redis_server.url, redis_client, tmp_path_factory.mktemp("builds"))
    env = {"BASHFLEET_REGISTRY_AUTH_FILE": str(image_registry.auth_file),
           "BASHFLEET_REGISTRY_CERTS_DIR": str(image_registry.certs_dir)}
    yield from factory.module_host(BUILD_HOST, env=env)


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BASHFLEET_REDIS_URL": url}
    return subprocess.run([sys.executable, "-m", "bashfleet.client.cli", *args], env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def test_the_cli_builds_with_the_network_it_names(
    build_worker: WorkerProcess, redis_server: RedisServer, registry_images: dict[str, str],
    tmp_path: Path,
) -> None:
    """`workspace create --build DIR --build-network none` through a real worker: the
    steps probed the fleet's own Redis (on the host's loopback) and reached nothing."""
    port = urlsplit(redis_server.url).port
    assert port is not None
    context = _context(tmp_path, "cli", registry_images["debian"], port)
    made = _cli(redis_server.url, "workspace", "create", "--host", BUILD_HOST, "--build",
                str(context), "--build-network", "none")
    assert made.returncode == 0, made.stderr[-2000:]
    workspace = made.stdout.strip()
    try:
        shown = _cli(redis_server.url, "run", "--workspace", workspace,
                     "cat /ifaces.txt /dns-status.txt /loopback.txt")
        assert shown.returncode == 0, shown.stderr[-2000:]
        lines = shown.stdout.splitlines()
        assert lines[:1] == ["lo"] and lines[1] != "0", lines[:2]
        assert "refused" in shown.stdout.lower(), "the step reached the fleet's Redis"
    finally:
        _cli(redis_server.url, "workspace", "rm", workspace)
    wrong = _cli(redis_server.url, "workspace", "create", "--host", BUILD_HOST, "--build",
                 str(context), "--build-network", "sideways")
    assert wrong.returncode != 0 and "network" in wrong.stderr

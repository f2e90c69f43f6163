"""A call's environment through a real worker started from a person's shell: what that
shell exported (an agent socket, registry credentials, an app's password, a virtualenv's
PYTHONPATH) is in the worker's own environment and reaches no command, on the host's
root or on an image, in the foreground or as a job; what the operator names
(`BASHFLEET_ENV_PASS`) and what the caller passes do. An image workspace's calls see the
image's ENV and what docs/calls.md says bashfleet adds, nothing else; its hostname resolves."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from privilege import needs_root

from bashfleet.client import Fleet
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine.environment import HARDENING, MARKER_VAR

from .conftest import WorkerFactory, WorkerProcess
from .registry import Registry

pytestmark = pytest.mark.timeout(600)

HOST = "envs"

#: What the person's shell exported, which the worker inherits.
EXPORTED = {
    "MY_APP_PASS": "app-pass-7f3k2q9z", "SSH_AUTH_SOCK": "/tmp/ssh-agent-x/agent.4242",
    "DOCKER_AUTH_CONFIG": '{"auths":{"reg.example":{"auth":"dXNlcjpwYXNz"}}}',
    "PYTHONPATH": "/home/person/src/lib", "VIRTUAL_ENV": "/home/person/.venv",
    "PIP_FIND_LINKS": "/home/person/wheels", "KUBECONFIG": "/home/person/.kube/config",
}
#: What the operator passes through (named in BASHFLEET_ENV_PASS).
NAMED = {"CORP_PROXY_HINT": "proxy.corp.example:3128", "LC_TIME": "C.UTF-8"}


@pytest.fixture(scope="module")
def worker(
    redis_server: RedisServer, redis_client: redis.Redis, image_registry: Registry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    factory = WorkerFactory(redis_server.url, redis_client, tmp_path_factory.mktemp("envs"))
    env = {**EXPORTED, **NAMED, "BASHFLEET_ENV_PASS": "corp_proxy_*,LC_*",
           "BASHFLEET_REGISTRY_AUTH_FILE": str(image_registry.auth_file),
           "BASHFLEET_REGISTRY_CERTS_DIR": str(image_registry.certs_dir)}
    yield from factory.module_host(HOST, env=env)


def _worker_environ(worker: WorkerProcess) -> dict[str, str]:
    """The worker's own environment, as the kernel keeps it for its process."""
    raw = Path(f"/proc/{worker.pid}/environ").read_bytes()
    return dict(item.decode().partition("=")[::2] for item in raw.split(b"\0") if item)


def _env_of(text: str) -> dict[str, str]:
    return dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)


def test_the_workers_exports_are_in_its_environment(worker: WorkerProcess) -> None:
    """What the calls below must not see is there to leak: the worker has it all."""
    own = _worker_environ(worker)
    assert {name: own.get(name) for name in EXPORTED} == EXPORTED


def _assert_clean(env: dict[str, str], what: str) -> None:
    leaked = sorted(name for name in EXPORTED if name in env)
    assert not leaked, f"{what}: the worker's {leaked} reached the command"
    assert not any(value in "\n".join(env.values()) for value in EXPORTED.values()), what
    assert {name: env.get(name) for name in NAMED} == NAMED, what


def test_a_call_on_the_hosts_root_gets_a_clean_environment(
    worker: WorkerProcess, fleet: Fleet
) -> None:
    result = fleet.run("env", host=HOST, env={"CALLER_VAR": "from-the-caller"})
    env = _env_of(result.stdout)
    _assert_clean(env, "a call")
    assert env["CALLER_VAR"] == "from-the-caller"
    assert env["PATH"] == _worker_environ(worker)["PATH"]  # where the host's programs are
    assert env["TERM"] == "dumb" and env[MARKER_VAR] == result.call_id
    assert env.get("HOME") and env.get("USER")


def test_a_background_job_gets_the_same(worker: WorkerProcess, fleet: Fleet) -> None:
    job = fleet.run("env", host=HOST, mode="background").job
    assert job is not None
    fleet.wait(job.id, timeout=60)
    env = _env_of(fleet.read_output(job.id).text)
    _assert_clean(env, "a job")
    assert env[MARKER_VAR] == job.id


def test_a_session_keeps_its_own_exports(worker: WorkerProcess, fleet: Fleet) -> None:
    session = f"env-{uuid.uuid4().hex[:8]}"
    fleet.run("export MINE=kept; unset LC_TIME", host=HOST, session=session)
    env = _env_of(fleet.run("env", host=HOST, session=session).stdout)
    assert env["MINE"] == "kept" and "LC_TIME" not in env
    assert not any(name in env for name in EXPORTED)


#: What bash sets itself in every shell it starts (not an environment it was given).
BASH_OWN = {"PWD", "SHLVL", "_"}


@needs_root("image workspaces and a UTS namespace of its own are a root worker's")
def test_an_image_workspace_sees_the_images_env_and_only_what_bashfleet_adds(
    worker: WorkerProcess, fleet: Fleet, registry_images: dict[str, str]
) -> None:
    with fleet.workspace(host=HOST, image=registry_images["user"]) as ws:
        env = _env_of(ws.run("env").stdout)
        _assert_clean(env, "an image's call")
        # The image's ENV as `docker exec` gives it (its PATH, not the host's).
        assert env["GREETING"] == "hello"
        assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        assert "LANG" not in env
        # docs/calls.md's list: HOME, the hardening, the marker; the operator's names.
        added = {"HOME", *HARDENING, MARKER_VAR, *NAMED}
        assert set(env) - BASH_OWN == {"PATH", "GREETING"} | added, sorted(env)


class _RenamedHost(WorkerProcess):
    """A worker in a UTS namespace of its own whose hostname this machine's /etc/hosts
    does not name, as on a host whose installer wrote none (its workspaces share it)."""

    def args(self) -> list[str]:
        return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', UNNAMED,
                *super().args()]


#: The hostname of `renamed`'s machine.
UNNAMED = f"bf-unnamed-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def renamed(
    redis_server: RedisServer, redis_client: redis.Redis, image_registry: Registry,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    assert UNNAMED not in Path("/etc/hosts").read_text()
    base = tmp_path_factory.mktemp("renamed")
    worker = _RenamedHost(
        "renamed", redis_server.url, state_dir=base / "state", log_dir=base / "logs",
        extra_env={"BASHFLEET_REGISTRY_AUTH_FILE": str(image_registry.auth_file),
                   "BASHFLEET_REGISTRY_CERTS_DIR": str(image_registry.certs_dir)})
    worker.start()
    try:
        worker.wait_ready(redis_client)
        yield worker
    finally:
        worker.stop()
        worker.kill_jobs()


#: The hostname a call sees, and what it resolves to (empty: nothing).
RESOLVE = ('h=$(cat /proc/sys/kernel/hostname); echo "name=$h"; '
           'echo "address=$(getent ahostsv4 "$h" | head -1 | cut -d" " -f1)"')


@needs_root("image workspaces and a UTS namespace of its own are a root worker's")
@pytest.mark.parametrize("image", [None, "debian"])
def test_the_workspaces_hostname_resolves(
    renamed: WorkerProcess, fleet: Fleet, registry_images: dict[str, str], image: str | None
) -> None:
    """`gethostbyname(gethostname())` (Python's, Java's, MPI's start-up) failed in a
    workspace whose /etc/hosts did not name the hostname: an image's always, the host's
    root's where the host's file does not."""
    with fleet.workspace(host=renamed.host,
                         image=registry_images[image] if image else None) as ws:
        out = _env_of(ws.run(RESOLVE).stdout)
        assert out["name"] == UNNAMED, out
        assert out["address"] == "127.0.1.1", out
        if image is None:
            py = ws.run("python3 -c 'import socket; "
                        "print(socket.gethostbyname(socket.gethostname()))'", check=False)
            assert (py.exit_code, py.stdout) == (0, "127.0.1.1\n"), py
        # The host's file is unchanged. An image's /etc is its own to change; on the
        # host's root the copy is read-only, as all of the host's /etc is.
        assert UNNAMED not in Path("/etc/hosts").read_text()
        edit = ws.run("echo '10.9.9.9 mine' >> /etc/hosts && getent hosts mine", check=False)
        assert edit.exit_code == (0 if image else 1), edit
    assert UNNAMED not in Path("/etc/hosts").read_text()

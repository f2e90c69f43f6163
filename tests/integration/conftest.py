"""Fleet fixtures: a real Redis server and real worker processes, always cleaned up.

Workers are started as `python -m bashfleet.worker.fleet.supervisor --host H` in a session of their
own (so a test can SIGKILL a worker's whole process group, as a crash would), each with
its own state directory (as separate machines would have). Every process started
here is ended by its pid (or its group's id) and waited for; every wait is on a
condition, with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from bashfleet.client import BashfleetError, Fleet, records
from bashfleet.client._core.sending import open_reply
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import teardown
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import auth
from bashfleet.worker.wire.messages import task_message
from bashfleet.worker.wire.models import CallResult
from bashfleet.worker.wire.names import Task, exec_queue

from .engine_helpers import give_to_run_user
from .netns_helpers import NetNs
from .registry import Registry, pushed_images, running_registry

T = TypeVar("T")

#: Seconds a worker gets to be ready (both consumers consuming) on a loaded 2-core box.
READY_TIMEOUT_S = 40.0
#: What verifies the records this suite's workers publish (sealed with the suite's key).
RECORD_KEYS = auth.keyring([os.environ["BASHFLEET_SIGNING_KEY"]])


def wait_for(
    condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.02
) -> T:
    """Poll `condition` until it returns something truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    delay = interval
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(delay)  # polling a condition, with a deadline
        delay = min(delay * 1.5, 0.2)


def end_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """End a process this suite started as the leader of its own group: SIGTERM the
    group, then SIGKILL it if it has not ended within `grace_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class WorkerProcess:
    """One `python -m bashfleet.worker.fleet.supervisor` process (a supervisor and its two
    consumers)."""

    def __init__(
        self, host: str, url: str, *, state_dir: Path, log_dir: Path, concurrency: int = 2,
        labels: tuple[str, ...] = (), extra_env: dict[str, str] | None = None,
        projects: Path | None = None,
    ) -> None:
        self.host = host
        self.url = url
        self.state_dir = state_dir
        self.projects = projects or state_dir.parent / f"{state_dir.name}-projects"
        """The root under which this worker allows existing directories as workspaces
        (`workspace_allow`): where a test puts what a call must see (its cwd, a marker,
        a witness), since the test's own tmp_path is invisible to a sandboxed call."""
        self.log_path = log_dir / f"worker-{host}-{time.monotonic_ns()}.log"
        self.concurrency = concurrency
        self.labels = labels
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        """The command line."""
        # --local-fallback: like `bashfleet up`'s, the suite's workers start where
        # bubblewrap does not work (they say so in their log; the sandbox's own tests
        # skip there), where `bashfleet worker` alone refuses to.
        args = [
            sys.executable, "-m", "bashfleet.worker.fleet.supervisor", "--host", self.host,
            "--concurrency", str(self.concurrency), "--local-fallback",
        ]
        for label in self.labels:
            args += ["--label", label]
        return args

    def env(self) -> dict[str, str]:
        """The environment: this worker's Redis, state directory, workspace root (the
        test's, never the machine's default, which every run on this machine shares) and
        allowed root (`projects`), then what the test adds (`extra_env`)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
        env.update(
            BASHFLEET_REDIS_URL=self.url, BASHFLEET_STATE_DIR=str(self.state_dir),
            BASHFLEET_SIGNING_KEY=os.environ["BASHFLEET_SIGNING_KEY"],
            BASHFLEET_WORKSPACE_ROOT=str(self.state_dir.parent / f"{self.state_dir.name}-ws"),
            BASHFLEET_WORKSPACE_ALLOW=str(self.projects),
        )
        env.update(self.extra_env)
        return env

    @property
    def workspace_root(self) -> Path:
        """Where this worker makes fresh workspaces and keeps their calls' and jobs'
        output (`.out/<id>`)."""
        return Path(self.env()["BASHFLEET_WORKSPACE_ROOT"])

    def project(self, name: str | None = None) -> Path:
        """A new directory under `projects`, the run user's (as an operator gives a build
        directory to it): a call whose cwd is in it runs in a workspace whose directory
        is this one, which the test reads and writes on the host at the same path."""
        path = self.projects / (name or f"p{uuid.uuid4().hex[:10]}")
        path.mkdir(parents=True)
        give_to_run_user(path)
        return path

    def record_keys(self) -> dict[str, str]:
        """What verifies the records this worker publishes (its keys)."""
        env = self.env()
        return auth.keyring([env.get("BASHFLEET_SIGNING_KEY", ""),
                             env.get("BASHFLEET_ADMIN_KEY", "")])

    def start(self) -> WorkerProcess:
        """Start it (not waiting)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.projects.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args(), env=self.env(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        """The supervisor's pid (also its process group id)."""
        assert self.proc is not None
        return self.proc.pid

    def wait_ready(self, client: redis.Redis, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait until this very process holds the host and both consumers consume."""

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"worker {self.host} exited with {self.proc.returncode}:\n{self.log()}"
                )
            info = records.host_info(client, self.host, keys=self.record_keys())
            return bool(info and info.ready and info.pid == self.pid)

        wait_for(ready, timeout, f"worker {self.host} to be ready")

    def log(self) -> str:
        """What it printed so far (the end of it)."""
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-6000:]
        return ""

    def kill_group(self) -> None:
        """SIGKILL the worker's whole process group, as a machine crash would."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 25.0) -> int | None:
        """SIGTERM the group, wait; SIGKILL it if it does not stop. Returns the status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait(10)
        # Consumers share the group: make sure none outlives its supervisor.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        return self.proc.returncode

    def kill_jobs(self) -> None:
        """End every background job this worker's host still runs, delete its
        workspaces, and end its blanks and the keepers no record names (test cleanup:
        `teardown.end_host`). Their keepers outlive the worker by design (a real host's
        reaper would end them; here nothing else would), and so would their cgroups."""
        root = self.env().get("BASHFLEET_WORKSPACE_ROOT")
        teardown.end_host(Settings(state_dir=self.state_dir, host=self.host,
                                   workspace_root=Path(root) if root else None))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server on 127.0.0.1 with a password, for the whole session."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), password=secrets.token_hex(12))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A registry-style client (text replies) of the session's Redis."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.close()


class WorkerFactory:
    """Starts workers; stops every one it started (and their jobs) at teardown."""

    def __init__(self, url: str, client: redis.Redis, base: Path) -> None:
        self.url = url
        self.client = client
        self.base = base
        self.started: list[WorkerProcess] = []

    def state_dir(self, host: str) -> Path:
        """The state directory of a host (the same across restarts)."""
        return self.base / "hosts" / host

    @property
    def projects(self) -> Path:
        """The allowed root of workspaces every worker of this factory shares (a
        directory a call of one host sees, a call of another sees too)."""
        return self.base / "projects"

    def start(
        self, host: str, *, concurrency: int = 2, labels: tuple[str, ...] = (),
        wait: bool = True, env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        """Start a worker for `host` (`env`: settings of its own); wait until it is
        ready unless told not to."""
        worker = WorkerProcess(
            host, self.url, state_dir=self.state_dir(host), log_dir=self.base / "logs",
            concurrency=concurrency, labels=labels, extra_env=env, projects=self.projects,
        )
        worker.start()
        self.started.append(worker)
        if wait:
            worker.wait_ready(self.client)
        return worker

    def module_host(
        self, host: str, *, env: dict[str, str] | None = None
    ) -> Iterator[WorkerProcess]:
        """A host for one test module, stopped (its jobs and workspaces ended) when the
        module ends: every worker also serves the fleet's `any` queue, and later modules
        expect a call without a host to land on their own hosts."""
        worker = self.start(host, env=env)
        try:
            yield worker
        finally:
            worker.stop()
            worker.kill_jobs()
            self.started.remove(worker)

    def cleanup(self) -> None:
        """Stop every worker, then end the jobs they left running."""
        for worker in reversed(self.started):
            worker.stop()
        for worker in self.started:
            worker.kill_jobs()


@pytest.fixture(scope="session")
def session_workers(
    redis_server: RedisServer, redis_client: redis.Redis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerFactory]:
    """Workers shared by the session (started once: each start costs seconds)."""
    factory = WorkerFactory(redis_server.url, redis_client, tmp_path_factory.mktemp("fleet"))
    try:
        yield factory
    finally:
        factory.cleanup()


@pytest.fixture(scope="session")
def two_hosts(session_workers: WorkerFactory) -> tuple[WorkerProcess, WorkerProcess]:
    """Hosts `alpha` and `beta`, two command slots each, started in parallel."""
    alpha = session_workers.start("alpha", wait=False)
    beta = session_workers.start("beta", labels=("gpu",), wait=False)
    alpha.wait_ready(session_workers.client)
    beta.wait_ready(session_workers.client)
    return alpha, beta


@pytest.fixture
def workers(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[WorkerFactory]:
    """Workers of one test (for fault tests that kill them)."""
    factory = WorkerFactory(redis_server.url, redis_client, tmp_path)
    try:
        yield factory
    finally:
        factory.cleanup()


@pytest.fixture(autouse=True)
def _route_test_network_extras(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that uses a test network (`net`: `netns_helpers.make_netns`) has its extra
    addresses routed to it while it runs, and no other module's test meanwhile."""
    if "net" not in request.fixturenames:
        yield
        return
    net = request.getfixturevalue("net")
    if not isinstance(net, NetNs):
        yield
        return
    with net.routed_extras():
        yield


@pytest.fixture(autouse=True)
def _end_new_workspaces(request: pytest.FixtureRequest) -> Iterator[None]:
    """The workspaces a test made as the suite's default owner (a fleet session's, an
    agent session's: they live 24 h unless deleted) end with the test, with whatever
    still runs in them, rather than piling up keepers until the session's end. Those of
    hosts no longer alive are left to their worker's cleanup (`kill_jobs`)."""
    if "redis_server" not in request.fixturenames:
        yield
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    with Fleet(server.url) as client:
        before = {view.id for view in client.workspaces()}
        yield
        with contextlib.suppress(BashfleetError, redis.RedisError):
            alive = {info.host for info in client.hosts() if info.alive}
            for view in client.workspaces():
                if view.id not in before and view.host in alive:
                    with contextlib.suppress(BashfleetError):
                        client.open_workspace(view.id).delete()


@pytest.fixture
def fleet(redis_server: RedisServer) -> Iterator[Fleet]:
    """A fleet client of the session's Redis."""
    client = Fleet(redis_server.url)
    yield client
    client.close()


def raw_task(fleet: Fleet, task: str, args: list[object], queue: str, task_id: str) -> str:
    """Push a task message with exactly these arguments on `queue` (as any Redis writer
    could, bypassing the client's signing); the answer the worker gives it, its seal
    checked."""
    message = task_message(task, args, task_id=task_id, queue=queue,
                           reply_to=fleet._replies.channel, argsrepr="raw")
    slot = fleet._replies.expect(task_id)
    try:
        records.push(fleet._redis, queue, message)
        deadline = time.monotonic() + 30
        while not isinstance(answer := slot.wait(0.5) or records.stored_reply(
                fleet._redis, task_id), str):
            assert time.monotonic() < deadline, "no answer within 30 s"
    finally:
        fleet._replies.forget(task_id)
    return open_reply(fleet._keys, task_id, answer)


def raw_exec(
    fleet: Fleet, host: str, args: list[object], call_id: str, queue: str | None = None
) -> CallResult:
    """Send an exec message with exactly these arguments to `host` (as any Redis writer
    could, bypassing the client's signing), on its command queue unless `queue` says
    another; the answer the worker gives it."""
    answer = raw_task(fleet, Task.EXEC, args, queue or exec_queue(host), call_id)
    return CallResult.model_validate_json(answer)


@pytest.fixture(scope="session")
def image_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A real registry on 127.0.0.1 (TLS, basic auth) for the session (`registry.py`)."""
    with running_registry(tmp_path_factory.mktemp("registry")) as registry:
        yield registry


@pytest.fixture(scope="session")
def registry_images(image_registry: Registry) -> dict[str, str]:
    """The test images in the session's registry, by name (`debian`, `nobash`, `user`):
    references such as `127.0.0.1:PORT/bashfleet/debian:bookworm`."""
    return pushed_images(image_registry)

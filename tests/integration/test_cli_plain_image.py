"""`bashfleet run --image`'s light path, end to end: the real CLI as a process against a
real worker that holds the image (pulled from the real test registry), on a fleet of its
own (one live host: the light path places the workspace there without --host).

It prints what the fleet client's path prints (stdout, stderr, exit status) for the same
commands, loads no model, leaves no workspace behind (its deletion is seen in the host's
log and the owner's listing is as before), keeps the workspace while a job of the call
runs, says an image the host does not hold as the fleet client's path says it (which
pulls: the light path makes nothing), and Ctrl-C while the call runs ends the call (run
once) and the workspace."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from bashfleet.client import BashfleetError, Fleet
from bashfleet.client.cli import run
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.wire import names
from bashfleet.worker.wire.control import WorkspaceCreateRequest
from bashfleet.worker.wire.models import WorkspaceSpec, WorkspaceView

from .conftest import WorkerFactory, WorkerProcess
from .registry import Registry
from .test_cli_imports import ENTRY, NOT_ON_PLAIN_RUN, NOT_ON_RUN

pytestmark = pytest.mark.timeout(600)

HOST = "imgrun"
DELETED = re.compile(r"workspace_delete workspace (w[0-9a-f]+): done")


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A Redis of this module's alone: its fleet has one live host."""
    with RedisServer(tmp_path_factory.mktemp("imgrun-redis")) as server:
        yield server


@pytest.fixture(scope="module")
def worker(own_redis: RedisServer, image_registry: Registry,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    client = redis.Redis.from_url(own_redis.url, decode_responses=True)
    factory = WorkerFactory(own_redis.url, client, tmp_path_factory.mktemp("imgrun"))
    # One lane thread per owner: a request can be held up behind another of its owner's
    # (`test_ctrl_c_while_the_workspace_is_made_...`).
    env = {"BASHFLEET_REGISTRY_AUTH_FILE": str(image_registry.auth_file),
           "BASHFLEET_REGISTRY_CERTS_DIR": str(image_registry.certs_dir),
           "BASHFLEET_LANE_THREADS_PER_OWNER": "1"}
    try:
        yield from factory.module_host(HOST, env=env)
    finally:
        client.close()


@pytest.fixture(scope="module")
def own_fleet(own_redis: RedisServer, worker: WorkerProcess) -> Iterator[Fleet]:
    with Fleet(own_redis.url) as client:
        yield client


@pytest.fixture(scope="module")
def ref(own_fleet: Fleet, registry_images: dict[str, str]) -> str:
    """The image, held on the host."""
    image = registry_images["debian"]
    own_fleet.pull_image(image, host=HOST)
    return image


def cli(url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """`bashfleet run ARGV` against the fleet at `url`, as a person's shell runs it."""
    return subprocess.run(
        [sys.executable, "-m", "bashfleet.client.cli", "run", *argv], env=_env(url),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False)


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "BASHFLEET_REDIS_URL"}
    return {**env, "BASHFLEET_REDIS_URL": url}


def _log(worker: WorkerProcess) -> str:
    """All the host logged so far (`WorkerProcess.log` gives its end only)."""
    return worker.log_path.read_text(errors="replace")


def _deleted(worker: WorkerProcess) -> list[str]:
    """The workspaces the host logged as deleted, in order."""
    return DELETED.findall(_log(worker))


def _wait(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling a condition with a deadline


def _ids(fleet: Fleet) -> set[str]:
    return {view.id for view in fleet.workspaces()}


def _same_spill(text: str) -> str:
    """The text with its call's and its workspace's own ids (where its spill files are
    kept) made one."""
    return re.sub(r"\bw[0-9a-f]{15}\b", "<ws>", re.sub(r"c[0-9a-f]{23}", "<call>", text))


#: Commands and the exit status each ends `run` with.
COMMANDS = [
    (["true"], 0),
    (["false"], 1),
    (["echo out; echo err >&2; exit 3"], 3),
    (["cat /etc/debian_version"], 0),
    (["printf 'no newline'"], 0),
    (["kill -9 $$"], 137),
    (["seq 1 3000"], 0),  # cut: its notice names the spill file, kept on the host
    (["--cwd", "/nonexistent/dir", "true"], 125),  # did not run: a system error
    (["--host", HOST, "--isolation", "strict", "id -u"], 0),
]


@pytest.mark.parametrize(("argv", "status"), COMMANDS)
def test_run_image_prints_what_the_fleet_client_path_prints_and_leaves_nothing(
    *, own_redis: RedisServer, own_fleet: Fleet, worker: WorkerProcess, ref: str,
    argv: list[str], status: int,
) -> None:
    before, deleted = _ids(own_fleet), len(_deleted(worker))
    lightly = cli(own_redis.url, "--image", ref, *argv)
    # Its workspace was made and deleted (the deletion is not waited for by the CLI).
    _wait(lambda: len(_deleted(worker)) == deleted + 1, "the light path's deletion")
    # A tag (which only a job of the call would carry) sends it all through the fleet
    # client's path.
    through_fleet = cli(own_redis.url, "--image", ref, "--tag", "via=fleet", *argv)
    _wait(lambda: len(_deleted(worker)) == deleted + 2, "the fleet path's deletion")
    said = [(p.returncode, _same_spill(p.stdout), _same_spill(p.stderr))
            for p in (lightly, through_fleet)]
    assert said[0] == said[1], said
    assert lightly.returncode == status, lightly.stderr
    _wait(lambda: _ids(own_fleet) == before, "the owner's listing as before")


def test_run_image_loads_no_model(own_redis: RedisServer, ref: str) -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", ENTRY, "run", "--image", ref, "echo ran"],
        env=_env(own_redis.url), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120, check=False)
    assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    modules = [line.rsplit("|", 1)[1].strip() for line in lines[1:]]
    assert {"bashfleet.client.cli.plain_image", "bashfleet.client._core.sending",
            "bashfleet.worker.fleet.resp"} <= {*modules}
    # Nor `datetime`: a control request's expiry is written without it.
    heavy = [m for m in modules
             if any(m == name or m.startswith(name + ".")
                    for name in (*NOT_ON_RUN, *NOT_ON_PLAIN_RUN, "datetime"))]
    assert heavy == []


def test_a_job_that_outlives_the_call_keeps_the_workspace(
    own_redis: RedisServer, own_fleet: Fleet, worker: WorkerProcess, ref: str,
) -> None:
    before = _ids(own_fleet)
    done = cli(own_redis.url, "--image", ref, "--timeout", "1", "--background-on-timeout",
               "sleep 60")
    made = _ids(own_fleet) - before
    try:
        assert len(made) == 1, (made, done.stderr)
        (ws_id,) = made
        assert run.stays_notice(ws_id) in done.stderr.splitlines(), done.stderr
        workspace = own_fleet.open_workspace(ws_id)
        assert [job.running for job in workspace.jobs()] == [True]
        assert ws_id not in _deleted(worker)
    finally:
        for ws_id in made:
            own_fleet.open_workspace(ws_id).delete()


def test_an_image_the_host_does_not_hold_is_said_as_the_fleet_client_says_it(
    own_redis: RedisServer, own_fleet: Fleet, worker: WorkerProcess, ref: str,
) -> None:
    """The light path's create is refused (nothing made), then the fleet client's path
    pulls, and says why it cannot, in its words."""
    missing = ref.rsplit("/", 1)[0] + "/no-such-image:1"
    before, deleted = _ids(own_fleet), _deleted(worker)
    lightly = cli(own_redis.url, "--image", missing, "true")
    through_fleet = cli(own_redis.url, "--image", missing, "--tag", "via=fleet", "true")
    assert (lightly.returncode, lightly.stdout, lightly.stderr) == (
        through_fleet.returncode, through_fleet.stdout, through_fleet.stderr)
    assert lightly.returncode == 125 and "no-such-image" in lightly.stderr, lightly.stderr
    assert (_ids(own_fleet), _deleted(worker)) == (before, deleted)  # nothing was made


def test_ctrl_c_while_the_call_runs_ends_it_once_and_leaves_nothing(
    own_redis: RedisServer, own_fleet: Fleet, worker: WorkerProcess, ref: str,
) -> None:
    before, deleted = _ids(own_fleet), len(_deleted(worker))
    started = _log(worker).count("call started")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bashfleet.client.cli", "run", "--image", ref, "sleep 60"],
        env=_env(own_redis.url), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: _log(worker).count("call started") > started, "the call to start")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    _wait(lambda: len(_deleted(worker)) == deleted + 1, "the workspace's deletion")
    _wait(lambda: _ids(own_fleet) == before, "the owner's listing as before")
    assert _log(worker).count("call started") == started + 1  # never sent twice


class SilentRegistry:
    """A TCP server on 127.0.0.1 that takes connections and never answers: a pull from it
    holds its lane thread until `close`."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.taken: list[socket.socket] = []
        self.thread = threading.Thread(target=self._take, daemon=True)
        self.thread.start()

    def _take(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.taken.append(self.server.accept()[0])

    def close(self) -> None:
        self.server.close()
        for conn in self.taken:
            conn.close()
        self.thread.join(10)


def test_ctrl_c_while_the_workspace_is_made_waits_for_it_then_deletes_it(
    own_redis: RedisServer, own_fleet: Fleet, worker: WorkerProcess, ref: str,
) -> None:
    """The owner's one lane thread is held by a pull that hangs, so the CLI's create waits
    behind it; Ctrl-C comes while it waits. The CLI still reads the create's answer once
    the lane is free, deletes what was made, runs no call and exits 130."""
    before, deleted = _ids(own_fleet), len(_deleted(worker))
    started = _log(worker).count("call started")
    silent = SilentRegistry()
    blocker = threading.Thread(target=_create_from, daemon=True,
                               args=(own_fleet, f"127.0.0.1:{silent.port}/hangs:1"))
    blocker.start()
    proc = None
    try:
        _wait(lambda: bool(silent.taken), "the pull that holds the lane")
        channels = _reply_channels(own_redis)
        proc = subprocess.Popen(
            [sys.executable, "-m", "bashfleet.client.cli", "run", "--image", ref, "echo ran"],
            env=_env(own_redis.url), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        # It listens on its reply channel just before it sends the create, Ctrl-C held off.
        _wait(lambda: bool(_reply_channels(own_redis) - channels), "the CLI's create")
        # A CLI that left on Ctrl-C here would leave the workspace the host then makes:
        # its deletion below would never come.
        proc.send_signal(signal.SIGINT)
    finally:
        silent.close()
        blocker.join(120)
        if proc is not None:
            stdout, stderr = proc.communicate(timeout=120)
    assert (proc.returncode, stdout) == (130, ""), stderr
    _wait(lambda: len(_deleted(worker)) == deleted + 1, "the made workspace's deletion")
    _wait(lambda: _ids(own_fleet) == before, "the owner's listing as before")
    assert _log(worker).count("call started") == started  # its call never went


def _create_from(fleet: Fleet, image: str) -> None:
    """A create the fleet client never sends (it pulls first): it pulls in the lane."""
    with contextlib.suppress(BashfleetError):
        fleet._control(HOST, WorkspaceCreateRequest(spec=WorkspaceSpec(image=image)),
                       WorkspaceView, timeout=120)


def _reply_channels(server: RedisServer) -> set[str]:
    with redis.Redis.from_url(server.url, decode_responses=True) as client:
        return set(client.pubsub_channels(names.reply_channel("*")))


def test_the_host_can_be_named(own_redis: RedisServer, worker: WorkerProcess,
                               ref: str) -> None:
    deleted = len(_deleted(worker))
    done = cli(own_redis.url, "--host", HOST, "--image", ref, "echo named")
    assert (done.returncode, done.stdout, done.stderr) == (0, "named\n", "")
    _wait(lambda: len(_deleted(worker)) == deleted + 1, "the workspace's deletion")

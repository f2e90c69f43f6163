"""What the dialect conformance tests share: one worker host, a Fleet, sessions on it.

Every conformance test drives `dialect.call(tool, args, runner=<Fleet>, session=...)`
as an agent harness does, against the session's real Redis and a real worker process
(host `conform`), and checks the text the model reads. The worker is started once per
module (a start costs a second or two) and carries in its own environment a secret and
a plain variable, so tests can see what a command inherits.

The fixture is registered under the name `conform`; a test module imports
`conform_fixture` to use it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil
import pytest

from client import Fleet
from client.dialects import Dialect, Runner, SessionState, ToolText
from client.redis_server import RedisServer
from worker.wire.models import CallResult, RunRequest

from .conftest import WorkerFactory, WorkerProcess, wait_for

#: The host every conformance call runs on.
HOST = "conform"
#: A secret in the worker's environment (matches `*TOKEN*`): never visible to commands.
SECRET_VAR = "CONFORMANCE_DEPLOY_TOKEN"
SECRET_VALUE = secrets.token_hex(12)
#: A plain variable the worker provides (commands see it, and may unset it).
PLAIN_VAR = "CONFORMANCE_WORKER_NOTE"
PLAIN_VALUE = "provided-by-the-worker"


class _ConformanceWorker(WorkerProcess):
    """A worker whose environment also holds a secret and a plain variable.

    It runs calls unsandboxed (`isolation=none`): the seeds describe one machine, where
    the pids a command prints (`echo $!`) are the host's, and a later command may end a
    background job with `kill -9 -<pgid>` (seed 001's reminder). In a sandbox each call
    has a PID namespace of its own (tests/integration/test_engine_sandbox.py), and these
    tests' pid checks would look at other processes.
    """

    def env(self) -> dict[str, str]:
        """The usual worker environment plus SECRET_VAR and PLAIN_VAR, unsandboxed."""
        env = super().env()
        env.update({SECRET_VAR: SECRET_VALUE, PLAIN_VAR: PLAIN_VALUE,
                    "BASHFLEET_ISOLATION": "none"})
        return env


def start_conformance_worker(factory: WorkerFactory) -> WorkerProcess:
    """Start the `conform` worker (registered with the factory, which stops it at the end
    of the session should its module's teardown not have)."""
    worker = _ConformanceWorker(
        HOST, factory.url, state_dir=factory.state_dir(HOST), log_dir=factory.base / "logs",
        concurrency=4,
    )
    worker.start()
    factory.started.append(worker)
    worker.wait_ready(factory.client)
    return worker


class RecordingFleet(Fleet):
    """A `Fleet` that keeps the results of its runs, for the call ids a text leaves out."""

    def __init__(self, redis_url: str) -> None:
        super().__init__(redis_url)
        self.results: list[CallResult] = []

    def execute(self, request: RunRequest, **options: Any) -> CallResult:
        """`Fleet.execute`, its result kept."""
        result = super().execute(request, **options)
        self.results.append(result)
        return result

    @property
    def last(self) -> CallResult:
        """The latest run's result."""
        return self.results[-1]


@dataclass
class Conformance:
    """The fleet a conformance module drives its dialects on."""

    worker: WorkerProcess
    fleet: RecordingFleet
    workdir: Path

    @property
    def runner(self) -> Runner:
        """The Fleet as the dialects' Runner."""
        return self.fleet

    def session(self, **fields: object) -> SessionState:
        """A fresh agent session on the conformance host, in the module's directory."""
        values: dict[str, object] = {"host": HOST, "cwd": str(self.workdir)}
        values.update(fields)
        return SessionState.model_validate(values)

    def call(
        self, dialect: Dialect, tool: str, args: Mapping[str, object], session: SessionState
    ) -> ToolText:
        """One tool call through the fleet."""
        return dialect.call(tool, args, self.runner, session)

    def read_all(self, item_id: str, stream: Literal["stdout", "stderr"] = "stdout") -> str:
        """The whole kept output of a call or job, read from its host in slices."""
        text, offset = "", 0
        while True:
            chunk = self.fleet.read_output(item_id, offset=offset, limit=65536, stream=stream)
            text += chunk.text
            if chunk.eof or chunk.next_offset == offset:
                return text
            offset = chunk.next_offset

    def spill_files(self) -> set[str]:
        """Names of the files in the host's spill directory now."""
        spill = self.worker.state_dir / "spill"
        return {p.name for p in spill.iterdir()} if spill.is_dir() else set()


@pytest.fixture(scope="module", name="conform")
def conform_fixture(
    session_workers: WorkerFactory, redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Conformance]:
    """The conformance host, a fleet client of it, and a working directory it shares.

    The worker lives for one module: every worker also serves the fleet's `any` queue,
    and other modules' tests expect calls without a host to land on their own hosts.
    """
    worker = start_conformance_worker(session_workers)
    fleet = RecordingFleet(redis_server.url)
    try:
        yield Conformance(worker, fleet, tmp_path_factory.mktemp("conform-work"))
    finally:
        fleet.close()
        worker.stop()
        # Jobs a failed test left behind end with its module.
        worker.kill_jobs()


# ------------------------------------------------------------------------- processes


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its parent is dead)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: Sequence[int], timeout: float = 10.0) -> None:
    """Wait until none of `pids` runs."""
    wait_for(lambda: not any(alive(pid) for pid in pids), timeout, f"pids {list(pids)} to end")


def poll(
    call: Callable[[], ToolText], done: Callable[[ToolText], bool], what: str,
    timeout: float = 15.0,
) -> ToolText:
    """Repeat a tool call (a check) until its answer satisfies `done`; that answer."""

    def answer() -> ToolText | None:
        text = call()
        return text if done(text) else None

    return wait_for(answer, timeout, what)


def wait_file(path: Path, text: str, timeout: float = 15.0) -> str:
    """Wait until the file at `path` holds `text`; its content."""

    def holds() -> str | None:
        try:
            content = path.read_text(errors="replace")
        except FileNotFoundError:
            return None
        return content if text in content else None

    return wait_for(holds, timeout, f"{text!r} in {path}")


class Elapsed:
    """Wall time of a block: `with Elapsed() as t: ...; t.seconds`."""

    def __enter__(self) -> Elapsed:
        self.started = time.monotonic()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.started

"""What the dialect conformance tests share: one worker host, a Fleet, sessions on it.

Every conformance test drives `dialect.call(tool, args, runner=<Fleet>, session=...)`
as an agent harness does, against the session's real Redis and a real worker process
(host `conform`, sandboxed as a deployment is), and checks the text the model reads.
An agent session's calls run in one workspace on that host: a pid or a path the text
shows is checked there, as the model's next call would use it (`Conformance.alive`,
`read_in_workspace`), never as a host pid. The worker is started once per
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

import pytest

from bashfleet.client import Fleet
from bashfleet.client.dialects import Dialect, Runner, SessionState, ToolText
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.wire.models import CallResult, RunRequest

from .conftest import WorkerFactory, WorkerProcess, wait_for

#: The host every conformance call runs on.
HOST = "conform"
#: A secret in the worker's environment (matches `*TOKEN*`): never visible to commands.
SECRET_VAR = "CONFORMANCE_DEPLOY_TOKEN"
SECRET_VALUE = secrets.token_hex(12)
#: A plain variable the worker provides and the operator passes on (`BASHFLEET_ENV_PASS`):
#: commands see it, and may unset it.
PLAIN_VAR = "CONFORMANCE_WORKER_NOTE"
PLAIN_VALUE = "provided-by-the-worker"


class _ConformanceWorker(WorkerProcess):
    """A worker whose environment also holds a secret and a plain variable.

    It runs calls sandboxed (the default isolation, as a deployment has it): an agent
    session's calls share one workspace (one PID namespace, one mount view), so the pids
    a dialect shows (`echo $!`, `<pid>`, `kill -9 -<pgid>`) are the workspace's and the
    paths it shows (`Full output:`, `<output_file>`) are read by the session's next
    call. The session's cwd (the module's project directory, under `projects`) is its
    workspace's directory: the test writes and reads its files on the host at the same
    path.
    """

    def env(self) -> dict[str, str]:
        """The usual worker environment plus SECRET_VAR and PLAIN_VAR, which the operator
        names to pass on to calls (a call gets nothing of the worker's environment else)."""
        env = super().env()
        env.update({SECRET_VAR: SECRET_VALUE, PLAIN_VAR: PLAIN_VALUE,
                    "BASHFLEET_ENV_PASS": PLAIN_VAR})
        return env


def start_conformance_worker(factory: WorkerFactory, projects: Path) -> _ConformanceWorker:
    """Start the `conform` worker, workspaces allowed under `projects` (registered with
    the factory, which stops it at the end of the session should its module's teardown
    not have)."""
    worker = _ConformanceWorker(
        HOST, factory.url, state_dir=factory.state_dir(HOST), log_dir=factory.base / "logs",
        concurrency=4, projects=projects,
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

    worker: _ConformanceWorker
    fleet: RecordingFleet
    workdir: Path
    probe: Fleet
    """A client of the same owner for the test's own looks into a session's workspace
    (kept apart from `fleet`, whose `last` result the tests read)."""

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
        """The files kept output may go to on the host now: every workspace's output
        directory (`<workspace root>/.out/<id>/`) and the state directory's spill."""
        found: set[str] = set()
        for folder in (self.worker.workspace_root / ".out", self.worker.state_dir / "spill"):
            if folder.is_dir():
                found |= {str(p) for p in folder.rglob("*") if p.is_file()}
        return found

    # --------------------------------------------- looking into a session's workspace

    def in_workspace(self, session: SessionState, command: str) -> CallResult:
        """Run `command` in the session's workspace (made by its first call), as the
        model's next call would run there, without changing the session; its whole
        output."""
        return self.probe.run(command, workspace=session.workspaces[HOST], output="full")

    def out_dir(self, session: SessionState) -> Path:
        """Where the session's workspace keeps its output files (kept output, jobs'
        logs): the same path on the host and in its calls' view."""
        return self.worker.workspace_root / ".out" / session.workspaces[HOST]

    def alive(self, session: SessionState, pid: int) -> bool:
        """True while `pid` (a number in the session's workspace, as the dialects show
        it) runs there; a zombie is dead."""
        state = self.in_workspace(session, f"ps -o stat= -p {pid} || true").stdout.strip()
        return bool(state) and not state.startswith("Z")

    def wait_gone(self, session: SessionState, pids: Sequence[int],
                  timeout: float = 10.0) -> None:
        """Wait until none of `pids` runs in the session's workspace."""
        wait_for(lambda: not any(self.alive(session, pid) for pid in pids), timeout,
                 f"pids {list(pids)} to end in the workspace")

    def read_in_workspace(self, session: SessionState, path: str | Path) -> str:
        """The file at `path` as the session's next call reads it (`cat`)."""
        result = self.in_workspace(session, f"cat {path}")
        assert result.exit_code == 0, result.stderr
        return result.stdout

    def wait_file(self, session: SessionState, path: str | Path, text: str,
                  timeout: float = 15.0) -> str:
        """Wait until the file at `path`, read by a call in the session's workspace,
        holds `text`; its content."""

        def holds() -> str | None:
            result = self.in_workspace(session, f"cat {path}")
            return result.stdout if result.exit_code == 0 and text in result.stdout else None

        return wait_for(holds, timeout, f"{text!r} in {path}, read in the workspace")

    def end_workspaces(self) -> None:
        """Delete every workspace this owner has (its sessions' ones and their
        processes)."""
        for view in self.probe.workspaces():
            self.probe.open_workspace(view.id).delete()


@pytest.fixture(scope="module", name="conform")
def conform_fixture(
    session_workers: WorkerFactory, redis_server: RedisServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Conformance]:
    """The conformance host, a fleet client of it, and a working directory it shares.

    The worker lives for one module: every worker also serves the fleet's `any` queue,
    and other modules' tests expect calls without a host to land on their own hosts.
    The working directory is a project under the worker's allowed root, the run user's
    (as an operator gives a build directory to it): each session's workspace is that
    directory.
    """
    worker = start_conformance_worker(session_workers,
                                      tmp_path_factory.mktemp("conform-projects"))
    workdir = worker.project("work")
    fleet = RecordingFleet(redis_server.url)
    probe = Fleet(redis_server.url)
    conformance = Conformance(worker, fleet, workdir, probe)
    try:
        yield conformance
    finally:
        try:
            conformance.end_workspaces()
        finally:
            probe.close()
            fleet.close()
            worker.stop()
            # Jobs and workspaces a failed test left behind end with its module.
            worker.kill_jobs()


# ------------------------------------------------------------------------- processes


def poll(
    call: Callable[[], ToolText], done: Callable[[ToolText], bool], what: str,
    timeout: float = 15.0,
) -> ToolText:
    """Repeat a tool call (a check) until its answer satisfies `done`; that answer."""

    def answer() -> ToolText | None:
        text = call()
        return text if done(text) else None

    return wait_for(answer, timeout, what)


class Elapsed:
    """Wall time of a block: `with Elapsed() as t: ...; t.seconds`."""

    def __enter__(self) -> Elapsed:
        self.started = time.monotonic()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.started

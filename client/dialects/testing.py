"""A fake `Runner` for tests: records every request, answers with canned results.

Shipped next to the real thing (the fleet) so every layer above the dialects (the MCP
server, the CLI's schema command) can test against the same fake. Sessions' shells are
kept in memory with the fleet's own rules (`bashfleet.client.shells`): a request with a `session`
is recorded as the fleet would send it (host, cwd and variables of the shell filled in),
and its result changes the shell as the fleet's would.

    runner = FakeRunner(run=[CallResult(call_id="c1", host="h", exit_code=0, stdout="hi\\n")])
    dialect.call("bash", {"command": "echo hi"}, runner, SessionState())
    runner.last().request.timeout
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from bashfleet.client.shells import ShellState, apply_change, change_of, fill_request
from bashfleet.worker.wire.control import (
    CheckRequest,
    KillRequest,
    ReadOutputRequest,
    SessionOutput,
    WriteStdinRequest,
)
from bashfleet.worker.wire.models import CallResult, CheckResult, OutputChunk, RunRequest

Request = RunRequest | CheckRequest | KillRequest | ReadOutputRequest | WriteStdinRequest


@dataclass(frozen=True)
class FakeCall:
    """One request the fake received."""

    request: Request

    @property
    def method(self) -> str:
        """`run`, `check`, `kill`, `read` or `write`."""
        return {
            RunRequest: "run", CheckRequest: "check", KillRequest: "kill",
            ReadOutputRequest: "read", WriteStdinRequest: "write",
        }[type(self.request)]

    @property
    def options(self) -> dict[str, object]:
        """The request's fields but its command or id, as given (models, not dumps)."""
        return {
            name: getattr(self.request, name)
            for name in type(self.request).model_fields
            if name not in ("command", "id")
        }

    @property
    def target(self) -> str:
        """The command (run) or job or call id (check, kill, read)."""
        if isinstance(self.request, RunRequest):
            return self.request.command
        return self.request.id


class FakeRunner:
    """Answers `execute`, `check_job`, `kill_job` and `write_stdin_request` from queues of
    canned results.

    An empty queue answers with a plain success: exit code 0 for a run, a finished job
    with exit code 0 for a check, one ended by SIGTERM for a kill. `error`, when set,
    is raised by every call (a fleet that cannot be reached).
    """

    def __init__(
        self,
        *,
        run: Iterable[CallResult] = (),
        check: Iterable[CheckResult] = (),
        kill: Iterable[CheckResult] = (),
        read: Iterable[OutputChunk] = (),
        write: Iterable[SessionOutput | Exception] = (),
        error: Exception | None = None,
    ) -> None:
        self.run_results = list(run)
        self.check_results = list(check)
        self.kill_results = list(kill)
        self.read_results = list(read)
        self.write_results = list(write)
        self.error = error
        self.calls: list[FakeCall] = []
        self.cancelled: list[str] = []
        """Ids of the calls `cancel` was asked to stop."""
        self.shells: dict[str, ShellState] = {}
        """Sessions' shells, by session id (as the fleet keeps them in Redis)."""
        self._ids = itertools.count(1)

    def _record(self, request: Request) -> None:
        self.calls.append(FakeCall(request))
        if self.error is not None:
            raise self.error

    def execute(self, request: RunRequest) -> CallResult:
        """Record the request (in its session's shell); the next canned result, or a
        plain success."""
        session = request.session
        if session is not None:
            request = fill_request(self.shells.get(session, ShellState()), request)
        self._record(request)
        if self.run_results:
            result = self.run_results.pop(0)
        else:
            result = CallResult(call_id=f"fake-{next(self._ids)}", host="fake", exit_code=0)
        if session is not None:
            self.shells[session] = apply_change(
                self.shells.get(session, ShellState()), change_of(result)
            )
        return result

    def check_job(self, request: CheckRequest) -> CheckResult:
        """Record the request; the next canned result, or a finished job."""
        self._record(request)
        if self.check_results:
            return self.check_results.pop(0)
        return CheckResult(
            id=request.id, host="fake", running=False, exit_code=0, offset=request.offset or 0
        )

    def kill_job(self, request: KillRequest) -> CheckResult:
        """Record the request; the next canned result, or a job that ended on SIGTERM."""
        self._record(request)
        if self.kill_results:
            return self.kill_results.pop(0)
        return CheckResult(id=request.id, host="fake", running=False, signal=15)

    def read_chunk(self, request: ReadOutputRequest) -> OutputChunk:
        """Record the request; the next canned chunk, or an empty file."""
        self._record(request)
        if self.read_results:
            return self.read_results.pop(0)
        return OutputChunk(
            path=f"/fake/{request.id}.out", offset=0, next_offset=0, size=0, text="", eof=True
        )

    def cancel(self, call_id: str) -> bool:
        """Record a cancel (as the MCP server asks the fleet); True, as for a running call."""
        self.cancelled.append(call_id)
        return True

    def write_stdin_request(self, request: WriteStdinRequest) -> SessionOutput:
        """Record the request; the next canned output (an exception in the queue is
        raised), or a session still running that printed nothing."""
        self._record(request)
        if self.write_results:
            answer = self.write_results.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer
        return SessionOutput(id=request.id, host="fake", running=True, stdin="pty",
                             stdin_open=True)

    def last(self) -> FakeCall:
        """The most recent call."""
        return self.calls[-1]

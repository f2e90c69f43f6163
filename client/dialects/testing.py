"""A fake `Runner` for tests: records every request, answers with canned results.

Shipped next to the real thing (the fleet) so every layer above the dialects (the MCP
server, the CLI's schema command) can test against the same fake.

    runner = FakeRunner(run=[CallResult(call_id="c1", host="h", exit_code=0, stdout="hi\\n")])
    dialect.call("bash", {"command": "echo hi"}, runner, SessionState())
    runner.last().request.timeout
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from worker.wire.control import CheckRequest, KillRequest, SessionOutput, WriteStdinRequest
from worker.wire.models import CallResult, CheckResult, RunRequest

Request = RunRequest | CheckRequest | KillRequest | WriteStdinRequest


@dataclass(frozen=True)
class FakeCall:
    """One request the fake received."""

    request: Request

    @property
    def method(self) -> str:
        """`run`, `check`, `kill` or `write`."""
        return {
            RunRequest: "run", CheckRequest: "check", KillRequest: "kill",
            WriteStdinRequest: "write",
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
        """The command (run) or job id (check, kill)."""
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
        write: Iterable[SessionOutput | Exception] = (),
        error: Exception | None = None,
    ) -> None:
        self.run_results = list(run)
        self.check_results = list(check)
        self.kill_results = list(kill)
        self.write_results = list(write)
        self.error = error
        self.calls: list[FakeCall] = []
        self._ids = itertools.count(1)

    def _record(self, request: Request) -> None:
        self.calls.append(FakeCall(request))
        if self.error is not None:
            raise self.error

    def execute(self, request: RunRequest) -> CallResult:
        """Record the request; the next canned result, or a plain success."""
        self._record(request)
        if self.run_results:
            return self.run_results.pop(0)
        return CallResult(call_id=f"fake-{next(self._ids)}", host="fake", exit_code=0)

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

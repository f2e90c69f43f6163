"""A fake `Runner` for tests: records every call, answers with canned results.

Shipped next to the real thing (the fleet) so every layer above the dialects (the MCP
server, the CLI's schema command) can test against the same fake.

    runner = FakeRunner(run=[CallResult(call_id="c1", host="h", exit_code=0, stdout="hi\\n")])
    dialect.call("bash", {"command": "echo hi"}, runner, SessionState())
    runner.calls[0].options["timeout"]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from client.dialects.base import given
from worker.wire.models import CallResult, CheckResult, Policy


@dataclass(frozen=True)
class FakeCall:
    """One call the fake received."""

    method: Literal["run", "check", "kill"]
    target: str
    """The command (run) or job id (check, kill)."""
    options: dict[str, object] = field(default_factory=dict)


class FakeRunner:
    """Answers `run`, `check` and `kill` from queues of canned results.

    An empty queue answers with a plain success: exit code 0 for `run`, a finished job
    with exit code 0 for `check` and `kill`. `error`, when set, is raised by every call
    (a fleet that cannot be reached).
    """

    def __init__(
        self,
        *,
        run: Iterable[CallResult] = (),
        check: Iterable[CheckResult] = (),
        kill: Iterable[CheckResult] = (),
        error: Exception | None = None,
    ) -> None:
        self.run_results = list(run)
        self.check_results = list(check)
        self.kill_results = list(kill)
        self.error = error
        self.calls: list[FakeCall] = []
        self._ids = itertools.count(1)

    def run(
        self,
        command: str,
        *,
        host: str | None = None,
        mode: str = "default",
        timeout: float | None = None,
        cwd: str | None = None,
        session: str | None = None,
        policy: Policy | None = None,
        env: dict[str, str] | None = None,
        head: int | None = None,
        tail: int | None = None,
        unset_env: Sequence[str] = (),
        capture_state: bool = False,
    ) -> CallResult:
        """Record the call; the next canned result, or a plain success."""
        options: dict[str, object] = {
            "host": host,
            "mode": mode,
            "timeout": timeout,
            "cwd": cwd,
            "session": session,
            "policy": policy,
            "env": env,
            "head": head,
            "tail": tail,
        }
        # Later options are recorded only when used, so recorded calls of dialects
        # that never use them compare as before.
        options.update(given(unset_env=tuple(unset_env), capture_state=capture_state))
        self.calls.append(FakeCall("run", command, options))
        if self.error is not None:
            raise self.error
        if self.run_results:
            return self.run_results.pop(0)
        return CallResult(call_id=f"fake-{next(self._ids)}", host="fake", exit_code=0)

    def check(
        self,
        id: str,
        *,
        grep: str | None = None,
        offset: int | None = None,
        stderr_offset: int | None = None,
        policy: Policy | None = None,
    ) -> CheckResult:
        """Record the call; the next canned result, or a finished job."""
        options: dict[str, object] = {"grep": grep, "offset": offset}
        options.update(given(stderr_offset=stderr_offset, policy=policy))
        self.calls.append(FakeCall("check", id, options))
        if self.error is not None:
            raise self.error
        if self.check_results:
            return self.check_results.pop(0)
        return CheckResult(id=id, host="fake", running=False, exit_code=0, offset=offset or 0)

    def kill(
        self, id: str, *, offset: int | None = None, policy: Policy | None = None
    ) -> CheckResult:
        """Record the call; the next canned result, or a job that ended on SIGTERM."""
        self.calls.append(FakeCall("kill", id, given(offset=offset, policy=policy)))
        if self.error is not None:
            raise self.error
        if self.kill_results:
            return self.kill_results.pop(0)
        return CheckResult(id=id, host="fake", running=False, signal=15)

    def last(self) -> FakeCall:
        """The most recent call."""
        return self.calls[-1]

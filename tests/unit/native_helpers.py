"""What the native dialect's tests share: the dialect, a job, a call through it, and
the results and counts a fake runner answers with."""

from __future__ import annotations

from bashfleet.client.dialects import NativeDialect, SessionState, ToolText
from bashfleet.client.dialects.testing import FakeRunner
from bashfleet.worker.wire.models import CallResult, JobHandle, TruncationInfo

NATIVE = NativeDialect()
JOB = JobHandle(id="j1", host="h2", pid=4242, pgid=4242, output_path="/jobs/j1.log")


def bash(
    result: CallResult | None = None,
    args: dict[str, object] | None = None,
    session: SessionState | None = None,
) -> tuple[ToolText, FakeRunner, SessionState]:
    runner = FakeRunner(run=[result] if result else [])
    session = session if session is not None else SessionState()
    answer = NATIVE.call("bash", args if args is not None else {"command": "make"}, runner, session)
    return answer, runner, session


def done(**fields: object) -> CallResult:
    fields.setdefault("duration_s", 0.5)
    return CallResult(call_id="c1", host="h1", **fields)


def tail(
    total: int,
    shown: int,
    total_bytes: int = 400000,
    shown_bytes: int = 51200,
    limit: str = "lines",
) -> TruncationInfo:
    return TruncationInfo(
        direction="tail",
        truncated=shown < total,
        limit=limit if shown < total else None,
        total_lines=total,
        total_bytes=total_bytes,
        shown_lines=shown,
        shown_bytes=shown_bytes,
        shown_ranges=((total - shown + 1, total),) if shown else (),
    )

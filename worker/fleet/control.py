"""What the control calls do on the owning host: one function per request model.

Each takes the worker's `Runtime` and its request (`worker.wire.control`), and returns
its response model or raises a `ToolError` (`JobError`): the task turns that into the
reply's `error`. Served by the control consumer (`bashfleet.<host>.ctl`), apart from
the command slots, so they answer at once even when every slot is busy.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from worker.engine import jobs, running
from worker.engine.capture import read_slice
from worker.engine.secrets import worker_redaction
from worker.fleet import recovery, registry
from worker.settings import Settings
from worker.wire import names
from worker.wire.control import (
    MAX_READ_LIMIT,
    CancelRequest,
    CancelResult,
    CheckRequest,
    JobList,
    JobsRequest,
    KillRequest,
    ReadOutputRequest,
)
from worker.wire.models import CheckResult, JobRecord, OutputChunk, Truncation
from worker.wire.names import CallState, JobState
from worker.wire.records import job_offsets, job_view

#: Grace between SIGTERM and SIGKILL when a job is killed through the fleet.
KILL_GRACE_S = 2.0


@dataclass(frozen=True)
class Runtime:
    """What every task of this worker process needs."""

    settings: Settings
    redis: redis.Redis
    instance: str


JobAction = Callable[[Runtime, JobRecord, int, int, Truncation | None], CheckResult]


def check(rt: Runtime, request: CheckRequest) -> CheckResult:
    """A job's state and its output since the offset (None: since the last check)."""

    def act(
        rt: Runtime, record: JobRecord, start: int, err_start: int, cut: Truncation | None
    ) -> CheckResult:
        return jobs.check_job(
            record, offset=start, stderr_offset=err_start, grep=request.grep, policy=cut,
            settings=rt.settings,
        )

    return _job_action(rt, request, act)


def kill(rt: Runtime, request: KillRequest) -> CheckResult:
    """End a job (group SIGTERM, grace, SIGKILL, marker sweep); its final state."""

    def act(
        rt: Runtime, record: JobRecord, start: int, err_start: int, cut: Truncation | None
    ) -> CheckResult:
        return jobs.kill_job(
            record, offset=start, stderr_offset=err_start, grace_s=KILL_GRACE_S, policy=cut,
            settings=rt.settings,
        )

    return _job_action(rt, request, act, always_sync=True)


def _job_action(
    rt: Runtime, request: CheckRequest | KillRequest, act: JobAction, *,
    always_sync: bool = False,
) -> CheckResult:
    """Check or kill a job from its local record; keep the offsets and, once it has
    ended (or always, for a kill), its record in Redis up to date."""
    record = jobs.load_record(request.id, rt.settings)
    start, err_start = _offsets(rt, request)
    result = act(rt, record, start, err_start, request.truncation)
    registry.save_offsets(rt.redis, request.id, result.offset, result.stderr_offset)
    if always_sync or not result.running:
        recovery.sync_job(rt.redis, record)
    return result


def _offsets(rt: Runtime, request: CheckRequest | KillRequest) -> tuple[int, int]:
    """Where to read from: as asked, else where the last check (by any client) stopped."""
    stored, stored_err = job_offsets(registry.job_fields(rt.redis, request.id))
    start = stored if request.offset is None else request.offset
    if request.stderr_offset is not None:
        return start, request.stderr_offset
    # Reading stdout from the start reads stderr from the start too.
    return start, 0 if request.offset == 0 else stored_err


def read_output(rt: Runtime, request: ReadOutputRequest) -> OutputChunk:
    """A slice of a job's output file or of a call's spill file on this host."""
    path = _output_path(rt.settings, request.id, request.stream)
    pattern = _compile(request.grep)
    size = path.stat().st_size
    start = min(request.offset, size)
    size_to_read = min(request.limit, MAX_READ_LIMIT)
    text, end, size = read_slice(path, start, size_to_read, worker_redaction(rt.settings))
    if pattern is not None:
        text = "".join(ln for ln in text.splitlines(keepends=True) if pattern.search(ln))
    return OutputChunk(
        path=str(path), offset=start, next_offset=end, size=size, text=text, eof=end >= size
    )


def _output_path(settings: Settings, item_id: str, stream: str) -> Path:
    """The file of a job or call id: only files this worker wrote are ever read."""
    if not names.valid_id(item_id):
        raise jobs.JobError("not_found", f"no such job or call: {item_id!r}")
    try:
        record = jobs.load_record(item_id, settings)
    except jobs.JobError:
        record = None
    if record is not None:
        chosen = record.output_path if stream == "stdout" else record.stderr_path
        if chosen is None:
            raise jobs.JobError("not_found", f"job {item_id} has no separate stderr")
        return Path(chosen)
    suffixes = (".out", ".log") if stream == "stdout" else (".err",)
    for suffix in suffixes:
        candidate = settings.spill_dir / f"{item_id}{suffix}"
        if candidate.is_file():
            return candidate
    raise jobs.JobError("not_found", f"no job or kept output for {item_id!r} on {settings.host}")


def _compile(grep: str | None) -> re.Pattern[str] | None:
    if not grep:
        return None
    try:
        return re.compile(grep)
    except re.error as exc:
        raise jobs.JobError("invalid", f"invalid regular expression {grep!r}: {exc}") from None


def cancel(rt: Runtime, request: CancelRequest) -> CancelResult:
    """Kill the processes of a running foreground call; its exec task then answers."""
    previous = registry.mark_call(
        rt.redis, request.call_id, CallState.CANCELLING, only_from=(CallState.RUNNING,)
    )
    entry = running.load(rt.settings, request.call_id)
    if entry is None:
        # Not spawned (or not on disk) yet: its running hook sees `cancelling` and
        # kills it (within the engine's first wake-up).
        return CancelResult(cancelled=previous == CallState.RUNNING, state=previous)
    survivors = running.kill(entry)
    return CancelResult(
        cancelled=True, state=CallState.CANCELLING, survivors=tuple(survivors)
    )


def list_jobs(rt: Runtime, request: JobsRequest) -> JobList:
    """This host's jobs, fresh from its disk (and published to Redis)."""
    del request
    views = []
    records = jobs.local_records(rt.settings)
    # One round trip for all of them (10,000 jobs: 2.2 s one by one, see bench_scale).
    known = registry.jobs_fields(rt.redis, [record.id for record in records])
    for record, stored in zip(records, known, strict=True):
        if not stored:
            continue  # expired from the fleet's listing: too old to show
        fields = stored
        if stored.get("state") != JobState.ENDED:
            recovery.sync_job(rt.redis, record)
            fields = registry.job_fields(rt.redis, record.id)
        view = job_view(fields)
        if view is not None:
            views.append(view)
    return JobList(jobs=tuple(views))

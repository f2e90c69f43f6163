"""How the registry's Redis hashes read as wire models: pure functions, no Redis.

Both sides read the same hashes (a worker lists its jobs, a client falls back on what
Redis knows when a host is down), so both parse them here.
"""

from __future__ import annotations

from collections.abc import Mapping

from worker.wire.models import HostInfo, JobRecord, JobView, SandboxProbe
from worker.wire.names import JobState


def text(mapping: Mapping[str, str], name: str) -> str | None:
    """A hash field; None for a missing or empty one (None is stored as "")."""
    value = mapping.get(name)
    return value if value not in (None, "") else None


def integer(mapping: Mapping[str, str], name: str) -> int | None:
    """A hash field as an int, or None."""
    value = text(mapping, name)
    return int(value) if value is not None else None


def number(mapping: Mapping[str, str], name: str) -> float | None:
    """A hash field as a float, or None."""
    value = text(mapping, name)
    return float(value) if value is not None else None


def job_offsets(fields: Mapping[str, str]) -> tuple[int, int]:
    """The offsets the last check of a job stopped at (0, 0 before any check)."""
    return integer(fields, "offset") or 0, integer(fields, "stderr_offset") or 0


def job_view(fields: Mapping[str, str], *, host_alive: bool = True) -> JobView | None:
    """A listing entry from a job hash; a running job of a dead host shows `unknown`."""
    raw = fields.get("record")
    if not raw:
        return None
    record = JobRecord.model_validate_json(raw)
    state = fields.get("state", JobState.UNKNOWN)
    note = text(fields, "note")
    if state == JobState.RUNNING and not host_alive:
        state = JobState.UNKNOWN
        note = f"host {record.host} is down; the job was running when last seen"
    if state not in tuple(JobState):
        state = JobState.UNKNOWN
    return JobView(
        id=record.id, host=record.host, pid=record.pid, pgid=record.pgid,
        command=record.command, cwd=record.cwd, output_path=record.output_path,
        started_at=record.started_at, state=JobState(state),
        running=None if state == JobState.UNKNOWN else state == JobState.RUNNING,
        exit_code=integer(fields, "exit_code"), signal=integer(fields, "signal"),
        ended_at=number(fields, "ended_at"), note=note, call_id=record.call_id,
        owner=record.owner, tags=record.tags,
    )


def host_info(
    host: str, record: Mapping[str, str], token: str | None, busy: int
) -> HostInfo | None:
    """A host as listings show it, from its record, its lock token and its busy set."""
    if not record:
        return None
    holds = token is not None and token == record.get("instance")
    labels = tuple(part for part in record.get("labels", "").split(",") if part)
    return HostInfo(
        host=host,
        alive=token is not None,
        ready=holds and bool(record.get("exec_ready")) and bool(record.get("ctl_ready")),
        slots=integer(record, "concurrency") or 0,
        busy=busy if token is not None else 0,
        labels=labels,
        version=record.get("version", ""),
        pid=integer(record, "pid"),
        machine=record.get("machine", ""),
        started_at=number(record, "started_at"),
        heartbeat_at=number(record, "heartbeat_at"),
        sandbox=_sandbox(record.get("sandbox")),
    )


def _sandbox(raw: str | None) -> SandboxProbe | None:
    if not raw:
        return None
    try:
        return SandboxProbe.model_validate_json(raw)
    except ValueError:
        return None  # a newer worker's shape: show the host without it

"""Job events: a background job started, a job ended. Workers add them to a Redis
stream and publish them (`worker.fleet.registry.save_job`); any client hears them
(`client.events`): `Fleet.wait`, `Fleet.events`, `bashfleet wait` / `bashfleet events`.

An event travels sealed (`seal_event`: `<seals>` on a first line, then its JSON, with
the worker's keys); a listener opens it with `open_event` and drops, with a warning,
one that does not verify: a Redis writer cannot make a client hear of an end that did
not happen.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field, ValidationError

from worker.wire import auth
from worker.wire.models import JobRecord, JobStatus, Model, Tags

log = logging.getLogger("bashfleet")

EventKind = Literal["started", "ended", "denied"]


class JobEvent(Model):
    """One job event, as listeners get it."""

    kind: EventKind
    """`started` (the job runs), `ended` (it exited, was killed, or its end was found
    while nobody watched), or `denied`: a workspace's network policy refused a
    connection or a name (`target`; `job_id` is then the workspace's id)."""
    job_id: str
    """The job's id."""
    host: str
    """Host that owns the job."""
    at: float
    """When it happened (seconds since the epoch, the host's clock)."""
    command: str
    """The job's command."""
    output_path: str
    """The job's output file, on `host`."""
    call_id: str | None = None
    """The call that started it."""
    exit_code: int | None = None
    """Exit status (ended, when it exited)."""
    signal: int | None = None
    """Terminating signal (ended, when a signal ended it)."""
    duration_s: float | None = None
    """Seconds from its start to its end (ended)."""
    note: str | None = None
    """Why the end is incomplete, when it is (its status was unknown)."""
    tags: Tags = Field(default_factory=dict)
    """The job's tags."""
    target: str | None = None
    """What was refused (denied): `name`, `name:port`, or `address:port/proto`."""
    seq: str = ""
    """The event's id in the stream (`<ms>-<n>`, increasing): resume a listing after it.
    Empty until Redis assigned it."""


def started_event(record: JobRecord) -> JobEvent:
    """The event of a job that started."""
    return JobEvent(
        kind="started", job_id=record.id, host=record.host, at=record.started_at,
        command=record.command, output_path=record.output_path, call_id=record.call_id,
        tags=record.tags,
    )


def ended_event(record: JobRecord, status: JobStatus | None) -> JobEvent:
    """The event of a job that ended (`status` None: its status is not known)."""
    ended_at = status.ended_at if status is not None else record.started_at
    return JobEvent(
        kind="ended", job_id=record.id, host=record.host, at=ended_at,
        command=record.command, output_path=record.output_path, call_id=record.call_id,
        exit_code=status.exit_code if status else None,
        signal=status.signal if status else None,
        duration_s=round(max(0.0, ended_at - record.started_at), 3),
        note=status.note if status else "exit status unknown", tags=record.tags,
    )


def denied_event(ws_id: str, host: str, at: float, target: str, kind: str, *,
                 tags: dict[str, str] | None = None) -> JobEvent:
    """The event of a refusal by a workspace's network policy (`kind`: `dns`, `connect`
    or `address`, how it was refused)."""
    return JobEvent(kind="denied", job_id=ws_id, host=host, at=at, target=target,
                    command=f"{kind} {target}", output_path="", tags=tags or {})


def event_matches(
    event: JobEvent, *, host: str | None = None, kinds: tuple[EventKind, ...] = (),
    tags: dict[str, str] | None = None, job_id: str | None = None,
) -> bool:
    """True when `event` passes the filters (None / empty: any)."""
    if host is not None and event.host != host:
        return False
    if kinds and event.kind not in kinds:
        return False
    if job_id is not None and event.job_id != job_id:
        return False
    return all(event.tags.get(name) == value for name, value in (tags or {}).items())


def seal_event(keys: Sequence[str], event: JobEvent) -> str:
    """An event as a worker adds and publishes it: its seals, a newline, its JSON."""
    body = event.model_dump_json()
    return f"{auth.mark(keys, auth.EVENT, event.job_id, body)}\n{body}"


def open_event(keys: Mapping[str, str], sealed: str, seq: str) -> JobEvent | None:
    """The event of a stream entry or channel message (`seq`: its stream id), its seal
    checked with `keys`. None for what is not an event of ours (malformed, a newer
    format) and for one that does not verify (dropped with a warning, never believed)."""
    marked, newline, body = sealed.partition("\n")
    if not newline:  # no seal line (an older worker's): only a keyless client takes it
        marked, body = "", sealed
    try:
        event = JobEvent.model_validate_json(body)
    except ValidationError:
        return None
    try:
        auth.check_mark(keys, auth.EVENT, event.job_id, body, marked)
    except auth.AuthError as exc:
        log.warning("job event %s of job %s does not verify (%s); dropped",
                    seq, event.job_id, exc.message)
        return None
    return event.model_copy(update={"seq": seq})

"""Job events: a background job started, a job ended. Workers add them to a Redis
stream and publish them (`bashfleet.worker.fleet.registry.save_job`); any client hears them
(`client.events`): `Fleet.wait`, `Fleet.events`, `bashfleet wait` / `bashfleet events`.

An event travels locked (`seal_event`: encrypted for the worker's keys and its job's
owner's, `auth.lock`); a listener opens it with `open_event`, skips another owner's
(it cannot read them) and drops, with a warning, one that does not verify: a Redis
writer cannot make a client hear of an end that did not happen.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field, ValidationError

from bashfleet.worker.wire import auth
from bashfleet.worker.wire.models import JobRecord, JobStatus, Model, Tags

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


#: The name every event is locked under (its job id is inside, under the lock).
EVENT_NAME = "job-event"


def seal_event(keys: Sequence[str], event: JobEvent) -> str:
    """An event as a worker adds and publishes it: locked (`auth.lock`) for `keys`, the
    workers', the admin's and the job's owner's (`owner_keys.SealingKeys.for_owner`):
    every client hears every event, and opens only its owner's."""
    return auth.lock(keys, auth.EVENT, EVENT_NAME, event.model_dump_json())


def open_event(keys: Mapping[str, str], sealed: str, seq: str) -> JobEvent | None:
    """The event of a stream entry or channel message (`seq`: its stream id), opened
    with `keys`. None for another owner's (quietly), for what is not an event of ours
    (malformed, a newer format) and for one that does not verify (dropped with a
    warning, never believed)."""
    try:
        body = auth.unlock(keys, auth.EVENT, EVENT_NAME, sealed)
    except auth.AuthError as exc:
        if exc.reason != "unknown_key":
            log.warning("job event %s does not verify (%s); dropped", seq, exc.message)
        return None
    try:
        event = JobEvent.model_validate_json(body)
    except ValidationError:
        return None
    return event.model_copy(update={"seq": seq})

"""Where a call goes and who owns an id: pure functions over what was looked up in Redis.

- A call's *placement* (a host, a pool label, or anywhere) becomes a *route*: the
  queue its message goes to and the host it targets (`route`), or HostUnavailable when
  nobody would take it. A workspace will be one more placement: its host, named.
- An id a caller gives (a job, the call that started a job, a call that kept output)
  is resolved to the host that owns it from one lookup (`IdLookup`): `job_target`,
  `output_host`, `ask_every_host`, `call_record_of`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bashfleet.client.errors import CallRejected, HostUnavailable, UnknownCall, UnknownJob
from bashfleet.worker.wire import names

if TYPE_CHECKING:
    from bashfleet.worker.wire.models import HostInfo, RunRequest


@dataclass(frozen=True)
class Placement:
    """Where a call asks to run: a named host, any host of a pool label, or any host."""

    host: str | None = None
    label: str | None = None

    @classmethod
    def of(cls, request: RunRequest) -> Placement:
        """A request's placement (its session's pin already filled in)."""
        return cls(host=request.host, label=request.label)

    def validated(self) -> Placement:
        """Itself, or CallRejected for a host or label that is not a valid name."""
        try:
            if self.host is not None:
                names.validate_host(self.host)
            if self.label is not None:
                names.validate_label(self.label)
        except ValueError as exc:
            raise CallRejected(str(exc)) from None
        return self

    @property
    def needs_live_hosts(self) -> bool:
        """True when routing needs the live hosts (no host named)."""
        return self.host is None


@dataclass(frozen=True)
class Route:
    """Where a call's message goes."""

    queue: str
    target: str | None
    """The host it must run on (None: any host of the queue)."""
    label: str | None = None
    """The pool it was sent to, if any."""


def route(placement: Placement, live: Iterable[str] = (),
          infos: Iterable[HostInfo] = ()) -> Route:
    """The route of a placement, given the live hosts and (for a label) their records.

    A named host's liveness is checked when the call is sent (in the same round trip
    that records it), not here.
    """
    placement = placement.validated()
    if placement.host is not None:
        return Route(names.exec_queue(placement.host), placement.host)
    if placement.label is not None:
        if not pool_members(placement.label, infos):
            raise HostUnavailable(f"no live worker has the label {placement.label!r}")
        return Route(names.pool_queue(placement.label), None, placement.label)
    if not list(live):
        raise HostUnavailable("no live worker in the fleet")
    return Route(names.ANY_EXEC_QUEUE, None)


def pool_members(label: str, infos: Iterable[HostInfo]) -> list[str]:
    """The live hosts among `infos` that carry `label`."""
    return [info.host for info in infos if info.alive and label in info.labels]


def host_down(host: str, live: Iterable[str]) -> HostUnavailable:
    """The error of a call or control request for a host no worker holds."""
    named = ", ".join(live) or "none"
    return HostUnavailable(f"no live worker for host {host!r} (live hosts: {named})", host=host)


# ----------------------------------------------------------------------- owner lookups


@dataclass(frozen=True)
class CallProgress:
    """How far a call got, as its record says (`bashfleet run`'s spinner shows it)."""

    state: str | None
    """`queued` until a worker takes it, `running`, then how it ended (`CallState`);
    None for an id no call has."""
    host: str | None
    """The host it was sent to or runs on; None while it waits for any host."""

    @property
    def started(self) -> bool:
        """True once a worker took it."""
        return self.state not in (None, names.CallState.QUEUED)


@dataclass(frozen=True)
class IdLookup:
    """What Redis knows of an id, looked up in one go: is it a job (its host), is it a
    call (its record), and the host of the job that call started."""

    job_host: str | None = None
    call: Mapping[str, str] | None = None
    call_job_host: str | None = None

    @property
    def call_job_id(self) -> str | None:
        """The job the call started (or became), if any."""
        return (self.call or {}).get("job_id") or None


def checked_id(item_id: str, what: str) -> str:
    """The id, or UnknownJob for one that cannot be an id (never looked up)."""
    if not names.valid_id(item_id):
        raise UnknownJob(f"no such {what}: {item_id!r}", item_id=item_id)
    return item_id


def job_target(item_id: str, found: IdLookup) -> tuple[str, str]:
    """(host, job id) of a job id, or of the call that started the job."""
    if found.job_host is not None:
        return found.job_host, item_id
    if found.call_job_id is not None and found.call_job_host is not None:
        return found.call_job_host, found.call_job_id
    raise unknown_job(item_id)


def output_host(item_id: str, found: IdLookup) -> str:
    """The host keeping the output of a job or call id."""
    host = found.job_host or (found.call or {}).get("host") or None
    if host is None:
        raise unknown_output(item_id)
    return host


def unknown_output(item_id: str) -> UnknownJob:
    """What `read_output` of an id no host keeps output for raises."""
    return UnknownJob(f"no such job or call: {item_id} (unknown or expired)", item_id=item_id)


def ask_every_host(found: IdLookup) -> bool:
    """True when Redis knows nothing of an id (an older call's record expired: its kept
    output is on its host's disk, so the live hosts are asked)."""
    return found.job_host is None and not found.call


def checked_call_id(call_id: str) -> str:
    """The call id, or UnknownCall for one that cannot be an id."""
    if not names.valid_id(call_id):
        raise UnknownCall(f"no such call: {call_id!r}", call_id=call_id)
    return call_id


def call_record_of(call_id: str, record: Mapping[str, str]) -> Mapping[str, str]:
    """A call's record, or UnknownCall when Redis has none (never sent, or expired)."""
    if not record:
        raise unknown_call(call_id)
    return record


def unknown_call(call_id: str) -> UnknownCall:
    """What an id no call of this client's has raises (one that no call has, and another
    owner's call alike: its existence is not told)."""
    return UnknownCall(f"no such call: {call_id} (unknown or expired)", call_id=call_id)


def unknown_job(job_id: str) -> UnknownJob:
    """What an id no job of this client's has raises (one that no job has, and another
    owner's job alike)."""
    return UnknownJob(f"no such job: {job_id} (unknown or expired)", item_id=job_id)

"""The client's side of the fleet's Redis state, with no I/O: how the replies of its
pipelined reads read as models (the keys and arguments of the scripts it sends calls and
withdraws them with, `SEND` and `WITHDRAW`, are `bashfleet.client._core.sending`'s).

What a worker publishes (host records, job hashes) is sealed by it; every parser here
opens it with the client's record keys (`bashfleet.worker.wire.records.open_host_info`,
`open_job_view`) and leaves out, with a warning, what does not verify: a Redis writer
without the key can hide a host or a job from a listing, never forge one.

Names and TTLs are in `bashfleet.worker.wire.names`; the worker's side is
`bashfleet.worker.fleet.registry`; the reads themselves are `bashfleet.client._async.records` (and
its generated twin).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bashfleet.worker.wire import names
from bashfleet.worker.wire.models import HostInfo, JobView
from bashfleet.worker.wire.records import open_host_info, open_job_view

# ------------------------------------------------------------------------- hosts

#: Commands read per host by `host_infos` (record, lock, busy set, exec queue depth).
HOST_READS = 4


def host_reads(host: str) -> list[tuple[str, str]]:
    """The reads of one host's listing entry, in `host_infos`' order: (command, key)."""
    return [("hgetall", names.host_key(host)), ("get", names.alive_key(host)),
            ("scard", names.running_key(host)), ("llen", names.exec_queue(host))]


def busy_slots(members: int) -> int:
    """The calls a host's busy set counts: its members but its sentinel
    (`names.BUSY_SENTINEL`: a live host's set holds it; one lost with Redis' data is
    held again by the host's next heartbeat)."""
    return max(0, members - 1)


def host_infos(
    hosts: Sequence[str], answers: Sequence[Any], keys: Mapping[str, str]
) -> list[HostInfo]:
    """The listing entries of `hosts` from the answers of their `host_reads`, in order,
    each record verified with `keys`; a host without a record, or whose record does not
    verify, is left out."""
    infos = []
    for index, host in enumerate(hosts):
        record, token, busy, queued = answers[HOST_READS * index:HOST_READS * (index + 1)]
        info = open_host_info(keys, host, record, token, busy_slots(int(busy)))
        if info is not None:
            infos.append(info.model_copy(update={"queued": int(queued)}))
    return infos


# -------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class JobListing:
    """A host's jobs as Redis lists them, and the ids whose records expired (to prune)."""

    views: list[JobView] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)


def job_listing(ids: Sequence[str], hashes: Sequence[Mapping[str, str]],
                host_alive: bool, keys: Mapping[str, str]) -> JobListing:
    """A host's listing from its job ids and their hashes, each verified with `keys` (a
    running job of a dead host shows `unknown`). A hash that does not verify is left out
    but not pruned: its job may be real (its worker seals it again), only forged over."""
    views: list[JobView] = []
    expired: list[str] = []
    for job_id, fields in zip(ids, hashes, strict=True):
        if not fields:
            expired.append(job_id)
        elif (view := open_job_view(keys, job_id, fields, host_alive=host_alive)) is not None:
            views.append(view)
    return JobListing(views, expired)


def job_views(job_ids: Sequence[str], hashes: Sequence[Mapping[str, str]],
              alive: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, JobView]:
    """The jobs Redis knows among `job_ids`, by id (`alive`: each host's lock, by host),
    each verified with `keys`: one that does not verify is left out, never believed."""
    views = {}
    for job_id, fields in zip(job_ids, hashes, strict=True):
        up = bool(alive.get(fields.get("host", "")))
        view = open_job_view(keys, job_id, fields, host_alive=up)
        if view is not None:
            views[job_id] = view
    return views


def hosts_of(hashes: Sequence[Mapping[str, str]]) -> list[str]:
    """The hosts named by job hashes, sorted, once each."""
    return sorted({fields.get("host", "") for fields in hashes if fields.get("host")})


# ------------------------------------------------------------------------- watch


@dataclass(frozen=True)
class WatchSnapshot:
    """One watch pass' reads: each waiting call's stored answer and record, and the lock
    tokens of their hosts."""

    answers: list[str | None]
    records: list[dict[str, str | None]]
    tokens: dict[str, str | None]


#: Where a call record keeps its answer.
REPLY_FIELD = names.CALL_REPLY_FIELD


def watch_snapshot(count: int, fields: Sequence[str], hosts: Sequence[str],
                   answers: Sequence[Any]) -> WatchSnapshot:
    """A pass' snapshot from its pipeline's answers: `count` GETs of answers kept apart,
    `count` HMGETs of `fields` and REPLY_FIELD (the answer kept in the record, which
    wins), one GET per host's lock."""
    rows = answers[count:2 * count]
    return WatchSnapshot(
        answers=[row[-1] if row[-1] is not None else apart
                 for apart, row in zip(answers[:count], rows, strict=True)],
        records=[dict(zip(fields, row[:-1], strict=True)) for row in rows],
        tokens=dict(zip(hosts, answers[2 * count:], strict=True)),
    )

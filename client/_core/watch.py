"""The watch's rules: when a call waited for is lost, when its host is dead, when to give
up. Pure: the I/O layer reads, in one pipelined round trip per WATCH_INTERVAL_S for
every call in flight, each call's stored answer and record and the locks of their
hosts, and these functions say what that means.

One behaviour for both clients, stated once:

- a call is first looked at once it has waited WATCH_INTERVAL_S (`due`): most are
  answered sooner, and a pass reads nothing for them (under a burst of short calls
  the watch's reads were more than one Redis command a call);
- a call a worker claimed is lost when its host's lock names another instance (the
  host restarted), or has been gone LOCK_GONE_GRACE_S (not at once: a heartbeat may be
  late after a failover);
- a queued call is withdrawn (by the WITHDRAW script: `bashfleet.worker.wire.lua`) when its
  message has been gone from its queue, unclaimed, MESSAGE_LOST_GRACE_S (a consumer
  took it and died; MESSAGE_TAKEN_BY_LIVE_HOST_GRACE_S when its host's lock is held),
  or when no live worker is left that could take it; if a worker claimed it meanwhile,
  the withdrawal fails and it is watched as running;
- a message is found in its queue by its parsed task id (`message_task_id`), in at most
  QUEUE_SCAN_LIMIT messages (a longer queue holds every call sent to it);
- Redis errors while waiting are tolerated for the outage grace (a Sentinel failover),
  then every waiting call fails with FleetUnavailable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bashfleet.client._core.constants import (
    LOCK_GONE_GRACE_S,
    MESSAGE_LOST_GRACE_S,
    MESSAGE_TAKEN_BY_LIVE_HOST_GRACE_S,
    WATCH_INTERVAL_S,
)
from bashfleet.client._core.messages import unstarted_result
from bashfleet.client._core.routing import Route
from bashfleet.client.errors import BashfleetError, WorkerLost
from bashfleet.worker.wire.models import CallResult
from bashfleet.worker.wire.names import CALL_UNSTARTED, CallState

#: Call record fields the watch reads.
WATCHED_FIELDS = ("state", "host", "instance", "note", "queue")

#: What the first `"id": "` of a task message precedes: its task id (the headers come
#: before the properties, and the body is base64, which has no quote).
_ID_FIELD = '"id": "'


@dataclass
class Pending:
    """A call sent and not answered yet, as the watch sees it."""

    call_id: str
    route: Route
    host: str | None = None
    """The host its record names, once a worker claimed it."""
    missing_since: float | None = None
    """When its message was first seen gone from its queue while it was still queued."""
    lock_gone_since: float | None = None
    """When its host's lock was first seen gone while it ran (None: held)."""
    sent_at: float = float("-inf")
    """When it was sent (monotonic; -inf: long ago, a call sent by another process)."""

    @property
    def target(self) -> str | None:
        """The host it was sent to (None: a pool or any host)."""
        return self.route.target

    @property
    def label(self) -> str | None:
        """The pool it was sent to."""
        return self.route.label


@dataclass(frozen=True)
class Verdict:
    """What the watch concluded about one waiting call."""

    problem: BashfleetError | CallResult | None = None
    """The error (or result) to end the call with; None: keep waiting."""
    withdraw: bool = False
    """End it only once withdrawn (it was queued); if a worker took it meanwhile, wait on."""


KEEP_WAITING = Verdict()


def due(pending: Pending, now: float) -> bool:
    """True once a call has waited WATCH_INTERVAL_S: a pass looks at it from then on (a
    lost worker is still found within a pass more, its answer read back as soon)."""
    return now - pending.sent_at >= WATCH_INTERVAL_S


def verdict(
    pending: Pending, record: Mapping[str, str | None], tokens: Mapping[str, str | None],
    live: list[str] | None, now: float,
) -> Verdict:
    """What to do about a waiting call, from one watch pass.

    `record`: its call record's watched fields; `tokens`: lock tokens of the hosts read
    this pass; `live`: the live hosts that could take an untargeted call (None: not
    read); `pending.missing_since` says how long its message has been gone.
    """
    call_id, state = pending.call_id, record.get("state")
    host = record.get("host") or pending.target
    if state == CallState.LOST:
        note = record.get("note") or "it died"
        return Verdict(WorkerLost(
            f"the worker on {host} was lost while running call {call_id} ({note}); "
            "the command was not run again", call_id=call_id, host=host,
        ))
    if state in CALL_UNSTARTED:
        return Verdict(unstarted_result(call_id, host, str(state)))
    if state not in (CallState.QUEUED, None):
        gone_for = now - pending.lock_gone_since if pending.lock_gone_since is not None else 0.0
        return running_verdict(call_id, record, tokens.get(host or ""), (host or "") in tokens,
                               gone_for)
    return queued_verdict(pending, tokens, live, now)


def running_verdict(call_id: str, record: Mapping[str, str | None], token: str | None,
                    host_known: bool, lock_gone_for: float) -> Verdict:
    """A claimed call: lost when its host's lock names another instance than the one that
    claimed it, or has been gone for LOCK_GONE_GRACE_S (`host_known`: the token was read
    this pass; `lock_gone_for`: how long it has been seen gone)."""
    host, instance = record.get("host"), record.get("instance")
    if not (host and instance and host_known) or token == instance:
        return KEEP_WAITING
    if token is not None or lock_gone_for >= LOCK_GONE_GRACE_S:
        return Verdict(WorkerLost(
            f"the worker on {host} died while running call {call_id}; "
            "the command was not run again", call_id=call_id, host=host,
        ))
    return KEEP_WAITING


def queued_verdict(
    pending: Pending, tokens: Mapping[str, str | None], live: list[str] | None, now: float
) -> Verdict:
    """A call no worker claimed yet: withdraw it when its message was taken by a consumer
    that died, or when no worker is left that could take it."""
    call_id = pending.call_id
    # A host whose lock is held is alive: its consumer claims what it took, maybe late.
    alive = pending.target is not None and tokens.get(pending.target) is not None
    grace = MESSAGE_TAKEN_BY_LIVE_HOST_GRACE_S if alive else MESSAGE_LOST_GRACE_S
    if pending.missing_since is not None and now - pending.missing_since >= grace:
        return Verdict(WorkerLost(
            f"call {call_id} was taken from its queue by a worker that died before "
            "starting it; it was withdrawn and will not run", call_id=call_id,
            host=pending.target,
        ), withdraw=True)
    if pending.target is not None:
        if pending.target not in tokens or tokens[pending.target] is not None:
            return KEEP_WAITING
        where = f"host {pending.target}"
    else:
        if live is None or live:
            return KEEP_WAITING
        where = f"pool {pending.label}" if pending.label else "the fleet"
    return Verdict(WorkerLost(
        f"no live worker is left in {where} to run call {call_id}; "
        "the call was withdrawn and will not run", call_id=call_id, host=pending.target,
    ), withdraw=True)


# ------------------------------------------------------------------ what a pass notes


def note_lock(pending: Pending, tokens: Mapping[str, str | None], now: float) -> None:
    """Remember since when the lock of the call's host has been seen gone."""
    if pending.host is None or pending.host not in tokens:
        return
    if tokens[pending.host] is not None:
        pending.lock_gone_since = None
    elif pending.lock_gone_since is None:
        pending.lock_gone_since = now


def note_queue(pending: Pending, waiting_ids: set[str] | None, now: float) -> None:
    """Remember since when the call's message has been gone from its queue (`waiting_ids`:
    the task ids in it; None: too long a queue to scan, so it waits its turn)."""
    if waiting_ids is None or pending.call_id in waiting_ids:
        pending.missing_since = None
    elif pending.missing_since is None:
        pending.missing_since = now


def message_task_id(message: str) -> str | None:
    """The task id of a task message as it sits in a queue (None: not one of ours)."""
    start = message.find(_ID_FIELD)
    if start < 0:
        return None
    start += len(_ID_FIELD)
    end = message.find('"', start)
    return message[start:end] if end > start else None


def waiting_ids(messages: Iterable[str]) -> set[str]:
    """The task ids of the messages waiting in a queue."""
    return {task_id for task_id in map(message_task_id, messages) if task_id}


def labels_to_read(queued: Iterable[Pending]) -> set[str]:
    """The pools (by label; "" for any host) whose live hosts a pass must read: those of
    the queued calls sent to no host in particular."""
    return {p.label or "" for p in queued if p.target is None}


# ------------------------------------------------------------------ outages, answers


class Outage:
    """Redis errors while calls are waited for: tolerated for `grace_s` (a Sentinel
    failover), since the worker stores the answers for when a replica took over."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.since: float | None = None

    def ended(self) -> None:
        """Redis answered again."""
        self.since = None

    def outlasted(self, now: float) -> bool:
        """Note a failure at `now`; True once the outage has lasted `grace_s`."""
        self.since = self.since if self.since is not None else now
        return now - self.since >= self.grace_s

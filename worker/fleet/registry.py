"""The worker's side of the fleet's state in Redis: its host lock and heartbeat, the
transitions of the calls it runs, its jobs, and the replies it delivers.

Names and TTLs are in `bashfleet.worker.wire.names` (the key list is in its docstring); the Lua
in `bashfleet.worker.wire.lua`; what a client reads and writes, in `bashfleet.client._core.records`.
Updates that race (the host lock, a call's state) are atomic: WATCH/MULTI
transactions, or a Lua script each for the transitions every call makes (claim,
finish), one round trip and no retry.

Replies do not use Celery's result backend: the worker stores and publishes a call's
answer in the same script that records its end (one round trip), and each client
listens on one channel for all its calls (no subscribe, poll or forget per call).

What clients believe of a host and its jobs is sealed here with the worker's keys
(`bashfleet.worker.wire.records`, `bashfleet.worker.wire.events`): the host record at each
heartbeat, the readiness of each consumer, each job's record and state, its events and the offsets
of its last check. A client verifies every one before it shows it.

Redis losing its data (a restart without persistence, a flush, a failover to an empty
replica): each worker notices at its next heartbeat (`heartbeat` says "missing") and
publishes again what its own disk holds: the host record with its consumers'
readiness, its running calls (`restore_running_call`) and its background jobs. Lost
for good: queued messages, session pins, the offsets of the last checks.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from bashfleet.worker.fleet.connect import (
    Redis,
    Script,
    SentScript,
    flat_fields,
    hash_fields,
    transaction,
)
from bashfleet.worker.settings import get_settings
from bashfleet.worker.wire import auth, lua, names
from bashfleet.worker.wire.events import ended_event, seal_event, started_event
from bashfleet.worker.wire.models import JobRecord, JobStatus
from bashfleet.worker.wire.names import CALL_ACTIVE, CallState, JobState
from bashfleet.worker.wire.owner_keys import for_owner
from bashfleet.worker.wire.records import (
    OFFSETS_SEAL,
    SEAL,
    host_seal,
    job_seal,
    lock_record,
    offsets_seal,
    ready_seal,
)

#: The keys a worker seals with (`Settings.sealing_keys()`: its signing keys and the
#: admin key; empty for a worker run --insecure-unsigned).
Keys = Sequence[str]

# The worker's scripts (their KEYS, ARGV and replies: `bashfleet.worker.wire.lua`).
CLAIM = Script(lua.CLAIM)
UPDATE = Script(lua.UPDATE)
FINISH = Script(lua.FINISH)
REPLY = Script(lua.REPLY)
RESTORE = Script(lua.RESTORE)
SAVE_JOB = Script(lua.SAVE_JOB)
QUOTA_ACQUIRE = Script(lua.QUOTA_ACQUIRE)
QUOTA_REFRESH = Script(lua.QUOTA_REFRESH)

# ---------------------------------------------------------------------- host lock


def acquire_host(client: Redis, host: str, token: str) -> str | None:
    """Take the host lock; None on success, else the token of the instance holding it."""
    key = names.alive_key(host)
    if client.set(key, token, nx=True, ex=names.ALIVE_TTL_S):
        return None
    holder = cast("str | None", client.get(key))
    if holder is None:  # expired between the two commands
        return acquire_host(client, host, token)
    return holder


def take_over_host(client: Redis, host: str, old_token: str, token: str) -> bool:
    """Replace a dead instance's lock by ours, only if `old_token` still holds it."""
    key = names.alive_key(host)

    def body(pipe: Any) -> bool:
        if pipe.get(key) not in (old_token, None):
            pipe.multi()
            return False
        pipe.multi()
        pipe.set(key, token, ex=names.ALIVE_TTL_S)
        return True

    return transaction(client, [key], body)


Heartbeat = Literal["ok", "missing", "taken"]


def heartbeat(
    client: Redis, host: str, token: str, record: Mapping[str, object], keys: Keys,
    *, renew: bool = True,
) -> Heartbeat:
    """Renew the lock and the host record; say how it went.

    "ok"; "taken": another instance holds the host; "missing": this instance's host
    record was not in Redis before this beat wrote it again (Redis lost its data, or
    the record expired), so whatever else the worker published may be gone too and is
    worth publishing again (`restore_running_call`, the job records). The first beat
    of an instance is "missing" too. A lock that expired (a long pause, or a Redis that
    lost its data) is taken again if nobody else took it meanwhile.

    Every beat writes what expires within seconds or tells a live host (the lock, the
    host record's fields, its place in the listing). The TTLs of hours (the host
    record's, the listing's, the busy-slot set's, the jobs index's) and the listing's
    trim are renewed only with `renew` (`RENEW_EVERY_S` apart is ample), and by any
    beat that finds the record missing: a record this beat writes again gets its TTL
    in the same transaction.
    """
    key = names.alive_key(host)
    fields = hash_fields({**record, "heartbeat_at": time.time()})
    fields[SEAL] = host_seal(keys, host, fields)
    now = float(fields["heartbeat_at"])

    def body(pipe: Any) -> Heartbeat:
        if pipe.get(key) not in (token, None):
            pipe.multi()
            return "taken"
        # Read in the same WATCHed round as the lock: a record that names us was
        # written by one of our earlier beats, so Redis kept what we published.
        kept = pipe.hget(names.host_key(host), "instance") == token
        pipe.multi()
        pipe.set(key, token, ex=names.ALIVE_TTL_S)
        pipe.hset(names.host_key(host), mapping=fields)
        pipe.zadd(names.HOSTS_KEY, {host: now})
        if renew or not kept:
            pipe.expire(names.host_key(host), names.HOST_TTL_S)
            pipe.zremrangebyscore(names.HOSTS_KEY, "-inf", now - names.HOST_TTL_S)
            pipe.expire(names.HOSTS_KEY, names.HOST_TTL_S)
            _hold_busy_set(pipe, host)
            pipe.expire(names.jobs_key(host), names.JOB_TTL_S)
        return "ok" if kept else "missing"

    return transaction(client, [key], body)


def release_host(client: Redis, host: str, token: str) -> None:
    """Give the host lock up (clean stop) if we hold it, and say so in the host record."""
    key = names.alive_key(host)

    def body(pipe: Any) -> None:
        held = pipe.get(key) == token
        pipe.multi()
        if held:
            pipe.delete(key)
            stopped = hash_fields({"ready": "", "stopped_at": time.time()})
            pipe.hset(names.host_key(host), mapping=stopped)
            pipe.delete(names.running_key(host))

    transaction(client, [key], body)


def readiness(
    keys: Keys, host: str, instance: str, ready: Mapping[str, object]
) -> dict[str, str]:
    """The host record fields saying whether consumers take messages (`{role: pid, or
    "" once stopped}`), each with its seal for this worker instance."""
    fields: dict[str, str] = {}
    for role, value in hash_fields(ready).items():
        fields[f"{role}_ready"] = value
        fields[f"{role}_ready_seal"] = ready_seal(keys, host, instance, role, value)
    return fields


def set_ready(
    client: Redis, keys: Keys, host: str, instance: str, ready: Mapping[str, object]
) -> None:
    """Say (sealed) whether consumers of this worker instance take messages."""
    set_host_fields(client, host, readiness(keys, host, instance, ready))


def set_host_fields(client: Redis, host: str, fields: Mapping[str, object]) -> None:
    """Update some fields of the host record (a consumer's sealed readiness)."""
    with client.pipeline() as pipe:
        pipe.hset(names.host_key(host), mapping=hash_fields(fields))
        pipe.expire(names.host_key(host), names.HOST_TTL_S)
        pipe.execute()


def host_record(client: Redis, host: str) -> dict[str, str]:
    """The raw host record (for the lock holder's details)."""
    return cast("dict[str, str]", client.hgetall(names.host_key(host)))


def reset_running(client: Redis, host: str) -> None:
    """Forget the busy slots of a previous instance (a starting worker has none)."""
    with client.pipeline() as pipe:
        pipe.delete(names.running_key(host))
        _hold_busy_set(pipe, host)
        pipe.execute()


def _hold_busy_set(pipe: Any, host: str) -> None:
    """Keep the host's busy set with its sentinel and renew its TTL: the claims add to
    it without a TTL of their own (`lua.CLAIM`)."""
    pipe.sadd(names.running_key(host), names.BUSY_SENTINEL)
    pipe.expire(names.running_key(host), names.RUNNING_TTL_S)


# ------------------------------------------------------------------------------ calls


def claim_call(
    client: Redis, call_id: str, host: str, instance: str, worker_pid: int,
    *, nonce: str | None = None, nonce_ttl_s: float = 0.0, owner: str = "",
    keys: Sequence[str] = (),
) -> str:
    """Mark a call running on this worker; return "ok", or the state that forbids it.

    A call the client withdrew (cancelled, abandoned) or that already ran is never
    started: this is the at-most-once guard on the worker side. With the `nonce` of a
    signed message, the nonce is recorded in the same round trip: "replayed" when it
    was seen before (nothing is claimed then). The owner is recorded sealed with `keys`
    (the fleet's): what a cancel or a detach goes by (`call_owner`).
    """
    return cast(str, send_claim(
        client, call_id, host, instance, worker_pid, nonce=nonce, nonce_ttl_s=nonce_ttl_s,
        owner=owner, keys=keys).answer())


def send_claim(
    client: Redis, call_id: str, host: str, instance: str, worker_pid: int,
    *, nonce: str | None = None, nonce_ttl_s: float = 0.0, owner: str = "",
    keys: Sequence[str] = (),
) -> SentScript:
    """`claim_call`, sent now and answered later (`SentScript.answer`: "ok" or the state
    that forbids the call): the caller prepares the call meanwhile and starts nothing
    before the answer says "ok"."""
    fields = {
        "call_id": call_id, "state": CallState.RUNNING, "host": host, "instance": instance,
        "worker_pid": worker_pid, "started_at": time.time(), "owner": owner,
        "owner_mark": auth.mark(keys, auth.CALL_OWNER, call_id, owner),
    }
    keys = [names.call_key(call_id), names.running_key(host)]
    if nonce is not None:
        keys.append(names.nonce_key(nonce))
    ttl_ms = max(1, int(nonce_ttl_s * 1000))
    return CLAIM.send(client, keys, [names.CALL_TTL_S, call_id, ttl_ms, *flat_fields(fields)])


def use_nonce(client: Redis, nonce: str, ttl_s: float) -> bool:
    """Record a signed message's nonce; False when it was seen before (a replay)."""
    ttl_ms = max(1, int(ttl_s * 1000))
    return bool(client.set(names.nonce_key(nonce), "1", nx=True, px=ttl_ms))


def mark_call(
    client: Redis, call_id: str, state: CallState, *,
    only_from: Iterable[CallState] = CALL_ACTIVE, **fields: object,
) -> str | None:
    """Move a call to `state` if it is in one of `only_from`; return its previous state."""
    key = names.call_key(call_id)
    allowed = tuple(only_from)

    ttl = names.FINISHED_TTL_S if state in names.CALL_FINAL else names.CALL_TTL_S

    def body(pipe: Any) -> str | None:
        current = pipe.hget(key, "state")
        pipe.multi()
        if current in allowed:
            pipe.hset(key, mapping=hash_fields({**fields, "state": state}))
            pipe.expire(key, ttl)
        return cast("str | None", current)

    return transaction(client, [key], body)


def call_owner(client: Redis, call_id: str, keys: Mapping[str, str]) -> str | None:
    """The owner its worker recorded when it claimed the call, its seal checked with
    `keys` (the fleet's); None for an unknown call, or one whose owner does not verify
    (its client's credentials write the record: a name there alone proves nothing)."""
    state, owner, marked = cast("list[str | None]", client.hmget(
        names.call_key(call_id), ["state", "owner", "owner_mark"]))
    if state is None:
        return None
    try:
        auth.check_mark(keys, auth.CALL_OWNER, call_id, owner or "", marked or "")
    except auth.AuthError:
        return None
    return owner or ""


def call_state(client: Redis, call_id: str) -> str | None:
    """A call's state (None: no such call)."""
    return cast("str | None", client.hget(names.call_key(call_id), "state"))


def update_call(client: Redis, call_id: str, **fields: object) -> str | None:
    """Set fields of a call record (pid, pgid, marker, spill...) without a transition.

    Returns the call's state as it is after the update (one round trip for both).
    """
    args = [names.CALL_TTL_S, *flat_fields(fields)]
    return cast("str | None", UPDATE(client, [names.call_key(call_id)], args))


@dataclass(frozen=True)
class Reply:
    """A task's answer on its way: stored under the task id, published on `channel`."""

    task_id: str
    channel: str | None
    payload: str

    def publish_on(self) -> str:
        """The channel to publish on; "" (store only) for one that is not a reply
        channel of ours: a message's `reply_to` is whatever its sender wrote."""
        return self.channel if names.valid_reply_channel(self.channel) and self.channel else ""


def finish_and_reply(
    client: Redis, host: str, call_id: str, fields: Mapping[str, object],
    *, reply: Reply | None = None, hold_in: Iterable[str] = (),
) -> tuple[str | None, bool]:
    """Record a call's end and free its slot, and in the same round trip deliver
    `reply` (see `deliver_reply`) unless the call ended from one of the states
    `hold_in` (whose reply the worker must amend first).

    A call that was being cancelled ends `cancelled`; one killed because its worker
    stopped ends `stopped`; one already declared lost stays `lost`; otherwise `done`.
    Its record is then kept FINISHED_TTL_S (JOB_TTL_S when it started a job: `job_id`).
    The reply is kept in the record's `reply` field, written with its end (no key of its
    own to write and expire), but for a call that started a job: its record outlives a
    reply, which is kept apart (`names.reply_key`, REPLY_TTL_S). Readers look in both
    (`bashfleet.client._async.records.stored_reply`).
    Returns (the state it ended from, whether the reply went).
    """
    rest = {k: v for k, v in fields.items() if k not in ("state", "ended_at")}
    keys = [names.call_key(call_id), names.running_key(host)]
    started_job = bool(rest.get("job_id"))
    channel, payload = "", ""
    if reply is not None:
        channel, payload = reply.publish_on(), reply.payload
        if started_job or reply.task_id != call_id:
            # Kept apart: this record is kept JOB_TTL_S, a reply only REPLY_TTL_S.
            keys.append(names.reply_key(reply.task_id))
    ttl = names.finished_call_ttl_s(started_job)
    previous, sent = FINISH.run_durable(
        client, keys,
        [ttl, call_id, time.time(), names.REPLY_TTL_S, channel, payload,
         " ".join(hold_in), *flat_fields(rest)],
    )
    return (str(previous) or None), bool(sent)


def deliver_reply(client: Redis, reply: Reply) -> None:
    """Store a task's answer (REPLY_TTL_S) and publish it on its caller's channel."""
    REPLY.run_durable(
        client, [names.reply_key(reply.task_id)],
        [reply.payload, names.REPLY_TTL_S, reply.publish_on(), reply.task_id],
    )


def restore_running_call(
    client: Redis, host: str, call_id: str, *, owner: str, keys: Sequence[str],
    **fields: object,
) -> str:
    """Publish again a call this host runs, after Redis lost its record, its owner
    sealed again with `keys` (the fleet's) as `claim_call` seals it.

    Atomic against the call's own end: a call that finished between the worker
    reading its local file and this script stays finished and takes no busy slot.
    Returns the call's state afterwards.
    """
    rest = {k: v for k, v in fields.items() if k != "state"}
    rest.update(call_id=call_id, host=host, owner=owner,
                owner_mark=auth.mark(keys, auth.CALL_OWNER, call_id, owner))
    return cast(str, RESTORE(
        client, [names.call_key(call_id), names.running_key(host)],
        [names.CALL_TTL_S, names.RUNNING_TTL_S, call_id, *flat_fields(rest)],
    ))


def busy_calls(client: Redis, host: str) -> dict[str, dict[str, str]]:
    """The calls in a host's busy set, with their records (two round trips)."""
    members = cast("set[str]", client.smembers(names.running_key(host)))
    ids = sorted(members - {names.BUSY_SENTINEL})
    with client.pipeline(transaction=False) as pipe:
        for call_id in ids:
            pipe.hgetall(names.call_key(call_id))
        records = pipe.execute() if ids else []
    return dict(zip(ids, records, strict=True))


def forget_busy(client: Redis, host: str, call_id: str) -> None:
    """Free a call's slot in the host's busy set (a call declared lost)."""
    client.srem(names.running_key(host), call_id)


# ------------------------------------------------------------------------------- jobs


def save_job(
    client: Redis,
    record: JobRecord,
    *,
    keys: Keys,
    running: bool | None,
    exit_code: int | None = None,
    signal: int | None = None,
    ended_at: float | None = None,
    note: str | None = None,
) -> str | None:
    """Publish a job's record and state, and its event when this is a transition (it
    started, it ended: `bashfleet.worker.wire.events`); returns that event's stream id, if any.

    One script, so two processes that both see a job end (its host's watcher and a
    `check`) publish one `ended` event between them. Foreground calls never come here.
    The hash and the events are sealed with `keys`. A plain background job (not an
    interactive session, which has its own cap) counts in its owner's job quota while
    it runs (`QUOTA_ACQUIRE` took its place before it started).
    """
    state = JobState.UNKNOWN if running is None else (
        JobState.RUNNING if running else JobState.ENDED
    )
    owners = for_owner(keys, record.owner)  # its owner reads it too, no other owner
    fields = hash_fields({
        "record": lock_record(owners, record), "host": record.host, "state": state,
        "exit_code": exit_code, "signal": signal, "ended_at": ended_at, "note": note,
    })
    fields[SEAL] = job_seal(owners, record.id, fields)
    status = None if running or ended_at is None else JobStatus(
        exit_code=exit_code, signal=signal, ended_at=ended_at, note=note
    )
    space = owner_space(record.owner)
    job_keys = [names.job_key(record.id), names.jobs_key(record.host), names.EVENTS_KEY,
                names.owner_jobs_key(record.host, space)]
    if counts_as_job(record):
        job_keys.append(names.quota_key(JOBS_QUOTA, space))
    event_id = SAVE_JOB(
        client, job_keys,
        [names.JOB_TTL_S, record.id, record.started_at, names.EVENTS_MAXLEN,
         names.EVENTS_CHANNEL, seal_event(owners, started_event(record)),
         seal_event(owners, ended_event(record, status)), state, job_member(record),
         names.QUOTA_TTL_S * 1000, *flat_fields(fields)],
    )
    return str(event_id) if event_id else None


def save_offsets(
    client: Redis, job_id: str, offset: int, stderr_offset: int, keys: Keys
) -> None:
    """Remember where the last check stopped reading, for the next `check` without offset."""
    with client.pipeline() as pipe:
        offsets = hash_fields({
            "offset": offset, "stderr_offset": stderr_offset,
            OFFSETS_SEAL: offsets_seal(keys, job_id, offset, stderr_offset),
        })
        pipe.hset(names.job_key(job_id), mapping=offsets)
        pipe.expire(names.job_key(job_id), names.JOB_TTL_S)
        pipe.execute()


def owner_job_ids(client: Redis, host: str, owner: str) -> list[str]:
    """The ids of one owner's jobs on a host, oldest first (its index, not every job)."""
    return cast("list[str]", client.zrange(names.owner_jobs_key(host, owner_space(owner)),
                                           0, -1))


def jobs_fields(client: Redis, job_ids: list[str]) -> list[dict[str, str]]:
    """The raw hashes of several jobs, in one round trip (empty ones for unknown ids)."""
    if not job_ids:
        return []
    with client.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hgetall(names.job_key(job_id))
        return cast("list[dict[str, str]]", pipe.execute())


def job_fields(client: Redis, job_id: str) -> dict[str, str]:
    """The raw job hash (empty when unknown or expired)."""
    return cast("dict[str, str]", client.hgetall(names.job_key(job_id)))


# ----------------------------------------------------------------------------- quotas


def owner_space(owner: str) -> str:
    """What names `owner`'s quotas and job index in Redis (`Settings.owner_space`): a MAC
    of its key, so that a client names its own owner's and no other's."""
    return get_settings().owner_space(owner)

#
# What one owner holds live fleet-wide, per kind (its background jobs; the lead's
# workspaces): a sorted set per owner and kind, member -> expiry. Taken in one script
# (`QUOTA_ACQUIRE`), so many orchestrator processes sharing an owner, and every host,
# cannot together pass the cap; refreshed by the host while the member lives; given back
# when it ends, or by expiry when its host died.

#: The kind of quota of background jobs (BASHFLEET_LIMIT_JOBS).
JOBS_QUOTA = "jobs"


@dataclass(frozen=True)
class Quota:
    """The answer of `quota_acquire`."""

    taken: bool
    """True when the member has its place (new, or held already)."""
    held: int
    """Members the owner holds now (the refused one not counted)."""
    limit: int
    """The cap that applied."""
    retry_after_s: float
    """Refused: seconds until the soonest held member would expire unless its host
    renews it (a job still running is renewed: retry once one of them ended)."""


def quota_acquire(
    client: Redis, kind: str, owner: str, member: str, limit: int, *,
    ttl_s: float = names.QUOTA_TTL_S,
) -> Quota:
    """Take a place for `member` in `owner`'s quota of `kind`, unless `limit` are held."""
    taken, held, soonest_ms = QUOTA_ACQUIRE(
        client, [names.quota_key(kind, owner_space(owner))], [member, limit, int(ttl_s * 1000)]
    )
    return Quota(bool(taken), int(held), limit, max(0.0, int(soonest_ms) / 1000))


def quota_refresh(
    client: Redis, kind: str, owner: str, members: Iterable[str],
    ttl_s: float = names.QUOTA_TTL_S,
) -> int:
    """Renew live members of `owner`'s quota (past the limit too: they exist); returns
    how many the owner holds."""
    args: list[object] = [int(ttl_s * 1000), *members]
    return int(QUOTA_REFRESH(client, [names.quota_key(kind, owner_space(owner))], args))


def quota_release(client: Redis, kind: str, owner: str, member: str) -> None:
    """Give a member's place back (it ended, or never started)."""
    client.zrem(names.quota_key(kind, owner_space(owner)), member)


def counts_as_job(record: JobRecord) -> bool:
    """True for a job its owner's job quota counts: a plain background job (an
    interactive session has its own cap, per host)."""
    return record.stdin == "null"


def job_member(record: JobRecord) -> str:
    """A job's member in its owner's quota: the call that started it (known before the
    job exists, when its place is taken)."""
    return record.call_id or record.id

"""The fleet's names and state in Redis: every key, queue and task name, in one place.

Both sides use this module (the client for names and reads, the worker for writes);
it imports nothing but redis and the wire models. All updates that race (the host
lock, a call's state) are atomic: WATCH/MULTI transactions, and a Lua script each for
the three transitions every call makes (submit, claim, finish), which take one round
trip instead of three and never retry (see `_Script`).

Keys (prefix `bashfleet:`; every key has a TTL or an owner that deletes it):

- `bashfleet:alive:<host>` (string): host lock and heartbeat, the token of the worker
  instance holding the host id. TTL ALIVE_TTL_S (5 s), renewed every second by the
  worker (so a dead worker is seen within seconds); deleted when it stops.
- `bashfleet:host:<host>` (hash): host record: concurrency, labels, version, pid,
  machine, instance, readiness of its two consumers, last heartbeat. TTL HOST_TTL_S
  (1 day), renewed by the heartbeat.
- `bashfleet:hosts` (zset): host id -> last heartbeat, for listings. TTL HOST_TTL_S,
  renewed by heartbeats; members older than that are pruned by them.
- `bashfleet:running:<host>` (set): ids of the calls running on the host (busy slots).
  TTL RUNNING_TTL_S (1 h), renewed by the heartbeat; reset by a starting worker,
  deleted by a stopping one.
- `bashfleet:call:<call_id>` (hash): call record: state, queue, host, instance, pid,
  pgid, marker (once the call has run 50 ms, else with its end), spill paths and
  sizes, job id. TTL CALL_TTL_S (2 days), set by the client and renewed at every
  transition.
- `bashfleet:job:<job_id>` (hash): job record (JobRecord JSON), state, exit code,
  signal, end time, last check offsets. TTL JOB_TTL_S (7 days), renewed at every
  update and while the job runs.
- `bashfleet:jobs:<host>` (zset): job ids of a host -> start time, for listings.
  TTL JOB_TTL_S, renewed with its jobs and by the heartbeat; members whose job hash
  expired are pruned when listed.
- `bashfleet:session:<session>` (string): the host a session's calls are pinned to.
  TTL SESSION_TTL_S (1 day), renewed by each call of the session.
- `bashfleet:nonce:<nonce>` (string): a signed message's nonce, seen once (replays are
  refused). TTL: until the message expires (plus the clock skew allowed).
- `bashfleet:reply:<task_id>` (string): a task's answer (a CallResult, or a control
  envelope, as JSON), also published on the caller's channel
  `bashfleet:replies:<client>`. Kept REPLY_TTL_S (1 h) for a caller that missed the
  publish (its subscription was reconnecting): it reads the key at its next watch.

Replies do not use Celery's result backend: the worker stores and publishes a call's
answer in the same script that records its end (one round trip), and each client
listens on one channel for all its calls (no subscribe, poll or forget per call).

Celery's own keys are Celery's: the queue lists (named like the queues below, emptied
by the consumers) and kombu's `_kombu.binding.*` sets.

Redis losing its data (a restart without persistence, a flush, a failover to an empty
replica): each worker notices at its next heartbeat (`beat` finds its host record gone)
and publishes again what its own disk holds: the host record with its consumers'
readiness, its running calls (`restore_running_call`) and its background jobs. Lost
for good: queued messages, session pins, the offsets of the last checks.

Call states: `queued` (the client sent it) -> `running` (a worker claimed it) ->
`done`; or `cancelled` / `abandoned` before it started (it never runs); `cancelling`
/ `stopping` while its processes are being killed; `lost` when its worker died.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import redis

from worker.wire.models import HostInfo, JobRecord, JobView
from worker.fleet.transport import TRANSPORT

PREFIX = "bashfleet:"

#: Seconds between two heartbeats of a worker.
HEARTBEAT_INTERVAL_S = 1.0
#: Life of the host lock without a heartbeat: a dead worker is seen within this.
ALIVE_TTL_S = 5
#: Life of a host record (and the host listing) without a heartbeat.
HOST_TTL_S = 24 * 3600
#: Life of the busy-slot set without a heartbeat.
RUNNING_TTL_S = 3600
#: Life of a call record after its last transition.
CALL_TTL_S = 2 * 24 * 3600
#: Life of a job record after its last update.
JOB_TTL_S = 7 * 24 * 3600
#: A stored reply: only for a caller that missed its publish, which reads it within
#: seconds; an hour leaves room for a long pause (a laptop asleep) and no more.
REPLY_TTL_S = 3600
#: Life of a session's host pin after its last call.
SESSION_TTL_S = 24 * 3600

# ----------------------------------------------------------------------------- names

TASK_EXEC = "bashfleet.exec"
TASK_CHECK = "bashfleet.check"
TASK_KILL = "bashfleet.kill"
TASK_READ_OUTPUT = "bashfleet.read_output"
TASK_CANCEL = "bashfleet.cancel"
TASK_JOBS = "bashfleet.jobs"

ANY_EXEC_QUEUE = "bashfleet.any.exec"

_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_RESERVED_HOSTS = ("any", "pool")

CALL_ACTIVE = ("running", "cancelling", "stopping")
"""States of a call whose processes may be alive on its host."""
CALL_UNSTARTED = ("cancelled", "abandoned")
"""States of a call that never ran and never will."""


def validate_host(host: str) -> str:
    """A host id, or ValueError: it names queues, so `any` and `pool.*` are taken."""
    if not _HOST_RE.match(host):
        raise ValueError(
            f"invalid host id {host!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if host in _RESERVED_HOSTS or host.startswith("pool."):
        raise ValueError(f"invalid host id {host!r}: 'any' and 'pool' name shared queues")
    return host


def validate_label(label: str) -> str:
    """A pool label, or ValueError."""
    if not _LABEL_RE.match(label):
        raise ValueError(
            f"invalid label {label!r}: use 1-64 letters, digits, '_' or '-'"
        )
    return label


def valid_id(value: str) -> bool:
    """True when `value` can be a call or job id (what keys and file names accept)."""
    return bool(_ID_RE.match(value))


def exec_queue(host: str) -> str:
    """Commands for one host."""
    return f"bashfleet.{host}.exec"


def pool_queue(label: str) -> str:
    """Commands for any host with a label."""
    return f"bashfleet.pool.{label}.exec"


def ctl_queue(host: str) -> str:
    """Control calls (check, kill, read_output, cancel, jobs) for one host."""
    return f"bashfleet.{host}.ctl"


def exec_queues(host: str, labels: Iterable[str]) -> list[str]:
    """Every command queue a worker serves."""
    return [exec_queue(host), ANY_EXEC_QUEUE, *(pool_queue(label) for label in labels)]


def alive_key(host: str) -> str:
    """Host lock and heartbeat (string: instance token)."""
    return f"{PREFIX}alive:{host}"


def host_key(host: str) -> str:
    """Host record (hash)."""
    return f"{PREFIX}host:{host}"


HOSTS_KEY = f"{PREFIX}hosts"
"""Host listing (zset: host -> last heartbeat)."""


def running_key(host: str) -> str:
    """Call ids running on a host (set)."""
    return f"{PREFIX}running:{host}"


def call_key(call_id: str) -> str:
    """Call record (hash)."""
    return f"{PREFIX}call:{call_id}"


def job_key(job_id: str) -> str:
    """Job record (hash)."""
    return f"{PREFIX}job:{job_id}"


def jobs_key(host: str) -> str:
    """Job ids of a host (zset: job id -> start time)."""
    return f"{PREFIX}jobs:{host}"


def session_key(session: str) -> str:
    """Host a session is pinned to (string)."""
    return f"{PREFIX}session:{session}"


#: Channels callers listen on for their replies: `<prefix><client token>`.
REPLY_CHANNEL_PREFIX = f"{PREFIX}replies:"
_REPLY_CHANNEL_RE = re.compile(r"^bashfleet:replies:[A-Za-z0-9_-]{1,64}$")


def reply_key(task_id: str) -> str:
    """A task's stored reply (string)."""
    return f"{PREFIX}reply:{task_id}"


def reply_channel(token: str) -> str:
    """The channel a client with `token` listens on for all its replies."""
    return f"{REPLY_CHANNEL_PREFIX}{token}"


def valid_reply_channel(channel: str | None) -> bool:
    """True for a channel a worker may publish a reply on (none other is used)."""
    return bool(channel) and _REPLY_CHANNEL_RE.match(channel or "") is not None


def parse_reply_message(message: str) -> tuple[str, str] | None:
    """(task id, reply) of a reply channel's message, which is the task id, a newline
    and the reply (as the finish and reply scripts publish it); None when malformed."""
    task_id, newline, payload = message.partition("\n")
    return (task_id, payload) if newline and task_id else None


def celery_wire_config(url: str) -> dict[str, object]:
    """Celery settings both sides must agree on: where, how encoded, result keys."""
    return {
        "broker_url": url,
        "broker_transport": TRANSPORT,  # kombu's, reusing its Redis clients
        # No result backend: answers travel as replies (see the module's docstring).
        "result_backend": None,
        "task_ignore_result": True,
        # JSON only: a pickle from Redis would be code execution on every worker.
        "task_serializer": "json",
        "accept_content": ["json"],
        # No task-sent event from the client: it cost every call a publish (~0.4 ms of
        # client CPU, ~0.25 ms of latency). Flower lists a call from the worker's
        # events (received, started, succeeded); a call still waiting in its queue is
        # seen in its call record (state `queued`).
        "task_send_sent_event": False,
        "enable_utc": True,
    }


# ------------------------------------------------------------------------ helpers

Redis = redis.Redis
T = TypeVar("T")


def _transaction(client: Redis, keys: list[str], body: Callable[[Any], T]) -> T:
    """Run `body(pipe)` under WATCH on `keys`, retrying when another client raced us.

    `body` reads with the pipe in immediate mode, then calls `pipe.multi()` and queues
    its writes; its return value is returned once the transaction committed.
    """
    while True:
        with client.pipeline() as pipe:
            try:
                pipe.watch(*keys)  # type: ignore[no-untyped-call]
                value = body(pipe)
                pipe.execute()
                return value
            except redis.WatchError:
                continue


class _Script:
    """A Lua script run with EVALSHA (loaded on first use, and again after a restart).

    Redis runs a script atomically, so a read-check-write needs one round trip and no
    WATCH retry loop: what the hot path of every call (submit, claim, finish) uses.
    """

    def __init__(self, source: str) -> None:
        # `unpack` is a global in Redis' Lua 5.1 and `table.unpack` in later Luas
        # (fakeredis' through lupa).
        self.source = "local unpack = unpack or table.unpack\n" + source
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()  # noqa: S324 - Redis' id

    def __call__(self, client: Redis, keys: list[str], args: list[object]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)  # type: ignore[arg-type]
        except redis.exceptions.NoScriptError:
            # Not loaded yet (or Redis restarted): EVAL runs it and caches it.
            return client.eval(self.source, len(keys), *keys, *args)  # type: ignore[arg-type]


def _flat(fields: Mapping[str, object]) -> list[object]:
    """Hash fields as the flat name, value list a script passes to HSET."""
    return [item for pair in _fields(fields).items() for item in pair]


def _str(mapping: Mapping[str, str], name: str) -> str | None:
    value = mapping.get(name)
    return value if value not in (None, "") else None


def _int(mapping: Mapping[str, str], name: str) -> int | None:
    value = _str(mapping, name)
    return int(value) if value is not None else None


def _float(mapping: Mapping[str, str], name: str) -> float | None:
    value = _str(mapping, name)
    return float(value) if value is not None else None


def _fields(values: Mapping[str, object]) -> dict[Any, Any]:
    # Hash values are text; None is stored as "" (and read back as None).
    return {k: "" if v is None else str(v) for k, v in values.items()}


# ---------------------------------------------------------------------- host lock


def acquire_host(client: Redis, host: str, token: str) -> str | None:
    """Take the host lock; None on success, else the token of the instance holding it."""
    if client.set(alive_key(host), token, nx=True, ex=ALIVE_TTL_S):
        return None
    holder = cast("str | None", client.get(alive_key(host)))
    if holder is None:  # expired between the two commands
        return acquire_host(client, host, token)
    return holder


def take_over_host(client: Redis, host: str, old_token: str, token: str) -> bool:
    """Replace a dead instance's lock by ours, only if `old_token` still holds it."""
    key = alive_key(host)

    def body(pipe: Any) -> bool:
        if pipe.get(key) not in (old_token, None):
            pipe.multi()
            return False
        pipe.multi()
        pipe.set(key, token, ex=ALIVE_TTL_S)
        return True

    return _transaction(client, [key], body)


def heartbeat(client: Redis, host: str, token: str, record: Mapping[str, object]) -> bool:
    """Renew the lock and the host record; False when another instance holds the host.

    A lock that expired (a long pause, or a Redis that lost its data) is taken again
    if nobody else took it meanwhile.
    """
    return beat(client, host, token, record) != "taken"


BeatOutcome = Literal["ok", "missing", "taken"]


def beat(
    client: Redis, host: str, token: str, record: Mapping[str, object]
) -> BeatOutcome:
    """`heartbeat`, telling why: "ok"; "taken" (another instance holds the host); or
    "missing": this instance's host record was not in Redis before this beat wrote it
    again (Redis lost its data, or the record expired), so whatever else the worker
    published may be gone too and is worth publishing again (`restore_running_call`,
    the job records). The first beat of an instance is "missing" too.
    """
    key = alive_key(host)
    now = time.time()

    def body(pipe: Any) -> BeatOutcome:
        if pipe.get(key) not in (token, None):
            pipe.multi()
            return "taken"
        # Read in the same WATCHed round as the lock: a record that names us was
        # written by one of our earlier beats, so Redis kept what we published.
        kept = pipe.hget(host_key(host), "instance") == token
        pipe.multi()
        pipe.set(key, token, ex=ALIVE_TTL_S)
        pipe.hset(host_key(host), mapping=_fields({**record, "heartbeat_at": now}))
        pipe.expire(host_key(host), HOST_TTL_S)
        pipe.zadd(HOSTS_KEY, {host: now})
        pipe.zremrangebyscore(HOSTS_KEY, "-inf", now - HOST_TTL_S)
        pipe.expire(HOSTS_KEY, HOST_TTL_S)
        pipe.expire(running_key(host), RUNNING_TTL_S)
        pipe.expire(jobs_key(host), JOB_TTL_S)
        return "ok" if kept else "missing"

    return _transaction(client, [key], body)


def release_host(client: Redis, host: str, token: str) -> None:
    """Give the host lock up (clean stop) if we hold it, and say so in the host record."""
    key = alive_key(host)

    def body(pipe: Any) -> None:
        held = pipe.get(key) == token
        pipe.multi()
        if held:
            pipe.delete(key)
            pipe.hset(host_key(host), mapping={"ready": "", "stopped_at": str(time.time())})
            pipe.delete(running_key(host))

    _transaction(client, [key], body)


def set_host_fields(client: Redis, host: str, fields: Mapping[str, object]) -> None:
    """Update some fields of the host record (readiness of a consumer, for example)."""
    with client.pipeline() as pipe:
        pipe.hset(host_key(host), mapping=_fields(fields))
        pipe.expire(host_key(host), HOST_TTL_S)
        pipe.execute()


def host_alive_token(client: Redis, host: str) -> str | None:
    """Token of the live instance of `host`, or None when no worker holds it."""
    return cast("str | None", client.get(alive_key(host)))


def live_hosts(client: Redis) -> list[str]:
    """Host ids whose worker is alive now."""
    hosts = cast("list[str]", client.zrange(HOSTS_KEY, 0, -1))
    if not hosts:
        return []
    with client.pipeline(transaction=False) as pipe:
        for host in hosts:
            pipe.exists(alive_key(host))
        alive = pipe.execute()
    return [host for host, flag in zip(hosts, alive, strict=True) if flag]


def list_hosts(client: Redis) -> list[HostInfo]:
    """Every host seen within HOST_TTL_S, alive or not, sorted by id."""
    hosts = sorted(cast("list[str]", client.zrange(HOSTS_KEY, 0, -1)))
    return [info for info in (host_info(client, host) for host in hosts) if info is not None]


def host_info(client: Redis, host: str) -> HostInfo | None:
    """One host's record, or None when the fleet does not know it."""
    with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(host_key(host))
        pipe.get(alive_key(host))
        pipe.scard(running_key(host))
        record, token, busy = pipe.execute()
    if not record:
        return None
    alive = token is not None and token == record.get("instance")
    labels = tuple(part for part in record.get("labels", "").split(",") if part)
    return HostInfo(
        host=host,
        alive=token is not None,
        ready=alive and bool(record.get("exec_ready")) and bool(record.get("ctl_ready")),
        slots=_int(record, "concurrency") or 0,
        busy=int(busy) if token is not None else 0,
        labels=labels,
        version=record.get("version", ""),
        pid=_int(record, "pid"),
        machine=record.get("machine", ""),
        started_at=_float(record, "started_at"),
        heartbeat_at=_float(record, "heartbeat_at"),
    )


def host_record(client: Redis, host: str) -> dict[str, str]:
    """The raw host record (for the lock holder's details)."""
    return cast("dict[str, str]", client.hgetall(host_key(host)))


def reset_running(client: Redis, host: str) -> None:
    """Forget the busy slots of a previous instance (a starting worker has none)."""
    client.delete(running_key(host))


# ------------------------------------------------------------------------------ calls


# KEYS: call, [alive]; ARGV: call TTL, fields... Refuses when the host is down (its
# lock gone) or the id taken, so the client checks and records in one round trip.
_SUBMIT = _Script("""
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 0 then return 'down' end
if redis.call('EXISTS', KEYS[1]) == 1 then return 'taken' end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 'ok'
""")


def submit_call(
    client: Redis, call_id: str, queue: str, host: str | None, *, require_alive: bool = False
) -> str:
    """Record a call as queued (client side), atomically with the checks it needs.

    Returns "ok"; "taken" when the id is already in use; "down" when `require_alive`
    and no worker holds `host` (nothing is recorded then).
    """
    fields = {
        "call_id": call_id, "state": "queued", "queue": queue, "host": host,
        "sent_at": time.time(),
    }
    keys = [call_key(call_id)]
    if require_alive:
        if host is None:
            raise ValueError("require_alive needs a host")
        keys.append(alive_key(host))
    return cast(str, _SUBMIT(client, keys, [CALL_TTL_S, *_flat(fields)]))


def new_call(client: Redis, call_id: str, queue: str, host: str | None) -> bool:
    """Record a call as queued (client side); False when the id is already taken."""
    return submit_call(client, call_id, queue, host) == "ok"


# KEYS: call, running[, nonce]; ARGV: call TTL, running TTL, call id, nonce TTL (ms),
# fields... A signed message's nonce is used first (a replay claims nothing); a call in
# any state but queued (or unknown: its record expired, or Redis lost it) is not claimed.
_CLAIM = _Script("""
if KEYS[3] and not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[4]) then
  return 'replayed'
end
local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= 'queued' then return state end
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 'ok'
""")


def claim_call(
    client: Redis, call_id: str, host: str, instance: str, worker_pid: int,
    *, nonce: str | None = None, nonce_ttl_s: float = 0.0,
) -> str:
    """Mark a call running on this worker; return "ok", or the state that forbids it.

    A call the client withdrew (cancelled, abandoned) or that already ran is never
    started: this is the at-most-once guard on the worker side. With the `nonce` of a
    signed message, the nonce is recorded in the same round trip: "replayed" when it
    was seen before (nothing is claimed then).
    """
    fields = {
        "call_id": call_id, "state": "running", "host": host, "instance": instance,
        "worker_pid": worker_pid, "started_at": time.time(),
    }
    keys = [call_key(call_id), running_key(host)]
    if nonce is not None:
        keys.append(nonce_key(nonce))
    return cast(str, _CLAIM(
        client, keys,
        [CALL_TTL_S, RUNNING_TTL_S, call_id, max(1, int(nonce_ttl_s * 1000)), *_flat(fields)],
    ))


#: kombu keeps a queue's messages in one list per priority step: the queue's own name
#: (the default priority) and `<queue>\x06\x16<step>` for the others.
_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")
#: Most messages of a queue scanned when looking for one (a queue is rarely longer).
QUEUE_SCAN_LIMIT = 10_000


def message_waiting(client: Redis, queue: str, call_id: str) -> bool:
    """True when the message of `call_id` still waits in `queue` (no consumer took it).

    Messages are JSON with the task id in their headers. A queue longer than the scan
    limit counts as still holding it: the call is simply waiting its turn.
    """
    needle = f'"id": "{call_id}"'
    for suffix in _PRIORITY_SUFFIXES:
        key = queue + suffix
        if client.llen(key) > QUEUE_SCAN_LIMIT:
            return True
        if any(needle in message for message in client.lrange(key, 0, -1)):
            return True
    return False


def queue_depths(client: Redis, queues: Sequence[str]) -> dict[str, int]:
    """Messages waiting in each queue (all its priority lists), in one round trip."""
    with client.pipeline(transaction=False) as pipe:
        for queue in queues:
            for suffix in _PRIORITY_SUFFIXES:
                pipe.llen(queue + suffix)
        lengths = pipe.execute() if queues else []
    step = len(_PRIORITY_SUFFIXES)
    return {
        queue: sum(int(n) for n in lengths[i * step:(i + 1) * step])
        for i, queue in enumerate(queues)
    }


def nonce_key(nonce: str) -> str:
    """A signed message's nonce, once seen (TTL: until the message expires)."""
    return f"{PREFIX}nonce:{nonce}"


def use_nonce(client: Redis, nonce: str, ttl_s: float) -> bool:
    """Record a signed message's nonce; False when it was seen before (a replay)."""
    return bool(client.set(nonce_key(nonce), "1", nx=True, px=max(1, int(ttl_s * 1000))))


def withdraw_call(client: Redis, call_id: str, state: str = "abandoned") -> str | None:
    """Mark a queued call `state` (cancelled / abandoned) so no worker ever starts it.

    Returns the state the call had: "queued" means it is withdrawn; anything else
    (running, done...) means it was too late; None: no such call.
    """
    key = call_key(call_id)

    def body(pipe: Any) -> str | None:
        current = pipe.hget(key, "state")
        pipe.multi()
        if current == "queued":
            pipe.hset(key, mapping={"state": state, "ended_at": str(time.time())})
            pipe.expire(key, CALL_TTL_S)
        return cast("str | None", current)

    return _transaction(client, [key], body)


def mark_call(
    client: Redis, call_id: str, state: str, *, only_from: Iterable[str] = CALL_ACTIVE,
    **fields: object,
) -> str | None:
    """Move a call to `state` if it is in one of `only_from`; return its previous state."""
    key = call_key(call_id)
    allowed = tuple(only_from)

    def body(pipe: Any) -> str | None:
        current = pipe.hget(key, "state")
        pipe.multi()
        if current in allowed:
            pipe.hset(key, mapping=_fields({**fields, "state": state}))
            pipe.expire(key, CALL_TTL_S)
        return cast("str | None", current)

    return _transaction(client, [key], body)


# KEYS: call; ARGV: call TTL, fields... Returns the call's state after the update.
_UPDATE = _Script("""
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return redis.call('HGET', KEYS[1], 'state')
""")


def update_call(client: Redis, call_id: str, **fields: object) -> str | None:
    """Set fields of a call record (pid, pgid, marker, spill...) without a transition.

    Returns the call's state as it is after the update (one round trip for both).
    """
    return cast("str | None", _UPDATE(client, [call_key(call_id)], [CALL_TTL_S, *_flat(fields)]))


# KEYS: call, running[, reply]; ARGV: call TTL, call id, end time, reply TTL, reply
# channel, reply, states that hold the reply back, fields... Returns {the state the
# call ended from ('' : no record), 1 when the reply was stored and published}.
_FINISH = _Script("""
local current = redis.call('HGET', KEYS[1], 'state')
local final = 'done'
if current == 'cancelling' then final = 'cancelled'
elseif current == 'stopping' then final = 'stopped'
elseif current == 'lost' then final = 'lost' end
redis.call('HSET', KEYS[1], 'state', final, 'ended_at', ARGV[3], unpack(ARGV, 8))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('SREM', KEYS[2], ARGV[2])
current = current or ''
if not KEYS[3] or string.find(' ' .. ARGV[7] .. ' ', ' ' .. current .. ' ', 1, true) then
  return {current, 0}
end
redis.call('SET', KEYS[3], ARGV[6], 'EX', ARGV[4])
if ARGV[5] ~= '' then redis.call('PUBLISH', ARGV[5], ARGV[2] .. '\\n' .. ARGV[6]) end
return {current, 1}
""")


@dataclass(frozen=True)
class Reply:
    """A task's answer on its way: stored under the task id, published on `channel`."""

    task_id: str
    channel: str | None
    payload: str

    def publish_on(self) -> str:
        """The channel to publish on; "" (store only) for one that is not a reply
        channel of ours: a message's `reply_to` is whatever its sender wrote."""
        return self.channel if self.channel and valid_reply_channel(self.channel) else ""


def finish_call(client: Redis, host: str, call_id: str, **fields: object) -> str | None:
    """Record a call's end and free its slot; return the state it ended from.

    A call that was being cancelled ends `cancelled`; one killed because its worker
    stopped ends `stopped`; one already declared lost stays `lost`; otherwise `done`.
    """
    return finish_and_reply(client, host, call_id, fields)[0]


def finish_and_reply(
    client: Redis, host: str, call_id: str, fields: Mapping[str, object],
    *, reply: Reply | None = None, hold_in: Iterable[str] = (),
) -> tuple[str | None, bool]:
    """`finish_call`, and in the same round trip deliver `reply` (see `deliver_reply`)
    unless the call ended from one of the states `hold_in` (whose reply the worker
    must amend first). Returns (the state it ended from, whether the reply went)."""
    rest = {k: v for k, v in fields.items() if k not in ("state", "ended_at")}
    keys = [call_key(call_id), running_key(host)]
    channel, payload = "", ""
    if reply is not None:
        keys.append(reply_key(reply.task_id))
        channel, payload = reply.publish_on(), reply.payload
    previous, sent = _FINISH(
        client, keys,
        [CALL_TTL_S, call_id, time.time(), REPLY_TTL_S, channel, payload, " ".join(hold_in),
         *_flat(rest)],
    )
    return (str(previous) or None), bool(sent)


# KEYS: reply; ARGV: reply, reply TTL, channel, task id.
_REPLY = _Script("""
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], ARGV[4] .. '\\n' .. ARGV[1]) end
return 1
""")


def deliver_reply(client: Redis, reply: Reply) -> None:
    """Store a task's answer (REPLY_TTL_S) and publish it on its caller's channel."""
    _REPLY(
        client, [reply_key(reply.task_id)],
        [reply.payload, REPLY_TTL_S, reply.publish_on(), reply.task_id],
    )


def stored_reply(client: Redis, task_id: str) -> str | None:
    """A task's stored answer, or None (not answered yet, or expired)."""
    return cast("str | None", client.get(reply_key(task_id)))


# KEYS: call, running; ARGV: call TTL, running TTL, call id, fields... Returns the
# call's state after it: a record Redis lost is written again as running; one whose
# end was recorded meanwhile (finish_call) is left as it is, and out of the busy set.
_RESTORE = _Script("""
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  redis.call('HSET', KEYS[1], 'state', 'running', unpack(ARGV, 4))
  redis.call('EXPIRE', KEYS[1], ARGV[1])
  state = 'running'
end
if state == 'running' or state == 'cancelling' or state == 'stopping' then
  redis.call('SADD', KEYS[2], ARGV[3])
  redis.call('EXPIRE', KEYS[2], ARGV[2])
end
return state
""")


def restore_running_call(
    client: Redis, host: str, call_id: str, **fields: object
) -> str:
    """Publish again a call this host runs, after Redis lost its record (worker side).

    Atomic against the call's own end: a call that finished between the worker
    reading its local file and this script stays finished and takes no busy slot.
    Returns the call's state afterwards.
    """
    rest = {k: v for k, v in fields.items() if k != "state"}
    rest.update(call_id=call_id, host=host)
    return cast(str, _RESTORE(
        client, [call_key(call_id), running_key(host)],
        [CALL_TTL_S, RUNNING_TTL_S, call_id, *_flat(rest)],
    ))


def busy_calls(client: Redis, host: str) -> dict[str, dict[str, str]]:
    """The calls in a host's busy set, with their records (two round trips)."""
    ids = sorted(cast("set[str]", client.smembers(running_key(host))))
    with client.pipeline(transaction=False) as pipe:
        for call_id in ids:
            pipe.hgetall(call_key(call_id))
        records = pipe.execute() if ids else []
    return dict(zip(ids, records, strict=True))


def call_record(client: Redis, call_id: str) -> dict[str, str]:
    """The call record (empty when unknown or expired)."""
    return cast("dict[str, str]", client.hgetall(call_key(call_id)))


# ------------------------------------------------------------------------------- jobs


def save_job(
    client: Redis,
    record: JobRecord,
    *,
    running: bool | None,
    exit_code: int | None = None,
    signal: int | None = None,
    ended_at: float | None = None,
    note: str | None = None,
) -> None:
    """Publish a job's record and state (worker side)."""
    state = "unknown" if running is None else ("running" if running else "ended")
    fields = {
        "record": record.model_dump_json(), "host": record.host, "state": state,
        "exit_code": exit_code, "signal": signal, "ended_at": ended_at, "note": note,
    }
    with client.pipeline() as pipe:
        pipe.hset(job_key(record.id), mapping=_fields(fields))
        pipe.expire(job_key(record.id), JOB_TTL_S)
        pipe.zadd(jobs_key(record.host), {record.id: record.started_at})
        pipe.expire(jobs_key(record.host), JOB_TTL_S)
        pipe.execute()


def save_offsets(client: Redis, job_id: str, offset: int, stderr_offset: int) -> None:
    """Remember where the last check stopped reading, for the next `check` without offset."""
    with client.pipeline() as pipe:
        pipe.hset(job_key(job_id), mapping={"offset": offset, "stderr_offset": stderr_offset})
        pipe.expire(job_key(job_id), JOB_TTL_S)
        pipe.execute()


def job_fields(client: Redis, job_id: str) -> dict[str, str]:
    """The raw job hash (empty when unknown or expired)."""
    return cast("dict[str, str]", client.hgetall(job_key(job_id)))


def job_host(client: Redis, job_id: str) -> str | None:
    """Host owning a job, or None when the fleet does not know the id."""
    return cast("str | None", client.hget(job_key(job_id), "host"))


def job_offsets(fields: Mapping[str, str]) -> tuple[int, int]:
    """The offsets the last check stopped at (0, 0 before any check)."""
    return _int(fields, "offset") or 0, _int(fields, "stderr_offset") or 0


def job_view(fields: Mapping[str, str], *, host_alive: bool = True) -> JobView | None:
    """A listing entry from a job hash; a running job of a dead host shows `unknown`."""
    raw = fields.get("record")
    if not raw:
        return None
    record = JobRecord.model_validate_json(raw)
    state = fields.get("state", "unknown")
    note = _str(fields, "note")
    if state == "running" and not host_alive:
        state = "unknown"
        note = f"host {record.host} is down; the job was running when last seen"
    if state not in ("running", "ended", "unknown"):
        state = "unknown"
    return JobView(
        id=record.id, host=record.host, pid=record.pid, pgid=record.pgid,
        command=record.command, cwd=record.cwd, output_path=record.output_path,
        started_at=record.started_at, state=state,
        running=None if state == "unknown" else state == "running",
        exit_code=_int(fields, "exit_code"), signal=_int(fields, "signal"),
        ended_at=_float(fields, "ended_at"), note=note, call_id=record.call_id,
    )


def list_jobs(client: Redis, host: str) -> list[JobView]:
    """The jobs Redis knows for a host, oldest first; expired entries are pruned."""
    ids = cast("list[str]", client.zrange(jobs_key(host), 0, -1))
    if not ids:
        return []
    alive = client.exists(alive_key(host)) > 0
    with client.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hgetall(job_key(job_id))
        hashes = pipe.execute()
    views: list[JobView] = []
    gone: list[str] = []
    for job_id, fields in zip(ids, hashes, strict=True):
        view = job_view(fields, host_alive=alive) if fields else None
        if view is None:
            gone.append(job_id)
        else:
            views.append(view)
    if gone:
        client.zrem(jobs_key(host), *gone)
    return views

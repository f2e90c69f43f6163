"""Every name the fleet uses in Redis: keys, channels, queues, tasks; their TTLs; the
call and job states; id validation. Imports nothing (like arq's `constants.py`): both
sides, and every tool that reads Redis, agree on these.

Keys (prefix `bashfleet:`; every key has a TTL or an owner that deletes it):

- `bashfleet:alive:<host>` (string): host lock and heartbeat, the token of the worker
  instance holding the host id. TTL ALIVE_TTL_S (5 s), renewed every second by the
  worker (so a dead worker is seen within seconds); deleted when it stops.
- `bashfleet:host:<host>` (hash): host record: concurrency, labels, version, pid,
  machine, instance, readiness of its two consumers, last heartbeat, each sealed by the
  worker (`seal`, `<role>_ready_seal`: `bashfleet.worker.wire.records`). TTL HOST_TTL_S (1 day),
  renewed by the heartbeat (every RENEW_EVERY_S).
- `bashfleet:hosts` (zset): host id -> last heartbeat, for listings. TTL HOST_TTL_S,
  renewed by heartbeats (every RENEW_EVERY_S); members older than that are pruned by
  them.
- `bashfleet:running:<host>` (set): ids of the calls running on the host (busy slots),
  and BUSY_SENTINEL, which keeps the set (and its TTL) while no call runs: a claim adds
  its id to a set that has its TTL already, so it sets none. TTL RUNNING_TTL_S (1 h),
  renewed by the heartbeat with its sentinel (every RENEW_EVERY_S, and when Redis lost
  the host's record); reset by a starting worker, deleted by a stopping one.
- `bashfleet:call:<call_id>` (hash): call record: state, queue, host, instance, pid,
  pgid, marker (once the call has run 50 ms, else with its end), spill paths and
  sizes, job id, and once it ended its sealed answer (`reply`, also published on the
  caller's channel: kept for a caller that missed the publish, written with the end;
  a call that started a job keeps it apart, `reply:`). TTL CALL_TTL_S (2 days, longer
  than any call runs) while it waits and runs, set by the client; once it ended,
  FINISHED_TTL_S (10 minutes), or JOB_TTL_S when it started a job (a `check` of the
  call's id finds the job through it). What
  `read_output` of an older call needs is on its host's disk (the spill files and
  their owner file), found by asking the live hosts.
- `bashfleet:job:<job_id>` (hash): job record (JobRecord JSON), state, exit code,
  signal, end time, last check offsets, sealed by the worker (`seal`, `offsets_seal`).
  TTL JOB_TTL_S (7 days), renewed at every update and while the job runs.
- `bashfleet:jobs:<host>` (zset): job ids of a host -> start time, for listings.
  TTL JOB_TTL_S, renewed with its jobs and by the heartbeat; members whose job hash
  expired are pruned when listed.
- `bashfleet:owner-jobs:<host>:<space>` (zset): the job ids of one owner on a host ->
  start time: what a listing of an owner's jobs reads (`ps`, `jobs()`), not every job
  of the host. TTL JOB_TTL_S, renewed with its jobs; pruned like the host's list.
  An owner's space (here and in quota keys) is a MAC of its key, not its name
  (`bashfleet.worker.wire.owner_keys.space_of`): no other owner can name its keys.
- `bashfleet:shell:<space>:<session>` (string): a session's shell (ShellState JSON:
  pinned host, cwd, exported and unset variables), shared by every caller of the session (CLI
  `--session`, `Fleet.run(session=)`, native's `session` argument, claude's kept state, each
  MCP server's own session). TTL SESSION_TTL_S (1 day), renewed by each call.
- `bashfleet:session-state:<space>:<session>` (string): what a dialect carries between
  the calls of one agent session (SessionState JSON). TTL SESSION_TTL_S, renewed by
  saves. Both are locked with the owner's key, in the owner's space (a MAC of its key:
  `bashfleet.worker.wire.owner_keys`; no space for an unsigned client): an owner cannot find,
  read or forge another's sessions.
- `bashfleet:nonce:<nonce>` (string): a signed message's nonce, seen once (replays are
  refused). TTL: until the message expires (plus the clock skew allowed).
- `bashfleet:quota:<kind>:<space>` (zset): what one owner holds live of a kind (`jobs`:
  its background jobs; `workspaces`) fleet-wide, member -> when it expires (ms, Redis'
  clock). A cap (BASHFLEET_LIMIT_JOBS...) is checked and taken in one script; its host
  refreshes a live member (a job, at each pass of its watcher) and removes it when it
  ends; a member of a host that died expires after QUOTA_TTL_S. The key expires with
  its last member.
- `bashfleet:transfer:<transfer id>` (list): the framed chunks of one file transfer
  (`bashfleet.worker.wire.transfer`), pushed by one side and popped by the other, at most
  TRANSFER_WINDOW of them waiting. TTL TRANSFER_TTL_S, renewed with each push; the
  reader deletes it at the end.
- `bashfleet:transfer-end:<transfer id>` (list): how it ended, one framed chunk (a
  TransferOutcome) pushed by the host, popped by the client. TTL TRANSFER_TTL_S.
- `bashfleet:reply:<task_id>` (string): a task's answer (a control reply; a CallResult
  whose call started a job, or that was sent apart from the call's end), also published
  on the caller's channel `bashfleet:replies:<client>`. Kept REPLY_TTL_S (10 minutes)
  for a caller that missed the publish. A call's other answers are in its record.

- `bashfleet:events` (stream): job events (a job started, a job ended), each as one
  sealed JobEvent JSON (`bashfleet.worker.wire.events.seal_event`), newest last; capped at
  EVENTS_MAXLEN entries (approximately) and expiring JOB_TTL_S after the last one.
  Each is also published on the channel `bashfleet:events` as `<stream id>\n<event>`:
  listeners hear it at once, and read the stream from the last id they saw after a
  reconnect.

Celery's own keys are Celery's: the queue lists (named like the queues below: one list
per queue, as `priority_steps` is [0] on both sides) and kombu's `_kombu.binding.*`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Literal

PREFIX = "bashfleet:"

#: What an owner may be: a session (`session:<id>`), a user (`user:<name>`), a tenant.
OWNER_PATTERN = r"^[A-Za-z0-9_.:@-]{0,128}$"
#: A workspace id: `w` and 15 hex digits, unique across hosts and time.
WORKSPACE_ID_PATTERN = r"^w[0-9a-f]{15}$"

#: Seconds between two heartbeats of a worker.
HEARTBEAT_INTERVAL_S = 1.0
#: Seconds between two heartbeats that renew the TTLs of hours (the host record's, the
#: host listing's, the busy-slot set's, the jobs index's): the beats between write only
#: what tells a live host (`bashfleet.worker.fleet.registry.heartbeat`).
RENEW_EVERY_S = 60.0
#: Life of the host lock without a heartbeat: a dead worker is seen within this.
ALIVE_TTL_S = 5
#: Life of a host record (and the host listing) without a heartbeat.
HOST_TTL_S = 24 * 3600
#: Life of the busy-slot set without a heartbeat.
RUNNING_TTL_S = 3600
#: The member a host's busy set always holds (no call id is empty): Redis deletes a set
#: that empties, with its TTL, and the claim that made it again would have to set one.
BUSY_SENTINEL = ""
#: Life of a call record while it waits and runs (longer than any call may run).
CALL_TTL_S = 2 * 24 * 3600
#: Life of a call record once the call ended (or was withdrawn, or lost), unless it
#: started a job: at 1,000 calls/s a finished call is ~1.6 KB for this long (record and
#: reply), ~1 GB in all. Longer than a signed message is valid (auth.DEFAULT_TTL_S plus
#: the clock skew): a message delivered again meets its call's record and is refused.
FINISHED_TTL_S = 600
#: Life of a job record after its last update.
JOB_TTL_S = 7 * 24 * 3600
#: A stored reply: only for a caller that missed its publish, which reads it within
#: seconds (its watch looks every half second); kept as long as a finished call's record.
REPLY_TTL_S = FINISHED_TTL_S
#: Life of a session's shell and dialect state after its last call.
SESSION_TTL_S = 24 * 3600
#: Job events kept for catch-up reads (a listener away longer misses the oldest).
EVENTS_MAXLEN = 10_000
#: Life of an owner's quota member (a live job) without a refresh by its host: what
#: a host that died holds is given back within this.
QUOTA_TTL_S = 60


class CallState(StrEnum):
    """Where a call is: `queued` (the client sent it) -> `running` (a worker claimed it)
    -> `done`; `cancelled` / `abandoned` before it started (it never runs);
    `cancelling` / `stopping` while its processes are being killed (then `cancelled` /
    `stopped`); `lost` when its worker died."""

    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    STOPPING = "stopping"
    DONE = "done"
    CANCELLED = "cancelled"
    STOPPED = "stopped"
    ABANDONED = "abandoned"
    LOST = "lost"


#: States of a call whose processes may be alive on its host.
CALL_ACTIVE: tuple[CallState, ...] = (CallState.RUNNING, CallState.CANCELLING, CallState.STOPPING)
#: States of a call that never ran and never will.
CALL_UNSTARTED: tuple[CallState, ...] = (CallState.CANCELLED, CallState.ABANDONED)
#: States a call never leaves (its record is kept FINISHED_TTL_S from then on).
CALL_FINAL: tuple[CallState, ...] = (
    CallState.DONE, CallState.CANCELLED, CallState.STOPPED, CallState.ABANDONED, CallState.LOST,
)


#: The call record's field that keeps its answer (written by `lua.FINISH`).
CALL_REPLY_FIELD = "reply"


def finished_call_ttl_s(started_job: bool) -> int:
    """How long a finished call's record is kept: a call that started a job as long as
    the job's record (its id finds the job), any other FINISHED_TTL_S."""
    return JOB_TTL_S if started_job else FINISHED_TTL_S


class JobState(StrEnum):
    """A background job as listings show it; `unknown` when its host is down."""

    RUNNING = "running"
    ENDED = "ended"
    UNKNOWN = "unknown"


# ----------------------------------------------------------------------------- tasks


class Task(StrEnum):
    """Celery task names: `exec` on the command queues, the others on the control queue."""

    EXEC = "bashfleet.exec"
    CHECK = "bashfleet.check"
    KILL = "bashfleet.kill"
    READ_OUTPUT = "bashfleet.read_output"
    CANCEL = "bashfleet.cancel"
    DETACH = "bashfleet.detach"
    JOBS = "bashfleet.jobs"
    WRITE_STDIN = "bashfleet.write_stdin"
    RESIZE = "bashfleet.resize"
    CLOSE_STDIN = "bashfleet.close_stdin"
    WORKSPACE_CREATE = "bashfleet.workspace_create"
    WORKSPACE_DELETE = "bashfleet.workspace_delete"
    WORKSPACE_RENEW = "bashfleet.workspace_renew"
    WORKSPACE_NETWORK = "bashfleet.workspace_network"
    WORKSPACES = "bashfleet.workspaces"
    FILE_READ = "bashfleet.file_read"
    FILE_WRITE = "bashfleet.file_write"
    IMAGES = "bashfleet.images"
    IMAGE_PULL = "bashfleet.image_pull"
    IMAGE_REMOVE = "bashfleet.image_remove"
    TRANSFER = "bashfleet.transfer"
    SNAPSHOT_CREATE = "bashfleet.snapshot_create"
    SNAPSHOT_DELETE = "bashfleet.snapshot_delete"
    SNAPSHOT_FETCH = "bashfleet.snapshot_fetch"
    WORKSPACE_FORK = "bashfleet.workspace_fork"
    WORKSPACE_RESTORE = "bashfleet.workspace_restore"


# ---------------------------------------------------------------------- validation

_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_RESERVED_HOSTS = ("any", "pool")


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
        raise ValueError(f"invalid label {label!r}: use 1-64 letters, digits, '_' or '-'")
    return label


def valid_id(value: str) -> bool:
    """True when `value` can be a call, job or session id (what keys and file names take)."""
    return bool(_ID_RE.match(value))


# ---------------------------------------------------------------------------- queues

Role = Literal["exec", "ctl"]
"""A worker's two consumers: `exec` serves the command queues, `ctl` the control queue."""
ROLES: tuple[Role, ...] = ("exec", "ctl")


ANY_EXEC_QUEUE = "bashfleet.any.exec"


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


# ------------------------------------------------------------------------------ keys


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


def owner_jobs_key(host: str, space: str) -> str:
    """Job ids of one owner (by its space) on a host (zset: job id -> start time)."""
    return f"{PREFIX}owner-jobs:{host}:{space}"


def workspace_key(ws_id: str) -> str:
    """A workspace's view, sealed by its host (string: `seal` of WorkspaceView JSON)."""
    return f"{PREFIX}ws:{ws_id}"


def shell_key(session: str, space: str = "") -> str:
    """A session's shell: pinned host, cwd, variables (string: ShellState JSON), in its
    owner's `space` (none for an unsigned client)."""
    return f"{PREFIX}shell:{space}:{session}" if space else f"{PREFIX}shell:{session}"


def session_state_key(session: str, space: str = "") -> str:
    """A dialect session's state (string: SessionState JSON), in its owner's `space`."""
    return (f"{PREFIX}session-state:{space}:{session}" if space
            else f"{PREFIX}session-state:{session}")


def nonce_key(nonce: str) -> str:
    """A signed message's nonce, once seen (TTL: until the message expires)."""
    return f"{PREFIX}nonce:{nonce}"


def snapshot_key(snap_id: str) -> str:
    """A snapshot's record, sealed by its host (string: `seal` of SnapshotRecord JSON):
    what a client lists and what another host trusts when it fetches the snapshot."""
    return f"{PREFIX}snap:{snap_id}"


def quota_key(kind: str, space: str) -> str:
    """What the owner of `space` holds live of `kind` (zset: member -> expiry, ms)."""
    return f"{PREFIX}quota:{kind}:{space}"


#: Seconds a transfer's list lives past its last push (a side that went away).
TRANSFER_TTL_S = 60
#: Chunks a transfer's writer lets wait on its list before it waits for the reader:
#: enough to keep both sides busy, little enough that Redis holds a few MiB per transfer.
TRANSFER_WINDOW = 16


def transfer_key(transfer_id: str) -> str:
    """One file transfer's chunks (list of framed bytes)."""
    return f"{PREFIX}transfer:{transfer_id}"


def transfer_end_key(transfer_id: str) -> str:
    """How one file transfer ended (list: one framed TransferOutcome)."""
    return f"{PREFIX}transfer-end:{transfer_id}"


def reply_key(task_id: str) -> str:
    """A task's stored reply (string)."""
    return f"{PREFIX}reply:{task_id}"


EVENTS_KEY = f"{PREFIX}events"
"""Job events (stream: one `e` field, a JobEvent's JSON)."""
EVENTS_CHANNEL = f"{PREFIX}events"
"""Where each job event is also published, as `event_message` builds it."""


def event_message(entry_id: str, event_json: str) -> str:
    """A job event as published: its stream id, a newline, the event."""
    return f"{entry_id}\n{event_json}"


def parse_event_message(message: str) -> tuple[str, str] | None:
    """(stream id, event JSON) of a published job event; None when malformed."""
    entry_id, newline, payload = message.partition("\n")
    return (entry_id, payload) if newline and entry_id else None


# -------------------------------------------------------------------------- replies

#: Channels callers listen on for their replies: `<prefix><client token>`.
REPLY_CHANNEL_PREFIX = f"{PREFIX}replies:"
_REPLY_CHANNEL_RE = re.compile(r"^bashfleet:replies:[A-Za-z0-9_-]{1,64}$")


def reply_channel(token: str) -> str:
    """The channel a client with `token` listens on for all its replies."""
    return f"{REPLY_CHANNEL_PREFIX}{token}"


def valid_reply_channel(channel: str | None) -> bool:
    """True for a channel a worker may publish a reply on (none other is used)."""
    return bool(channel) and _REPLY_CHANNEL_RE.match(channel or "") is not None


def parse_reply_message(message: str) -> tuple[str, str] | None:
    """(task id, reply) of a reply channel's message (the task id, a newline, the reply:
    as the FINISH and REPLY scripts of `bashfleet.worker.wire.lua` publish it); None
    when malformed."""
    task_id, newline, payload = message.partition("\n")
    return (task_id, payload) if newline and task_id else None

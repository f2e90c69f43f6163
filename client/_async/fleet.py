"""The fleet client, written once: `bashfleet.client.aio.AsyncFleet` is the class of
`client/_async/fleet.py`, and `bashfleet.client.fleet.Fleet` the same class in
`client/_sync/fleet.py`, which `scripts/unasync.py` generates from it (dropping `async`,
`await` and the `Async` prefix of names; checked in, and a test fails when it differs).

    async with AsyncFleet() as fleet:        # BASHFLEET_REDIS_URL, else the local fleet
        result = await fleet.run("make test", host="build-1")
        job = (await fleet.run("./serve.sh", mode="background")).job
        await fleet.check(job.id); await fleet.kill(job.id)

What the client decides is the core's (`bashfleet.client._core`, no I/O): how a request is
validated and signed, where a call goes, what an answer means, when a call waited for
is lost. What this layer does is Redis I/O (`bashfleet.client._async.records`), in the order the
core asks for it:

- a call is one Lua script that records it and pushes its Celery message (the JSON
  kombu would push: `bashfleet.worker.wire.messages`) in one round trip; a control call (check,
  kill, read_output, cancel, jobs, write_stdin...) is one message pushed on the owning
  host's control queue, served apart from the command slots. No Celery in a client.
- answers arrive on the client's reply channel, heard by one listener
  (`bashfleet.client._async.replies`); a call waits on its own slot;
- calls in flight are watched together: every WATCH_INTERVAL_S one pipelined round
  trip reads every waiting call's stored answer and record and the locks of their
  hosts (a worker that dies shows as WorkerLost within seconds; the command is never
  sent again);
- backpressure is explicit: at most `max_in_flight` calls sent and not answered (more
  wait in the client, unsent), at most `redis_concurrency` Redis commands under way;
- every error a worker answers is a typed exception (`bashfleet.client.errors`).

The asyncio client belongs to one event loop; the blocking one serves any number of
threads (its listener and watch are threads: two, whatever the calls in flight).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

import redis
import redis.sentinel

from bashfleet.client import shells
from bashfleet.client._async import records
from bashfleet.client._async.concurrency import (
    CANCELLED,
    AsyncEvent,
    AsyncLoopGuard,
    AsyncSemaphore,
    AsyncSlot,
    AsyncTasks,
    sleep,
)
from bashfleet.client._async.events import follow
from bashfleet.client._async.replies import Answer, AsyncReplies
from bashfleet.client._async.shells import AsyncShellStore
from bashfleet.client._async.workspace import AsyncWorkspace
from bashfleet.client._core.constants import (
    BUILD_TIMEOUT_S,
    CTL_TIMEOUT_S,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_REDIS_CONCURRENCY,
    FULL_OUTPUT_MAX_BYTES,
    IDLE_TICK_S,
    PULL_POLL_S,
    TIMED_WAIT_TICK_S,
    WATCH_INTERVAL_S,
)
from bashfleet.client._core.events import EventCursor, job_matches
from bashfleet.client._core.identity import (
    outage_grace_s,
    record_keys_at,
    require_url,
    resolve_identity,
)
from bashfleet.client._core.messages import (
    ErrorFor,
    build_call,
    control_message,
    control_request,
    decode_control,
    decode_result,
    exec_message,
    raise_if_not_run,
    run_request,
)
from bashfleet.client._core.output import FullRead, OutputMode, full_reads, with_full_output
from bashfleet.client._core.routing import (
    CallProgress,
    Placement,
    Route,
    ask_every_host,
    call_record_of,
    checked_call_id,
    checked_id,
    host_down,
    job_target,
    output_host,
    pool_members,
    route,
    unknown_call,
    unknown_job,
    unknown_output,
)
from bashfleet.client._core.watch import (
    Outage,
    Pending,
    Verdict,
    control_verdict,
    labels_to_read,
    note_lock,
    note_queue,
    verdict,
)
from bashfleet.client._core.workspaces import (
    choose_host,
    open_snapshot,
    open_view,
    owned_by_host,
    started_by,
)
from bashfleet.client.errors import (
    BashfleetError,
    CallRejected,
    FleetUnavailable,
    HostUnavailable,
    ImageError,
    UnknownCall,
    UnknownJob,
    UnknownSnapshot,
    UnknownWorkspace,
    WaitTimeout,
    WorkerError,
    WorkerLost,
    error_for,
    image_error_for,
    snapshot_error_for,
)
from bashfleet.worker.fleet.connect import AsyncRedis, async_redis_client, safe_url
from bashfleet.worker.wire import names
from bashfleet.worker.wire.control import (
    MAX_READ_LIMIT,
    CancelRequest,
    CancelResult,
    CheckRequest,
    CloseStdinRequest,
    Collect,
    ControlRequest,
    DetachRequest,
    DetachResult,
    ImageList,
    ImagePull,
    ImagePullRequest,
    ImageRemoved,
    ImageRemoveRequest,
    ImagesRequest,
    JobList,
    JobsRequest,
    KillRequest,
    ReadOutputRequest,
    ResizeRequest,
    SessionOutput,
    SnapshotDeleted,
    SnapshotDeleteRequest,
    SnapshotFetch,
    SnapshotFetchRequest,
    WorkspaceCreateRequest,
    WriteStdinRequest,
)
from bashfleet.worker.wire.events import EventKind, JobEvent, event_matches
from bashfleet.worker.wire.models import (
    SNAPSHOT_ID_PATTERN,
    CallResult,
    CheckResult,
    HostInfo,
    ImageInfo,
    JobView,
    Model,
    OutputChunk,
    RunRequest,
    Snapshot,
    SnapshotRecord,
    Truncation,
    WorkspaceLimits,
    WorkspaceView,
)
from bashfleet.worker.wire.names import CallState
from bashfleet.worker.wire.network import NetworkPolicy
from bashfleet.worker.wire.network import parse as parse_network
from bashfleet.worker.wire.records import readers_job

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Model)
T = TypeVar("T")
P = ParamSpec("P")

#: The watch's name among a client's background work.
WATCH = "bashfleet-watch"

_REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)
#: A Sentinel that knows no primary (or replica) by the URL's name.
_NO_PRIMARY = (redis.sentinel.MasterNotFoundError, redis.sentinel.SlaveNotFoundError)


def unreachable(url: str, exc: BaseException) -> FleetUnavailable:
    """Redis at `url` (password hidden) failed, said in one line: a Sentinel that knows
    no primary by that name is said so (redis-py's own message goes on with the repr of
    every sentinel's client, some 1,500 characters)."""
    reason = str(exc)
    if isinstance(exc, _NO_PRIMARY):
        reason = (reason.split(" : ", 1)[0]
                  + ": no sentinel answered for it (are they up, and do they monitor it?)")
    return FleetUnavailable(f"Redis at {url} is unreachable: {reason}")


#: What a call of a closed client fails with.
CLOSED = "the fleet client was closed"


@dataclass(frozen=True)
class SentControl:
    """A control request on its way: what waiting for its answer needs."""

    host: str
    task_id: str
    token: str
    """The lock token of the host's instance when it was sent."""
    slot: AsyncSlot[Answer]
    timeout: float
    deadline: float


class AsyncFleet:
    """A client of the fleet. Cheap to keep for the life of a process.

    `redis_url`: the fleet's Redis (default BASHFLEET_REDIS_URL, else the local fleet of
    `bashfleet up`). `owner`: who this client's calls and jobs belong to (default:
    BASHFLEET_OWNER, else `user:<login>`); another owner's jobs are unknown to it.
    `admin`: sign with the admin key when one is configured (BASHFLEET_ADMIN_KEY, or the
    local fleet's), to reach every owner's jobs. `max_in_flight`: calls sent and not
    answered, at most (the others wait their turn in this process, unsent).
    `redis_concurrency`: Redis commands under way at once (the connections it holds).
    """

    def __init__(
        self, redis_url: str | None = None, *, owner: str | None = None, admin: bool = False,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        redis_concurrency: int = DEFAULT_REDIS_CONCURRENCY,
    ) -> None:
        if max_in_flight < 1 or redis_concurrency < 1:
            raise ValueError("max_in_flight and redis_concurrency must be at least 1")
        url = require_url(redis_url)
        self.url = safe_url(url)
        """The Redis URL with its password hidden (for messages)."""
        self.max_in_flight = max_in_flight
        """Calls sent and not answered, at most."""
        identity = self._identity = resolve_identity(url, owner, admin)
        self.owner = identity.owner
        """Who this client's calls and jobs belong to."""
        self.admin = identity.admin
        """True when this client signs with the admin key."""
        self._asked_url = redis_url
        self._raw_url = url
        self._redis = async_redis_client(url)
        self._keys = identity.reply_keys()
        # What verifies the host and job records and the job events workers publish.
        self._record_keys = identity.record_keys()
        self._tasks = AsyncTasks()
        self._replies = AsyncReplies(self._redis, self._tasks)
        self._shells = AsyncShellStore(self._redis, key=identity.shell_key,
                                       space=identity.shell_space)
        self._outage_grace_s = outage_grace_s(url)
        self._slots = AsyncSemaphore(max_in_flight)
        self._io = AsyncSemaphore(redis_concurrency)
        self._loop = AsyncLoopGuard()
        self._pending: dict[str, Pending] = {}
        # Workspaces this client is making now, by host: placed before Redis lists them.
        self._placing: Counter[str] = Counter()
        # Calls whose message is being pushed: `close` waits for them to be pending (or
        # refused) before it cancels what is pending.
        self._sending: set[str] = set()
        self._closing = AsyncEvent()
        # Another fleet's Redis (the local fleet brought down and up) and its keys, by URL.
        self._event_clients: dict[str, tuple[AsyncRedis, dict[str, str]]] = {}
        # File transfers' chunks are bytes: a client of their own (made on first use).
        self._chunks: AsyncRedis | None = None

    async def close(self) -> None:
        """Close the connections (the object is unusable afterwards). Nothing is sent from
        now; the calls still waited for fail (FleetUnavailable) and are cancelled on the
        fleet, as are those whose callers gave up, before the connections close: no one
        is left to hear their results."""
        self._closing.set()
        await self._settle_sends()
        abandoned = list(self._pending)
        self._fail_all(FleetUnavailable(CLOSED))
        for call_id in abandoned:
            self._tasks.spawn(f"cancel-{call_id}", functools.partial(self._abandon, call_id))
        await self._tasks.join()
        self._replies.close()
        await self._tasks.stop()
        clients = [self._redis, *(each for each, _ in self._event_clients.values())]
        for client in [*clients, *([self._chunks] if self._chunks is not None else [])]:
            with contextlib.suppress(*_REDIS_ERRORS):
                await client.aclose()

    async def __aenter__(self) -> AsyncFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def in_flight(self) -> int:
        """Calls sent and not answered yet."""
        return len(self._pending)

    # ------------------------------------------------------------------------ run

    async def run(
        self, command: str, *, check: bool = True, output: OutputMode = "tail",
        max_output_bytes: int = FULL_OUTPUT_MAX_BYTES, **options: Any,
    ) -> CallResult:
        """Run `command` and wait for its result; `options` are `RunRequest`'s fields
        (host, label, mode, timeout, cwd, session, policy, env, call_id, head, tail,
        unset_env, capture_state, tags, stdin...). An unknown or invalid option is a
        CallRejected, nothing sent.

        `host` None: any live host (`label`: a host of that pool). `mode`: `default`
        (the policy's timeout), `slow` (15 minutes unless `timeout` says otherwise) or
        `background` (start it detached, return its job at once). A `session` is a
        shell that lives on in Redis: its calls run on the host of its first call (asking
        for another host is a SessionPinned error), and each starts in the directory and
        with the variables the previous ones left. `call_id` (default: a fresh one) lets
        another caller `cancel` or `detach` the call.

        The result's `stdout` and `stderr` are the output as the native policy shows it:
        the last 2000 lines / 50 KB of each stream, the rest left out (its counts in
        `stdout_truncation` / `stderr_truncation`, the whole in the call's spill files on
        its host: `result.spill`). `output="full"` reads the whole output back (through
        `read_output`) into the result, up to `max_output_bytes` of stdout and stderr
        together (OutputTooLarge past it).

        `check` (default True): a call that did not run at all (a bad cwd, a blocked or
        invalid command, a refused signature, a spawn failure, no worker to take it, a
        background job past its owner's cap) raises CallNotRun, which carries its kind,
        message and result; `check=False` returns that result instead (its `error` says
        why). A command that ran and failed is never an error: see `exit_code`,
        `signal`, `timed_out`.
        """
        return await self.execute(run_request(command, options), check=check, output=output,
                                  max_output_bytes=max_output_bytes)

    async def execute(
        self, request: RunRequest, *, check: bool = False, output: OutputMode = "tail",
        max_output_bytes: int = FULL_OUTPUT_MAX_BYTES,
    ) -> CallResult:
        """Run a `RunRequest` (what `run` builds) and wait for its result (`run` says what
        `check`, `output` and `max_output_bytes` do).

        The dialects' `Runner` method: a call that did not run is in its result (`error`),
        which a dialect renders as text for its model, unless `check` asks for CallNotRun
        (`run` asks by default).

        With a `session`, the call runs in the session's shell (`bashfleet.client.shells`): on its
        pinned host, in its cwd, with its variables; and what the call changed (a `cd`,
        an `export`, an `unset`) is kept for the session's next call, whoever makes it.
        An asyncio task awaiting it that is cancelled cancels the call too (withdrawn if
        queued, its processes killed if running), as `cancel` does.
        """
        if output not in ("tail", "full"):
            raise CallRejected(f"invalid output {output!r}: 'tail' or 'full'")
        if request.session is None:
            result = await self._execute(request)
        else:
            result = await self._execute_in_session(request, request.session)
        if check:
            raise_if_not_run(result)
        if output == "full":
            result = await self._full_output(result, max_output_bytes)
        return result

    async def _execute_in_session(self, request: RunRequest, session: str) -> CallResult:
        if not names.valid_id(session):
            raise CallRejected(f"invalid session id {session!r}")
        shell = await self._call(self._shells.load, session)
        if shell.workspace is None and request.workspace is None:
            shell = await self._session_workspace(session, shell, request)
        elif shell.workspace is None and request.workspace is not None:
            # An agent session's workspace (a dialect's): the shell lives in it from now,
            # whoever calls next (the CLI's --session included).
            shell = await self._call(self._shells.commit, session, shells.ShellChange(
                host=request.host, workspace=request.workspace))
        result = await self._execute(shells.fill_request(shell, request))
        if (shell.workspace is not None and request.workspace is None
                and shells.workspace_gone(result)):
            # Its workspace ended (unused past its TTL): a new one, said so in the result.
            # (A caller that named it, an agent session, is told it ended: it asks for
            # the session's workspace again, `workspace(session=)`, and says so itself.)
            await self._refuse_another_owners(session, shell.workspace)
            shell = await self._session_workspace(session, shell, request, replace=True)
            # The refused attempt ran nothing: its id (the caller's, to cancel it) is the
            # new attempt's.
            await self._r(records.forget_call, result.call_id)
            result = shells.with_new_workspace(
                await self._execute(shells.fill_request(shell, request)))
        change = shells.change_of(result)
        if change:
            try:
                await self._call(self._shells.commit, session, change)
            except (FleetUnavailable, redis.RedisError) as exc:
                # The call ran: its result matters more than the session's next cwd.
                log.warning("session %s: could not save its shell: %s", session, exc)
        return result

    async def _execute(self, request: RunRequest) -> CallResult:
        if request.workspace is not None and request.host is None:
            # A call in a workspace runs on its host: from its sealed view in Redis.
            view = await self._workspace_view(request.workspace)
            request = request.model_copy(update={"host": view.host})
        call = build_call(request, self.owner)
        async with self._slots:
            where = await self._route(Placement.of(request))
            message = exec_message(self._identity, call, where.queue, self._replies.channel)
            slot = await self._replies.expect(call.call_id)
            sent = False
            try:
                await self._send_call(call.call_id, where, message)
                sent = True
                return await self._wait_call(Pending(call.call_id, where), slot)
            except CANCELLED:
                if sent and not self._closing.is_set():  # (`close` cancelled it then)
                    # The caller gave up: so does the fleet (withdraw, or kill), before
                    # the caller's task ends (an event loop's shutdown waits for that).
                    await self._cancel_now(call.call_id)
                raise
            finally:
                self._replies.forget(call.call_id)

    async def _refuse_another_owners(self, session: str, workspace_id: str | None) -> None:
        """CallRejected when the session's workspace is there but another owner's (an MCP
        session's, say): its host answered as for an ended one, and making one of this
        owner's would take the session's shell from its owner."""
        if workspace_id is None:
            return
        sealed = (await self._r(records.workspace_views, [workspace_id]))[0]
        view = open_view(self._record_keys, workspace_id, sealed)
        if view is not None and view.owner != self.owner:
            raise CallRejected(
                f"session {session} lives in workspace {workspace_id} of another owner: a "
                "client of its owner (BASHFLEET_OWNER, Fleet(owner=)) runs its calls; or use "
                "another session")

    async def _session_workspace(self, session: str, shell: shells.ShellState,
                                 request: RunRequest, *, replace: bool = False,
                                 ) -> shells.ShellState:
        """The session's workspace, made at its first call (on its pinned host, or where
        the call goes), at the directory of that call's cwd when the host allows it;
        laid onto the shell so that every caller of the session shares one (the first
        made wins: a concurrent one made meanwhile is deleted)."""
        host = shell.host or request.host
        workspace = await self._new_workspace(
            host=host, label=None if host else request.label, ttl_s=names.SESSION_TTL_S,
            near=request.cwd or request.default_cwd, session=session,
            isolation=request.isolation, network=request.network)
        change = shells.ShellChange(host=workspace.host, workspace=workspace.id,
                                    force_workspace=replace)
        stored = await self._call(self._shells.commit, session, change)
        if stored.workspace != workspace.id:
            await workspace.delete()  # another caller's made first: the session's
        return stored

    async def _route(self, placement: Placement) -> Route:
        """Where a call goes (`bashfleet.client._core.routing.route`), from the live hosts when no
        host is named."""
        if not placement.needs_live_hosts:
            return route(placement)
        live = await self._r(records.live_hosts)
        infos: list[HostInfo] = []
        if placement.label is not None and live:
            infos = await self._r(records.list_hosts, live, keys=self._record_keys)
        return route(placement, live, infos)

    async def _send_call(self, call_id: str, where: Route, message: str) -> None:
        """Record the call and push its message: one round trip, one Lua script that also
        checks the named host is alive."""
        if self._closing.is_set():
            raise FleetUnavailable(CLOSED)
        self._sending.add(call_id)
        try:
            await self._push_call(call_id, where, message)
        finally:
            self._sending.discard(call_id)

    async def _push_call(self, call_id: str, where: Route, message: str) -> None:
        target = where.target
        tag = self._identity.call_tag(call_id)
        sent = await self._r(records.send_call, call_id, where.queue, target, message,
                             require_alive=target is not None, owner_tag=tag)
        if sent == "down" and target is not None:
            await self._require_alive(target)  # raises HostUnavailable, naming live hosts
            sent = await self._r(records.send_call, call_id, where.queue, target, message,
                                 require_alive=False, owner_tag=tag)
        if sent == "taken":
            raise CallRejected(f"call id {call_id} is already in use")

    async def _require_alive(self, host: str) -> str:
        """The lock token of the host's live instance; HostUnavailable when none holds it."""
        token = await self._r(records.host_alive_token, host)
        if token is None:
            raise host_down(host, await self._r(records.live_hosts))
        return token

    async def _wait_call(self, pending: Pending, slot: AsyncSlot[Answer]) -> CallResult:
        """The call's result: its answer, or what the watch found wrong with it."""
        if self._closing.is_set():  # closed while it was pushed: `close` did not see it
            await self._cancel_now(pending.call_id)
            raise FleetUnavailable(CLOSED)
        self._pending[pending.call_id] = pending
        try:
            self._tasks.start_once(WATCH, self._watch_calls)
            answer = await slot.wait()
        finally:
            self._pending.pop(pending.call_id, None)
        if isinstance(answer, str):
            return decode_result(self._keys, pending.call_id, answer)
        if isinstance(answer, CallResult):
            return answer
        raise answer if answer is not None else WorkerError(f"call {pending.call_id}: no answer")

    async def _cancel_now(self, call_id: str) -> None:
        """Cancel a call no one waits for, and wait for that (`close` waits too, should
        the waiting caller be cancelled again)."""
        await self._tasks.finish(f"cancel-{call_id}", functools.partial(self._abandon, call_id))

    async def _abandon(self, call_id: str) -> None:
        """Cancel a call no one waits for: withdrawn if queued, else its host told to kill
        it. Its host's answer is not waited for (no one would read it): an event loop
        shutting down, or a closing client, gets its cancels sent in a round trip or
        three, and starts no listener again."""
        with contextlib.suppress(BashfleetError):
            previous = await self._r(records.withdraw_call, call_id, CallState.CANCELLED)
            if previous != CallState.RUNNING:
                return
            host = (await self._r(records.call_record, call_id)).get("host")
            if host:
                await self._r(records.push, names.ctl_queue(host), self._control_message(
                    host, CancelRequest(call_id=call_id), uuid.uuid4().hex, CTL_TIMEOUT_S))

    async def _settle_sends(self) -> None:
        """Wait until no call is half sent (each push is one round trip)."""
        deadline = time.monotonic() + CTL_TIMEOUT_S
        while self._sending and time.monotonic() < deadline:
            await sleep(0.01)  # a condition polled with a deadline: a push in progress

    async def _full_output(self, result: CallResult, max_bytes: int) -> CallResult:
        """The result with its whole output read back (`bashfleet.client._core.output`)."""
        texts = {}
        for read in full_reads(result, max_bytes):
            texts[read.stream] = await self._read_whole(result.call_id, read)
        return with_full_output(result, texts) if texts else result

    async def _read_whole(self, call_id: str, read: FullRead) -> str:
        parts = []
        offset = 0
        while True:
            chunk = await self.read_output(call_id, offset=offset, limit=MAX_READ_LIMIT,
                                           stream=read.stream)
            parts.append(chunk.text)
            if chunk.eof or chunk.next_offset <= offset:
                return "".join(parts)
            offset = chunk.next_offset

    # ------------------------------------------------------------------ the watch

    async def _watch_calls(self) -> None:
        """Watch every waiting call, one pass per WATCH_INTERVAL_S, until none waits."""
        outage = Outage(self._outage_grace_s)
        while not await self._closing.wait(WATCH_INTERVAL_S):
            if self._tasks.retire(WATCH, lambda: not self._pending):
                return
            try:
                await self._watch_pass()
                outage.ended()
            except (FleetUnavailable, redis.RedisError) as exc:
                if outage.outlasted(time.monotonic()):
                    self._fail_all(exc if isinstance(exc, FleetUnavailable) else
                                   unreachable(self.url, exc))
            except Exception as exc:  # a bug of ours: tell the callers, never leave them
                log.exception("the watch of the calls in flight failed")
                self._fail_all(WorkerError(f"the client's watch failed: {exc!r}"))

    def _fail_all(self, error: BashfleetError) -> None:
        for pending in list(self._pending.values()):
            self._replies.deliver(pending.call_id, error)

    async def _watch_pass(self) -> None:
        waiting = [p for p in list(self._pending.values())
                   if not self._replies.answered(p.call_id)]
        if not waiting:
            return
        hosts = {h for p in waiting for h in (p.target, p.host) if h}
        snapshot = await self._r(records.watch_snapshot, [p.call_id for p in waiting], hosts)
        queued = [p for p, record in zip(waiting, snapshot.records, strict=True)
                  if record.get("state") in (CallState.QUEUED, None)]
        live = await self._live_for(queued)
        await self._scan_queues(queued)
        now = time.monotonic()
        for pending, answer, record in zip(waiting, snapshot.answers, snapshot.records,
                                           strict=True):
            if answer is not None:
                self._replies.deliver(pending.call_id, answer)
                continue
            pending.host = record.get("host") or pending.host
            note_lock(pending, snapshot.tokens, now)
            found = verdict(pending, record, snapshot.tokens, live.get(pending.label or ""),
                            now)
            if found.problem is not None:
                await self._conclude(pending, found)

    async def _live_for(self, queued: list[Pending]) -> dict[str, list[str]]:
        """Live hosts that could take each untargeted queued call, by its label ("" for
        any host); read only when such a call waits."""
        labels = labels_to_read(queued)
        if not labels:
            return {}
        alive = await self._r(records.live_hosts)
        infos = await self._r(records.list_hosts, alive, keys=self._record_keys) \
            if labels - {""} and alive else []
        return {label: pool_members(label, infos) if label else alive for label in labels}

    async def _scan_queues(self, queued: list[Pending]) -> None:
        """Note which queued calls' messages are gone from their queues (taken by a
        consumer that never claimed them); one read per queue."""
        now = time.monotonic()
        for queue in {p.route.queue for p in queued}:
            ids = await self._r(records.queued_ids, queue)
            for pending in queued:
                if pending.route.queue == queue:
                    note_queue(pending, ids, now)

    async def _conclude(self, pending: Pending, found: Verdict) -> None:
        """End a call the watch found in trouble (withdrawing it first when it was queued);
        an answer stored meanwhile wins."""
        if found.withdraw:
            previous = await self._r(records.withdraw_call, pending.call_id)
            if previous != CallState.QUEUED:
                return  # a worker took it after all: watch it as a running call
        stored = await self._r(records.stored_reply, pending.call_id)
        if stored is not None:
            self._replies.deliver(pending.call_id, stored)
        elif found.problem is not None:
            self._replies.deliver(pending.call_id, found.problem)

    # -------------------------------------------------------------------- control

    async def check(
        self, id: str, *, grep: str | None = None, offset: int | None = None,
        stderr_offset: int | None = None, truncation: Truncation | None = None,
    ) -> CheckResult:
        """A job's state and its output since `offset` (None: since the last check).

        "The last check" is any client's: the offsets are kept in the job's record.
        `truncation` cuts the new output (default: the last 2000 lines). `id`: the job's,
        or the call's that started it.
        """
        return await self.check_job(control_request(
            CheckRequest, id=id, grep=grep, offset=offset, stderr_offset=stderr_offset,
            truncation=truncation,
        ))

    async def check_job(self, request: CheckRequest) -> CheckResult:
        """`check`, from its request model."""
        host, job_id = await self._job_target(request.id)
        return await self._control(host, request.model_copy(update={"id": job_id}),
                                   CheckResult)

    async def kill(
        self, id: str, *, offset: int | None = None, stderr_offset: int | None = None,
        truncation: Truncation | None = None,
    ) -> CheckResult:
        """End a job; its final state and its output since `offset` (None: the last check)."""
        return await self.kill_job(control_request(
            KillRequest, id=id, offset=offset, stderr_offset=stderr_offset,
            truncation=truncation,
        ))

    async def kill_job(self, request: KillRequest) -> CheckResult:
        """`kill`, from its request model."""
        host, job_id = await self._job_target(request.id)
        return await self._control(host, request.model_copy(update={"id": job_id}),
                                   CheckResult)

    async def read_output(
        self, id: str, *, offset: int = 0, limit: int = 65536, grep: str | None = None,
        stream: Literal["stdout", "stderr"] = "stdout",
    ) -> OutputChunk:
        """A slice of a job's output, or of the kept (spilled) output of a call."""
        return await self.read_chunk(control_request(
            ReadOutputRequest, id=id, offset=offset, limit=limit, grep=grep, stream=stream
        ))

    async def read_chunk(self, request: ReadOutputRequest) -> OutputChunk:
        """`read_output`, from its request model."""
        found = await self._r(records.lookup_id, checked_id(request.id, "job or call"))
        if ask_every_host(found):
            return await self._read_on_some_host(request)
        return await self._control(output_host(request.id, found), request, OutputChunk)

    async def _read_on_some_host(self, request: ReadOutputRequest) -> OutputChunk:
        """The kept output of an id Redis no longer knows (a call's record is kept
        minutes after its end, its output files on its host for days): each live host is
        asked in turn; the one that keeps it answers, the others say it is unknown."""
        for host in await self._r(records.live_hosts):
            with contextlib.suppress(UnknownJob):
                return await self._control(host, request, OutputChunk)
        raise unknown_output(request.id)

    async def cancel(self, call_id: str) -> bool:
        """Stop a call: withdraw it if queued, kill its processes if running (its result
        then says `cancelled`). True when it was withdrawn or its processes were
        signalled; False when it had ended already. UnknownCall for an id no call has.
        """
        record = await self._own_call(call_id)
        previous = await self._r(records.withdraw_call, call_id, CallState.CANCELLED)
        if previous == CallState.QUEUED:
            return True
        if previous != CallState.RUNNING:
            return False
        request = CancelRequest(call_id=call_id)
        try:
            return (await self._control(record["host"], request, CancelResult)).cancelled
        except (UnknownCall, UnknownJob):  # the worker's word for it: told as no call
            raise unknown_call(call_id) from None

    def _acts_on(self, owner: str) -> bool:
        """Whether this client acts on what `owner` owns: its own; anyone's for a client
        of the fleet or admin key (the operator's)."""
        return owner == self.owner or not self._identity.owner_key

    async def _own_call(self, call_id: str) -> Mapping[str, str]:
        """A call's record, when it is this client's to act on (`Identity.owns_call`);
        another owner's call is UnknownCall, as no call is, word for word."""
        record = call_record_of(
            call_id, await self._r(records.call_record, checked_call_id(call_id)))
        if not self._identity.owns_call(call_id, record):
            raise unknown_call(call_id)
        return record

    async def detach(self, call_id: str) -> bool:
        """Leave a running foreground call running as a background job.

        True when the call was asked to: its own result (the one `run` returns) then
        names the job (`CallResult.job`). False when it was not running (yet: a call is
        detachable once it has run 50 ms) or had ended already. UnknownCall for an id
        no call has.
        """
        record = await self._own_call(call_id)
        if record.get("state") != CallState.RUNNING:
            return False
        request = DetachRequest(call_id=call_id)
        try:
            return (await self._control(record["host"], request, DetachResult)).detached
        except (UnknownCall, UnknownJob):  # the worker's word for it: told as no call
            raise unknown_call(call_id) from None

    async def call_progress(self, call_id: str) -> CallProgress:
        """How far a call got: queued (on which host, when sent to one), running (where),
        ended; from its record (`bashfleet run`'s spinner says `queued on b`, then
        `running on b`): words to show, not verified claims."""
        if not names.valid_id(call_id):
            return CallProgress(None, None)
        record = await self._r(records.call_record, call_id)
        return CallProgress(record.get("state") or None, record.get("host") or None)

    async def call_host(self, call_id: str) -> str | None:
        """The host a call runs (or ran) on; None while it waits in a queue for any host,
        or when the call is unknown (`bashfleet run`'s spinner names it once known).
        Read from the call record's host field as control calls route by it: a name to
        show, not a verified claim."""
        if not names.valid_id(call_id):
            return None
        return (await self._r(records.call_record, call_id)).get("host") or None

    async def jobs(
        self, host: str | None = None, *, all_owners: bool = False,
        tags: Mapping[str, str] | None = None, owner: str | None = None,
    ) -> list[JobView]:
        """This client's background jobs on one host, or on every host the fleet knows;
        oldest first; only those carrying every tag of `tags`. `all_owners` (an admin
        client only): every owner's, or those of `owner`. Every live host is asked at
        once; a dead one's jobs are what Redis last knew of them."""
        every = all_owners or (owner is not None and owner != self.owner)
        hosts = [host] if host is not None else await self._r(records.known_hosts)
        live = set(await self._r(records.live_hosts))
        request = JobsRequest(all_owners=every)
        asked: dict[str, SentControl] = {}
        for name in hosts:
            if name in live:
                with contextlib.suppress(WorkerLost, HostUnavailable):
                    asked[name] = await self._send_control(name, request)
        views: list[JobView] = []
        for name in hosts:
            views += await self._host_jobs(name, asked.get(name), every)
        return sorted((view for view in views if job_matches(view, tags=tags, owner=owner)),
                      key=lambda view: view.started_at)

    async def _host_jobs(self, host: str, sent: SentControl | None,
                         all_owners: bool) -> list[JobView]:
        if sent is not None:
            try:
                return list((await self._await_control(sent, JobList)).jobs)
            except (WorkerLost, HostUnavailable):
                pass  # it died meanwhile: show what Redis knows
        listed = await self._r(records.list_jobs, host, keys=self._record_keys,
                               space=None if all_owners else self._identity.space)
        return [view for view in listed if all_owners or view.owner == self.owner]

    async def job_views(self, ids: list[str]) -> dict[str, JobView]:
        """What Redis knows of these jobs, by id, in one round trip (no worker is asked):
        how a dialect learns which of its jobs ended. Unknown ids are left out."""
        return await self._r(records.job_views, [i for i in ids if names.valid_id(i)],
                             keys=self._record_keys)

    async def hosts(self) -> list[HostInfo]:
        """Every host seen in the last day: alive or not, slots, busy and queued, labels
        (a host whose record does not verify is left out, with a warning)."""
        return await self._r(records.list_hosts, keys=self._record_keys)

    async def shared_queues(self) -> dict[str, int]:
        """Calls waiting in the queues no single host owns, by queue name.

        `bashfleet.any.exec` (calls with no host) and `bashfleet.pool.<label>.exec` for
        each label of a known host: any live host (of the label) takes them, so
        `hosts()` counts them for none.
        """
        infos = await self._r(records.list_hosts, keys=self._record_keys)
        labels = sorted({label for info in infos for label in info.labels})
        queues = [names.ANY_EXEC_QUEUE, *(names.pool_queue(label) for label in labels)]
        return await self._r(records.queue_depths, queues)

    # ----------------------------------------------------------------- workspaces

    async def workspace(
        self, *, host: str | None = None, label: str | None = None, path: str | None = None,
        ttl_s: float | None = None, isolation: Literal["none", "process", "strict"] | None = None,
        network: NetworkPolicy | str | bool | None = None,
        limits: WorkspaceLimits | Mapping[str, Any] | None = None,
        mounts: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None,
        near: str | None = None, session: str | None = None, image: str | None = None,
        build: str | os.PathLike[str] | None = None, user: str | None = None,
        snapshot: Snapshot | str | None = None,
        build_network: NetworkPolicy | str | None = None,
    ) -> AsyncWorkspace:
        """Make a workspace: a directory on one host and the namespaces its calls share
        (`AsyncWorkspace`). `host`, else a live host of `label` (else of the fleet): the one
        with the fewest of this owner's workspaces, then the least loaded, then any
        (`choose_host`: made at once, a client's spread evenly). `path`: an existing
        directory under a root the host allows (else a fresh one, removed with it). `ttl_s`:
        seconds it lives unused (the host's default, 1 h). `isolation` (at least the host's)
        and `network`, its network policy (`bashfleet.worker.wire.network`: `egress`, the host's
        default: the internet, never the fleet, the host, link-local or private ranges;
        `none`; `allow=pypi.org,*.pythonhosted.org,10.1.0.0/16`; `host` where the host
        allows it; a `NetworkPolicy`; False is `none`). `limits`: memory_mb, procs, cpus,
        disk_mb of its processes together, open_files of each, never above the host's.
        `mounts`: absolute paths in its calls' view -> its own subdirectories
        (`{"/logs": "logs"}`). LimitReached past the owner's cap.

        `image`: an OCI image reference (`python:3.12-slim`): its root filesystem is the
        workspace's `/` (pulled onto the host first, unless held there: a host that holds
        it is preferred); `build`: a local directory with a Dockerfile, built on the host
        (cached by its content); its RUN steps run in network and PID namespaces of
        their own, the network `build_network`: `egress` by default (the internet, never
        the fleet, the host's loopback, link-local or private ranges), `none`, or `host`
        where the host allows it. `user`: who its calls run as inside (a name, `uid` or
        `uid:gid`; default the image's USER, else root).

        `snapshot` (one of this owner's, or its id): its files are the snapshot's, in
        the same paths, over the snapshot's image or host root; no process runs in it.
        Made on the snapshot's host unless `host`/`label` say otherwise (another host
        fetches its layers through the fleet's registry first). `image`, `build`, `path`
        and `user` cannot be given with it.

        `session`: the fleet session it is for (an agent session's calls run in it). When
        that session lives in a workspace still there (on `host`, when named), that one
        is returned (renewed), not a new one: an agent whose own state was lost, or
        refused as forged, finds its files again, and its calls are not refused for
        naming another workspace than its session's. Else a new one, laid onto the
        session's shell (replacing one that ended; the first made wins when two callers
        make one at once)."""
        if snapshot is not None and (image or build or path or user):
            raise CallRejected("a workspace made from a snapshot stands on the snapshot's "
                               "image or host root, in its directory, as its user: `image`, "
                               "`build`, `path` and `user` cannot be given with `snapshot`")
        if build_network is not None and build is None:
            raise CallRejected("`build_network` is the network of a build's RUN steps: "
                               "given with `build` only (a workspace's own is `network`)")
        try:  # before its context is copied onto the host
            build_network = parse_network(build_network)
        except ValueError as exc:
            raise CallRejected(f"build_network: {exc}") from None
        if session is None:
            return await self._new_workspace(
                host=host, label=label, path=path, ttl_s=ttl_s, isolation=isolation,
                network=network, limits=limits, mounts=mounts, tags=tags, near=near,
                image=image, build=build, user=user, snapshot=snapshot,
                build_network=build_network)
        if not names.valid_id(session):
            raise CallRejected(f"invalid session id {session!r}")
        shell = await self._call(self._shells.load, session)
        if host is not None and shell.host not in (None, host):
            # Another host than the session's: a workspace of its own there.
            return await self._new_workspace(
                host=host, label=label, path=path, ttl_s=ttl_s, isolation=isolation,
                network=network, limits=limits, mounts=mounts, tags=tags, near=near,
                session=session, image=image, build=build, user=user, snapshot=snapshot,
                build_network=build_network)
        if shell.workspace is not None:
            with contextlib.suppress(UnknownWorkspace):
                kept = await self.open_workspace(shell.workspace)
                await kept.renew()  # its host still has it (its record may outlive it)
                return kept
        made = await self._new_workspace(
            host=host or shell.host, label=label, path=path, ttl_s=ttl_s,
            isolation=isolation, network=network, limits=limits, mounts=mounts, tags=tags,
            near=near, session=session, image=image, build=build, user=user,
            snapshot=snapshot, build_network=build_network)
        stored = await self._call(self._shells.commit, session, shells.ShellChange(
            host=made.host, workspace=made.id, force_workspace=shell.workspace is not None))
        if stored.workspace not in (None, made.id):
            await made.delete()  # another caller's made first: the session's
            return await self.open_workspace(stored.workspace)
        return made

    async def _new_workspace(
        self, *, host: str | None = None, label: str | None = None, path: str | None = None,
        ttl_s: float | None = None, isolation: Literal["none", "process", "strict"] | None = None,
        network: NetworkPolicy | str | bool | None = None,
        limits: WorkspaceLimits | Mapping[str, Any] | None = None,
        mounts: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None,
        near: str | None = None, session: str | None = None, image: str | None = None,
        build: str | os.PathLike[str] | None = None, user: str | None = None,
        snapshot: Snapshot | str | None = None,
        build_network: NetworkPolicy | str | None = None,
    ) -> AsyncWorkspace:
        """A new workspace as `workspace` describes it (`session`: only its label)."""
        record = await self._snapshot_record(snapshot) if snapshot is not None else None
        if record is not None and host is None:
            holder = [info for info in await self.hosts() if info.host == record.host
                      and (label is None or label in info.labels)]
            host = holder[0].host if holder else None
        where = await self._place_workspace(host, label, image)
        try:
            context: AsyncWorkspace | None = None
            if record is not None:
                if record.host != where:
                    await self._move_snapshot(record, where)
            elif build is not None:
                context = await self._build_context(where, build)
            elif image is not None:
                # Long pulls: not in the create request (the host's control threads).
                await self.pull_image(image, host=where)
            try:
                spec = control_request(
                    WorkspaceCreateRequest,
                    spec={"path": path, "ttl_s": ttl_s, "isolation": isolation,
                          "network": network, "limits": limits or {},
                          "mounts": dict(mounts or {}), "tags": dict(tags or {}),
                          "near": near, "session": session,
                          "image": image if context is None else None, "user": user,
                          "build": f"{context.path}/context" if context is not None else None,
                          "build_network": build_network if context is not None else None,
                          "snapshot": record.id if record is not None else None})
                view = await self._control(where, spec, WorkspaceView,
                                           timeout=BUILD_TIMEOUT_S if context else CTL_TIMEOUT_S)
            finally:
                if context is not None:
                    await context.delete()
        finally:
            self._placing[where] -= 1
        return AsyncWorkspace(self, view)

    async def _place_workspace(self, host: str | None, label: str | None,
                               image: str | None = None) -> str:
        """The host a new workspace goes to (`choose_host`: the owner's fewest there
        first, this client's being made counted; for an image, among the hosts that hold
        it when any does), counted as being made there until its host answers (then its
        view in Redis counts it)."""
        views = await self.workspaces() if host is None else []
        infos = await self._hosts_for(image, host)
        # From here to the count, nothing waits: another task of this client placing one
        # at once sees this one.
        where = choose_host(infos, host, label, owned=owned_by_host(views, self._placing))
        self._placing[where] += 1
        return where

    async def _hosts_for(self, image: str | None, host: str | None) -> list[HostInfo]:
        """The live hosts a workspace may go to: for an image, those that hold it when any
        does (a pull is the slowest part of making one)."""
        hosts = await self.hosts()
        if image is None or host is not None:
            return hosts
        with contextlib.suppress(ImageError, WorkerError, WorkerLost):
            holding = {info.host for info in await self.images() if image in info.refs
                       or info.digest == image or image.endswith(f"@{info.digest}")}
            preferred = [view for view in hosts if view.host in holding]
            if preferred:
                return preferred
        return hosts

    async def _build_context(self, host: str, build: str | os.PathLike[str]) -> AsyncWorkspace:
        """A local build context copied onto `host` (into a workspace of its own, deleted
        once the build is done): the host builds from its copy."""
        source = Path(build)
        if not source.is_dir() or not any((source / name).is_file()
                                         for name in ("Dockerfile", "Containerfile")):
            raise CallRejected(f"build: {build} is not a directory with a Dockerfile")
        context = await self._new_workspace(host=host, ttl_s=BUILD_TIMEOUT_S)
        try:
            await context.upload(source, "context")
        except BaseException:
            await context.delete()
            raise
        return context

    async def open_workspace(self, workspace_id: str) -> AsyncWorkspace:
        """A workspace made before (by any client of this owner): UnknownWorkspace when
        the fleet knows none by that id."""
        return AsyncWorkspace(self, await self._workspace_view(workspace_id))

    async def workspaces(self) -> list[WorkspaceView]:
        """This owner's live workspaces across the fleet, oldest first (from what their
        hosts sealed in Redis: a record that does not verify is left out)."""
        ids = await self._r(records.owner_workspaces, self._identity.space)
        views = await self._r(records.workspace_views, ids)
        opened = [open_view(self._record_keys, ws_id, sealed)
                  for ws_id, sealed in zip(ids, views, strict=True)]
        return sorted((view for view in opened if view is not None
                       and view.owner == self.owner), key=lambda view: view.created_at)

    async def agent_workspaces(self) -> list[WorkspaceView]:
        """The live workspaces of the MCP servers (`bashfleet mcp`) this owner started:
        each belongs to its server's session (owner `session:<id>`, which `workspaces`
        leaves out) and is tagged `started_by=<this owner>`; oldest first. Those of a
        named session outlive its server (to be resumed): here to find, and remove
        (`open_workspace` of a client whose owner is the view's)."""
        # An owner key's sessions are its sub-owners, counted in its own space; a fleet
        # key's (`session:<id>`) are found among every workspace.
        ids = await (self._r(records.owner_workspaces, self._identity.space)
                     if self._identity.owner_key else self._r(records.all_workspace_ids))
        views = await self._r(records.workspace_views, ids)
        opened = [open_view(self._record_keys, ws_id, sealed)
                  for ws_id, sealed in zip(ids, views, strict=True)]
        return sorted((view for view in opened if view is not None
                       and started_by(view, self.owner)), key=lambda view: view.created_at)

    async def _workspace_view(self, workspace_id: str) -> WorkspaceView:
        if not names.valid_id(workspace_id):
            raise UnknownWorkspace(f"no such workspace: {workspace_id!r}")
        sealed = (await self._r(records.workspace_views, [workspace_id]))[0]
        view = open_view(self._record_keys, workspace_id, sealed)
        if view is None or (view.owner != self.owner and not self.admin):
            raise UnknownWorkspace(f"no such workspace: {workspace_id} (deleted, expired "
                                   "unused, or another owner's)")
        return view

    # --------------------------------------------------------------------- images

    async def images(self, *, host: str | None = None) -> list[ImageInfo]:
        """The images `host` holds, or every live host (`ImageInfo.host` says whose):
        pulled or built there, shared by every owner of the host, least recently used
        first on each."""
        hosts = await self._image_hosts(host)
        answers = await self._ask_each(dict.fromkeys(hosts, ImagesRequest()), ImageList)
        return [info for answer in _all_or_raise(answers).values() for info in answer.images]

    # ------------------------------------------------------------------ snapshots

    async def snapshots(self) -> list[Snapshot]:
        """This owner's snapshots across the fleet, oldest first (from the records their
        hosts sealed in Redis: one that does not verify is left out)."""
        ids = await self._r(records.owner_snapshots, self._identity.space)
        sealed = await self._r(records.snapshot_records, ids)
        opened = [open_snapshot(self._record_keys, snap_id, value)
                  for snap_id, value in zip(ids, sealed, strict=True)]
        return sorted((record.as_snapshot() for record in opened if record is not None
                       and record.owner == self.owner and not record.hidden
                       and not record.deleted), key=lambda snap: snap.created_at)

    async def delete_snapshot(self, snapshot: Snapshot | str) -> bool:
        """Delete a snapshot of this owner's: unlisted and unusable at once, its layer
        removed once no workspace (nor later snapshot) stands on it. False when it was
        gone already."""
        try:
            record = await self._snapshot_record(snapshot)
        except UnknownSnapshot:
            return False
        done = await self._control(record.host, control_request(
            SnapshotDeleteRequest, id=record.id), SnapshotDeleted)
        return done.deleted

    async def _snapshot_record(self, snapshot: Snapshot | str) -> SnapshotRecord:
        """A snapshot's record as its host sealed it; UnknownSnapshot when this owner
        has none by that id."""
        snap_id = snapshot.id if isinstance(snapshot, Snapshot) else str(snapshot)
        if re.fullmatch(SNAPSHOT_ID_PATTERN, snap_id) is None:
            raise UnknownSnapshot(f"no such snapshot: {snap_id!r}")
        sealed = (await self._r(records.snapshot_records, [snap_id]))[0]
        record = open_snapshot(self._record_keys, snap_id, sealed)
        if record is None or record.deleted or record.hidden or (
                record.owner != self.owner and not self.admin):
            raise UnknownSnapshot(f"no such snapshot: {snap_id} (deleted, expired, or "
                                  "another owner's)")
        return record

    async def _move_snapshot(self, record: SnapshotRecord, where: str) -> None:
        """Bring a snapshot's layers to host `where`: its host pushes them to the fleet's
        registry (once), `where` fetches them (once); each on a thread of its own there,
        asked again every few seconds until done."""
        for host in (record.host, where):
            request = control_request(SnapshotFetchRequest, id=record.id, wait_s=PULL_POLL_S)
            while True:
                sent = await self._send_control(host, request, CTL_TIMEOUT_S + PULL_POLL_S)
                state = await self._await_control(sent, SnapshotFetch,
                                                  errors=snapshot_error_for)
                if state.done:
                    break

    async def pull_image(
        self, ref: str, *, host: str | None = None, refresh: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> list[ImageInfo]:
        """Pull an image onto `host`, or onto every live host, unless it is held there
        already (a pull of it under way is joined); the image as each host holds it.
        `refresh`: ask the registry where a tag points now. `progress` hears the hosts'
        progress lines (`host: line`). ImageError when a host cannot pull it (the other
        hosts' pulls go on)."""
        first = control_request(ImagePullRequest, ref=ref, refresh=refresh, wait_s=PULL_POLL_S)
        asked = dict.fromkeys(await self._image_hosts(host), first)
        pulled: dict[str, ImageInfo | BashfleetError] = {}
        while asked:
            # A host holds each question at most PULL_POLL_S: the pull runs on a thread
            # of its own there, and the control consumer's threads stay free.
            answers = await self._ask_each(asked, ImagePull, CTL_TIMEOUT_S + PULL_POLL_S)
            for name, state in answers.items():
                if isinstance(state, ImagePull):
                    _say(progress, name, state.lines)
                    if not state.done:
                        asked[name] = first.model_copy(
                            update={"pull_id": state.pull_id, "seen": state.seen})
                        continue
                pulled[name] = _image_of(name, state)
                del asked[name]
        return list(_all_or_raise(pulled).values())

    async def remove_image(self, ref: str, *, host: str | None = None) -> list[str]:
        """Remove an image (by a reference it was pulled as, or its digest) from `host`,
        or from every live host holding it; the hosts it was removed from. An admin
        client's call (a host's images are shared by its owners); ImageError `invalid`
        where a workspace uses it."""
        request = control_request(ImageRemoveRequest, ref=ref)
        hosts = await self._image_hosts(host)
        answers = _all_or_raise(await self._ask_each(dict.fromkeys(hosts, request),
                                                     ImageRemoved))
        return [name for name, answer in answers.items() if answer.removed]

    async def _image_hosts(self, host: str | None) -> list[str]:
        """`host`, or every live host (HostUnavailable when there is none)."""
        if host is not None:
            return [host]
        live = sorted(await self._r(records.live_hosts))
        if not live:
            raise HostUnavailable("no live host in the fleet")
        return live

    async def _ask_each(self, questions: Mapping[str, ControlRequest], response: type[R],
                        timeout: float = CTL_TIMEOUT_S) -> dict[str, R | BashfleetError]:
        """Send each host its image request at once, then read every answer: a host's
        failure as its exception (ImageError for the image's own), the others read all
        the same."""
        sent = {name: await self._send_control(name, question, timeout)
                for name, question in questions.items()}
        answers: dict[str, R | BashfleetError] = {}
        for name, each in sent.items():
            try:
                answers[name] = await self._await_control(each, response, errors=image_error_for)
            except BashfleetError as exc:
                answers[name] = exc
        return answers

    # --------------------------------------------------------------------- events

    async def wait(self, id: str, *, timeout: float | None = None) -> JobView:
        """Wait until a job (or the job a call started) ends; its final view.

        Hears the job's `ended` event (`events`) as it is published, and reads the job's
        record at each idle tick, so neither a missed publish nor a Redis reconnect
        makes it miss the end. WaitTimeout after `timeout` seconds (the job runs on).
        """
        _, job_id = await self._job_target(id)
        since = await self._r(records.last_seq)
        view = (await self.job_views([job_id])).get(job_id)
        if (view is None and not readers_job(
                self._record_keys, job_id, await self._r(records.job_hash, job_id))) \
                or (view is not None and not self._acts_on(view.owner)):
            # Another owner's job (its record does not open, or names another owner) is
            # told as no job is: waiting on it would tell it exists. One of this owner's
            # that a Redis writer changed is not believed, and waited on.
            raise unknown_job(id)
        deadline = None if timeout is None else time.monotonic() + timeout
        tick = IDLE_TICK_S if timeout is None else TIMED_WAIT_TICK_S
        stream = self._follow(since, tick)
        try:
            while view is None or view.state != "ended":
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(f"job {job_id} still running after {timeout:g}s",
                                      job_id=job_id)
                event = await anext(stream)
                if event is None or (event.job_id == job_id and event.kind == "ended"):
                    with contextlib.suppress(FleetUnavailable):  # Redis away: next tick
                        view = (await self.job_views([job_id])).get(job_id, view)
            return view
        finally:
            await stream.aclose()

    async def events(
        self, *, host: str | None = None, kinds: tuple[EventKind, ...] = (),
        tags: Mapping[str, str] | None = None, since: str | None = None,
    ) -> AsyncGenerator[JobEvent, None]:
        """Job events (a job started, a job ended) of the whole fleet as they happen,
        from any client; filtered by host, kind and tags. `since`: a `JobEvent.seq` to
        resume after ("0-0": every event kept); None: from now. Endless: break out of
        it (or close it).

        Each event is heard once, in order, across Redis reconnects and restarts, and
        across a local fleet brought down and up again (`bashfleet.client._core.events`); while
        Redis cannot be reached it keeps trying, and says so once (a warning in the
        `bashfleet.events` log).
        """
        start = since if since is not None else await self._r(records.last_seq)
        wanted = dict(tags or {})
        stream = self._follow(start, IDLE_TICK_S)
        try:
            async for event in stream:
                if event is not None and event_matches(event, host=host, kinds=kinds,
                                                       tags=wanted):
                    yield event
        finally:
            await stream.aclose()

    def _follow(self, since: str, tick_s: float) -> AsyncGenerator[JobEvent | None, None]:
        cursor = EventCursor(since, time.time(), keys=self._record_keys)
        return follow(self._event_source, cursor, tick_s)

    def _event_source(self) -> tuple[AsyncRedis, str, dict[str, str]]:
        """The Redis to hear job events from now and the keys that verify them: this
        client's, or, when the fleet it found through `bashfleet up` was replaced by
        another, the new one's (another fleet seals with other keys)."""
        url = self._raw_url
        with contextlib.suppress(FleetUnavailable):
            url = require_url(self._asked_url)
        if url == self._raw_url:
            return self._redis, self.url, self._record_keys
        found = self._event_clients.get(url)
        if found is None:
            keys = record_keys_at(url, self.admin)
            found = self._event_clients[url] = (async_redis_client(url), keys)
        return found[0], safe_url(url), found[1]

    # ---------------------------------------------------------- interactive sessions

    async def write_stdin(
        self, id: str, data: str = "", *, collect: Collect | None = None,
        data_b64: str | None = None,
    ) -> SessionOutput:
        """Write `data` to an interactive job's stdin (through its terminal for a PTY:
        `\u0003` is Ctrl-C), then return its output since the last read by any client of
        this owner; empty `data` only reads. `collect` says how long to wait for output."""
        return await self.write_stdin_request(control_request(
            WriteStdinRequest, id=id, data=data, data_b64=data_b64,
            collect=collect or Collect(),
        ))

    async def write_stdin_request(self, request: WriteStdinRequest) -> SessionOutput:
        """`write_stdin`, from its request model."""
        return await self._session_control(request, request.collect)

    async def read(self, id: str, *, collect: Collect | None = None) -> SessionOutput:
        """An interactive job's output since the last read (a poll: nothing is written)."""
        return await self.write_stdin(id, collect=collect)

    async def close_stdin(self, id: str, *, collect: Collect | None = None) -> SessionOutput:
        """End an interactive job's input (EOF; Ctrl-D through a terminal); its new output."""
        return await self.close_stdin_request(control_request(
            CloseStdinRequest, id=id, collect=collect or Collect()))

    async def close_stdin_request(self, request: CloseStdinRequest) -> SessionOutput:
        """`close_stdin`, from its request model."""
        return await self._session_control(request, request.collect)

    async def resize(self, id: str, rows: int, cols: int) -> SessionOutput:
        """Set an interactive job's terminal size (its foreground process gets SIGWINCH)."""
        request = control_request(ResizeRequest, id=id, rows=rows, cols=cols)
        return await self._session_control(request, Collect(read=False))

    async def _session_control(
        self, request: WriteStdinRequest | CloseStdinRequest | ResizeRequest, collect: Collect
    ) -> SessionOutput:
        host, job_id = await self._job_target(request.id)
        # The worker may wait that long for output before it answers.
        timeout = CTL_TIMEOUT_S + collect.wait_s + collect.delay_s
        return await self._control(host, request.model_copy(update={"id": job_id}),
                                   SessionOutput, timeout)

    # ------------------------------------------------------------------- plumbing

    async def _r(self, operation: Callable[Concatenate[AsyncRedis, P], Awaitable[T]],
                 *args: P.args, **kwargs: P.kwargs) -> T:
        """`operation(self's Redis, *args, **kwargs)`, guarded (`_call`)."""
        return await self._call(functools.partial(operation, self._redis), *args, **kwargs)

    async def _call(self, operation: Callable[P, Awaitable[T]], *args: P.args,
                    **kwargs: P.kwargs) -> T:
        """`operation(*args, **kwargs)` (a Redis operation of its own): within the
        concurrency bound, its failure FleetUnavailable (password hidden).

        Written out, not as a generator-based context manager: a task cancelled while
        it waits for the bound would leave such a generator running, which the event
        loop's shutdown then fails to close, once per task (on Python 3.11, a cascade
        of "aclose(): asynchronous generator is already running")."""
        self._loop.check()
        async with self._io:
            try:
                return await operation(*args, **kwargs)
            except _REDIS_ERRORS as exc:
                raise unreachable(self.url, exc) from None

    async def _job_target(self, item_id: str) -> tuple[str, str]:
        """(host, job id) of a job id, or of the call that started the job."""
        found = await self._r(records.lookup_id, checked_id(item_id, "job"))
        return job_target(item_id, found)

    def _chunk_client(self) -> AsyncRedis:
        """A client of the fleet's Redis for file transfers' chunks (bytes, not text)."""
        if self._chunks is None:
            self._chunks = async_redis_client(self._raw_url, binary=True)
        return self._chunks

    async def _control(self, host: str, request: ControlRequest, response: type[R],
                       timeout: float = CTL_TIMEOUT_S) -> R:
        """Send a control request to `host`'s control queue; its typed response (every
        error kind the worker answers, its typed exception)."""
        return await self._await_control(await self._send_control(host, request, timeout),
                                         response)

    async def _send_control(self, host: str, request: ControlRequest,
                            timeout: float = CTL_TIMEOUT_S) -> SentControl:
        token = await self._require_alive(host)
        task_id = uuid.uuid4().hex
        message = self._control_message(host, request, task_id, timeout)
        slot = await self._replies.expect(task_id)
        try:
            await self._r(records.push, names.ctl_queue(host), message)
        except BaseException:
            self._replies.forget(task_id)
            raise
        return SentControl(host, task_id, token, slot, timeout, time.monotonic() + timeout)

    def _control_message(self, host: str, request: ControlRequest, task_id: str,
                         timeout: float) -> str:
        return control_message(self._identity, request, task_id=task_id, host=host,
                               reply_to=self._replies.channel, timeout=timeout)

    async def _await_control(self, sent: SentControl, response: type[R], *,
                             errors: ErrorFor = error_for) -> R:
        try:
            sealed = await self._control_answer(sent)
        finally:
            self._replies.forget(sent.task_id)
        return decode_control(self._keys, sent.task_id, sent.host, sealed, response,
                              errors=errors)

    async def _control_answer(self, sent: SentControl) -> str:
        """The answer as sent: heard, or read back (the listener may have missed its
        publish while reconnecting); WorkerLost / WorkerError as `control_verdict` says."""
        while True:
            answer = await sent.slot.wait(WATCH_INTERVAL_S)
            if isinstance(answer, str):
                return answer
            stored = await self._r(records.stored_reply, sent.task_id)
            if stored is not None:
                return stored
            token = await self._r(records.host_alive_token, sent.host)
            problem = control_verdict(sent.host, sent.token, token, now=time.monotonic(),
                                      deadline=sent.deadline, timeout=sent.timeout)
            if problem is not None:
                raise problem


def _all_or_raise(answers: Mapping[str, T | BashfleetError]) -> dict[str, T]:
    """Every host's answer; the first host's failure raised when there is one."""
    for answer in answers.values():
        if isinstance(answer, BashfleetError):
            raise answer
    return {name: answer for name, answer in answers.items()
            if not isinstance(answer, BashfleetError)}


def _say(progress: Callable[[str], None] | None, host: str, lines: tuple[str, ...]) -> None:
    """A host's progress lines, to whoever listens."""
    if progress is not None:
        for line in lines:
            progress(f"{host}: {line}")


def _image_of(host: str, state: ImagePull | BashfleetError) -> ImageInfo | BashfleetError:
    """What a finished pull left on a host: its image, or why there is none."""
    if isinstance(state, BashfleetError):
        return state
    return state.image or WorkerError(f"{host} ended a pull without saying its image")

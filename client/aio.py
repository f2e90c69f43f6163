"""`AsyncFleet`: the fleet client for asyncio, natively asynchronous.

    async with AsyncFleet() as fleet:
        results = await asyncio.gather(*(fleet.run(f"make -C pkg{i}") for i in range(400)))

No thread per call: Redis is spoken with `redis.asyncio`, and a call is sent by one
Lua script that records it and pushes its Celery message (`worker.wire.messages`, the
JSON kombu would push) in the same round trip. One process holds thousands of calls
in flight on a handful of connections:

- answers arrive on the client's reply channel, heard by one listening task; a call
  awaits its own future;
- calls in flight are watched together: every WATCH_INTERVAL_S one pipelined round
  trip reads every waiting call's stored answer and record and the heartbeats of their
  hosts (a worker that dies shows as WorkerLost within seconds, as with `Fleet`);
- backpressure is explicit: at most `max_in_flight` calls are sent and not answered
  (more wait in the client, unsent), and at most `redis_concurrency` Redis commands
  are under way at once (each holds one pooled connection).

The requests, results, errors and answers are `Fleet`'s (`worker.wire.control`,
`client.errors.error_for`, `client.replies.open_reply`). One AsyncFleet belongs to one
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import redis
from pydantic import ValidationError

from client import aio_records, events, shells
from client.errors import (
    BashfleetError,
    CallRejected,
    FleetUnavailable,
    HostUnavailable,
    UnknownJob,
    WaitTimeout,
    WorkerError,
    WorkerLost,
    error_for,
)
from client.fleet import (
    CTL_TIMEOUT_S,
    MESSAGE_LOST_GRACE_S,
    WATCH_INTERVAL_S,
    _argsrepr,
    build_call,
    outage_grace_s,
    resolve_identity,
    resolve_url,
    run_request,
    validation_message,
)
from client.replies import RETRY_DELAYS_S, SUBSCRIBE_WAIT_S, backoff, open_reply, reply_of
from client.sessions import ShellStore
from worker.fleet.connect import AsyncRedis, async_redis_client, redis_client, safe_url
from worker.wire import auth, names
from worker.wire.control import (
    CancelRequest,
    CancelResult,
    CheckRequest,
    CloseStdinRequest,
    Collect,
    ControlReply,
    ControlRequest,
    DetachRequest,
    DetachResult,
    JobList,
    JobsRequest,
    KillRequest,
    ReadOutputRequest,
    ResizeRequest,
    SessionOutput,
    WriteStdinRequest,
)
from worker.wire.events import EventKind, JobEvent, event_matches
from worker.wire.messages import task_message
from worker.wire.models import (
    CallResult,
    CheckResult,
    HostInfo,
    JobView,
    Model,
    OutputChunk,
    RunRequest,
    SystemError_,
    Truncation,
)
from worker.wire.names import CALL_UNSTARTED, CallState, Task

R = TypeVar("R", bound=Model)
Q = TypeVar("Q", bound=ControlRequest)
T = TypeVar("T")

#: Calls sent and not answered yet, at most (more wait in the client, unsent).
DEFAULT_MAX_IN_FLIGHT = 1024
#: Redis commands under way at once, at most: the connections the client holds (plus
#: one for its reply channel).
DEFAULT_REDIS_CONCURRENCY = 16
#: Longest block of the reply listener's read (how soon `close` ends it).
LISTEN_TICK_S = 1.0
#: A running call's host lock gone this long (not replaced by another instance's) means
#: its worker died. The lock lives ALIVE_TTL_S past the last heartbeat; this covers a
#: heartbeat that came late because Redis was away (a failover longer than the lock).
LOCK_GONE_GRACE_S = 2.0
#: Most messages of a queue scanned when looking for the ones still waiting.
QUEUE_SCAN_LIMIT = 10_000

_REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)

log = logging.getLogger(__name__)


def _unreachable(url: str, exc: BaseException) -> FleetUnavailable:
    return FleetUnavailable(f"Redis at {url} is unreachable: {exc}")


# ---------------------------------------------------------------------------- replies


class AsyncReplies:
    """The client's reply channel and the task listening on it."""

    def __init__(self, client: AsyncRedis) -> None:
        self._redis = client
        self.channel = names.reply_channel(uuid.uuid4().hex)
        """The channel each task names as its `reply_to`."""
        self._waiting: dict[str, asyncio.Future[str]] = {}
        self._first_attempt = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def expect(self, task_id: str) -> asyncio.Future[str]:
        """Register for a task's answer (before sending it): a future of the answer as
        sent (still to open with `open_reply`)."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[task_id] = future
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="bashfleet-replies")
        if not self._first_attempt.is_set():
            # Only the first calls wait, until the first subscription attempt ended.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._first_attempt.wait(), SUBSCRIBE_WAIT_S)
        return future

    def deliver(self, task_id: str, payload: str) -> None:
        """Hand an answer to its waiter (heard, or read from its stored copy)."""
        future = self._waiting.pop(task_id, None)
        if future is not None and not future.done():
            future.set_result(payload)

    def forget(self, task_id: str) -> None:
        """Stop waiting for a task's answer."""
        self._waiting.pop(task_id, None)

    async def close(self) -> None:
        """Stop listening."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, *_REDIS_ERRORS):
                await self._task

    async def _listen(self) -> None:
        attempt = 0
        while not self._closed:
            try:
                await self._serve_subscription()
                attempt = 0
            except (*_REDIS_ERRORS, redis.RedisError):
                self._first_attempt.set()
                await asyncio.sleep(backoff(RETRY_DELAYS_S, attempt))
                attempt += 1

    async def _serve_subscription(self) -> None:
        pubsub = self._redis.pubsub()
        try:
            await pubsub.subscribe(self.channel)
            while not self._closed:
                message = await pubsub.get_message(timeout=LISTEN_TICK_S)
                if message is None:
                    continue
                if message["type"] == "subscribe":
                    self._first_attempt.set()
                elif message["type"] == "message":
                    parsed = reply_of(message["data"])
                    if parsed is not None:
                        self.deliver(*parsed)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]


# -------------------------------------------------------------------------- watching


@dataclass
class Pending:
    """A call sent and not answered yet, as the watch sees it."""

    call_id: str
    target: str | None
    label: str | None
    queue: str
    answer: asyncio.Future[str]
    """Its answer as sent (resolved by the reply listener or the watch)."""
    problem: asyncio.Future[BashfleetError | CallResult] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    """What went wrong with it, when the watch finds out first."""
    host: str | None = None
    """The host its record names, once a worker claimed it."""
    missing_since: float | None = None
    """When its message was first seen gone from its queue while it was still queued."""
    lock_gone_since: float | None = None
    """When its host's lock was first seen gone while it ran (None: held)."""


@dataclass(frozen=True)
class Verdict:
    """What the watch concluded about one waiting call."""

    problem: BashfleetError | CallResult | None = None
    """The error (or result) to end the call with; None: keep waiting."""
    withdraw: bool = False
    """End it only once withdrawn (it was queued); if a worker took it meanwhile, wait on."""


KEEP_WAITING = Verdict()


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


def verdict(
    pending: Pending, record: Mapping[str, str | None], tokens: Mapping[str, str | None],
    live: list[str] | None, now: float,
) -> Verdict:
    """What to do about a waiting call, from one watch pass (pure: `Fleet._watch`'s rules).

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
        message = f"call {call_id} was {state} before it started; it did not run"
        return Verdict(CallResult(call_id=call_id, host=host or "",
                                  error=SystemError_(kind="internal", message=message)))
    if state not in (CallState.QUEUED, None):
        gone_for = now - pending.lock_gone_since if pending.lock_gone_since is not None else 0.0
        return running_verdict(call_id, record, tokens.get(host or ""), (host or "") in tokens,
                               gone_for)
    return queued_verdict(pending, tokens, live, now)


def queued_verdict(
    pending: Pending, tokens: Mapping[str, str | None], live: list[str] | None, now: float
) -> Verdict:
    """A call no worker claimed yet: withdraw it when its message was taken by a consumer
    that died, or when no worker is left that could take it."""
    call_id = pending.call_id
    if pending.missing_since is not None and now - pending.missing_since >= MESSAGE_LOST_GRACE_S:
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


# ----------------------------------------------------------------------------- client


class AsyncFleet:
    """A client of the fleet for asyncio; `Fleet`'s methods, awaited.

    `max_in_flight`: calls sent and not answered, at most (the others wait their turn
    in this process, unsent). `redis_concurrency`: Redis commands under way at once.
    """

    def __init__(
        self, redis_url: str | None = None, *, owner: str | None = None, admin: bool = False,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        redis_concurrency: int = DEFAULT_REDIS_CONCURRENCY,
    ) -> None:
        if max_in_flight < 1 or redis_concurrency < 1:
            raise ValueError("max_in_flight and redis_concurrency must be at least 1")
        url = resolve_url(redis_url)
        if not url:
            raise FleetUnavailable(
                "no fleet configured: pass redis_url=, set BASHFLEET_REDIS_URL, "
                "or start a local fleet with `bashfleet up`"
            )
        self.url = safe_url(url)
        """The Redis URL with its password hidden (for messages)."""
        self.max_in_flight = max_in_flight
        """Calls sent and not answered, at most."""
        identity = self._identity = resolve_identity(url, owner, admin)
        self.owner = identity.owner
        """Who this client's calls and jobs belong to (see `Fleet`)."""
        self.admin = identity.admin
        """True when this client signs with the admin key."""
        self._redis = async_redis_client(url)
        self._replies = AsyncReplies(self._redis)
        self._sync_redis = redis_client(url)  # a thread's, for the sessions' shells
        self._shells = ShellStore(self._sync_redis, key=identity.shell_key)
        self._outage_grace_s = outage_grace_s(url)
        self._keys = auth.keyring([identity.signing_key or ""])
        self._slots = asyncio.Semaphore(max_in_flight)
        self._io = asyncio.Semaphore(redis_concurrency)
        self._pending: dict[str, Pending] = {}
        self._watch_task: asyncio.Task[None] | None = None
        self._cancelling: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def close(self) -> None:
        """Stop listening and close the connections (the object is unusable afterwards);
        cancels of calls whose callers gave up are sent first."""
        if self._cancelling:
            await asyncio.gather(*self._cancelling, return_exceptions=True)
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        await self._replies.close()
        await self._redis.aclose()
        self._sync_redis.close()

    async def __aenter__(self) -> AsyncFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def in_flight(self) -> int:
        """Calls sent and not answered yet."""
        return len(self._pending)

    async def _r(self, operation: Awaitable[T]) -> T:
        """One Redis operation, within the concurrency bound; failures FleetUnavailable."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                if asyncio.iscoroutine(operation):
                    operation.close()
                raise RuntimeError(
                    "this AsyncFleet was first used in another event loop: its connections "
                    "belong to that one; make one AsyncFleet per event loop"
                )
            self._loop = loop
        async with self._io:
            try:
                return await operation
            except _REDIS_ERRORS as exc:
                raise _unreachable(self.url, exc) from None

    def _open(self, task_id: str, sealed: str) -> str:
        return open_reply(self._keys, task_id, sealed)

    # ------------------------------------------------------------------------ run

    async def run(self, command: str, **options: Any) -> CallResult:
        """See `Fleet.run`."""
        return await self.execute(run_request(command, options))

    async def execute(self, request: RunRequest) -> CallResult:
        """See `Fleet.execute`: waits for a slot of `max_in_flight` first. Cancelling the
        awaiting task cancels the call too (withdrawn if queued, its processes killed if
        running), as `cancel` does. A session's shell is read and saved by a thread
        (`client.sessions.ShellStore`: two round trips a session call)."""
        session = request.session
        if session is None:
            return await self._execute(request)
        if not names.valid_id(session):
            raise CallRejected(f"invalid session id {session!r}")
        try:
            shell = await asyncio.to_thread(self._shells.load, session)
        except _REDIS_ERRORS as exc:
            raise _unreachable(self.url, exc) from None
        result = await self._execute(shells.fill_request(shell, request))
        change = shells.change_of(result)
        if change:
            try:
                await asyncio.to_thread(self._shells.commit, session, change)
            except redis.RedisError as exc:
                # The call ran: its result matters more than the session's next cwd.
                log.warning("session %s: could not save its shell: %s", session, exc)
        return result

    async def _execute(self, request: RunRequest) -> CallResult:
        call = build_call(request, self.owner)
        async with self._slots:
            queue, target = await self._route(request.host, request.label)
            label = request.label
            args = self._identity.signed(Task.EXEC, [call.model_dump(mode="json")])
            message = task_message(
                Task.EXEC, args, task_id=call.call_id, queue=queue,
                reply_to=self._replies.channel, argsrepr=_argsrepr(call),
            )
            answer = await self._replies.expect(call.call_id)
            sent = False
            try:
                await self._send_call(call.call_id, queue, target, message)
                sent = True
                result = await self._wait_call(Pending(call.call_id, target, label, queue, answer))
            except asyncio.CancelledError:
                if sent:  # the caller gave up: so does the fleet (withdraw, or kill)
                    self._cancel_soon(call.call_id)
                raise
            finally:
                self._replies.forget(call.call_id)
            return result

    def _cancel_soon(self, call_id: str) -> None:
        """Cancel a call in the background (its awaiting task was cancelled); `close`
        waits for these."""
        task = asyncio.create_task(self._cancel_quietly(call_id), name=f"cancel-{call_id}")
        self._cancelling.add(task)
        task.add_done_callback(self._cancelling.discard)

    async def _cancel_quietly(self, call_id: str) -> None:
        with contextlib.suppress(BashfleetError):
            await self.cancel(call_id)

    async def _send_call(self, call_id: str, queue: str, target: str | None, message: str) -> None:
        sent = await self._r(aio_records.send_call(
            self._redis, call_id, queue, target, message, require_alive=target is not None
        ))
        if sent == "down" and target is not None:
            await self._require_alive(target)  # raises HostUnavailable, naming live hosts
            sent = await self._r(aio_records.send_call(
                self._redis, call_id, queue, target, message, require_alive=False
            ))
        if sent == "taken":
            raise CallRejected(f"call id {call_id} is already in use")

    async def _route(self, host: str | None, label: str | None) -> tuple[str, str | None]:
        """(queue, target host); HostUnavailable when nobody would take the call."""
        if host is not None:
            try:
                names.validate_host(host)
            except ValueError as exc:
                raise CallRejected(str(exc)) from None
            return names.exec_queue(host), host
        alive = await self._r(aio_records.live_hosts(self._redis))
        if label is not None:
            try:
                names.validate_label(label)
            except ValueError as exc:
                raise CallRejected(str(exc)) from None
            infos = await self._r(aio_records.list_hosts(self._redis, alive))
            if not any(label in info.labels for info in infos):
                raise HostUnavailable(f"no live worker has the label {label!r}")
            return names.pool_queue(label), None
        if not alive:
            raise HostUnavailable("no live worker in the fleet")
        return names.ANY_EXEC_QUEUE, None

    async def _require_alive(self, host: str) -> str:
        token = await self._r(aio_records.host_alive_token(self._redis, host))
        if token is None:
            live = ", ".join(await self._r(aio_records.live_hosts(self._redis))) or "none"
            raise HostUnavailable(
                f"no live worker for host {host!r} (live hosts: {live})", host=host
            )
        return token

    async def _wait_call(self, pending: Pending) -> CallResult:
        """The call's result: its answer, or what the watch found wrong with it."""
        self._pending[pending.call_id] = pending
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.create_task(self._watch_loop(), name="bashfleet-watch")
        try:
            done, _ = await asyncio.wait(
                (pending.answer, pending.problem), return_when=asyncio.FIRST_COMPLETED
            )
            if pending.answer in done:
                return CallResult.model_validate_json(
                    self._open(pending.call_id, pending.answer.result())
                )
            problem = pending.problem.result()
            if isinstance(problem, CallResult):
                return problem
            raise problem
        finally:
            self._pending.pop(pending.call_id, None)
            for future in (pending.answer, pending.problem):
                future.cancel()

    # --------------------------------------------------------------------- the watch

    async def _watch_loop(self) -> None:
        """Watch every waiting call, one pass per WATCH_INTERVAL_S, until none waits."""
        outage_since: float | None = None
        while self._pending:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                await self._watch_pass()
                outage_since = None
            except FleetUnavailable as exc:
                now = time.monotonic()
                outage_since = outage_since or now
                if now - outage_since >= self._outage_grace_s:
                    self._fail_all(exc)

    def _fail_all(self, error: BashfleetError) -> None:
        for pending in list(self._pending.values()):
            if not pending.problem.done():
                pending.problem.set_result(error)

    async def _watch_pass(self) -> None:
        waiting = [p for p in self._pending.values() if not p.answer.done()]
        if not waiting:
            return
        hosts = {h for p in waiting for h in (p.target, p.host) if h}
        stored, records, tokens = await self._r(aio_records.watch_snapshot(
            self._redis, [p.call_id for p in waiting], hosts
        ))
        queued = [p for p, rec in zip(waiting, records, strict=True)
                  if rec.get("state") in (CallState.QUEUED, None)]
        live = await self._live_for(queued)
        await self._scan_queues(queued)
        now = time.monotonic()
        for pending, payload, record in zip(waiting, stored, records, strict=True):
            if payload is not None:
                self._replies.deliver(pending.call_id, payload)
                continue
            pending.host = record.get("host") or pending.host
            self._note_lock(pending, tokens, now)
            found = verdict(pending, record, tokens, live.get(pending.label or ""), now)
            if found.problem is not None:
                await self._conclude(pending, found)

    @staticmethod
    def _note_lock(pending: Pending, tokens: Mapping[str, str | None], now: float) -> None:
        """Remember since when the lock of the call's host has been seen gone."""
        if pending.host is None or pending.host not in tokens:
            return
        if tokens[pending.host] is not None:
            pending.lock_gone_since = None
        elif pending.lock_gone_since is None:
            pending.lock_gone_since = now

    async def _live_for(self, queued: list[Pending]) -> dict[str, list[str]]:
        """Live hosts that could take each untargeted queued call, by its label ("" for
        any host); read only when such a call waits."""
        labels = {p.label or "" for p in queued if p.target is None}
        if not labels:
            return {}
        alive = await self._r(aio_records.live_hosts(self._redis))
        infos = await self._r(aio_records.list_hosts(self._redis, alive)) \
            if labels - {""} else []
        return {label: alive if not label else [i.host for i in infos if label in i.labels]
                for label in labels}

    async def _scan_queues(self, queued: list[Pending]) -> None:
        """Note which queued calls' messages are gone from their queues (taken by a
        consumer that never claimed them); one read per queue."""
        for queue in {p.queue for p in queued}:
            ids = await self._r(aio_records.queued_ids(self._redis, queue, QUEUE_SCAN_LIMIT))
            for pending in (p for p in queued if p.queue == queue):
                if ids is None or pending.call_id in ids:
                    pending.missing_since = None
                elif pending.missing_since is None:
                    pending.missing_since = time.monotonic()

    async def _conclude(self, pending: Pending, found: Verdict) -> None:
        """End a call the watch found in trouble (withdrawing it first when it was queued);
        an answer stored meanwhile wins."""
        if found.withdraw:
            previous = await self._r(aio_records.withdraw_call(self._redis, pending.call_id))
            if previous != CallState.QUEUED:
                return  # a worker took it after all: watch it as a running call
        payload = await self._r(aio_records.stored_reply(self._redis, pending.call_id))
        if payload is not None:
            self._replies.deliver(pending.call_id, payload)
        elif not pending.problem.done() and found.problem is not None:
            pending.problem.set_result(found.problem)

    # -------------------------------------------------------------------- control

    @staticmethod
    def _request(model: type[Q], **fields: Any) -> Q:
        try:
            return model(**fields)
        except ValidationError as exc:
            raise CallRejected(f"invalid {model.__name__}: {validation_message(exc)}") from None

    async def check(
        self, id: str, *, grep: str | None = None, offset: int | None = None,
        stderr_offset: int | None = None, truncation: Truncation | None = None,
    ) -> CheckResult:
        """See `Fleet.check`."""
        return await self.check_job(self._request(
            CheckRequest, id=id, grep=grep, offset=offset, stderr_offset=stderr_offset,
            truncation=truncation,
        ))

    async def check_job(self, request: CheckRequest) -> CheckResult:
        """See `Fleet.check_job`."""
        host, job_id = await self._job_owner(request.id)
        return await self._control(host, request.model_copy(update={"id": job_id}), CheckResult)

    async def kill(
        self, id: str, *, offset: int | None = None, stderr_offset: int | None = None,
        truncation: Truncation | None = None,
    ) -> CheckResult:
        """See `Fleet.kill`."""
        return await self.kill_job(self._request(
            KillRequest, id=id, offset=offset, stderr_offset=stderr_offset,
            truncation=truncation,
        ))

    async def kill_job(self, request: KillRequest) -> CheckResult:
        """See `Fleet.kill_job`."""
        host, job_id = await self._job_owner(request.id)
        return await self._control(host, request.model_copy(update={"id": job_id}), CheckResult)

    async def read_output(
        self, id: str, *, offset: int = 0, limit: int = 65536, grep: str | None = None,
        stream: Literal["stdout", "stderr"] = "stdout",
    ) -> OutputChunk:
        """See `Fleet.read_output`."""
        request = self._request(
            ReadOutputRequest, id=id, offset=offset, limit=limit, grep=grep, stream=stream
        )
        return await self._control(await self._owner_host(id), request, OutputChunk)

    async def cancel(self, call_id: str) -> bool:
        """See `Fleet.cancel`."""
        if not names.valid_id(call_id):
            raise UnknownJob(f"no such call: {call_id!r}", item_id=call_id)
        record = await self._r(aio_records.call_record(self._redis, call_id))
        if not record:
            raise UnknownJob(f"no such call: {call_id} (unknown or expired)", item_id=call_id)
        previous = await self._r(
            aio_records.withdraw_call(self._redis, call_id, CallState.CANCELLED)
        )
        if previous == CallState.QUEUED:
            return True
        if previous != CallState.RUNNING:
            return False
        result = await self._control(record["host"], CancelRequest(call_id=call_id),
                                     CancelResult)
        return result.cancelled

    async def detach(self, call_id: str) -> bool:
        """See `Fleet.detach`."""
        if not names.valid_id(call_id):
            raise UnknownJob(f"no such call: {call_id!r}", item_id=call_id)
        record = await self._r(aio_records.call_record(self._redis, call_id))
        if record.get("state") != CallState.RUNNING:
            return False
        request = DetachRequest(call_id=call_id)
        return (await self._control(record["host"], request, DetachResult)).detached

    async def call_host(self, call_id: str) -> str | None:
        """See `Fleet.call_host`."""
        if not names.valid_id(call_id):
            return None
        record = await self._r(aio_records.call_record(self._redis, call_id))
        return record.get("host") or None

    # ---------------------------------------------------------- interactive sessions

    async def write_stdin(
        self, id: str, data: str = "", *, collect: Collect | None = None,
        data_b64: str | None = None,
    ) -> SessionOutput:
        """See `Fleet.write_stdin`."""
        return await self.write_stdin_request(self._request(
            WriteStdinRequest, id=id, data=data, data_b64=data_b64,
            collect=collect or Collect(),
        ))

    async def write_stdin_request(self, request: WriteStdinRequest) -> SessionOutput:
        """See `Fleet.write_stdin_request`."""
        return await self._session_control(request, request.collect)

    async def read(self, id: str, *, collect: Collect | None = None) -> SessionOutput:
        """See `Fleet.read`."""
        return await self.write_stdin(id, collect=collect)

    async def close_stdin(self, id: str, *, collect: Collect | None = None) -> SessionOutput:
        """See `Fleet.close_stdin`."""
        return await self._session_control(
            self._request(CloseStdinRequest, id=id, collect=collect or Collect()),
            collect or Collect(),
        )

    async def resize(self, id: str, rows: int, cols: int) -> SessionOutput:
        """See `Fleet.resize`."""
        request = self._request(ResizeRequest, id=id, rows=rows, cols=cols)
        return await self._session_control(request, Collect(read=False))

    async def _session_control(
        self, request: WriteStdinRequest | CloseStdinRequest | ResizeRequest, collect: Collect
    ) -> SessionOutput:
        host, job_id = await self._job_owner(request.id)
        # The worker may wait that long for output before it answers.
        timeout = CTL_TIMEOUT_S + collect.wait_s + collect.delay_s
        return await self._control(host, request.model_copy(update={"id": job_id}),
                                   SessionOutput, timeout)

    async def jobs(
        self, host: str | None = None, *, all_owners: bool = False,
        tags: Mapping[str, str] | None = None, owner: str | None = None,
    ) -> list[JobView]:
        """See `Fleet.jobs`: every live host asked at once."""
        every = all_owners or (owner is not None and owner != self.owner)
        if host is not None:
            hosts = [host]
        else:
            hosts = [info.host for info in await self._r(aio_records.list_hosts(self._redis))]
        live = set(await self._r(aio_records.live_hosts(self._redis)))
        listed = await asyncio.gather(
            *(self._host_jobs(name, name in live, every) for name in hosts)
        )
        views = [view for found in listed for view in found
                 if events.job_matches(view, tags=tags, owner=owner)]
        return sorted(views, key=lambda view: view.started_at)

    async def _host_jobs(self, host: str, alive: bool, all_owners: bool) -> list[JobView]:
        if alive:
            try:
                request = JobsRequest(all_owners=all_owners)
                return list((await self._control(host, request, JobList)).jobs)
            except (WorkerLost, HostUnavailable):
                pass  # it died meanwhile: show what Redis knows
        return [view for view in await self._r(aio_records.list_jobs(self._redis, host))
                if all_owners or view.owner == self.owner]

    async def hosts(self) -> list[HostInfo]:
        """See `Fleet.hosts`."""
        infos = await self._r(aio_records.list_hosts(self._redis))
        depths = await self._r(aio_records.queue_depths(
            self._redis, [names.exec_queue(info.host) for info in infos]
        ))
        return [info.model_copy(update={"queued": depths[names.exec_queue(info.host)]})
                for info in infos]

    async def shared_queues(self) -> dict[str, int]:
        """See `Fleet.shared_queues`."""
        infos = await self._r(aio_records.list_hosts(self._redis))
        labels = sorted({label for info in infos for label in info.labels})
        queues = [names.ANY_EXEC_QUEUE, *(names.pool_queue(label) for label in labels)]
        return await self._r(aio_records.queue_depths(self._redis, queues))

    async def job_views(self, ids: list[str]) -> dict[str, JobView]:
        """See `Fleet.job_views`."""
        valid = [i for i in ids if names.valid_id(i)]
        return await self._r(events.job_views_async(self._redis, valid))

    # --------------------------------------------------------------------- events

    async def wait(self, id: str, *, timeout: float | None = None) -> JobView:
        """See `Fleet.wait`."""
        _, job_id = await self._job_owner(id)
        since = await self._r(events.last_seq_async(self._redis))
        view = (await self.job_views([job_id])).get(job_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        stream = events.follow_async(self._redis, since)
        try:
            while view is None or view.state != "ended":
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeout(f"job {job_id} still running after {timeout:g}s",
                                      job_id=job_id)
                event = await asyncio.wait_for(anext(stream), left)
                if event is None or (event.job_id == job_id and event.kind == "ended"):
                    with contextlib.suppress(FleetUnavailable):  # Redis away: next tick
                        view = (await self.job_views([job_id])).get(job_id, view)
            return view
        except TimeoutError:
            raise WaitTimeout(f"job {job_id} still running after {timeout:g}s",
                              job_id=job_id) from None
        finally:
            await stream.aclose()

    async def events(
        self, *, host: str | None = None, kinds: tuple[EventKind, ...] = (),
        tags: Mapping[str, str] | None = None, since: str | None = None,
    ) -> AsyncGenerator[JobEvent, None]:
        """See `Fleet.events`."""
        start = since if since is not None else await self._r(events.last_seq_async(self._redis))
        stream = events.follow_async(self._redis, start)
        try:
            async for event in stream:
                if event is not None and event_matches(event, host=host, kinds=kinds,
                                                       tags=dict(tags or {})):
                    yield event
        finally:
            await stream.aclose()

    # ------------------------------------------------------------------- plumbing

    async def _job_owner(self, item_id: str) -> tuple[str, str]:
        """(host, job id) of a job id, or of the call that started the job."""
        if not names.valid_id(item_id):
            raise UnknownJob(f"no such job: {item_id!r}", item_id=item_id)
        host = await self._r(aio_records.job_host(self._redis, item_id))
        if host is not None:
            return host, item_id
        record = await self._r(aio_records.call_record(self._redis, item_id))
        job_id = record.get("job_id")
        if job_id:
            host = await self._r(aio_records.job_host(self._redis, job_id))
            if host is not None:
                return host, job_id
        raise UnknownJob(f"no such job: {item_id} (unknown or expired)", item_id=item_id)

    async def _owner_host(self, item_id: str) -> str:
        if not names.valid_id(item_id):
            raise UnknownJob(f"no such job or call: {item_id!r}", item_id=item_id)
        host = await self._r(aio_records.job_host(self._redis, item_id))
        if host is None:
            record = await self._r(aio_records.call_record(self._redis, item_id))
            host = record.get("host") or None
        if host is None:
            raise UnknownJob(f"no such job or call: {item_id} (unknown or expired)",
                             item_id=item_id)
        return host

    async def _control(self, host: str, request: ControlRequest, response: type[R],
                       timeout: float = CTL_TIMEOUT_S) -> R:
        """Send a control request to `host`'s control queue; its typed response."""
        token = await self._require_alive(host)
        request = request.model_copy(update={"owner": self.owner})  # who asks: this client
        task_id = uuid.uuid4().hex
        answer = await self._replies.expect(task_id)
        subject = getattr(request, "id", None) or getattr(request, "call_id", None)
        message = task_message(
            request.task, self._identity.signed(request.task, [request.model_dump(mode="json")]),
            task_id=task_id, queue=names.ctl_queue(host), reply_to=self._replies.channel,
            argsrepr=repr(subject), expires_s=timeout,
        )
        try:
            await self._r(aio_records.push(self._redis, names.ctl_queue(host), message))
            payload = await self._await_control(host, task_id, answer, token, timeout)
        finally:
            self._replies.forget(task_id)
            answer.cancel()
        try:
            reply = ControlReply.model_validate_json(self._open(task_id, payload))
        except ValidationError:
            raise WorkerError(f"the worker on {host} answered {payload[:200]!r}") from None
        if reply.error is not None:
            raise error_for(reply.error.kind, reply.error.message)
        return response.model_validate(reply.ok or {})

    async def _await_control(
        self, host: str, task_id: str, answer: asyncio.Future[str], token: str, timeout: float
    ) -> str:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(answer), WATCH_INTERVAL_S)
            stored = await self._r(aio_records.stored_reply(self._redis, task_id))
            if stored is not None:
                return stored
            if await self._r(aio_records.host_alive_token(self._redis, host)) != token:
                raise WorkerLost(f"the worker on {host} went away before answering", host=host)
            if time.monotonic() > deadline:
                raise WorkerError(
                    f"the worker on {host} did not answer within {timeout:.0f}s"
                )


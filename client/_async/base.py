"""What every part of the fleet client stands on: `FleetBase`, the client's state (its
Redis connection, identity and keys, reply listener, shell store, bounds), its closing,
the guarded Redis helper (`_on_redis`, `_call`), and the control plumbing every part
sends through (`_control`: a request pushed on a host's control queue, its answer heard
or read back).

`AsyncFleet` (`bashfleet.client._async.fleet`) is this class with the parts of the API
on top (`calls`, `workspaces`, `images`, `snapshots`, `jobs`). Written for asyncio;
`client/_sync/base.py` is generated from it by `scripts/unasync.py`.
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Concatenate, ParamSpec, Self, TypeVar

from bashfleet.client._async import records
from bashfleet.client._async.concurrency import (
    AsyncEvent,
    AsyncLoopGuard,
    AsyncSemaphore,
    AsyncSlot,
    AsyncTasks,
    sleep,
)
from bashfleet.client._async.replies import Answer, AsyncReplies
from bashfleet.client._async.shells import AsyncShellStore
from bashfleet.client._core.constants import (
    CTL_TIMEOUT_S,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_REDIS_CONCURRENCY,
    HOST_SEEN_ALIVE_S,
    WATCH_INTERVAL_S,
)
from bashfleet.client._core.identity import outage_grace_s, require_url, resolve_identity
from bashfleet.client._core.messages import ErrorFor, control_message, decode_control
from bashfleet.client._core.routing import checked_id, host_down, job_target
from bashfleet.client._core.sending import HostsSeenAlive, control_verdict
from bashfleet.client._core.watch import Pending
from bashfleet.client._core.workspaces import open_view
from bashfleet.client.errors import BashfleetError, FleetUnavailable, UnknownWorkspace, error_for
from bashfleet.worker.fleet.connect import (
    async_redis_client,
    connection_errors,
    no_primary_errors,
    safe_url,
)
from bashfleet.worker.wire import names
from bashfleet.worker.wire.control import CancelRequest, ControlRequest
from bashfleet.worker.wire.models import HostInfo, Model, WorkspaceView
from bashfleet.worker.wire.names import CallState

if TYPE_CHECKING:
    from bashfleet.worker.fleet.connect import AsyncRedis

R = TypeVar("R", bound=Model)
T = TypeVar("T")
P = ParamSpec("P")


def _redis_errors() -> tuple[type[BaseException], ...]:
    """What a Redis that failed raises (asked when one is raised: the clients loaded
    then, redis-py or the light one, are those that can raise)."""
    return connection_errors(OSError)


def unreachable(url: str, exc: BaseException) -> FleetUnavailable:
    """Redis at `url` (password hidden) failed, said in one line: a Sentinel that knows
    no primary by that name is said so (redis-py's own message goes on with the repr of
    every sentinel's client, some 1,500 characters)."""
    reason = str(exc)
    if isinstance(exc, no_primary_errors()):
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


class FleetBase:
    """The state of an `AsyncFleet` and what each of its parts calls: its constructor
    (`AsyncFleet` says what the arguments mean), `close`, the hosts, a workspace's view,
    the Redis helper and
    the control plumbing."""

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
        # Hosts a send found alive lately: the next sends skip the look-up of their lock.
        self._seen_alive = HostsSeenAlive(HOST_SEEN_ALIVE_S)
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
            with contextlib.suppress(*_redis_errors()):
                await client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def in_flight(self) -> int:
        """Calls sent and not answered yet."""
        return len(self._pending)

    # ---------------------------------------------------------- hosts, workspaces

    async def hosts(self) -> list[HostInfo]:
        """Every host seen in the last day: alive or not, slots, busy and queued, labels
        (a host whose record does not verify is left out, with a warning)."""
        return await self._on_redis(records.list_hosts, keys=self._record_keys)

    async def _require_alive(self, host: str) -> str:
        """The lock token of the host's live instance; HostUnavailable when none holds it."""
        token = await self._on_redis(records.host_alive_token, host)
        if token is None:
            raise host_down(host, await self._on_redis(records.live_hosts))
        return token

    async def _workspace_view(self, workspace_id: str) -> WorkspaceView:
        """A workspace's view as its host sealed it in Redis (where a call in it goes);
        UnknownWorkspace when this owner has none by that id."""
        if not names.valid_id(workspace_id):
            raise UnknownWorkspace(f"no such workspace: {workspace_id!r}")
        sealed = (await self._on_redis(records.workspace_views, [workspace_id]))[0]
        view = open_view(self._record_keys, workspace_id, sealed)
        if view is None or (view.owner != self.owner and not self.admin):
            raise UnknownWorkspace(f"no such workspace: {workspace_id} (deleted, expired "
                                   "unused, or another owner's)")
        return view

    # ----------------------------------------------------- calls no one waits for

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
            previous = await self._on_redis(records.withdraw_call, call_id, CallState.CANCELLED)
            if previous != CallState.RUNNING:
                return
            host = (await self._on_redis(records.call_record, call_id)).get("host")
            if host:
                await self._on_redis(records.push, names.ctl_queue(host), self._control_message(
                    host, CancelRequest(call_id=call_id), uuid.uuid4().hex, CTL_TIMEOUT_S))

    async def _settle_sends(self) -> None:
        """Wait until no call is half sent (each push is one round trip)."""
        deadline = time.monotonic() + CTL_TIMEOUT_S
        while self._sending and time.monotonic() < deadline:
            await sleep(0.01)  # a condition polled with a deadline: a push in progress

    def _fail_all(self, error: BashfleetError) -> None:
        for pending in list(self._pending.values()):
            self._replies.deliver(pending.call_id, error)

    # ------------------------------------------------------------------- plumbing

    async def _on_redis(self, operation: Callable[Concatenate[AsyncRedis, P], Awaitable[T]],
                        *args: P.args, **kwargs: P.kwargs) -> T:
        """`operation(this client's Redis, *args, **kwargs)`, an operation of
        `bashfleet.client._async.records`, guarded as `_call` guards (the same lines,
        written out: a call's path to Redis is one frame shorter)."""
        self._loop.check()
        async with self._io:
            try:
                return await operation(self._redis, *args, **kwargs)
            except _redis_errors() as exc:
                raise unreachable(self.url, exc) from None

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
            except _redis_errors() as exc:
                raise unreachable(self.url, exc) from None

    async def _job_target(self, item_id: str) -> tuple[str, str]:
        """(host, job id) of a job id, or of the call that started the job."""
        found = await self._on_redis(records.lookup_id, checked_id(item_id, "job"))
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
            await self._on_redis(records.push, names.ctl_queue(host), message)
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
            stored = await self._on_redis(records.stored_reply, sent.task_id)
            if stored is not None:
                return stored
            token = await self._on_redis(records.host_alive_token, sent.host)
            problem = control_verdict(sent.host, sent.token, token, now=time.monotonic(),
                                      deadline=sent.deadline, timeout=sent.timeout)
            if problem is not None:
                raise problem



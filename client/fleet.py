"""The Python API of the fleet: `Fleet` (blocking; `AsyncFleet`, in `client.aio`, for asyncio).

    fleet = Fleet()                      # BASHFLEET_REDIS_URL, else the local fleet
    result = fleet.run("make test", host="build-1")
    job = fleet.run("./serve.sh", mode="background").job
    fleet.check(job.id); fleet.kill(job.id)

Calls travel as Celery tasks (JSON) through Redis: a command to its host's exec queue
(or the any / pool queue), everything else to the owning host's control queue, which
is served apart from the command slots. Every operation is one request model
(`RunRequest`, or a control request of `worker.wire.control`) and one result model;
every error a worker answers is a typed exception (`client.errors`). Answers come back
on the client's own reply channel (`client.replies`). While a call runs the client
watches the worker's heartbeat, so a worker that dies shows as `WorkerLost` within
seconds, and the command is never sent again.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import uuid
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import redis
from kombu.exceptions import OperationalError
from pydantic import ValidationError

from client import events, records, shells
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
from client.replies import Replies, Waiter
from worker.fleet.connect import client_celery, redis_client, safe_url, sentinel_target
from worker.settings import Settings
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
    OWNER_PATTERN,
    SLOW_TIMEOUT_S,
    Call,
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

log = logging.getLogger(__name__)

R = TypeVar("R", bound=Model)
Q = TypeVar("Q", bound=ControlRequest)

#: How often a waiting client looks at the worker's heartbeat.
WATCH_INTERVAL_S = 0.5
#: A claim follows a take within milliseconds; a message gone this long without one
#: was lost with the consumer that took it.
MESSAGE_LOST_GRACE_S = 3.0
#: Longest wait for a control call (check, kill, read_output, cancel, jobs).
CTL_TIMEOUT_S = 30.0
#: Longest command shown in a call's task arguments (Flower's "args").
ARGSREPR_COMMAND_CHARS = 500


#: Behind Redis Sentinel, an outage shorter than this (a failover: seconds) does not
#: fail the calls being waited for: their answers are stored, and read once a replica
#: took over. A single Redis that goes away is said at once (FleetUnavailable).
FAILOVER_GRACE_S = 30.0


def outage_grace_s(url: str) -> float:
    """How long the calls in flight wait through a Redis outage (see FAILOVER_GRACE_S)."""
    return FAILOVER_GRACE_S if sentinel_target(url) is not None else 0.0
#: Longest wait for a control call (check, kill, read_output, cancel, jobs).
CTL_TIMEOUT_S = 30.0
#: Longest command shown in a call's task arguments (Flower's "args").
ARGSREPR_COMMAND_CHARS = 500


def resolve_url(redis_url: str | None = None) -> str | None:
    """The fleet's Redis URL: the argument, else BASHFLEET_REDIS_URL, else the local fleet."""
    if redis_url:
        return redis_url
    configured = Settings().redis_url_value()
    if configured:
        return configured
    try:
        from client.local import local_redis_url  # noqa: PLC0415 - optional, CLI side
    except ImportError:
        return None
    try:
        return local_redis_url()
    except ValueError as exc:  # a state directory that is not this user's alone
        raise FleetUnavailable(f"the local fleet's state is not trusted: {exc}") from None


def _key(url: str, name: Literal["signing_key", "admin_key"]) -> str | None:
    configured = getattr(Settings(), name)
    if configured is not None:
        return str(configured.get_secret_value())
    try:
        from client.local import local_key  # noqa: PLC0415 - optional, CLI side
    except ImportError:
        return None
    return local_key(url, name)


def resolve_signing_key(url: str) -> str | None:
    """The key calls are signed with: BASHFLEET_SIGNING_KEY, else the local fleet's own
    (when `url` is that fleet's Redis), else None (unsigned)."""
    return _key(url, "signing_key")


def resolve_admin_key(url: str) -> str | None:
    """The admin key: BASHFLEET_ADMIN_KEY, else the local fleet's own (when `url` is that
    fleet's Redis: whoever runs `bashfleet up` administers it), else None."""
    return _key(url, "admin_key")


def validation_message(exc: ValidationError) -> str:
    """A pydantic error as one line: each field path and what is wrong with it."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "call"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Identity:
    """Who a client is to the fleet: the owner of its calls and the key it signs with."""

    owner: str
    signing_key: str | None
    admin: bool
    """True when `signing_key` is the admin key."""
    shell_key: str | None
    """The fleet's signing key, which seals the sessions' shells (an admin client's too:
    any client of the fleet, a person's CLI or an agent's MCP server, opens them)."""

    def signed(self, task: str, args: list[Any]) -> list[Any]:
        """A task's arguments, wrapped in a signed envelope when there is a key."""
        if self.signing_key is None:
            return args
        return [auth.sign(self.signing_key, task, args, time.time())]


def resolve_identity(url: str, owner: str | None, admin: bool) -> Identity:
    """A client's identity (`Fleet`'s `owner` and `admin` arguments); CallRejected for an
    owner that is not a valid name."""
    if owner is not None and not re.fullmatch(OWNER_PATTERN, owner):
        raise CallRejected(f"invalid owner {owner!r}: 1-128 letters, digits, _.:@-")
    admin_key = resolve_admin_key(url) if admin else None
    fleet_key = resolve_signing_key(url)
    return Identity(
        owner=owner or Settings().owner_name(),
        signing_key=admin_key or fleet_key,
        admin=admin_key is not None,
        shell_key=fleet_key,
    )


def build_call(request: RunRequest, owner: str = "") -> Call:
    """The call a request sends: its mode applied, a fresh id unless it names one."""
    timeout = request.timeout
    if request.mode == "slow" and timeout is None:
        timeout = SLOW_TIMEOUT_S
    try:
        return Call(
            call_id=request.call_id or f"c{uuid.uuid4().hex[:23]}", command=request.command,
            cwd=request.cwd or request.default_cwd, timeout_s=timeout,
            background=request.mode == "background",
            env=request.env, unset_env=request.unset_env, capture_state=request.capture_state,
            head=request.head, tail=request.tail, owner=owner, isolation=request.isolation,
            network=request.network, session=request.session, tags=request.tags,
            stdin=request.stdin, term_size=request.term_size, shell=request.shell,
            login=request.login,
            **({"input_wait_s": request.input_wait_s} if request.input_wait_s else {}),
            **({"policy": request.policy} if request.policy is not None else {}),
        )
    except ValidationError as exc:
        raise CallRejected(f"invalid call: {validation_message(exc)}") from None


def run_request(command: str, options: dict[str, Any]) -> RunRequest:
    """`RunRequest(command=command, **options)`, a bad option a CallRejected."""
    try:
        return RunRequest(command=command, **options)
    except ValidationError as exc:
        raise CallRejected(f"invalid call: {validation_message(exc)}") from None


def _argsrepr(call: Call) -> str:
    """What Flower shows as a call's arguments when it is sent: the command's size, the
    cwd asked for, the dialect, the session (the worker adds the cwd actually used and
    the job id once the call ends: `worker.fleet.flower`).

    Celery would otherwise repr the whole call (its policy, and its `env`, which may
    hold secrets) on every send: ~0.1 ms of client CPU per call, for a text cut at
    1 KB anyway. The command itself is redacted: it may carry a token inline
    (curl -H ...), and Flower shows these arguments to anyone with its password.
    """
    return repr({"command": f"<redacted: {len(call.command)} chars>", "cwd": call.cwd,
                 "background": call.background, "dialect": call.policy.name,
                 "session": call.session})


class Outage:
    """Redis errors while a call is waited for: tolerated for `grace_s` (a Sentinel
    failover), since the worker stores the answer for when a replica took over."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.since: float | None = None

    @contextlib.contextmanager
    def tolerated(self) -> Iterator[None]:
        """Run the block; a Redis error in it passes (after a short pause) unless the
        outage has lasted `grace_s`, then it is raised."""
        try:
            yield
            self.since = None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            now = time.monotonic()
            self.since = self.since or now
            if now - self.since >= self.grace_s:
                raise exc from None
            time.sleep(WATCH_INTERVAL_S)  # Redis is away: look again in a moment


class Fleet:
    """A client of the fleet. Thread-safe; cheap to keep for the life of a process.

    `owner`: who this client's calls and jobs belong to (default: BASHFLEET_OWNER, else
    `user:<login>`); another owner's jobs are unknown to it. `admin`: sign with the
    admin key when one is configured (BASHFLEET_ADMIN_KEY, or the local fleet's), to
    reach every owner's jobs.
    """

    def __init__(
        self, redis_url: str | None = None, *, owner: str | None = None, admin: bool = False
    ) -> None:
        url = resolve_url(redis_url)
        if not url:
            raise FleetUnavailable(
                "no fleet configured: pass redis_url=, set BASHFLEET_REDIS_URL, "
                "or start a local fleet with `bashfleet up`"
            )
        self.url = safe_url(url)
        """The Redis URL with its password hidden (for messages)."""
        self._redis = redis_client(url)
        self._celery = client_celery(url)
        identity = self._identity = resolve_identity(url, owner, admin)
        self.owner = identity.owner
        """Who this client's calls and jobs belong to."""
        self.admin = identity.admin
        """True when this client signs with the admin key."""
        self._shell_key = identity.shell_key
        self._keys = auth.keyring([identity.signing_key or ""])
        self._replies = Replies(self._redis, self._keys)
        self._outage_grace_s = outage_grace_s(url)
        # call id -> when its unclaimed message was first seen gone from its queue.
        self._missing_since: dict[str, float] = {}

    def close(self) -> None:
        """Close the connections (the object is unusable afterwards)."""
        self._replies.close()
        self._redis.close()
        self._celery.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Redis and broker failures become FleetUnavailable, password hidden."""
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError, OperationalError, OSError) as exc:
            raise FleetUnavailable(f"Redis at {self.url} is unreachable: {exc}") from None

    # ------------------------------------------------------------------------ run

    def run(self, command: str, **options: Any) -> CallResult:
        """Run `command`; `options` are `RunRequest`'s fields (host, label, mode,
        timeout, cwd, session, policy, env, call_id, head, tail, unset_env,
        capture_state). An unknown or invalid option is a CallRejected.

        `host` None: any live host (`label`: a host of that pool). `mode`: `default`
        (the policy's timeout), `slow` (15 minutes unless `timeout` says otherwise) or
        `background` (start it detached, return its job at once). A `session` is a
        shell that lives on in Redis: its calls run on the host of its first call, and
        each starts in the directory and with the variables the previous ones left.
        `call_id` (default: a fresh one) lets another thread `cancel` the call.
        """
        return self.execute(run_request(command, options))

    def execute(self, request: RunRequest) -> CallResult:
        """Run a `RunRequest` (what `run` builds) and wait for its result.

        With a `session`, the call runs in the session's shell (`client.shells`): on its
        pinned host, in its cwd, with its variables; and what the call changed (a `cd`,
        an `export`, an `unset`) is kept for the session's next call, whoever makes it.
        """
        if request.session is None:
            return self._execute(request)
        from client.sessions import ShellStore  # noqa: PLC0415 - only sessions need it

        if not names.valid_id(request.session):
            raise CallRejected(f"invalid session id {request.session!r}")
        store = ShellStore(self._redis, key=self._shell_key)
        with self._errors():
            shell = store.load(request.session)
        result = self._execute(shells.fill_request(shell, request))
        change = shells.change_of(result)
        if change:
            try:
                store.commit(request.session, change)
            except redis.RedisError as exc:
                # The call ran: its result matters more than the session's next cwd.
                log.warning("session %s: could not save its shell: %s", request.session, exc)
        return result

    def _execute(self, request: RunRequest) -> CallResult:
        call = build_call(request, self.owner)
        host, label = request.host, request.label
        with self._errors():
            queue, target = self._route(host, label)
            args = self._identity.signed(Task.EXEC, [call.model_dump(mode="json")])
            message = task_message(
                Task.EXEC, args, task_id=call.call_id, queue=queue,
                reply_to=self._replies.channel, argsrepr=_argsrepr(call),
            )
            waiter = self._replies.expect(call.call_id)
            try:
                self._send_call(call.call_id, queue, target, message)
                return self._wait_call(waiter, target, label, queue)
            finally:
                self._replies.forget(waiter)

    def _send_call(self, call_id: str, queue: str, target: str | None, message: str) -> None:
        """Record the call and push its message: one round trip, one Lua script that also
        checks the named host is alive (no Celery publish: see `worker.wire.messages`)."""
        sent = records.send_call(
            self._redis, call_id, queue, target, message, require_alive=target is not None
        )
        if sent == "down" and target is not None:
            self._require_alive(target)  # raises HostUnavailable, with the live hosts
            sent = records.send_call(self._redis, call_id, queue, target, message,
                                     require_alive=False)
        if sent == "taken":
            raise CallRejected(f"call id {call_id} is already in use")

    def _route(self, host: str | None, label: str | None) -> tuple[str, str | None]:
        """(queue, target host) for a call; HostUnavailable when nobody would take it.

        A named host's liveness is checked by `execute`, with the call's record.
        """
        if host is not None:
            try:
                names.validate_host(host)
            except ValueError as exc:
                raise CallRejected(str(exc)) from None
            return names.exec_queue(host), host
        alive = records.live_hosts(self._redis)
        if label is not None:
            try:
                names.validate_label(label)
            except ValueError as exc:
                raise CallRejected(str(exc)) from None
            if not any(label in info.labels for info in self._infos(alive)):
                raise HostUnavailable(f"no live worker has the label {label!r}")
            return names.pool_queue(label), None
        if not alive:
            raise HostUnavailable("no live worker in the fleet")
        return names.ANY_EXEC_QUEUE, None

    def _infos(self, hosts: list[str]) -> list[HostInfo]:
        infos = (records.host_info(self._redis, host) for host in hosts)
        return [info for info in infos if info is not None]

    def _require_alive(self, host: str) -> str:
        token = records.host_alive_token(self._redis, host)
        if token is None:
            live = ", ".join(records.live_hosts(self._redis)) or "none"
            raise HostUnavailable(
                f"no live worker for host {host!r} (live hosts: {live})", host=host
            )
        return token

    def _send(self, task: str, args: list[Any], queue: str, task_id: str, argsrepr: str,
              **options: Any) -> None:
        """Publish a task whose answer comes back on this client's reply channel."""
        self._celery.send_task(
            task, args=args, queue=queue, task_id=task_id, reply_to=self._replies.channel,
            ignore_result=True, argsrepr=argsrepr, kwargsrepr="{}", **options,
        )

    def _answer(self, waiter: Waiter, timeout: float) -> str | None:
        """The task's verified answer if it arrives within `timeout` (`Replies.answer`)."""
        return self._replies.answer(waiter, timeout)

    def _wait_call(
        self, waiter: Waiter, target: str | None, label: str | None, queue: str
    ) -> CallResult:
        call_id = waiter.task_id
        outage = Outage(self._outage_grace_s)
        try:
            while True:
                problem: BashfleetError | CallResult | None = None
                with outage.tolerated():
                    payload = self._answer(waiter, WATCH_INTERVAL_S)
                    if payload is not None:
                        return CallResult.model_validate_json(payload)
                    problem = self._watch(call_id, target, label, queue)
                if problem is None:
                    continue
                # Before calling it lost, take an answer that arrived meanwhile.
                payload = self._answer(waiter, 0.05)
                if payload is not None:
                    return CallResult.model_validate_json(payload)
                if isinstance(problem, CallResult):
                    return problem
                raise problem
        finally:
            self._missing_since.pop(call_id, None)

    def _watch(
        self, call_id: str, target: str | None, label: str | None, queue: str
    ) -> BashfleetError | CallResult | None:
        """What went wrong with a pending call, if anything (None: keep waiting)."""
        record = records.call_record(self._redis, call_id)
        state = record.get("state")
        host = record.get("host") or target
        if state == CallState.LOST:
            note = record.get("note") or "it died"
            return WorkerLost(
                f"the worker on {host} was lost while running call {call_id} ({note}); "
                "the command was not run again", call_id=call_id, host=host,
            )
        if state in CALL_UNSTARTED:
            message = f"call {call_id} was {state} before it started; it did not run"
            return CallResult(
                call_id=call_id, host=host or "",
                error=SystemError_(kind="internal", message=message),
            )
        if state == CallState.QUEUED or state is None:
            # The queue as sent: a record Redis lost (a failover) names none.
            return self._watch_queued(call_id, target, label, record.get("queue") or queue)
        instance = record.get("instance")
        if host and instance and records.host_alive_token(self._redis, host) != instance:
            return WorkerLost(
                f"the worker on {host} died while running call {call_id}; "
                "the command was not run again", call_id=call_id, host=host,
            )
        return None

    def _watch_queued(
        self, call_id: str, target: str | None, label: str | None, queue: str | None = None
    ) -> BashfleetError | None:
        """A call no worker took yet: withdraw it when no worker is left to take it, or
        when its message left the queue without any worker starting it."""
        if queue is not None and self._message_lost(call_id, queue):
            if records.withdraw_call(self._redis, call_id) != CallState.QUEUED:
                return None  # a worker took it after all: watch it as a running call
            return WorkerLost(
                f"call {call_id} was taken from its queue by a worker that died before "
                "starting it; it was withdrawn and will not run", call_id=call_id, host=target,
            )
        if target is not None:
            if records.host_alive_token(self._redis, target) is not None:
                return None
            where = f"host {target}"
        else:
            alive = records.live_hosts(self._redis)
            if label is not None:
                alive = [i.host for i in self._infos(alive) if label in i.labels]
            if alive:
                return None
            where = f"pool {label}" if label else "the fleet"
        if records.withdraw_call(self._redis, call_id) != CallState.QUEUED:
            return None  # a worker took it meanwhile: watch it as a running call
        return WorkerLost(
            f"no live worker is left in {where} to run call {call_id}; "
            "the call was withdrawn and will not run", call_id=call_id, host=target,
        )

    def _message_lost(self, call_id: str, queue: str) -> bool:
        """True once the call's message has been gone from its queue, unclaimed, for
        MESSAGE_LOST_GRACE_S: a consumer took it and died (or Redis handed it to a dead
        consumer's read), so no worker will ever start it."""
        now = time.monotonic()
        if records.message_waiting(self._redis, queue, call_id):
            self._missing_since.pop(call_id, None)
            return False
        since = self._missing_since.setdefault(call_id, now)
        return now - since >= MESSAGE_LOST_GRACE_S

    # -------------------------------------------------------------------- control

    def check(
        self, id: str, *, grep: str | None = None, offset: int | None = None,
        stderr_offset: int | None = None, truncation: Truncation | None = None,
    ) -> CheckResult:
        """A job's state and its output since `offset` (None: since the last check).

        "The last check" is any client's: the offsets are kept in the job's record.
        `truncation` cuts the new output (default: the last 2000 lines).
        """
        return self.check_job(self._request(
            CheckRequest, id=id, grep=grep, offset=offset, stderr_offset=stderr_offset,
            truncation=truncation,
        ))

    def check_job(self, request: CheckRequest) -> CheckResult:
        """`check`, from its request model."""
        with self._errors():
            host, job_id = self._job_owner(request.id)
            request = request.model_copy(update={"id": job_id})
            return self._control(host, request, CheckResult)

    def kill(
        self, id: str, *, offset: int | None = None, stderr_offset: int | None = None,
        truncation: Truncation | None = None,
    ) -> CheckResult:
        """End a job; its final state and its output since `offset` (None: the last check)."""
        return self.kill_job(self._request(
            KillRequest, id=id, offset=offset, stderr_offset=stderr_offset,
            truncation=truncation,
        ))

    def kill_job(self, request: KillRequest) -> CheckResult:
        """`kill`, from its request model."""
        with self._errors():
            host, job_id = self._job_owner(request.id)
            request = request.model_copy(update={"id": job_id})
            return self._control(host, request, CheckResult)

    def read_output(
        self, id: str, *, offset: int = 0, limit: int = 65536, grep: str | None = None,
        stream: Literal["stdout", "stderr"] = "stdout",
    ) -> OutputChunk:
        """A slice of a job's output, or of the kept (spilled) output of a call."""
        return self.read_chunk(self._request(
            ReadOutputRequest, id=id, offset=offset, limit=limit, grep=grep, stream=stream
        ))

    def read_chunk(self, request: ReadOutputRequest) -> OutputChunk:
        """`read_output`, from its request model."""
        with self._errors():
            return self._control(self._owner_host(request.id), request, OutputChunk)

    def cancel(self, call_id: str) -> bool:
        """Stop a call: withdraw it if queued, kill its processes if running.

        True when it was withdrawn or its processes were signalled; False when it had
        ended already.
        """
        with self._errors():
            record = self._call(call_id)
            previous = records.withdraw_call(self._redis, call_id, CallState.CANCELLED)
            if previous == CallState.QUEUED:
                return True
            if previous != CallState.RUNNING:
                return False
            result = self._control(record["host"], CancelRequest(call_id=call_id), CancelResult)
            return result.cancelled

    def detach(self, call_id: str) -> bool:
        """Leave a running foreground call running as a background job.

        True when the call was asked to: its own result (the one `run` returns) then
        names the job (`CallResult.job`). False when it was not running (yet: a call is
        detachable once it has run 50 ms) or had ended already.
        """
        with self._errors():
            record = self._call(call_id)
            if record.get("state") != CallState.RUNNING:
                return False
            request = DetachRequest(call_id=call_id)
            return self._control(record["host"], request, DetachResult).detached

    def call_host(self, call_id: str) -> str | None:
        """The host a call runs (or ran) on; None while it waits in a queue for any host,
        or when the call is unknown (`bashfleet run`'s spinner names it once known)."""
        if not names.valid_id(call_id):
            return None
        with self._errors():
            return records.call_record(self._redis, call_id).get("host") or None

    def jobs(
        self, host: str | None = None, *, all_owners: bool = False,
        tags: Mapping[str, str] | None = None, owner: str | None = None,
    ) -> list[JobView]:
        """This client's background jobs on one host, or on every host the fleet knows;
        oldest first; only those carrying every tag of `tags`. `all_owners` (an admin
        client only): every owner's, or those of `owner`."""
        every = all_owners or (owner is not None and owner != self.owner)
        return [view for view in self._all_jobs(host, every)
                if events.job_matches(view, tags=tags, owner=owner)]

    def _all_jobs(self, host: str | None, all_owners: bool) -> list[JobView]:
        with self._errors():
            hosts = [host] if host is not None else [
                info.host for info in records.list_hosts(self._redis)
            ]
            live = set(records.live_hosts(self._redis))
            request = JobsRequest(all_owners=all_owners)
            asked = {h: self._send_control(h, request) for h in hosts if h in live}
            views: list[JobView] = []
            for name in hosts:
                if name in asked:
                    try:
                        views += self._await_control(name, asked[name], JobList).jobs
                        continue
                    except (WorkerLost, HostUnavailable):
                        pass  # it died meanwhile: show what Redis knows
                views += [
                    view for view in records.list_jobs(self._redis, name)
                    if all_owners or view.owner == self.owner
                ]
            return sorted(views, key=lambda view: view.started_at)

    def job_views(self, ids: list[str]) -> dict[str, JobView]:
        """What Redis knows of these jobs, by id, in one round trip (no worker is asked):
        how a dialect learns which of its jobs ended. Unknown ids are left out."""
        with self._errors():
            return events.job_views(self._redis, [i for i in ids if names.valid_id(i)])

    def wait(self, id: str, *, timeout: float | None = None) -> JobView:
        """Wait until a job (or the job a call started) ends; its final view.

        Hears the job's `ended` event (`events`) as it is published, and reads the job's
        record at each idle tick, so neither a missed publish nor a Redis reconnect
        makes it miss the end. WaitTimeout after `timeout` seconds (the job runs on).
        """
        with self._errors():
            _, job_id = self._job_owner(id)
            since = events.last_seq(self._redis)
            view = self.job_views([job_id]).get(job_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        # Ticks short enough to keep the timeout, within a tenth of a second or so.
        tick = events.IDLE_TICK_S if timeout is None else min(events.IDLE_TICK_S, 0.1)
        stream = events.follow(self._redis, since, tick)
        try:
            while view is None or view.state != "ended":
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(
                        f"job {job_id} still running after {timeout:g}s", job_id=job_id
                    )
                event = next(stream)
                if event is None or (event.job_id == job_id and event.kind == "ended"):
                    with contextlib.suppress(FleetUnavailable):  # Redis away: next tick
                        view = self.job_views([job_id]).get(job_id, view)
            return view
        finally:
            stream.close()

    def events(
        self, *, host: str | None = None, kinds: tuple[EventKind, ...] = (),
        tags: Mapping[str, str] | None = None, since: str | None = None,
    ) -> Generator[JobEvent, None, None]:
        """Job events (a job started, a job ended) of the whole fleet as they happen,
        from any client; filtered by host, kind and tags. `since`: a `JobEvent.seq` to
        resume after ("0-0": every event kept); None: from now. Endless: break out of
        it (or close it). Nothing is missed across a Redis reconnect (see
        `client.events`)."""
        with self._errors():
            start = since if since is not None else events.last_seq(self._redis)
        stream = events.follow(self._redis, start)
        try:
            for event in stream:
                if event is not None and event_matches(event, host=host, kinds=kinds,
                                                       tags=dict(tags or {})):
                    yield event
        finally:
            stream.close()

    def hosts(self) -> list[HostInfo]:
        """Every host seen in the last day: alive or not, slots, busy and queued, labels."""
        with self._errors():
            infos = records.list_hosts(self._redis)
            # One more round trip for all the hosts' queues; LLEN is O(1) whatever waits.
            depths = records.queue_depths(
                self._redis, [names.exec_queue(info.host) for info in infos]
            )
        return [
            info.model_copy(update={"queued": depths[names.exec_queue(info.host)]})
            for info in infos
        ]

    def shared_queues(self) -> dict[str, int]:
        """Calls waiting in the queues no single host owns, by queue name.

        `bashfleet.any.exec` (calls with no host) and `bashfleet.pool.<label>.exec` for
        each label of a known host: any live host (of the label) takes them, so
        `hosts()` counts them for none.
        """
        with self._errors():
            labels = sorted({label for info in records.list_hosts(self._redis)
                             for label in info.labels})
            queues = [names.ANY_EXEC_QUEUE, *(names.pool_queue(lb) for lb in labels)]
            return records.queue_depths(self._redis, queues)

    # ---------------------------------------------------------- interactive sessions

    def write_stdin(
        self, id: str, data: str = "", *, collect: Collect | None = None,
        data_b64: str | None = None,
    ) -> SessionOutput:
        """Write `data` to an interactive job's stdin (through its terminal for a PTY:
        `\u0003` is Ctrl-C), then return its output since the last read by any client of
        this owner; empty `data` only reads. `collect` says how long to wait for output."""
        return self.write_stdin_request(self._request(
            WriteStdinRequest, id=id, data=data, data_b64=data_b64,
            collect=collect or Collect(),
        ))

    def write_stdin_request(self, request: WriteStdinRequest) -> SessionOutput:
        """`write_stdin`, from its request model."""
        return self._session_control(request, request.collect)

    def read(self, id: str, *, collect: Collect | None = None) -> SessionOutput:
        """An interactive job's output since the last read (a poll: nothing is written)."""
        return self.write_stdin(id, collect=collect)

    def close_stdin(self, id: str, *, collect: Collect | None = None) -> SessionOutput:
        """End an interactive job's input (EOF; Ctrl-D through a terminal); its new output."""
        return self.close_stdin_request(self._request(
            CloseStdinRequest, id=id, collect=collect or Collect()))

    def close_stdin_request(self, request: CloseStdinRequest) -> SessionOutput:
        """`close_stdin`, from its request model."""
        return self._session_control(request, request.collect)

    def resize(self, id: str, rows: int, cols: int) -> SessionOutput:
        """Set an interactive job's terminal size (its foreground process gets SIGWINCH)."""
        request = self._request(ResizeRequest, id=id, rows=rows, cols=cols)
        return self._session_control(request, Collect(read=False))

    def _session_control(
        self, request: WriteStdinRequest | CloseStdinRequest | ResizeRequest, collect: Collect
    ) -> SessionOutput:
        with self._errors():
            host, job_id = self._job_owner(request.id)
            request = request.model_copy(update={"id": job_id})
            # The worker may wait that long for output before it answers.
            timeout = CTL_TIMEOUT_S + collect.wait_s + collect.delay_s
            return self._control(host, request, SessionOutput, timeout)

    # ------------------------------------------------------------------- plumbing

    @staticmethod
    def _request(model: type[Q], **fields: Any) -> Q:
        """A control request, a bad field a CallRejected (nothing sent)."""
        try:
            return model(**fields)
        except ValidationError as exc:
            raise CallRejected(f"invalid {model.__name__}: {validation_message(exc)}") from None

    def _call(self, call_id: str) -> dict[str, str]:
        if not names.valid_id(call_id):
            raise UnknownJob(f"no such call: {call_id!r}", item_id=call_id)
        record = records.call_record(self._redis, call_id)
        if not record:
            raise UnknownJob(f"no such call: {call_id} (unknown or expired)", item_id=call_id)
        return record

    def _job_owner(self, item_id: str) -> tuple[str, str]:
        """(host, job id) of a job id, or of the call that started the job."""
        if not names.valid_id(item_id):
            raise UnknownJob(f"no such job: {item_id!r}", item_id=item_id)
        host = records.job_host(self._redis, item_id)
        if host is not None:
            return host, item_id
        job_id = records.call_record(self._redis, item_id).get("job_id")
        if job_id:
            host = records.job_host(self._redis, job_id)
            if host is not None:
                return host, job_id
        raise UnknownJob(f"no such job: {item_id} (unknown or expired)", item_id=item_id)

    def _owner_host(self, item_id: str) -> str:
        """Host holding the output of a job or call id."""
        if not names.valid_id(item_id):
            raise UnknownJob(f"no such job or call: {item_id!r}", item_id=item_id)
        host = records.job_host(self._redis, item_id)
        if host is None:
            host = records.call_record(self._redis, item_id).get("host") or None
        if host is None:
            raise UnknownJob(
                f"no such job or call: {item_id} (unknown or expired)", item_id=item_id
            )
        return host

    def _control(self, host: str, request: ControlRequest, response: type[R],
                 timeout: float = CTL_TIMEOUT_S) -> R:
        """Send a control request to `host`'s control queue; its typed response."""
        return self._await_control(host, self._send_control(host, request, timeout), response,
                                   timeout)

    def _send_control(self, host: str, request: ControlRequest,
                      timeout: float = CTL_TIMEOUT_S) -> tuple[Waiter, str]:
        token = self._require_alive(host)
        request = request.model_copy(update={"owner": self.owner})  # who asks: this client
        waiter = self._replies.expect(uuid.uuid4().hex)
        args = [request.model_dump(mode="json")]
        subject = getattr(request, "id", None) or getattr(request, "call_id", None)
        try:
            self._send(
                request.task, self._identity.signed(request.task, args), names.ctl_queue(host),
                waiter.task_id, repr(subject), expires=timeout,
            )
        except BaseException:
            self._replies.forget(waiter)
            raise
        return waiter, token

    def _await_control(self, host: str, sent: tuple[Waiter, str], response: type[R],
                       timeout: float = CTL_TIMEOUT_S) -> R:
        waiter, token = sent
        try:
            payload = self._await_control_answer(host, waiter, token, timeout)
        finally:
            self._replies.forget(waiter)
        try:
            reply = ControlReply.model_validate_json(payload)
        except ValidationError:
            raise WorkerError(f"the worker on {host} answered {payload[:200]!r}") from None
        if reply.error is not None:
            raise error_for(reply.error.kind, reply.error.message)
        return response.model_validate(reply.ok or {})

    def _await_control_answer(self, host: str, waiter: Waiter, token: str,
                              timeout: float = CTL_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout
        while True:
            payload = self._answer(waiter, WATCH_INTERVAL_S)
            if payload is not None:
                return payload
            if records.host_alive_token(self._redis, host) != token:
                raise WorkerLost(f"the worker on {host} went away before answering", host=host)
            if time.monotonic() > deadline:
                raise WorkerError(
                    f"the worker on {host} did not answer within {timeout:.0f}s"
                )

"""The Python API of the fleet: `Fleet` (blocking) and `AsyncFleet` (asyncio).

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

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any, Literal, TypeVar

import redis
from kombu.exceptions import OperationalError
from kombu.utils.url import maybe_sanitize_url
from pydantic import ValidationError

from client import records
from client.errors import (
    BashfleetError,
    CallRejected,
    FleetUnavailable,
    HostUnavailable,
    UnknownJob,
    WorkerError,
    WorkerLost,
    error_for,
)
from client.replies import Replies, Waiter
from worker.fleet.connect import client_celery, redis_client
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
    JobList,
    JobsRequest,
    KillRequest,
    ReadOutputRequest,
    ResizeRequest,
    SessionOutput,
    WriteStdinRequest,
)
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


def resolve_signing_key(url: str) -> str | None:
    """The key calls are signed with: BASHFLEET_SIGNING_KEY, else the local fleet's own
    (when `url` is that fleet's Redis), else None (unsigned)."""
    configured = Settings().signing_key
    if configured is not None:
        return configured.get_secret_value()
    try:
        from client.local import local_signing_key  # noqa: PLC0415 - optional, CLI side
    except ImportError:
        return None
    return local_signing_key(url)


def resolve_admin_key(url: str) -> str | None:
    """The admin key: BASHFLEET_ADMIN_KEY, else the local fleet's own (when `url` is that
    fleet's Redis: whoever runs `bashfleet up` administers it), else None."""
    configured = Settings().admin_key
    if configured is not None:
        return configured.get_secret_value()
    try:
        from client.local import local_admin_key  # noqa: PLC0415 - optional, CLI side
    except ImportError:
        return None
    return local_admin_key(url)


def validation_message(exc: ValidationError) -> str:
    """A pydantic error as one line: each field path and what is wrong with it."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "call"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def build_call(request: RunRequest, owner: str = "") -> Call:
    """The call a request sends: its mode applied, a fresh id unless it names one."""
    timeout = request.timeout
    if request.mode == "slow" and timeout is None:
        timeout = SLOW_TIMEOUT_S
    try:
        return Call(
            call_id=request.call_id or f"c{uuid.uuid4().hex[:23]}", command=request.command,
            cwd=request.cwd, timeout_s=timeout, background=request.mode == "background",
            env=request.env, unset_env=request.unset_env, capture_state=request.capture_state,
            head=request.head, tail=request.tail, owner=owner, isolation=request.isolation,
            network=request.network, stdin=request.stdin, term_size=request.term_size,
            shell=request.shell, login=request.login,
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
    """What Flower and the task events show as a call's arguments: command and cwd.

    Celery would otherwise repr the whole call (its policy, and its `env`, which may
    hold secrets) on every send: ~0.1 ms of client CPU per call, for a text cut at
    1 KB anyway.
    """
    # The command itself is redacted: it may carry a token inline (curl -H ...), and
    # Flower shows these arguments to anyone with its password.
    size = len(call.command)
    return repr({"command": f"<redacted: {size} chars>", "cwd": call.cwd,
                 "background": call.background})


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
        if owner is not None and not re.fullmatch(OWNER_PATTERN, owner):
            raise CallRejected(f"invalid owner {owner!r}: 1-128 letters, digits, _.:@-")
        url = resolve_url(redis_url)
        if not url:
            raise FleetUnavailable(
                "no fleet configured: pass redis_url=, set BASHFLEET_REDIS_URL, "
                "or start a local fleet with `bashfleet up`"
            )
        self.url = maybe_sanitize_url(url)
        """The Redis URL with its password hidden (for messages)."""
        self._redis = redis_client(url)
        self._celery = client_celery(url)
        self.owner = owner or Settings().owner_name()
        """Who this client's calls and jobs belong to."""
        admin_key = resolve_admin_key(url) if admin else None
        self.admin = admin_key is not None
        """True when this client signs with the admin key."""
        self._signing_key = admin_key or resolve_signing_key(url)
        self._keys = auth.keyring([self._signing_key or ""])
        self._replies = Replies(self._redis, self._keys)
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
        `background` (start it detached, return its job at once). A `session` pins the
        host of its first call for its later calls. `call_id` (default: a fresh one)
        lets another thread `cancel` the call while it runs.
        """
        return self.execute(run_request(command, options))

    def execute(self, request: RunRequest) -> CallResult:
        """Run a `RunRequest` (what `run` builds) and wait for its result."""
        call = build_call(request, self.owner)
        host, label, session = request.host, request.label, request.session
        with self._errors():
            if session is not None and host is None and label is None:
                host = self._session_host(session)
            queue, target = self._route(host, label)
            # One round trip: the host's liveness and the new call record, atomically.
            submitted = records.submit_call(
                self._redis, call.call_id, queue, target, require_alive=target is not None
            )
            if submitted == "down" and target is not None:
                self._require_alive(target)  # raises HostUnavailable, with the live hosts
                submitted = records.submit_call(self._redis, call.call_id, queue, target)
            if submitted == "taken":
                raise CallRejected(f"call id {call.call_id} is already in use")
            args = self._signed(Task.EXEC, [call.model_dump(mode="json")])
            waiter = self._replies.expect(call.call_id)
            try:
                self._send(Task.EXEC, args, queue, call.call_id, _argsrepr(call))
                result = self._wait_call(waiter, target, label)
            finally:
                self._replies.forget(waiter)
            if session is not None:
                records.pin_session(self._redis, session, result.host, self._signing_key)
            return result

    def _session_host(self, session: str) -> str | None:
        if not names.valid_id(session):
            raise CallRejected(f"invalid session id {session!r}")
        return records.session_host(self._redis, session, self._keys)

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

    def _wait_call(self, waiter: Waiter, target: str | None, label: str | None) -> CallResult:
        call_id = waiter.task_id
        try:
            while True:
                payload = self._answer(waiter, WATCH_INTERVAL_S)
                if payload is not None:
                    return CallResult.model_validate_json(payload)
                problem = self._watch(call_id, target, label)
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
        self, call_id: str, target: str | None, label: str | None
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
            return self._watch_queued(call_id, target, label, record.get("queue"))
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
        request = self._request(
            ReadOutputRequest, id=id, offset=offset, limit=limit, grep=grep, stream=stream
        )
        with self._errors():
            return self._control(self._owner_host(id), request, OutputChunk)

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

    def jobs(self, host: str | None = None, *, all_owners: bool = False) -> list[JobView]:
        """This client's background jobs on one host, or on every host the fleet knows;
        oldest first. `all_owners`: every owner's (an admin client only)."""
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

    def _signed(self, task: str, args: list[Any]) -> list[Any]:
        """The task's arguments, wrapped in a signed envelope when a key is configured."""
        if self._signing_key is None:
            return args
        return [auth.sign(self._signing_key, task, args, time.time())]

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
                request.task, self._signed(request.task, args), names.ctl_queue(host),
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


class AsyncFleet:
    """`Fleet` for asyncio: the same methods, awaited (each runs in a worker thread)."""

    def __init__(
        self, redis_url: str | None = None, *, owner: str | None = None, admin: bool = False
    ) -> None:
        self.fleet = Fleet(redis_url, owner=owner, admin=admin)
        self.url = self.fleet.url

    async def run(self, command: str, **options: Any) -> CallResult:
        """See `Fleet.run`."""
        return await self.execute(run_request(command, options))

    async def execute(self, request: RunRequest) -> CallResult:
        """See `Fleet.execute`."""
        return await asyncio.to_thread(self.fleet.execute, request)

    async def check(self, id: str, **options: Any) -> CheckResult:
        """See `Fleet.check`."""
        return await asyncio.to_thread(lambda: self.fleet.check(id, **options))

    async def kill(self, id: str, **options: Any) -> CheckResult:
        """See `Fleet.kill`."""
        return await asyncio.to_thread(lambda: self.fleet.kill(id, **options))

    async def read_output(self, id: str, **options: Any) -> OutputChunk:
        """See `Fleet.read_output`."""
        return await asyncio.to_thread(lambda: self.fleet.read_output(id, **options))

    async def cancel(self, call_id: str) -> bool:
        """See `Fleet.cancel`."""
        return await asyncio.to_thread(self.fleet.cancel, call_id)

    async def write_stdin(self, id: str, data: str = "", **options: Any) -> SessionOutput:
        """See `Fleet.write_stdin`."""
        return await asyncio.to_thread(lambda: self.fleet.write_stdin(id, data, **options))

    async def close_stdin(self, id: str, **options: Any) -> SessionOutput:
        """See `Fleet.close_stdin`."""
        return await asyncio.to_thread(lambda: self.fleet.close_stdin(id, **options))

    async def resize(self, id: str, rows: int, cols: int) -> SessionOutput:
        """See `Fleet.resize`."""
        return await asyncio.to_thread(self.fleet.resize, id, rows, cols)

    async def jobs(self, host: str | None = None, *, all_owners: bool = False) -> list[JobView]:
        """See `Fleet.jobs`."""
        return await asyncio.to_thread(lambda: self.fleet.jobs(host, all_owners=all_owners))

    async def hosts(self) -> list[HostInfo]:
        """See `Fleet.hosts`."""
        return await asyncio.to_thread(self.fleet.hosts)

    async def shared_queues(self) -> dict[str, int]:
        """See `Fleet.shared_queues`."""
        return await asyncio.to_thread(self.fleet.shared_queues)

    def close(self) -> None:
        """Close the connections."""
        self.fleet.close()

    async def __aenter__(self) -> AsyncFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

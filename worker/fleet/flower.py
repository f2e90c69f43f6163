"""What Flower shows of the fleet beyond Celery's own events: failed calls as failures,
the arguments a call actually ran with, background jobs, names a person reads, and no
control that would lie.

- Workers: each host shows as three, named for what they do: `calls@<host>` (the
  consumer that runs its commands; Active: its busy slots), `control@<host>` (the one
  that answers check, kill, output, cancel... at once, whatever the slots do), and
  `jobs@<host>` (its background jobs, sent by its supervisor; Active: the jobs running).
- Commands: a call's and a job's arguments show the command, so a person can tell calls
  apart (`shown_command`): with the values of secrets the worker knows redacted (its
  scrubbed environment, its secret files, its own keys), the values of the call's own
  `env` that can be secrets, credentials written inline (a URL's password, a bearer
  token, `--password X`, `TOKEN=...`, the well-known token formats), and cut past
  MAX_COMMAND_CHARS. A call's command shows from its start (`task-started`, sent once
  its bash runs: as the call was verified) and again when it ends (as it ran).
- Control: Celery's remote control is off (it is unsigned: anyone who can write to
  Redis could stop hosts), so Flower's Revoke and Terminate would answer "Revoked" and
  stop nothing. Flower serving this app is read-only (`read_only_by_default`): it offers
  neither; a call or job is stopped through the fleet's signed path (`bashfleet kill ID`,
  `Fleet.cancel`).

- A call whose command failed (non-zero exit, a signal, a timeout kill, a system error,
  a cancel) shows as FAILURE, its reason as the exception (`exit 42`, `timeout after
  2s`): the exec task raises `CallFailed` *after* its answer went to the caller, so the
  caller's reply is untouched, and a success costs nothing more. Celery then sends
  `task-failed` (what Flower's "Failed" counts and `flower_events_total{type="task-failed"}`
  counts) and, `CallFailed` being declared in the task's `throws`, logs no traceback.
- Arguments: the client's `argsrepr` says the command's size, the cwd asked for, the
  dialect and the session; the `task-started` event replaces them with the command
  shown, and the call's end event (`task-succeeded` / `task-failed`) with the cwd
  actually used and the job id too (`CallRequest`); Flower takes the latest.
- Background jobs: each job's start and end are sent by the host's supervisor, which
  watches them (`recovery.JobWatcher`), as the task events of a task named
  `bashfleet.job` whose id is the job id: `task-received` and `task-started` when it
  starts, `task-succeeded` or `task-failed` (`exit 3`, `signal 15 (SIGTERM)`) when it
  ends, on the worker `jobs@<host>`, whose heartbeats count the running jobs as Active.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from celery import Celery
from celery.events import EventDispatcher
from celery.worker.request import Request

from bashfleet.worker.engine.output.sanitize import REDACTED, may_be_secret, redact, secret_pattern
from bashfleet.worker.engine.secrets import worker_redaction
from bashfleet.worker.settings import get_settings
from bashfleet.worker.wire.models import Call, CallResult, JobRecord, JobStatus

log = logging.getLogger("bashfleet.worker")

#: The task name Flower lists background jobs under.
JOB_TASK = "bashfleet.job"
#: Longest reason shown (a system error's message can be long).
MAX_REASON_CHARS = 200
#: Final arguments waiting for their call's end event, at most: a task whose event is
#: never sent (events off) must not make this grow.
MAX_PENDING_ARGS = 1024
#: Longest command shown (Flower cuts a task's arguments at about 1 KB anyway).
MAX_COMMAND_CHARS = 300
#: Flower's name for each consumer of a host, and for its background jobs.
WORKER_NAMES: Mapping[str, str] = {"exec": "calls", "ctl": "control", "jobs": "jobs"}
#: Seconds between two heartbeats of a host's `jobs@` worker (Celery's own default).
JOBS_HEARTBEAT_S = 2.0


def worker_name(role: str, host: str) -> str:
    """How Flower names a host's consumer (`exec`, `ctl`) or its jobs (`jobs`):
    `calls@build-3`, `control@build-3`, `jobs@build-3`."""
    return f"{WORKER_NAMES[role]}@{host}"


# ----------------------------------------------------------------- shown commands

#: Credentials a command may carry inline; the group `secret` is replaced. A URL's
#: password, an HTTP authorization, a secret option or assignment, and the token
#: formats of GitHub, GitLab, Slack, OpenAI / Anthropic, AWS and Google.
_INLINE_SECRETS = tuple(re.compile(pattern) for pattern in (
    r"://[^/\s:@'\"]+:(?P<secret>[^@\s/'\"]+)@",
    r"(?i:authorization:\s*(?:bearer|basic|token)\s+|\bbearer\s+)(?P<secret>[^\s'\"]+)",
    r"(?i:--?(?:password|passwd|pass|token|api[-_]?key|secret|auth)(?:=|\s+))"
    r"(?P<secret>[^\s'\"-][^\s'\"]*)",
    r"\b[A-Za-z0-9_]*(?i:password|passwd|token|secret|api_?key|credentials?)[A-Za-z0-9_]*="
    r"['\"]?(?P<secret>[^\s'\"]+)",
    r"(?P<secret>\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|glpat-[\w-]{20,}"
    r"|xox[abprs]-[\w-]{10,}|sk-(?:ant-|proj-)?[\w-]{20,}|AKIA[0-9A-Z]{16}|AIza[\w-]{35}))",
))


def _redact_inline(command: str) -> str:
    for pattern in _INLINE_SECRETS:
        command = pattern.sub(
            lambda m: m.group(0).replace(m.group("secret"), REDACTED), command
        )
    return command


def shown_command(
    command: str, secrets: re.Pattern[str] | None = None, env_values: Iterable[str] = ()
) -> str:
    """A command as Flower shows it: the values of known secrets (`secrets`: the
    worker's), of the call's `env` that can be secrets, and credentials written inline
    redacted; cut past MAX_COMMAND_CHARS (`… (+N chars)`)."""
    own = secret_pattern(v for v in env_values if may_be_secret(v))
    text = _redact_inline(redact(redact(command, secrets), own))
    if len(text) > MAX_COMMAND_CHARS:
        text = f"{text[:MAX_COMMAND_CHARS]}… (+{len(text) - MAX_COMMAND_CHARS} chars)"
    return text


#: How long the worker's redaction pattern is reused for Flower's view (its sources, the
#: worker's environment and secret files, change rarely; two events a call ask for it).
SECRETS_REUSE_S = 30.0
_secrets_cache: dict[str, tuple[float, re.Pattern[str] | None]] = {}


def _worker_secrets() -> re.Pattern[str] | None:
    """The secrets this worker redacts from output (`secrets.worker_redaction`)."""
    now = time.monotonic()
    cached = _secrets_cache.get("pattern")
    if cached is not None and now - cached[0] < SECRETS_REUSE_S:
        return cached[1]
    try:
        pattern = worker_redaction(get_settings())
    except Exception:  # the view must never fail a call; redact nothing more then
        log.debug("no redaction pattern for Flower's view", exc_info=True)
        pattern = None
    _secrets_cache["pattern"] = (now, pattern)
    return pattern


class CallFailed(Exception):  # noqa: N818 - Flower shows the name: "CallFailed('exit 42')"
    """A call whose command failed, raised by the exec task after it answered."""


def _signal_text(number: int) -> str:
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def failure_reason(result: CallResult, timeout_s: float) -> str | None:
    """Why a call counts as failed in Flower (None: it succeeded, or goes on as a job)."""
    if result.backgrounded:
        return None
    if result.cancelled or result.timed_out:
        return "cancelled" if result.cancelled else f"timeout after {timeout_s:g}s"
    if result.signal is not None:
        return _signal_text(result.signal)
    if result.exit_code is None:
        error = result.error
        return f"error {error.kind}: {error.message}"[:MAX_REASON_CHARS] if error else (
            "no exit status"
        )
    return f"exit {result.exit_code}" if result.exit_code != 0 else None


def call_args(
    call: Call, result: CallResult | None = None, secrets: re.Pattern[str] | None = None
) -> str:
    """A call's arguments as Flower shows them: its command (`shown_command`: secrets
    redacted, cut), never its env (it may hold secrets); with its result, the cwd used and
    the job. `secrets`: the worker's redaction (default: looked up)."""
    pattern = _worker_secrets() if secrets is None else secrets
    shown: dict[str, object] = {
        "command": shown_command(call.command, pattern, call.env.values()),
        "cwd": (result.cwd if result is not None and result.cwd else call.cwd),
        "background": call.background,
        "dialect": call.policy.name,
        "session": call.session,
    }
    if result is not None:
        shown["job"] = result.job.id if result.job is not None else None
    return repr(shown)


_pending: OrderedDict[str, str] = OrderedDict()
_pending_lock = threading.Lock()


def set_final_args(task_id: str, args: str) -> None:
    """The arguments the end event of task `task_id` carries (`CallRequest`)."""
    with _pending_lock:
        _pending[task_id] = args
        while len(_pending) > MAX_PENDING_ARGS:
            _pending.popitem(last=False)


def _final_args(task_id: str) -> str | None:
    with _pending_lock:
        return _pending.pop(task_id, None)


_held: OrderedDict[str, tuple[CallRequest, dict[str, Any]]] = OrderedDict()
_held_lock = threading.Lock()


def _hold_started(request: CallRequest, fields: dict[str, Any]) -> None:
    with _held_lock:
        _held[request.id] = (request, fields)
        overflow = [_held.popitem(last=False) for _ in range(len(_held) - MAX_PENDING_ARGS)]
    for _, (old, old_fields) in overflow:  # never dropped: sent as they were
        old._send_started(old_fields, None)


def release_started(task_id: str, call: Call | None = None) -> None:
    """Send task `task_id`'s `task-started` event, held since Celery asked for it, with
    the arguments of `call` (its verified call; None: as its message says them)."""
    with _held_lock:
        held = _held.pop(task_id, None)
    if held is not None:
        request, fields = held
        request._send_started(fields, call)


class CallRequest(Request):  # type: ignore[misc]  # celery is untyped
    """The exec task's request: its end event carries the call's final arguments; a
    failed call's, its runtime and no traceback (it is the command's failure, not a bug
    of the worker's: the traceback would only show the worker's code).

    Its `task-started` event is held (with the time Celery asked for it) until bash
    runs (`release_started`, from the call's watcher) or the call ends: built and sent
    while bash starts up, not on the way to it. Flower sees it as soon as before: the
    consumer publishes its events in batches (`batching`)."""

    def send_event(self, type: str, **fields: Any) -> None:
        if type == "task-started":
            fields.setdefault("timestamp", time.time())
            _hold_started(self, fields)
            return
        if type in ("task-succeeded", "task-failed"):
            release_started(self.id)
            args = _final_args(self.id)
            if args is not None:
                fields["args"] = args
        if type == "task-failed" and str(fields.get("exception", "")).startswith("CallFailed("):
            fields["traceback"] = ""
            started = getattr(self, "time_start", None)
            if started:
                fields.setdefault("runtime", max(0.0, time.time() - started))
        super().send_event(type, **fields)

    def _send_started(self, fields: dict[str, Any], call: Call | None) -> None:
        started = call_args(call) if call is not None else _started_args(self.args)
        if started is not None:
            fields["args"] = started
        super().send_event("task-started", **fields)


def _started_args(args: Any) -> str | None:
    """A call's arguments as its message says them, for the `task-started` event of a
    call that ended before its bash ran (refused, or not verified: its end event says
    so); None when they cannot be read as a call."""
    payload = args[0] if isinstance(args, list | tuple) and args else None
    if isinstance(payload, dict) and "auth" in payload:
        inner = payload.get("args")
        payload = inner[0] if isinstance(inner, list) and inner else None
    if not isinstance(payload, dict):
        return None
    try:
        return call_args(Call.model_validate(payload))
    except ValueError:
        return None


# --------------------------------------------------------------------------- jobs


def job_args(record: JobRecord, secrets: re.Pattern[str] | None = None) -> str:
    """A job's arguments as Flower shows them: its command (`shown_command`), cwd, the
    call that started it, its pid. `secrets`: the worker's redaction (default: looked up)."""
    pattern = _worker_secrets() if secrets is None else secrets
    return repr({
        "command": shown_command(record.command, pattern), "cwd": record.cwd,
        "call": record.call_id, "pid": record.pid,
    })


def job_outcome(status: JobStatus | None) -> str | None:
    """Why a job counts as failed (None: it exited 0)."""
    if status is None:
        return "ended, status unknown"
    if status.signal is not None:
        return _signal_text(status.signal)
    if status.exit_code is None:
        return f"ended, status unknown ({status.note})" if status.note else "ended, status unknown"
    return f"exit {status.exit_code}" if status.exit_code != 0 else None


class JobEvents:
    """Sends background jobs' starts and ends to Flower as task events of the worker
    `jobs@<host>`, and that worker's heartbeats every JOBS_HEARTBEAT_S with the jobs
    running as its Active (see the module).

    Best effort: an event that cannot be sent (Redis away) is logged and dropped, and
    the dispatcher is built again for the next one. `close` says the worker went offline.
    """

    def __init__(
        self, app: Celery, host: str, *, heartbeat_s: float | None = JOBS_HEARTBEAT_S
    ) -> None:
        self._app = app
        self._hostname = worker_name("jobs", host)
        self._dispatcher: EventDispatcher | None = None
        self._lock = threading.Lock()  # one sender at a time: the watcher, the heartbeat
        self._running: set[str] = set()
        self._processed = 0
        self._stopped = threading.Event()
        self._heartbeat_s = heartbeat_s
        self._beat: threading.Thread | None = None
        if heartbeat_s is not None:
            self._send("worker-online", **self._worker_fields())
            self._beat = threading.Thread(target=self._beat_loop, daemon=True,
                                          name="bashfleet-jobs-heartbeat")
            self._beat.start()

    @property
    def active(self) -> int:
        """Jobs running, as this worker's heartbeats count them."""
        with self._lock:
            return len(self._running)

    def started(self, record: JobRecord) -> None:
        """A job started (or was first seen running)."""
        with self._lock:
            self._running.add(record.id)
        fields = {"uuid": record.id, "timestamp": record.started_at}
        self._send("task-received", name=JOB_TASK, args=job_args(record), kwargs="{}",
                   retries=0, root_id=record.id, parent_id=record.call_id, **fields)
        self._send("task-started", **fields)

    def ended(self, record: JobRecord, status: JobStatus | None) -> None:
        """A job ended: succeeded (exit 0) or failed, with its reason."""
        with self._lock:
            self._running.discard(record.id)
            self._processed += 1
        ended_at = status.ended_at if status is not None else record.started_at
        fields = {"uuid": record.id, "timestamp": ended_at}
        reason = job_outcome(status)
        runtime = max(0.0, ended_at - record.started_at)
        if reason is None:
            self._send("task-succeeded", result="'exit 0'", runtime=runtime, **fields)
        else:
            self._send("task-failed", exception=f"JobFailed({reason!r})", traceback="",
                       runtime=runtime, **fields)

    def _worker_fields(self) -> dict[str, Any]:
        """What Celery's own heartbeat says of a worker; `active`: the jobs running."""
        with self._lock:
            active, processed = len(self._running), self._processed
        return {
            "freq": self._heartbeat_s, "active": active, "processed": processed,
            "loadavg": list(os.getloadavg()), "sw_ident": "bashfleet-jobs",
            "sw_ver": "", "sw_sys": platform.system(),
        }

    def _beat_loop(self) -> None:
        while not self._stopped.wait(self._heartbeat_s):
            self._send("worker-heartbeat", **self._worker_fields())

    def _send(self, type_: str, **fields: Any) -> None:
        with self._lock:
            try:
                if self._dispatcher is None:
                    self._dispatcher = EventDispatcher(
                        self._app.connection_for_write(), hostname=self._hostname,
                        enabled=True,
                    )
                self._dispatcher.send(type_, **fields)
            except Exception as exc:  # Flower's view must never stop the supervisor
                log.debug("could not send %s for %s: %s", type_,
                          fields.get("uuid", self._hostname), exc)
                self._reset()

    def _reset(self) -> None:
        """Close the connection (a new one is made for the next event); lock held."""
        dispatcher, self._dispatcher = self._dispatcher, None
        if dispatcher is not None:
            try:
                dispatcher.close()
                dispatcher.connection.release()
            except Exception:  # closing what already failed: nothing to do
                log.debug("closing the event dispatcher failed", exc_info=True)

    def close(self) -> None:
        """Stop the heartbeats, say the worker went offline, close the connection."""
        self._stopped.set()
        if self._beat is not None:
            self._beat.join((self._heartbeat_s or 0.0) + 5.0)
            self._send("worker-offline", **self._worker_fields())
        with self._lock:
            self._reset()


def read_only_by_default() -> None:
    """In a Flower process serving this app, make read-only the default (Flower's own
    `read_only` option; `--read_only=false` or FLOWER_READ_ONLY=false still wins): its
    Revoke and Terminate go through Celery's remote control, which the fleet turns off,
    so they would answer "Revoked" and stop nothing. Read-only, Flower offers neither
    (and its API answers 403). Called by `bashfleet.worker.fleet.app`; nothing in other processes
    (Flower's options exist only where Flower is loaded)."""
    import sys  # noqa: PLC0415

    if "flower.options" not in sys.modules:
        return
    from tornado.options import options  # noqa: PLC0415 - Flower's own options

    if "read_only" in options:
        options.read_only = True

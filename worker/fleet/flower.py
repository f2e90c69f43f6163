"""What Flower shows of the fleet beyond Celery's own events: failed calls as failures,
the arguments a call actually ran with, and background jobs.

- A call whose command failed (non-zero exit, a signal, a timeout kill, a system error,
  a cancel) shows as FAILURE, its reason as the exception (`exit 42`, `timeout after
  2s`): the exec task raises `CallFailed` *after* its answer went to the caller, so the
  caller's reply is untouched, and a success costs nothing more. Celery then sends
  `task-failed` (what Flower's "Failed" counts and `flower_events_total{type="task-failed"}`
  counts) and, `CallFailed` being declared in the task's `throws`, logs no traceback.
- Arguments: the client's `argsrepr` says the command's size (never its text), the cwd
  asked for, the dialect and the session; when the call ends its `task-succeeded` /
  `task-failed` event carries them again with the cwd actually used and the job id
  (`CallRequest`), which Flower takes as the task's arguments.
- Background jobs: each job's start and end are sent by the host's supervisor, which
  watches them (`recovery.JobWatcher`), as the task events of a task named
  `bashfleet.job` whose id is the job id: `task-received` and `task-started` when it
  starts, `task-succeeded` or `task-failed` (`exit 3`, `signal 15 (SIGTERM)`) when it
  ends, on the worker `exec@<host>`.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import OrderedDict
from typing import Any

from celery import Celery
from celery.events import EventDispatcher
from celery.worker.request import Request

from worker.wire.models import Call, CallResult, JobRecord, JobStatus

log = logging.getLogger("bashfleet.worker")

#: The task name Flower lists background jobs under.
JOB_TASK = "bashfleet.job"
#: Longest reason shown (a system error's message can be long).
MAX_REASON_CHARS = 200
#: Final arguments waiting for their call's end event, at most: a task whose event is
#: never sent (events off) must not make this grow.
MAX_PENDING_ARGS = 1024


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


def call_args(call: Call, result: CallResult | None = None) -> str:
    """A call's arguments as Flower shows them: never the command (it may carry a token)
    nor its env (it may hold secrets); with its result, the cwd used and the job."""
    shown: dict[str, object] = {
        "command": f"<redacted: {len(call.command)} chars>",
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


class CallRequest(Request):  # type: ignore[misc]  # celery is untyped
    """The exec task's request: its end event carries the call's final arguments; a
    failed call's, its runtime and no traceback (it is the command's failure, not a bug
    of the worker's: the traceback would only show the worker's code)."""

    def send_event(self, type: str, **fields: Any) -> None:
        if type in ("task-succeeded", "task-failed"):
            args = _final_args(self.id)
            if args is not None:
                fields["args"] = args
        if type == "task-failed" and str(fields.get("exception", "")).startswith("CallFailed("):
            fields["traceback"] = ""
            started = getattr(self, "time_start", None)
            if started:
                fields.setdefault("runtime", max(0.0, time.time() - started))
        super().send_event(type, **fields)


# --------------------------------------------------------------------------- jobs


def job_args(record: JobRecord) -> str:
    """A job's arguments as Flower shows them (never its command)."""
    return repr({
        "command": f"<redacted: {len(record.command)} chars>", "cwd": record.cwd,
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
    """Sends background jobs' starts and ends to Flower as task events (see the module).

    Best effort: an event that cannot be sent (Redis away) is logged and dropped, and
    the dispatcher is built again for the next one.
    """

    def __init__(self, app: Celery, host: str) -> None:
        self._app = app
        self._hostname = f"exec@{host}"
        self._dispatcher: EventDispatcher | None = None

    def started(self, record: JobRecord) -> None:
        """A job started (or was first seen running)."""
        fields = {"uuid": record.id, "timestamp": record.started_at}
        self._send("task-received", name=JOB_TASK, args=job_args(record), kwargs="{}",
                   retries=0, root_id=record.id, parent_id=record.call_id, **fields)
        self._send("task-started", **fields)

    def ended(self, record: JobRecord, status: JobStatus | None) -> None:
        """A job ended: succeeded (exit 0) or failed, with its reason."""
        ended_at = status.ended_at if status is not None else record.started_at
        fields = {"uuid": record.id, "timestamp": ended_at}
        reason = job_outcome(status)
        if reason is None:
            runtime = max(0.0, ended_at - record.started_at)
            self._send("task-succeeded", result="'exit 0'", runtime=runtime, **fields)
        else:
            runtime = max(0.0, ended_at - record.started_at)
            self._send("task-failed", exception=f"JobFailed({reason!r})", traceback="",
                       runtime=runtime, **fields)

    def _send(self, type_: str, **fields: Any) -> None:
        try:
            if self._dispatcher is None:
                self._dispatcher = EventDispatcher(
                    self._app.connection_for_write(), hostname=self._hostname, enabled=True,
                )
            self._dispatcher.send(type_, **fields)
        except Exception as exc:  # Flower's view must never stop the supervisor
            log.debug("could not send %s for job %s: %s", type_, fields.get("uuid"), exc)
            self.close()

    def close(self) -> None:
        """Close the connection (a new one is made for the next event)."""
        dispatcher, self._dispatcher = self._dispatcher, None
        if dispatcher is not None:
            try:
                dispatcher.close()
                dispatcher.connection.release()
            except Exception:  # closing what already failed: nothing to do
                log.debug("closing the event dispatcher failed", exc_info=True)

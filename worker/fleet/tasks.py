"""The Celery tasks: `exec` runs a call; the control tasks reach a host's jobs and calls.

Every task takes JSON-able arguments and answers exactly once, whatever happens, as a
reply (`registry.deliver_reply`: stored under the task id, published on the caller's
channel, the message's `reply_to`); Celery stores no result, and the task returns
only a one-line summary for Flower. `exec` always answers a CallResult, even for
input it cannot accept, in the same round trip that records the call's end. Control
tasks answer an envelope, `{"ok": value}` or `{"error": {"kind": ..., "message":
...}}`, so the client can raise a typed error (`not_found` becomes UnknownJob,
`invalid` CallRejected).

`exec` is served by the command consumer (`bashfleet.<host>.exec`, the any and pool
queues); the others by the separate control consumer (`bashfleet.<host>.ctl`), so
they answer at once even when every command slot is busy.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import redis
from celery import current_task
from pydantic import TypeAdapter, ValidationError

from worker.engine import jobs, procs

from worker.fleet import recovery, registry

from worker.wire import auth
from worker.fleet.app import app
from worker.engine.capture import read_slice
from worker.engine.call import RunningHook, SpawnHook, run_call
from worker.wire.models import (
    Call,
    CallResult,
    CheckResult,
    JobRecord,
    OutputChunk,
    SystemError_,
    Truncation,
)
from worker.engine.secrets import worker_redaction
from worker.settings import Settings, get_settings

log = logging.getLogger("bashfleet.worker")

#: Largest slice `read_output` returns (results stay small on Redis).
MAX_READ_LIMIT = 4 * 1024 * 1024
#: Grace between SIGTERM and SIGKILL when a job is killed through the fleet.
KILL_GRACE_S = 2.0
#: What a signed message seen before is told (it is not acted on).
REPLAYED = "replayed message refused (nonce seen before)"
#: Pauses between attempts to deliver an answer while Redis is away (~30 s in all).
REPLY_RETRY_DELAYS_S = (0.1, 0.2, 0.5, 1.0, 2.0, 2.0, 4.0, 4.0, 8.0, 8.0)

Envelope = dict[str, Any]
_TRUNCATION: TypeAdapter[Truncation] = TypeAdapter(Truncation)


@dataclass(frozen=True)
class Runtime:
    """What every task of this worker process needs."""

    settings: Settings
    redis: redis.Redis
    instance: str


_runtime_override: Runtime | None = None


def set_runtime(runtime: Runtime) -> None:
    """Set the runtime (the consumer process does at start; tests may too)."""
    global _runtime_override  # noqa: PLW0603 - one runtime per process, set once
    _runtime_override = runtime


@lru_cache(maxsize=1)
def _default_runtime() -> Runtime:
    settings = get_settings()
    return Runtime(
        settings=settings,
        redis=connect(settings.redis_url_value() or ""),
        instance=os.environ.get("BASHFLEET_INSTANCE", ""),
    )


def runtime() -> Runtime:
    """The process's runtime."""
    return _runtime_override or _default_runtime()


def connect(url: str) -> redis.Redis:
    """A Redis client for the registry (text replies, bounded waits)."""
    return redis.Redis.from_url(
        url, decode_responses=True, socket_connect_timeout=5, socket_timeout=10,
        health_check_interval=30,
    )


def _ok(value: Any) -> Envelope:
    return {"ok": value}


def _error(kind: str, message: str) -> Envelope:
    return {"error": {"kind": kind, "message": message}}


# ------------------------------------------------------------------------------- exec


@dataclass
class Answer:
    """Where the running task's answer goes, and whether it went already."""

    task_id: str
    channel: str | None
    sent: bool = False

    def reply(self, payload: str) -> registry.Reply:
        """The answer to deliver."""
        return registry.Reply(self.task_id, self.channel, payload)


def _current_answer() -> Answer:
    """The answer of the task Celery runs now (its id, its message's `reply_to`)."""
    request = getattr(current_task, "request", None)
    return Answer(
        task_id=str(getattr(request, "id", None) or "?"),
        channel=getattr(request, "reply_to", None) or None,
    )


def _deliver(rt: Runtime, answer: Answer, payload: str) -> None:
    """Deliver an answer not sent yet, retrying while Redis is away (as Celery's result
    backend did): a caller waits for it."""
    for delay in (*REPLY_RETRY_DELAYS_S, None):
        try:
            registry.deliver_reply(rt.redis, answer.reply(payload))
            answer.sent = True
            return
        except redis.RedisError as exc:
            if delay is None:
                log.error("could not deliver the answer of task %s: %s", answer.task_id, exc,
                          extra={"call_id": answer.task_id})
                return
            time.sleep(delay)


@dataclass(frozen=True)
class Nonce:
    """A signed message's nonce, to record when the call is claimed."""

    value: str
    ttl_s: float


def exec_call(
    payload: dict[str, Any], answer: Answer | None = None, nonce: Nonce | None = None
) -> CallResult:
    """Run one call on this host and return its CallResult.

    With an `answer`, the result is delivered in the round trip that records the end
    (`answer.sent` says so); with a `nonce`, it is recorded in the claim's.
    """
    rt = runtime()
    host = rt.settings.host
    try:
        call = Call.model_validate(payload)
    except ValidationError as exc:
        call_id = str(payload.get("call_id") or "invalid") if isinstance(payload, dict) else "?"
        message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        # Field paths only: pydantic's messages may quote the input (the command).
        log.warning(
            "call refused: invalid (%d error(s))", exc.error_count(),
            extra={"call_id": call_id[:64], "error_kind": "invalid"},
        )
        return _failed(call_id, host, "invalid", f"invalid call: {message}")
    state = registry.claim_call(
        rt.redis, call.call_id, host, rt.instance, os.getpid(),
        nonce=nonce.value if nonce else None, nonce_ttl_s=nonce.ttl_s if nonce else 0.0,
    )
    if state != "ok":
        log.info("call not started: %s", state, extra={"call_id": call.call_id, "state": state})
        return _failed(call.call_id, host, *_refusal(call.call_id, state))
    started = time.monotonic()
    _log_start(call)
    spawned = _Spawned()
    try:
        result = run_call(
            call, settings=rt.settings, on_spawn=_spawn_hook(spawned),
            on_running=_running_hook(rt, call, spawned),
        )
    except Exception as exc:  # an engine bug must still answer the caller
        log.exception("call %s failed inside the worker", call.call_id,
                      extra={"call_id": call.call_id})
        result = CallResult(
            call_id=call.call_id, host=host,
            error=SystemError_(kind="internal", message=f"worker error: {exc!r}"),
        )
    finally:
        if spawned.on_disk:
            recovery.remove_running(rt.settings, call.call_id)
    result = _finish(rt, call, result, answer, spawned.fields())
    _log_end(result, time.monotonic() - started)
    return result


def _queue() -> str | None:
    """The queue the running task's message came from (None when not run by Celery)."""
    request = getattr(current_task, "request", None)
    delivery = getattr(request, "delivery_info", None) or {}
    queue = delivery.get("routing_key")
    return str(queue) if queue else None


def _log_start(call: Call) -> None:
    """A call's start line: never its command text nor its env (they may hold secrets)."""
    queue = _queue()
    log.info(
        "call started: queue %s, cwd %s, command of %d chars%s", queue or "-", call.cwd or "~",
        len(call.command), ", background" if call.background else "",
        extra={
            "call_id": call.call_id, "queue": queue, "cwd": call.cwd,
            "command_chars": len(call.command), "background": call.background,
            "timeout_s": call.timeout_s, "dialect": call.policy.name,
        },
    )


def outcome(result: CallResult) -> str:
    """How a call ended, in a few words (its log line, its summary in Flower)."""
    if result.error is not None:
        text = f"error {result.error.kind}"
    elif result.backgrounded and result.job is not None:
        text = f"backgrounded as job {result.job.id}"
    elif result.job is not None:
        text = f"started job {result.job.id}"
    elif result.signal is not None:
        text = f"signal {result.signal}"
    else:
        text = f"exit {result.exit_code}"
    return text + (" (timed out)" if result.timed_out else "")


def _log_end(result: CallResult, duration_s: float) -> None:
    """A call's end line: how it ended and how long it took (not its output)."""
    log.info(
        "call ended: %s in %.2fs", outcome(result), duration_s,
        extra={
            "call_id": result.call_id, "job_id": result.job.id if result.job else None,
            "exit_code": result.exit_code, "signal": result.signal,
            "timed_out": result.timed_out, "backgrounded": result.backgrounded,
            "error_kind": result.error.kind if result.error else None,
            "limit_hit": result.limit_hit, "duration_s": round(duration_s, 3),
        },
    )


def _failed(call_id: str, host: str, kind: str, message: str) -> CallResult:
    return CallResult(call_id=call_id, host=host, error=SystemError_(kind=kind, message=message))


def _refusal(call_id: str, state: str) -> tuple[str, str]:
    if state == "replayed":
        return "unauthorized", REPLAYED
    if state == "cancelled":
        return "internal", f"call {call_id} was cancelled before it started; it did not run"
    if state == "abandoned":
        return "unavailable", (
            f"call {call_id} was withdrawn by its caller before a worker took it; it did not run"
        )
    return "invalid", f"call {call_id} was already taken ({state}); it was not run again"


@dataclass
class _Spawned:
    """A call's process, as its hooks saw it (recorded with its end)."""

    pid: int = 0
    pgid: int = 0
    marker: str = ""
    on_disk: bool = False

    def fields(self) -> dict[str, object]:
        """The process fields of the call record."""
        if not self.pid:
            return {}
        return {"pid": self.pid, "pgid": self.pgid, "marker": self.marker}


def _spawn_hook(spawned: _Spawned) -> SpawnHook:
    """Remember the call's process; it is recorded once it has run a moment (see
    `_running_hook`), or with its end."""

    def on_spawn(pid: int, pgid: int, marker: str) -> None:
        spawned.pid, spawned.pgid, spawned.marker = pid, pgid, marker

    return on_spawn


def _running_hook(rt: Runtime, call: Call, spawned: _Spawned) -> RunningHook:
    """Record the call's process once it has run FOLLOW_INTERVAL_S: on the host's disk
    (what a restarted worker, a cancel and a stop go by), then in Redis; kill it if it
    was cancelled (or its worker stopped) before a canceller could find it on disk.

    Most calls end sooner: their process is recorded with their end, a file write, a
    /proc read and a round trip fewer. If their consumer dies meanwhile, the supervisor
    finds them by their Redis record and their processes by their marker
    (`recovery.recover_orphans`). The order, disk then Redis, is what makes a cancel
    never missed: a canceller marks the call in Redis, then looks on disk.
    """

    def on_running() -> None:
        if not spawned.pid:
            return
        entry = recovery.RunningCall(
            call_id=call.call_id, pid=spawned.pid, pgid=spawned.pgid, marker=spawned.marker,
            start_time=procs.start_time(spawned.pid) or time.time(), worker_pid=os.getpid(),
            instance=rt.instance, kill_grace_s=call.policy.kill_grace_s,
        )
        recovery.save_running(rt.settings, entry)
        spawned.on_disk = True
        try:
            state = registry.update_call(rt.redis, call.call_id, **spawned.fields())
        except redis.RedisError as exc:
            log.warning("call %s: could not record its process: %s", call.call_id, exc,
                        extra={"call_id": call.call_id})
            return
        if state in ("cancelling", "stopping"):
            recovery.kill_running(entry)

    return on_running


#: Notes for a call that ended from these states (its answer must say so first).
_END_NOTES = {
    "cancelling": "call cancelled; its processes were killed",
    "stopping": "the worker was stopped; the call's processes were killed",
}


def _finish(
    rt: Runtime, call: Call, result: CallResult, answer: Answer | None,
    process: dict[str, object],
) -> CallResult:
    """Record the call's end in Redis, and deliver its answer in the same round trip,
    unless it was cancelled or stopped meanwhile: then the answer says so (sent after)."""
    spill = result.spill
    fields: dict[str, object] = {
        **process, "exit_code": result.exit_code, "signal": result.signal,
        "job_id": result.job.id if result.job else None,
    }
    if spill is not None:
        fields.update(
            stdout_path=spill.stdout_path, stderr_path=spill.stderr_path,
            stdout_bytes=spill.stdout_bytes, stderr_bytes=spill.stderr_bytes,
        )
    reply = answer.reply(result.model_dump_json()) if answer is not None else None
    try:
        if result.job is not None:
            record = jobs.load_record(result.job.id, rt.settings)
            registry.save_job(rt.redis, record, running=True)
        previous, sent = registry.finish_and_reply(
            rt.redis, rt.settings.host, call.call_id, fields, reply=reply,
            hold_in=_END_NOTES if result.error is None else (),
        )
    except (redis.RedisError, jobs.JobError) as exc:
        log.warning("call %s: could not record its end: %s", call.call_id, exc,
                    extra={"call_id": call.call_id})
        return result
    if answer is not None and sent:
        answer.sent = True
        return result
    note = _END_NOTES.get(previous or "")
    if note is not None and result.error is None:
        result = result.model_copy(update={"error": SystemError_(kind="internal", message=note)})
    return result


# ---------------------------------------------------------------------------- control


def _guard(body: Any) -> Envelope:
    """Run a control body; turn the expected failures into an error envelope."""
    try:
        return _ok(body())
    except jobs.JobError as exc:
        return _error(exc.kind, exc.message)
    except redis.RedisError as exc:
        return _error("unavailable", f"the worker could not reach Redis: {exc}")


#: Fields of a control result worth a log line (never output, never paths of it).
_LOGGED_FIELDS = ("running", "exit_code", "signal", "cancelled", "state", "survivors")


def _logged(action: str, envelope: Envelope, **ids: str) -> Envelope:
    """Log one line for a control call (what, on which id, how it went); pass it on."""
    subject = " ".join(f"{name.removesuffix('_id')} {value}" for name, value in ids.items())
    error = envelope.get("error")
    if isinstance(error, dict):
        log.info(
            "%s %s: %s: %s", action, subject, error.get("kind"), error.get("message"),
            extra={**ids, "action": action, "error_kind": error.get("kind")},
        )
        return envelope
    value = envelope.get("ok")
    fields = (
        {name: value[name] for name in _LOGGED_FIELDS if name in value}
        if isinstance(value, dict) else {}
    )
    log.info(
        "%s %s: %s", action, subject,
        ", ".join(f"{name} {field}" for name, field in fields.items()) or "done",
        extra={**ids, "action": action, **fields},
    )
    return envelope


def _record(rt: Runtime, job_id: str) -> JobRecord:
    return jobs.load_record(job_id, rt.settings)


def check(
    job_id: str,
    grep: str | None = None,
    offset: int | None = None,
    stderr_offset: int | None = None,
    truncation: dict[str, Any] | None = None,
) -> Envelope:
    """A job's state and its output since `offset` (None: since the last check)."""
    def act(rt: Runtime, record: JobRecord, start: int, err_start: int) -> CheckResult:
        return jobs.check_job(
            record, offset=start, stderr_offset=err_start, grep=grep,
            policy=_truncation(truncation), settings=rt.settings,
        )

    return _logged("check", _job_action(job_id, offset, stderr_offset, act), job_id=job_id)


def _job_action(
    job_id: str,
    offset: int | None,
    stderr_offset: int | None,
    act: Callable[[Runtime, JobRecord, int, int], CheckResult],
    *,
    always_sync: bool = False,
) -> Envelope:
    """Check or kill a job from its local record; keep the offsets and, once it has
    ended (or always, for a kill), its record in Redis up to date."""
    rt = runtime()

    def body() -> Any:
        record = _record(rt, job_id)
        start, err_start = _offsets(rt, job_id, offset, stderr_offset)
        result = act(rt, record, start, err_start)
        registry.save_offsets(rt.redis, job_id, result.offset, result.stderr_offset)
        if always_sync or not result.running:
            recovery.sync_job(rt.redis, record)
        return result.model_dump(mode="json")

    return _guard(body)


def _offsets(
    rt: Runtime, job_id: str, offset: int | None, stderr_offset: int | None
) -> tuple[int, int]:
    """Where to read from: as asked, else where the last check (by any client) stopped."""
    stored, stored_err = registry.job_offsets(registry.job_fields(rt.redis, job_id))
    start = stored if offset is None else max(0, offset)
    if stderr_offset is not None:
        return start, max(0, stderr_offset)
    # Reading stdout from the start reads stderr from the start too.
    return start, 0 if offset == 0 else stored_err


def _truncation(value: dict[str, Any] | None) -> Truncation | None:
    if value is None:
        return None
    try:
        return _TRUNCATION.validate_python(value)
    except ValidationError as exc:
        raise jobs.JobError("invalid", f"invalid truncation policy: {exc}") from None


def kill(
    job_id: str,
    offset: int | None = None,
    stderr_offset: int | None = None,
    truncation: dict[str, Any] | None = None,
) -> Envelope:
    """End a job (group SIGTERM, grace, SIGKILL, marker sweep); its final state."""
    def act(rt: Runtime, record: JobRecord, start: int, err_start: int) -> CheckResult:
        return jobs.kill_job(
            record, offset=start, stderr_offset=err_start, grace_s=KILL_GRACE_S,
            policy=_truncation(truncation), settings=rt.settings,
        )

    envelope = _job_action(job_id, offset, stderr_offset, act, always_sync=True)
    return _logged("kill", envelope, job_id=job_id)


def read_output(
    item_id: str, offset: int = 0, limit: int = 65536, grep: str | None = None,
    stream: str = "stdout",
) -> Envelope:
    """A slice of a job's output file or of a call's spill file on this host."""
    rt = runtime()

    def body() -> Any:
        path = _output_path(rt.settings, item_id, stream)
        pattern = _compile(grep)
        size = path.stat().st_size
        start = min(max(0, offset), size)
        size_to_read = max(1, min(limit, MAX_READ_LIMIT))
        text, end, size = read_slice(path, start, size_to_read, worker_redaction(rt.settings))
        if pattern is not None:
            text = "".join(ln for ln in text.splitlines(keepends=True) if pattern.search(ln))
        chunk = OutputChunk(
            path=str(path), offset=start, next_offset=end, size=size, text=text, eof=end >= size
        )
        return chunk.model_dump(mode="json")

    return _guard(body)


def _output_path(settings: Settings, item_id: str, stream: str) -> Path:
    """The file of a job or call id: only files this worker wrote are ever read."""
    if stream not in ("stdout", "stderr"):
        raise jobs.JobError("invalid", f"stream must be stdout or stderr, not {stream!r}")
    if not registry.valid_id(item_id):
        raise jobs.JobError("not_found", f"no such job or call: {item_id!r}")
    try:
        record = jobs.load_record(item_id, settings)
    except jobs.JobError:
        record = None
    if record is not None:
        chosen = record.output_path if stream == "stdout" else record.stderr_path
        if chosen is None:
            raise jobs.JobError("not_found", f"job {item_id} has no separate stderr")
        return Path(chosen)
    suffixes = (".out", ".log") if stream == "stdout" else (".err",)
    for suffix in suffixes:
        candidate = settings.spill_dir / f"{item_id}{suffix}"
        if candidate.is_file():
            return candidate
    raise jobs.JobError(
        "not_found", f"no job or kept output for {item_id!r} on {settings.host}"
    )


def _compile(grep: str | None) -> re.Pattern[str] | None:
    if not grep:
        return None
    try:
        return re.compile(grep)
    except re.error as exc:
        raise jobs.JobError("invalid", f"invalid regular expression {grep!r}: {exc}") from None


def cancel(call_id: str) -> Envelope:
    """Kill the processes of a running foreground call; its exec task then returns."""
    rt = runtime()

    def body() -> Any:
        previous = registry.mark_call(rt.redis, call_id, "cancelling", only_from=("running",))
        entry = recovery.load_running(rt.settings, call_id)
        if entry is None:
            # Not spawned (or not on disk) yet: its running hook sees `cancelling` and
            # kills it (within the engine's first wake-up).
            return {"cancelled": previous == "running", "state": previous}
        survivors = recovery.kill_running(entry)
        return {"cancelled": True, "state": "cancelling", "survivors": survivors}

    return _logged("cancel", _guard(body), call_id=call_id)


def list_jobs() -> Envelope:
    """This host's jobs, fresh from its disk (and published to Redis)."""
    rt = runtime()

    def body() -> Any:
        views = []
        for record in jobs.local_records(rt.settings):
            fields = registry.job_fields(rt.redis, record.id)
            if not fields:
                continue  # expired from the fleet's listing: too old to show
            if fields.get("state") != "ended":
                recovery.sync_job(rt.redis, record)
                fields = registry.job_fields(rt.redis, record.id)
            view = registry.job_view(fields)
            if view is not None:
                views.append(view.model_dump(mode="json"))
        return views

    return _guard(body)


# ------------------------------------------------------------------ entry points


@dataclass(frozen=True)
class _Message:
    """A task's arguments, verified, and the nonce still to record (None: none)."""

    args: tuple[Any, ...]
    nonce: Nonce | None


def _verify(rt: Runtime, task: str, args: tuple[Any, ...]) -> _Message:
    """Check a message's signature and expiry; auth.AuthError when it must be refused.

    With no key configured (the worker warned at start) a signed envelope is unwrapped
    unverified and plain arguments are taken as they are.
    """
    keys = auth.keyring(rt.settings.accepted_keys())
    if not keys:
        if len(args) == 1 and auth.is_envelope(args[0]):
            return _Message(tuple(args[0]["args"]), None)
        return _Message(args, None)
    verified = auth.verify(args[0] if len(args) == 1 else None, task, keys, time.time())
    ttl = verified.expires - time.time() + auth.CLOCK_SKEW_S
    return _Message(tuple(verified.args), Nonce(verified.nonce, ttl))


def _use_nonce(rt: Runtime, nonce: Nonce | None) -> None:
    if nonce is not None and not registry.use_nonce(rt.redis, nonce.value, nonce.ttl_s):
        raise auth.AuthError("replayed", REPLAYED)


def _exec_refused(args: tuple[Any, ...], kind: str, message: str) -> CallResult:
    rt = runtime()
    payload = args[0] if args and isinstance(args[0], dict) else {}
    inner = payload.get("args") if "auth" in payload else [payload]
    first = inner[0] if isinstance(inner, list) and inner and isinstance(inner[0], dict) else {}
    call_id = str(first.get("call_id") or "?")[:64]
    log.warning("call %s refused: %s", call_id, message, extra={"call_id": call_id})
    return _failed(call_id, rt.settings.host, kind, message)


def exec_task(*args: Any) -> str:
    """The exec task as Celery runs it: verify, run, answer (once, whatever happens).

    The nonce of a signed call is recorded with its claim (one round trip for both).
    """
    rt = runtime()
    answer = _current_answer()
    try:
        message = _verify(rt, registry.TASK_EXEC, args)
        payload = message.args[0] if len(message.args) == 1 else None
        result = exec_call(payload, answer, message.nonce)  # type: ignore[arg-type]
    except auth.AuthError as exc:
        result = _exec_refused(args, "unauthorized", exc.message)
    except Exception as exc:  # a bug must still answer the caller
        log.exception("task %s failed inside the worker", answer.task_id,
                      extra={"call_id": answer.task_id})
        result = _failed(answer.task_id, rt.settings.host, "internal", f"worker error: {exc!r}")
    if not answer.sent:  # the finish script delivered it, most often
        _deliver(rt, answer, result.model_dump_json())
    return outcome(result)


def _ctl_task(task: str, body: Callable[..., Envelope]) -> Callable[..., str]:
    """A control task as Celery runs it: verify (nonce included), act, answer."""
    signature = inspect.signature(body)

    def envelope_of(rt: Runtime, answer: Answer, args: tuple[Any, ...]) -> Envelope:
        try:
            message = _verify(rt, task, args)
            _use_nonce(rt, message.nonce)
            signature.bind(*message.args)
        except auth.AuthError as exc:
            log.warning("control message refused: %s", exc.message)
            return _error("unauthorized", exc.message)
        except TypeError as exc:  # not this task's arguments
            return _error("invalid", f"invalid arguments: {exc}")
        try:
            return body(*message.args)
        except Exception as exc:  # a bug must still answer the caller
            log.exception("task %s failed inside the worker", answer.task_id)
            return _error("internal", f"worker error: {exc!r}")

    def run(*args: Any) -> str:
        rt = runtime()
        answer = _current_answer()
        envelope = envelope_of(rt, answer, args)
        _deliver(rt, answer, json.dumps(envelope))
        error = envelope.get("error")
        return f"error {error.get('kind')}" if isinstance(error, dict) else "ok"

    run.__name__ = getattr(body, "__name__", task)
    return run


# Registered apart from their definitions so the functions keep their types (Celery's
# decorator is untyped) and stay callable directly in tests. No result is stored
# (`task_ignore_result` in the wire config): the answer is the reply.
celery_exec_task = app.task(name=registry.TASK_EXEC)(exec_task)
check_task = app.task(name=registry.TASK_CHECK)(_ctl_task(registry.TASK_CHECK, check))
kill_task = app.task(name=registry.TASK_KILL)(_ctl_task(registry.TASK_KILL, kill))
read_output_task = app.task(name=registry.TASK_READ_OUTPUT)(
    _ctl_task(registry.TASK_READ_OUTPUT, read_output)
)
cancel_task = app.task(name=registry.TASK_CANCEL)(_ctl_task(registry.TASK_CANCEL, cancel))
jobs_task = app.task(name=registry.TASK_JOBS)(_ctl_task(registry.TASK_JOBS, list_jobs))

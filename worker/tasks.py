"""The Celery tasks: `exec` runs a call; the control tasks reach a host's jobs and calls.

Every task takes and returns JSON-able dicts (the wire models dumped). `exec` always
returns a CallResult, even for input it cannot accept. Control tasks return an
envelope, `{"ok": value}` or `{"error": {"kind": ..., "message": ...}}`, so the
client can raise a typed error (`not_found` becomes UnknownJob, `invalid`
CallRejected).

`exec` is served by the command consumer (`bashfleet.<host>.exec`, the any and pool
queues); the others by the separate control consumer (`bashfleet.<host>.ctl`), so
they answer at once even when every command slot is busy.
"""

from __future__ import annotations

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

from worker import auth, hoststate, jobs, procs, registry
from worker.app import app
from worker.capture import read_slice
from worker.engine import SpawnHook, run_call
from worker.models import (
    Call,
    CallResult,
    CheckResult,
    JobRecord,
    OutputChunk,
    SystemError_,
    Truncation,
)
from worker.secrets import worker_redaction
from worker.settings import Settings, get_settings

log = logging.getLogger("bashfleet.worker")

#: Largest slice `read_output` returns (results stay small on Redis).
MAX_READ_LIMIT = 4 * 1024 * 1024
#: Grace between SIGTERM and SIGKILL when a job is killed through the fleet.
KILL_GRACE_S = 2.0

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


def exec_call(payload: dict[str, Any]) -> dict[str, Any]:
    """Run one call on this host and return its CallResult."""
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
    state = registry.claim_call(rt.redis, call.call_id, host, rt.instance, os.getpid())
    if state != "ok":
        log.info("call not started: %s", state, extra={"call_id": call.call_id, "state": state})
        return _failed(call.call_id, host, *_refusal(call.call_id, state))
    started = time.monotonic()
    _log_start(call)
    try:
        result = run_call(call, settings=rt.settings, on_spawn=_spawn_hook(rt, call))
    except Exception as exc:  # an engine bug must still answer the caller
        log.exception("call %s failed inside the worker", call.call_id,
                      extra={"call_id": call.call_id})
        result = CallResult(
            call_id=call.call_id, host=host,
            error=SystemError_(kind="internal", message=f"worker error: {exc!r}"),
        )
    finally:
        hoststate.remove_running(rt.settings, call.call_id)
    result = _finish(rt, call, result)
    _log_end(result, time.monotonic() - started)
    return result.model_dump(mode="json")


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


def _log_end(result: CallResult, duration_s: float) -> None:
    """A call's end line: how it ended and how long it took (not its output)."""
    if result.error is not None:
        outcome = f"error {result.error.kind}"
    elif result.backgrounded and result.job is not None:
        outcome = f"backgrounded as job {result.job.id}"
    elif result.job is not None:
        outcome = f"started job {result.job.id}"
    elif result.signal is not None:
        outcome = f"signal {result.signal}"
    else:
        outcome = f"exit {result.exit_code}"
    if result.timed_out:
        outcome += " (timed out)"
    log.info(
        "call ended: %s in %.2fs", outcome, duration_s,
        extra={
            "call_id": result.call_id, "job_id": result.job.id if result.job else None,
            "exit_code": result.exit_code, "signal": result.signal,
            "timed_out": result.timed_out, "backgrounded": result.backgrounded,
            "error_kind": result.error.kind if result.error else None,
            "limit_hit": result.limit_hit, "duration_s": round(duration_s, 3),
        },
    )


def _failed(call_id: str, host: str, kind: str, message: str) -> dict[str, Any]:
    error = SystemError_(kind=kind, message=message)
    return CallResult(call_id=call_id, host=host, error=error).model_dump(mode="json")


def _refusal(call_id: str, state: str) -> tuple[str, str]:
    if state == "cancelled":
        return "internal", f"call {call_id} was cancelled before it started; it did not run"
    if state == "abandoned":
        return "unavailable", (
            f"call {call_id} was withdrawn by its caller before a worker took it; it did not run"
        )
    return "invalid", f"call {call_id} was already taken ({state}); it was not run again"


def _spawn_hook(rt: Runtime, call: Call) -> SpawnHook:
    def on_spawn(pid: int, pgid: int, marker: str) -> None:
        entry = hoststate.RunningCall(
            call_id=call.call_id, pid=pid, pgid=pgid, marker=marker,
            start_time=procs.start_time(pid) or time.time(), worker_pid=os.getpid(),
            instance=rt.instance, kill_grace_s=call.policy.kill_grace_s,
        )
        hoststate.save_running(rt.settings, entry)
        try:
            state = registry.update_call(
                rt.redis, call.call_id, pid=pid, pgid=pgid, marker=marker
            )
        except redis.RedisError as exc:
            log.warning("call %s: could not record its process: %s", call.call_id, exc,
                        extra={"call_id": call.call_id})
            return
        if state in ("cancelling", "stopping"):
            # Cancelled between the claim and the spawn: the canceller found no process.
            hoststate.kill_running(entry)

    return on_spawn


def _finish(rt: Runtime, call: Call, result: CallResult) -> CallResult:
    """Record the call's end in Redis; say so in the result when it was cancelled."""
    spill = result.spill
    fields: dict[str, object] = {
        "exit_code": result.exit_code, "signal": result.signal,
        "job_id": result.job.id if result.job else None,
    }
    if spill is not None:
        fields.update(
            stdout_path=spill.stdout_path, stderr_path=spill.stderr_path,
            stdout_bytes=spill.stdout_bytes, stderr_bytes=spill.stderr_bytes,
        )
    try:
        if result.job is not None:
            record = jobs.load_record(result.job.id, rt.settings)
            registry.save_job(rt.redis, record, running=True)
        previous = registry.finish_call(rt.redis, rt.settings.host, call.call_id, **fields)
    except (redis.RedisError, jobs.JobError) as exc:
        log.warning("call %s: could not record its end: %s", call.call_id, exc,
                    extra={"call_id": call.call_id})
        return result
    note = {
        "cancelling": "call cancelled; its processes were killed",
        "stopping": "the worker was stopped; the call's processes were killed",
    }.get(previous or "")
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
            hoststate.sync_job(rt.redis, record)
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
        entry = hoststate.load_running(rt.settings, call_id)
        if entry is None:
            # Claimed but not yet spawned: the spawn hook sees `cancelling` and kills.
            return {"cancelled": previous == "running", "state": previous}
        survivors = hoststate.kill_running(entry)
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
                hoststate.sync_job(rt.redis, record)
                fields = registry.job_fields(rt.redis, record.id)
            view = registry.job_view(fields)
            if view is not None:
                views.append(view.model_dump(mode="json"))
        return views

    return _guard(body)


# ------------------------------------------------------------------------ signing


def _refused_exec(args: tuple[Any, ...], kind: str, message: str) -> dict[str, Any]:
    rt = runtime()
    payload = args[0] if args and isinstance(args[0], dict) else {}
    inner = payload.get("args") if "auth" in payload else [payload]
    first = inner[0] if isinstance(inner, list) and inner and isinstance(inner[0], dict) else {}
    call_id = str(first.get("call_id") or "?")[:64]
    log.warning("call %s refused: %s", call_id, message, extra={"call_id": call_id})
    return _failed(call_id, rt.settings.host, kind, message)


def _refused_ctl(args: tuple[Any, ...], kind: str, message: str) -> Envelope:
    del args
    log.warning("control message refused: %s", message)
    return _error(kind, message)


def _signed(task: str, body: Callable[..., Any], refuse: Callable[..., Any]) -> Callable[..., Any]:
    """The task as the worker runs it: signature, expiry and nonce checked first.

    With no key configured (the worker warned at start) a signed envelope is unwrapped
    unverified and plain arguments are taken as they are.
    """

    def run(*args: Any) -> Any:
        rt = runtime()
        keys = auth.keyring(rt.settings.accepted_keys())
        if not keys:
            if len(args) == 1 and auth.is_envelope(args[0]):
                return body(*args[0]["args"])
            return body(*args)
        try:
            verified = auth.verify(args[0] if len(args) == 1 else None, task, keys, time.time())
        except auth.AuthError as exc:
            return refuse(args, "unauthorized", exc.message)
        ttl = verified.expires - time.time() + auth.CLOCK_SKEW_S
        if not registry.use_nonce(rt.redis, verified.nonce, ttl):
            return refuse(args, "unauthorized", "replayed message refused (nonce seen before)")
        return body(*verified.args)

    run.__name__ = getattr(body, "__name__", task)
    return run


# Registered apart from their definitions so the functions keep their types (Celery's
# decorator is untyped) and stay callable directly in tests.
exec_task = app.task(name=registry.TASK_EXEC)(_signed(registry.TASK_EXEC, exec_call, _refused_exec))
check_task = app.task(name=registry.TASK_CHECK)(_signed(registry.TASK_CHECK, check, _refused_ctl))
kill_task = app.task(name=registry.TASK_KILL)(_signed(registry.TASK_KILL, kill, _refused_ctl))
read_output_task = app.task(name=registry.TASK_READ_OUTPUT)(
    _signed(registry.TASK_READ_OUTPUT, read_output, _refused_ctl)
)
cancel_task = app.task(name=registry.TASK_CANCEL)(
    _signed(registry.TASK_CANCEL, cancel, _refused_ctl)
)
jobs_task = app.task(name=registry.TASK_JOBS)(_signed(registry.TASK_JOBS, list_jobs, _refused_ctl))

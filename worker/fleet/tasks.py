"""The Celery tasks: `exec` runs a call; one control task per request model.

Every task takes JSON arguments and answers exactly once, whatever happens, as a reply
(`registry.deliver_reply`: stored under the task id, published on the caller's
channel, the message's `reply_to`); Celery stores no result, and the task returns
only a one-line summary for Flower. `exec` always answers a CallResult, even for input
it cannot accept, in the same round trip that records the call's end. A control task
answers a `ControlReply`: its response model, or an error whose kind the client raises
as a typed exception.

`exec` is served by the command consumer (`bashfleet.<host>.exec`, the any and pool
queues); the others by the separate control consumer (`bashfleet.<host>.ctl`), so
they answer at once even when every command slot is busy: the instant ones (`INSTANT`:
check, kill, cancel...) on its own threads, every other in its owner's lane
(`bashfleet.worker.fleet.lanes`), so that no file, build, kill or wait of one tenant holds them.

Here is the dispatch: which handler a message reaches and how its answer goes. A message
is checked first by `bashfleet.worker.fleet.verify` (signature, target queue, nonce,
owner); its answer's address and seal are `bashfleet.worker.fleet.answers`'; a running
call's records on the host are `bashfleet.worker.fleet.exec_watch`'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import redis
from pydantic import ValidationError

from bashfleet.worker.engine import running
from bashfleet.worker.engine.call import run_call, runs_in_foreground
from bashfleet.worker.engine.jobs.jobs import load_record
from bashfleet.worker.fleet import (
    control,
    flower,
    image_calls,
    interactive,
    lanes,
    recovery,
    registry,
    snapshot_calls,
    transfers,
    workspace_calls,
)
from bashfleet.worker.fleet.answers import Answer, current_answer, deliver
from bashfleet.worker.fleet.app import app
from bashfleet.worker.fleet.connect import redis_client
from bashfleet.worker.fleet.control import Runtime
from bashfleet.worker.fleet.exec_watch import ExecWatcher, NotClaimed, log_start
from bashfleet.worker.fleet.verify import REPLAYED, Nonce, use_nonce, verify
from bashfleet.worker.settings import get_settings
from bashfleet.worker.wire import auth, names, owner_keys
from bashfleet.worker.wire.control import REQUESTS, ControlError, ControlReply, ControlRequest
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.models import (
    CANCELLED_MESSAGE,
    Call,
    CallResult,
    Model,
    SystemError_,
    SystemErrorKind,
)
from bashfleet.worker.wire.names import CallState, Task

log = logging.getLogger("bashfleet.worker")

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
        redis=redis_client(settings.redis_url_value() or ""),
        instance=os.environ.get("BASHFLEET_INSTANCE", ""),
    )


def runtime() -> Runtime:
    """The process's runtime."""
    return _runtime_override or _default_runtime()


# -------------------------------------------------------------------------------- exec


def run_exec(
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
    if answer is not None:
        answer.call = call
    claim = registry.send_claim(
        rt.redis, call.call_id, host, rt.instance, os.getpid(),
        nonce=nonce.value if nonce else None, nonce_ttl_s=nonce.ttl_s if nonce else 0.0,
        owner=call.owner, keys=rt.fleet_keys,
    )
    # A plain foreground call is prepared while its claim travels: the engine reads the
    # claim just before bash starts (`ExecWatcher.starting`). The others start a job or
    # a session (and take a quota place) first thing: their claim is read now. One
    # predicate with the engine's own choice of path, so no call that starts by another
    # path is ever left to a `starting` that is never asked.
    overlapped = runs_in_foreground(call)
    if not overlapped:
        refusal = _refused(call, host, claim.answer(), answer)
        if refusal is not None:
            return refusal
        refused = _take_job_place(rt, call)
        if refused is not None:
            return _finish(rt, call, refused, answer, ExecWatcher(rt, call))
        log_start(call)
    started = time.monotonic()
    watcher = ExecWatcher(rt, call, claim.answer if overlapped else None)
    try:
        try:
            result = run_call(call, settings=rt.settings, watcher=watcher)
        except NotClaimed:  # nothing started: the claim's answer says why, below
            result = _failed(call.call_id, host, "internal", "the call was not claimed")
        except Exception as exc:  # an engine bug must still answer the caller
            log.exception("call %s failed inside the worker", call.call_id,
                          extra={"call_id": call.call_id})
            result = _failed(call.call_id, host, "internal", f"worker error: {exc!r}")
        finally:
            watcher.ended()
        # Read again (it was read before bash started, if it started): the refusal, or
        # the Redis error, that started nothing; a call refused before it got there too.
        refusal = _refused(call, host, claim.answer(), answer) if overlapped else None
        if refusal is not None:
            return refusal
        if result.job is None and _counts_as_job(call):
            _give_job_place_back(rt, call)  # it never started (a bad cwd, a spawn failure)
        result = _finish(rt, call, result, answer, watcher)
    finally:
        watcher.put_away_now()  # the workspace's turn, once the caller has its answer
    _log_end(result, time.monotonic() - started)
    return result


def _refused(call: Call, host: str, state: str, answer: Answer | None) -> CallResult | None:
    """The result of a call its claim did not give this worker (`state`: the claim's
    answer); None when it did ("ok")."""
    if state == "ok":
        return None
    log.info("call not started: %s", state, extra={"call_id": call.call_id, "state": state})
    if answer is not None and state not in _ANSWERED_REFUSALS:
        # A second delivery of a message that ran already (a failover handed out again
        # a message whose take the promoted replica never got): the run that claimed
        # it answers. An answer from here would overwrite that one.
        answer.sent = True
    return _failed(call.call_id, host, *_refusal(call.call_id, state))


def _counts_as_job(call: Call) -> bool:
    """True for a call that starts a job its owner's job quota counts: a background
    call (an interactive session has its own cap, per host)."""
    return call.background and call.stdin == "null"


def _take_job_place(rt: Runtime, call: Call) -> CallResult | None:
    """Take a background call's place in its owner's job quota, fleet-wide, before its
    job starts; the refusal (`limit`) when the owner runs BASHFLEET_LIMIT_JOBS already."""
    if not _counts_as_job(call):
        return None
    limit = rt.settings.limit_jobs
    quota = registry.quota_acquire(rt.redis, registry.JOBS_QUOTA, call.owner, call.call_id, limit)
    if quota.taken:
        return None
    log.info("call refused: job limit", extra={"call_id": call.call_id, "error_kind": "limit"})
    return _failed(call.call_id, rt.settings.host, "limit", job_limit_message(call.owner, quota))


def job_limit_message(owner: str, quota: registry.Quota) -> str:
    """What a background start refused by its owner's job cap says."""
    return (
        f"background job refused: {owner or 'this owner'} has {quota.held} background "
        f"job(s) running across the fleet, the most allowed (BASHFLEET_LIMIT_JOBS="
        f"{quota.limit}); nothing was started. Retry once one of them has ended: "
        "`bashfleet ps` lists them, `bashfleet wait ID` waits for one, `bashfleet kill ID` "
        f"ends one (the jobs of a host that died are given back within {names.QUOTA_TTL_S} s)."
    )


def _give_job_place_back(rt: Runtime, call: Call) -> None:
    with contextlib.suppress(redis.RedisError):  # it expires by itself otherwise
        registry.quota_release(rt.redis, registry.JOBS_QUOTA, call.owner, call.call_id)


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


def _failed(call_id: str, host: str, kind: Any, message: str) -> CallResult:
    return CallResult(call_id=call_id, host=host, error=SystemError_(kind=kind, message=message))


#: Claims refused for a reason the caller must hear (nothing else will answer it).
_ANSWERED_REFUSALS = ("replayed", CallState.CANCELLED, CallState.ABANDONED)


def _refusal(call_id: str, state: str) -> tuple[str, str]:
    if state == "replayed":
        return "unauthorized", REPLAYED
    if state == CallState.CANCELLED:
        return "cancelled", f"call {call_id} was cancelled before it started; it did not run"
    if state == CallState.ABANDONED:
        return "unavailable", (
            f"call {call_id} was withdrawn by its caller before a worker took it; it did not run"
        )
    return "invalid", f"call {call_id} was already taken ({state}); it was not run again"


#: Notes for a call that ended from these states (its answer must say so first): a
#: cancel's, and a call its worker killed as it was stopped (to its caller, the worker
#: was lost).
_END_NOTES: dict[str, tuple[SystemErrorKind, str]] = {
    CallState.CANCELLING: ("cancelled", CANCELLED_MESSAGE),
    CallState.STOPPING: ("worker_lost", "the worker was stopped; the call's processes were "
                         "killed"),
}


def _finish(
    rt: Runtime, call: Call, result: CallResult, answer: Answer | None,
    watcher: ExecWatcher,
) -> CallResult:
    """Record the call's end in Redis, and deliver its answer in the same round trip,
    unless it was cancelled or stopped meanwhile: then the answer says so (sent after)."""
    spill = result.spill
    fields: dict[str, object] = {
        **watcher.fields(), "exit_code": result.exit_code, "signal": result.signal,
        "job_id": result.job.id if result.job else None,
    }
    if spill is not None:
        fields.update(
            stdout_path=spill.stdout_path, stderr_path=spill.stderr_path,
            stdout_bytes=spill.stdout_bytes, stderr_bytes=spill.stderr_bytes,
        )
    reply = answer.reply(result.model_dump_json()) if answer is not None else None
    watcher.settle(kept=spill is not None and bool(spill.stdout_path))
    try:
        if result.job is not None:
            record = load_record(result.job.id, rt.settings)
            keys = rt.settings.sealing_keys()
            registry.save_job(rt.redis, record, keys=keys, running=True)
            if not result.backgrounded:  # an interactive session that ended in its call
                recovery.sync_job(rt.redis, record, keys)
        previous, sent = registry.finish_and_reply(
            rt.redis, rt.settings.host, call.call_id, fields, reply=reply,
            hold_in=_END_NOTES if result.error is None else (),
        )
    except (redis.RedisError, ToolError) as exc:
        log.warning("call %s: could not record its end: %s", call.call_id, exc,
                    extra={"call_id": call.call_id})
        return result
    if answer is not None and sent:
        answer.sent = True
        return result
    if previous == CallState.CANCELLING:
        # A canceller may have flagged it on disk (`control.cancel`) after the engine
        # last looked: nobody will look again.
        running.forget_cancel(rt.settings, call.call_id)
    note = _END_NOTES.get(CallState(previous)) if previous in tuple(CallState) else None
    if note is not None and result.error is None:
        result = result.model_copy(update={
            "error": SystemError_(kind=note[0], message=note[1]),
            "cancelled": previous == CallState.CANCELLING,
        })
    return result


def _exec_refused(args: tuple[Any, ...], message: str) -> CallResult:
    rt = runtime()
    payload = args[0] if args and isinstance(args[0], dict) else {}
    inner = payload.get("args") if "auth" in payload else [payload]
    first = inner[0] if isinstance(inner, list) and inner and isinstance(inner[0], dict) else {}
    call_id = str(first.get("call_id") or "?")[:64]
    log.warning("call %s refused: %s", call_id, message, extra={"call_id": call_id})
    return _failed(call_id, rt.settings.host, "unauthorized", message)


def handle_exec(*args: Any) -> str:
    """The exec task as Celery runs it: verify, run, answer (once, whatever happens).

    The nonce of a signed call is recorded with its claim (one round trip for both).
    Once answered, a call whose command failed raises `CallFailed` with the reason, so
    Flower shows it as a failure (`bashfleet.worker.fleet.flower`); its end event carries the cwd
    it ran in and its job.
    """
    rt = runtime()
    answer = current_answer(rt)
    try:
        message = verify(rt, Task.EXEC, args, answer)
        payload = message.args[0] if len(message.args) == 1 else None
        result = run_exec(payload, answer, message.nonce)  # type: ignore[arg-type]
    except auth.AuthError as exc:
        result = _exec_refused(args, exc.message)
    except redis.RedisError as exc:  # the claim could not be recorded: nothing ran
        log.warning("task %s: Redis unreachable before the start: %s", answer.task_id, exc,
                    extra={"call_id": answer.task_id})
        result = _failed(answer.task_id, rt.settings.host, "unavailable",
                         f"the worker could not reach Redis to start the call ({exc}); "
                         "the command was not run")
    except Exception as exc:  # a bug must still answer the caller
        log.exception("task %s failed inside the worker", answer.task_id,
                      extra={"call_id": answer.task_id})
        result = _failed(answer.task_id, rt.settings.host, "internal", f"worker error: {exc!r}")
    if not answer.sent:  # the finish script delivered it, most often
        deliver(rt, answer, result.model_dump_json())
    reason = _report(answer.task_id, answer.call, result)
    if reason is not None:
        raise flower.CallFailed(reason)
    return outcome(result)


def _report(task_id: str, call: Call | None, result: CallResult) -> str | None:
    """Flower's view of a finished call: its final arguments; why it failed, if it did."""
    if call is None:
        return flower.failure_reason(result, 0.0)
    flower.set_final_args(task_id, flower.call_args(call, result))
    timeout = call.timeout_s if call.timeout_s is not None else call.policy.default_timeout_s
    return flower.failure_reason(result, timeout)


# ----------------------------------------------------------------------------- control

#: What each control request does (`bashfleet.worker.fleet.control`).
HANDLERS: dict[str, Callable[[Runtime, Any, bool], Model]] = {
    Task.CHECK: control.check,
    Task.KILL: control.kill,
    Task.READ_OUTPUT: control.read_output,
    Task.CANCEL: control.cancel,
    Task.DETACH: control.detach,
    Task.JOBS: control.list_jobs,
    Task.WRITE_STDIN: interactive.write_stdin,
    Task.CLOSE_STDIN: interactive.close_stdin,
    Task.RESIZE: interactive.resize,
    Task.WORKSPACE_CREATE: workspace_calls.create,
    Task.WORKSPACE_DELETE: workspace_calls.delete,
    Task.WORKSPACE_RENEW: workspace_calls.renew,
    Task.WORKSPACE_NETWORK: workspace_calls.set_network,
    Task.WORKSPACES: workspace_calls.list_workspaces,
    Task.FILE_READ: workspace_calls.read_file,
    Task.FILE_WRITE: workspace_calls.write_file,
    Task.IMAGES: image_calls.list_images,
    Task.IMAGE_PULL: image_calls.pull,
    Task.IMAGE_REMOVE: image_calls.remove,
    Task.SNAPSHOT_CREATE: snapshot_calls.create,
    Task.SNAPSHOT_DELETE: snapshot_calls.delete,
    Task.SNAPSHOT_FETCH: snapshot_calls.fetch,
    Task.WORKSPACE_FORK: snapshot_calls.fork,
    Task.WORKSPACE_RESTORE: snapshot_calls.restore,
}
#: Control requests whose handler also takes the key that signed the request: a
#: transfer MACs its chunks with it (`bashfleet.worker.fleet.transfers`).
KEYED_HANDLERS: dict[str, Callable[[Runtime, Any, bool, str | None], Model]] = {
    Task.TRANSFER: transfers.transfer,
}

#: Fields of a control response worth a log line (never output, never paths of it).
_LOGGED_FIELDS = (
    "running", "exit_code", "signal", "cancelled", "detached", "state", "survivors",
)


def _request(task: str, args: tuple[Any, ...]) -> ControlRequest:
    """The request model of a control message; `ToolError("invalid")` when it is not one."""
    cls = REQUESTS[task]
    if len(args) != 1 or not isinstance(args[0], dict):
        raise ToolError("invalid", f"invalid arguments: {task} takes one {cls.__name__}")
    try:
        return cls.model_validate(args[0])
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ToolError("invalid", f"invalid {cls.__name__}: {fields}") from None


#: Control requests answered on the control consumer's own threads: each acts at once
#: (the host's own records and output files, read a bounded slice at a time; never a
#: workspace's file, never a wait on a process).
INSTANT = frozenset({Task.CHECK, Task.READ_OUTPUT, Task.DETACH, Task.JOBS})
#: Requests that wait on processes: a kill or a cancel waits out its grace (a process
#: that ignores SIGTERM holds it 2 s, a cancel up to its policy's 60 s), an interactive
#: read waits for output (up to MAX_COLLECT_WAIT_S) and for the session's one reader:
#: their owner's `waits` lane, threads of their own. Every other request (files,
#: transfers' starts, workspaces, snapshots, images) goes to its owner's `work` lane
#: (`bashfleet.worker.fleet.lanes`).
WAITS = frozenset({Task.KILL, Task.CANCEL, Task.WRITE_STDIN, Task.CLOSE_STDIN, Task.RESIZE})


#: Requests where the fleet key is the admin's, as the admin key is: what concerns every
#: owner of a host alike (its images), and a call's cancel (the operator's client acts on
#: any call, as it reads every owner's records).
OPERATOR_TASKS = frozenset({Task.IMAGE_REMOVE, Task.CANCEL})


@dataclass(frozen=True)
class Accepted:
    """A control message verified (its nonce used) and read as its request model, and
    who signed it: the admin key, an owner key (`signer`), or a fleet key (`fleet`)."""

    request: ControlRequest
    admin: bool
    signer: str | None = None
    fleet: bool = False

    def admin_for(self, task: str) -> bool:
        """Whether the request acts as the admin: signed with the admin key, or with a
        fleet key for an operator's request (`OPERATOR_TASKS`)."""
        return self.admin or (self.fleet and task in OPERATOR_TASKS)

    @property
    def lane_owner(self) -> str:
        """Whose lane the request waits in (`lane_owner`)."""
        return lane_owner(self.request.owner, self.signer)


def lane_owner(owner: str, signer: str | None) -> str:
    """The owner a slow request counts against: the owner whose key signed it, never a
    sub-owner (`team::0`, `team::1`, ... are one key's: counted apart, one key would take
    as many threads as it names sub-owners). A fleet-key message counts against the root
    of the owner it names."""
    return signer if signer is not None else owner_keys.root_owner(owner)


def accept(rt: Runtime, task: str, args: tuple[Any, ...], answer: Answer) -> Accepted:
    """Verify (nonce included) and validate one control message; AuthError, ToolError
    (`invalid`) or RedisError when it must be refused."""
    message = verify(rt, task, args, answer)
    use_nonce(rt, message.nonce)
    return Accepted(_request(task, message.args), message.admin, message.owner, message.fleet)


def act(rt: Runtime, task: str, accepted: Accepted, answer: Answer) -> ControlReply:
    """Do what an accepted request asks; its reply (an error reply for any failure)."""
    try:
        if task in KEYED_HANDLERS:
            response = KEYED_HANDLERS[task](rt, accepted.request, accepted.admin_for(task),
                                            answer.key)
        else:
            response = HANDLERS[task](rt, accepted.request, accepted.admin_for(task))
        return ControlReply(ok=response.model_dump(mode="json"))
    except Exception as exc:  # each kind its reply; a bug must still answer the caller
        return _failure_reply(task, exc)


def _failure_reply(task: str, exc: Exception) -> ControlReply:
    if isinstance(exc, auth.AuthError):
        log.warning("control message refused: %s", exc.message)
        return _error_reply(exc)
    if isinstance(exc, ToolError):
        return _error_reply(exc)
    if isinstance(exc, redis.RedisError):
        return _error_reply(ToolError("unavailable", f"the worker could not reach Redis: {exc}"))
    log.error("control task %s failed inside the worker", task, exc_info=exc)
    return _error_reply(ToolError("internal", f"worker error: {exc!r}"))


def lane_of(rt: Runtime, task: str) -> lanes.Lanes | None:
    """Where a request of `task` is acted on: None for the control thread itself (an
    instant one), else its owner's lane of the kind it needs."""
    if task in INSTANT:
        return None
    return lanes.for_host(rt.settings, "waits" if task in WAITS else "work")


def _error_reply(exc: ToolError) -> ControlReply:
    return ControlReply(error=ControlError(kind=exc.kind, message=exc.message, file=exc.file))


#: Control calls that get a log line, and the id field each is about.
#: (Not write_stdin: a person's terminal sends one per keystroke.)
_LOGGED_SUBJECTS = {
    Task.CHECK: "job_id", Task.KILL: "job_id", Task.CANCEL: "call_id", Task.DETACH: "call_id",
    Task.CLOSE_STDIN: "job_id", Task.RESIZE: "job_id", Task.WORKSPACE_DELETE: "workspace_id",
}


def _log_control(task: str, request: ControlRequest | None, reply: ControlReply) -> None:
    """One line per check, kill and cancel: what, on which id, how it went (no output)."""
    id_field = _LOGGED_SUBJECTS.get(Task(task))
    if id_field is None:
        return
    action = task.removeprefix("bashfleet.")
    item = str(getattr(request, "id", None) or getattr(request, "call_id", None) or "?")
    subject = f"{id_field.removesuffix('_id')} {item}"
    ids = {id_field: item}
    if reply.error is not None:
        log.info("%s %s: %s: %s", action, subject, reply.error.kind, reply.error.message,
                 extra={**ids, "action": action, "error_kind": reply.error.kind})
        return
    value = reply.ok or {}
    fields = {name: value[name] for name in _LOGGED_FIELDS if name in value}
    log.info("%s %s: %s", action, subject,
             ", ".join(f"{name} {field}" for name, field in fields.items()) or "done",
             extra={**ids, "action": action, **fields})


def _control_task(task: str) -> Callable[..., str]:
    """A control task as Celery runs it: accept the message, then act and reply here
    (an instant request) or in its owner's lane; one log line, a summary."""

    def run(*args: Any) -> str:
        rt = runtime()
        answer = current_answer(rt)
        try:
            accepted = accept(rt, task, args, answer)
        except Exception as exc:  # each kind its reply (`_failure_reply`)
            return _reply(rt, task, None, answer, _failure_reply(task, exc))
        lane = lane_of(rt, task)
        if lane is None:
            return _reply(rt, task, accepted.request, answer, act(rt, task, accepted, answer))
        work = lanes.Work(
            act=lambda: _reply(rt, task, accepted.request, answer,
                               act(rt, task, accepted, answer)),
            expire=lambda: _reply(rt, task, accepted.request, answer, _error_reply(ToolError(
                "unavailable", "the request waited in its owner's lane on this host past "
                "its expiry (its caller stopped waiting): it was not acted on"))),
            expires_at=answer.expires_at,
        )
        try:
            lane.submit(accepted.lane_owner, work)
        except ToolError as exc:
            return _reply(rt, task, accepted.request, answer, _error_reply(exc))
        return f"in the {lane.name} lane"

    run.__name__ = task.removeprefix("bashfleet.")
    return run


def _reply(rt: Runtime, task: str, request: ControlRequest | None, answer: Answer,
           reply: ControlReply) -> str:
    """Log a control call's line, deliver its answer; its summary for Flower. Logged
    before the answer goes: a caller that reads the log once answered finds the line."""
    _log_control(task, request, reply)
    deliver(rt, answer, reply.model_dump_json())
    return f"error {reply.error.kind}" if reply.error is not None else "ok"


# Registered apart from their definitions so the functions keep their types (Celery's
# decorator is untyped) and stay callable directly in tests. No result is stored
# (`task_ignore_result` in the wire config): the answer is the reply.
exec_task = app.task(
    name=Task.EXEC, Request=flower.CallRequest, throws=(flower.CallFailed,)
)(handle_exec)
control_tasks = {task: app.task(name=task)(_control_task(task))
                 for task in [*HANDLERS, *KEYED_HANDLERS]}

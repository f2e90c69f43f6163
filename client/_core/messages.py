"""What a client sends and how it reads what comes back, with no I/O.

- A request (`RunRequest`, or a control request of `bashfleet.worker.wire.control`) is built and
  validated here: a bad one is a CallRejected, nothing sent.
- A call or a control request becomes the Celery task message kombu would push
  (`bashfleet.worker.wire.messages.task_message`), its arguments signed with the client's key
  for the very queue it is pushed on (the envelope's `target`: a worker refuses a
  message taken from another queue, `auth.check_target`).
  Both clients push it themselves (no Celery in a client).
- An answer is opened (its seal checked: `open_reply`) and decoded: a `CallResult`, or
  a control reply whose error kind becomes its typed exception (`bashfleet.client.errors`).
- A result is judged: a call that did not run is a CallNotRun for the caller who asked
  to be told (`raise_if_not_run`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from bashfleet.client._core.identity import Identity
from bashfleet.client._core.sending import (
    call_message,
    control_reply,
    control_task_message,
    new_call_id,
    open_reply,
)
from bashfleet.client.errors import (
    BashfleetError,
    CallNotRun,
    CallRejected,
    WorkerError,
    error_for,
)
from bashfleet.worker.wire.control import ControlReply, ControlRequest
from bashfleet.worker.wire.models import (
    SLOW_TIMEOUT_S,
    Call,
    CallOptions,
    CallResult,
    Model,
    RunRequest,
    SystemError_,
)

R = TypeVar("R", bound=Model)
Q = TypeVar("Q", bound=ControlRequest)
#: What turns a worker's error (kind, message, file problem) into the exception raised.
ErrorFor = Callable[[str, str, str | None], BashfleetError]

#: The system errors of a call that did not run at all: `run` raises CallNotRun for
#: these (`limit`: its owner's cap of background jobs was reached, checked before the
#: job starts). Not among them: a timeout, a signal, a cancel (the command ran, or was
#: stopped on purpose), `worker_lost` (raised as WorkerLost when the client finds the
#: worker gone; the result's kind when a stopping worker killed the command and said so,
#: its output so far kept), `internal` (a bug of ours, after which nobody can say what ran).
NOT_RUN_KINDS = frozenset({
    "bad_cwd", "spawn_failed", "blocked", "invalid", "unauthorized", "unavailable",
    "not_found", "limit",
})

def validation_message(exc: ValidationError) -> str:
    """A pydantic error as one line: each field path and what is wrong with it."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "call"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def run_request(command: str, options: Mapping[str, Any]) -> RunRequest:
    """`RunRequest(command=command, **options)`, a bad option a CallRejected."""
    try:
        return RunRequest(command=command, **options)
    except ValidationError as exc:
        raise CallRejected(f"invalid call: {validation_message(exc)}") from None


def control_request(model: type[Q], **fields: Any) -> Q:
    """A control request, a bad field a CallRejected (nothing sent)."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise CallRejected(f"invalid {model.__name__}: {validation_message(exc)}") from None


def build_call(request: RunRequest, owner: str = "") -> Call:
    """The call a request sends: its options as asked (`CallOptions`, checked now: a bad
    one is a CallRejected), its mode applied, a fresh id unless it names one."""
    timeout = request.timeout
    if request.mode == "slow" and timeout is None:
        timeout = SLOW_TIMEOUT_S
    # The values as they are: a dump would turn its TermSize and network policy into
    # dicts only for the call to read them back.
    options = {name: getattr(request, name) for name in CallOptions.model_fields}
    try:
        return Call(
            **options | {"cwd": request.cwd or request.default_cwd},
            call_id=request.call_id or new_call_id(), timeout_s=timeout,
            background=request.mode == "background", owner=owner,
            **({"input_wait_s": request.input_wait_s} if request.input_wait_s else {}),
            **({"policy": request.policy} if request.policy is not None else {}),
        )
    except ValidationError as exc:
        raise CallRejected(f"invalid call: {validation_message(exc)}") from None


def exec_message(identity: Identity, call: Call, queue: str, reply_to: str) -> str:
    """The task message of a call, for its queue; answered on `reply_to`."""
    return call_message(identity, call.model_dump(mode="json"), queue, reply_to)


def control_message(
    identity: Identity, request: ControlRequest, *, task_id: str, host: str, reply_to: str,
    timeout: float,
) -> str:
    """The task message of a control request to `host`, asked as this client's owner; the
    worker drops it unrun once `timeout` passed (nobody waits for its answer then)."""
    request = request.model_copy(update={"owner": identity.owner})
    return control_task_message(identity, request.task, request.model_dump(mode="json"),
                                task_id=task_id, host=host, reply_to=reply_to,
                                timeout=timeout)


# ------------------------------------------------------------------------- answers


def decode_result(keys: Mapping[str, str], call_id: str, sealed: str) -> CallResult:
    """A call's answer as its result (seal checked)."""
    text = open_reply(keys, call_id, sealed)
    try:
        return CallResult.model_validate_json(text)
    except ValidationError:
        raise WorkerError(f"call {call_id}: unreadable answer {text[:200]!r}") from None


def decode_control(
    keys: Mapping[str, str], task_id: str, host: str, sealed: str, response: type[R],
    *, errors: ErrorFor = error_for,
) -> R:
    """A control call's answer as its response model; the worker's error as its typed
    exception (`errors`: `error_for`, or an image request's `image_error_for`)."""
    data = control_reply(keys, task_id, host, sealed)
    try:
        reply = ControlReply.model_validate(data)
    except ValidationError:
        raise WorkerError(f"the worker on {host} answered {str(data)[:200]!r}") from None
    if reply.error is not None:
        raise errors(reply.error.kind, reply.error.message, reply.error.file)
    return response.model_validate(reply.ok or {})


def unstarted_result(call_id: str, host: str | None, state: str) -> CallResult:
    """The result of a call withdrawn before any worker started it: `cancelled` (its
    caller cancelled it) or `unavailable` (abandoned: nobody was left to run it)."""
    kind = "cancelled" if state == "cancelled" else "unavailable"
    message = f"call {call_id} was {state} before it started; it did not run"
    return CallResult(call_id=call_id, host=host or "",
                      error=SystemError_(kind=kind, message=message))


def raise_if_not_run(result: CallResult) -> CallResult:
    """The result, unless the call did not run at all (NOT_RUN_KINDS): then CallNotRun,
    which carries the kind, the message and the result."""
    error = result.error
    if error is not None and error.kind in NOT_RUN_KINDS:
        raise CallNotRun(error.kind, f"call {result.call_id} did not run: {error.message}",
                         result)
    return result

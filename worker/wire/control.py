"""Control calls: one request and one response model each, and the reply envelope.

A control call goes to the owning host's control queue (`names.ctl_queue`), served
apart from the command slots, as the request model's JSON (the task is the request's
`task`); the worker answers a `ControlReply`: the response model's JSON in `ok`, or
an `error` whose kind the client raises as a typed exception.

    CheckRequest      -> CheckResult    a job's state and its new output
    KillRequest       -> CheckResult    end a job; its final state
    ReadOutputRequest -> OutputChunk    a slice of a job's or a call's kept output
    CancelRequest     -> CancelResult   kill a running foreground call
    DetachRequest     -> DetachResult   leave a running foreground call running as a job
    JobsRequest       -> JobList        the host's background jobs
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from worker.wire.errors import ErrorKind
from worker.wire.models import (
    OWNER_PATTERN,
    CheckResult,
    JobView,
    Model,
    OutputChunk,
    Truncation,
)
from worker.wire.names import Task

#: A `grep` that matches no line (RE2 syntax): a check that reads a job's state only.
NO_LINE = r"[^\s\S]"

#: Largest slice `read_output` returns (results stay small on Redis).
MAX_READ_LIMIT = 4 * 1024 * 1024


class ControlRequest(Model):
    """Base of the control requests: each names its task and its response model, and
    says who asks (only the owner of a job or call, or an admin, reaches it)."""

    task: ClassVar[Task]
    response: ClassVar[type[Model]]

    owner: str = Field("", pattern=OWNER_PATTERN)
    """Who asks: another owner's job or call is answered as unknown (`not_found`),
    unless the message was signed with the admin key."""


class CheckRequest(ControlRequest):
    """A job's state and its output since `offset`."""

    task: ClassVar[Task] = Task.CHECK
    response: ClassVar[type[Model]] = CheckResult

    id: str
    """Job id."""
    grep: str | None = None
    """Only new lines matching this regular expression."""
    offset: int | None = Field(None, ge=0)
    """Byte offset of the output to read from; None: where the last check stopped."""
    stderr_offset: int | None = Field(None, ge=0)
    """Byte offset of a separate stderr file; None: where the last check stopped."""
    truncation: Truncation | None = None
    """How to cut the new output; None: the last 2000 lines."""


class KillRequest(ControlRequest):
    """End a job (group SIGTERM, grace, SIGKILL, marker sweep)."""

    task: ClassVar[Task] = Task.KILL
    response: ClassVar[type[Model]] = CheckResult

    id: str
    """Job id."""
    offset: int | None = Field(None, ge=0)
    """Byte offset of the output to return from; None: where the last check stopped."""
    stderr_offset: int | None = Field(None, ge=0)
    """Byte offset of a separate stderr file; None: where the last check stopped."""
    truncation: Truncation | None = None
    """How to cut the final output; None: the last 2000 lines."""
    signal: Literal[9, 15] = 15
    """The first signal to the job's group: 15 (SIGTERM, then SIGKILL after a grace) or
    9 (SIGKILL at once, as `kill -9 -<pgid>` does)."""


class ReadOutputRequest(ControlRequest):
    """A slice of a job's output file, or of a call's kept (spilled) output."""

    task: ClassVar[Task] = Task.READ_OUTPUT
    response: ClassVar[type[Model]] = OutputChunk

    id: str
    """Job or call id."""
    offset: int = Field(0, ge=0)
    """Byte offset to read from."""
    limit: int = Field(65536, ge=1)
    """Most bytes to read (capped at MAX_READ_LIMIT)."""
    grep: str | None = None
    """Only lines matching this regular expression."""
    stream: Literal["stdout", "stderr"] = "stdout"
    """Which file of a separate-stream call."""


class CancelResult(Model):
    """What cancelling a foreground call did."""

    cancelled: bool
    """True when the call was found running and its processes were signalled."""
    state: str | None = None
    """The call's state when the cancel arrived."""
    survivors: tuple[int, ...] = ()
    """Processes of the call still alive after the kill."""


class CancelRequest(ControlRequest):
    """Kill the processes of a running foreground call; its exec task then answers."""

    task: ClassVar[Task] = Task.CANCEL
    response: ClassVar[type[Model]] = CancelResult

    call_id: str
    """The call's id."""


class DetachResult(Model):
    """What asking a foreground call to go on as a background job did."""

    detached: bool
    """True when the call was running and was asked to go on as a job: its own answer
    (`CallResult.job`) then names the job."""
    state: str | None = None
    """The call's state when the request arrived."""


class DetachRequest(ControlRequest):
    """Leave a running foreground call running as a background job; its exec task then
    answers with the job (as an auto-background timeout would)."""

    task: ClassVar[Task] = Task.DETACH
    response: ClassVar[type[Model]] = DetachResult

    call_id: str
    """The call's id."""


class JobList(Model):
    """A host's background jobs, oldest first."""

    jobs: tuple[JobView, ...] = ()
    """The jobs, fresh from the host's disk."""


class JobsRequest(ControlRequest):
    """The host's background jobs: the asker's own, or with `all_owners` (admin) all."""

    task: ClassVar[Task] = Task.JOBS
    response: ClassVar[type[Model]] = JobList

    all_owners: bool = False
    """Every owner's jobs (refused unless the message was signed with the admin key)."""


#: Every control request by task name (what the worker validates a message against).
REQUESTS: dict[str, type[ControlRequest]] = {
    cls.task: cls
    for cls in (
        CheckRequest, KillRequest, ReadOutputRequest, CancelRequest, DetachRequest, JobsRequest,
    )
}


class ControlError(Model):
    """Why a control call failed."""

    kind: ErrorKind
    """Machine-readable class (`not_found`, `invalid`, `unauthorized`...)."""
    message: str
    """What went wrong, for a person or a model."""


class ControlReply(Model):
    """A control call's answer: `ok` (the response model's JSON) or `error`."""

    ok: dict[str, Any] | None = None
    """The response, when the call succeeded."""
    error: ControlError | None = None
    """The failure, when it did not."""

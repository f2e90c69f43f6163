"""Background jobs: the record a host keeps, how one ended, a check of one, a slice of
its output, and how listings show it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from bashfleet.worker.wire.models.base import Model, Stdin, Tags
from bashfleet.worker.wire.models.results import TruncationInfo


class JobRecord(Model):
    """Everything needed to check or kill a background job from any process on its host."""

    id: str
    """Job id: unique across hosts and time."""
    host: str
    """Host id of the owning worker."""
    pid: int
    """Process id of the job's bash (the process group leader)."""
    pgid: int
    """Process group id."""
    start_time: float
    """Kernel start time of `pid` (seconds since the epoch): guards against pid reuse."""
    marker: str
    """Value of the marker variable carried by every process the job started."""
    command: str
    """The command, for listings."""
    cwd: str
    """Working directory."""
    output_path: str
    """Combined output file; the completion line is appended to it."""
    status_path: str
    """JSON file the job's supervisor writes when the command ends."""
    started_at: float
    """Wall clock time the job started."""
    call_id: str | None = None
    """The call that started it (or that was auto-backgrounded)."""
    stderr_path: str | None = None
    """Separate stderr file (None: stderr is in `output_path`): jobs of separate-stream
    calls, started in the background or auto-backgrounded."""
    owner: str = ""
    """Who the job belongs to (the owner of the call that started it)."""
    tags: Tags = Field(default_factory=dict)
    """Tags given by the call that started it."""
    stdin: Stdin = "null"
    """The job's standard input (`pipe` and `pty` take writes through its supervisor)."""
    socket_path: str | None = None
    """Unix socket of the job's supervisor (interactive jobs): writes, resizes, closes."""
    stdin_id: tuple[int, int] | None = None
    """(st_dev, st_ino) of the job's stdin pipe or terminal: how a process reading it is
    recognised."""
    workspace: str | None = None
    """The workspace the job runs in (None: a job of an unsandboxed host)."""
    ns_pid: int | None = None
    """Its bash's pid in the workspace's PID namespace: the number its calls use (None:
    the same as `pid`)."""
    ns_pgid: int | None = None
    """Its process group in the workspace's PID namespace (None: the same as `pgid`)."""


class JobStatus(Model):
    """How a job ended, as written to its status file."""

    exit_code: int | None = None
    """Exit status, when it exited."""
    signal: int | None = None
    """Terminating signal, when one ended it."""
    ended_at: float
    """Wall clock time it ended."""
    note: str | None = None
    """Why the status is incomplete, when it is (for example the watcher was gone)."""


class CheckResult(Model):
    """A job's state and the output it printed since the given offset."""

    id: str
    """Job id."""
    host: str
    """Owning host."""
    running: bool
    """True until the job's bash ends; processes it left running are named in `note`."""
    exit_code: int | None = None
    """Exit status once ended."""
    signal: int | None = None
    """Terminating signal once ended by one."""
    output: str = ""
    """New output since `offset` (sanitized, redacted, filtered by `grep` if given)."""
    offset: int = 0
    """Byte offset to pass next time to get only newer output."""
    output_truncation: TruncationInfo | None = None
    """Counts for `output`."""
    output_path: str = ""
    """The job's full output file."""
    stderr_output: str = ""
    """New stderr since the stderr offset, for jobs that keep stderr apart."""
    stderr_offset: int = 0
    """Byte offset into the stderr file."""
    note: str | None = None
    """Anything the caller should know (status unknown, process gone)."""


class OutputChunk(Model):
    """A slice of a spill or job output file, for `read_output`."""

    path: str
    """File read."""
    offset: int
    """Byte offset the slice starts at."""
    next_offset: int
    """Byte offset just past the slice."""
    size: int
    """File size when read."""
    text: str
    """The slice, sanitized and redacted (filtered when `grep` is given)."""
    eof: bool
    """True when the slice reaches the end of the file."""


class JobView(Model):
    """A background job as listings show it (`bashfleet ps`)."""

    id: str
    """Job id."""
    host: str
    """Owning host."""
    pid: int
    """Process id of the job's bash."""
    pgid: int
    """Process group id."""
    command: str
    """The command."""
    cwd: str
    """Working directory."""
    output_path: str
    """Output file on `host`."""
    started_at: float
    """When it started."""
    state: Literal["running", "ended", "unknown"]
    """`unknown` when the owning host is down and the job was running when last seen."""
    running: bool | None
    """True while running; None when unknown."""
    exit_code: int | None = None
    """Exit status once ended."""
    signal: int | None = None
    """Terminating signal once ended by one."""
    ended_at: float | None = None
    """When it ended, if known."""
    note: str | None = None
    """Anything worth knowing (status unknown, host down)."""
    call_id: str | None = None
    """The call that started it."""
    owner: str = ""
    """Who the job belongs to."""
    tags: Tags = Field(default_factory=dict)
    """Tags given by the call that started it."""
    host_pid: int | None = None
    """Its bash's pid on the host, when `pid` is its workspace's."""
    workspace: str | None = None
    """The workspace it runs in."""
    stderr_path: str | None = None
    """Its stderr file on `host`, when it keeps stderr apart from `output_path`."""

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
    WriteStdinRequest -> SessionOutput  write to an interactive job; its new output
    CloseStdinRequest -> SessionOutput  end an interactive job's input (EOF)
    ResizeRequest     -> SessionOutput  set an interactive job's terminal size
    WorkspaceCreateRequest -> WorkspaceView      make a workspace on the host
    WorkspaceDeleteRequest -> WorkspaceDeleted   end one (its processes, files, cgroup)
    WorkspaceRenewRequest  -> WorkspaceView      mark one used (its lease starts again)
    WorkspaceNetworkRequest -> WorkspaceView     put another network policy in force
    WorkspacesRequest      -> WorkspaceList      the host's workspaces
    FileReadRequest        -> FileChunk          a slice of a file, as its calls see it
    FileWriteRequest       -> FileWritten        write (or append) bytes to a file
    TransferRequest        -> TransferStarted    stream a file or a directory in or out
    ImagesRequest          -> ImageList          the images the host holds
    ImagePullRequest       -> ImagePull          start (or join) a pull; its state so far
    ImageRemoveRequest     -> ImageRemoved       remove an image no workspace uses (admin)
    SnapshotCreateRequest  -> Snapshot           freeze a workspace's own layers
    SnapshotDeleteRequest  -> SnapshotDeleted    delete one (kept while others stand on it)
    SnapshotFetchRequest   -> SnapshotFetch      push (on its host) or fetch (on another)
    WorkspaceForkRequest   -> WorkspaceForks     n workspaces from a workspace's state now
    WorkspaceRestoreRequest -> RestoreResult     a workspace's files back to a snapshot's

A pull can take minutes, longer than any control call may hold one of the control
consumer's few threads: it runs on a thread of its own on the host, and the client asks
again (`pull_id`) until it is done, each answer waiting at most `wait_s` and bringing
the progress lines since the last.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field

from bashfleet.worker.wire.errors import ErrorKind, FileProblem
from bashfleet.worker.wire.models import (
    OWNER_PATTERN,
    SNAPSHOT_ID_PATTERN,
    WORKSPACE_ID_PATTERN,
    CheckResult,
    ImageInfo,
    InputWait,
    JobView,
    Model,
    OutputChunk,
    RestoreResult,
    Snapshot,
    Stdin,
    Tags,
    Truncation,
    TruncationInfo,
    WorkspaceSpec,
    WorkspaceView,
)
from bashfleet.worker.wire.names import Task
from bashfleet.worker.wire.network import NetworkPolicy
from bashfleet.worker.wire.network import parse as parse_network
from bashfleet.worker.wire.transfer import TRANSFER_ID_PATTERN

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
    workspace: str | None = None
    """Only a job of this workspace: another's is answered as unknown (`Workspace.check`)."""


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
    workspace: str | None = None
    """Only a job of this workspace: another's is answered as unknown (`Workspace.check`)."""


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
    workspace: str | None = None
    """Only a job of this workspace: another's is answered as unknown (`Workspace.check`)."""


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
    workspace: str | None = None
    """Only a job of this workspace: another's is answered as unknown (`Workspace.check`)."""


#: Most bytes one `write_stdin` carries (a paste; bigger inputs go in several writes).
MAX_WRITE_BYTES = 1024 * 1024
#: Longest an interactive read may wait for output (a control call must answer).
MAX_COLLECT_WAIT_S = 300.0


class Collect(Model):
    """How an interactive read (a write, a poll, a close) waits for output before it
    answers: at most `wait_s`, less when the process ends, when output came and settled,
    or when the process waits for input."""

    wait_s: float = Field(0.0, ge=0, le=MAX_COLLECT_WAIT_S)
    """Most seconds to wait (0: answer with what is there now)."""
    delay_s: float = Field(0.0, ge=0, le=10)
    """Seconds to let the process react to a write before reading (codex: 0.1)."""
    settle_s: float | None = Field(None, ge=0, le=MAX_COLLECT_WAIT_S)
    """Answer once output arrived and then none came for this long (0: at the first
    output); None: wait the whole `wait_s` unless the process ends or waits for input."""
    input_wait_s: float = Field(2.0, ge=0.05, le=3600)
    """Answer when the process has been blocked reading its input, with no output, for
    this long (it is then reported as waiting for input)."""
    truncation: Truncation | None = None
    """How to cut the new output; None: the last 2000 lines / 50 KB."""
    raw: bool = False
    """Also return the new output's bytes as written (base64), unsanitized: for a
    person's terminal (`bashfleet attach`), never for a model."""
    max_bytes: int = Field(8 * 1024 * 1024, ge=1, le=64 * 1024 * 1024)
    """Most bytes of new output read in one answer; the rest waits for the next read."""
    read: bool = True
    """False: write only, read nothing (the output stays for the next read): a person's
    keystrokes while another request waits for the output."""


class SessionOutput(Model):
    """An interactive job's state and the output it produced since the last read (by
    any client of its owner): every byte is returned once, in order."""

    id: str
    """Job id."""
    host: str
    """Owning host."""
    running: bool
    """True until the job's shell ends."""
    exit_code: int | None = None
    """Exit status once ended."""
    signal: int | None = None
    """Terminating signal once ended by one."""
    stdin: Stdin = "null"
    """The job's standard input."""
    stdin_open: bool = False
    """True while writes reach the process (pipe or pty, not closed, job running)."""
    output: str = ""
    """New output since the last read: sanitized, redacted, cut by the truncation."""
    output_truncation: TruncationInfo | None = None
    """Counts for `output`."""
    raw_b64: str | None = None
    """The new output's bytes as written, base64 (with `Collect.raw`)."""
    offset: int = 0
    """Byte offset of the job's output this answer read up to."""
    start_offset: int = 0
    """Byte offset this answer read from."""
    more: bool = False
    """More output is waiting past `max_bytes`: read again."""
    input_wait: InputWait | None = None
    """Set when the process waits for input (blocked reading, no output for a while)."""
    written: int = 0
    """Bytes of this request's input handed to the process."""
    output_path: str = ""
    """The job's full output file on `host`."""
    note: str | None = None
    """Anything the caller should know."""


class WriteStdinRequest(ControlRequest):
    """Write to an interactive job's stdin (a pipe, or its terminal), then read its new
    output; empty `data` just reads (a poll)."""

    task: ClassVar[Task] = Task.WRITE_STDIN
    response: ClassVar[type[Model]] = SessionOutput

    id: str
    """Job id."""
    data: str = Field("", max_length=MAX_WRITE_BYTES)
    """Text to write (UTF-8). Through a terminal `\u0003` is Ctrl-C, `\r` or `\n` Enter."""
    data_b64: str | None = Field(None, max_length=MAX_WRITE_BYTES * 4 // 3 + 4)
    """Bytes to write, base64 (a person's keystrokes), instead of `data`."""
    close: bool = False
    """End the input after the data: the pipe is closed, a terminal gets Ctrl-D."""
    collect: Collect = Field(default_factory=Collect)
    """How to wait for the output."""


class CloseStdinRequest(ControlRequest):
    """End an interactive job's input: its pipe is closed, or its terminal sends EOF
    (Ctrl-D); then read its new output."""

    task: ClassVar[Task] = Task.CLOSE_STDIN
    response: ClassVar[type[Model]] = SessionOutput

    id: str
    """Job id."""
    collect: Collect = Field(default_factory=Collect)
    """How to wait for the output."""


class ResizeRequest(ControlRequest):
    """Set an interactive job's terminal size (its foreground process gets SIGWINCH)."""

    task: ClassVar[Task] = Task.RESIZE
    response: ClassVar[type[Model]] = SessionOutput

    id: str
    """Job id."""
    rows: int = Field(ge=1, le=1000)
    """Lines."""
    cols: int = Field(ge=1, le=1000)
    """Columns."""


# ------------------------------------------------------------------------ workspaces

#: Most bytes one file read or write carries (bigger files go in several).
MAX_FILE_CHUNK = 4 * 1024 * 1024
#: Longest file path a file operation takes.
MAX_FILE_PATH = 4096


class WorkspaceCreateRequest(ControlRequest):
    """Make a workspace on the host (counted against the owner's cap)."""

    task: ClassVar[Task] = Task.WORKSPACE_CREATE
    response: ClassVar[type[Model]] = WorkspaceView

    spec: WorkspaceSpec = Field(default_factory=WorkspaceSpec)
    """What it is made of (its owner is the request's)."""
    pull: bool = True
    """False: only from an image the host holds now; one it would have to pull is refused
    at once (`not_found`), nothing made. A pull can take minutes, longer than a control
    call may hold its owner's lane: a caller that has not pulled the image first (the
    CLI's light `run --image`) asks so, and pulls on a refusal (`Fleet.pull_image`)."""


class WorkspaceDeleted(Model):
    """A workspace's end."""

    id: str
    deleted: bool
    """False when there was no such workspace (gone already)."""


class WorkspaceDeleteRequest(ControlRequest):
    """End a workspace: its processes killed, its jobs' ends recorded, its files (a fresh
    one's directory too), /tmp, HOME and cgroup removed (its kept output stays)."""

    task: ClassVar[Task] = Task.WORKSPACE_DELETE
    response: ClassVar[type[Model]] = WorkspaceDeleted

    id: str
    """The workspace."""


class WorkspaceRenewRequest(ControlRequest):
    """Mark a workspace used now: its TTL starts again."""

    task: ClassVar[Task] = Task.WORKSPACE_RENEW
    response: ClassVar[type[Model]] = WorkspaceView

    id: str
    """The workspace."""
    count: bool = False
    """Also count its disk bytes and processes."""


class WorkspaceNetworkRequest(ControlRequest):
    """Put another network policy in force in a live workspace (`bashfleet.worker.wire.network`)."""

    task: ClassVar[Task] = Task.WORKSPACE_NETWORK
    response: ClassVar[type[Model]] = WorkspaceView

    id: str
    """The workspace."""
    network: Annotated[NetworkPolicy, BeforeValidator(parse_network)]
    """The policy: `none`, `egress`, `allow=...` (`host` only for a workspace made so)."""


class WorkspaceList(Model):
    """A host's workspaces."""

    workspaces: tuple[WorkspaceView, ...] = ()


class WorkspacesRequest(ControlRequest):
    """The host's workspaces: the asker's own, or with `all_owners` (admin) all."""

    task: ClassVar[Task] = Task.WORKSPACES
    response: ClassVar[type[Model]] = WorkspaceList

    all_owners: bool = False
    """Every owner's (refused unless the message was signed with the admin key)."""


class FileChunk(Model):
    """A slice of a file of a workspace."""

    path: str
    """The file, as the workspace's calls see it."""
    offset: int
    """Where the slice starts."""
    data_b64: str
    """The bytes, base64."""
    size: int
    """The file's size."""
    eof: bool
    """The slice reaches the end of the file."""


class FileReadRequest(ControlRequest):
    """Read a regular file of a workspace as its calls see it (read as the run user);
    a FIFO, a device or a socket is refused (`special`), a read past the host's file
    deadline stopped (`timed_out`)."""

    task: ClassVar[Task] = Task.FILE_READ
    response: ClassVar[type[Model]] = FileChunk

    workspace: str
    path: str = Field(min_length=1, max_length=MAX_FILE_PATH)
    """Relative to the workspace's directory, or absolute in its calls' view."""
    offset: int = Field(0, ge=0)
    limit: int = Field(MAX_FILE_CHUNK, ge=0, le=MAX_FILE_CHUNK)


class FileWritten(Model):
    """What a write left."""

    path: str
    size: int
    """The file's size after the write."""


class FileWriteRequest(ControlRequest):
    """Write bytes to a regular file of a workspace as its calls see it (as the run
    user: its owner and mode are what a call's would be); refused as a read is."""

    task: ClassVar[Task] = Task.FILE_WRITE
    response: ClassVar[type[Model]] = FileWritten

    workspace: str
    path: str = Field(min_length=1, max_length=MAX_FILE_PATH)
    """Relative to the workspace's directory, or absolute in its calls' view."""
    data_b64: str = Field("", max_length=MAX_FILE_CHUNK * 4 // 3 + 8)
    """The bytes, base64."""
    append: bool = False
    """Append (the next chunk of a large file) instead of replacing the file."""
    mode: int | None = Field(None, ge=0, le=0o7777)
    """Permissions to give the file (None: the umask's)."""
    make_parents: bool = True
    """Make its missing parent directories."""


class TransferStarted(Model):
    """A transfer under way: its tool runs in the workspace, the data may flow."""

    path: str
    """The file or directory, as the workspace's calls see it."""


class TransferRequest(ControlRequest):
    """Stream a file or a directory (`tree`) into the workspace (`upload`) or out of it
    (`download`) as chunks on the transfer's list (`bashfleet.worker.wire.transfer`), MAC'd with
    the key that signs this request. In the workspace `cat`, `dd` or `tar` reads or
    writes them through a pipe, as the run user in its view: a download never passes
    through a file a command could replace. A tree travels as a tar; the client checks
    every member of one it receives before it writes anything.

    Answered once the tool runs (in the owner's lane); the data then moves on a thread
    of the host's own (a control thread stays free for checks), and how it ended comes
    as a `TransferOutcome` on the transfer's end list."""

    task: ClassVar[Task] = Task.TRANSFER
    response: ClassVar[type[Model]] = TransferStarted

    workspace: str
    direction: Literal["upload", "download"]
    kind: Literal["file", "tree"]
    path: str = Field(min_length=1, max_length=MAX_FILE_PATH)
    """Relative to the workspace's directory, or absolute in its calls' view."""
    mode: int | None = Field(None, ge=0, le=0o7777)
    """Permissions to give an uploaded file (None: the umask's)."""
    transfer: str = Field(pattern=TRANSFER_ID_PATTERN)
    """The transfer's id: its list, and what each chunk's MAC is bound to."""


# -------------------------------------------------------------------------- images

#: Longest a pull's answer waits for it to end (the client asks again).
MAX_PULL_WAIT_S = 10.0
#: Longest image reference (`bashfleet.worker.engine.images.image_meta` checks the rest).
MAX_IMAGE_REF = 1024


class ImageList(Model):
    """The images a host holds, least recently used first."""

    host: str
    images: tuple[ImageInfo, ...] = ()


class ImagesRequest(ControlRequest):
    """The images the host holds (what it pulled or built, for every owner)."""

    task: ClassVar[Task] = Task.IMAGES
    response: ClassVar[type[Model]] = ImageList


class ImagePull(Model):
    """A pull on a host: under way, or done (`image`)."""

    pull_id: str
    """What to ask again with until it is done."""
    host: str
    ref: str
    done: bool = False
    image: ImageInfo | None = None
    """The image, once done."""
    lines: tuple[str, ...] = ()
    """Progress lines since `ImagePullRequest.seen`."""
    seen: int = 0
    """Progress lines said so far (the next request's `seen`)."""


class ImagePullRequest(ControlRequest):
    """Pull an image onto the host unless it holds it (a pull of the same reference
    under way is joined); or, with `pull_id`, the state of a pull asked before. A failed
    pull is answered as its error (`invalid`, `not_found`, `unavailable`)."""

    task: ClassVar[Task] = Task.IMAGE_PULL
    response: ClassVar[type[Model]] = ImagePull

    ref: str = Field(min_length=1, max_length=MAX_IMAGE_REF)
    """The image reference (`registry/name:tag`, `name@sha256:...`)."""
    pull_id: str | None = Field(None, pattern=r"^[0-9a-f]{32}$")
    """A pull asked before (its answer's `pull_id`)."""
    refresh: bool = False
    """Ask the registry where a tag points now, even when the host holds the reference."""
    wait_s: float = Field(2.0, ge=0, le=MAX_PULL_WAIT_S)
    """Most seconds to wait for the pull to end before answering."""
    seen: int = Field(0, ge=0)
    """Progress lines already received (only later ones are sent)."""


class ImageRemoved(Model):
    """What removing an image did."""

    host: str
    ref: str
    removed: bool
    """False when the host held no image by that name."""


class ImageRemoveRequest(ControlRequest):
    """Remove an image from the host (admin key only: images are shared by every owner
    of the host); refused (`invalid`) while a workspace uses it."""

    task: ClassVar[Task] = Task.IMAGE_REMOVE
    response: ClassVar[type[Model]] = ImageRemoved

    ref: str = Field(min_length=1, max_length=MAX_IMAGE_REF)
    """A reference it was pulled as, `build:<dir>`, or its digest."""


class SnapshotCreateRequest(ControlRequest):
    """Snapshot a workspace of the asker's: its own layers frozen (its processes paused
    for the instant it takes, then running on)."""

    task: ClassVar[Task] = Task.SNAPSHOT_CREATE
    response: ClassVar[type[Model]] = Snapshot

    workspace: str = Field(pattern=WORKSPACE_ID_PATTERN)
    ttl_s: float | None = Field(None, gt=0, le=30 * 24 * 3600.0)
    """Seconds it lives (None: the host's default, a day)."""
    tags: Tags = Field(default_factory=dict)


class SnapshotDeleted(Model):
    id: str
    deleted: bool
    """False when the host had no such snapshot of the asker's."""


class SnapshotDeleteRequest(ControlRequest):
    """Delete a snapshot of the asker's (its layer stays while a workspace or a later
    snapshot stands on it; it is no longer listed nor usable)."""

    task: ClassVar[Task] = Task.SNAPSHOT_DELETE
    response: ClassVar[type[Model]] = SnapshotDeleted

    id: str = Field(pattern=SNAPSHOT_ID_PATTERN)


class SnapshotFetch(Model):
    """A snapshot's move between hosts: under way, or done."""

    host: str
    snapshot: str
    done: bool = False
    pushed: tuple[str, ...] = ()
    """Where the fleet's registry holds its layers (`ref@sha256:...`), newest first."""


class SnapshotFetchRequest(ControlRequest):
    """On the snapshot's host: push its layers (and those it stands on) to the fleet's
    registry; on another host: fetch them from there. Either runs on a thread of its own;
    the answer comes within `wait_s`, `done` once it is over (ask again until then)."""

    task: ClassVar[Task] = Task.SNAPSHOT_FETCH
    response: ClassVar[type[Model]] = SnapshotFetch

    id: str = Field(pattern=SNAPSHOT_ID_PATTERN)
    wait_s: float = Field(2.0, ge=0, le=MAX_PULL_WAIT_S)


class WorkspaceForks(Model):
    """What a fork made."""

    snapshot: Snapshot
    """The snapshot its forks stand on (made for them: it goes with the last of them)."""
    workspaces: tuple[WorkspaceView, ...]


class WorkspaceForkRequest(ControlRequest):
    """`n` new workspaces, each with the files a workspace of the asker's has now (a
    snapshot of it is taken for them) and none of its processes."""

    task: ClassVar[Task] = Task.WORKSPACE_FORK
    response: ClassVar[type[Model]] = WorkspaceForks

    workspace: str = Field(pattern=WORKSPACE_ID_PATTERN)
    n: int = Field(1, ge=1, le=256)
    ttl_s: float | None = Field(None, gt=0, le=30 * 24 * 3600.0)
    """Seconds each lives unused (None: the source's)."""
    tags: Tags = Field(default_factory=dict)


class WorkspaceRestoreRequest(ControlRequest):
    """Put a workspace's files back to a snapshot of it (its processes are ended)."""

    task: ClassVar[Task] = Task.WORKSPACE_RESTORE
    response: ClassVar[type[Model]] = RestoreResult

    workspace: str = Field(pattern=WORKSPACE_ID_PATTERN)
    snapshot: str = Field(pattern=SNAPSHOT_ID_PATTERN)


#: Every control request by task name (what the worker validates a message against).
REQUESTS: dict[str, type[ControlRequest]] = {
    cls.task: cls
    for cls in (
        CheckRequest, KillRequest, ReadOutputRequest, CancelRequest, DetachRequest, JobsRequest,
        WriteStdinRequest, CloseStdinRequest, ResizeRequest, WorkspaceCreateRequest,
        WorkspaceDeleteRequest, WorkspaceRenewRequest, WorkspaceNetworkRequest,
        WorkspacesRequest, FileReadRequest,
        FileWriteRequest, TransferRequest, ImagesRequest, ImagePullRequest,
        ImageRemoveRequest, SnapshotCreateRequest, SnapshotDeleteRequest,
        SnapshotFetchRequest, WorkspaceForkRequest, WorkspaceRestoreRequest,
    )
}


class ControlError(Model):
    """Why a control call failed."""

    kind: ErrorKind
    """Machine-readable class (`not_found`, `invalid`, `unauthorized`...)."""
    message: str
    """What went wrong, for a person or a model."""
    file: FileProblem | None = None
    """A workspace's file operation failed on the file itself: what was wrong with it."""


class TransferOutcome(Model):
    """How a transfer ended (the payload of its end list's one chunk)."""

    size: int = 0
    """Bytes that travelled (the file's, or the tar stream's)."""
    error: ControlError | None = None
    """Why it failed, when it did (the client raises it typed, as a control error)."""


class ControlReply(Model):
    """A control call's answer: `ok` (the response model's JSON) or `error`."""

    ok: dict[str, Any] | None = None
    """The response, when the call succeeded."""
    error: ControlError | None = None
    """The failure, when it did not."""

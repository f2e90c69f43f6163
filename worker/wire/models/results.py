"""What a call returns (`CallResult`) and what it is made of: truncation counts, the
tool's own errors, the spill, live processes, the handle of the job it started, an
interactive process waiting for input."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator

from bashfleet.worker.wire.models.base import Model, Stdin


class InputWait(Model):
    """An interactive process found blocked reading its stdin or terminal with no output
    for a while: it waits for input nobody gave yet."""

    idle_s: float
    """Seconds since the process last printed anything."""
    prompt: str
    """The last line it printed (its prompt), sanitized; empty when it printed none."""
    pid: int
    """The process that reads (host pid)."""
    command: str
    """Its command line, shortened."""


class TruncationInfo(Model):
    """Exact counts of what a stream held and what is shown of it."""

    direction: Literal["tail", "head", "middle"]
    """Which part is shown."""
    truncated: bool
    """True when anything was left out."""
    limit: Literal["lines", "bytes", "chars"] | None
    """The limit that cut the output, if any."""
    total_lines: int
    """Lines the stream held (a last line without newline counts)."""
    total_bytes: int
    """Bytes the stream held, as the command wrote them."""
    shown_lines: int
    """Lines (whole or partial) in the shown text."""
    shown_bytes: int
    """UTF-8 bytes of the shown text."""
    partial_line: bool = False
    """The shown text starts (tail) or ends (head) inside a line that was cut."""
    shown_ranges: tuple[tuple[int, int], ...] = ()
    """1-based inclusive line ranges shown: one range, or two for `middle`."""
    long_lines_cut: int = 0
    """Shown lines that were longer than the policy's `max_line_chars` and were cut to it
    (the cut characters count as left out: `truncated` is then true)."""
    binary: bool = False
    """The stream looked binary (policy `detect_binary`): no text is shown, `truncated` is
    true, and the bytes are in the spill file."""


SystemErrorKind = Literal[
    "bad_cwd", "spawn_failed", "blocked", "invalid", "worker_lost", "unavailable",
    "not_found", "internal", "unauthorized", "cancelled", "limit",
]
#: Every `SystemError_.kind` this version knows.
SYSTEM_ERROR_KINDS = frozenset(get_args(SystemErrorKind))
#: What a cancelled call's error says to a person (its kind, `cancelled`, is what a
#: reader goes by).
CANCELLED_MESSAGE = "call cancelled; its processes were killed"


class SystemError_(Model):  # noqa: N801 - avoid shadowing the builtin SystemError
    """A failure of the tool, not of the command: nothing ran, or it could not be watched."""

    kind: SystemErrorKind
    """Machine-readable class of the failure: what a reader goes by, never `message`.
    `cancelled`: the caller cancelled the call (withdrawn before it started, or its
    processes killed). `limit`: an owner's cap was reached (the call did not run)."""
    message: str
    """What went wrong, for a person or a model."""
    missing: Literal["workspace"] | None = None
    """With `not_found`: what was not there. `workspace`: the workspace the call names
    has ended (unused past its TTL, or deleted); a session makes a new one."""

    @field_validator("kind", mode="before")
    @classmethod
    def _unknown_kind_is_internal(cls, value: object) -> object:
        # A kind added by a newer version reads as `internal` here rather than making
        # the whole result unreadable.
        return value if value in SYSTEM_ERROR_KINDS else "internal"


class Spill(Model):
    """Where the full output of a call is kept, on the host that ran it."""

    host: str
    """Host id of the worker that holds the files."""
    stdout_path: str | None = None
    """Full stdout (or the combined stream)."""
    stderr_path: str | None = None
    """Full stderr (None for combined streams)."""
    stdout_bytes: int = 0
    """Size of the stdout (or combined) file."""
    stderr_bytes: int = 0
    """Size of the stderr file."""
    error: str | None = None
    """Set when the spill file could not be written whole (disk full, unwritable)."""


class ProcessInfo(Model):
    """A process of a call that is still alive, for timeout and background notices."""

    pid: int
    """Process id."""
    state: str
    """Kernel state: running, sleeping, stopped, ..."""
    cpu_s: float
    """User plus system CPU seconds used so far."""
    command: str
    """Command line, shortened."""


class JobHandle(Model):
    """A background job as a caller addresses it."""

    id: str
    """Job id: unique across hosts and time."""
    host: str
    """Host id of the worker that owns the job."""
    pid: int
    """Process id of the job's bash, as the calls of its workspace see it."""
    pgid: int
    """Process group id: `kill -9 -<pgid>` from a call of its workspace ends the job."""
    output_path: str
    """File receiving the job's output, on `host`: the same path in the calls of its
    workspace (read-only there)."""
    stderr_path: str | None = None
    """File receiving its stderr, when it keeps stderr apart (None: in `output_path`)."""
    stdin: Stdin = "null"
    """The job's standard input: `pipe` or `pty` take `write_stdin`."""
    host_pid: int | None = None
    """Its bash's pid on the host (None: the same as `pid`)."""
    workspace: str | None = None
    """The workspace it runs in."""


class CallResult(Model):
    """What a call returns: small (a few KB) whatever the command printed."""

    call_id: str
    """The call's id."""
    host: str
    """Host id of the worker that ran it."""
    exit_code: int | None = None
    """The command's exit status; None when it died by signal, timed out, or never ran."""
    signal: int | None = None
    """Number of the signal that ended the command, if one did."""
    timed_out: bool = False
    """True when the timeout passed (then killed or backgrounded)."""
    cancelled: bool = False
    """True when the caller cancelled the call before it ended; its processes were killed."""
    backgrounded: bool = False
    """True when the command is still running as a background job."""
    error: SystemError_ | None = None
    """A system error: the tool failed, as opposed to the command."""
    combined: bool = False
    """True when `stdout` holds stdout and stderr interleaved."""
    stdout: str = ""
    """Shown stdout (or combined output), sanitized, redacted and truncated."""
    stderr: str = ""
    """Shown stderr, sanitized, redacted and truncated."""
    stdout_truncation: TruncationInfo | None = None
    """Counts for `stdout`."""
    stderr_truncation: TruncationInfo | None = None
    """Counts for `stderr`."""
    spill: Spill | None = None
    """Where the full output is, when it was kept."""
    job: JobHandle | None = None
    """The background job, when the call started one or was backgrounded."""
    error_digest: tuple[str, ...] = ()
    """Error-looking lines from the part of the output that was cut."""
    processes: tuple[ProcessInfo, ...] = ()
    """Processes of the call alive at its timeout: what a kill ended, or what runs on."""
    limit_hit: Literal["memory", "cpu_time", "file_size", "processes", "output"] | None = None
    """The per-call resource limit that ended the command, if one did."""
    last_output_age_s: float | None = None
    """Seconds since the call last wrote output, at its timeout (None: it never wrote)."""
    duration_s: float = 0.0
    """Wall time of the call on the worker."""
    cwd: str | None = None
    """Working directory the command ran in."""
    cwd_after: str | None = None
    """Working directory the command ended in (only with `capture_state`)."""
    env_changes: dict[str, str] = Field(default_factory=dict)
    """Variables the command exported or changed (only with `capture_state`)."""
    env_removed: tuple[str, ...] = ()
    """Variables the command unset (only with `capture_state`)."""
    input_wait: InputWait | None = None
    """An interactive call whose process waits for input (and has shown its prompt)."""
    network_denied: tuple[str, ...] = ()
    """What the workspace's network policy refused since its last call's result (`allow`:
    names, `name:port`, `address:port/proto`; at most 10, then `+N more`)."""
    read_offset: int | None = None
    """Interactive calls: the byte offset of the job's output this result showed up to
    (the next read starts there)."""

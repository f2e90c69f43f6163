"""The wire contract: every model that crosses Redis, a process or the CLI's --json.

All models forbid unknown fields so a typo in a caller fails loudly instead of being
ignored, and every field says what it means. Models are JSON-only (never pickle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, cast, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticKnownError

if TYPE_CHECKING:
    from pydantic_core.core_schema import ErrorType

from bashfleet.worker.wire.network import NetworkPolicy, parse

#: Largest command accepted, in bytes of UTF-8. The `modes` dialect asks agents for
#: < 60k tokens; 1 MiB leaves room for heredocs while keeping messages small on Redis.
MAX_COMMAND_BYTES = 1024 * 1024

#: Longest working directory path accepted (Linux's PATH_MAX).
MAX_PATH_CHARS = 4096

#: Longest timeout any call may ask for: the `modes` dialect's background mode runs 24 hours.
MAX_TIMEOUT_S = 24 * 60 * 60.0

#: A workspace id: `w` and 15 hex digits, unique across hosts and time.
WORKSPACE_ID_PATTERN = r"^w[0-9a-f]{15}$"
#: A snapshot's id (`bashfleet.worker.engine.snapshots.snapshots.new_id`).
SNAPSHOT_ID_PATTERN = r"^s[0-9a-f]{15}$"

#: What an owner may be: a session (`session:<id>`), a user (`user:<name>`), a tenant.
OWNER_PATTERN = r"^[A-Za-z0-9_.:@-]{0,128}$"

#: Variables that make bash, or the loader under it, run code of their own: a call may
#: not set them (nor a session carry them), whoever sent it.
CODE_VARIABLES = frozenset(
    {"BASH_ENV", "ENV", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS", "IFS", "PS4"}
)
#: Prefixes of such variables: exported functions and the dynamic loader's settings.
CODE_VARIABLE_PREFIXES = ("BASH_FUNC_", "LD_")


def runs_code(name: str) -> bool:
    """True for a variable a call may not set: BASH_ENV, ENV, BASH_FUNC_*, LD_*,
    PROMPT_COMMAND, SHELLOPTS, BASHOPTS, IFS, PS4."""
    return name in CODE_VARIABLES or name.startswith(CODE_VARIABLE_PREFIXES)


#: Most tags a call or job carries; the longest tag name and value.
MAX_TAGS = 16
MAX_TAG_NAME_CHARS = 64
MAX_TAG_VALUE_CHARS = 256
_TAG_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def _tags_are_sane(tags: dict[str, str]) -> dict[str, str]:
    """Tags an orchestrator gives a job (`{"agent": "a17"}`): few, short, one line each,
    names that a `--tag NAME=VALUE` filter can spell."""
    if len(tags) > MAX_TAGS:
        raise ValueError(f"at most {MAX_TAGS} tags, not {len(tags)}")
    for name, value in tags.items():
        if not name or len(name) > MAX_TAG_NAME_CHARS or not set(name) <= _TAG_NAME_CHARS:
            raise ValueError(
                f"invalid tag name {name!r}: use 1-{MAX_TAG_NAME_CHARS} letters, digits, "
                "'.', '_' or '-'"
            )
        if len(value) > MAX_TAG_VALUE_CHARS or any(c in value for c in "\x00\n\r"):
            raise ValueError(
                f"invalid value of tag {name!r}: one line of at most {MAX_TAG_VALUE_CHARS} "
                "characters"
            )
    return tags


Tags = Annotated[dict[str, str], AfterValidator(_tags_are_sane)]
"""Tags of a call and of the job it starts: name -> value."""

AskedNetwork = Annotated[NetworkPolicy | None, BeforeValidator(parse)]
"""A network policy a caller asks for (`bashfleet.worker.wire.network`): a policy, its spelling
(`none`, `egress`, `host`, `allow=a.com,10.1.0.0/16`) or an older caller's bool (False:
`none`, True: the host's default). None: the host's default."""
KeptNetwork = Annotated[NetworkPolicy, BeforeValidator(
    lambda value: parse(value, legacy_true="host"))]
"""A workspace's network policy as its host keeps it (an older record's True: it shared
the host's namespace)."""


class Model(BaseModel):
    """Base of every wire model: strict about unknown fields, immutable once built.

    A model's validators and serializers are built at its first use, not at import
    (`defer_build`): a process builds those of the models it uses (a CLI's `run` a few
    of the hundred), and importing the wire costs a third of what it would."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


# --------------------------------------------------------------------------- policies


class TailLines(Model):
    """Keep the end of a stream: at most `max_lines` lines and `max_bytes` bytes."""

    kind: Literal["tail_lines"] = "tail_lines"
    max_lines: int = Field(2000, ge=1)
    """Most lines shown (the `pipe` dialect: 2000)."""
    max_bytes: int = Field(50 * 1024, ge=1)
    """Most bytes of UTF-8 shown (the `pipe` dialect: 51,200)."""


class Middle(Model):
    """Past `max_bytes`, keep only the first and last `keep_bytes` (the `modes` dialect)."""

    kind: Literal["middle"] = "middle"
    max_bytes: int = Field(128 * 1024, ge=1)
    """Output up to this size is shown whole."""
    keep_bytes: int = Field(4 * 1024, ge=1)
    """Bytes kept at each end when the output is larger."""


class CharCap(Model):
    """Keep the first `max_chars` characters (the `claude` dialect: 30,000)."""

    kind: Literal["char_cap"] = "char_cap"
    max_chars: int = Field(30_000, ge=1)
    """Most characters shown."""


class ByteTail(Model):
    """Keep the last `max_bytes` bytes, never splitting a UTF-8 character (the `pi` dialect)."""

    kind: Literal["byte_tail"] = "byte_tail"
    max_bytes: int = Field(50 * 1024, ge=1)
    """Most bytes of UTF-8 shown."""


class HeadTailTokens(Model):
    """Past `max_tokens` tokens (a token is 4 bytes), keep half of those bytes from the
    head and half from the tail, at UTF-8 boundaries, with `…N tokens truncated…` between
    them (N: tokens left out) (codex)."""

    kind: Literal["head_tail_tokens"] = "head_tail_tokens"
    max_tokens: int = Field(10_000, ge=0)
    """Most tokens shown."""


Truncation = Annotated[
    TailLines | Middle | CharCap | ByteTail | HeadTailTokens, Field(discriminator="kind")
]


class InterceptRule(Model):
    """Refuse commands that another tool does better (the `pi` dialect's interceptor)."""

    pattern: str
    """Regular expression searched in the normalized command."""
    tool: str
    """The tool the agent should use instead."""
    message: str
    """Why the command is refused; shown after `Blocked: `."""


#: The `pi` dialect's default interception rules: commands a dedicated tool does better.
#: Data of the wire contract, so a dialect (client side) can put them in its policy.
DEFAULT_INTERCEPT_RULES: tuple[InterceptRule, ...] = (
    InterceptRule(
        pattern=r"^\s*(cat|head|tail|less|more)\s+[^|;&<>]+$",
        tool="read",
        message="Use the read tool to read files instead of cat/head/tail.",
    ),
    InterceptRule(
        pattern=r"^\s*(grep|rg|ag|ack)\s",
        tool="grep",
        message="Use the grep tool to search file contents instead of grep/rg.",
    ),
    InterceptRule(
        pattern=r"^\s*(find|fd)\s",
        tool="find",
        message="Use the find tool to find files instead of find/fd.",
    ),
    InterceptRule(
        pattern=r"(^|[;&|]\s*)(sed\s+(-[a-zA-Z]*i|--in-place)|perl\s+-[a-zA-Z]*i|awk\s+-i\s+inplace)",
        tool="edit",
        message="Use the edit tool to change files instead of in-place editors.",
    ),
    InterceptRule(
        pattern=r"^\s*(echo|printf|cat)\b[^|]*(>|>>)\s*[\w./~-]+\s*$|<<-?\s*['\"]?\w+['\"]?\s*>",
        tool="write",
        message="Use the write tool to create files instead of shell redirection.",
    ),
)


class Policy(Model):
    """How one dialect wants a call run and its output shaped."""

    name: str = "native"
    """Dialect name, for logs and notices."""
    streams: Literal["separate", "combined"] = "separate"
    """`separate`: stdout and stderr apart; `combined`: one stream in arrival order."""
    truncation: Truncation = Field(default_factory=TailLines)
    """How shown output is cut."""
    digest_errors: bool = False
    """List error-looking lines from the part that was cut (native dialect)."""
    default_timeout_s: float = Field(120.0, gt=0, le=MAX_TIMEOUT_S)
    """Timeout when the call gives none."""
    max_timeout_s: float = Field(MAX_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S)
    """Largest timeout a foreground call may ask for; larger ones are refused."""
    background_timeout_s: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S)
    """A background job is ended (group SIGTERM, grace, SIGKILL) after this; None: never."""
    on_timeout: Literal["kill", "background"] = "background"
    """`kill`: end the process group; `background`: leave it running as a job."""
    kill_grace_s: float = Field(2.0, ge=0, le=60)
    """Seconds between SIGTERM and SIGKILL when a call is killed."""
    spill_min_bytes: int = Field(0, ge=0)
    """Keep the spill file only when output was cut and is larger than this (`pipe`: 50 KB)."""
    lift_head_tail: bool = False
    """Lift a trailing `| head -n N` / `| tail -n N` into limits (`pi`)."""
    intercept: tuple[InterceptRule, ...] = ()
    """Commands to refuse, with the tool to use instead (`pi`)."""
    available_tools: tuple[str, ...] = ()
    """Tools the agent has; an intercept rule only blocks when its tool is among them."""
    detect_binary: bool = False
    """Show a stream whose first 8 KiB look binary (a NUL byte, or mostly invalid UTF-8
    and control bytes) as a count of its bytes, not as text; its spill file is kept
    (native)."""
    reveal_invisible: bool = False
    """Show bidirectional controls and zero-width characters as `<U+202E>` markers, so the
    text a model reads is the text the bytes hold (native)."""
    last_frame: bool = False
    """A line rewritten with carriage returns (a progress bar) shows only its last frame
    (native)."""
    max_line_chars: int | None = Field(None, ge=1)
    """Lines longer than this many characters are cut to it, and the cut is counted, so
    one minified line cannot fill the output budget (native: 2000). None: no cap."""


# ------------------------------------------------------------------------------ calls

Isolation = Literal["none", "process", "strict"]
"""How a call is sandboxed, weakest first. `none`: plain `bash -c`; `process`: its own
PID namespace and /proc, the worker's state and secrets hidden; `strict`: also a
read-only root with writable workspace paths, a private /tmp and no network."""

Stdin = Literal["null", "closed", "pipe", "pty"]
"""A call's standard input. `null`: /dev/null, the call runs to its end or timeout as
always. The others make it an interactive session (a job of its own supervisor, whose
output is read as it comes): `closed`: stdin is /dev/null but the process keeps running
past the call's wait (codex `tty: false`); `pipe`: a pipe the fleet writes to
(`write_stdin`); `pty`: a pseudo-terminal, its controlling terminal, stdout and stderr in
one stream (Ctrl-C, window size, prompts that read /dev/tty)."""

#: Longest shell name or path a call may ask for, and what it is spelled with.
MAX_SHELL_CHARS = 256
SHELL_PATTERN = r"^[A-Za-z0-9_./+-]+$"

#: Longest session id a call may carry.
MAX_SESSION_CHARS = 64

#: What a call holds these fields of `CallOptions` to, as `Field` constraints would:
#: `Call` applies them, since on the fields themselves they would hold a request too.
_CALL_CONSTRAINTS: dict[str, TypeAdapter[str]] = {
    "command": TypeAdapter(Annotated[str, Field(min_length=1)]),
    "session": TypeAdapter(Annotated[str, Field(max_length=MAX_SESSION_CHARS)]),
    "shell": TypeAdapter(
        Annotated[str, Field(max_length=MAX_SHELL_CHARS, pattern=SHELL_PATTERN)]),
}


def _constrained(field: str, value: str) -> str:
    """`value` held to a call's constraints of `field` (`_CALL_CONSTRAINTS`): what breaks
    one raises pydantic's own error (`string_too_long`, `string_unicode` for a lone
    surrogate...), as the constraint on the field would."""
    try:
        return _CALL_CONSTRAINTS[field].validate_python(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise PydanticKnownError(cast("ErrorType", error["type"]), error.get("ctx")) from None


class TermSize(Model):
    """A terminal's window size."""

    rows: int = Field(24, ge=1, le=1000)
    """Lines."""
    cols: int = Field(80, ge=1, le=1000)
    """Columns."""


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


class CallOptions(Model):
    """What a call asks for, meant the same way by the caller who asks (`RunRequest`) and
    by the worker that runs it (`Call`): the fields both declare, declared here once.

    A request holds any text in `command`, `cwd`, `env`, `session` and `shell`; the
    checks of those belong to the call, so a bad one is refused when the call is built
    from the request (a CallRejected in the client, `invalid` on a worker), wherever
    the request was made (a dialect, the MCP server, `Fleet.run`).
    """

    command: str
    """Run as `bash -c COMMAND`. Its call refuses an empty command, a NUL byte and more
    than MAX_COMMAND_BYTES."""
    cwd: str | None = None
    """Working directory on the host; it must exist and be a directory. None: the
    session's, else the request's `default_cwd`, else the worker's home."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables set on top of the scrubbed environment (a session's, for example); none
    that makes bash or the loader run code of its own (`runs_code`)."""
    unset_env: tuple[str, ...] = ()
    """Variables removed from the environment (a session's earlier `unset`)."""
    capture_state: bool = False
    """Report the working directory and exported variables the command ends with
    (sessions)."""
    head: int | None = Field(None, ge=0)
    """Show only the first N lines of the shaped output (the `pi` dialect's `head`)."""
    tail: int | None = Field(None, ge=0)
    """Show only the last N lines of the shaped output (the `pi` dialect's `tail`)."""
    isolation: Isolation | None = None
    """Sandbox of the call: `none`, `process` or `strict` (see `Isolation`); None: the
    host's default. Stronger than the host's default is granted, weaker is refused."""
    network: AskedNetwork = None
    """The network policy of its throwaway workspace (`none`, `egress`, `allow=...`,
    `host`; or of the workspace it names, which must match). None: the host's default
    (`strict`: `none` unless the host's `sandbox_network`). Refused (`invalid`) when
    asking for more than the host grants."""
    session: str | None = None
    """Session id: the call runs in the session's shell (its pinned host, cwd and
    variables, which the client fills in) and what it changes there holds for the
    session's next call; workers name it in logs and Flower. At most MAX_SESSION_CHARS."""
    tags: Tags = Field(default_factory=dict)
    """Tags of the job the call starts, if it starts one (`{"agent": "a17"}`): `jobs()`,
    `ps --tag` and job events carry them and filter by them."""
    stdin: Stdin = "null"
    """Standard input (see `Stdin`): anything but `null` makes the call an interactive
    session that waits at most its timeout (its yield), returns earlier when the process
    ends or waits for input, and otherwise goes on as a job one can write to
    (`write_stdin`)."""
    term_size: TermSize | None = None
    """The PTY's window size (`stdin="pty"`); None: 24x80."""
    shell: str | None = None
    """Shell that runs an interactive session's command (`SHELL -c COMMAND`): a name or
    path of letters, digits and `_./+-`, at most MAX_SHELL_CHARS; None: bash."""
    login: bool = False
    """Run an interactive session's shell as a login shell (`-l`): profiles are read."""
    workspace: str | None = Field(None, pattern=WORKSPACE_ID_PATTERN)
    """The workspace it runs in, on its host (`Workspace.run`, `--workspace W`); None: a
    session's own workspace, else a throwaway one, made for the call and removed once it
    and its jobs end."""


class Call(CallOptions):
    """One bash call, as the client sends it and a worker runs it: the options asked
    for, checked, and what the client decided (its id, timeout, owner and policy)."""

    call_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    """Unique id of this call; names its spill files and records."""
    timeout_s: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S)
    """Seconds before the policy's timeout action; None: the policy's default."""
    background: bool = False
    """Start detached and return at once with a job handle."""
    policy: Policy = Field(default_factory=Policy)
    """The dialect's policy."""
    owner: str = Field("", pattern=OWNER_PATTERN)
    """Who the call, and the job it starts, belong to (an MCP session, a tenant): only
    the same owner (or an admin) may check, read or kill that job."""
    input_wait_s: float = Field(2.0, ge=0.05, le=3600)
    """An interactive session's process blocked reading its input with no output for this
    long is reported as waiting for input (and the call returns)."""

    # The call's checks of fields a request leaves unchecked (see `CallOptions`).

    @field_validator("command")
    @classmethod
    def _command_is_sane(cls, value: str) -> str:
        value = _constrained("command", value)
        if "\x00" in value:
            raise ValueError("command contains a NUL byte, which bash cannot receive")
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_COMMAND_BYTES:
            raise ValueError(
                f"command is {size} bytes; the limit is {MAX_COMMAND_BYTES}: "
                "write long scripts to a file and run the file"
            )
        if not value.strip():
            raise ValueError("command is empty")
        return value

    @field_validator("cwd")
    @classmethod
    def _cwd_is_sane(cls, value: str | None) -> str | None:
        if value is not None and ("\x00" in value or len(value) > MAX_PATH_CHARS):
            raise ValueError("cwd must be a path without NUL bytes, at most 4096 characters")
        return value

    @field_validator("env")
    @classmethod
    def _env_is_sane(cls, value: dict[str, str]) -> dict[str, str]:
        for name, val in value.items():
            if not name or "=" in name or "\x00" in name or "\x00" in val:
                raise ValueError(f"invalid environment variable {name!r}")
            if runs_code(name):
                raise ValueError(
                    f"environment variable {name} is refused: it makes bash (or the "
                    "dynamic loader) run code before the command does"
                )
        return value

    @field_validator("session")
    @classmethod
    def _session_is_sane(cls, value: str | None) -> str | None:
        return None if value is None else _constrained("session", value)

    @field_validator("shell")
    @classmethod
    def _shell_is_sane(cls, value: str | None) -> str | None:
        return None if value is None else _constrained("shell", value)


Mode = Literal["default", "slow", "background"]
"""`default`: the policy's timeout; `slow`: 15 minutes unless a timeout is given (the
`modes` dialect's slow mode); `background`: start detached and return the job at once."""

#: Timeout of `mode="slow"`: 15 minutes, the `modes` dialect's slow commands.
SLOW_TIMEOUT_S = 15 * 60.0


class RunRequest(CallOptions):
    """One bash call as a caller asks for it: what every runner takes (the fleet, the
    dialects' runners, the MCP server's). `Fleet.run(command, **options)` builds one;
    `bashfleet.client._core.messages.build_call` makes its `Call`."""

    host: str | None = None
    """Host to run on; None: any live host (or the session's pinned host)."""
    label: str | None = None
    """Run on any live host with this pool label."""
    mode: Mode = "default"
    """`default`, `slow` or `background` (see `Mode`)."""
    timeout: float | None = None
    """Seconds before the policy's timeout action (the call's `timeout_s`); None: the
    mode's or policy's default."""
    default_cwd: str | None = None
    """Working directory when neither `cwd` nor the session's shell gives one (where a
    fresh session starts)."""
    policy: Policy | None = None
    """The dialect's policy; None: the native one."""
    call_id: str | None = None
    """The call's id (None: a fresh one); lets another thread cancel the call."""
    input_wait_s: float | None = None
    """Seconds blocked on input without output before a session is reported as waiting
    for input; None: the call's default (2)."""

    @field_validator("mode", mode="before")
    @classmethod
    def _mode_is_known(cls, value: object) -> object:
        if value not in ("default", "slow", "background"):
            raise ValueError(f"mode must be default, slow or background, not {value!r}")
        return value


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


# ------------------------------------------------------------------------------- jobs


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


# ------------------------------------------------------------------------------ fleet


class HostInfo(Model):
    """A worker host as the fleet registry knows it (`bashfleet hosts`)."""

    host: str
    """Host id."""
    alive: bool
    """True while the worker's heartbeat is fresh (it expires seconds after a crash)."""
    ready: bool = False
    """True once both of its consumers (commands and control) take messages."""
    slots: int = 0
    """Command slots (the worker's concurrency)."""
    busy: int = 0
    """Command slots running a call now."""
    queued: int = 0
    """Calls waiting in the host's own command queue (`bashfleet.<host>.exec`, every
    priority) for a free slot. Calls sent to the any or pool queues are not counted."""
    labels: tuple[str, ...] = ()
    """Pool labels: the worker also serves `bashfleet.pool.<label>.exec`."""
    version: str = ""
    """bashfleet version of the worker."""
    pid: int | None = None
    """Process id of the worker's supervisor, on its machine."""
    machine: str = ""
    """Name of the machine the worker runs on."""
    started_at: float | None = None
    """When the worker started (seconds since the epoch, its clock)."""
    heartbeat_at: float | None = None
    """Its last heartbeat (seconds since the epoch, its clock)."""
    sandbox: SandboxProbe | None = None
    """The isolation its calls get (default level, bubblewrap, cgroups, run-as user);
    None when the host's record carries no probe that reads as one."""


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


class SandboxProbe(Model):
    """What sandbox a host gives its calls (`bashfleet.worker.engine.sandbox.probe`), for
    `hosts`."""

    isolation: Isolation
    """Default isolation of this host's calls (what `auto` resolved to)."""
    configured: Literal["auto", "none", "process", "strict"] = "auto"
    """The host's `isolation` setting."""
    bwrap: str | None = None
    """bubblewrap's version when it works here, e.g. `0.8.0`."""
    problem: str | None = None
    """Why calls run without a sandbox (bubblewrap missing or failing), when they do."""
    cgroup: Literal["v2", "v1"] | None = None
    """The cgroup version calls get a cgroup of their own with; None: ulimit only."""
    cgroup_problem: str | None = None
    """Why calls get no cgroup of their own, when they do not."""
    run_as: str | None = None
    """User the calls run as (None: the worker's own user)."""
    tenancy: Literal["multi", "single"] = "single"
    """`multi`: each workspace has a user namespace mapped to host ids of its own (calls
    are root inside, an id no other workspace has outside); `single`: one uid for every
    workspace (a worker that is not root, or no subordinate ids for the run user)."""
    id_slots: int = 0
    """Workspaces this host can give ids of their own at once (`multi`)."""
    id_range: str | None = None
    """`start:count`: the host ids the operator gave this worker (None: all of the run
    user's subordinate ids)."""
    id_problem: str | None = None
    """Why its workspaces' ids may not be the machine's alone (a container's own lock
    directory and no range of its own), when they may not."""
    network: str = ""
    """Its workspaces' default network policy (`egress`, `none`, `host`)."""
    network_host: bool = False
    """Workspaces may ask for the host's own network namespace (`network_host_ok`)."""
    network_problem: str | None = None
    """Why this host cannot filter workspaces' networks (`egress` and `allow` refused)."""
    seccomp: str = ""
    """The system call filter of its sandboxed calls (`default`: containers-common's
    profile; `unconfined`); empty: calls run unsandboxed, or a worker that does not say."""
    layers: str = ""
    """How a workspace's `/` is made: `overlay` (its own upper layer over the host's
    directories, bound read-only with the host's ids, never idmapped; or over an image),
    `read-only host` (the host's root read-only around its directory); empty: calls run
    unsandboxed, or a worker that does not say."""



class WorkspaceLimits(Model):
    """What a workspace's processes may use together (None: the host's default)."""

    memory_mb: int | None = Field(None, ge=1)
    """Memory of all its processes (a cgroup where the host makes them)."""
    procs: int | None = Field(None, ge=1)
    """Processes and threads at once."""
    cpus: float | None = Field(None, gt=0)
    """CPUs' worth of time (throttled past it)."""
    disk_mb: int | None = Field(None, ge=1)
    """Bytes on disk: its directory, /tmp, HOME and kept output (past it: a notice on
    every call, background jobs stopped, new ones refused)."""
    open_files: int | None = Field(None, ge=16, le=1 << 20)
    """Files and sockets each of its processes may hold open (RLIMIT_NOFILE, soft and
    hard; the host's `limit_open_files`, 4096 by default, is the most)."""


class WorkspaceSpec(Model):
    """What a caller asks for when it makes a workspace."""

    owner: str = Field("", pattern=OWNER_PATTERN)
    """Who it belongs to (inside the signed message)."""
    path: str | None = Field(None, max_length=MAX_PATH_CHARS)
    """An existing host directory under a root the host allows; None: a fresh one."""
    isolation: Isolation | None = None
    """At least the host's level (None: the host's)."""
    network: AskedNetwork = None
    """Its network policy (`bashfleet.worker.wire.network`): `none`, `egress`, `allow=[...]` or
    `host`; None: the host's default."""
    ttl_s: float | None = Field(None, gt=0, le=30 * 24 * 3600.0)
    """Seconds it lives unused before the host reaps it (None: the host's default)."""
    limits: WorkspaceLimits = Field(default_factory=WorkspaceLimits)
    """Caps of its processes and disk (lower than the host's, never higher)."""
    mounts: dict[str, str] = Field(default_factory=dict)
    """Absolute paths in its calls' view -> subdirectories of the workspace
    (`{"/logs": "logs"}`): Harbor's `/logs`, `/tests`, `/solution`."""
    session: str | None = Field(None, max_length=128)
    """The session it serves, when it is one's."""
    tags: Tags = Field(default_factory=dict)
    """Tags, for listings."""
    near: str | None = Field(None, max_length=MAX_PATH_CHARS)
    """A directory it is made for (a session's first cwd): when no `path` is given and
    this one is under a root the host allows, the project directory holding it (the
    root's child) is the workspace's directory; else a fresh one."""
    image: str | None = Field(None, max_length=1024)
    """An OCI image reference (`python:3.12-slim`, `reg.example:5000/app@sha256:...`): its
    root filesystem is the workspace's `/` (None: the host's own root)."""
    build: str | None = Field(None, max_length=MAX_PATH_CHARS)
    """A directory on the workspace's host holding a Dockerfile: built there, and the
    image it makes is the workspace's `/`."""
    build_network: AskedNetwork = None
    """The network its build's RUN steps get (`none`, `egress`; `host` where the host
    allows it); None: `egress`. Not the workspace's own (`network`)."""
    user: str | None = Field(None, max_length=256)
    """Who its calls run as inside (a name or uid[:gid]; None: the image's USER, else root)."""
    snapshot: str | None = Field(None, pattern=SNAPSHOT_ID_PATTERN)
    """A snapshot it is made from: its files are the snapshot's (over the snapshot's own
    image or host root, which `image`, `build` and `path` may not change), its processes
    none."""


class ImageInfo(Model):
    """An image as a host holds it (pinned by digest; `bashfleet images ls`)."""

    ref: str
    """The reference it was asked by."""
    digest: str
    """Its manifest's digest (`sha256:...`): what a workspace record pins."""
    host: str = ""
    size_bytes: int = 0
    env: list[str] = Field(default_factory=list)
    """Its config's `ENV` (`NAME=value`)."""
    workdir: str = ""
    user: str = ""
    shell: str = "bash"
    """`bash` where the image has bash, else `sh`."""
    pulled_at: float = 0.0
    last_used_at: float | None = None
    refs: list[str] = Field(default_factory=list)
    """Every reference this host holds it under (canonical spelling; `build:<dir>` for
    one built from a Dockerfile)."""


class WorkspaceRecord(Model):
    """A workspace as its host keeps it (its disk record; sealed in Redis)."""

    id: str = Field(pattern=WORKSPACE_ID_PATTERN)
    """Unique across hosts and time."""
    host: str
    """The host it lives on."""
    owner: str = ""
    """Who it belongs to."""
    path: str
    """Its directory: the same path on the host and in its calls' view; a call's default
    cwd."""
    fresh: bool
    """Made by the worker (removed with the workspace), not an existing directory."""
    out_dir: str
    """Where its calls' kept output and its jobs' output go (read-only in its view)."""
    isolation: Isolation
    """Its sandbox: `none` (a directory only), `process` or `strict`."""
    network: KeptNetwork
    """Its network policy, in force (`bashfleet.worker.wire.network`)."""
    ttl_s: float
    """Seconds unused before it is reaped."""
    created_at: float
    """Wall clock time it was made."""
    limits: WorkspaceLimits = Field(default_factory=WorkspaceLimits)
    """Its caps as granted."""
    mounts: dict[str, str] = Field(default_factory=dict)
    """View path -> host directory bound there."""
    session: str | None = None
    """The session it serves."""
    tags: Tags = Field(default_factory=dict)
    """Tags given when it was made."""
    throwaway: bool = False
    """Made for one call without a session: removed once that call and its jobs end."""
    keeper_pid: int | None = None
    """Host pid of its keeper (pid 1 of its namespaces); None: not sandboxed."""
    keeper_start: float | None = None
    """Start time of the keeper (pid reuse guard)."""
    socket_path: str | None = None
    """The keeper's socket (in the host's state directory)."""
    cgroup: tuple[str, ...] = ()
    """Its cgroup directories."""
    run_as: str | None = None
    """The user its calls run as."""
    image: ImageInfo | None = None
    """The image its `/` is made of (None: the host's root)."""
    ids: tuple[int, int] | None = None
    """(first host id, count) its user namespace maps (None: single-tenant host)."""
    user: str | None = None
    """Who its calls run as inside (None: the image's USER, else root)."""
    home: str | None = None
    """Its calls' HOME inside (ids per workspace): the home its user has in its root's
    /etc/passwd (root's /root)."""
    lowers: tuple[str, ...] = ()
    """The snapshots its files stand on, newest first
    (`bashfleet.worker.engine.snapshots.snapshots`): each a read-only layer under its own, over its
    image or the host's root."""
    dir: str | None = None
    """The host directory behind `path` when they differ: a workspace made from a
    snapshot shows its source's `path`, and keeps what it changes there in a directory
    of its own."""

    def host_dir(self) -> str:
        """Where its directory's files are on the host."""
        return self.dir or self.path


class WorkspaceView(Model):
    """A workspace as a client sees it (`Fleet.workspace`, `bashfleet workspace ls`)."""

    id: str
    host: str
    owner: str = ""
    path: str
    """Its directory (the same path on its host and in its calls)."""
    isolation: Isolation
    network: KeptNetwork
    """Its network policy, in force."""
    ttl_s: float
    created_at: float
    last_used_at: float | None = None
    """When a call, control call or file operation last used it."""
    expires_at: float | None = None
    """When it is reaped unless used before."""
    session: str | None = None
    tags: Tags = Field(default_factory=dict)
    limits: WorkspaceLimits = Field(default_factory=WorkspaceLimits)
    disk_bytes: int | None = None
    """Bytes it holds on disk, when counted."""
    processes: int | None = None
    """Processes running in it, when counted."""
    run_as: str | None = None
    """The user its calls run as."""
    image: str | None = None
    """The image reference its `/` is made of, with its digest (None: the host's root)."""
    snapshot: str | None = None
    """The snapshot its files were made from, when one (`fork`, `snapshot=`, `restore`)."""



class SnapshotRecord(Model):
    """A snapshot as its host keeps it: a workspace's own layers, frozen read-only, and
    what they stand on (`bashfleet.worker.engine.snapshots.snapshots`)."""

    id: str = Field(pattern=SNAPSHOT_ID_PATTERN)
    host: str
    """The host whose disk holds it (others fetch it through the fleet's registry)."""
    owner: str = ""
    workspace: str = Field(pattern=WORKSPACE_ID_PATTERN)
    """The workspace it was taken of."""
    created_at: float
    ttl_s: float
    """Seconds it lives from `created_at` (a workspace standing on it keeps its layer)."""
    bytes: int = 0
    """Bytes its own layer holds."""
    tags: Tags = Field(default_factory=dict)
    layers: tuple[str, ...]
    """Its own id, then the snapshots its workspace stood on, newest first: the lower
    layers of a workspace made from it, over its base."""
    path: str
    """Its workspace's directory, in the view: a workspace made from it shows it there."""
    image: ImageInfo | None = None
    """The image its layers stand on (None: the host's root)."""
    user: str | None = None
    home: str | None = None
    limits: WorkspaceLimits = Field(default_factory=WorkspaceLimits)
    isolation: Isolation = "strict"
    network: Annotated[NetworkPolicy, BeforeValidator(parse)] = NetworkPolicy()
    mounts: dict[str, str] = Field(default_factory=dict)
    """View path -> subdirectory of its directory (relative)."""
    hidden: bool = False
    """Made by `fork` for its forks: not listed; it goes with the last of them."""
    deleted: bool = False
    """Deleted by its owner while workspaces still stand on it: unlisted, its layer kept
    until the last of them ends."""
    pushed: str | None = None
    """Where the fleet's registry holds its layer (`ref@sha256:...`), once pushed."""

    @property
    def expires_at(self) -> float:
        return self.created_at + self.ttl_s

    def base(self) -> str:
        """What its layers stand on: `host` (the host's root) or the image's `ref@digest`."""
        return "host" if self.image is None else f"{self.image.ref}@{self.image.digest}"

    def as_snapshot(self, paused_ms: float | None = None) -> Snapshot:
        """The snapshot as a client sees it."""
        return Snapshot(
            id=self.id, host=self.host, workspace=self.workspace, owner=self.owner,
            created_at=self.created_at, expires_at=self.expires_at, bytes=self.bytes,
            base=self.base(), path=self.path, tags=self.tags, pushed=self.pushed,
            paused_ms=paused_ms,
        )


class Snapshot(Model):
    """A snapshot as a client sees it (`Workspace.snapshot`, `bashfleet snapshot ls`)."""

    id: str
    host: str
    workspace: str
    owner: str = ""
    created_at: float
    expires_at: float
    bytes: int = 0
    base: str = "host"
    """`host` (the host's root) or the image's `ref@sha256:...` its layers stand on."""
    path: str = ""
    """The directory a workspace made from it has (its source's)."""
    tags: Tags = Field(default_factory=dict)
    pushed: str | None = None
    """Its layer in the fleet's registry, once another host asked for it."""
    paused_ms: float | None = None
    """How long its source's processes were paused while it was taken (when it was)."""


class RestoreResult(Model):
    """What `Workspace.restore` did."""

    workspace: str
    snapshot: str
    ended: int
    """Processes of the workspace that were running and were ended (its files went back
    to the snapshot's; none of its processes survive a restore)."""

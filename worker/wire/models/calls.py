"""A call as a caller asks for it (`RunRequest`) and as a worker runs it (`Call`): the
options both declare once (`CallOptions`), and the checks a call holds them to."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, cast

from pydantic import Field, TypeAdapter, ValidationError, field_validator
from pydantic_core import PydanticKnownError

if TYPE_CHECKING:
    from pydantic_core.core_schema import ErrorType

from bashfleet.worker.wire.models.base import (
    MAX_COMMAND_BYTES,
    MAX_PATH_CHARS,
    MAX_TIMEOUT_S,
    OWNER_PATTERN,
    WORKSPACE_ID_PATTERN,
    AskedNetwork,
    Isolation,
    Model,
    Stdin,
    Tags,
    runs_code,
)
from bashfleet.worker.wire.models.policy import Policy

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

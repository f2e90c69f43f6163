"""What every dialect is made of: tool specs, result text, the runner and the session.

A dialect is pure: it turns a model's tool call into `Runner` calls and the wire results
back into the exact text of its tool. It never raises for anything a model can send; bad
input becomes a `ToolText` with `is_error=True`.

    dialect = get_dialect("pipe")
    session = store.load(session_id)
    text = dialect.call("bash", {"command": "make"}, fleet, session)
    store.save(session_id, session)     # call() updates the session in place

Runner exceptions (Redis down, worker lost, unknown job) are reported the same way, as
a system error of the dialect, so an agent always gets an answer.
"""

from __future__ import annotations

import copy
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bashfleet.client import shells
from bashfleet.client.dialects.args import ArgError, Args, parse_args
from bashfleet.worker.wire.control import (
    CheckRequest,
    KillRequest,
    ReadOutputRequest,
    SessionOutput,
    WriteStdinRequest,
)
from bashfleet.worker.wire.models import (
    CallResult,
    CheckResult,
    JobHandle,
    JobView,
    OutputChunk,
    Policy,
    RunRequest,
)
from bashfleet.worker.wire.names import SESSION_TTL_S

JSONSchema = dict[str, Any]
SchemaStyle = Literal["anthropic", "openai", "openai-responses", "mcp", "function"]
#: Every style, in the order `bashfleet schema --help` lists them.
SCHEMA_STYLES: tuple[SchemaStyle, ...] = (
    "anthropic", "openai", "openai-responses", "mcp", "function",
)


@dataclass(frozen=True)
class ToolSpec:
    """One tool as a model sees it: its name, description and JSON Schema of arguments."""

    name: str
    description: str
    input_schema: JSONSchema = field(default_factory=dict)

    def as_json(self, style: SchemaStyle = "anthropic") -> dict[str, Any]:
        """The spec in the shape a function-calling API takes in its `tools` list.

        - `anthropic`: Anthropic's Messages API, `{name, description, input_schema}`.
        - `openai`: OpenAI's Chat Completions API, `{"type": "function", "function":
          {name, description, parameters}}`.
        - `openai-responses`: OpenAI's Responses API, `{"type": "function", name,
          description, parameters, "strict": false}`: flat, and `strict` said, since the
          Responses API defaults it to true, which takes only schemas whose every property
          is required (ours have optional ones).
        - `mcp`: an MCP `tools/list` entry, `{name, description, inputSchema}`.
        - `function`: the bare function, `{name, description, parameters}` (the pipe
          tool's own shape; Chat Completions' inner `function`; Gemini's function
          declaration).

        The schema is deep-copied: callers may mutate it.
        """
        schema = copy.deepcopy(self.input_schema)
        function = {"name": self.name, "description": self.description, "parameters": schema}
        match style:
            case "anthropic":
                return {"name": self.name, "description": self.description,
                        "input_schema": schema}
            case "mcp":
                return {"name": self.name, "description": self.description,
                        "inputSchema": schema}
            case "openai":
                return {"type": "function", "function": function}
            case "openai-responses":
                return {"type": "function", **function, "strict": False}
            case "function":
                return function
        raise ValueError(f"unknown schema style {style!r}; known: {', '.join(SCHEMA_STYLES)}")


@dataclass(frozen=True)
class ToolText:
    """A tool's answer to the model: text, and whether the tool call failed."""

    text: str
    is_error: bool = False


@runtime_checkable
class Runner(Protocol):
    """What a dialect needs from the fleet (`client.Fleet` provides it): one request
    model in, one result model out."""

    def execute(self, request: RunRequest) -> CallResult:
        """Run a command (see `RunRequest`)."""
        ...

    def check_job(self, request: CheckRequest) -> CheckResult:
        """A job's state and its new output (see `CheckRequest`)."""
        ...

    def kill_job(self, request: KillRequest) -> CheckResult:
        """End a job; its final state (see `KillRequest`)."""
        ...

    def read_chunk(self, request: ReadOutputRequest) -> OutputChunk:
        """A slice of the full output a call or job kept on its host (see
        `ReadOutputRequest`)."""
        ...

    def write_stdin_request(self, request: WriteStdinRequest) -> SessionOutput:
        """Write to an interactive job, read its new output (see `WriteStdinRequest`)."""
        ...


@runtime_checkable
class JobViewer(Protocol):
    """A runner that can also say, cheaply, how jobs are doing (`Fleet.job_views`): the
    native dialect tells a model which of its jobs ended. Optional: a runner without it
    simply tells nothing."""

    def job_views(self, ids: list[str]) -> dict[str, JobView]:
        """What the fleet knows of these jobs, by id (unknown ids left out)."""
        ...


T = TypeVar("T")


class MadeWorkspace(Protocol):
    """What a runner says of a workspace it made (`client.Workspace` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def host(self) -> str: ...


@runtime_checkable
class WorkspaceMaker(Protocol):
    """A runner that makes workspaces (`Fleet.workspace`): an agent session's calls then
    run in one, where what they leave (files, /tmp, processes) is there for the next,
    and the pids and paths a dialect shows work in the next call. Optional: a runner
    without it runs every call in a throwaway workspace."""

    def workspace(self, *, host: str | None = ..., near: str | None = ...,
                  ttl_s: float | None = ..., session: str | None = ...) -> MadeWorkspace:
        """A new workspace (see `Fleet.workspace`)."""
        ...


class RunnerError(Exception):
    """The runner raised: the fleet could not answer (not the command's failure)."""


class RefusalError(Exception):
    """Raised by a handler to end a call early with a given answer (an unknown job id...)."""

    def __init__(self, answer: ToolText) -> None:
        super().__init__(answer.text)
        self.answer = answer


def validation_text(exc: ValidationError) -> str:
    """A request model's validation errors as one line: each field and what is wrong."""
    return "; ".join(
        f"{'.'.join(map(str, error['loc'])) or 'request'}: {error['msg']}"
        for error in exc.errors()
    )


def _describe(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class GuardedRunner:
    """A runner whose exceptions become `RunnerError`, caught by `Dialect.call`.

    Only the runner's own exceptions are converted: a bug in a dialect's rendering still
    raises, so tests see it.
    """

    def __init__(self, runner: Runner, session: SessionState | None = None) -> None:
        self._runner = runner
        self._session = session

    def execute(self, request: RunRequest) -> CallResult:
        """`Runner.execute`, in the agent session's workspace on the call's host (made at
        its first call there), exceptions converted. A workspace that ended (unused past
        its TTL) is made again, and the result says so."""
        placed = self._guarded(self._in_workspace, request)
        result = self._guarded(self._runner.execute, placed)
        if self._session is not None and shells.workspace_gone(result):
            self._session.workspaces.pop(placed.host or "", None)
            again = self._guarded(self._in_workspace, request)
            result = shells.with_new_workspace(self._guarded(self._runner.execute, again))
        return result

    @staticmethod
    def _guarded(step: Callable[[RunRequest], T], request: RunRequest) -> T:
        try:
            return step(request)
        except Exception as exc:
            raise RunnerError(_describe(exc)) from exc

    def _in_workspace(self, request: RunRequest) -> RunRequest:
        session = self._session
        if session is None or request.workspace is not None or \
                not isinstance(self._runner, WorkspaceMaker):
            return request
        host = request.host or session.host
        found = session.workspaces.get(host) if host else next(
            iter(session.workspaces.items()), None)
        if isinstance(found, tuple):
            host, found = found
        if found is None:
            try:
                made = self._runner.workspace(
                    host=host, near=request.cwd or session.cwd, ttl_s=SESSION_TTL_S,
                    session=session.fleet_session)
            except NotImplementedError:  # a wrapper around a runner that makes none
                return request
            host, found = made.host, made.id
            session.workspaces[host] = found
        return request.model_copy(update={"workspace": found, "host": host,
                                          "label": None})

    def check_job(self, request: CheckRequest) -> CheckResult:
        """`Runner.check_job`, exceptions converted."""
        try:
            return self._runner.check_job(request)
        except Exception as exc:
            raise RunnerError(_describe(exc)) from exc

    def kill_job(self, request: KillRequest) -> CheckResult:
        """`Runner.kill_job`, exceptions converted."""
        try:
            return self._runner.kill_job(request)
        except Exception as exc:
            raise RunnerError(_describe(exc)) from exc

    def read_chunk(self, request: ReadOutputRequest) -> OutputChunk:
        """`Runner.read_chunk`, exceptions converted."""
        try:
            return self._runner.read_chunk(request)
        except Exception as exc:
            raise RunnerError(_describe(exc)) from exc

    def job_views(self, ids: list[str]) -> dict[str, JobView]:
        """`JobViewer.job_views` when the runner has it, else nothing; a failure is
        nothing too (what it tells is a courtesy, never worth failing a call for)."""
        if not ids or not isinstance(self._runner, JobViewer):
            return {}
        try:
            return self._runner.job_views(ids)
        except Exception:
            return {}

    def write_stdin_request(self, request: WriteStdinRequest) -> SessionOutput:
        """`Runner.write_stdin_request`, exceptions converted (the original kept as the
        cause: a dialect may tell an unknown session from a fleet failure)."""
        try:
            return self._runner.write_stdin_request(request)
        except Exception as exc:
            raise RunnerError(_describe(exc)) from exc


# ---------------------------------------------------------------------------- session


class SessionJob(BaseModel):
    """A background job started in a session, as its dialect remembers it."""

    model_config = ConfigDict(extra="forbid")

    id: str
    """Job id (unique across hosts and time)."""
    host: str
    """Host that owns the job."""
    pid: int
    """The job's pid, as pid-addressing dialects show it."""
    pgid: int
    """The job's process group."""
    command: str
    """The command, for kill notices."""
    output_path: str
    """The job's output file on `host`."""
    stderr_path: str | None = None
    """Separate stderr file (auto-backgrounded separate-stream calls)."""
    killed: bool = False
    """True once the session killed it (claude reports status `killed`)."""
    end_told: bool = False
    """True once the model was told the job ended (native: by a check, a kill, or the
    note on the result after it ended)."""


class RunRecord(BaseModel):
    """A command a session ran, so a later identical one can be told where its output is."""

    model_config = ConfigDict(extra="forbid")

    command: str
    """The command as the model sent it."""
    call_id: str
    """The call's id (its kept output is read by that id)."""
    host: str
    """Host that ran it (and holds its output)."""
    at: float
    """When it was sent, in seconds since the epoch (the client's clock)."""
    exit_code: int | None = None
    """Its exit code, when it exited in the call."""
    signal: int | None = None
    """The signal that ended it, when one did."""
    spill_path: str | None = None
    """Its full (stdout) output, kept on `host`, when it was kept."""
    job_id: str | None = None
    """The job it went on as, when it was backgrounded."""


class Artifact(BaseModel):
    """A call's full output kept on its host, as a session lists it (pi's `artifact://`)."""

    model_config = ConfigDict(extra="forbid")

    call_id: str
    """The call's id (the artifact id)."""
    host: str
    """Host that keeps the output."""
    path: str
    """The output file on `host`."""
    size: int
    """Its size in bytes when the call ended."""
    command: str
    """The command, for listings."""
    at: float
    """When the call was sent, in seconds since the epoch."""


class ExecSession(BaseModel):
    """An interactive session a dialect addresses by a number of its own (codex)."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    """The fleet's job id of the session's process."""
    host: str
    """Host that runs it."""
    tty: bool = False
    """True when it has a terminal (writes are taken); False: its stdin is closed."""
    command: str = ""
    """The command, for notes."""
    last_used: float = 0.0
    """When it was last written to or read (seconds since the epoch, client's clock)."""


class SessionState(BaseModel):
    """What a dialect carries between the calls of one agent session.

    Mutable on purpose: `Dialect.call` updates it in place; the caller saves it.
    JSON-serializable, for the Redis store.
    """

    model_config = ConfigDict(extra="forbid")

    cwd: str | None = None
    """Working directory of the session's calls (None: the worker's home)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables set on every call of the session (fixed; what commands export lives in
    the session's shell, `fleet_session`)."""
    host: str | None = None
    """Host the session's calls are pinned to (None: any host)."""
    jobs: dict[str, SessionJob] = Field(default_factory=dict)
    """Background jobs started in this session, by job id."""
    pids: dict[int, str] = Field(default_factory=dict)
    """pid -> job id, for dialects that address jobs by pid (pipe)."""
    offsets: dict[str, int] = Field(default_factory=dict)
    """job id -> byte offset of the output already shown by a check."""
    stderr_offsets: dict[str, int] = Field(default_factory=dict)
    """job id -> byte offset of the separate stderr already shown (auto-backgrounded calls)."""
    history: list[RunRecord] = Field(default_factory=list)
    """The session's latest commands, oldest first (native's "already ran" hint)."""
    workspaces: dict[str, str] = Field(default_factory=dict)
    """Host -> the session's workspace there (made at its first call on that host): its
    calls share its processes, /tmp and files, as on one machine."""
    fleet_session: str | None = None
    """The fleet session whose shell (cwd, exported variables: `bashfleet.client.shells`) the
    calls of dialects that keep one share (claude's state that persists across calls). The
    MCP server names its own session; a dialect names a fresh one on first use."""
    artifacts: dict[str, Artifact] = Field(default_factory=dict)
    """Call id -> a kept full output this session was told of (pi's `artifact://<id>`),
    oldest first."""
    exec_sessions: dict[int, ExecSession] = Field(default_factory=dict)
    """Interactive sessions by the number the model uses (codex's session ids)."""

    def remember(self, job: JobHandle, command: str, stderr_path: str | None = None) -> SessionJob:
        """Record a job started in this session; a newer job takes over a reused pid."""
        entry = SessionJob(
            id=job.id,
            host=job.host,
            pid=job.pid,
            pgid=job.pgid,
            command=command,
            output_path=job.output_path,
            stderr_path=stderr_path,
        )
        self.jobs[job.id] = entry
        self.pids[job.pid] = job.id
        return entry

    def shown_until(self, job_id: str, result: CallResult) -> None:
        """A backgrounded call's notice showed its output so far: checks read on from there.

        The counts are the bytes each stream's file held when the notice was made, and
        the job keeps writing to those same files.
        """
        out, err = result.stdout_truncation, result.stderr_truncation
        self.offsets[job_id] = out.total_bytes if out is not None else 0
        self.stderr_offsets[job_id] = err.total_bytes if err is not None else 0


class SessionStore(Protocol):
    """Where sessions live between calls (in memory here; Redis in the fleet)."""

    def load(self, session_id: str) -> SessionState:
        """The session's state; a fresh one for an unknown id."""
        ...

    def save(self, session_id: str, state: SessionState) -> None:
        """Store the session's state."""
        ...


class MemorySessionStore:
    """Sessions in this process's memory; loads return copies, as a remote store would."""

    def __init__(self) -> None:
        self._states: dict[str, SessionState] = {}
        self._lock = threading.Lock()

    def load(self, session_id: str) -> SessionState:
        """A copy of the session's state (a fresh state for an unknown id)."""
        with self._lock:
            state = self._states.get(session_id)
            return state.model_copy(deep=True) if state is not None else SessionState()

    def save(self, session_id: str, state: SessionState) -> None:
        """Store a copy, so later changes to `state` need another save."""
        with self._lock:
            self._states[session_id] = state.model_copy(deep=True)


# ---------------------------------------------------------------------------- dialect

Handler = Callable[[Args, GuardedRunner, SessionState], ToolText]


class Dialect(ABC):
    """One agent's bash tool: its tools, policy, and the text of every result."""

    name: ClassVar[str]
    """The dialect's name (`bashfleet schema --dialect NAME`)."""

    @abstractmethod
    def policy(self) -> Policy:
        """How the engine runs this dialect's calls and shapes their output."""

    @abstractmethod
    def tools(self, cwd: str | None = None) -> list[ToolSpec]:
        """The tools the model sees; `cwd` fills descriptions that show it."""

    @abstractmethod
    def handlers(self) -> Mapping[str, Handler]:
        """Tool name -> the function that serves it (arguments already validated)."""

    def aliases(self) -> list[ToolSpec]:
        """Tools the dialect answers to without showing them to the model (other names
        its agent uses for the same tools); none unless a dialect says so."""
        return []

    def invalid(self, tool: str, message: str) -> ToolText:
        """The answer to arguments the tool cannot take."""
        return ToolText(f"Error: {message}", is_error=True)

    def unknown_tool(self, tool: str) -> ToolText:
        """The answer to a call of a tool this dialect does not have."""
        known = ", ".join(self.handlers())
        return ToolText(
            f"Error: unknown tool {tool!r}; the {self.name} dialect has: {known}", is_error=True
        )

    def system_error(self, message: str) -> ToolText:
        """The answer when the fleet itself failed (not the command)."""
        return ToolText(f"[system error: {message}]", is_error=True)

    def call(
        self, tool: str, args: Mapping[str, object], runner: Runner, session: SessionState
    ) -> ToolText:
        """Serve one tool call. Never raises for anything the model sends."""
        handlers = self.handlers()
        if not isinstance(tool, str) or tool not in handlers:
            return self.unknown_tool(str(tool))
        specs = {spec.name: spec for spec in [*self.tools(session.cwd), *self.aliases()]}
        try:
            parsed = parse_args(tool, specs[tool].input_schema, args)
            return handlers[tool](parsed, GuardedRunner(runner, session), session)
        except ArgError as exc:
            return self.invalid(tool, str(exc))
        except ValidationError as exc:  # a request the arguments could not make
            return self.invalid(tool, validation_text(exc))
        except RefusalError as exc:
            return exc.answer
        except RunnerError as exc:
            return self.system_error(str(exc))


def schemas(
    dialect: Dialect, cwd: str | None = None, style: SchemaStyle = "anthropic"
) -> list[dict[str, Any]]:
    """The dialect's tools as JSON-serializable dicts (`bashfleet schema --dialect D`)."""
    return [spec.as_json(style) for spec in dialect.tools(cwd)]

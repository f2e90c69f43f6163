"""`bashfleet mcp`: one dialect's tools over MCP (stdio), every call run by the fleet.

    bashfleet mcp --dialect claude --session agent-7 --host build-1 --cwd /src/app

One server process serves one session (`--session`, else a new id, logged on stderr
so a restart can resume it). Each tool call loads the session from Redis, goes
through the dialect (`Dialect.call`) to the fleet, and saves what the call changed,
so the session outlives the server: env, cwd, pinned host, jobs, read offsets.

- Tools: the dialect's specs as they are (`ToolSpec.input_schema` is the MCP
  `inputSchema`); the modes dialect's description shows the session's cwd.
- Results: the dialect's text; `ToolText.is_error` is `CallToolResult.isError`.
- Host: `--host` pins the session; otherwise its first call pins it to the host
  that ran it, since its cwd, files and jobs are there. Every run goes to the pin.
- Nothing an agent sends, and no fleet failure (Redis down, host gone, unknown job,
  worker lost), stops the server: each becomes an `isError` result in the
  dialect's own error shape.
- Fleet calls block (a build can take 10 minutes): they run in worker threads, so
  the server keeps answering, concurrent calls included.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Protocol, TypeVar, cast

import anyio
import anyio.to_thread
import redis
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from client.dialects import Dialect, Runner, SessionState, ToolText
from client.errors import BashfleetError, FleetUnavailable, HostUnavailable
from client.fleet import Fleet, resolve_signing_key, resolve_url
from client.sessions import RedisSessionStore, validate_session_id
from worker.fleet.connect import redis_client
from worker.wire.control import CheckRequest, KillRequest, SessionOutput, WriteStdinRequest
from worker.wire.models import CallResult, CheckResult, RunRequest

__all__ = [
    "Backend",
    "FleetBackend",
    "FleetRunner",
    "SessionRunner",
    "StaticBackend",
    "ToolServer",
    "build_server",
    "new_session_id",
    "serve",
]

log = logging.getLogger(__name__)

SERVER_NAME = "bashfleet"

T = TypeVar("T")


def session_owner(session_id: str) -> str:
    """Who the calls and jobs of an MCP session belong to: another session's tools (a
    native agent's `bash_check`, say) cannot reach them."""
    return f"session:{session_id}"


def new_session_id() -> str:
    """A fresh session id (what `--session` defaults to)."""
    return f"mcp-{uuid.uuid4().hex}"


def _version() -> str:
    try:
        return metadata.version("bashfleet")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ---------------------------------------------------------------------------- runners


class FleetRunner:
    """The dialects' `Runner` on a `Fleet`; a fleet found unreachable is reported to
    `on_unavailable`, so the server connects afresh for the next call."""

    def __init__(self, fleet: Fleet, on_unavailable: Callable[[], None] | None = None) -> None:
        self.fleet = fleet
        self._on_unavailable = on_unavailable

    def _guard(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except FleetUnavailable:
            if self._on_unavailable is not None:
                self._on_unavailable()
            raise

    def execute(self, request: RunRequest) -> CallResult:
        """`Fleet.execute`."""
        return self._guard(lambda: self.fleet.execute(request))

    def check_job(self, request: CheckRequest) -> CheckResult:
        """`Fleet.check_job`."""
        return self._guard(lambda: self.fleet.check_job(request))

    def kill_job(self, request: KillRequest) -> CheckResult:
        """`Fleet.kill_job`."""
        return self._guard(lambda: self.fleet.kill_job(request))

    def write_stdin_request(self, request: WriteStdinRequest) -> SessionOutput:
        """`Fleet.write_stdin_request`."""
        return self._guard(lambda: self.fleet.write_stdin_request(request))


class SessionRunner:
    """A runner bound to one session's state: runs go to its pinned host.

    The session is pinned to the host of its first run that reached one, so later
    calls find the cwd, files and jobs the earlier ones left there.
    """

    def __init__(self, runner: Runner, state: SessionState) -> None:
        self._runner = runner
        self._state = state

    def execute(self, request: RunRequest) -> CallResult:
        """`Runner.execute` on the pinned host (an explicit `host` wins, for one call)."""
        target = request.host or self._state.host
        try:
            result = self._runner.execute(request.model_copy(update={"host": target}))
        except HostUnavailable as exc:
            if target is None or target != self._state.host:
                raise
            # The pin outlives its host (each call renews the session): say how to move it.
            raise HostUnavailable(
                f"{exc.message}. This session is pinned to {target}; to move it, restart "
                "`bashfleet mcp` with --host and a live host",
                host=exc.host,
            ) from exc
        if self._state.host is None and result.host:
            self._state.host = result.host
        return result

    def check_job(self, request: CheckRequest) -> CheckResult:
        """`Runner.check_job` (jobs are routed by id, wherever they run)."""
        return self._runner.check_job(request)

    def kill_job(self, request: KillRequest) -> CheckResult:
        """`Runner.kill_job`."""
        return self._runner.kill_job(request)

    def write_stdin_request(self, request: WriteStdinRequest) -> SessionOutput:
        """`Runner.write_stdin_request` (sessions are routed by job id, wherever they run)."""
        return self._runner.write_stdin_request(request)


# ---------------------------------------------------------------------------- backend


class Backend(Protocol):
    """Where a tool server's calls go and its session lives."""

    def connect(self) -> tuple[Runner, RedisSessionStore]:
        """The runner and session store (raises BashfleetError / RedisError when down)."""
        ...

    def reset(self) -> None:
        """Forget the connections: the next `connect` makes new ones."""
        ...


class FleetBackend:
    """The fleet, connected on first use and again after it was found unreachable.

    An agent harness may start its MCP servers before anyone ran `bashfleet up`, and a
    local fleet started again listens on a new URL: so the URL is resolved when a call
    needs it, not when the server starts.
    """

    def __init__(self, redis_url: str | None = None, owner: str | None = None) -> None:
        """`owner`: who the calls and jobs of this server belong to (its session)."""
        self._redis_url = redis_url
        self._owner = owner
        self._lock = threading.Lock()
        self._connected: tuple[FleetRunner, RedisSessionStore, redis.Redis] | None = None

    def connect(self) -> tuple[Runner, RedisSessionStore]:
        """A runner on the fleet and the session store on the fleet's Redis."""
        with self._lock:
            if self._connected is None:
                url = resolve_url(self._redis_url)
                # No URL: FleetUnavailable, with what to do about it. Never an admin: an
                # agent's tools reach only their own session's jobs.
                fleet = Fleet(url, owner=self._owner)
                client = redis_client(cast("str", url))
                runner = FleetRunner(fleet, on_unavailable=self.reset)
                store = RedisSessionStore(client, key=resolve_signing_key(cast("str", url)))
                self._connected = (runner, store, client)
            runner, store, _ = self._connected
            return runner, store

    def reset(self) -> None:
        """Close and forget the connections."""
        with self._lock:
            connected, self._connected = self._connected, None
        if connected is not None:
            runner, _, client = connected
            for close in (runner.fleet.close, client.close):
                try:
                    close()
                except Exception:  # closing what already failed: nothing to do
                    log.debug("closing a dead connection failed", exc_info=True)


@dataclass(frozen=True)
class StaticBackend:
    """A fixed runner and store (tests, embedding)."""

    runner: Runner
    store: RedisSessionStore

    def connect(self) -> tuple[Runner, RedisSessionStore]:
        """The runner and store given."""
        return self.runner, self.store

    def reset(self) -> None:
        """Nothing to reconnect."""


# ----------------------------------------------------------------------------- server


class ToolServer:
    """One dialect and one session: lists its tools and serves its calls (blocking).

    `host` and `cwd` (the command line's `--host` / `--cwd`) are written into the
    session once, with the first call that reaches Redis. A bad `session_id` is a
    ValueError here, not an error result on every call.
    """

    def __init__(
        self,
        dialect: Dialect,
        backend: Backend,
        session_id: str,
        *,
        host: str | None = None,
        cwd: str | None = None,
    ) -> None:
        self.dialect = dialect
        self.session_id = validate_session_id(session_id)
        self._backend = backend
        self._overrides: dict[str, str] = {
            name: value for name, value in (("host", host), ("cwd", cwd)) if value is not None
        }
        # Commits of this process's concurrent calls one at a time (merges are cheap);
        # the calls themselves run in parallel.
        self._commit_lock = threading.Lock()

    def tools(self) -> list[types.Tool]:
        """The dialect's tools; listing works even while the fleet is down."""
        cwd = self._overrides.get("cwd")
        try:
            _, store = self._backend.connect()
            cwd = cwd or store.load(self.session_id).cwd
        except (BashfleetError, redis.RedisError) as exc:
            log.warning("listing tools without the session (%s)", _describe(exc))
        return [
            types.Tool(name=spec.name, description=spec.description, input_schema=spec.input_schema)
            for spec in self.dialect.tools(cwd)
        ]

    def call(self, tool: str, arguments: Mapping[str, object]) -> ToolText:
        """Serve one tool call; never raises for the agent's input or a fleet failure."""
        try:
            runner, store = self._backend.connect()
            base = store.load(self.session_id)
        except (BashfleetError, redis.RedisError) as exc:
            self._backend.reset()
            return self.dialect.system_error(_describe(exc))
        state = base.model_copy(deep=True)
        overrides = dict(self._overrides)
        for name, value in overrides.items():
            setattr(state, name, value)
        answer = self.dialect.call(tool, arguments, SessionRunner(runner, state), state)
        try:
            with self._commit_lock:
                store.commit(self.session_id, base, state)
                for name in overrides:
                    self._overrides.pop(name, None)
        except redis.RedisError as exc:
            self._backend.reset()
            note = f"[bashfleet: the session could not be saved: {_describe(exc)}]"
            return ToolText(f"{answer.text}\n{note}", is_error=answer.is_error)
        return answer


def _text_result(answer: ToolText) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=answer.text)], is_error=answer.is_error
    )


def build_server(tool_server: ToolServer) -> Server[Any]:
    """The MCP server (SDK low-level `Server`) for a tool server."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        del ctx, params
        tools = await anyio.to_thread.run_sync(tool_server.tools)
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        del ctx
        arguments: Mapping[str, object] = params.arguments or {}
        try:
            answer = await anyio.to_thread.run_sync(tool_server.call, params.name, arguments)
        except Exception as exc:
            # A bug of ours: report it to the agent and keep serving.
            log.exception("tool call %s failed", params.name)
            answer = tool_server.dialect.system_error(f"internal error: {_describe(exc)}")
        return _text_result(answer)

    return Server(
        SERVER_NAME,
        version=_version(),
        instructions=f"bash on a bashfleet fleet ({tool_server.dialect.name} dialect)",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def _serve_stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def serve(
    dialect: Dialect,
    session_id: str,
    *,
    host: str | None = None,
    cwd: str | None = None,
    redis_url: str | None = None,
) -> None:
    """Serve `dialect` over stdio until the client closes stdin."""
    if cwd is not None:
        # A relative path means one on this machine, as for a local fleet.
        cwd = os.path.abspath(cwd)
    backend = FleetBackend(redis_url, owner=session_owner(session_id))
    tool_server = ToolServer(dialect, backend, session_id, host=host, cwd=cwd)
    try:
        anyio.run(_serve_stdio, build_server(tool_server))
    finally:
        backend.reset()

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
- Long calls: while a call runs, a request that carries a progress token gets a
  `notifications/progress` every PROGRESS_INTERVAL_S, its message the seconds so far
  and the last lines of output, so clients that reset their request timeout on
  progress (the TypeScript SDK's `resetTimeoutOnProgress`) wait for a 15-minute build.
- Cancellation: `notifications/cancelled` (a client giving up, or its timeout) cancels
  the call on its host (`Fleet.cancel`: withdrawn if queued, killed if running, its
  slot freed); the call's id is chosen before it is sent, so no window loses it.
- Shells: the session's shell (cwd, exported variables: `bashfleet.client.shells`) is the
  fleet session of the same id, so the claude dialect's persistent cwd and variables are
  shared with `bashfleet run --session ID`; `--host` and `--cwd` are written into it too.
- Workspaces: a session's calls run in workspaces of its own (owner `session:<id>`,
  tagged `started_by=<owner of who started the server>`), renewed while the server
  lives. When its client goes away (stdin closed, SIGTERM, SIGHUP), a server whose
  session no `--session` named deletes them (no one could resume it); a named one
  keeps them for its next server. `bashfleet workspace ls --mcp` lists those left.
- Resources: the kept full outputs the session was told of (pi's `artifact://<id>`)
  are listed by `resources/list` and read by `resources/read`, through the fleet.

This module is the server (its tool calls, cancellation, progress, resources and
stdio loop); where its calls go (runners, the cancel watch, backends) is
`bashfleet.client.mcp_backend`, whose names it also exports.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.to_thread
import redis
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS

from bashfleet.client._core.workspaces import SESSION_OWNER_PREFIX
from bashfleet.client.dialects import Artifact, Dialect, Runner, SessionState, ToolText
from bashfleet.client.errors import BashfleetError, UnknownCall
from bashfleet.client.mcp_backend import (
    Backend,
    CallCancelledError,
    CallWatch,
    FleetBackend,
    FleetRunner,
    SessionRunner,
    StaticBackend,
    kill_unseen_job,
)
from bashfleet.client.sessions import RedisSessionStore, ShellStore, validate_session_id
from bashfleet.client.shells import ShellChange
from bashfleet.worker.wire.control import ReadOutputRequest
from bashfleet.worker.wire.owner_keys import SUB_OWNER

__all__ = [
    "Backend",
    "CallCancelledError",
    "CallWatch",
    "FleetBackend",
    "FleetRunner",
    "SessionRunner",
    "StaticBackend",
    "ToolServer",
    "build_server",
    "new_session_id",
    "serve",
    "session_owner",
]

log = logging.getLogger(__name__)

SERVER_NAME = "bashfleet"
#: Seconds between two progress notifications of a running call: well inside the 60 s
#: default request timeout of the MCP SDKs, which a notification resets.
PROGRESS_INTERVAL_S = 5.0
#: Bytes of a running call's output read for a progress message, and lines shown of them.
PROGRESS_TAIL_BYTES = 2048
PROGRESS_TAIL_LINES = 3
#: How long a cancel keeps trying to reach a call whose record is not written yet.
CANCEL_REACH_S = 10.0
#: Bytes of an artifact one `resources/read` returns (`?offset=N` reads on).
ARTIFACT_READ_BYTES = 1024 * 1024
#: An offset past any file: `read_output` then answers the file's size and no text.
_END = 1 << 62

#: Seconds between two renewals of a server's workspaces (a workspace lives a day unused).
RENEW_INTERVAL_S = 600.0


def session_owner(session_id: str, parent: str | None = None) -> str:
    """Who the calls and jobs of an MCP session belong to: another session's tools (a
    native agent's `bash_check`, say) cannot reach them. A server holding an owner key
    acts as a sub-owner of that owner (`<parent>::session:<id>`), all its key covers."""
    own = f"{SESSION_OWNER_PREFIX}{session_id}"
    return f"{parent}{SUB_OWNER}{own}" if parent else own


def _key_owner() -> str | None:
    """The owner of the owner key this process is configured with, if any."""
    from bashfleet.client._core.settings import client_settings  # noqa: PLC0415 - read when serving starts

    try:
        key = client_settings().client_owner_key()
    except ValueError:
        return None  # the fleet client says what is wrong with it, at the first call
    return key.owner if key is not None else None


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

    def renew_workspaces(self) -> int:
        """Mark the session's workspaces used (their TTL starts again): what the server
        does every RENEW_INTERVAL_S while it lives, so an agent that pauses keeps its
        files and processes; how many were renewed."""
        renewed = 0
        try:
            runner, store = self._backend.connect()
            state = store.load(self.session_id)
        except (BashfleetError, redis.RedisError) as exc:
            log.info("workspaces not renewed: %s", _describe(exc))
            return 0
        renew = getattr(runner, "renew_workspace", None)
        for workspace_id in state.workspaces.values():
            try:
                if renew is not None:
                    renew(workspace_id)
                    renewed += 1
            except (BashfleetError, redis.RedisError) as exc:
                log.info("workspace %s not renewed: %s", workspace_id, _describe(exc))
        return renewed

    def delete_workspaces(self) -> int:
        """End the session's workspaces (what a server whose session cannot be resumed
        does as it stops: no one could reach them again); how many were ended."""
        try:
            runner, store = self._backend.connect()
            state = store.load(self.session_id)
        except (BashfleetError, redis.RedisError) as exc:
            log.warning("workspaces of session %s not deleted: %s", self.session_id,
                        _describe(exc))
            return 0
        delete = getattr(runner, "delete_workspace", None)
        ended = 0
        for workspace_id in state.workspaces.values():
            try:
                if delete is not None:
                    delete(workspace_id)
                    ended += 1
            except (BashfleetError, redis.RedisError) as exc:
                log.warning("workspace %s not deleted: %s", workspace_id, _describe(exc))
        return ended

    def keep_renewing(self, stop: threading.Event, interval_s: float) -> threading.Thread:
        """Renew the session's workspaces every `interval_s` until `stop` is set."""

        def loop() -> None:
            while not stop.wait(interval_s):
                self.renew_workspaces()

        thread = threading.Thread(target=loop, name="bashfleet-renew", daemon=True)
        thread.start()
        return thread

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

    def call(
        self, tool: str, arguments: Mapping[str, object], watch: CallWatch | None = None
    ) -> ToolText:
        """Serve one tool call; never raises for the agent's input or a fleet failure.

        `watch` (the server's) lets a cancelled request reach the call it sent.
        """
        try:
            try:
                runner, store = self._backend.connect()
                base = store.load(self.session_id)
                overrides = dict(self._overrides)
                if overrides:
                    self._seed_shell(store.shells, overrides)
            except (BashfleetError, redis.RedisError) as exc:
                self._backend.reset()
                return self.dialect.system_error(_describe(exc))
            return self._serve(
                tool, arguments, watch, runner=runner, store=store, base=base,
                overrides=overrides,
            )
        finally:
            if watch is not None:
                watch.done.set()

    def _seed_shell(self, shells: ShellStore, overrides: Mapping[str, str]) -> None:
        """`--host` / `--cwd` into the session's shell (its kept cwd and variables start
        there)."""
        shells.commit(self.session_id, ShellChange(
            host=overrides.get("host"), cwd=overrides.get("cwd"), force_host=True,
        ))

    def _serve(
        self, tool: str, arguments: Mapping[str, object], watch: CallWatch | None, *,
        runner: Runner, store: RedisSessionStore, base: SessionState,
        overrides: Mapping[str, str],
    ) -> ToolText:
        state = base.model_copy(deep=True)
        for name, value in overrides.items():
            setattr(state, name, value)
        state.fleet_session = self.session_id
        answer = self.dialect.call(tool, arguments, SessionRunner(runner, state, watch), state)
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

    # ------------------------------------------------------------- cancel, progress

    def cancel(self, watch: CallWatch) -> None:
        """Stop what a cancelled request started: its call, withdrawn or killed, and a
        job it went on as (`SessionRunner.execute` kills one that comes with the call's
        answer; here, one whose call had ended before the cancel came).

        The call's record may not be written yet (the request was cancelled while its
        call was being sent): try again until it is, or until the tool call is over.
        """
        call_id = watch.cancel()
        if call_id is None:
            return
        deadline = time.monotonic() + CANCEL_REACH_S
        while True:
            try:
                runner, _ = self._backend.connect()
                if not runner.cancel(call_id):
                    # It had ended, but its answer was not sent yet: a job it started
                    # (codex's session, a backgrounded call) has an id nobody will see.
                    kill_unseen_job(runner, call_id)
                log.info("call %s cancelled: its request was cancelled", call_id)
                return
            except UnknownCall:
                if watch.done.wait(0.05) or time.monotonic() > deadline:
                    return
            except (BashfleetError, redis.RedisError) as exc:
                log.warning("call %s: could not cancel it: %s", call_id, _describe(exc))
                return

    def progress_message(self, watch: CallWatch) -> str:
        """What a progress notification says: time so far, and the last output lines."""
        elapsed = f"running for {time.monotonic() - watch.started:.0f}s"
        call_id = watch.call_id
        if call_id is None:
            return elapsed
        try:
            tail = self._output_tail(call_id)
        except (BashfleetError, redis.RedisError):
            return elapsed  # not claimed yet, or its output is not in a file
        return f"{elapsed}; last output:\n{tail}" if tail else elapsed

    def _output_tail(self, call_id: str) -> str:
        runner, _ = self._backend.connect()
        size = runner.read_chunk(ReadOutputRequest(id=call_id, offset=_END, limit=1)).size
        start = max(0, size - PROGRESS_TAIL_BYTES)
        chunk = runner.read_chunk(
            ReadOutputRequest(id=call_id, offset=start, limit=PROGRESS_TAIL_BYTES)
        )
        lines = chunk.text.splitlines()
        if start > 0:
            lines = lines[1:]  # the first line begins before the slice
        return "\n".join(line for line in lines[-PROGRESS_TAIL_LINES:])

    # -------------------------------------------------------------------- resources

    def artifacts(self) -> list[Artifact]:
        """The kept full outputs this session was told of (pi's `artifact://<id>`)."""
        try:
            _, store = self._backend.connect()
            return list(store.load(self.session_id).artifacts.values())
        except (BashfleetError, redis.RedisError) as exc:
            log.warning("listing artifacts without the session (%s)", _describe(exc))
            return []

    def read_artifact(self, uri: str) -> str:
        """An artifact's text from `?offset=N` (default 0), ARTIFACT_READ_BYTES at most;
        MCPError for a URI that names none of the session's artifacts."""
        call_id, offset = _artifact_address(uri)
        runner, store = self._backend.connect()
        if call_id not in store.load(self.session_id).artifacts:
            raise MCPError(INVALID_PARAMS, f"Resource not found: {uri}")
        chunk = runner.read_chunk(
            ReadOutputRequest(id=call_id, offset=offset, limit=ARTIFACT_READ_BYTES)
        )
        if chunk.eof:
            return chunk.text
        return chunk.text + (
            f"\n[artifact continues: bytes {chunk.offset}-{chunk.next_offset} of {chunk.size} "
            f"shown; read artifact://{call_id}?offset={chunk.next_offset} for more]"
        )


def _artifact_address(uri: str) -> tuple[str, int]:
    """(call id, offset) of `artifact://<id>[?offset=N]`; MCPError when malformed."""
    parts = urlsplit(uri)
    offsets = parse_qs(parts.query).get("offset", ["0"])
    if parts.scheme != "artifact" or not parts.netloc or not offsets[0].isdigit():
        raise MCPError(INVALID_PARAMS, f"Resource not found: {uri}")
    return parts.netloc, int(offsets[0])


def _text_result(answer: ToolText) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=answer.text)], is_error=answer.is_error
    )


def _progress_token(ctx: ServerRequestContext[Any]) -> object:
    """The request's progress token (None: the client asked for no progress)."""
    meta = (ctx.params or {}).get("_meta")
    return meta.get("progressToken") if isinstance(meta, Mapping) else None


async def _report_progress(
    ctx: ServerRequestContext[Any], tool_server: ToolServer, watch: CallWatch
) -> None:
    """A progress notification every PROGRESS_INTERVAL_S until cancelled; never raises."""
    while True:
        await anyio.sleep(PROGRESS_INTERVAL_S)
        try:
            message = await anyio.to_thread.run_sync(
                tool_server.progress_message, watch, abandon_on_cancel=True
            )
            await ctx.session.report_progress(
                round(time.monotonic() - watch.started, 1), None, message
            )
        except anyio.get_cancelled_exc_class():
            raise
        except Exception:  # a notification is a courtesy: never fail the call for one
            log.debug("progress notification failed", exc_info=True)


def _serve_call(
    tool_server: ToolServer, name: str, arguments: Mapping[str, object], watch: CallWatch
) -> ToolText:
    try:
        return tool_server.call(name, arguments, watch)
    except Exception as exc:
        # A bug of ours: report it to the agent and keep serving.
        log.exception("tool call %s failed", name)
        return tool_server.dialect.system_error(f"internal error: {_describe(exc)}")


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
        arguments: Mapping[str, object] = params.arguments or {}
        watch = CallWatch()
        try:
            async with anyio.create_task_group() as tasks:
                if _progress_token(ctx) is not None:
                    tasks.start_soon(_report_progress, ctx, tool_server, watch)
                # Abandoned on cancel: the thread goes on until the cancelled call
                # answers (and the session is saved); the request ends at once.
                answer = await anyio.to_thread.run_sync(
                    _serve_call, tool_server, params.name, arguments, watch,
                    abandon_on_cancel=True,
                )
                tasks.cancel_scope.cancel()
        except anyio.get_cancelled_exc_class():
            # `notifications/cancelled` (or the client went away): stop the call too.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(tool_server.cancel, watch)
            raise
        return _text_result(answer)

    async def list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        del ctx, params
        found = await anyio.to_thread.run_sync(tool_server.artifacts)
        return types.ListResourcesResult(resources=[_resource(item) for item in found])

    async def read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        del ctx
        uri = str(params.uri)
        try:
            text = await anyio.to_thread.run_sync(tool_server.read_artifact, uri)
        except (BashfleetError, redis.RedisError) as exc:
            raise MCPError(INVALID_PARAMS, f"{uri}: {_describe(exc)}") from None
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="text/plain", text=text)]
        )

    return Server(
        SERVER_NAME,
        version=_version(),
        instructions=f"bash on a bashfleet fleet ({tool_server.dialect.name} dialect)",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )


def _resource(artifact: Artifact) -> types.Resource:
    """An artifact as `resources/list` shows it."""
    return types.Resource(
        uri=f"artifact://{artifact.call_id}",
        name=artifact.call_id,
        description=(
            f"Full output of `{artifact.command[:200]}` ({artifact.size} bytes, kept on "
            f"host {artifact.host})"
        ),
        mime_type="text/plain",
        size=artifact.size,
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
    resumable: bool = True,
    started_by: str | None = None,
    made_of: Mapping[str, str | None] | None = None,
) -> None:
    """Serve `dialect` over stdio until the client closes stdin (or the server is told to
    stop: SIGTERM, SIGHUP). A session that is not `resumable` (no `--session` named it:
    no one knows its id) has its workspaces deleted then, their processes with them;
    a named one keeps them for the next server of that session. `started_by`: the owner
    of who started it, on its workspaces' tags (STARTED_BY). `made_of`: what the
    session's workspaces are made of (`image`, `build`, `user`)."""
    if cwd is not None:
        # A relative path means one on this machine, as for a local fleet.
        cwd = os.path.abspath(cwd)
    backend = FleetBackend(redis_url, owner=session_owner(session_id, _key_owner()),
                           started_by=started_by,
                           made_of=made_of)
    tool_server = ToolServer(dialect, backend, session_id, host=host, cwd=cwd)
    stop = threading.Event()
    tool_server.keep_renewing(stop, RENEW_INTERVAL_S)
    signalled = Signalled()
    try:
        with signalled.stopping():
            anyio.run(_serve_stdio, build_server(tool_server))
    finally:
        stop.set()
        if not resumable:
            tool_server.delete_workspaces()
        backend.reset()
    if signalled.name is not None:
        # The thread reading stdin still waits for a line no one will send, and the
        # interpreter would wait for it at exit: leave now, everything said and done.
        log.info("stopped on %s", signalled.name)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class _Stopped(Exception):  # noqa: N818 - a signal, not an error
    """SIGTERM or SIGHUP arrived: the server stops as at the end of its stdin."""


@dataclass
class Signalled:
    """SIGTERM and SIGHUP while serving (a harness ending its server, a terminal that
    closes): they end the serving as stdin's end does, so what follows it still runs
    (their default would end the process on the spot, its workspaces left behind)."""

    name: str | None = None
    """The signal that stopped the serving (None: none did)."""

    def _stop(self, signum: int, frame: object) -> None:
        del frame
        self.name = signal.Signals(signum).name
        raise _Stopped(self.name)

    @contextlib.contextmanager
    def stopping(self) -> Iterator[None]:
        """Stop the block's serving on SIGTERM or SIGHUP (its handlers given back)."""
        previous = {sig: signal.signal(sig, self._stop)
                    for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            yield
        except _Stopped:
            pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

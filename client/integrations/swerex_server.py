"""`bashfleet swerex`: a SWE-ReX runtime server whose runtime is a bashfleet workspace
(`pip install 'bashfleet[swerex]'`).

    bashfleet swerex --label linux --port 8000 --auth-token "$TOKEN"
    RemoteDeployment(host="http://127.0.0.1", port=8000, auth_token=TOKEN)   # SWE-agent

It speaks SWE-ReX's runtime protocol (`swerex/server.py`, its request and response models
from `swerex.runtime.abstract`): `/is_alive`, `/create_session`, `/run_in_session`,
`/close_session`, `/execute`, `/read_file`, `/write_file`, `/upload`, `/close`, each
request authenticated by its `X-API-Key` header, errors carried back as SWE-ReX carries
them (status 511 with the exception's class, which `RemoteRuntime` raises again), a
retried request (the same `X-Request-ID`) answered from the first answer.

One runtime is one workspace (on the host's own root, or with `--image REF` / `--build
DIR` an image's: pulled or built on the host, its USER, WORKDIR and ENV holding; SWE-ReX's
sessions need bash in it), made at the first request that needs it, renewed while
the server lives, deleted by `/close` (the next request makes a new one) and when the
server stops: the session-less calls (`/execute`, `/read_file`, `/write_file`, `/upload`)
and every session's shell act on it, so what SWE-agent uploads its sessions run. Paths
are the workspace's calls' own (relative ones from its directory).

A session is a bash shell on a bashfleet PTY (`stdin="pty"`) in the workspace, driven by
SWE-ReX's own `BashSession` (its command splitting, syntax check, prompt and exit-code
protocol, interactive commands and interrupts): `FleetShell` gives it the part of
`pexpect.spawn` it uses, over `Fleet.write_stdin` and `Fleet.read`.

`/execute` runs its command as a call in the workspace (a list is quoted as `shlex.join`
does; `env` is laid over the host's environment rather than replacing it), whole output
read back, a timeout killing it (`CommandTimeoutError`), `check` raising
`NonZeroExitCodeError`, a signal's status -N as `subprocess` gives it.

The server binds 127.0.0.1 unless `--bind` says otherwise, and refuses to start without
a token (`--auth-token`, or BASHFLEET_SWEREX_AUTH_TOKEN so it stays out of `ps`).
SWE-ReX and its own packages load only when the server runs: the core install never
imports them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import os
import re
import shlex
import socket
import sys
import tempfile
import threading
import time
import traceback
import zipfile
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bashfleet.client.cli.arguments import SWEREX_TOKEN_VARIABLE
from bashfleet.client.errors import BashfleetError
from bashfleet.client.integrations._backend import LeaseKeeper, WorkspaceOptions, file_error
from bashfleet.worker.wire.control import Collect
from bashfleet.worker.wire.models import MAX_TIMEOUT_S, CallResult, Policy, TailLines

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import ASGIApp, Receive, Scope, Send

    from bashfleet.client.fleet import Fleet, Workspace

#: The header SWE-ReX authenticates with, and the one that names a request for retries.
TOKEN_HEADER = "x-api-key"  # noqa: S105 - a header name, not a secret
REQUEST_ID_HEADER = "x-request-id"
#: The environment variable that may hold the token (kept out of the process list; the
#: CLI's `--auth-token` defaults to it).
TOKEN_VARIABLE = SWEREX_TOKEN_VARIABLE
#: Answers kept for retried requests (SWE-ReX's own server keeps the last one only).
ANSWERS_KEPT = 64
#: pexpect.spawn's default timeout, what `expect(timeout=-1)` means.
PEXPECT_TIMEOUT_S = 30.0
#: Longest single read of a session's output (an `expect` loops until its deadline).
READ_WAIT_MAX_S = 10.0
#: Seconds a new session's shell gets to show its first prompt.
SHELL_START_S = 20.0
#: A session's output read whole (SWE-ReX returns all of it; the fleet keeps it on disk).
WHOLE = TailLines(max_lines=1 << 40, max_bytes=1 << 40)
#: The shell of a session: the terminal's echo off first, as `pexpect.spawn(echo=False)`.
SHELL_COMMAND = "stty -echo; exec /usr/bin/env bash"


def _pexpect() -> Any:
    import pexpect  # noqa: PLC0415 - a SWE-ReX dependency: loaded only with the extra

    return pexpect


def _swerex() -> tuple[Any, Any]:
    """swerex's request and response models, and its exceptions."""
    from swerex import exceptions  # noqa: PLC0415 - only with the extra
    from swerex.runtime import abstract  # noqa: PLC0415

    return abstract, exceptions


# ----------------------------------------------------------------------- the shell


class FleetShell:
    """What SWE-ReX's `BashSession` uses of `pexpect.spawn`, over a bashfleet PTY session:
    `send`/`sendline`/`sendintr`/`sendcontrol`, `expect` (regular expressions, the
    earliest match wins, `before` set), `read_nonblocking`, `close`.

    As with pexpect, what `expect` read past its match stays in its buffer for the next
    `expect`, and `read_nonblocking` returns output no `expect` has read yet."""

    def __init__(self, fleet: Fleet, workspace: Workspace, job_id: str, pending: str = ""
                 ) -> None:
        self._fleet = fleet
        self._workspace = workspace
        self.job_id = job_id
        self._buffer = ""
        self._unread = pending
        self._running = True
        self.before: str | None = None
        self.after: str | None = None
        self.match: re.Match[str] | None = None

    def send(self, text: str) -> int:
        self._fleet.write_stdin(self.job_id, text, collect=Collect(read=False))
        return len(text.encode())

    def sendline(self, text: str = "") -> int:
        return self.send(text + "\n")

    def sendintr(self) -> None:
        self.send("\x03")  # the terminal's Ctrl-C: SIGINT to its foreground group

    def sendcontrol(self, char: str) -> int:
        return self.send(chr(ord(char.lower()) & 0x1F))

    def setecho(self, state: bool) -> None:
        """Nothing to do: the terminal's echo is off from the start and stays so."""

    def waitnoecho(self, timeout: float | None = -1) -> bool:
        return True

    def expect(self, pattern: str | list[str], timeout: float | None = -1) -> int:
        patterns = [re.compile(p, re.DOTALL)
                    for p in (pattern if isinstance(pattern, list) else [pattern])]
        deadline = _deadline(timeout)
        while True:
            self._buffer += self._unread
            self._unread = ""
            found = earliest_match(patterns, self._buffer)
            if found is not None:
                index, match = found
                self.before, self.after, self.match = (
                    self._buffer[:match.start()], match.group(), match)
                self._buffer = self._buffer[match.end():]
                return index
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self.before = self._buffer
                raise _pexpect().TIMEOUT("Timeout exceeded.")
            if not self._running:
                self.before = self._buffer
                raise _pexpect().EOF("End Of File (EOF): the shell ended.")
            self._unread += self._read(left)

    def read_nonblocking(self, size: int = 1, timeout: float | None = -1) -> str:
        if not self._unread:
            deadline = _deadline(timeout)
            self._unread = self._read(None if deadline is None else deadline - time.monotonic())
        if not self._unread:
            raise _pexpect().TIMEOUT("Timeout exceeded.")
        text, self._unread = self._unread[:size], self._unread[size:]
        return text

    def _read(self, wait_s: float | None) -> str:
        """The session's new output, waiting up to `wait_s` (None: READ_WAIT_MAX_S) for
        the first of it."""
        wait = READ_WAIT_MAX_S if wait_s is None else max(0.0, min(wait_s, READ_WAIT_MAX_S))
        out = self._fleet.read(self.job_id, collect=Collect(wait_s=wait, settle_s=0,
                                                            truncation=WHOLE))
        text = out.output
        while out.more:
            out = self._fleet.read(self.job_id, collect=Collect(truncation=WHOLE))
            text += out.output
        self._running = out.running
        return text

    def close(self) -> None:
        """End the shell (and what runs in its terminal)."""
        with contextlib.suppress(BashfleetError):
            self._workspace.kill(self.job_id, signal=9)
        self._running = False


def _deadline(timeout: float | None) -> float | None:
    """pexpect's timeouts: -1 its default, None forever."""
    if timeout is None:
        return None
    return time.monotonic() + (PEXPECT_TIMEOUT_S if timeout == -1 else timeout)


def earliest_match(patterns: list[re.Pattern[str]], text: str
                   ) -> tuple[int, re.Match[str]] | None:
    """pexpect's choice: the match that starts first, the earlier pattern on a tie."""
    found = [(match.start(), index, match) for index, pattern in enumerate(patterns)
             if (match := pattern.search(text)) is not None]
    if not found:
        return None
    _, index, match = min(found, key=lambda item: (item[0], item[1]))
    return index, match


# ---------------------------------------------------------------------- the runtime


def command_text(command: str | list[str], shell: bool) -> str:
    """What bash runs for a SWE-ReX `Command` (subprocess's rules: a list is argv, a
    string without `shell` is one program's name)."""
    if isinstance(command, list):
        return shlex.join(command)
    return command if shell else shlex.quote(command)


def status_of(result: CallResult) -> int | None:
    """The exit status as `subprocess` gives it: -N when signal N ended the command."""
    if result.exit_code is not None:
        return result.exit_code
    return -result.signal if result.signal is not None else None


def execute_policy(merge_output_streams: bool) -> Policy:
    """A call of `/execute`: no timeout unless asked, killed past it, streams apart
    unless merged."""
    return Policy(name="swe-rex", streams="combined" if merge_output_streams else "separate",
                  on_timeout="kill", default_timeout_s=MAX_TIMEOUT_S)


class WorkspaceRuntime:
    """One SWE-ReX runtime: one workspace (made at first use, deleted by `close`) and
    the bash sessions in it. Its methods block (they run in the server's threads)."""

    def __init__(self, fleet: Fleet, options: WorkspaceOptions) -> None:
        self._fleet = fleet
        self._options = options
        self._lock = threading.Lock()
        self._workspace: Workspace | None = None
        self._lease: LeaseKeeper | None = None
        self._sessions: dict[str, tuple[Any, threading.Lock]] = {}

    def workspace(self) -> Workspace:
        """The runtime's workspace, made now if it has none."""
        with self._lock:
            if self._workspace is None:
                made = self._fleet.workspace(
                    **self._options.create_kwargs(tags={"framework": "swe-rex"}))
                self._lease = LeaseKeeper(made.renew, made.view.ttl_s).start()
                self._workspace = made
            return self._workspace

    def is_alive(self) -> Any:
        """Whether the runtime can serve: its workspace still recorded in Redis (not
        deleted, not expired), and a live host to run it (or to make it on). Redis reads
        only, no round trip to a worker: SWE-ReX asks with a 0.15 s timeout (the lease
        is renewed by its own thread)."""
        abstract, _ = _swerex()
        workspace = self._workspace  # not under the lock: a workspace being made holds it
        try:
            if workspace is not None:
                self._fleet.open_workspace(workspace.id)
            if not self._a_host_is_alive(None if workspace is None else workspace.host):
                return abstract.IsAliveResponse(
                    is_alive=False, message="no live host of the fleet to run the workspace")
        except BashfleetError as exc:
            return abstract.IsAliveResponse(is_alive=False, message=str(exc))
        return abstract.IsAliveResponse(is_alive=True)

    def _a_host_is_alive(self, host: str | None) -> bool:
        """A live host of the fleet: `host` itself when given, else one the options
        allow."""
        label = self._options.label
        if host is None:
            host = self._options.host
        else:
            label = None
        return any(info.alive and host in (None, info.host)
                   and (label is None or label in info.labels) for info in self._fleet.hosts())

    # -------------------------------------------------------------- sessions

    def create_session(self, request: Any) -> Any:
        abstract, exceptions = _swerex()
        with self._lock:
            if request.session in self._sessions:
                raise exceptions.SessionExistsError(f"session {request.session} already exists")
            self._sessions[request.session] = (None, threading.Lock())
        try:
            session, output = self._start_session(request)
        except BaseException:
            with self._lock:
                self._sessions.pop(request.session, None)
            raise
        with self._lock:
            self._sessions[request.session] = (session, self._sessions[request.session][1])
        return abstract.CreateBashSessionResponse(output=output)

    def _start_session(self, request: Any) -> tuple[Any, str]:
        """SWE-ReX's `BashSession.start`, with a bashfleet PTY for its pexpect child."""
        from swerex.runtime.local import BashSession, _strip_control_chars  # noqa: PLC0415

        workspace = self.workspace()
        session = BashSession(request)
        started = workspace.run(
            SHELL_COMMAND, stdin="pty", timeout=SHELL_START_S, input_wait_s=0.1,
            env={"PS1": session._ps1, "PS2": "", "PS0": ""})
        if started.job is None:
            raise RuntimeError(f"the session's shell did not start: {started.stdout!r}")
        shell = FleetShell(self._fleet, workspace, started.job.id, started.stdout)
        session._shell = shell
        commands = [f"source {path}" for path in request.startup_source]
        commands += ["sleep 0.3"] if commands else []
        shell.sendline(" ; ".join([*commands, *session._get_reset_commands()]))
        shell.expect(session._ps1, timeout=request.startup_timeout)
        return session, _strip_control_chars(shell.before or "")

    def _session(self, name: str) -> tuple[Any, threading.Lock]:
        _, exceptions = _swerex()
        with self._lock:
            found = self._sessions.get(name)
        if found is None or found[0] is None:
            raise exceptions.SessionDoesNotExistError(f"session {name!r} does not exist")
        return found

    def run_in_session(self, action: Any) -> Any:
        session, lock = self._session(action.session)
        with lock:  # one command at a time in a shell
            return asyncio.run(session.run(action))

    def close_session(self, request: Any) -> Any:
        session, lock = self._session(request.session)
        with self._lock:
            self._sessions.pop(request.session, None)
        with lock:
            return asyncio.run(session.close())

    # -------------------------------------------------- session-less calls

    def execute(self, command: Any) -> Any:
        abstract, exceptions = _swerex()
        text = command_text(command.command, command.shell)
        if not text.strip():
            return abstract.CommandResponse(stdout="", stderr="", exit_code=0)
        result = self.workspace().run(
            text, timeout=command.timeout, env=command.env or {}, cwd=command.cwd,
            policy=execute_policy(command.merge_output_streams), output="full", check=False)
        if result.timed_out:
            raise exceptions.CommandTimeoutError(
                f"Timeout ({command.timeout}s) exceeded while running command")
        if result.error is not None and result.exit_code is None:
            if result.error.kind == "bad_cwd":
                raise FileNotFoundError(result.error.message)
            raise RuntimeError(result.error.message)
        response = abstract.CommandResponse(stdout=result.stdout, stderr=result.stderr,
                                            exit_code=status_of(result))
        if command.check and response.exit_code != 0:
            message = (f"Command {command.command!r} failed with exit code "
                       f"{response.exit_code}. Stdout:\n{response.stdout!r}\n"
                       f"Stderr:\n{response.stderr!r}")
            if command.error_msg:
                message = f"{command.error_msg}: {message}"
            raise exceptions.NonZeroExitCodeError(message)
        return response

    def read_file(self, request: Any) -> Any:
        abstract, _ = _swerex()
        try:
            data = self.workspace().read_file(request.path)
        except BashfleetError as exc:
            raise file_error(exc, request.path) or exc from None
        return abstract.ReadFileResponse(
            content=data.decode(request.encoding or "utf-8", request.errors or "strict"))

    def write_file(self, request: Any) -> Any:
        abstract, _ = _swerex()
        try:
            self.workspace().write_file(request.path, request.content)
        except BashfleetError as exc:
            raise file_error(exc, request.path) or exc from None
        return abstract.WriteFileResponse()

    def upload(self, data: bytes, target_path: str, unzip: bool) -> Any:
        """A file's bytes to `target_path`; a zip's contents into the directory
        `target_path` (as SWE-ReX's `/upload` takes a directory)."""
        abstract, _ = _swerex()
        if not unzip:
            self.workspace().write_file(target_path, data)
            return abstract.UploadResponse()
        with tempfile.TemporaryDirectory(prefix="bashfleet-swerex-") as staging:
            archive = Path(staging) / "upload.zip"
            archive.write_bytes(data)
            tree = Path(staging) / "tree"
            unzip_with_modes(archive, tree)
            self.workspace().upload(tree, target_path)
        return abstract.UploadResponse()

    def close(self) -> Any:
        """End every session and delete the workspace (the next request makes another)."""
        abstract, _ = _swerex()
        with self._lock:
            sessions = [session for session, _ in self._sessions.values() if session]
            self._sessions.clear()
            workspace, self._workspace = self._workspace, None
            lease, self._lease = self._lease, None
        for session in sessions:
            session.shell.close()
        if lease is not None:
            lease.stop()
        if workspace is not None:
            with contextlib.suppress(BashfleetError):
                workspace.delete()
        return abstract.CloseResponse()


def unzip_with_modes(archive: Path, tree: Path) -> None:
    """Unpack a zip (zipfile drops absolute and `..` parts) with the permission bits
    its members were stored with: an uploaded tool stays executable (`zipfile` alone
    leaves every file 0644, as SWE-ReX's own server does)."""
    with zipfile.ZipFile(archive) as opened:
        opened.extractall(tree)
        root = tree.resolve()
        for info in opened.infolist():
            mode = (info.external_attr >> 16) & 0o777
            target = (tree / info.filename).resolve()
            if mode and not info.is_dir() and target.is_relative_to(root) and target.is_file():
                target.chmod(mode)


# ------------------------------------------------------------------------ the server


def exception_answer(exc: BaseException) -> dict[str, Any]:
    """SWE-ReX's transfer of an exception (`RemoteRuntime` raises it again by class)."""
    abstract, _ = _swerex()
    transfer = abstract._ExceptionTransfer(
        message=str(exc), class_path=f"{type(exc).__module__}.{type(exc).__name__}",
        traceback="".join(traceback.format_exception(exc)),
        extra_info=getattr(exc, "extra_info", {}) or {})
    return {"swerexception": transfer.model_dump()}


class TokenGuard:
    """Refuses every request whose X-API-Key is not the token: 403 without one, 401 with
    another (compared in constant time)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.responses import JSONResponse  # noqa: PLC0415

        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(TOKEN_HEADER.encode())
        if given is None:
            answer = JSONResponse({"detail": "Not authenticated"}, status_code=403)
        elif not hmac.compare_digest(given, self.token):
            answer = JSONResponse({"detail": "Invalid API Key"}, status_code=401)
        else:
            await self.app(scope, receive, send)
            return
        await answer(scope, receive, send)


class Answers:
    """The answers of the last requests by their X-Request-ID (a retry gets the first
    answer: the command is not run twice)."""

    def __init__(self, kept: int = ANSWERS_KEPT) -> None:
        self._kept = kept
        self._answers: OrderedDict[str, tuple[int, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, request_id: str | None) -> tuple[int, Any] | None:
        if request_id is None:
            return None
        with self._lock:
            return self._answers.get(request_id)

    def put(self, request_id: str | None, answer: tuple[int, Any]) -> None:
        if request_id is None:
            return
        with self._lock:
            self._answers[request_id] = answer
            while len(self._answers) > self._kept:
                self._answers.popitem(last=False)


Handler = Callable[["Request"], Awaitable[Any]]


def build_app(runtime: WorkspaceRuntime, token: str) -> Starlette:
    """The HTTP server: SWE-ReX's routes over `runtime`, behind the token."""
    from pydantic import TypeAdapter, ValidationError  # noqa: PLC0415
    from starlette.applications import Starlette  # noqa: PLC0415
    from starlette.concurrency import run_in_threadpool  # noqa: PLC0415
    from starlette.middleware import Middleware  # noqa: PLC0415
    from starlette.responses import JSONResponse  # noqa: PLC0415
    from starlette.routing import Route  # noqa: PLC0415

    abstract, _ = _swerex()
    answers = Answers()

    def route(path: str, handler: Handler, method: str = "POST") -> Route:
        async def endpoint(request: Request) -> Response:
            request_id = request.headers.get(REQUEST_ID_HEADER)
            found = answers.get(request_id)
            if found is None:
                try:
                    found = (200, _dump(await handler(request)))
                except ValidationError as exc:
                    found = (422, {"detail": exc.errors(include_url=False)})
                except Exception as exc:  # carried back to the client as SWE-ReX does
                    found = (511, exception_answer(exc))
                answers.put(request_id, found)
            return JSONResponse(found[1], status_code=found[0])
        return Route(path, endpoint, methods=[method])

    def body(model: Any, method: Callable[[Any], Any]) -> Handler:
        adapter = TypeAdapter(model)

        async def handler(request: Request) -> Any:
            return await run_in_threadpool(method, adapter.validate_python(await request.json()))
        return handler

    async def hello(request: Request) -> Any:
        return {"message": "hello world"}

    async def alive(request: Request) -> Any:
        return await run_in_threadpool(runtime.is_alive)

    async def upload(request: Request) -> Any:
        form = await request.form()
        sent, target = form.get("file"), form.get("target_path")
        if sent is None or isinstance(sent, str) or not isinstance(target, str):
            raise ValueError("upload needs a file and a target_path")
        data = await sent.read()
        unzip = str(form.get("unzip", "false")).lower() == "true"
        return await run_in_threadpool(runtime.upload, data, target, unzip)

    async def close(request: Request) -> Any:
        return await run_in_threadpool(runtime.close)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(runtime.close)

    routes = [
        route("/", hello, "GET"),
        route("/is_alive", alive, "GET"),
        route("/create_session", body(abstract.CreateSessionRequest, runtime.create_session)),
        route("/run_in_session", body(abstract.Action, runtime.run_in_session)),
        route("/close_session", body(abstract.CloseSessionRequest, runtime.close_session)),
        route("/execute", body(abstract.Command, runtime.execute)),
        route("/read_file", body(abstract.ReadFileRequest, runtime.read_file)),
        route("/write_file", body(abstract.WriteFileRequest, runtime.write_file)),
        route("/upload", upload),
        route("/close", close),
    ]
    return Starlette(routes=routes, lifespan=lifespan,
                     middleware=[Middleware(TokenGuard, token=token)])


def _dump(answer: Any) -> Any:
    return answer.model_dump() if hasattr(answer, "model_dump") else answer


# ------------------------------------------------------------------------------ CLI


def run(args: argparse.Namespace) -> int:
    """Serve until stopped (Ctrl-C, SIGTERM); the workspace is deleted on the way out."""
    if not args.auth_token:
        print(f"bashfleet swerex: a token is required: --auth-token T, or {TOKEN_VARIABLE}",
              file=sys.stderr)
        return 2
    try:
        import swerex  # noqa: F401, PLC0415 - only to say what is missing
        import uvicorn  # noqa: PLC0415
    except ImportError as exc:
        print(f"bashfleet swerex: {exc.name} is missing: pip install 'bashfleet[swerex]'",
              file=sys.stderr)
        return 2
    from bashfleet.client.fleet import Fleet  # noqa: PLC0415

    # Bound first: "serving" is said only of a port that is ours (a busy one is said so,
    # before a workspace is made for nothing). It listens once uvicorn's loop serves it:
    # a client that connects earlier is refused and tries again (SWE-ReX's
    # wait_until_alive), rather than kept waiting past its 0.15 s on a server starting.
    try:
        listening = bound_socket(args.bind, args.port)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        print(f"bashfleet swerex: cannot listen on {args.bind}:{args.port}: {reason}",
              file=sys.stderr)
        return 1
    options = WorkspaceOptions(host=args.host, label=args.label, ttl_s=args.ttl,
                               image=args.image, build=args.build, user=args.user)
    with listening, Fleet(**options.fleet_kwargs()) as fleet:
        runtime = WorkspaceRuntime(fleet, options)
        runtime.is_alive()  # the fleet's first Redis reads, and SWE-ReX's models, before serving
        server = uvicorn.Server(uvicorn.Config(build_app(runtime, args.auth_token),
                                               log_level="warning"))
        print(f"bashfleet swerex: serving SWE-ReX's runtime on http://{args.bind}:{args.port}",
              file=sys.stderr)
        server.run(sockets=[listening])
    return 0


def bound_socket(bind: str, port: int) -> socket.socket:
    """A TCP socket bound to `bind`:`port` (IPv6 when the address is), not listening
    yet; OSError when the port is taken or the address not ours."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind, port))
    except BaseException:
        sock.close()
        raise
    return sock

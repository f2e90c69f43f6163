"""Where an MCP server's tool calls go (see `bashfleet.client.mcp_server`): the fleet as
the dialects' runner, a runner bound to one session's state and pinned host, the watch
that lets a cancelled request reach its call, and the backends that connect them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, cast

import redis

from bashfleet.client._core.workspaces import STARTED_BY
from bashfleet.client.dialects import Runner, SessionState
from bashfleet.client.dialects.base import JobViewer, MadeWorkspace, WorkspaceMaker
from bashfleet.client.errors import (
    BashfleetError,
    FleetUnavailable,
    HostUnavailable,
    UnknownJob,
    UnknownWorkspace,
)
from bashfleet.client.fleet import Fleet, resolve_url
from bashfleet.client.sessions import RedisSessionStore
from bashfleet.worker.fleet.connect import redis_client
from bashfleet.worker.wire.control import (
    CheckRequest,
    KillRequest,
    ReadOutputRequest,
    SessionOutput,
    WriteStdinRequest,
)
from bashfleet.worker.wire.models import CallResult, CheckResult, JobView, OutputChunk, RunRequest

__all__ = [
    "Backend",
    "CallCancelledError",
    "CallWatch",
    "FleetBackend",
    "FleetRunner",
    "ServerRunner",
    "SessionRunner",
    "StaticBackend",
    "kill_unseen_job",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


# ---------------------------------------------------------------------------- runners


class FleetRunner:
    """The dialects' `Runner` on a `Fleet`; a fleet found unreachable is reported to
    `on_unavailable`, so the server connects afresh for the next call."""

    def __init__(self, fleet: Fleet, on_unavailable: Callable[[], None] | None = None,
                 tags: Mapping[str, str] | None = None, *,
                 made_of: Mapping[str, str | None] | None = None) -> None:
        self.fleet = fleet
        self._on_unavailable = on_unavailable
        self._tags = dict(tags or {})
        self.made_of = dict(made_of or {})

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

    def read_chunk(self, request: ReadOutputRequest) -> OutputChunk:
        """`Fleet.read_chunk`."""
        return self._guard(lambda: self.fleet.read_chunk(request))

    def cancel(self, call_id: str) -> bool:
        """`Fleet.cancel`."""
        return self._guard(lambda: self.fleet.cancel(call_id))

    def job_views(self, ids: list[str]) -> dict[str, JobView]:
        """`Fleet.job_views` (the native dialect's ended-job notes)."""
        return self._guard(lambda: self.fleet.job_views(ids))

    def write_stdin_request(self, request: WriteStdinRequest) -> SessionOutput:
        """`Fleet.write_stdin_request`."""
        return self._guard(lambda: self.fleet.write_stdin_request(request))

    def workspace(self, *, host: str | None = None, near: str | None = None,
                  ttl_s: float | None = None, session: str | None = None) -> MadeWorkspace:
        """`Fleet.workspace`: the session's workspace on a host (at its first call there),
        made of the server's image when it has one."""
        return self._guard(lambda: self.fleet.workspace(
            host=host, near=near, ttl_s=ttl_s, session=session, tags=self._tags,
            image=self.made_of.get("image"), build=self.made_of.get("build"),
            user=self.made_of.get("user"), build_network=self.made_of.get("build_network")))

    def renew_workspace(self, workspace_id: str) -> None:
        """Mark a workspace of the session used (the server renews them while it lives)."""
        self._guard(lambda: self.fleet.open_workspace(workspace_id).renew())

    def delete_workspace(self, workspace_id: str) -> None:
        """End a workspace of the session (one gone already is no error)."""
        with contextlib.suppress(UnknownWorkspace):
            self._guard(lambda: self.fleet.open_workspace(workspace_id).delete())


class ServerRunner(Runner, Protocol):
    """What the server needs beyond the dialects' `Runner`: cancelling a call."""

    def cancel(self, call_id: str) -> bool:
        """Withdraw a queued call or kill a running one (see `Fleet.cancel`)."""
        ...


class CallCancelledError(BashfleetError):
    """The request was cancelled: before its call was sent (nothing ran), or while it
    ran (what it started was stopped)."""


def kill_unseen_job(runner: Runner, item_id: str) -> bool:
    """Kill the job a cancelled request's call started (`item_id`: the job's id, or the
    call's, which the fleet resolves); False when the call started none."""
    try:
        runner.kill_job(KillRequest(id=item_id))
    except UnknownJob:
        return False
    log.info("job of %s killed: its request was cancelled before its id was sent", item_id)
    return True


@dataclass
class CallWatch:
    """One tool call's fleet call, so that cancelling the request reaches it.

    Its id is chosen here, before it is sent: a cancel that arrives at any moment finds
    the call (or stops it from being sent at all).
    """

    started: float = field(default_factory=time.monotonic)
    call_id: str | None = None
    cancelled: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def next_call_id(self) -> str:
        """The id of the next call this tool call sends; refused once cancelled."""
        with self._lock:
            if self.cancelled:
                raise CallCancelledError("the request was cancelled; nothing was run")
            self.call_id = f"c{uuid.uuid4().hex[:23]}"
            return self.call_id

    def cancel(self) -> str | None:
        """Mark the tool call cancelled; the id of the call it sent, if any."""
        with self._lock:
            self.cancelled = True
            return self.call_id


class SessionRunner:
    """A runner bound to one session's state: runs go to its pinned host.

    The session is pinned to the host of its first run that reached one, so later
    calls find the cwd, files and jobs the earlier ones left there. A run in a fleet
    session (`request.session`: native's `session` argument, claude's shell) goes where
    that session is pinned, unless it names a host. With a `watch`, each run's id is
    chosen here, so a cancelled request can cancel it.
    """

    def __init__(
        self, runner: Runner, state: SessionState, watch: CallWatch | None = None
    ) -> None:
        self._runner = runner
        self._state = state
        self._watch = watch

    def execute(self, request: RunRequest) -> CallResult:
        """`Runner.execute` on the pinned host (an explicit `host` wins, for one call)."""
        own_pin = request.session is None
        target = request.host or (self._state.host if own_pin else None)
        update: dict[str, object] = {"host": target}
        if self._watch is not None and request.call_id is None:
            update["call_id"] = self._watch.next_call_id()
        try:
            result = self._runner.execute(request.model_copy(update=update))
        except HostUnavailable as exc:
            if target is None or target != self._state.host:
                raise
            # The pin outlives its host (each call renews the session): say how to move it.
            raise HostUnavailable(
                f"{exc.message}. This session is pinned to {target}; to move it, restart "
                "`bashfleet mcp` with --host and a live host",
                host=exc.host,
            ) from exc
        if own_pin and self._state.host is None and result.host:
            self._state.host = result.host
        if self._watch is not None and self._watch.cancelled and result.job is not None:
            # Cancelled while its call ran, and the call went on as a job (a codex
            # session is one from its start; a call past its timeout moves to the
            # background): its answer is never sent, so the model never gets the job's
            # id. Nothing may be left running out of its reach.
            kill_unseen_job(self._runner, result.job.id)
            raise CallCancelledError(
                f"the request was cancelled; job {result.job.id}, which its call started, "
                "was killed"
            )
        return result

    def check_job(self, request: CheckRequest) -> CheckResult:
        """`Runner.check_job` (jobs are routed by id, wherever they run)."""
        return self._runner.check_job(request)

    def kill_job(self, request: KillRequest) -> CheckResult:
        """`Runner.kill_job`."""
        return self._runner.kill_job(request)

    def read_chunk(self, request: ReadOutputRequest) -> OutputChunk:
        """`Runner.read_chunk` (routed by id)."""
        return self._runner.read_chunk(request)

    def job_views(self, ids: list[str]) -> dict[str, JobView]:
        """`JobViewer.job_views` of the runner, when it has it."""
        if not isinstance(self._runner, JobViewer):
            return {}
        return self._runner.job_views(ids)

    def write_stdin_request(self, request: WriteStdinRequest) -> SessionOutput:
        """`Runner.write_stdin_request` (sessions are routed by job id, wherever they run)."""
        return self._runner.write_stdin_request(request)

    def workspace(self, *, host: str | None = None, near: str | None = None,
                  ttl_s: float | None = None, session: str | None = None) -> MadeWorkspace:
        """The runner's `workspace` (NotImplementedError when it makes none: its calls
        then run in throwaway workspaces)."""
        if not isinstance(self._runner, WorkspaceMaker):
            raise NotImplementedError("this runner makes no workspaces")
        return self._runner.workspace(host=host, near=near, ttl_s=ttl_s, session=session)


# ---------------------------------------------------------------------------- backend


class Backend(Protocol):
    """Where a tool server's calls go and its session lives."""

    def connect(self) -> tuple[ServerRunner, RedisSessionStore]:
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

    def __init__(self, redis_url: str | None = None, owner: str | None = None,
                 started_by: str | None = None, *,
                 made_of: Mapping[str, str | None] | None = None) -> None:
        """`owner`: who the calls and jobs of this server belong to (its session);
        `started_by`: who started it (its workspaces say so: STARTED_BY); `made_of`: what
        its session's workspaces are made of (`image`, `build`, `user`)."""
        self._redis_url = redis_url
        self._owner = owner
        self._tags = {STARTED_BY: started_by} if started_by else {}
        self.made_of = dict(made_of or {})
        self._lock = threading.Lock()
        self._connected: tuple[FleetRunner, RedisSessionStore, redis.Redis] | None = None

    def connect(self) -> tuple[ServerRunner, RedisSessionStore]:
        """A runner on the fleet and the session store on the fleet's Redis."""
        with self._lock:
            if self._connected is None:
                url = resolve_url(self._redis_url)
                # No URL: FleetUnavailable, with what to do about it. Never an admin: an
                # agent's tools reach only their own session's jobs.
                fleet = Fleet(url, owner=self._owner)
                client = redis_client(cast("str", url))
                runner = FleetRunner(fleet, on_unavailable=self.reset, tags=self._tags,
                                     made_of=self.made_of)
                # Locked with its owner's key, in its owner's space: the session's shell
                # is the one `bashfleet run --session` of the same owner uses.
                identity = fleet._identity
                store = RedisSessionStore(client, key=identity.shell_key,
                                          space=identity.shell_space)
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

    runner: ServerRunner
    store: RedisSessionStore

    def connect(self) -> tuple[ServerRunner, RedisSessionStore]:
        """The runner and store given."""
        return self.runner, self.store

    def reset(self) -> None:
        """Nothing to reconnect."""

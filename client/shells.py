"""Shell sessions: the cwd and environment a named session carries between its calls.

Pure (no Redis): what a session's state is, how it fills a call, and what a finished call
changes in it. The state lives in Redis (`bashfleet.client.sessions.ShellStore`, key
`bashfleet:shell:<id>`) so every caller shares it: `bashfleet run --session S`,
`Fleet.run(..., session=S)`, the native dialect's `session` argument, the claude dialect's
persistence of cwd and variables across calls and every MCP server's own session.

    shell = store.load("s1")                       # host pin, cwd, env, unset names
    result = fleet.execute(fill_request(shell, request))
    store.commit("s1", change_of(result))          # atomically, onto the stored state

A call's effect is stored as a *change*, never as the state it saw: the directory it
`cd`-ed into (only if it changed directory: its final `$PWD` differs from the one it
started in), the variables it exported or changed, the ones it unset. So two calls of
one session that run at once both count, whichever ends last: a slow call that did not
`cd` leaves a quick one's `cd` alone. Two calls that both `cd` end where the later one
went, as two shells writing one file would.

Variables that make bash run code (BASH_ENV, LD_PRELOAD, BASH_FUNC_*...) are never
carried: a command that exported one does not get it into the next call (which the
worker would refuse, failing every later call of the session).
"""

from __future__ import annotations

import posixpath

from pydantic import BaseModel, ConfigDict, Field

from bashfleet.client.errors import CallRejected, SessionPinned
from bashfleet.worker.wire.models import CallResult, RunRequest, runs_code

__all__ = [
    "ShellChange",
    "ShellState",
    "apply_change",
    "carryable",
    "change_of",
    "check_pin",
    "fill_request",
]

#: Names a session never carries besides those that make bash or the loader run code
#: (`runs_code`, which the worker refuses in `Call.env`: a session drops them instead):
#: ones that change how a later command line is read, and the fleet's own.
_NOT_CARRIED = frozenset({"BASH_XTRACEFD", "CDPATH", "GLOBIGNORE"})


def carryable(name: str) -> bool:
    """True when a variable may travel from one call of a session to the next."""
    return (
        bool(name) and "=" not in name and not runs_code(name)
        and name not in _NOT_CARRIED and not name.startswith("BASHFLEET_")
    )


class ShellState(BaseModel):
    """A session's shell as stored: where its next call runs and with what environment."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    host: str | None = None
    """Host the session's calls are pinned to (its cwd and files are there)."""
    cwd: str | None = None
    """Directory the session's next call starts in (None: the worker's home)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables its calls exported or changed."""
    unset_env: tuple[str, ...] = ()
    """Variables its calls unset: kept out of later calls, the worker's own included."""
    workspace: str | None = None
    """The session's workspace (on its pinned host): its calls' processes, /tmp and
    files are shared there; made at the session's first call."""


class ShellChange(BaseModel):
    """What one call changed in its session's shell."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    host: str | None = None
    """Host the call ran on: pins a session that has no pin yet."""
    cwd: str | None = None
    """Directory the call changed into; None: it did not change directory."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables it exported or changed."""
    unset_env: tuple[str, ...] = ()
    """Variables it unset."""
    force_host: bool = False
    """The host replaces an existing pin (a server's `--host`), not only an empty one."""
    workspace: str | None = None
    """A workspace made for the session: kept only when it has none yet (the first one
    made wins), unless `force_workspace` (its old one ended)."""
    force_workspace: bool = False
    started_in: str | None = None
    """The directory the call ran in: a session with no cwd yet starts its next calls
    there (the first call's cwd is where the session was opened)."""

    def __bool__(self) -> bool:
        return bool(self.host or self.cwd or self.env or self.unset_env)


def fill_request(shell: ShellState, request: RunRequest) -> RunRequest:
    """The request as the session runs it: its host, cwd and environment filled in.

    What the request says itself wins: a label, a cwd or a variable; its `default_cwd`
    holds only while the shell has no cwd of its own. A host it names must be the
    session's pinned host, if it has one (SessionPinned otherwise: the session's cwd
    and files are on the pinned host, so running elsewhere would silently run
    somewhere else than the caller believes). A foreground call asks the worker for
    the state it ends in (`capture_state`); a background job or an interactive session
    ends after later calls ran, so it cannot say.
    """
    check_pin(shell, request)
    if shell.workspace is not None and request.workspace not in (None, shell.workspace):
        raise CallRejected(f"session {request.session} runs in workspace {shell.workspace}: "
                           f"a call of it cannot run in workspace {request.workspace}")
    env = {**shell.env, **request.env}
    unset = tuple(dict.fromkeys(
        name for name in (*shell.unset_env, *request.unset_env) if name not in env
    ))
    pinned = request.host is None and request.label is None
    return request.model_copy(update={
        "host": shell.host if pinned else request.host,
        "cwd": session_cwd(request.cwd, shell.cwd or request.default_cwd),
        "env": env,
        "unset_env": unset,
        "workspace": request.workspace or shell.workspace,
        "capture_state": request.capture_state or (
            request.mode != "background" and request.stdin == "null"
        ),
    })


def session_cwd(asked: str | None, current: str | None) -> str | None:
    """Where a session's call runs: `asked` when absolute (or `~`), relative to the
    session's cwd when relative (`cd tmp` would go there; the worker's own cwd means
    nothing to the caller), the session's cwd when none is asked. A session with no
    cwd yet leaves a relative one to the worker, which joins it to the workspace."""
    if not asked:
        return current
    if asked.startswith(("/", "~")) or not current:
        return asked
    return posixpath.normpath(posixpath.join(current, asked))


def check_pin(shell: ShellState, request: RunRequest) -> None:
    """SessionPinned when the request names another host than its session's pinned one."""
    asked, pinned = request.host, shell.host
    if asked is None or pinned is None or asked == pinned:
        return
    session = request.session or "?"
    raise SessionPinned(
        f"session {session} is pinned to host {pinned} (its cwd and files are there): "
        f"it cannot run a call on host {asked}; leave out the host, or use another "
        "session", session=session, pinned=pinned, asked=asked,
    )


def change_of(result: CallResult) -> ShellChange:
    """What a finished call changed in its session (nothing, for a call that never ran)."""
    host = result.host or None
    moved = result.cwd_after if result.cwd_after and result.cwd_after != result.cwd else None
    return ShellChange(
        host=host,
        cwd=moved,
        env={name: value for name, value in result.env_changes.items() if carryable(name)},
        unset_env=tuple(name for name in result.env_removed if carryable(name)),
        started_in=result.cwd if result.error is None else None,
    )


def apply_change(shell: ShellState, change: ShellChange) -> ShellState:
    """The session after a call: its change laid onto the state stored now.

    A change made on another host than the pinned one does not move the pinned
    session's cwd (that directory is on the other machine); its variables still count.
    """
    host = shell.host
    if change.host is not None and (host is None or change.force_host):
        host = change.host
    cwd = shell.cwd
    if change.cwd is not None and (change.host is None or change.host == host):
        cwd = change.cwd
    elif cwd is None and change.started_in is not None and change.host in (None, host):
        cwd = change.started_in
    workspace = shell.workspace
    if change.workspace is not None and (workspace is None or change.force_workspace):
        if workspace is not None and cwd is not None and f"/{workspace}/" in f"{cwd}/":
            cwd = None  # it was in the ended workspace's own directory: gone with it
        workspace = change.workspace
    env = {**shell.env, **change.env}
    unset = [name for name in shell.unset_env if name not in change.env]
    for name in change.unset_env:
        env.pop(name, None)
        if name not in unset:
            unset.append(name)
    return ShellState(host=host, cwd=cwd, env=env, unset_env=tuple(unset), workspace=workspace)


def workspace_gone(result: CallResult) -> bool:
    """True when a call was refused because the workspace it named had ended (unused
    past its TTL, or deleted): a session gets a new one."""
    error = result.error
    return error is not None and error.kind == "not_found" and error.missing == "workspace"


#: What a session's call says when its workspace had ended and a new one was made.
NEW_WORKSPACE_NOTICE = ("[bashfleet: this session's workspace had ended (unused past its "
                        "TTL); the command ran in a new one: files and processes of the "
                        "old one are gone]\n")


def with_new_workspace(result: CallResult) -> CallResult:
    """The result of a call rerun in a new workspace, saying so."""
    field = "stdout" if result.combined else "stderr"
    return result.model_copy(update={field: NEW_WORKSPACE_NOTICE + getattr(result, field)})

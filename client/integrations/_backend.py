"""What the framework adapters share: how a workspace is asked for (`WorkspaceOptions`,
which each framework takes in its own way: inspect's config, the Agents SDK's options,
Harbor's `--ek key=value`, mini-swe-agent's environment config, `bashfleet swerex`'s
flags; an image among them), one fleet client per event loop, the lease kept while a
framework holds its workspace (a task or a thread), and the few translations a
framework's exec needs that the client does not do (stdin bytes, a command line past a
call's cap, `user=`, the command's own output, exit statuses, file errors).

Nothing here runs a command or moves a file itself: that is `Workspace`'s. A framework's
`exec(cmd, input=...)` becomes one `Workspace.run`; its stdin and an over-long command
line travel as files of the workspace's own /tmp (`Workspace.write_file`), which the
command removes before it runs; its stdout and stderr come back through files there too
(`ExactOutput`), byte for byte. A `user=` other than the workspace's own is had from a
root workspace (`InsideUser`, `as_user`); `made_root` makes an image's workspace root
with the image's USER as its calls' default, for frameworks that ask for root at times.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shlex
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bashfleet.client._async.fleet import AsyncFleet
from bashfleet.client._async.workspace import AsyncWorkspace
from bashfleet.client.errors import BashfleetError, UnknownWorkspace, WorkspaceFileError
from bashfleet.worker.wire.models import MAX_COMMAND_BYTES, CallResult, Tags, WorkspaceLimits

#: Longest command sent inline. A call's command is capped at MAX_COMMAND_BYTES (1 MiB);
#: a framework may hand us more (inspect's conformance cases send a 1 MiB argv), so a
#: longer one is written to the workspace and sourced from there. Below the cap by a
#: margin: the stdin wrapper adds a few bytes.
INLINE_COMMAND_BYTES = MAX_COMMAND_BYTES - 4096

#: Longest pause between two renewals of a held workspace's lease.
MAX_RENEW_INTERVAL_S = 600.0


class WorkspaceOptions(BaseModel):
    """Where and how a framework's environment is made: `Fleet.workspace`'s arguments.
    The fleet itself (its Redis URL and the owner, unless given here) comes from the
    usual BASHFLEET_* settings; these override the host's defaults."""

    model_config = ConfigDict(extra="forbid")

    redis_url: str | None = None
    """The fleet's Redis (default BASHFLEET_REDIS_URL, else the local fleet's)."""
    host: str | None = None
    """The host to make it on (None: a live host of `label`, else of the fleet)."""
    label: str | None = None
    """A pool label: any live host that has it."""
    path: str | None = None
    """An existing host directory under a root the host allows (None: a fresh one)."""
    isolation: Literal["none", "process", "strict"] | None = None
    """At least the host's level (None: the host's)."""
    network: str | bool | None = None
    """Its network policy: `egress`, `none`, `allow=DOMAIN,CIDR,...`, `host` (False:
    `none`; None: the host's default)."""
    ttl_s: float | None = Field(None, gt=0)
    """Seconds it lives unused (None: the host's default, 1 h). Held environments are
    renewed while they live."""
    limits: WorkspaceLimits | None = None
    """memory_mb, procs, cpus, disk_mb of its processes together (None: the host's)."""
    mounts: dict[str, str] = Field(default_factory=dict)
    """Absolute paths in its calls' view -> its own subdirectories."""
    tags: Tags = Field(default_factory=dict)
    """Tags, for listings (`workspace ls`)."""
    owner: str | None = None
    """Who it belongs to (default BASHFLEET_OWNER, else `user:<login>`)."""
    image: str | None = None
    """An OCI image reference: its root filesystem is the workspace's `/` (None: the
    host's own root)."""
    build: str | None = None
    """A local directory with a Dockerfile, built on the host: the image of its `/`."""
    user: str | None = None
    """Who its calls run as inside (a name, `uid` or `uid:gid`; None: the image's USER,
    else root)."""

    @model_validator(mode="after")
    def _one_place(self) -> WorkspaceOptions:
        if self.host is not None and self.label is not None:
            raise ValueError("give a host or a label, not both")
        if self.image is not None and self.build is not None:
            raise ValueError("give an image or a build directory, not both")
        return self

    def __hash__(self) -> int:
        # Frameworks key their caches by config (inspect does): hash what it says, dicts
        # included.
        return hash(self.model_dump_json())

    def fleet_kwargs(self) -> dict[str, Any]:
        """`Fleet(...)`'s / `AsyncFleet(...)`'s arguments."""
        return {"redis_url": self.redis_url, "owner": self.owner}

    def create_kwargs(self, tags: Mapping[str, str] | None = None, **override: Any
                      ) -> dict[str, Any]:
        """`Fleet.workspace`'s keyword arguments (`tags` added to the options',
        `override` wins: a framework's own mounts or network)."""
        made = {
            "host": self.host, "label": self.label, "path": self.path, "ttl_s": self.ttl_s,
            "isolation": self.isolation, "network": self.network, "limits": self.limits,
            "mounts": dict(self.mounts), "tags": {**(tags or {}), **self.tags},
            "image": self.image, "build": self.build, "user": self.user,
        }
        made.update(override)
        return made

    def from_snapshot_kwargs(self, snapshot: str, tags: Mapping[str, str] | None = None,
                             **override: Any) -> dict[str, Any]:
        """`Fleet.workspace`'s keyword arguments for a workspace made from a snapshot: its
        files, paths and base (image or host root) are the snapshot's, so the options'
        image, build, path, mounts and user are not passed (its user is the snapshot's);
        where it lives, its lease, network, limits and tags are the options'."""
        made = self.create_kwargs(tags, **override)
        for taken in ("image", "build", "path", "mounts", "user"):
            made.pop(taken, None)
        made["snapshot"] = snapshot
        return made


# --------------------------------------------------------------------------- the fleet


@dataclass
class _Held:
    fleet: AsyncFleet
    users: int = 0


@dataclass
class FleetPool:
    """One `AsyncFleet` per event loop and owner, shared by every environment of a
    process and closed when the last one lets go: a hundred samples at once share one
    reply listener and one watch instead of a hundred (an AsyncFleet belongs to one
    loop, hence the key)."""

    redis_url: str | None = None
    """The fleet's Redis (None: BASHFLEET_REDIS_URL, else the local fleet)."""
    _held: dict[tuple[asyncio.AbstractEventLoop, str | None], _Held] = field(
        default_factory=dict)

    def acquire(self, owner: str | None) -> AsyncFleet:
        """The loop's fleet client for `owner`, made on first use; `release` it after."""
        key = (asyncio.get_running_loop(), owner)
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = _Held(AsyncFleet(self.redis_url, owner=owner))
        held.users += 1
        return held.fleet

    async def release(self, owner: str | None) -> None:
        """Let go of one `acquire`; the last one closes the client."""
        key = (asyncio.get_running_loop(), owner)
        held = self._held.get(key)
        if held is None:
            return
        held.users -= 1
        if held.users <= 0:
            del self._held[key]
            await held.fleet.close()


def renew_interval(ttl_s: float) -> float:
    """Seconds between renewals of a lease of `ttl_s`: a third of it (two chances before
    it ends), at most MAX_RENEW_INTERVAL_S."""
    return min(MAX_RENEW_INTERVAL_S, max(1.0, ttl_s / 3))


async def keep_lease(renew: Callable[[], Any], ttl_s: float) -> None:
    """Renew a workspace until cancelled or gone (`renew`: `AsyncWorkspace.renew`): an
    agent may think for longer than the TTL between two commands. A renewal that fails
    (the fleet away for a moment) is tried again at the next tick; a workspace gone for
    good ends it (the holder's next use says so)."""
    interval = renew_interval(ttl_s)
    while True:
        await asyncio.sleep(interval)
        try:
            await renew()
        except UnknownWorkspace:
            return
        except BashfleetError:
            continue


class Renewer:
    """`keep_lease` as a task of the running loop, for an asyncio framework."""

    def __init__(self, workspace: AsyncWorkspace) -> None:
        self._task: asyncio.Task[None] | None = asyncio.create_task(
            keep_lease(workspace.renew, workspace.view.ttl_s))

    async def stop(self) -> None:
        """Stop renewing."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class LeaseKeeper:
    """`keep_lease` from a daemon thread, for a blocking framework (`Workspace.renew`)."""

    def __init__(self, renew: Callable[[], object], ttl_s: float) -> None:
        self._renew = renew
        self._interval = renew_interval(ttl_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bashfleet-lease",
                                        daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):  # a timed wait on the stop event
            try:
                self._renew()
            except UnknownWorkspace:
                return
            except BashfleetError:
                continue

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


# ---------------------------------------------------------------------- commands


def staging_path(kind: str) -> str:
    """A file of the workspace's own /tmp that carries a command's stdin or script."""
    return f"/tmp/.bashfleet-{kind}-{uuid.uuid4().hex[:16]}"


def with_stdin(command: str, path: str) -> str:
    """`command` reading `path` as its stdin, the file removed once open (a newline
    before the brace: the command may end in a comment)."""
    quoted = shlex.quote(path)
    return f"{{ rm -f -- {quoted}; {command}\n}} < {quoted}"


def script_of(command: str, path: str) -> str:
    """The script that runs `command` from `path` (sourced, so the call's shell, cwd and
    variables are its), removing itself first: bash reads a sourced file whole."""
    return f"rm -f -- {shlex.quote(path)}\n{command}\n"


def sourcing(path: str) -> str:
    """The call that runs a script written by `script_of`."""
    return f". {shlex.quote(path)}"


@dataclass(frozen=True)
class Staged:
    """A framework's command as one call: its text, and the files to write first."""

    command: str
    files: tuple[tuple[str, bytes], ...] = ()


def stage(command: str, stdin: bytes | None,
          inline_bytes: int = INLINE_COMMAND_BYTES) -> Staged:
    """`command` (with `stdin` when not None, even empty) as one call of at most
    `inline_bytes`: stdin in a file it reads, a longer command in a script it sources."""
    files: list[tuple[str, bytes]] = []
    if stdin is not None:
        stdin_path = staging_path("stdin")
        files.append((stdin_path, stdin))
        command = with_stdin(command, stdin_path)
    if len(command.encode()) > inline_bytes:
        script_path = staging_path("script")
        files.append((script_path, script_of(command, script_path).encode()))
        command = sourcing(script_path)
    return Staged(command, tuple(files))


async def run_staged(workspace: AsyncWorkspace, staged: Staged, **options: Any) -> CallResult:
    """Write a staged command's files, then run it (`AsyncWorkspace.run`'s options)."""
    for path, data in staged.files:
        await workspace.write_file(path, data, mode=0o600)
    return await workspace.run(staged.command, **options)


def capturing(command: str, out: str, err: str, stale: Sequence[str] = ()) -> str:
    """`command` with its stdout and stderr in the files `out` and `err` (the files of
    `stale`, earlier captures read already, removed first)."""
    removed = f"rm -f -- {' '.join(map(shlex.quote, stale))}\n" if stale else ""
    return f"{removed}{{ {command}\n}} >{shlex.quote(out)} 2>{shlex.quote(err)}"


@dataclass(frozen=True)
class Exact:
    """A call and its command's output as the command wrote it (`ExactOutput.run`)."""

    result: CallResult
    stdout: bytes
    """At most `max_bytes + 1` bytes: more than `max_bytes` says there was more."""
    stderr: bytes


class ExactOutput:
    """Calls whose output comes back byte for byte. A call's own output is the fleet's
    text (sanitized: ANSI and control bytes dropped, `\\r\\n` read as `\\n`; redacted),
    which is right for a model to read and wrong for a harness that parses what a command
    printed; so the command writes its stdout and stderr to files of the workspace's
    own /tmp, read back whole after it. Each call removes the files of the calls before
    it (read already): no call of its own for that; the last ones go with the workspace."""

    def __init__(self, workspace: AsyncWorkspace) -> None:
        self._workspace = workspace
        self._stale: list[str] = []

    async def run(self, staged: Staged, max_bytes: int, **options: Any) -> Exact:
        """Run a staged command (`AsyncWorkspace.run`'s options); its output, each
        stream read up to `max_bytes + 1` bytes."""
        out, err = staging_path("stdout"), staging_path("stderr")
        stale, self._stale = self._stale, []
        try:
            result = await run_staged(self._workspace, Staged(
                capturing(staged.command, out, err, stale), staged.files), **options)
        except BaseException:
            self._stale += stale
            raise
        if result.error is not None and result.exit_code is None:  # it did not run
            self._stale += stale
            return Exact(result, b"", b"")
        self._stale += [out, err]
        # Both at once: one round trip's wait, not two.
        stdout, stderr = await asyncio.gather(self._read(out, max_bytes),
                                              self._read(err, max_bytes))
        return Exact(result, stdout, stderr)

    async def _read(self, path: str, max_bytes: int) -> bytes:
        try:
            return await self._workspace.read_file(path, max_bytes=max_bytes + 1)
        except FileNotFoundError:
            return b""  # killed before its shell opened the file


def shell_line(argv: Sequence[str]) -> str:
    """An argv as one shell command line (each word quoted as needed)."""
    if not argv:
        raise ValueError("an empty command")
    return shlex.join(argv)


def exit_status(exit_code: int | None, signal: int | None) -> int:
    """A shell's status for a process: its exit code, 128+N when signal N ended it, 1
    when neither is known."""
    if exit_code is not None:
        return exit_code
    return 128 + signal if signal is not None else 1


# --------------------------------------------------------------------------- users


class UserUnavailableError(PermissionError):
    """A framework's `user=` that the workspace's calls cannot become."""


def as_user(command: str, user: str) -> str:
    """`command` run as `user` by a call that is root inside its workspace (which holds
    every capability of its own namespace): with `setpriv` for a numeric `uid[:gid]`, else
    util-linux's `runuser` where the image has it, else `su` (busybox's too), in the
    call's own shell (bash where it has one)."""
    inner = shlex.quote(command)
    uid, _, gid = user.partition(":")
    if uid.isdigit() and (not gid or gid.isdigit()):
        return (f'setpriv --reuid={uid} --regid={gid or uid} --clear-groups -- '
                f'"${{BASH:-/bin/sh}}" -c {inner}')
    name = shlex.quote(user)
    return (f"if command -v runuser >/dev/null 2>&1; then "
            f'runuser -u {name} -- "${{BASH:-/bin/sh}}" -c {inner}; '
            f'else su -s "${{BASH:-/bin/sh}}" -c {inner} {name}; fi')


def cannot_become(user: str, current: str) -> str:
    """Why a call of a workspace whose calls run as `current` cannot run as `user`."""
    return (f"this workspace's calls run as {current!r}, not root, so a command cannot run "
            f"as {user!r}: make the workspace with user 'root' (the framework's config: "
            "`user: root`) to run commands as other users")


class InsideUser:
    """Who a workspace's calls run as inside it (asked once: `id -un; id -u`), and how a
    framework's `user=` is had: as it is when it names that user, switched to from root
    (`as_user`), else refused (`UserUnavailableError`). `default`: the user a call that
    names none runs as (an image's USER in a workspace made root for a framework that
    asks for root at times: `made_root`)."""

    def __init__(self, workspace: AsyncWorkspace, default: str | None = None) -> None:
        self._workspace = workspace
        self.default = default
        """The user of a call that names none (None: the workspace's own)."""
        self.names: tuple[str, ...] = ()
        """The workspace's user's name and uid, once asked."""

    async def known(self) -> tuple[str, ...]:
        """The workspace's user's name and uid."""
        if not self.names:
            found = await self._workspace.run("id -un 2>/dev/null; id -u", check=False)
            self.names = tuple(found.stdout.split())
        return self.names

    async def command_as(self, command: str, user: str | None) -> str:
        """`command` as a call that runs it as `user` (None: the default user)."""
        user = user if user is not None else self.default
        if user is None:
            return command
        names = await self.known()
        if user in names:
            return command
        if "0" in names:
            return as_user(command, user)
        raise UserUnavailableError(cannot_become(user, names[0] if names else "?"))

    async def check(self, user: str | None) -> None:
        """UserUnavailableError unless a call can run as `user`."""
        await self.command_as("", user)


async def made_root(fleet: AsyncFleet, kwargs: dict[str, Any]
                    ) -> tuple[AsyncWorkspace, str | None]:
    """A workspace as `Fleet.workspace(**kwargs)` makes it, but root when it is an
    image's and no user is asked for, with the image's USER as the default user of its
    calls (None: root, or a user was asked for). A container's runtime runs a command as
    root whenever asked (`docker exec -u root`), whatever the image's USER; a workspace of
    a user other than root could never become root again."""
    if kwargs.get("user") is not None or not (kwargs.get("image") or kwargs.get("build")):
        return await fleet.workspace(**kwargs), None
    workspace = await fleet.workspace(**{**kwargs, "user": "root"})
    try:
        return workspace, await image_user(fleet, workspace)
    except BaseException:
        await workspace.delete()
        raise


async def image_user(fleet: AsyncFleet, workspace: AsyncWorkspace) -> str | None:
    """The USER of a workspace's image as its host holds it (None: root, or none)."""
    digest = (workspace.view.image or "").rpartition("@")[2]
    for info in await fleet.images(host=workspace.host):
        if info.digest == digest:
            return None if info.user in ("", "root", "0", "0:0") else info.user
    return None


# --------------------------------------------------------------------------- files

#: The workspace's file tools' messages (`bashfleet.worker.engine.files`, and bash's own for a
#: write) -> the OSError a framework expects.
_FILE_ERRORS: tuple[tuple[str, type[OSError], int], ...] = (
    ("No such file or directory", FileNotFoundError, errno.ENOENT),
    ("Is a directory", IsADirectoryError, errno.EISDIR),
    ("Not a directory", NotADirectoryError, errno.ENOTDIR),
    ("Permission denied", PermissionError, errno.EACCES),
    ("Read-only file system", PermissionError, errno.EROFS),
)


def file_error(exc: BashfleetError, path: str) -> OSError | None:
    """The OSError a failed file operation on `path` stands for, with the framework's
    path in it; None when it is no file error (the workspace is gone, the fleet cannot be
    reached). The workspace's file tools type theirs (`WorkspaceFileError`); what they
    leave untyped (a read-only file system under a write) is told by its message."""
    if isinstance(exc, WorkspaceFileError):
        typed: tuple[type[OSError], ...] = (FileNotFoundError, IsADirectoryError,
                                            NotADirectoryError, PermissionError)
        for builtin in typed:
            if isinstance(exc, builtin):
                return builtin(exc.errno, os.strerror(exc.errno or errno.EIO), path)
    return os_error_in(exc.message, path)


def os_error_in(message: str, path: str) -> OSError | None:
    """The OSError a file tool's (or a shell's) message says, with `path` in it."""
    for text, kind, code in _FILE_ERRORS:
        if text in message:
            return kind(code, text, path)
    return None


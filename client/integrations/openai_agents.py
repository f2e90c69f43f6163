"""bashfleet as an OpenAI Agents SDK sandbox: `BashfleetSandboxClient`.

    pip install 'bashfleet[openai-agents]'
    run_config = RunConfig(sandbox=SandboxRunConfig(client=BashfleetSandboxClient(),
                                                    options=BashfleetSandboxClientOptions()))

A sandbox session is a workspace on the fleet (`AsyncWorkspace`): `create` makes one,
`resume` opens it again from a saved `BashfleetSandboxSessionState` (or makes a new one
when it ended: its snapshot then hydrates it), `delete` removes it. The fleet is the usual
BASHFLEET_* settings' (BASHFLEET_REDIS_URL, BASHFLEET_OWNER); the options say where and
how (host or label, image or build, user, isolation, network, ttl, limits, mounts): with
`image` the workspace's `/` is that image, pulled onto the host (its USER, WORKDIR and
ENV hold; the manifest root is still the workspace's own directory). The manifest's
default root (`/workspace`) becomes the workspace's own directory; another root is shown
at its path in the calls' view (a mount of the workspace).

- `exec`: one `run` in the workspace, in the manifest root with the manifest's
  environment; a timeout kills the process group (ExecTimeoutError). Output is the
  command's own bytes (`ExactOutput`), never the fleet's sanitized text.
- `exec(user=...)`: the workspace's own user (the image's USER, else root, unless the
  options' `user` says) runs it as is; a root workspace runs it as any user of its image
  (`runuser`/`su`, not the SDK's `sudo -u`: images seldom have sudo); a workspace of
  another user refuses it (PermissionError). `read(user=...)` and `write(user=...)` are
  checked the same way and act as the workspace's user.
- `read` / `write`: `AsyncWorkspace.read_file` / `write_file`.
- `pty_exec_start` / `pty_write_stdin` (Codex's exec_command / write_stdin): the fleet's
  interactive sessions (`stdin="pty"` with `tty`, else stdin closed); a process still
  running after `yield_time_s` gets a process id (1000..99999) that `pty_write_stdin`
  writes to (Ctrl-C is `\\u0003`) and polls; output is cut to `max_output_tokens` as
  Codex cuts it, head and tail.
- `persist_workspace` / `hydrate_workspace` (the SDK's snapshots: `stop` persists into
  the session's `SnapshotBase`, a new session hydrates from it): by default a native
  snapshot of the workspace (the fleet's: its files frozen at once, no copy, no process
  state), whose reference (`SnapshotRef`, a few bytes headed `BASHFLEET_SNAPSHOT_V1`, as the
  SDK's Modal, E2B and Runloop sessions mark theirs) is what the SDK's snapshot stores.
  Hydrating a reference restores the workspace it was taken of (its processes end), or
  puts the session on a new workspace made from it (a resumed or new session: `create` /
  `resume` make that one from the snapshot at once). The manifest's ephemeral paths are
  set aside while a snapshot is taken. `workspace_persistence="tar"`, or a manifest with
  mounts, persists a tar of the root instead (made and unpacked in the workspace); a tar
  is always hydrated as one.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import shlex
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

try:
    from agents.sandbox.errors import (
        ExecTimeoutError,
        ExecTransportError,
        PtySessionNotFoundError,
        WorkspaceArchiveReadError,
        WorkspaceArchiveWriteError,
        WorkspaceReadNotFoundError,
    )
    from agents.sandbox.manifest import Manifest
    from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
    from agents.sandbox.session.dependencies import Dependencies
    from agents.sandbox.session.manager import Instrumentation
    from agents.sandbox.session.pty_types import (
        PTY_PROCESSES_MAX,
        PtyExecUpdate,
        allocate_pty_process_id,
        clamp_pty_yield_time_ms,
        process_id_to_prune_from_meta,
        resolve_pty_write_yield_time_ms,
    )
    from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
    from agents.sandbox.session.sandbox_session import SandboxSession
    from agents.sandbox.session.sandbox_session_state import SandboxSessionState
    from agents.sandbox.session.tar_workspace import shell_tar_exclude_args
    from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
    from agents.sandbox.types import ExecResult, User
except ModuleNotFoundError as exc:  # the extra is not installed: say which
    from bashfleet.client.integrations import missing_extra

    raise missing_extra(__name__, "the OpenAI Agents SDK", "openai-agents", exc) from exc

from pydantic import Field

from bashfleet.client._async.fleet import AsyncFleet
from bashfleet.client._async.workspace import AsyncWorkspace
from bashfleet.client.dialects.codex import (
    INPUT_WAIT_S,
    MAX_OUTPUT_TOKENS,
    WRITE_SETTLE_S,
    shown_output,
)
from bashfleet.client.errors import BashfleetError, UnknownJob, UnknownWorkspace
from bashfleet.client.integrations._backend import (
    ExactOutput,
    FleetPool,
    InsideUser,
    Renewer,
    Staged,
    WorkspaceOptions,
    exit_status,
    file_error,
    shell_line,
    staging_path,
)
from bashfleet.worker.wire.control import Collect, SessionOutput
from bashfleet.worker.wire.models import (
    MAX_TIMEOUT_S,
    CallResult,
    HeadTailTokens,
    Policy,
    TruncationInfo,
)

#: The manifest root the SDK gives a session unless told otherwise: it becomes the
#: workspace's own directory.
DEFAULT_ROOT = "/workspace"
#: The most output an exec reads back (each stream): the SDK gives no limit.
MAX_EXEC_OUTPUT_BYTES = 64 * 1024 * 1024
#: Yields when the SDK gives none (Codex's: exec_command 10 s, write_stdin 250 ms).
EXEC_YIELD_MS = 10_000
WRITE_YIELD_MS = 250

#: The head of what `persist_workspace` returns for a native snapshot, JSON after it.
SNAPSHOT_REF_MAGIC = b"BASHFLEET_SNAPSHOT_V1\n"
#: How a session's workspace is persisted (`persist_workspace`).
WorkspacePersistence = Literal["snapshot", "tar"]

#: The policy of `exec`: separate streams read back whole, a timeout kills, none by
#: default.
EXEC_POLICY = Policy(name="openai-agents", on_timeout="kill", default_timeout_s=MAX_TIMEOUT_S,
                     kill_grace_s=1.0)


def pty_policy(max_tokens: int, timeout_s: float | None) -> Policy:
    """The policy of an interactive process: one stream cut as Codex cuts it, ended
    after `timeout_s` when given."""
    return Policy(name="openai-agents-pty", streams="combined",
                  truncation=HeadTailTokens(max_tokens=max_tokens),
                  background_timeout_s=timeout_s if timeout_s and timeout_s > 0 else None)


def pty_output(text: str, info: TruncationInfo | None, max_tokens: int | None
               ) -> tuple[bytes, int | None]:
    """An interactive process's new output as the SDK returns it: its bytes (a cut one
    headed `Total output lines: N`) and, when cut, its tokens before the cut."""
    if info is None or not info.truncated or max_tokens is None:
        return shown_output(text, info).encode(), None
    return shown_output(text, info).encode(), -(-info.total_bytes // 4)


@dataclass(frozen=True)
class SnapshotRef:
    """A native snapshot as the SDK's snapshot stores it (`persist_workspace`'s bytes)."""

    id: str
    """The snapshot (`Snapshot.id`)."""
    host: str
    """The host it was taken on."""
    workspace: str
    """The workspace it was taken of."""

    def encode(self) -> bytes:
        body = {"id": self.id, "host": self.host, "workspace": self.workspace}
        return SNAPSHOT_REF_MAGIC + json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> SnapshotRef | None:
        """The reference `raw` holds (None: it is not one: a tar)."""
        if not raw.startswith(SNAPSHOT_REF_MAGIC):
            return None
        try:
            body = json.loads(raw[len(SNAPSHOT_REF_MAGIC):])
            return cls(id=str(body["id"]), host=str(body["host"]),
                       workspace=str(body["workspace"]))
        except (ValueError, KeyError, TypeError):
            return None


def user_name(user: str | User | None) -> str | None:
    """A `user=` as a name (the SDK passes names or `User`s)."""
    if user is None or isinstance(user, str):
        return user
    return str(user.name)


class BashfleetSandboxClientOptions(BaseSandboxClientOptions, WorkspaceOptions):  # type: ignore[misc]
    """Where and how a session's workspace is made (`WorkspaceOptions`' fields), and how
    it is persisted."""

    type: Literal["bashfleet"] = "bashfleet"
    workspace_persistence: WorkspacePersistence = "snapshot"
    """`snapshot`: a native snapshot of the fleet (the SDK's snapshot stores a reference
    to it); `tar`: a tar of the manifest root (the SDK's snapshot stores the tar)."""
    snapshot_ttl_s: float | None = Field(None, gt=0)
    """Seconds a native snapshot lives (None: the fleet's default)."""


def workspace_options(options: BashfleetSandboxClientOptions) -> WorkspaceOptions:
    """The workspace part of the options (the SDK's serializer adds its `type` back)."""
    fields = WorkspaceOptions.model_fields
    return WorkspaceOptions.model_validate(
        {name: value for name, value in options.model_dump().items() if name in fields})


class BashfleetSandboxSessionState(SandboxSessionState):  # type: ignore[misc]
    """What resumes a session: its workspace, and how to make another if it ended."""

    type: Literal["bashfleet"] = "bashfleet"
    workspace_id: str
    """The session's workspace."""
    host: str
    """The host it lives on."""
    workspace_options: WorkspaceOptions = WorkspaceOptions()
    """How it was made (a replacement is made the same way)."""
    root_is_workspace: bool = True
    """The manifest root is the workspace's directory (it moves with a replacement)."""
    workspace_persistence: WorkspacePersistence = "snapshot"
    """How `persist_workspace` saves it (the options')."""
    snapshot_ttl_s: float | None = None
    """Seconds a native snapshot lives (the options')."""


@dataclass
class _Pty:
    """An interactive process of the session: its job on the fleet."""

    job_id: str
    tty: bool
    last_used: float = field(default_factory=time.monotonic)


class BashfleetSandboxSession(BaseSandboxSession):  # type: ignore[misc]
    """A session on a workspace of the fleet (see the module's docstring)."""

    state: BashfleetSandboxSessionState

    def __init__(self, state: BashfleetSandboxSessionState, fleet: AsyncFleet,
                 workspace: AsyncWorkspace) -> None:
        self.state = state
        self.fleet = fleet
        """The fleet client it speaks through."""
        self.workspace = workspace
        """Its workspace."""
        self._user = InsideUser(workspace)
        self._output = ExactOutput(workspace)
        self._renewer: Renewer | None = None
        self._ptys: dict[int, _Pty] = {}
        self._pty_lock = asyncio.Lock()
        self.made_from: str | None = None
        """The snapshot its workspace was made from, until the SDK's start has restored
        it (nothing to do then: the workspace is that snapshot already)."""
        self._restores = 0

    # ------------------------------------------------------------------ lifecycle

    async def _after_start(self) -> None:
        if self._renewer is None:
            self._renewer = Renewer(self.workspace)

    async def _shutdown_backend(self) -> None:
        """Stop renewing (the client's `delete` removes the workspace; left alone, its
        lease ends it)."""
        if self._renewer is not None:
            await self._renewer.stop()
            self._renewer = None

    async def running(self) -> bool:
        """Whether the workspace still lives (asking renews it)."""
        try:
            await self.workspace.renew()
        except UnknownWorkspace:
            return False
        return True

    def _root(self) -> str:
        return str(self.state.manifest.root)

    async def _env(self) -> dict[str, str]:
        return dict(await self.state.manifest.environment.resolve())

    # ----------------------------------------------------------------------- exec

    async def exec(self, *command: str | Path, timeout: float | None = None,
                   shell: bool | list[str] = True, user: str | User | None = None
                   ) -> ExecResult:
        """Run a command as `user` (None: the workspace's user): switched to from a root
        workspace by `runuser`/`su`, not the SDK's `sudo -u` (images seldom have sudo)."""
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        line = shell_line(argv)
        switched = await self._user.command_as(line, user_name(user))
        if switched == line:
            return await super().exec(*command, timeout=timeout, shell=shell, user=None)
        # The SDK's own `shell` argument (a command line for the workspace's shell).
        return await super().exec(switched, timeout=timeout, shell=["sh", "-c"],  # noqa: S604
                                  user=None)

    async def _check_user(self, user: str | User | None) -> None:
        """PermissionError (UserUnavailableError) unless a call can run as `user`."""
        await self._user.check(user_name(user))

    async def _exec_internal(self, *command: str | Path,
                             timeout: float | None = None) -> ExecResult:
        argv = [str(part) for part in command]
        try:
            exact = await self._output.run(
                Staged(shell_line(argv)), MAX_EXEC_OUTPUT_BYTES, cwd=self._root(),
                env=await self._env(), timeout=timeout, policy=EXEC_POLICY, check=False)
        except BashfleetError as exc:
            raise ExecTransportError(command=argv, cause=exc, message=exc.message) from exc
        result = exact.result
        if result.error is not None:
            raise ExecTransportError(command=argv, message=result.error.message,
                                     context={"kind": result.error.kind})
        if result.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        return ExecResult(stdout=exact.stdout, stderr=exact.stderr,
                          exit_code=exit_status(result.exit_code, result.signal))

    # ---------------------------------------------------------------------- files

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        """A file's bytes."""
        return io.BytesIO(await self._read(path, user, None))

    async def _read_bounded(self, path: Path, *, max_bytes: int) -> bytes:
        return await self._read(path, None, max_bytes)

    async def _read(self, path: Path, user: str | User | None, max_bytes: int | None) -> bytes:
        await self._check_user(user)
        target = self.normalize_path(path)
        try:
            return await self.workspace.read_file(str(target), max_bytes=max_bytes)
        except BashfleetError as exc:
            if isinstance(file_error(exc, str(target)), FileNotFoundError):
                raise WorkspaceReadNotFoundError(path=path, cause=exc) from exc
            raise WorkspaceArchiveReadError(path=path, cause=exc,
                                            context={"message": exc.message}) from exc

    async def write(self, path: Path, data: io.IOBase, *,
                    user: str | User | None = None) -> None:
        """Write a file (its parents made) as the run user."""
        await self._check_user(user)
        payload = data.read()
        raw = payload.encode() if isinstance(payload, str) else bytes(payload)
        target = self.normalize_path(path, for_write=True)
        try:
            await self.workspace.write_file(str(target), raw)
        except BashfleetError as exc:
            raise WorkspaceArchiveWriteError(path=target, cause=exc,
                                             context={"message": exc.message}) from exc

    async def persist_workspace(self) -> io.IOBase:
        """A native snapshot's reference, or the root as a tar (`workspace_persistence`;
        always a tar when the manifest has mounts, which a snapshot would not leave out)."""
        if self.state.workspace_persistence == "tar" or self.state.manifest.mount_targets():
            return await self._persist_tar()
        return io.BytesIO((await self._persist_native()).encode())

    async def _persist_native(self) -> SnapshotRef:
        """A snapshot of the workspace, the manifest's ephemeral paths set aside (they
        are not part of what the SDK persists)."""
        kept = await self._set_aside(self._persist_workspace_skip_relpaths())
        try:
            snapshot = await self.workspace.snapshot(
                ttl_s=self.state.snapshot_ttl_s,
                tags={"framework": "openai-agents", "session": self.state.session_id.hex})
        except BashfleetError as exc:
            raise WorkspaceArchiveReadError(path=Path(self._root()), cause=exc,
                                            context={"message": exc.message}) from exc
        finally:
            await self._put_back(kept)
        return SnapshotRef(id=snapshot.id, host=snapshot.host, workspace=self.workspace.id)

    async def _set_aside(self, relpaths: set[Path]) -> bytes | None:
        """Those of `relpaths` (under the root) that exist, as a tar held here, removed
        from the workspace (None: there were none)."""
        if not relpaths:
            return None
        archive = staging_path("aside") + ".tar"
        names = " ".join(shlex.quote(path.as_posix()) for path in sorted(relpaths))
        made = await self._shell(
            f"cd -- {shlex.quote(self._root())} || exit 1; set --; for p in {names}; do "
            'if [ -e "$p" ] || [ -L "$p" ]; then set -- "$@" "$p"; fi; done; '
            f'[ $# -eq 0 ] && exit 0; tar -c -f {shlex.quote(archive)} -- "$@" && '
            'rm -rf -- "$@" && echo set-aside')
        if made.exit_code != 0:
            raise WorkspaceArchiveReadError(path=Path(self._root()),
                                            context={"stderr": made.stderr[-2000:]})
        if "set-aside" not in made.stdout:
            return None
        try:
            return await self.workspace.read_file(archive)
        finally:
            await self._shell(f"rm -f -- {shlex.quote(archive)}")

    async def _put_back(self, kept: bytes | None) -> None:
        """Unpack what `_set_aside` held back into the root."""
        if kept is not None:
            await self._untar(kept, "aside")

    async def _persist_tar(self) -> io.IOBase:
        """The root as a tar (members relative to it), without the SDK's skip paths."""
        archive = staging_path("persist") + ".tar"
        excludes = " ".join(shell_tar_exclude_args(self._persist_workspace_skip_relpaths()))
        made = await self._shell(f"tar -c -f {shlex.quote(archive)} {excludes} "
                                 f"-C {shlex.quote(self._root())} .")
        try:
            if made.exit_code != 0:
                raise WorkspaceArchiveReadError(path=Path(self._root()),
                                                context={"stderr": made.stderr[-2000:]})
            return io.BytesIO(await self.workspace.read_file(archive))
        finally:
            await self._shell(f"rm -f -- {shlex.quote(archive)}")

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Restore a native snapshot's reference, or unpack a tar of `persist_workspace`
        into the root."""
        payload = data.read()
        raw = payload.encode() if isinstance(payload, str) else bytes(payload)
        ref = SnapshotRef.decode(raw)
        if ref is not None:
            await self._restore_native(ref)
        else:
            await self._untar(raw, "hydrate")

    async def _untar(self, raw: bytes, name: str) -> None:
        archive = staging_path(name) + ".tar"
        await self.workspace.write_file(archive, raw, mode=0o600)
        root, quoted = shlex.quote(self._root()), shlex.quote(archive)
        done = await self._shell(f"mkdir -p -- {root} && tar -x -f {quoted} -C {root}; "
                                 f"status=$?; rm -f -- {quoted}; exit $status")
        if done.exit_code != 0:
            raise WorkspaceArchiveWriteError(path=Path(self._root()),
                                             context={"stderr": done.stderr[-2000:]})

    async def _restore_snapshot_into_workspace_on_resume(self) -> None:
        """The SDK's start of a new or replaced session with a restorable snapshot: a
        reference to a native one is restored as is (no clearing of the root first: it
        replaces every file), nothing to do when the workspace was made from it; a tar
        as the SDK does it (the root cleared, then unpacked)."""
        stream = await self.state.snapshot.restore(dependencies=self.dependencies)
        try:
            payload = stream.read()
        finally:
            with contextlib.suppress(Exception):
                stream.close()
        raw = payload.encode() if isinstance(payload, str) else bytes(payload)
        ref = SnapshotRef.decode(raw)
        made_from, self.made_from = self.made_from, None
        if ref is None:
            await self._clear_workspace_root_on_resume()
            await self._untar(raw, "hydrate")
        elif ref.id != made_from:
            await self._restore_native(ref)

    async def _restore_native(self, ref: SnapshotRef) -> None:
        """The workspace's files as the snapshot holds them: restored in place when it
        was taken of this workspace, else the session moves to a new workspace made from
        it (the old one deleted). Its processes end either way."""
        try:
            if ref.workspace == self.workspace.id:
                await self.workspace.restore(ref.id)
            else:
                await self._move_to(await self.fleet.workspace(
                    **self.state.workspace_options.from_snapshot_kwargs(
                        ref.id, tags={"framework": "openai-agents"})))
        except BashfleetError as exc:
            raise WorkspaceArchiveWriteError(
                path=Path(self._root()), cause=exc,
                context={"message": exc.message, "snapshot": ref.id}) from exc
        self._restores += 1  # the runtime helpers may be gone (`_current_runtime_helper_cache_key`)
        self._ptys.clear()  # their processes ended

    async def _move_to(self, workspace: AsyncWorkspace) -> None:
        """Put the session on `workspace` (its state says so); delete the one it was on."""
        old, self.workspace = self.workspace, workspace
        self._user = InsideUser(workspace)
        self._output = ExactOutput(workspace)
        self.state.workspace_id, self.state.host = workspace.id, workspace.host
        if self.state.root_is_workspace:
            self.state.manifest = self.state.manifest.model_copy(
                update={"root": workspace.path}, deep=True)
        if self._renewer is not None:
            await self._renewer.stop()
            self._renewer = Renewer(workspace)
        with contextlib.suppress(BashfleetError):  # gone already: nothing to delete
            await old.delete()

    def _current_runtime_helper_cache_key(self) -> object | None:
        """The SDK installs its helpers once per key: a restore may have removed them."""
        return (self.workspace.id, self._restores)

    async def _shell(self, command: str) -> CallResult:
        return await self.workspace.run(command, policy=EXEC_POLICY, check=False)

    # ------------------------------------------------------------------------ PTY

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(self, *command: str | Path, timeout: float | None = None,
                             shell: bool | list[str] = True, user: str | User | None = None,
                             tty: bool = False, yield_time_s: float | None = None,
                             max_output_tokens: int | None = None) -> PtyExecUpdate:
        """Start an interactive process; its output until it ends or `yield_time_s`
        passes, and its process id while it runs."""
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        line = await self._user.command_as(shell_line(argv), user_name(user))
        yield_ms = clamp_pty_yield_time_ms(
            EXEC_YIELD_MS if yield_time_s is None else int(yield_time_s * 1000))
        await self._make_room()
        try:
            result = await self.workspace.run(
                line, cwd=self._root(), env=await self._env(),
                timeout=yield_ms / 1000, stdin="pty" if tty else "closed",
                policy=pty_policy(max_output_tokens or MAX_OUTPUT_TOKENS, timeout),
                input_wait_s=INPUT_WAIT_S, check=False)
        except BashfleetError as exc:
            raise ExecTransportError(command=argv, cause=exc, message=exc.message) from exc
        if result.error is not None:
            raise ExecTransportError(command=argv, message=result.error.message,
                                     context={"kind": result.error.kind})
        output, tokens = pty_output(result.stdout, result.stdout_truncation, max_output_tokens)
        if not (result.backgrounded and result.job is not None):
            return PtyExecUpdate(process_id=None, output=output, original_token_count=tokens,
                                 exit_code=exit_status(result.exit_code, result.signal))
        async with self._pty_lock:
            process_id = allocate_pty_process_id(set(self._ptys))
            self._ptys[process_id] = _Pty(job_id=result.job.id, tty=tty)
        return PtyExecUpdate(process_id=process_id, output=output, exit_code=None,
                             original_token_count=tokens)

    async def pty_write_stdin(self, *, session_id: int, chars: str,
                              yield_time_s: float | None = None,
                              max_output_tokens: int | None = None) -> PtyExecUpdate:
        """Write `chars` to a running process (empty: poll); its output since the last
        return."""
        entry = self._resolve_pty_session_entry(pty_processes=self._ptys,
                                                session_id=session_id)
        if chars and not entry.tty:
            raise RuntimeError("stdin is not available for this process")
        yield_ms = resolve_pty_write_yield_time_ms(
            yield_time_ms=WRITE_YIELD_MS if yield_time_s is None else int(yield_time_s * 1000),
            input_empty=chars == "")
        collect = Collect(wait_s=yield_ms / 1000, delay_s=WRITE_SETTLE_S if chars else 0.0,
                          input_wait_s=INPUT_WAIT_S,
                          truncation=HeadTailTokens(
                              max_tokens=max_output_tokens or MAX_OUTPUT_TOKENS))
        try:
            out = await self.fleet.write_stdin(entry.job_id, chars, collect=collect)
        except UnknownJob as exc:
            self._ptys.pop(session_id, None)
            raise PtySessionNotFoundError(session_id=session_id, cause=exc) from exc
        return self._pty_update(session_id, entry, out, max_output_tokens)

    def _pty_update(self, session_id: int, entry: _Pty, out: SessionOutput,
                    max_tokens: int | None) -> PtyExecUpdate:
        output, tokens = pty_output(out.output, out.output_truncation, max_tokens)
        if out.running:
            entry.last_used = time.monotonic()
            return PtyExecUpdate(process_id=session_id, output=output, exit_code=None,
                                 original_token_count=tokens)
        self._ptys.pop(session_id, None)
        return PtyExecUpdate(process_id=None, output=output, original_token_count=tokens,
                             exit_code=exit_status(out.exit_code, out.signal))

    async def _make_room(self) -> None:
        """At the SDK's cap of live processes, end the least recently used one."""
        async with self._pty_lock:
            if len(self._ptys) < PTY_PROCESSES_MAX:
                return
            meta = [(pid, entry.last_used, False) for pid, entry in self._ptys.items()]
            victim = process_id_to_prune_from_meta(meta)
            entry = self._ptys.pop(victim) if victim is not None else None
        if entry is not None:
            await self._end(entry)

    async def pty_terminate_all(self) -> None:
        """End every interactive process of the session."""
        async with self._pty_lock:
            entries = list(self._ptys.values())
            self._ptys.clear()
        for entry in entries:
            await self._end(entry)

    async def _end(self, entry: _Pty) -> None:
        with contextlib.suppress(BashfleetError):  # ended already, or the workspace is gone
            await self.workspace.kill(entry.job_id, signal=9)


class BashfleetSandboxClient(BaseSandboxClient[BashfleetSandboxClientOptions | None]):  # type: ignore[misc]
    """Sessions on workspaces of the fleet (see the module's docstring). `redis_url`:
    the fleet's Redis (default BASHFLEET_REDIS_URL, else the local fleet)."""

    backend_id = "bashfleet"
    supports_default_options = True

    def __init__(self, *, redis_url: str | None = None,
                 instrumentation: Instrumentation | None = None,
                 dependencies: Dependencies | None = None) -> None:
        self._pool = FleetPool(redis_url)
        self._instrumentation = instrumentation or Instrumentation()
        self._dependencies = dependencies

    async def create(self, *, snapshot: SnapshotSpec | SnapshotBase | None = None,
                     manifest: Manifest | None = None,
                     options: BashfleetSandboxClientOptions | None = None) -> SandboxSession:
        """A session on a new workspace: made from the native snapshot `snapshot` refers
        to when it does (a fork of the session that persisted it), else as the options
        say (the SDK hydrates it from `snapshot` when that holds a tar)."""
        manifest = self._validate_manifest_for_create(manifest or Manifest())
        given = options or BashfleetSandboxClientOptions()
        chosen = workspace_options(given)
        root_is_workspace = manifest.root == DEFAULT_ROOT
        session_id = uuid.uuid4()
        resolved = resolve_snapshot(snapshot, str(session_id))
        fleet = self._pool.acquire(chosen.owner)
        try:
            ref = await self._native_ref(resolved)
            workspace = await self._make(fleet, chosen, None if root_is_workspace
                                         else str(manifest.root), ref)
        except BaseException:
            await self._pool.release(chosen.owner)
            raise
        if root_is_workspace:
            manifest = manifest.model_copy(update={"root": workspace.path}, deep=True)
        state = BashfleetSandboxSessionState(
            session_id=session_id, manifest=manifest, snapshot=resolved,
            workspace_id=workspace.id, host=workspace.host, workspace_options=chosen,
            root_is_workspace=root_is_workspace,
            workspace_persistence=given.workspace_persistence,
            snapshot_ttl_s=given.snapshot_ttl_s)
        inner = BashfleetSandboxSession(state, fleet, workspace)
        inner.made_from = ref.id if ref is not None else None
        return self._wrap(inner)

    async def _native_ref(self, snapshot: SnapshotBase) -> SnapshotRef | None:
        """The native snapshot `snapshot` stores a reference to, if it does (None: it
        holds a tar, nothing, or cannot be read here: the SDK's start hydrates it)."""
        try:
            if not await snapshot.restorable(dependencies=self._dependencies):
                return None
            stream = await snapshot.restore(dependencies=self._dependencies)
        except Exception:  # any snapshot store's failure: the SDK's start says so
            return None
        try:
            head = stream.read(4096)
        finally:
            with contextlib.suppress(Exception):
                stream.close()
        raw = head.encode() if isinstance(head, str) else bytes(head)
        return SnapshotRef.decode(raw)

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """The session of a saved state: its workspace if it lives, else a new one (which
        the SDK hydrates from the state's snapshot when it has one)."""
        if not isinstance(state, BashfleetSandboxSessionState):
            raise TypeError("BashfleetSandboxClient.resume expects a BashfleetSandboxSessionState")
        state.assert_path_grants_rebound()
        options = state.workspace_options
        fleet = self._pool.acquire(options.owner)
        try:
            workspace, preserved, ref = await self._reopen(fleet, state)
        except BaseException:
            await self._pool.release(options.owner)
            raise
        inner = BashfleetSandboxSession(state, fleet, workspace)
        inner._set_start_state_preserved(preserved, system=preserved)
        inner.made_from = ref.id if ref is not None else None
        return self._wrap(inner)

    async def _reopen(self, fleet: AsyncFleet, state: BashfleetSandboxSessionState
                      ) -> tuple[AsyncWorkspace, bool, SnapshotRef | None]:
        """The state's workspace if it lives; else a new one, made from the native
        snapshot the state's snapshot refers to when it does."""
        try:
            return await fleet.open_workspace(state.workspace_id), True, None
        except UnknownWorkspace:
            pass
        mount = None if state.root_is_workspace else str(state.manifest.root)
        ref = await self._native_ref(state.snapshot)
        workspace = await self._make(fleet, state.workspace_options, mount, ref)
        if state.root_is_workspace:
            state.manifest = state.manifest.model_copy(update={"root": workspace.path},
                                                       deep=True)
        state.workspace_id, state.host = workspace.id, workspace.host
        state.workspace_root_ready = False
        return workspace, False, ref

    @staticmethod
    async def _make(fleet: AsyncFleet, options: WorkspaceOptions, root: str | None,
                    ref: SnapshotRef | None = None) -> AsyncWorkspace:
        """A workspace as `options` say, or made from a native snapshot (its files, paths
        and base are the snapshot's); a manifest root other than the default is the
        workspace itself, shown at that path."""
        tags = {"framework": "openai-agents"}
        if ref is not None:
            return await fleet.workspace(**options.from_snapshot_kwargs(ref.id, tags=tags))
        kwargs: dict[str, Any] = options.create_kwargs(tags=tags)
        if root is not None:
            kwargs["mounts"] = {**kwargs["mounts"], root: "."}
        return await fleet.workspace(**kwargs)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Remove the session's workspace (every process in it ends)."""
        inner = session._inner
        if not isinstance(inner, BashfleetSandboxSession):
            raise TypeError("BashfleetSandboxClient.delete expects a BashfleetSandboxSession")
        try:
            await inner.workspace.delete()
        except BashfleetError:
            pass  # unreachable now: its lease ends it
        finally:
            await self._pool.release(inner.state.workspace_options.owner)
        return session

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        """A state saved by `serialize_session_state`."""
        return self._deserialize_session_state_payload(payload, BashfleetSandboxSessionState)

    def _wrap(self, inner: BashfleetSandboxSession) -> SandboxSession:
        return self._wrap_session(inner, instrumentation=self._instrumentation)


__all__ = [
    "BashfleetSandboxClient",
    "BashfleetSandboxClientOptions",
    "BashfleetSandboxSession",
    "BashfleetSandboxSessionState",
    "SnapshotRef",
]


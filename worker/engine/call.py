"""Run one bash call right: spawn, follow, time out, shape. Usable in-process, no Redis.

    result = run_call(Call(call_id="c1", command="make test"))

The command runs as `bash -c COMMAND` in a new session (own process group, no
controlling terminal), stdin from /dev/null, its stdout and stderr written straight
into spill files. The engine waits on a pidfd, counting the files as they grow, and
on exit (or timeout) shapes what is shown by the call's policy.
"""

from __future__ import annotations

import functools
import os
import select
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from bashfleet.worker.engine import cgroups, limits, procs, resources, sandbox, workspaces
from bashfleet.worker.engine.call_env import child_env
from bashfleet.worker.engine.call_result import (
    EndReason,
    Pipes,
    ResultBuilder,
    Streams,
    with_state,
)
from bashfleet.worker.engine.environment import ChildEnv
from bashfleet.worker.engine.isolate import launcher, proto
from bashfleet.worker.engine.isolate.command_line import COMMAND_FD, CommandLine
from bashfleet.worker.engine.jobs import interactive, jobs
from bashfleet.worker.engine.memo import TimedMemo
from bashfleet.worker.engine.network import netlog, network
from bashfleet.worker.engine.output import normalize
from bashfleet.worker.engine.output.capture import (
    FollowedFile,
    MemoryStream,
)
from bashfleet.worker.engine.secrets import redaction_pattern
from bashfleet.worker.engine.startup import Startup
from bashfleet.worker.engine.watcher import UNWATCHED, CallWatcher, Spawned
from bashfleet.worker.settings import Settings, get_settings
from bashfleet.worker.wire.errors import ErrorKind, ToolError
from bashfleet.worker.wire.models import (
    Call,
    CallResult,
    SystemError_,
    WorkspaceRecord,
    WorkspaceSpec,
)

#: How often the engine wakes to count output while a command runs.
FOLLOW_INTERVAL_S = 0.05
#: Bytes counted per wake-up, so a flood of output cannot delay the timeout check.
FOLLOW_BUDGET = 64 * 1024 * 1024

class CallError(ToolError):
    """A system error: the call could not be run (bad cwd, spawn failure, policy block)."""

    def __init__(self, kind: ErrorKind, message: str, *,
                 missing: Literal["workspace"] | None = None) -> None:
        super().__init__(kind, message)
        self.missing = missing

    def as_model(self) -> SystemError_:
        """The error as it travels in a result."""
        return SystemError_(kind=self.kind, message=self.message, missing=self.missing)


class _NoSpillError(Exception):
    """The spill files cannot be written: capture in memory instead."""


#: Verdicts of `spill_problem` per (state directory, minimum free bytes), reused for a
#: second: free space does not change much in a second, and a statfs on every call was
#: a syscall of a `true` call's overhead.
_spill_verdicts: TimedMemo[tuple[Path, int], str | None] = TimedMemo(ttl_s=1.0)


def spill_problem(settings: Settings, folder: Path) -> str | None:
    """Why spill files cannot be used now in `folder` (unusable or too full), or None.

    Checked at most once a second per file system's directory and threshold.
    """
    key = (folder.parent, settings.spill_min_free_bytes)
    return _spill_verdicts.get(key, lambda: _check_spill_dir(settings, folder))


def _check_spill_dir(settings: Settings, folder: Path) -> str | None:
    try:
        info = os.statvfs(folder)
    except FileNotFoundError:
        return None  # created by the first call
    except OSError as exc:
        return f"spill directory unusable: {exc}"
    free = info.f_bavail * info.f_frsize
    if free < settings.spill_min_free_bytes:
        return (
            f"spill directory nearly full ({free} bytes free, "
            f"below {settings.spill_min_free_bytes})"
        )
    return None


def resolve_cwd(cwd: str | None, home: str | None = None) -> str:
    """Validate the working directory (None: `home`, else ours); nothing runs when it is wrong."""
    path = os.path.abspath(os.path.expanduser(cwd)) if cwd else (home or os.path.expanduser("~"))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CallError("bad_cwd", f"Working directory does not exist: {path}") from None
    except OSError as exc:
        raise CallError("bad_cwd", f"Working directory is not accessible: {path} ({exc})") from None
    if not stat.S_ISDIR(mode):
        raise CallError("bad_cwd", f"Working directory is not a directory: {path}")
    if not os.access(path, os.X_OK):
        raise CallError("bad_cwd", f"Working directory is not accessible: {path}")
    return path


def _user(settings: Settings) -> sandbox.User | None:
    try:
        return sandbox.run_user(settings)
    except OSError as exc:
        raise CallError("spawn_failed", exc.strerror or str(exc)) from None


def workspace_of(call: Call, settings: Settings) -> tuple[WorkspaceRecord, bool]:
    """The workspace the call runs in and whether it is a throwaway one (made for it):
    its own when it names one, else a fresh one, or the project directory its cwd is in
    when that is under a root this host allows."""
    try:
        if call.workspace is not None:
            record = workspaces.load(call.workspace, settings)
            # A throwaway one serves the call it was taken for, never a call that names it
            # (it goes back to the pool for other owners' calls).
            if record.owner != call.owner or record.throwaway:
                raise CallError("not_found", f"no such workspace on host {settings.host}: "
                                f"{call.workspace}", missing="workspace")
            _check_isolation(call, record)
            return record, False
        spec = WorkspaceSpec(owner=call.owner, isolation=call.isolation, network=call.network,
                             path=workspaces.project_dir(call.cwd, settings), tags=call.tags)
        return workspaces.throwaways.take(settings, spec), True
    except workspaces.WorkspaceError as exc:
        gone = exc.kind == "not_found" and call.workspace is not None
        raise CallError(exc.kind, exc.message, missing="workspace" if gone else None) from None


def _check_isolation(call: Call, record: WorkspaceRecord) -> None:
    order = sandbox.LEVELS
    if call.isolation is not None and order.index(call.isolation) > order.index(record.isolation):
        raise CallError("invalid", f"workspace {record.id} runs calls with isolation "
                        f"{record.isolation!r}; make a workspace with {call.isolation!r}")
    if call.network is not None and call.network != record.network:
        raise CallError("invalid", f"workspace {record.id} has network policy "
                        f"{record.network}, not {call.network} (`bashfleet workspace "
                        "network` changes it)")


def workspace_cwd(cwd: str | None, record: WorkspaceRecord) -> str:
    """A call's cwd: the workspace's directory when it gives none, relative ones from
    there; absolute ones as given (a path of its view)."""
    if not cwd:
        # An image's WORKDIR is where its tasks expect to run (SWE-bench's /testbed).
        if record.image is not None and record.image.workdir:
            return record.image.workdir
        return record.path
    path = os.path.expanduser(cwd) if record.isolation == "none" else cwd
    return os.path.normpath(os.path.join(record.path, path))


def prepare(call: Call, settings: Settings) -> Call:
    """Apply the policy's input rules; return the call to run."""
    policy = call.policy
    if policy.lift_head_tail:
        lifted = normalize.normalize_command(call.command)
        head, tail = normalize.merge_limits(lifted, call.head, call.tail)
        call = call.model_copy(update={"command": lifted.command, "head": head, "tail": tail})
    if policy.intercept:
        rule = normalize.check_interception(call.command, policy.intercept, policy.available_tools)
        if rule is not None:
            raise CallError("blocked", normalize.blocked_message(rule, call.command))
    refused = limits.host_rule_violation(
        call.command, settings.command_deny, settings.command_allow
    )
    if refused is not None:
        raise CallError("blocked", f"{refused} on host {settings.host}; nothing was run")
    timeout = call.timeout_s if call.timeout_s is not None else policy.default_timeout_s
    # A background job's limit is the policy's background timeout, not the foreground one.
    if not call.background and timeout > policy.max_timeout_s:
        raise CallError(
            "invalid", f"timeout {timeout:g}s is above this dialect's maximum of "
            f"{policy.max_timeout_s:g}s"
        )
    return call


def runs_in_foreground(call: Call) -> bool:
    """Whether `run_call` runs `call` as a plain foreground call (stdin from /dev/null,
    not left as a job): the only kind whose watcher is asked `starting` before its bash
    starts."""
    return call.stdin == "null" and not call.background


def run_call(
    call: Call,
    *,
    settings: Settings | None = None,
    watcher: CallWatcher | None = None,
) -> CallResult:
    """Run a call to its end (or timeout) and return its result. Never raises for the command.

    `watcher` hears the call's spawn and that it runs on (the fleet records it then), and
    is asked at each wake-up whether to cancel it or leave it running as a background job
    (`bashfleet.worker.engine.watcher`); None: nobody watches. An exception from the
    watcher goes on to the caller, once the call's processes are killed. Its workspace is
    put away (touched, or a throwaway one made ready again) when the watcher says: now,
    or once its answer went out; at once when the call started a job.
    """
    settings = settings or get_settings()
    watcher = UNWATCHED if watcher is None else watcher
    started = time.monotonic()
    try:
        call = prepare(call, settings)
        record, throwaway = workspace_of(call, settings)
    except CallError as exc:
        return _error_result(call, settings, exc, started)
    result: CallResult | None = None
    full = workspaces.over_disk_cap(record, settings)
    try:
        if full is not None and call.background:
            raise CallError("limit", workspaces.disk_cap_notice(record, full).strip())
        cwd = workspace_cwd(call.cwd, record)
        if record.network.mode == "egress" and record.keeper_pid is not None:
            netlog.watch(record.keeper_pid, record.id, settings)  # what its rules refuse
        if record.isolation == "none":
            cwd = resolve_cwd(cwd)
        if runs_in_foreground(call):
            result = _run_foreground(
                call, cwd, settings, record, watcher=watcher, started=started,
            )
        elif call.stdin != "null":
            result = _run_session(call, cwd, settings, record, started, watcher=watcher)
        else:
            result = _start_background(call, cwd, settings, record, started)
        if record.network.mode in ("allow", "egress"):
            result = _with_denials(result, network.take_denied(settings, record.id))
        return result if full is None else _with_notice(result, workspaces.disk_cap_notice(
            record, full))
    except CallError as exc:
        result = _error_result(call, settings, exc, started)
        return result
    finally:
        step = functools.partial(_after, record, settings, throwaway=throwaway, result=result)
        if result is not None and result.job is not None:
            # At once: a throwaway keeper outlives its worker only once told to wait for
            # the job, which must survive the worker from the moment its id is answered.
            step()
        else:
            watcher.put_away(step)


def _with_denials(result: CallResult, denied: tuple[str, ...]) -> CallResult:
    """A result with what its workspace's guard refused (most calls': nothing, as the
    result says already: no copy then)."""
    return result.model_copy(update={"network_denied": denied}) if denied else result


def _with_notice(result: CallResult, notice: str) -> CallResult:
    """A result with a notice where its reader looks (stderr, or the combined output)."""
    field = "stdout" if result.combined else "stderr"
    return result.model_copy(update={field: getattr(result, field) + notice})


def _error_result(call: Call, settings: Settings, exc: CallError, started: float) -> CallResult:
    return CallResult(
        call_id=call.call_id,
        host=settings.host,
        error=exc.as_model(),
        duration_s=time.monotonic() - started,
    )


def _after(record: WorkspaceRecord, settings: Settings, *, throwaway: bool,
           result: CallResult | None) -> None:
    """A call's workspace once it ended: used now, or, a throwaway one, removed (once
    the job it started ends, if it started one)."""
    if throwaway:
        workspaces.throwaways.end(record, settings,
                                  jobs_left=result is not None and result.job is not None)
    else:
        workspaces.touch(record, settings)


def _run_session(
    call: Call, cwd: str, settings: Settings, record: WorkspaceRecord, started: float,
    *, watcher: CallWatcher,
) -> CallResult:
    """An interactive call (stdin `closed`, `pipe` or `pty`): see
    `bashfleet.worker.engine.jobs.interactive`."""
    try:
        return interactive.run(call, cwd, settings, record, started=started,
                               cancelled=watcher.cancelled)
    except interactive.SessionError as exc:
        raise CallError(exc.kind, exc.message) from exc


def _start_background(
    call: Call, cwd: str, settings: Settings, workspace: WorkspaceRecord, started: float
) -> CallResult:
    try:
        record = jobs.start_job(call, cwd, settings, workspace)
    except jobs.JobError as exc:
        # A job that could not start is a system error like any other spawn failure.
        raise CallError(exc.kind, exc.message) from exc
    return CallResult(
        call_id=call.call_id,
        host=settings.host,
        backgrounded=True,
        job=jobs.handle(record),
        duration_s=time.monotonic() - started,
        cwd=cwd,
        combined=True,
    )


def _open_streams(call: Call, record: WorkspaceRecord) -> Streams:
    """A call's spill files: in its workspace's output directory, which its calls read
    at the same path."""
    spill = Path(record.out_dir)
    if call.policy.streams == "combined":
        return Streams(spill / f"{call.call_id}.log", None)
    return Streams(spill / f"{call.call_id}.out", spill / f"{call.call_id}.err")


def _open_files(streams: Streams) -> tuple[int, int]:
    """Open the spill files; _NoSpillError when the directory cannot take them."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        try:
            out_fd = os.open(streams.stdout, flags, 0o644)
        except FileNotFoundError:
            # The directory was removed (a gc): create it. Not done on every call, where
            # the mkdir was a measurable part of a `true` call's overhead.
            streams.stdout.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            out_fd = os.open(streams.stdout, flags, 0o644)
    except OSError as exc:
        raise _NoSpillError(f"spill directory unusable: {exc}") from exc
    if streams.stderr is None:
        return out_fd, out_fd
    try:
        return out_fd, os.open(streams.stderr, flags, 0o644)
    except OSError as exc:
        os.close(out_fd)
        streams.stdout.unlink(missing_ok=True)
        raise _NoSpillError(f"spill directory unusable: {exc}") from exc


#: PATH -> the bash found on it (None: none), searched again after 10 s (a bash
#: installed earlier on PATH meanwhile is then found, as a fresh search would).
_bash_paths: TimedMemo[str, str | None] = TimedMemo(ttl_s=10.0)


def _start_bash(env: dict[str, str], start: Callable[[str | None], procs.Process]) -> procs.Process:
    """Start bash through `start(executable)` with the bash found on the child's PATH
    (None: let the starter search PATH as Popen does)."""
    executable = _bash_path(env)
    try:
        return start(executable)
    except OSError as exc:
        if executable is None or exc.filename != executable:
            raise
        # The bash found earlier is gone (or no longer runs): search PATH as Popen does,
        # which may find another one, or fail as it would have.
        _bash_paths.clear()
        return start(None)


def _bash_path(env: dict[str, str]) -> str | None:
    """The bash that Popen would run with the child's PATH; None: let Popen search.

    Given the bare name, Popen hands the child every PATH candidate and the child
    tries one execve after another: with a long PATH, ~8 failed execve on every call
    (while the worker waits on the vfork). The first candidate that is an executable
    file is the one that execve would run.
    """
    search = env.get("PATH", os.defpath)
    return _bash_paths.get(
        search, lambda: shutil.which("bash", path=search) if _all_absolute(search) else None
    )


def _all_absolute(search: str) -> bool:
    # Relative (and empty) PATH entries are relative to the child's cwd: Popen searches.
    return all(os.path.isabs(part) for part in search.split(os.pathsep))


@dataclass
class _Launch:
    """How this call's bash starts: in its workspace's keeper, or plainly (`none`)."""

    call: Call
    cwd: str
    child: ChildEnv
    settings: Settings
    workspace: WorkspaceRecord
    user: sandbox.User | None
    capture: bool
    """Capture the cwd and environment the command ends with (`startup`)."""
    startup: Startup | None = None
    """What bash sources before the command, once started (closed with the launch)."""
    group: cgroups.Group | None = None
    """`none`: the call's own cgroup; else its workspace's (its counters read around it)."""
    groups: cgroups.GroupPool | None = None
    """Where `group` came from (`none`)."""

    @property
    def sandboxed(self) -> bool:
        return self.workspace.keeper_pid is not None

    def _arm(self, engine_lines: str, *, carried: bool, open_files: int | None = None) -> int:
        """Write the call's startup script (`bashfleet.worker.engine.startup`): the descriptor to
        pass; BASH_ENV names it. The sandbox gives it a fixed number, a plain spawn ours.
        `carried`: a cgroup carries the memory and process limits. `open_files`: set
        RLIMIT_NOFILE too (a plain spawn: a keeper sets it itself)."""
        self.startup = Startup(
            engine_lines + resources.ulimit_line(self.settings, carried, open_files),
            capture=self.capture,
            fd_in_child=launcher.STATE_FD if self.sandboxed else None,
        )
        self.child.env["BASH_ENV"] = self.startup.bash_env
        return self.startup.fd

    def start(self, stdout: int, stderr: int) -> procs.Process:
        """Start bash writing to `stdout` and `stderr`; OSError when it cannot start."""
        if self.sandboxed:
            return self._sandboxed(stdout, stderr)
        return self._plain(stdout, stderr)

    def recorded_state(self) -> bytes | None:
        """What the call's state capture recorded (None: it captured nothing)."""
        return self.startup.recorded() if self.startup is not None else None

    def _plain(self, stdout: int, stderr: int) -> procs.Process:
        self.groups = resources.group_pool(self.settings)
        if self.groups is not None and self.group is None:
            self.group = self.groups.acquire()
        fds = self.group.procs_fds() if self.group is not None else []
        startup = self._arm(cgroups.join_line(fds), carried=bool(fds),
                            open_files=self.workspace.limits.open_files)
        line = CommandLine(["bash"], self.call.command)
        passed = [*fds, startup, *([line.fd] if line.fd is not None else [])]
        user = self.user

        def popen(executable: str | None) -> procs.Process:
            return subprocess.Popen(
                line.argv, executable=executable, cwd=self.cwd,
                env=self.child.env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                # setsid(): a new session and process group, and no controlling terminal.
                start_new_session=True, close_fds=True, pass_fds=passed,
                user=user.uid if user else None, group=user.gid if user else None,
                extra_groups=sandbox.extra_groups(user) if user else None,
            )

        try:
            return _start_bash(self.child.env, popen)
        finally:
            line.close()
            for fd in fds:
                os.close(fd)

    def _without_script(self, carried: bool) -> tuple[bool, int | None]:
        """Whether the call's bash needs no startup script: no state to capture and no
        limit for it to set but the file size, which the keeper sets as it starts bash
        (RLIMIT_FSIZE, as `ulimit -f` would). Then that size in bytes (None: none).
        Sourcing the script costs bash ~0.08 ms of every call."""
        if self.capture:
            return False, None
        chosen = resources.ulimit_limits(self.settings, carried)
        if replace(chosen, file_mb=None).any():
            return False, None
        return True, None if chosen.file_mb is None else chosen.file_mb * 1024 * 1024

    def _sandboxed(self, stdout: int, stderr: int) -> procs.Process:
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.group = workspaces.group_of(self.workspace)
        carried = self.group is not None
        plain, file_size = self._without_script(carried)
        if plain:
            # As the script would leave it: BASH_ENV unset (none of the caller's sourced).
            self.child.env.pop("BASH_ENV", None)
            state = []
        else:
            state = [self._arm("", carried=carried)]
        line = CommandLine([workspaces.shell_of(self.workspace)], self.call.command,
                           fd_in_child=COMMAND_FD)
        fds = [null, stdout, stderr, *state, *([line.fd] if line.fd is not None else [])]
        targets = [0, 1, 2, *([launcher.STATE_FD] if state else []),
                   *([COMMAND_FD] if line.fd is not None else [])]

        # The keeper finds bash on the child's PATH in the workspace's view (which is not
        # the host's: a search here could find what the call cannot see).
        request: proto.SpawnRequest = {
            "argv": line.argv, "cwd": self.cwd, "env": self.child.env,
            "targets": targets,
            "output_cap": resources.output_cap(self.settings),
            "kill_grace_s": self.call.policy.kill_grace_s,
            # A throwaway workspace's call: nothing it starts outlives it (its keeper ends
            # it all, and says whether the workspace is fit for the next call).
            "recycle": self.workspace.throwaway,
        }
        if plain and file_size is not None:
            request["file_size"] = file_size
        try:
            return workspaces.start(self.workspace, request, fds, settings=self.settings)
        except launcher.KeeperLostError as exc:
            raise CallError("unavailable", f"workspace {self.workspace.id} is gone "
                            f"({exc.strerror or exc}): make a new one") from None
        except OSError as exc:
            if exc.filename == self.cwd:
                raise CallError("bad_cwd", jobs.cwd_problem(exc, self.cwd)) from None
            raise
        finally:
            line.close()
            os.close(null)

    def hits(self, proc: procs.Process) -> tuple[str, ...]:
        """The cgroup limits the call hit (call this once it ended)."""
        return self.group.hits() if self.group is not None else ()

    def release(self) -> None:
        """Give the call's own cgroup (`none`) back and drop its state capture, once the
        call ended."""
        if self.group is not None and self.groups is not None:
            self.groups.release(self.group)
        self.group = None
        self.groups = None
        if self.startup is not None:
            self.startup.close()
            self.startup = None


def _spawn_piped(launch: _Launch, reason: str) -> tuple[procs.Process, Pipes]:
    """Spawn with pipes pumped into bounded memory: the fallback when no file can be written."""
    combined = launch.call.policy.streams == "combined"
    out_read, out_write = os.pipe()
    err_read, err_write = (out_read, out_write) if combined else os.pipe()
    try:
        proc = launch.start(out_write, err_write)
    except OSError as exc:
        for fd in {out_read, err_read}:
            os.close(fd)
        raise CallError("spawn_failed", f"could not start bash: {exc}") from exc
    finally:
        for fd in {out_write, err_write}:
            os.close(fd)
    pipes = Pipes(MemoryStream(), None if combined else MemoryStream(), reason, [])
    targets = [(out_read, pipes.stdout)] + ([] if combined else [(err_read, pipes.stderr)])
    for fd, stream in targets:
        if stream is not None:
            pump = threading.Thread(
                target=_pump, args=(fd, stream), name="bashfleet-pump", daemon=True
            )
            pump.start()
            pipes.pumps.append(pump)
    return proc, pipes


def _pump(fd: int, stream: MemoryStream) -> None:
    try:
        while chunk := os.read(fd, 65536):
            stream.append(chunk)
    finally:
        os.close(fd)


def _spawn(launch: _Launch, streams: Streams) -> procs.Process:
    out_fd, err_fd = _open_files(streams)
    try:
        return launch.start(out_fd, err_fd)
    except (OSError, CallError) as exc:
        # Nothing ran (a bad cwd, no bash): leave no empty spill files behind.
        streams.stdout.unlink(missing_ok=True)
        if streams.stderr is not None:
            streams.stderr.unlink(missing_ok=True)
        if isinstance(exc, CallError):
            raise
        raise CallError("spawn_failed", f"could not start bash: {exc}") from exc
    finally:
        os.close(out_fd)
        if err_fd != out_fd:
            os.close(err_fd)


def _exit_fd(proc: procs.Process) -> tuple[int, bool]:
    """(fd that polls readable once the call ended, whether we must close it)."""
    if isinstance(proc, launcher.KeeperProcess):
        # Its status message: a pidfd of bash would race the keeper reaping it.
        return proc.exit_fd(), False
    return os.pidfd_open(proc.pid), True





def _wait(
    proc: procs.Process,
    files: list[FollowedFile],
    timeout_s: float,
    watcher: CallWatcher,
    *,
    over_cap: Callable[[], bool] | None = None,
    detachable: bool = True,
) -> EndReason:
    """Follow the output until the process exits; return why the wait ended.

    `watcher.running()` is called once, at the first wake-up that finds the process
    running; `over_cap()` says when the call wrote more than it may (checked at each
    wake-up); `watcher.detach_requested()` is asked at every wake-up after the first when
    the call is `detachable` (the fleet's is a stat of a flag file: ~2 us a time).
    """
    deadline = time.monotonic() + timeout_s
    first_look = True
    fd, owned = _exit_fd(proc)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            if watcher.cancelled():
                return "cancel"
            if poller.poll(min(remaining, FOLLOW_INTERVAL_S) * 1000):
                proc.wait()
                return "exited"  # the result reads what is left: no catch-up here
            if first_look:
                first_look = False
                watcher.running()
            elif detachable and watcher.detach_requested():
                return "detach"
            for followed in files:
                followed.catch_up(FOLLOW_BUDGET)
            if over_cap is not None and over_cap():
                return "output"
    finally:
        if owned:
            os.close(fd)


def _cap_check(
    settings: Settings, files: list[FollowedFile], pipes: Pipes | None
) -> Callable[[], bool] | None:
    """`over_cap` for `_wait`: the call's output passed `limit_output_mb`."""
    cap = resources.output_cap(settings)
    if cap is None:
        return None
    if pipes is not None:
        streams = [pipes.stdout] + ([pipes.stderr] if pipes.stderr else [])
        return lambda: sum(s.total for s in streams) > cap
    return lambda: sum(f.offset for f in files) > cap


def _run_foreground(
    call: Call,
    cwd: str,
    settings: Settings,
    workspace: WorkspaceRecord,
    *,
    watcher: CallWatcher,
    started: float,
) -> CallResult:
    marker = call.call_id
    user = _user(settings)
    child = child_env(call, settings, workspace, user, marker=marker)
    secrets = redaction_pattern(settings, child.scrubbed_values)
    try:
        streams = _open_streams(call, workspace)
    except OSError as exc:
        raise CallError("spawn_failed", f"spill directory unusable: {exc}") from exc
    # bash's $PWD is the cwd as asked (not the worker's, nor the physical path), so a
    # command that does not `cd` ends where it started, symlinks included.
    child.env["PWD"] = cwd
    launch = _Launch(call, cwd, child, settings, workspace, user, call.capture_state)
    pipes: Pipes | None = None
    problem = spill_problem(settings, streams.stdout.parent)
    watcher.starting()  # before anything is armed: a refusal has nothing to undo
    try:
        if problem is not None:
            raise _NoSpillError(problem)
        proc = _spawn(launch, streams)
    except _NoSpillError as exc:
        # Never lose the call for want of disk: keep its output in bounded memory.
        launch.release()  # a capture the spill attempt armed is armed again
        proc, pipes = _spawn_piped(launch, str(exc))
    files = streams.followers() if pipes is None else []
    timeout_s = call.timeout_s if call.timeout_s is not None else call.policy.default_timeout_s
    try:
        watcher.spawned(Spawned(proc.pid, proc.pid, marker, streams.stdout.parent))
        # Output kept in memory has no file to go on into: such a call cannot detach.
        reason = _wait(proc, files, timeout_s, watcher,
                       over_cap=_cap_check(settings, files, pipes), detachable=pipes is None)
    except BaseException:
        # The watcher failed (or we were interrupted) while the command runs: nobody would
        # ever watch or kill it, so end it before the error goes on.
        procs.terminate(proc.pid, marker, grace_s=0, rounds=settings.sweep_rounds)
        _reap(proc)
        launch.release()
        raise
    builder = ResultBuilder(call, settings, streams, files, secrets, cwd, started, pipes)
    if reason == "exited":
        return _finished(builder, proc, launch, started_with=child.env)
    # With output in memory there is no file to keep running into: kill instead.
    if reason == "detach" or (
        reason == "timeout" and call.policy.on_timeout == "background" and pipes is None
    ):
        record = jobs.adopt_foreground(
            call, proc, streams.stdout, streams.stderr, cwd, settings, on_end=launch.release,
            workspace=workspace,
        )
        if record is None:  # it ended as it was made a job: a finished call after all
            return _finished(builder, proc, launch, started_with=child.env)
        return builder.backgrounded(record, proc.pid, timed_out=reason == "timeout")
    # What the call was doing when its time ran out, for the notice, before killing it.
    doing = procs.describe(procs.find_call_processes(proc.pid, marker))
    survivors = procs.terminate(
        proc.pid, marker, grace_s=call.policy.kill_grace_s, rounds=settings.sweep_rounds
    )
    returncode = _reap(proc)
    launch.release()
    if pipes is not None:
        pipes.drained()
    return builder.killed(returncode, survivors, doing, reason=reason)


#: Seconds a keeper gets to report the status of a call whose processes were killed.
RUNNER_REPORT_S = 10.0


def _reap(proc: procs.Process) -> int:
    """The returncode of a call whose processes were just killed. A runner that does not
    report it in time is killed, which ends its namespace: never a hang."""
    if not isinstance(proc, launcher.KeeperProcess):
        return proc.wait()
    try:
        return proc.wait(RUNNER_REPORT_S)
    except subprocess.TimeoutExpired:
        # Its keeper does not report (stuck, or gone): the call's processes were killed.
        proc.conn.close()
        proc.returncode = -9
        return proc.returncode


def _finished(
    builder: ResultBuilder, proc: procs.Process, launch: _Launch, *, started_with: dict[str, str],
) -> CallResult:
    returncode = proc.wait()
    hits = launch.hits(proc)
    recorded = launch.recorded_state()
    launch.release()
    if builder.pipes is not None:
        builder.pipes.drained()
    if getattr(proc, "capped", False):
        # Its runner stopped it for writing too much before our next look did.
        return builder.killed(returncode, [], (), reason="output")
    finished = builder.finished(returncode, hits)
    return finished if recorded is None else with_state(finished, recorded, started_with)

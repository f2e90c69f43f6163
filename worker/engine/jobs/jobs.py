"""Background jobs: start in a workspace, check and kill from any process given the record.

A job's record is a small JSON file beside its status (`bashfleet.worker.engine.jobs.job_records`;
in the fleet, a Redis hash too). Check and kill need nothing else: the pid with its start
time (a pid reused by an unrelated process is never taken for the job), the process
group, the marker every process of the job carries, and the output and status files.

Where a job runs and who records its end:

- in a sandboxed workspace, a plain job is a child of the workspace's keeper, which
  writes its status and completion line when it ends, the worker up or not;
- an interactive one (stdin `pipe`, `pty`, `closed`) has a supervisor of its own that
  holds its stdin (`bashfleet.worker.engine.isolate.relay`) and asks the keeper to start it;
- on a host without a sandbox (`none`), the supervisor starts it plainly.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bashfleet.worker.engine import cgroups, isolate, procs, resources, sandbox
from bashfleet.worker.engine.call_env import child_env
from bashfleet.worker.engine.isolate import job_end, launcher, proto
from bashfleet.worker.engine.isolate.command_line import COMMAND_FD, CommandLine
from bashfleet.worker.engine.isolate.proto import CAP_MIN_WAIT_S, CapWatch, files_size
from bashfleet.worker.engine.jobs.job_records import (
    JobError,
    load_record,
    local_records,
    read_status,
    record_path,
    save_record,
    write_status,
)
from bashfleet.worker.engine.output import truncate
from bashfleet.worker.engine.output.capture import read_slice
from bashfleet.worker.engine.output.patterns import Pattern, caller_pattern, grep_lines
from bashfleet.worker.engine.secrets import worker_redaction
from bashfleet.worker.engine.startup import Startup
from bashfleet.worker.engine.workspaces import keeper_calls
from bashfleet.worker.settings import Settings, get_settings
from bashfleet.worker.wire.models import (
    Call,
    CheckResult,
    JobHandle,
    JobRecord,
    TailLines,
    Truncation,
    WorkspaceRecord,
)

__all__ = [
    "JobError", "load_record", "local_records", "read_status", "record_path", "save_record",
    "write_status",
]

#: Seconds to wait for the supervisor to report the job's pid.
START_TIMEOUT_S = 10.0
#: Most bytes of new output one check reads; older new output is skipped with a note.
CHECK_READ_LIMIT = 8 * 1024 * 1024
#: Seconds a check that finds the job dead waits for its watcher (the keeper, the
#: supervisor or the adopting worker's thread) to record the end, before concluding that
#: none is alive.
WATCHER_GRACE_S = 1.0


def new_job_id() -> str:
    """A job id unique across hosts and time."""
    return f"j{uuid.uuid4().hex[:15]}"


def handle(record: JobRecord) -> JobHandle:
    """The caller's view of a job: its numbers as the calls of its workspace see them."""
    return JobHandle(
        id=record.id, host=record.host,
        pid=record.ns_pid if record.ns_pid is not None else record.pid,
        pgid=record.ns_pgid if record.ns_pgid is not None else record.pgid,
        output_path=record.output_path, stderr_path=record.stderr_path, stdin=record.stdin,
        host_pid=record.pid if record.ns_pid is not None else None,
        workspace=record.workspace,
    )


def output_path(settings: Settings, workspace: WorkspaceRecord | None, job_id: str) -> Path:
    """Where a job's output goes: its workspace's output directory (readable by its
    calls at that same path), else the jobs directory."""
    if workspace is not None:
        return Path(workspace.out_dir) / f"{job_id}.log"
    return settings.jobs_dir / f"{job_id}.log"


def stderr_path(call: Call, output: Path) -> Path | None:
    """Where a job keeps its stderr apart, beside its output: a job of a call whose
    streams are separate (its stdin `null`: a terminal merges the two, and an
    interactive job's reads follow one file); None: stderr goes to the output file."""
    if call.policy.streams != "separate" or call.stdin != "null":
        return None
    return output.with_suffix(".err")


def start_job(
    call: Call, cwd: str, settings: Settings, workspace: WorkspaceRecord | None = None,
) -> JobRecord:
    """Start `call` as a background job in `workspace` (None, or one without a sandbox:
    plainly, under a supervisor); return its record once it runs."""
    settings.jobs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    job_id = new_job_id()
    output = output_path(settings, workspace, job_id)
    status = settings.jobs_dir / f"{job_id}.status.json"
    new = _NewJob(call, cwd, settings, workspace, job_id, output, status,
                  stderr_path(call, output))
    if workspace is not None and workspace.keeper_pid is not None and call.stdin == "null":
        started = _start_in_keeper(new, workspace)
    else:
        started = _start_supervised(new)
    stdin_id = started.get("stdin_id")
    record = JobRecord(
        id=job_id, host=settings.host, pid=started["pid"], pgid=started["pgid"],
        start_time=started["start_time"], marker=job_id, command=call.command, cwd=cwd,
        output_path=str(output), status_path=str(status), started_at=time.time(),
        stderr_path=str(new.stderr) if new.stderr is not None else None,
        call_id=call.call_id, owner=call.owner, tags=call.tags, stdin=call.stdin,
        socket_path=started.get("socket_path"),
        stdin_id=tuple(stdin_id) if isinstance(stdin_id, list) else None,
        workspace=workspace.id if workspace is not None else None,
        ns_pid=started.get("ns_pid"), ns_pgid=started.get("ns_pid"),
    )
    save_record(record, settings)
    return record


def _job_env(call: Call, settings: Settings, job_id: str,
             workspace: WorkspaceRecord | None = None) -> dict[str, str]:
    """What a call of the job's workspace would get (`call_env`), marked with its id."""
    return child_env(call, settings, workspace, sandbox.run_user(settings), marker=job_id).env


@dataclass(frozen=True)
class _NewJob:
    """A job about to start."""

    call: Call
    cwd: str
    settings: Settings
    workspace: WorkspaceRecord | None
    job_id: str
    output: Path
    status: Path
    stderr: Path | None
    """Its stderr file (None: stderr goes to `output`)."""

    def remove_outputs(self) -> None:
        """Nothing ran: leave no empty output files behind."""
        self.output.unlink(missing_ok=True)
        if self.stderr is not None:
            self.stderr.unlink(missing_ok=True)


def _start_in_keeper(new: _NewJob, workspace: WorkspaceRecord) -> dict[str, Any]:
    """A plain job as a child of its workspace's keeper, which records its end."""
    call, cwd, settings, job_id = new.call, new.cwd, new.settings, new.job_id
    output, status = new.output, new.status
    env = _job_env(call, settings, job_id, workspace)
    startup = Startup(resources.ulimit_line(settings, bool(workspace.cgroup)), capture=False,
                      fd_in_child=launcher.STATE_FD)
    env["BASH_ENV"] = startup.bash_env
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    fds = [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), os.open(output, flags, 0o644),
           startup.fd, os.open(status.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
    # The keeper appends the completion line to the first output it is given: stdout.
    err = [os.open(new.stderr, flags, 0o644)] if new.stderr is not None else []
    line = CommandLine([call.shell or "bash", *(["-l"] if call.login else [])], call.command,
                       fd_in_child=COMMAND_FD)
    command_fds = [line.fd] if line.fd is not None else []
    request: proto.SpawnRequest = {
        "argv": line.argv, "cwd": cwd, "env": env,
        "targets": [0, 1, 2, launcher.STATE_FD, *([COMMAND_FD] if command_fds else [])],
        "output_cap": resources.output_cap(settings),
        "kill_grace_s": call.policy.kill_grace_s,
        "job": {"status": status.name, "cap_mb": settings.limit_output_mb,
                "timeout_s": call.policy.background_timeout_s},
    }
    try:
        conn, started = keeper_calls.start_on(
            workspace, request, [fds[0], fds[1], *(err or fds[1:2]), fds[2], *command_fds,
                                 fds[3]], settings=settings)
        keeper_calls.connections.give_back(workspace.id, conn)
    except OSError as exc:
        new.remove_outputs()
        if exc.filename == cwd:
            raise JobError("bad_cwd", cwd_problem(exc, cwd)) from exc
        raise JobError("spawn_failed", f"could not start the job: {exc.strerror or exc}") from exc
    finally:
        for fd in fds[:2] + fds[3:] + err:
            os.close(fd)
        startup.close()
        line.close()
    return {"pid": started.host_pid, "pgid": started.host_pid, "ns_pid": started.pid,
            "start_time": _ticks_time(started.start_ticks)}


def cwd_problem(exc: OSError, cwd: str) -> str:
    """What a call is told when its cwd cannot be entered in its workspace."""
    if exc.errno == errno.ENOENT:
        return f"Working directory does not exist: {cwd}"
    if exc.errno == errno.ENOTDIR:
        return f"Working directory is not a directory: {cwd}"
    return f"Working directory is not accessible: {cwd} ({exc.strerror or exc})"


def _ticks_time(ticks: int | None) -> float:
    if ticks is None:
        return time.time()
    boot = procs.boot_time() or 0.0
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _start_supervised(new: _NewJob) -> dict[str, Any]:
    """A job under a supervisor of its own: an interactive one (its stdin held there),
    or any job where there is no sandbox."""
    call, cwd, settings, workspace = new.call, new.cwd, new.settings, new.workspace
    job_id, output, status = new.job_id, new.output, new.status
    group = _job_group(settings) if workspace is None or workspace.keeper_pid is None else None
    try:
        spec = _job_spec(call, cwd, settings, workspace, job_id=job_id, group=group)
    except OSError as exc:
        _drop_group(group)
        raise JobError("spawn_failed", f"could not start the job: {exc}") from exc
    spec.update(output_path=str(output), status_path=str(status),
                stderr_path=str(new.stderr) if new.stderr is not None else None)
    held = None
    if "keeper" in spec and workspace is not None:
        # The supervisor starts the job on a connection made here: a sleeping workspace
        # is woken by this process's zygote (the supervisor has none), and its keeper
        # stays awake while the connection is open.
        try:
            held = keeper_calls.awake(workspace, settings, hold=True)
        except OSError as exc:
            raise JobError("spawn_failed", f"could not start the job: {exc.strerror or exc}"
                           ) from exc
        spec["keeper"]["fd"] = held.fileno()
    path = settings.jobs_dir / f"{job_id}.spec.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    output.touch(mode=0o644)
    if new.stderr is not None:
        new.stderr.touch(mode=0o644)
    try:
        started = _launch_supervisor(path, held)
    except JobError:
        # Nothing ran: leave no empty output files (or cgroup) behind.
        new.remove_outputs()
        _drop_group(group)
        raise
    finally:
        if held is not None:
            held.close()
    started["socket_path"] = spec.get("socket_path")
    return started


def _job_group(settings: Settings) -> cgroups.Group | None:
    """An unsandboxed job's cgroup, when this host makes them (its supervisor removes it)."""
    carried, support = resources.cgroup_plan(settings)
    if support.version is None or not carried.controllers():
        return None
    try:
        return cgroups.create(support, carried)
    except OSError as exc:
        raise JobError("spawn_failed", f"could not make the job's cgroup: {exc}") from exc


def _drop_group(group: cgroups.Group | None) -> None:
    if group is not None:
        group.remove(timeout=0)


def _job_spec(
    call: Call, cwd: str, settings: Settings, workspace: WorkspaceRecord | None, *,
    job_id: str, group: cgroups.Group | None,
) -> dict[str, Any]:
    """The supervisor's instructions (without the output and status paths)."""
    user = sandbox.run_user(settings)
    in_keeper = workspace is not None and workspace.keeper_pid is not None
    env = _job_env(call, settings, job_id, workspace)
    dirs = [path for path, _ in group.paths] if group is not None else []
    # An unsandboxed job's command joins its cgroup with its first line; a sandboxed one
    # is born in its workspace's.
    join = cgroups.join_line(launcher.CGROUP_FD + n for n in range(len(dirs)))
    carried = bool(dirs) or bool(workspace and workspace.cgroup)
    limits_line = resources.ulimit_line(settings, carried)
    # A job no keeper starts sets its open files limit itself (a keeper sets its own).
    plain_line = resources.ulimit_line(
        settings, carried, workspace.limits.open_files if workspace else settings.limit_open_files)
    spec: dict[str, Any] = {
        "command": (join + plain_line if not in_keeper else "") + call.command,
        "cwd": cwd, "env": env,
        "timeout_s": call.policy.background_timeout_s,
        "kill_grace_s": call.policy.kill_grace_s,
        "output_cap": resources.output_cap(settings), "output_cap_mb": settings.limit_output_mb,
        "cgroup_dirs": dirs, "cgroup_fd": launcher.CGROUP_FD,
        "engine": str(Path(launcher.__file__).parent),
    }
    if in_keeper and workspace is not None:
        spec["keeper"] = {"socket": workspace.socket_path, "startup": limits_line}
    if call.stdin != "null":
        size = call.term_size
        spec.update(
            stdin=call.stdin, socket_path=str(settings.jobs_dir / f"{job_id}.sock"),
            term_size=[size.rows, size.cols] if size else None, shell=call.shell,
            login=call.login, idle_s=settings.interactive_idle_s,
        )
    if user is not None and not in_keeper:
        spec["user"] = [user.uid, user.gid, list(sandbox.extra_groups(user))]
    return spec


def _launch_supervisor(spec: Path, held: launcher.KeeperConnection | None = None
                       ) -> dict[str, Any]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    try:
        proc = subprocess.Popen(
            isolate.command("job_supervisor", str(spec)),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            close_fds=True,
            pass_fds=(held.fileno(),) if held is not None else (),
        )
    except OSError as exc:
        spec.unlink(missing_ok=True)
        raise JobError("spawn_failed", f"could not start the job supervisor: {exc}") from exc
    if proc.stdout is None:  # pragma: no cover - stdout=PIPE always gives one
        raise JobError("spawn_failed", "the job supervisor has no stdout")
    ready = launcher.readable(proc.stdout.fileno(), START_TIMEOUT_S)
    line = proc.stdout.readline() if ready else b""
    proc.stdout.close()
    # The supervisor lives on detached; reap it from a thread if it ends while we run.
    threading.Thread(target=proc.wait, name="bashfleet-reap", daemon=True).start()
    try:
        started: dict[str, Any] = json.loads(line)
    except ValueError:
        spec.unlink(missing_ok=True)
        raise JobError("spawn_failed", "the job supervisor did not start the job") from None
    if "error" in started:
        raise JobError("spawn_failed", str(started["error"]))
    return started


def adopt_foreground(  # noqa: PLR0917 - public signature the fleet calls
    call: Call,
    proc: procs.Process,
    stdout: Path,
    stderr: Path | None,
    cwd: str,
    settings: Settings,
    *,
    on_end: Callable[[], object] | None = None,
    workspace: WorkspaceRecord | None = None,
) -> JobRecord | None:
    """Turn a running foreground call into a job that keeps running (its timeout made it
    auto-background, or its caller detached it); None when it ended meanwhile.

    Its output keeps going to its spill files. In a workspace its keeper records its end
    (the worker up or not); else a watcher thread of this process does (and stops it if
    its output passes the host's cap), then calls `on_end`. If this process dies first,
    the end is recorded as unknown on re-adoption.
    """
    settings.jobs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    job_id = new_job_id()
    status = settings.jobs_dir / f"{job_id}.status.json"
    ns_pid = getattr(proc, "ns_pid", None)
    record = JobRecord(
        id=job_id, host=settings.host, pid=proc.pid, pgid=proc.pid,
        start_time=procs.start_time(proc.pid) or time.time(), marker=call.call_id,
        command=call.command, cwd=cwd, output_path=str(stdout), status_path=str(status),
        started_at=time.time(), call_id=call.call_id, owner=call.owner,
        stderr_path=str(stderr) if stderr else None, tags=call.tags,
        workspace=workspace.id if workspace is not None else None,
        ns_pid=ns_pid, ns_pgid=ns_pid,
    )
    if isinstance(proc, keeper_calls.WorkspaceProcess):
        if not _adopt_in_keeper(proc, call, settings, status):
            return None
        save_record(record, settings)
        if on_end is not None:
            on_end()
        return record
    save_record(record, settings)
    watch = _Watch(proc, record, settings.limit_output_mb, call.policy.kill_grace_s, on_end)
    threading.Thread(target=watch.run, name=f"bashfleet-watch-{job_id}", daemon=True).start()
    return record


def _adopt_in_keeper(proc: keeper_calls.WorkspaceProcess, call: Call, settings: Settings,
                     status: Path) -> bool:
    folder = os.open(status.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        adopted = proc.conn.adopt(proto.AdoptRequest(
            status=status.name, cap_mb=settings.limit_output_mb, timeout_s=None,
            kill_grace_s=call.policy.kill_grace_s), [folder])
    except OSError:
        adopted = False
    finally:
        os.close(folder)
    if adopted:
        keeper_calls.connections.give_back(proc.record.id, proc.conn)  # free for the next call
    return adopted


class _Watch:
    """The worker's watcher of an auto-backgrounded call that runs unsandboxed."""

    def __init__(self, proc: procs.Process, record: JobRecord, cap_mb: int | None,
                 grace_s: float, on_end: Callable[[], object] | None) -> None:
        self.proc = proc
        self.record = record
        self.cap_mb = cap_mb
        self.grace_s = grace_s
        self.on_end = on_end

    def run(self) -> None:
        returncode, capped = self._wait()
        with open(self.record.output_path, "a", encoding="utf-8") as handle:
            if capped:
                handle.write(job_end.cap_notice(self.cap_mb))
            handle.write(job_end.completion_line(returncode))
        # The watcher knows the real status: it replaces a guess a check may have written.
        write_status(self.record, returncode, job_end.cap_note(self.cap_mb) if capped else None,
                     replace=True)
        if self.on_end is not None:
            self.on_end()

    def _wait(self) -> tuple[int, bool]:
        """(returncode, whether the output cap stopped it)."""
        if self.cap_mb is None:
            return self.proc.wait(), False
        paths = [p for p in (self.record.output_path, self.record.stderr_path) if p]
        watch = CapWatch(lambda: _paths_size(paths), self.cap_mb * 1024 * 1024)
        pause = CAP_MIN_WAIT_S
        while True:
            try:
                return self.proc.wait(pause), False
            except subprocess.TimeoutExpired:
                pass
            over, pause = watch.step()
            if over:
                procs.terminate(self.record.pgid, self.record.marker, grace_s=self.grace_s)
                return self.proc.wait(), True


def _paths_size(paths: list[str]) -> int:
    fds = []
    try:
        for path in paths:
            with contextlib.suppress(OSError):
                fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        return files_size(fds)
    finally:
        for fd in fds:
            os.close(fd)


def is_running(record: JobRecord) -> bool:
    """True while the job's leader or any process carrying its marker is alive."""
    if procs.is_same_process(record.pid, record.start_time):
        return True
    return bool(procs.find_call_processes(None, record.marker))


def check_job(
    record: JobRecord,
    *,
    offset: int = 0,
    stderr_offset: int = 0,
    grep: str | None = None,
    policy: Truncation | None = None,
    settings: Settings | None = None,
) -> CheckResult:
    """The job's state and its output since `offset`, filtered by `grep`, cut by `policy`."""
    settings = settings or get_settings()
    pattern = compile_grep(grep)
    status = read_status(record)
    # Running means the job's bash has not ended; processes it left behind are named in
    # the note (and `kill` ends them), as a shell's `jobs` would not list them either.
    running = status is None and procs.is_same_process(record.pid, record.start_time)
    note = None
    if status is None and not running:
        # The watcher records the end moments after the job dies: give it that moment.
        _await_status(record, timeout=WATCHER_GRACE_S)
        status = read_status(record)
    if status is None and not running:
        # Nothing recorded the end: the watcher died with its worker.
        write_status(record, None, note="ended while no watcher was alive; exit status unknown")
        status = read_status(record)
    if status is not None and status.note:
        note = status.note
    if not running:
        note = _join(note, _lingering_note(record))
    secrets = worker_redaction(settings)
    text, new_offset, skipped = _read_new(Path(record.output_path), offset, secrets)
    err_text, new_err_offset = "", stderr_offset
    if record.stderr_path:
        err_text, new_err_offset, _ = _read_new(Path(record.stderr_path), stderr_offset, secrets)
    if skipped:
        note = _join(note, f"{skipped} older bytes of new output not shown")
    if pattern is not None:
        text = grep_lines(text, pattern)
        err_text = grep_lines(err_text, pattern)
    cut = truncate.apply(text, policy or TailLines())
    return CheckResult(
        id=record.id,
        host=record.host,
        running=running,
        exit_code=status.exit_code if status else None,
        signal=status.signal if status else None,
        output=cut.text,
        offset=new_offset,
        output_truncation=cut.info,
        output_path=record.output_path,
        stderr_output=truncate.apply(err_text, policy or TailLines()).text,
        stderr_offset=new_err_offset,
        note=note,
    )


def _join(note: str | None, more: str | None) -> str | None:
    if not more:
        return note
    return f"{note}; {more}" if note else more


def _lingering_note(record: JobRecord) -> str | None:
    left = procs.find_call_processes(None, record.marker)
    if not left:
        return None
    shown = ", ".join(str(pid) for pid in left[:10])
    return (
        f"{len(left)} process(es) the job started are still running (pid {shown}); "
        "kill ends them"
    )


def compile_grep(grep: str | None) -> Pattern | None:
    """A caller's `grep`, compiled in RE2 (linear time); None for none; JobError
    `invalid` (saying why) for a pattern RE2 cannot take."""
    if grep is None or grep == "":
        return None
    try:
        return caller_pattern(grep)
    except ValueError as exc:
        raise JobError("invalid", f"invalid regular expression {grep!r}: {exc}") from None


def _read_new(
    path: Path, offset: int, secrets: re.Pattern[str] | None
) -> tuple[str, int, int]:
    """New output from `offset` to the end: (text, next offset, bytes skipped)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "", offset, 0
    skipped = max(0, size - offset - CHECK_READ_LIMIT)
    start = offset + skipped
    text, end, _ = read_slice(path, start, size - start, secrets)
    return text, end, skipped


def kill_job(
    record: JobRecord,
    *,
    offset: int = 0,
    stderr_offset: int = 0,
    grace_s: float = 2.0,
    policy: Truncation | None = None,
    settings: Settings | None = None,
    first: int = signal.SIGTERM,
) -> CheckResult:
    """End a job (group SIGTERM or `first`, grace, SIGKILL, marker sweep); return its
    final state."""
    settings = settings or get_settings()
    leader_ours = procs.is_same_process(record.pid, record.start_time)
    survivors = procs.terminate(
        record.pgid if leader_ours else None, record.marker,
        grace_s=grace_s, rounds=settings.sweep_rounds, first=first,
    )
    _await_status(record, timeout=2.0)
    write_status(record, None, note="killed; the supervisor did not record the exit status")
    result = check_job(
        record, offset=offset, stderr_offset=stderr_offset, policy=policy, settings=settings
    )
    if survivors:
        note = f"{len(survivors)} process(es) survived the kill: {survivors}"
        result = result.model_copy(update={"running": True, "note": note})
    return result


def _await_status(record: JobRecord, timeout: float) -> None:
    # The supervisor (or the adopting worker's watcher thread) writes the status right
    # after the job dies; give it a moment before recording the end ourselves.
    deadline = time.monotonic() + timeout
    delay = 0.002
    while read_status(record) is None and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.05)

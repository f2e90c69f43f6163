"""Background jobs: start detached, check and kill from any process given the record.

A job's record is a small JSON file beside its output (and, in the fleet, a Redis
hash). Check and kill need nothing else: the pid with its start time (a pid reused
by an unrelated process is never taken for the job), the process group, the marker
every process of the job carries, and the output and status files.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.engine import cgroups, launcher, procs, sandbox, truncate
from worker.engine.capture import read_slice
from worker.engine.environment import build_env
from worker.engine.job_supervisor import _cap_notice, _completion_line
from worker.engine.launcher import CAP_MIN_WAIT_S, CapWatch, files_size
from worker.engine.patterns import Pattern, caller_pattern, grep_lines
from worker.engine.secrets import worker_redaction
from worker.settings import Settings, get_settings
from worker.wire.errors import ToolError
from worker.wire.models import (
    Call,
    CheckResult,
    JobHandle,
    JobRecord,
    JobStatus,
    TailLines,
    Truncation,
)

_SUPERVISOR = Path(__file__).with_name("job_supervisor.py")
#: Seconds to wait for the supervisor to report the job's pid.
START_TIMEOUT_S = 10.0
#: Most bytes of new output one check reads; older new output is skipped with a note.
CHECK_READ_LIMIT = 8 * 1024 * 1024
#: Seconds a check that finds the job dead waits for its watcher (the supervisor or the
#: adopting worker's thread) to record the end, before concluding that none is alive.
WATCHER_GRACE_S = 1.0


class JobError(ToolError):
    """A job could not be started, found or controlled."""


def new_job_id() -> str:
    """A job id unique across hosts and time."""
    return f"j{uuid.uuid4().hex[:15]}"


def handle(record: JobRecord) -> JobHandle:
    """The caller's view of a job."""
    return JobHandle(
        id=record.id, host=record.host, pid=record.pid, pgid=record.pgid,
        output_path=record.output_path, stdin=record.stdin,
    )


def record_path(settings: Settings, job_id: str) -> Path:
    """Where the worker keeps a job's record on its own disk (for re-adoption)."""
    return settings.jobs_dir / f"{job_id}.json"


def save_record(record: JobRecord, settings: Settings) -> None:
    """Write the record beside the job's files, atomically."""
    path = record_path(settings, record.id)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(record.model_dump_json(), encoding="utf-8")
    os.replace(tmp, path)


def load_record(job_id: str, settings: Settings | None = None) -> JobRecord:
    """Read a job's record from this host's disk."""
    settings = settings or get_settings()
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", job_id):
        raise JobError("not_found", f"no such job: {job_id!r}")
    try:
        return JobRecord.model_validate_json(record_path(settings, job_id).read_text("utf-8"))
    except FileNotFoundError:
        raise JobError("not_found", f"no such job: {job_id}") from None


def local_records(settings: Settings | None = None) -> list[JobRecord]:
    """Every job record kept on this host."""
    settings = settings or get_settings()
    if not settings.jobs_dir.is_dir():
        return []
    records = []
    for path in sorted(settings.jobs_dir.glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            records.append(JobRecord.model_validate_json(path.read_text("utf-8")))
    return records


def start_job(
    call: Call, cwd: str, settings: Settings, choice: sandbox.Choice | None = None
) -> JobRecord:
    """Start `call` detached under a supervisor (in a sandbox of its own unless `choice`
    is `none`); return its record once it runs."""
    choice = choice or sandbox.Choice("none", network=True)
    settings.jobs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    job_id = new_job_id()
    output = settings.jobs_dir / f"{job_id}.log"
    status = settings.jobs_dir / f"{job_id}.status.json"
    group = _job_group(settings)
    try:
        spec = _job_spec(call, cwd, settings, choice, job_id=job_id, group=group)
    except OSError as exc:
        _drop_group(group)
        raise JobError("spawn_failed", f"could not start the job: {exc}") from exc
    spec.update(output_path=str(output), status_path=str(status))
    path = settings.jobs_dir / f"{job_id}.spec.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    output.touch(mode=0o600)
    try:
        started = _launch_supervisor(path)
    except JobError:
        # Nothing ran: leave no empty output file (or cgroup) behind.
        output.unlink(missing_ok=True)
        _drop_group(group)
        raise
    stdin_id = started.get("stdin_id")
    record = JobRecord(
        id=job_id, host=settings.host, pid=started["pid"], pgid=started["pgid"],
        start_time=started["start_time"], marker=job_id, command=call.command, cwd=cwd,
        output_path=str(output), status_path=str(status), started_at=time.time(),
        call_id=call.call_id, owner=call.owner, tags=call.tags, stdin=call.stdin,
        socket_path=spec.get("socket_path"),
        stdin_id=tuple(stdin_id) if isinstance(stdin_id, list) else None,
    )
    save_record(record, settings)
    return record


def _job_group(settings: Settings) -> cgroups.Group | None:
    """The job's cgroup, when this host makes them (its supervisor removes it at the end)."""
    carried, support = sandbox.cgroup_plan(settings)
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
    call: Call, cwd: str, settings: Settings, choice: sandbox.Choice, *, job_id: str,
    group: cgroups.Group | None,
) -> dict[str, Any]:
    """The supervisor's instructions (without the output and status paths)."""
    user = sandbox.run_as_user(settings)
    child = build_env(
        os.environ, marker=job_id, extra={**sandbox.user_env(user), **call.env},
        unset=call.unset_env, deny=settings.secret_deny, allow=settings.secret_allow,
    )
    dirs = [path for path, _ in group.paths] if group is not None else []
    # A sandboxed job's runner joins the cgroup before it spawns bash; a plain one's
    # command joins it with its first line.
    plain = choice.level == "none"
    join = cgroups.join_line(launcher.CGROUP_FD + n for n in range(len(dirs))) if plain else ""
    command = join + sandbox.ulimit_line(settings) + call.command
    spec: dict[str, Any] = {
        "command": command, "cwd": cwd, "env": child.env,
        "timeout_s": call.policy.background_timeout_s,
        "kill_grace_s": call.policy.kill_grace_s,
        "output_cap": sandbox.output_cap(settings), "output_cap_mb": settings.limit_output_mb,
        "cgroup_dirs": dirs, "cgroup_fd": launcher.CGROUP_FD,
        "launcher": launcher.__file__,
    }
    if call.stdin != "null":
        size = call.term_size
        spec.update(
            stdin=call.stdin, socket_path=str(settings.jobs_dir / f"{job_id}.sock"),
            term_size=[size.rows, size.cols] if size else None, shell=call.shell,
            login=call.login, idle_s=settings.interactive_idle_s,
            relay=str(Path(launcher.__file__).with_name("relay.py")),
        )
    if choice.level != "none":
        spec["sandbox"] = sandbox.job_spec(
            settings, choice, command, cwd=cwd, env=child.env, grace_s=call.policy.kill_grace_s
        )
    elif user is not None:
        spec["user"] = [user.uid, user.gid, list(sandbox.extra_groups(user))]
    return spec


def _launch_supervisor(spec: Path) -> dict[str, Any]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_SUPERVISOR), str(spec)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        spec.unlink(missing_ok=True)
        raise JobError("spawn_failed", f"could not start the job supervisor: {exc}") from exc
    if proc.stdout is None:  # pragma: no cover - stdout=PIPE always gives one
        raise JobError("spawn_failed", "the job supervisor has no stdout")
    ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
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
) -> JobRecord:
    """Turn a timed-out foreground call into a job that keeps running.

    Its output keeps going to its spill files; a watcher thread records its end (and
    stops it if its output passes the host's cap), then calls `on_end`.
    If this process dies first, the end is recorded as unknown on re-adoption.
    """
    settings.jobs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    job_id = new_job_id()
    record = JobRecord(
        id=job_id, host=settings.host, pid=proc.pid, pgid=proc.pid,
        start_time=procs.start_time(proc.pid) or time.time(), marker=call.call_id,
        command=call.command, cwd=cwd, output_path=str(stdout),
        status_path=str(settings.jobs_dir / f"{job_id}.status.json"),
        started_at=time.time(), call_id=call.call_id, owner=call.owner,
        stderr_path=str(stderr) if stderr else None, tags=call.tags,
    )
    save_record(record, settings)
    watch = _Watch(proc, record, settings.limit_output_mb, call.policy.kill_grace_s, on_end)
    threading.Thread(target=watch.run, name=f"bashfleet-watch-{job_id}", daemon=True).start()
    return record


class _Watch:
    """The worker's watcher of an auto-backgrounded call."""

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
                handle.write(_cap_notice(self.cap_mb))
            handle.write(completion_line(returncode))
        # The watcher knows the real status: it replaces a guess a check may have written.
        note = f"stopped: its output passed this host's cap of {self.cap_mb} MiB"
        write_status(self.record, returncode, note if capped else None, replace=True)
        if self.on_end is not None:
            self.on_end()

    def _wait(self) -> tuple[int, bool]:
        """(returncode, whether the output cap stopped it)."""
        if isinstance(self.proc, launcher.RunnerProcess):
            # Its runner watches the cap (out of this process: no thread of ours to wait
            # for the GIL meanwhile).
            returncode = self.proc.wait()
            return returncode, self.proc.capped
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


def completion_line(returncode: int) -> str:
    """Seed 001's completion line, appended to a job's output when it ends."""
    # One implementation for both the supervisor (which cannot import us) and here.
    return _completion_line(returncode)


def write_status(
    record: JobRecord, returncode: int | None, note: str | None = None, *, replace: bool = False
) -> None:
    """Record how a job ended, atomically, unless its end is already recorded.

    `replace`: overwrite what is recorded (the job's own watcher, which knows the truth).
    Writers race (a check, a kill, the watcher): each uses its own temporary file, and
    without `replace` the status is linked into place only if none exists yet.
    """
    path = Path(record.status_path)
    if not replace and path.exists():
        return
    status = JobStatus(
        exit_code=returncode if returncode is not None and returncode >= 0 else None,
        signal=-returncode if returncode is not None and returncode < 0 else None,
        ended_at=time.time(),
        note=note,
    )
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(status.model_dump_json(), encoding="utf-8")
    try:
        if replace:
            os.replace(tmp, path)
        else:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_status(record: JobRecord) -> JobStatus | None:
    """How the job ended, or None while its end is not recorded."""
    try:
        return JobStatus.model_validate_json(Path(record.status_path).read_text("utf-8"))
    except (FileNotFoundError, ValueError):
        return None


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

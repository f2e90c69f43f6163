"""Supervisor of one background job: run it, wait for it, record how it ended.

Started detached (own session) by `bashfleet.worker.engine.jobs.jobs.start_job` as
`python -I -S .../isolate/bootstrap.py job_supervisor SPEC_PATH`, it outlives the worker that
started it, so a job's exit status is recorded even when no worker is watching when it ends. It
serves the jobs a workspace's keeper does not watch alone: interactive ones (it holds their
stdin: `bashfleet.worker.engine.isolate.relay`), which it asks the keeper to start inside the
workspace, and the jobs of a host without a sandbox, which it starts itself.

Standard library only: it runs with `-I -S` to start fast and to be immune to the
caller's PYTHON* variables (`bootstrap.py` finds its siblings). The spec (JSON, mode 0600) is read
and deleted at once because it holds the job's environment.

Protocol: one JSON line `{"pid": P, "pgid": G, "start_time": T, "ns_pid": N}` on stdout
once the job runs (or `{"error": "..."}`), then stdout is closed. When the job ends:
the status file is written atomically and a completion line (the modes dialect's text) is
appended to the output file. A job whose output passes the host's cap is stopped
(group SIGTERM, grace, SIGKILL) with a notice before that line.
"""

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import termios
import time
from collections.abc import Iterable
from typing import Any

from bashfleet.worker.engine.isolate import job_end, launcher, proto, relay
from bashfleet.worker.engine.isolate.command_line import COMMAND_FD, CommandLine


def _start_time(pid: int) -> float:
    # The same arithmetic as psutil: boot time plus start ticks over the clock rate.
    with open(f"/proc/{pid}/stat", "rb") as handle:
        raw = handle.read().decode("ascii", "replace")
    ticks = int(raw[raw.rfind(")") + 2 :].split()[19])
    with open("/proc/stat", "rb") as handle:
        for line in handle:
            if line.startswith(b"btime"):
                boot = float(line.split()[1])
                break
        else:  # pragma: no cover - every Linux has btime
            boot = 0.0
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _wait(proc: Any, spec: dict[str, Any]) -> tuple[int, bool]:
    """Wait for the job: (returncode, whether its output cap stopped it). Past its
    timeout (24 h for the modes dialect's background jobs) or its cap, end its group
    politely, then not."""
    timeout_s = spec.get("timeout_s")
    cap = spec.get("output_cap")
    watch = None
    if cap is not None and not spec.get("keeper"):
        # A job in a workspace: its keeper watches its cap.
        paths = [spec["output_path"], *([spec["stderr_path"]] if spec.get("stderr_path") else [])]
        watch = proto.CapWatch(lambda: sum(_size(path) for path in paths), cap)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    step: float | None = 0.01 if watch is not None else None
    while True:
        if deadline is not None:
            left = max(0.0, deadline - time.monotonic())
            step = left if step is None else min(step, left)
        try:
            returncode = proc.wait(step)
            return returncode, bool(getattr(proc, "capped", False))
        except subprocess.TimeoutExpired:
            pass
        if watch is not None:
            over, step = watch.step()
            if over:
                return _stop(proc, float(spec.get("kill_grace_s") or 0)), True
        if deadline is not None and time.monotonic() >= deadline:
            return _stop(proc, float(spec.get("kill_grace_s") or 0)), False


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _stop(proc: Any, grace_s: float) -> int:
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            break  # already gone: ESRCH is success
        try:
            return int(proc.wait(wait_s))
        except subprocess.TimeoutExpired:
            continue
    return int(proc.wait())


def _ignore(signum: int, frame: object) -> None:
    del signum, frame


def open_procs_files(folders: Iterable[str]) -> list[int]:
    """The `cgroup.procs` file of each cgroup directory, opened for writing
    (close-on-exec): a process writes itself in. All or none (an error closes them).

    Here, in this standard-library-only module, so that the worker's cgroups use it too.
    """
    fds: list[int] = []
    try:
        for folder in folders:
            fds.append(os.open(os.path.join(folder, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC))
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _procs_fds(spec: dict[str, Any]) -> list[int]:
    """The job's cgroup procs files, opened for writing (the job writes itself in)."""
    return open_procs_files(spec.get("cgroup_dirs") or [])


def _command_line(spec: dict[str, Any], fd_in_child: int | None = None) -> CommandLine:
    """`bash -c COMMAND`, or an interactive session's own shell (`-l`: a login shell)."""
    shell = spec.get("shell") or "bash"
    return CommandLine([shell, *(["-l"] if spec.get("login") else [])], spec["command"],
                       fd_in_child=fd_in_child)


def _ctty() -> None:
    """In the child (plain jobs on a PTY): its fd 0 becomes its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _start_plain(spec: dict[str, Any], out_fd: int, stdio: tuple[int, int, int] | None = None,
                 ctty: bool = False, *, err_fd: int | None = None) -> tuple[Any, float]:
    """bash -c COMMAND, its cgroup fds where the command's first line expects them.
    `stdio`: the child's fds 0, 1, 2 (an interactive session's pipe or terminal);
    `err_fd`: its stderr, when not `out_fd`."""
    targets = []
    for offset, fd in enumerate(_procs_fds(spec)):
        target = spec["cgroup_fd"] + offset
        os.dup2(fd, target)  # we are single-threaded: fixed numbers are ours to take
        os.close(fd)
        targets.append(target)
    user = spec.get("user") or [None, None, None]
    line = _command_line(spec)
    passed = [*targets, *([line.fd] if line.fd is not None else [])]
    try:
        stdin, stdout, stderr = stdio or (subprocess.DEVNULL, out_fd, err_fd or out_fd)
        proc = subprocess.Popen(
            line.argv, cwd=spec["cwd"], env=spec["env"],
            stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True,
            close_fds=True, pass_fds=passed, user=user[0], group=user[1], extra_groups=user[2],
            # This process is single-threaded: a preexec_fn is safe here.
            preexec_fn=_ctty if ctty else None,  # noqa: PLW1509
        )
    finally:
        line.close()
        for target in targets:
            os.close(target)
    return proc, _start_time(proc.pid)


def _start_in_keeper(spec: dict[str, Any], out_fd: int,
                     stdio: tuple[int, int, int] | None = None,
                     ctty: bool = False, *, err_fd: int | None = None) -> tuple[Any, float]:
    """The job as a child of its workspace's keeper (in the workspace's namespaces).
    `err_fd`: its stderr, when not `out_fd`."""
    keeper = spec["keeper"]
    if keeper.get("fd") is not None:
        # The worker's connection, made (and the keeper woken) for this supervisor.
        conn = launcher.KeeperConnection(socket.socket(fileno=int(keeper["fd"])))
    else:
        conn = launcher.KeeperConnection.connect(keeper["socket"])
    startup = os.memfd_create("bashfleet-startup", os.MFD_CLOEXEC)
    os.write(startup, f"unset BASH_ENV\n{keeper.get('startup') or ''}".encode())
    env = {**spec["env"], "BASH_ENV": f"/dev/fd/{launcher.STATE_FD}"}
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    line = _command_line(spec, COMMAND_FD)
    command_fds = [line.fd] if line.fd is not None else []
    request: proto.SpawnRequest = {
        "argv": line.argv, "cwd": spec["cwd"], "env": env, "ctty": ctty,
        "targets": [0, 1, 2, launcher.STATE_FD, *([COMMAND_FD] if command_fds else [])],
        "kill_grace_s": spec.get("kill_grace_s"),
        # A terminal's output is copied by the relay, which watches the cap on it.
        "output_cap": None if stdio is not None else spec.get("output_cap"),
    }
    try:
        started = conn.start(request, [*(stdio or (null, out_fd, err_fd or out_fd)), startup,
                                       *command_fds])
    except OSError:
        conn.close()
        raise
    finally:
        line.close()
        os.close(null)
        os.close(startup)
    ticks = started.start_ticks
    when = _boot_time() + ticks / os.sysconf("SC_CLK_TCK") if ticks is not None else time.time()
    return launcher.KeeperProcess(conn, started), when


def _boot_time() -> float:
    with open("/proc/stat", "rb") as handle:
        for line in handle:
            if line.startswith(b"btime"):
                return float(line.split()[1])
    return 0.0  # pragma: no cover - every Linux has btime


def _remove_groups(spec: dict[str, Any], timeout: float = 5.0) -> None:
    """Remove the job's cgroup once its last process is gone."""
    deadline = time.monotonic() + timeout
    for folder in spec.get("cgroup_dirs") or []:
        while True:
            try:
                os.rmdir(folder)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)


def main(spec_path: str) -> int:
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    os.unlink(spec_path)
    # The worker may stop (and signal its own group) while the job runs: this process
    # is in a session of its own, and it ignores the polite signals so it can record
    # the job's end. SIGKILL still ends it. A handler (not SIG_IGN, which exec keeps)
    # so that the job itself starts with default signal handling.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _ignore)
    start = _start_in_keeper if spec.get("keeper") else _start_plain
    if spec.get("stdin", "null") != "null":
        return int(relay.main(spec, start, job_end.write_status, _remove_groups))
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    out_fd = os.open(spec["output_path"], flags, 0o644)
    err_fd = os.open(spec["stderr_path"], flags, 0o644) if spec.get("stderr_path") else None
    try:
        proc, started = start(spec, out_fd, err_fd=err_fd)
    except OSError as exc:
        sys.stdout.write(json.dumps({"error": f"could not start bash: {exc}"}) + "\n")
        _remove_groups(spec, timeout=0)
        return 1
    finally:
        os.close(out_fd)
        if err_fd is not None:
            os.close(err_fd)
    sys.stdout.write(json.dumps({"pid": proc.pid, "pgid": proc.pid, "start_time": started,
                                 "ns_pid": getattr(proc, "ns_pid", None)}) + "\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    returncode, capped = _wait(proc, spec)
    with open(spec["output_path"], "a", encoding="utf-8") as handle:
        if capped:
            handle.write(job_end.cap_notice(spec.get("output_cap_mb")))
        handle.write(job_end.completion_line(returncode))
    note = job_end.cap_note(spec.get("output_cap_mb"))
    job_end.write_status(spec["status_path"], returncode, note if capped else None)
    _remove_groups(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""Supervisor of one background job: run it, wait for it, record how it ended.

Started detached (own session) by `worker.engine.jobs.start_job` as
`python -I -S job_supervisor.py SPEC_PATH`, it outlives the worker that started it, so a
job's exit status is recorded even when no worker is watching when it ends.

Standard library only, and no package imports: it runs with `-I -S` to start fast
and to be immune to the caller's PYTHON* variables. The spec (JSON, mode 0600) is
read and deleted at once because it holds the job's environment. A sandboxed job gets
a launcher of its own (bwrap, then `launcher.py`, loaded here by path): the launcher
exits once it made the job's runner, and the runner lives as long as the job.

Protocol: one JSON line `{"pid": P, "pgid": G, "start_time": T}` on stdout once the
job runs (or `{"error": "..."}`), then stdout is closed. When the job ends:
the status file is written atomically and a completion line (seed 001's text) is
appended to the output file. A job whose output passes the host's cap is stopped
(group SIGTERM, grace, SIGKILL) with a notice before that line.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any


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


def _completion_line(returncode: int) -> str:
    # Seed 001: "[background process completed]" or "[background process failed: STATUS]",
    # STATUS as Rust's ExitStatus prints it.
    if returncode == 0:
        return "\n\n[background process completed]\n"
    if returncode < 0:
        number = -returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "?"
        return f"\n\n[background process failed: signal: {number} ({name})]\n"
    return f"\n\n[background process failed: exit status: {returncode}]\n"


def _cap_notice(cap_mb: int | None) -> str:
    """The line appended to a job's output when its output cap stopped it."""
    return f"\n[bashfleet: the output passed this host's cap of {cap_mb} MiB; the job was stopped]"


def _write_status(path: str, returncode: int, note: str | None = None) -> None:
    status = {
        "exit_code": returncode if returncode >= 0 else None,
        "signal": -returncode if returncode < 0 else None,
        "ended_at": time.time(),
        "note": note,
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(status, handle)
    os.replace(tmp, path)


def _wait(proc: Any, spec: dict[str, Any]) -> tuple[int, bool]:
    """Wait for the job: (returncode, whether its output cap stopped it). Past its
    timeout (seed 001: 24 h) or its cap, end its group politely, then not."""
    timeout_s = spec.get("timeout_s")
    cap = spec.get("output_cap")
    watch = None
    if cap is not None and not spec.get("sandbox"):
        # A sandboxed job's runner watches its cap itself.
        launcher = _launcher(spec)
        watch = launcher.CapWatch(lambda: _size(spec["output_path"]), cap)
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


def _load_by_path(name: str, path: str) -> Any:
    """A module of the engine loaded from its file (no package imports here)."""
    found = importlib.util.spec_from_file_location(name, path)
    if found is None or found.loader is None:
        raise OSError(f"cannot load {path}")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def _launcher(spec: dict[str, Any]) -> Any:
    """`worker/engine/launcher.py`, loaded by path."""
    return _load_by_path("bashfleet_launcher", spec["launcher"])


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


def _argv(spec: dict[str, Any]) -> list[str]:
    """`bash -c COMMAND`, or an interactive session's own shell (`-l`: a login shell)."""
    shell = spec.get("shell") or "bash"
    return [shell, *(["-l"] if spec.get("login") else []), "-c", spec["command"]]


def _ctty() -> None:
    """In the child (plain jobs on a PTY): its fd 0 becomes its controlling terminal."""
    import fcntl  # noqa: PLC0415
    import termios  # noqa: PLC0415

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _start_plain(spec: dict[str, Any], out_fd: int, stdio: tuple[int, int, int] | None = None,
                 ctty: bool = False) -> tuple[Any, float]:
    """bash -c COMMAND, its cgroup fds where the command's first line expects them.
    `stdio`: the child's fds 0, 1, 2 (an interactive session's pipe or terminal)."""
    targets = []
    for offset, fd in enumerate(_procs_fds(spec)):
        target = spec["cgroup_fd"] + offset
        os.dup2(fd, target)  # we are single-threaded: fixed numbers are ours to take
        os.close(fd)
        targets.append(target)
    user = spec.get("user") or [None, None, None]
    try:
        stdin, stdout, stderr = stdio or (subprocess.DEVNULL, out_fd, out_fd)
        proc = subprocess.Popen(
            _argv(spec), cwd=spec["cwd"], env=spec["env"],
            stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True,
            close_fds=True, pass_fds=targets, user=user[0], group=user[1], extra_groups=user[2],
            # This process is single-threaded: a preexec_fn is safe here.
            preexec_fn=_ctty if ctty else None,  # noqa: PLW1509
        )
    finally:
        for target in targets:
            os.close(target)
    return proc, _start_time(proc.pid)


def _start_sandboxed(spec: dict[str, Any], out_fd: int,
                     stdio: tuple[int, int, int] | None = None,
                     ctty: bool = False) -> tuple[Any, float]:
    """The job in a runner of a launcher of its own."""
    launcher = _launcher(spec)
    box = spec["sandbox"]
    if ctty:
        box["request"]["ctty"] = True
    if stdio is not None:
        box["request"]["argv"] = _argv(spec)
    client = launcher.LauncherClient(box["argv"], box["env"])
    try:
        fds = _procs_fds(spec)
        try:
            runner = client.runner(box["runner"], fds)
        finally:
            for fd in fds:
                os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            pid = runner.start(box["request"], list(stdio or (null, out_fd, out_fd)))
        finally:
            os.close(null)
    finally:
        client.close()  # the launcher exits; the runner lives on with the job
    ticks = runner.start_ticks
    started = _boot_time() + ticks / os.sysconf("SC_CLK_TCK") if ticks is not None else time.time()
    return launcher.RunnerProcess(runner, pid), started


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


def _relay(spec: dict[str, Any]) -> Any:
    """`worker/engine/relay.py` (an interactive session's loop), loaded by path."""
    return _load_by_path("bashfleet_relay", spec["relay"])


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
    start = _start_sandboxed if spec.get("sandbox") else _start_plain
    if spec.get("stdin", "null") != "null":
        return int(_relay(spec).main(spec, start, _write_status, _remove_groups))
    out_fd = os.open(spec["output_path"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc, started = start(spec, out_fd)
    except OSError as exc:
        sys.stdout.write(json.dumps({"error": f"could not start bash: {exc}"}) + "\n")
        _remove_groups(spec, timeout=0)
        return 1
    finally:
        os.close(out_fd)
    sys.stdout.write(json.dumps({"pid": proc.pid, "pgid": proc.pid, "start_time": started}) + "\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    returncode, capped = _wait(proc, spec)
    with open(spec["output_path"], "a", encoding="utf-8") as handle:
        if capped:
            handle.write(_cap_notice(spec.get("output_cap_mb")))
        handle.write(_completion_line(returncode))
    note = f"stopped: its output passed this host's cap of {spec.get('output_cap_mb')} MiB"
    _write_status(spec["status_path"], returncode, note if capped else None)
    _remove_groups(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

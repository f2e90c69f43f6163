"""Supervisor of one background job: run it, wait for it, record how it ended.

Started detached (own session) by `worker.engine.jobs.start_job` as
`python -I -S job_supervisor.py SPEC_PATH`, it outlives the worker that started it, so a
job's exit status is recorded even when no worker is watching when it ends.

Standard library only, and no package imports: it runs with `-I -S` to start fast
and to be immune to the caller's PYTHON* variables. The spec (JSON, mode 0600) is
read and deleted at once because it holds the job's environment.

Protocol: one JSON line `{"pid": P, "pgid": G, "start_time": T}` on stdout once the
job runs (or `{"error": "..."}`), then stdout is closed. When the job ends:
the status file is written atomically and a completion line (seed 001's text) is
appended to the output file.
"""

import json
import os
import signal
import subprocess
import sys
import time


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


def _write_status(path: str, returncode: int) -> None:
    status = {
        "exit_code": returncode if returncode >= 0 else None,
        "signal": -returncode if returncode < 0 else None,
        "ended_at": time.time(),
        "note": None,
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(status, handle)
    os.replace(tmp, path)


def _wait(proc: subprocess.Popen[bytes], timeout_s: float | None, grace_s: float) -> int:
    """Wait for the job; past its timeout (seed 001: 24 h) end its group politely, then not."""
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            break  # already gone: ESRCH is success
        try:
            return proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def _ignore(signum: int, frame: object) -> None:
    del signum, frame


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
    out_fd = os.open(spec["output_path"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            ["bash", "-c", spec["command"]],
            cwd=spec["cwd"],
            env=spec["env"],
            stdin=subprocess.DEVNULL,
            stdout=out_fd,
            stderr=out_fd,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        sys.stdout.write(json.dumps({"error": f"could not start bash: {exc}"}) + "\n")
        return 1
    finally:
        os.close(out_fd)
    sys.stdout.write(
        json.dumps({"pid": proc.pid, "pgid": proc.pid, "start_time": _start_time(proc.pid)}) + "\n"
    )
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    returncode = _wait(proc, spec.get("timeout_s"), float(spec.get("kill_grace_s") or 0))
    with open(spec["output_path"], "a", encoding="utf-8") as handle:
        handle.write(_completion_line(returncode))
    _write_status(spec["status_path"], returncode)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

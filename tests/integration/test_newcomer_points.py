"""A newcomer's first stumbles, replayed as the newcomer and the agent trajectories hit
them: the engine with real bash, and the CLI and the Python API on real workers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from bashfleet.client import Fleet
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import Policy

from .conftest import WorkerProcess, wait_for
from .engine_helpers import (
    Engine,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    _plain_engine_fixture,  # noqa: F401 - fixture
)

Hosts = tuple[WorkerProcess, WorkerProcess]


def _cli(url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BASHFLEET_REDIS_URL": url}  # the suite's key and state dir
    return subprocess.run([sys.executable, "-m", "bashfleet.client.cli", *args], env=env, text=True,
                          capture_output=True, input=stdin, timeout=60, check=False)


# ------------------------------------------------------------------------- the engine


def test_23_worker_internals_never_reach_a_call(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_MP_FORK_LOG*` (Celery's) and the worker's `OLDPWD` were in every call's env."""
    monkeypatch.setenv("_MP_FORK_LOGFORMAT_", "[%(asctime)s: %(levelname)s] %(message)s")
    monkeypatch.setenv("_MP_FORK_LOGLEVEL_", "30")
    monkeypatch.setenv("OLDPWD", "/the/workers/old/dir")
    monkeypatch.setenv("PWD", "/the/workers/dir")
    result = engine.run('env; echo "pwd=$PWD oldpwd=${OLDPWD-unset}"')
    assert result.exit_code == 0
    assert "_MP_FORK" not in result.stdout and "/the/workers" not in result.stdout
    assert f"pwd={engine.tmp} oldpwd=unset" in result.stdout


def test_23_a_sessions_unset_wins_over_the_hardening(engine: Engine) -> None:
    result = engine.run('echo "${PAGER-unset} ${GIT_PAGER-unset}"', unset_env=("PAGER",))
    assert result.stdout == "unset cat\n"


def test_21_settings_scrubbed_by_name_are_not_redacted_secrets_are(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every `WARNING` of a pytest run and the CA bundle's path came back [REDACTED]."""
    bundle = "/etc/ssl/certs/ca-certificates.crt"
    if not os.path.exists(bundle):
        bundle = "/etc/passwd"  # any file anyone may read
    monkeypatch.setenv("AWS_CA_BUNDLE", bundle)
    monkeypatch.setenv("CELERY_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    result = engine.run(f"echo 'WARNING: x'; echo {bundle}; "
                        "echo key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    assert result.stdout == f"WARNING: x\n{bundle}\nkey=[REDACTED]\n"


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def test_17_the_process_list_shows_what_readme_says(engine: Engine) -> None:
    """docs/agents.md: a foreground call's process shows `bash -c <the command>` exactly. In a
    sandboxed workspace a background job's does too (it is born of the workspace's
    keeper, its limits come in through `BASH_ENV` as a foreground call's do); as a person
    lists the host's processes, it is found at its host pid."""
    foreground = engine.run("tr '\\0' ' ' < /proc/$$/cmdline")
    assert foreground.stdout.strip() == "bash -c tr '\\0' ' ' < /proc/$$/cmdline"
    job = engine.run("sleep 30; echo done", background=True).job  # bash stays (no exec)
    assert job is not None and job.host_pid is not None
    # `job.pid` is the number in its workspace; the host's process list has `host_pid`.
    shown = wait_for(lambda: _cmdline(job.host_pid or 0), 10, "the job's bash")
    assert shown == "bash -c sleep 30; echo done", shown


def test_17_an_unsandboxed_jobs_process_shows_the_limits_line_first(
        plain_engine: Engine) -> None:
    """docs/agents.md: without a sandbox, a background job's process shows the host's limits line
    before the command, where the host sets limits with `ulimit` rather than a cgroup."""
    job = plain_engine.run("sleep 30; echo done", background=True).job
    assert job is not None
    shown = wait_for(lambda: _cmdline(job.pid), 10, "the job's bash")
    assert shown.startswith("bash -c ") and shown.endswith("sleep 30; echo done"), shown
    assert "ulimit " in shown  # the limits line, when a cgroup does not carry them all


# ----------------------------------------------------------------------- the fleet


def test_2_output_and_check_grep_dollar_match_line_ends(
    two_hosts: Hosts, fleet: Fleet, redis_server: RedisServer
) -> None:
    """`bashfleet output J --grep '0$'` on `seq 1 30` printed nothing."""
    job = fleet.run("seq 1 30", host="alpha", mode="background").job
    assert job is not None
    fleet.wait(job.id, timeout=30)
    shown = _cli(redis_server.url, "output", job.id, "--grep", "0$")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "10\n20\n30\n"
    checked = _cli(redis_server.url, "check", job.id, "--grep", "^2.$")
    assert checked.stdout == "".join(f"{n}\n" for n in range(20, 30))
    assert fleet.check(job.id, grep="^3", offset=0).output == "3\n30\n"


def test_7_a_background_jobs_id_alone_on_stdout(
    two_hosts: Hosts, fleet: Fleet, redis_server: RedisServer
) -> None:
    """`X=$(bashfleet run --mode background 'sleep 5')` left X empty."""
    started = _cli(redis_server.url, "run", "--host", "alpha", "--mode", "background",
                   "sleep 5")
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    assert started.stdout == f"{job_id}\n" and job_id.startswith("j")
    assert f"bashfleet kill {job_id}" in started.stderr
    assert fleet.kill(job_id).running is False


def test_6_write_takes_n_after_the_id_and_close_adds_no_newline(
    two_hosts: Hosts, fleet: Fleet, redis_server: RedisServer
) -> None:
    """`bashfleet write J -n abc` was refused; `write J --close` sent a newline first."""
    started = fleet.run("python3 -c 'import sys; print(repr(sys.stdin.read()))'",
                        host="alpha", mode="background", stdin="pipe")
    assert started.job is not None
    job_id = started.job.id
    written = _cli(redis_server.url, "write", job_id, "-n", "abc", "--wait", "0.5")
    assert written.returncode == 0, written.stderr
    closed = _cli(redis_server.url, "write", job_id, "--close")
    assert closed.returncode == 0, closed.stderr
    view = fleet.wait(job_id, timeout=30)
    assert view.exit_code == 0
    assert "'abc'" in fleet.read_output(job_id).text  # no newline was added, before EOF


def test_23_unset_pager_sticks_in_a_session(two_hosts: Hosts, fleet: Fleet) -> None:
    """`unset PAGER` in a session was undone on its next call (PAGER=cat again)."""
    session = f"pg-{uuid.uuid4().hex[:8]}"
    fleet.run("unset PAGER; export GIT_PAGER=less", session=session)
    later = fleet.run('echo "${PAGER-unset} $GIT_PAGER"', session=session)
    assert later.stdout == "unset less\n"


def test_14_a_foreground_calls_host_is_known_while_it_runs(
    two_hosts: Hosts, fleet: Fleet
) -> None:
    """The spinner said "running on any host": `Fleet.call_host` names the host once a
    worker took the call."""
    call_id = f"csp{uuid.uuid4().hex[:8]}"
    kill = Policy(name="cli", on_timeout="kill")
    assert fleet.call_host(call_id) is None
    runner = threading.Thread(target=fleet.run, args=("sleep 2",),
                              kwargs={"call_id": call_id, "policy": kill})
    runner.start()
    try:
        host = wait_for(lambda: fleet.call_host(call_id), 20, "the call's host")
        assert host in {"alpha", "beta"}
    finally:
        runner.join(30)


def _held(lock: Path) -> bool:
    """Whether a read holds a session's reader lock on its host (an flock of it)."""
    import fcntl  # noqa: PLC0415

    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


def test_20_the_first_key_after_attaching_again_is_shown(
    two_hosts: Hosts, fleet: Fleet
) -> None:
    """"mport sys" for "import sys" after attaching again: a terminal that died without
    detaching left its last long-poll read on the host, which took the echo of the first
    key typed at the new one. Forced here: a read left in flight (as a killed `attach`
    leaves it), then a new attach and keys typed one at a time. The new terminal shows
    the current line first, what the abandoned read took of it included."""
    import io  # noqa: PLC0415

    from bashfleet.client import attach  # noqa: PLC0415
    from bashfleet.worker.wire.control import Collect  # noqa: PLC0415
    from bashfleet.worker.wire.models import ByteTail  # noqa: PLC0415

    started = fleet.run("python3 -q", host="alpha", mode="background", stdin="pty")
    assert started.job is not None
    job_id = started.job.id
    try:
        fleet.read(job_id, collect=Collect(wait_s=5, settle_s=0.3))  # the first prompt
        abandoned = threading.Thread(target=fleet.read, args=(job_id,), kwargs={
            "collect": Collect(wait_s=5, settle_s=0, raw=True, truncation=ByteTail(max_bytes=1)),
        }, daemon=True)
        abandoned.start()  # a dead terminal's read, waiting on the host
        alpha = next(worker for worker in two_hosts if worker.host == "alpha")
        lock = Settings(state_dir=alpha.state_dir, host="alpha").jobs_dir / f"{job_id}.lock"
        wait_for(lambda: _held(lock), 20, "the abandoned read to hold the session's reader lock")
        keys_r, keys_w = os.pipe()
        shown = io.BytesIO()
        attached = threading.Thread(target=attach.attach, args=(fleet, job_id), kwargs={
            "stdin_fd": keys_r, "out": shown, "note": lambda _: None})
        attached.start()
        for key in b"import sys\r":
            os.write(keys_w, bytes([key]))
            threading.Event().wait(0.05)  # typed, one key at a time
        wait_for(lambda: b"import sys\r\n>>> " in shown.getvalue(), 20,
                 f"the keys' echo, whole (shown: {shown.getvalue()!r})")
        os.write(keys_w, attach.DETACH_KEY)
        attached.join(20)
        abandoned.join(20)
        os.close(keys_r)
        os.close(keys_w)
    finally:
        fleet.kill(job_id)

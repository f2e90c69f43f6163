"""The sandbox, attacked: what a command may not see, keep, write, reach or exceed.

Each test is one attack (or one guarantee) against real bubblewrap, runners and cgroups
(v1 on the development VM). Positive controls run the same attack unsandboxed, so a
test that passes is known to be able to fail.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from worker.engine import launcher, sandbox
from worker.engine.call import run_call
from worker.engine.jobs import check_job, kill_job, load_record
from worker.settings import Settings
from worker.wire.models import Call, CallResult, CheckResult, Policy

from .engine_helpers import (
    KILL,
    Engine,
    Janitor,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    _plain_engine_fixture,  # noqa: F401 - fixture
    alive,
    engine_with,
    marked_pids,
    wait_until,
)

PROBE = sandbox.probe(Settings(host="probe"))
PROBE_BWRAP = sandbox.bwrap_path(Settings(host="probe")) or "bwrap"
pytestmark = pytest.mark.skipif(
    PROBE.isolation == "none", reason=f"no working bubblewrap here: {PROBE.problem}"
)
needs_cgroups = pytest.mark.skipif(PROBE.cgroup is None, reason="no cgroups for calls here")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs a worker started as root")

SIGNING_KEY = "sk-planted-9c4e1f7a2b"
AUTO = Policy(on_timeout="background", kill_grace_s=0.5)
CAP_SYS_ADMIN = 21


@pytest.fixture(name="strict_engine")
def _strict_engine_fixture(tmp_path: Path, janitor: Janitor) -> Iterator[Engine]:
    with engine_with(tmp_path, janitor, isolation="strict") as engine:
        yield engine


@pytest.fixture(name="keyholder")
def _keyholder_fixture(janitor: Janitor) -> int:
    """A process holding the worker's signing key in its environment, as a worker does."""
    proc = subprocess.Popen(
        ["sleep", "300"], env={"PATH": os.defpath, "BASHFLEET_SIGNING_KEY": SIGNING_KEY},
        start_new_session=True,
    )
    janitor.popen(proc)
    return proc.pid


def _all_environments(pid: int) -> str:
    """A command printing every environment and command line it can read, and `pid`'s."""
    return (
        f"tr '\\0' '\\n' < /proc/{pid}/environ; tr '\\0' '\\n' < /proc/$PPID/environ; "
        "for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f; done"
    )


# ---------------------------------------------------------- what a call cannot see


def test_no_process_of_the_worker_is_visible(engine: Engine) -> None:
    result = engine.run("ps -eo pid=,args=; echo ppid=$PPID; kill -0 " + str(os.getpid()))
    lines = result.stdout.splitlines()
    processes = [line.split(None, 1) for line in lines if not line.startswith("ppid=")]
    # Only the runner (pid 1) and the call itself: bash, ps.
    assert {int(pid) for pid, _ in processes} <= {1, 2, 3, 4}, lines
    assert not any("pytest" in args for _, args in processes)
    assert "ppid=1" in lines
    assert "No such process" in result.stderr


def test_the_worker_environment_and_key_are_unreadable(
    engine: Engine, plain_engine: Engine, keyholder: int
) -> None:
    # Positive control: without the sandbox, a command reads another process's key.
    leaked = plain_engine.run(f"tr '\\0' '\\n' < /proc/{keyholder}/environ")
    assert SIGNING_KEY in leaked.stdout
    result = engine.run(_all_environments(keyholder))
    assert SIGNING_KEY not in result.stdout + result.stderr
    assert "No such file" in result.stderr  # the key holder's /proc entry is not there


def test_the_runner_is_not_readable_either(engine: Engine) -> None:
    # pid 1 is the runner: not dumpable, so its memory, environment and what its fds and
    # root point to are closed (even to root: it has no CAP_SYS_PTRACE in the sandbox).
    result = engine.run(
        "cat /proc/1/environ; readlink -v /proc/1/fd/0 /proc/1/root /proc/1/cwd; "
        "head -c 16 /proc/1/mem; echo done", timeout_s=10
    )
    assert result.stdout == "done\n"
    assert result.stderr.count("Permission denied") >= 3, result.stderr


def test_state_dir_fleet_json_and_secret_files_are_hidden(
    tmp_path: Path, janitor: Janitor, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "deploy.env"
    secret.write_text("DEPLOY_SECRET=file-secret-123\n")
    extra = tmp_path / "other-state"
    (extra / "fleet").mkdir(parents=True)
    (extra / "fleet" / "fleet.json").write_text('{"signing_key": "fleet-key-456"}')
    default = tmp_path / "default-state"
    default.mkdir()
    (default / "fleet.json").write_text('{"redis": "default-pw-789"}')
    monkeypatch.setattr(sandbox, "default_state_dir", lambda: default)
    with engine_with(tmp_path, janitor, secret_files=(str(secret),),
                           sandbox_hidden=(str(extra),)) as engine:
        state = engine.settings.state_dir
        (state / "fleet").mkdir(parents=True)
        (state / "fleet" / "fleet.json").write_text('{"signing_key": "state-key-000"}')
        command = (f"cat {secret} {extra}/fleet/fleet.json {default}/fleet.json "
                   f"{state}/fleet/fleet.json; ls -A {state} {extra} {default}; "
                   f"grep -r secret {tmp_path}")
        result = engine.run(command)
        text = result.stdout + result.stderr
        for value in ("file-secret-123", "fleet-key-456", "default-pw-789", "state-key-000"):
            assert value not in text, text
        # The hidden directories read as empty, the secret file as unreadable.
        listed = [line for line in result.stdout.splitlines() if line]
        assert sorted(listed) == sorted(f"{path}:" for path in (state, extra, default))


def test_the_state_dir_is_no_working_directory(engine: Engine) -> None:
    engine.settings.spill_dir.mkdir(parents=True, exist_ok=True)
    result = engine.run("ls", cwd=str(engine.settings.spill_dir))
    assert result.error is not None and result.error.kind == "bad_cwd"
    assert "not visible inside the sandbox" in result.error.message


def test_the_runner_ignores_what_its_call_sends_it(engine: Engine) -> None:
    result = engine.run("kill -INT 1; kill -TERM 1; kill -KILL 1; sleep 0.2; echo alive")
    assert (result.exit_code, result.stdout) == (0, "alive\n")
    assert engine.run("echo again").stdout == "again\n"


def test_spill_files_of_other_calls_are_hidden(engine: Engine) -> None:
    first = engine.run("echo other-calls-output; exit 3")
    assert first.spill is None or first.spill.stdout_path
    second = engine.run(f"ls -A {engine.settings.state_dir}; cat {engine.settings.spill_dir}/*")
    assert "other-calls-output" not in second.stdout + second.stderr


# ------------------------------------------------------- what a call cannot keep


# A `setsid`, a double fork (the grandchild orphaned) and `nohup ... &`, each writing
# its pid; `started` once all three exist.
ESCAPES = (
    "setsid sleep 301 & echo $! > setsid.pid; "
    "( (sleep 302 & echo $! > double.pid) & ); "
    "nohup sleep 303 >/dev/null 2>&1 & echo $! > nohup.pid; "
    "until [ -s double.pid ]; do sleep 0.01; done; echo started"
)


def _job_end(engine: Engine, job_id: str) -> CheckResult:
    record = load_record(job_id, engine.settings)

    def ended() -> CheckResult | None:
        check = check_job(record, settings=engine.settings)
        return None if check.running else check

    return wait_until(ended, what=f"job {job_id} to end")


def test_escapees_die_when_a_foreground_call_ends(engine: Engine, plain_engine: Engine) -> None:
    # Positive control: unsandboxed, the escapees outlive the call (the janitor ends them).
    plain = plain_engine.run(ESCAPES)
    assert plain.stdout == "started\n"
    assert len(marked_pids(plain.call_id)) == 3
    result = engine.run(ESCAPES)
    assert (result.exit_code, result.stdout) == (0, "started\n")
    assert marked_pids(result.call_id) == []


def test_escapees_die_with_a_timed_out_call(engine: Engine) -> None:
    started: list[int] = []

    def on_spawn(pid: int, pgid: int, marker: str) -> None:
        started.append(pid)
        # bash (which execs its last command, `sleep 300`) and its three escapees.
        wait_until(lambda: len(marked_pids(marker)) >= 4, what="bash and its escapees")

    result = engine.run(ESCAPES + "; sleep 300", timeout_s=0.5, policy=KILL, on_spawn=on_spawn)
    assert result.timed_out and result.signal == 15
    assert {p.command.split()[0] for p in result.processes} >= {"sleep"}
    assert marked_pids(result.call_id) == []
    assert not alive(started[0])


def test_escapees_die_with_their_background_job(engine: Engine) -> None:
    # A job that leaves processes behind loses them when its bash ends...
    ended = engine.run(ESCAPES, background=True)
    assert ended.job is not None
    final = _job_end(engine, ended.job.id)
    assert final.exit_code == 0
    record = load_record(ended.job.id, engine.settings)
    wait_until(lambda: marked_pids(record.marker) == [], what="its escapees to die")
    # ...and a job killed while running loses them too.
    running = engine.run(ESCAPES + "; sleep 300", background=True)
    record = load_record(running.job.id if running.job else "", engine.settings)
    wait_until(lambda: len(marked_pids(record.marker)) >= 4, what="the job's escapees")
    killed = kill_job(record, grace_s=0.5, settings=engine.settings)
    assert (killed.running, killed.signal) == (False, 15)
    assert marked_pids(record.marker) == []


def test_a_killed_runner_ends_its_call_and_leaves_nothing(engine: Engine) -> None:
    outcome: list[CallResult] = []
    call_id = engine.janitor.new_call_id()
    thread = threading.Thread(
        target=lambda: outcome.append(engine.run("setsid sleep 300 & sleep 300",
                                                 call_id=call_id, timeout_s=60)),
    )
    thread.start()
    def leader() -> int | None:
        # The call's bash leads its process group (subshells on their way do not).
        return next((p for p in marked_pids(call_id) if _pgid(p) == p), None)

    runner = psutil.Process(wait_until(leader, what="the call's bash")).ppid()
    os.kill(runner, signal.SIGKILL)
    thread.join(30)
    assert outcome and outcome[0].signal == signal.SIGKILL
    wait_until(lambda: marked_pids(call_id) == [], what="the call's processes to die")
    # The next call gets a fresh runner.
    assert engine.run("echo again").stdout == "again\n"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_a_dead_launcher_is_replaced(engine: Engine) -> None:
    assert engine.run("true").exit_code == 0
    pool = sandbox.pool_for(engine.settings, "process")
    assert pool.client is not None
    os.killpg(pool.client.proc.pid, signal.SIGKILL)  # bwrap and the launcher
    pool.client.proc.wait(10)
    # Two calls at once: one takes the idle runner, the other needs a new launcher.
    results: list[CallResult] = []
    threads = [threading.Thread(target=lambda n=n: results.append(engine.run(f"echo {n}")))
               for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(r.stdout for r in results) == ["0\n", "1\n"]


def test_closing_the_pools_ends_launchers_and_runners(engine: Engine) -> None:
    assert engine.run("true").exit_code == 0
    pool = sandbox.pool_for(engine.settings, "process")
    assert pool.client is not None
    launcher = pool.client.proc.pid
    runners = [slot.runner.pid for slots in pool.idle.values() for slot in slots]
    assert runners
    sandbox.close_all()
    wait_until(lambda: not any(alive(pid) for pid in [launcher, *runners]),
               what="the launcher and runners to exit")


# ------------------------------------------------------ what a call cannot write


def test_strict_writes_only_its_workspace_and_private_tmp(strict_engine: Engine) -> None:
    engine = strict_engine
    outside = engine.tmp.parent / "outside"
    outside.mkdir()
    probe = Path(tempfile.gettempdir()) / f"bashfleet-test-{os.getpid()}-probe"
    result = engine.run(
        f"touch in-cwd && echo cwd; touch /tmp/x && echo tmp; ls /tmp; "
        f"touch {outside}/f || echo no-outside; touch /etc/bashfleet-test || echo no-etc; "
        f"touch $HOME/bashfleet-test || echo no-home; echo x > {probe} && echo probe-written"
    )
    assert result.stdout.splitlines()[:2] == ["cwd", "tmp"]
    assert {"no-outside", "no-etc", "no-home"} <= set(result.stdout.splitlines())
    assert (engine.tmp / "in-cwd").exists()
    assert not (outside / "f").exists()
    # /tmp was private: what it wrote there is not on the host's /tmp.
    assert not probe.exists()


def test_strict_tmp_is_fresh_for_every_call(strict_engine: Engine) -> None:
    assert strict_engine.run("echo left > /tmp/left-by-first").exit_code == 0
    second = strict_engine.run("cat /tmp/left-by-first")
    assert second.exit_code == 1 and "No such file" in second.stderr


def test_strict_configured_workspace(tmp_path: Path, janitor: Janitor) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    with engine_with(tmp_path, janitor, isolation="strict",
                           sandbox_writable=(str(workspace),)) as engine:
        # The cwd is outside the workspace: visible, not writable.
        result = engine.run(f"touch {workspace}/ok && echo ws; touch here || echo ro-cwd")
        assert result.stdout.splitlines() == ["ws", "ro-cwd"]
        assert (workspace / "ok").exists()


@needs_root
def test_root_in_the_sandbox_cannot_unhide_or_mount(engine: Engine) -> None:
    result = engine.run(
        "grep CapBnd /proc/self/status; umount /proc 2>&1 || echo no-umount; "
        "mount -t tmpfs x /mnt 2>&1 || echo no-mount; echo 1 > /proc/sys/kernel/core_pattern"
        " 2>/dev/null || echo no-sysctl; mknod /tmp/disk b 8 0 2>/dev/null || echo no-mknod"
    )
    bounding = int(result.stdout.split()[1], 16)
    assert not bounding & (1 << CAP_SYS_ADMIN)
    assert {"no-umount", "no-mount", "no-sysctl", "no-mknod"} <= set(result.stdout.splitlines())


def test_what_hides_the_state_dir_cannot_be_unmounted(engine: Engine) -> None:
    state = engine.settings.state_dir
    state.mkdir(parents=True, exist_ok=True)
    (state / "kept-secret").write_text("state-secret-321")
    result = engine.run(
        f"umount {state}; umount -l {state}; "
        # A user namespace of its own gives it CAP_SYS_ADMIN there: the mounts it copies
        # are locked together, so unmounting one is refused.
        f"unshare -rm sh -c 'umount {state}; umount -l {state}; cat {state}/kept-secret'"
    )
    assert "state-secret-321" not in result.stdout + result.stderr


ROOTLESS_SCRIPT = """
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launcher
argv = [sys.argv[1], "--dev-bind", "/", "/", "--dev", "/dev", "--tmpfs", sys.argv[2],
        "--remount-ro", sys.argv[2], "--cap-add", "ALL", "--",
        sys.executable, "-I", "-S", launcher.__file__]
client = launcher.LauncherClient(argv, {"PATH": "/usr/bin:/bin"})
runner = client.runner({"network": False})
out = os.open(sys.argv[3], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
null = os.open(os.devnull, os.O_RDONLY)
runner.start({"argv": ["bash", "-c", sys.argv[4]], "cwd": "/", "targets": [0, 1, 2],
              "env": {"PATH": "/usr/bin:/bin"}}, [null, out, out])
print(runner.wait_status(30))
runner.close()
client.close()
"""


@needs_root
@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="no system python3")
def test_a_worker_that_is_not_root_gets_the_same_sandbox(tmp_path: Path) -> None:
    # A worker that is not root: bwrap makes a user namespace, the launcher gets its
    # capabilities in it, the calls none (bwrap hands them out as ambient ones).
    # The launcher alone (standard library) under the system Python, as `nobody`.
    folder = Path(tempfile.mkdtemp(prefix="bashfleet-rootless-"))
    try:
        shutil.copy(launcher.__file__ or "", folder / "launcher.py")
        (folder / "run.py").write_text(ROOTLESS_SCRIPT)
        hidden = folder / "hidden"
        hidden.mkdir()
        (hidden / "secret").write_text("rootless-secret-654")
        folder.chmod(0o755)
        out = folder / "out"
        out.touch()
        os.chown(out, pwd.getpwnam("nobody").pw_uid, -1)
        command = (
            f"id -u; grep CapEff /proc/self/status; ps -e | wc -l; ls -A {hidden}; "
            f"umount {hidden}; unshare -rm sh -c 'umount {hidden}; cat {hidden}/secret'"
        )
        done = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
             "/usr/bin/python3", "-I", str(folder / "run.py"), PROBE_BWRAP, str(hidden),
             str(out), command],
            capture_output=True, text=True, timeout=60, check=False, cwd="/",
        )
        assert done.returncode == 0, done.stderr
        text = out.read_text()
        lines = text.splitlines()
        assert lines[0] == str(pwd.getpwnam("nobody").pw_uid)
        assert lines[1].split() == ["CapEff:", "0000000000000000"]
        assert int(lines[2]) <= 5  # the runner, bash, ps, wc
        assert "rootless-secret-654" not in text
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------ what a call cannot reach


@pytest.fixture(name="listener")
def _listener_fixture() -> Iterator[int]:
    """A TCP port on the host's loopback that accepts connections (the backlog does)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def _connect(port: int) -> str:
    return f"(exec 3<>/dev/tcp/127.0.0.1/{port}) && echo connected || echo refused"


def test_strict_has_no_network(engine: Engine, strict_engine: Engine, listener: int) -> None:
    assert engine.run(_connect(listener)).stdout == "connected\n"  # positive control
    result = strict_engine.run(_connect(listener) + "; ip -o link 2>/dev/null | wc -l")
    assert result.stdout.splitlines()[0] == "refused"


def test_network_is_granted_only_where_the_host_allows_it(
    tmp_path: Path, janitor: Janitor, strict_engine: Engine, listener: int
) -> None:
    refused = strict_engine.run("true", network=True)
    assert refused.error is not None and refused.error.kind == "invalid"
    # A process call may cut its own network.
    cut = strict_engine.run(_connect(listener), isolation="strict", network=False)
    assert cut.stdout == "refused\n"
    (tmp_path / "net").mkdir()
    with engine_with(tmp_path / "net", janitor, isolation="strict", sandbox_network=True) as engine:
        assert engine.run(_connect(listener)).stdout == "connected\n"
        assert engine.run(_connect(listener), network=False).stdout == "refused\n"


def test_a_process_call_can_cut_its_network(engine: Engine, listener: int) -> None:
    assert engine.run(_connect(listener), network=False).stdout == "refused\n"


# ------------------------------------------------------------ isolation decisions


def test_a_call_may_ask_for_stronger_isolation_never_weaker(
    engine: Engine, strict_engine: Engine
) -> None:
    stronger = engine.run("touch /etc/bashfleet-test || echo read-only", isolation="strict")
    assert stronger.stdout == "read-only\n"
    weaker = strict_engine.run("echo ran", isolation="process")
    assert weaker.error is not None and weaker.error.kind == "invalid"
    assert "never weaker" in weaker.error.message
    assert weaker.stdout == ""
    none = engine.run("echo ran", isolation="none")
    assert none.error is not None and none.error.kind == "invalid"


def test_a_host_without_bubblewrap_says_so_and_runs_unsandboxed(
    tmp_path: Path, janitor: Janitor
) -> None:
    with engine_with(tmp_path, janitor, bwrap="/nonexistent/bwrap") as engine:
        found = sandbox.probe(engine.settings)
        assert found.isolation == "none" and found.bwrap is None
        assert found.problem is not None and "not installed" in found.problem
        errors, warnings = sandbox.startup_problems(engine.settings)
        assert errors == [] and any("WITHOUT a sandbox" in w for w in warnings)
        # `auto`: the call runs, unsandboxed (it sees the host's processes).
        result = engine.run(f"kill -0 {os.getpid()} && echo visible")
        assert result.stdout == "visible\n"
        asked = engine.run("true", isolation="process")
        assert asked.error is not None and asked.error.kind == "unavailable"
    strict = Settings(state_dir=tmp_path / "s2", host="t", bwrap="/nonexistent/bwrap",
                      isolation="process")
    errors, _ = sandbox.startup_problems(strict)
    assert errors and "not installed" in errors[0]
    refused = run_call(Call(call_id="nobwrap-1", command="true", cwd=str(tmp_path)),
                       settings=strict)
    assert refused.error is not None and refused.error.kind == "unavailable"


def test_probe_describes_this_host() -> None:
    assert PROBE.isolation == "process"
    assert PROBE.bwrap is not None and PROBE.bwrap[0].isdigit()
    assert PROBE.problem is None


# -------------------------------------------------------------- caps and users


def test_output_cap_stops_a_flooding_call(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, limit_output_mb=2) as engine:
        result = engine.run("yes flood")
        assert result.limit_hit == "output" and result.signal == 15
        assert "cap of 2 MiB; the call was stopped" in result.stderr
        assert "flood\nflood\n" in result.stdout


def _ended(engine: Engine, job_id: str) -> tuple[str, str | None, int | None]:
    """(the end of the job's output, its note, its signal) once it ended."""
    check = _job_end(engine, job_id)
    full = Path(load_record(job_id, engine.settings).output_path).read_text()
    return full[-300:], check.note, check.signal


@pytest.mark.parametrize("how", ["background", "auto-background"])
def test_output_cap_stops_a_flooding_job_with_a_notice(
    tmp_path: Path, janitor: Janitor, how: str
) -> None:
    with engine_with(tmp_path, janitor, limit_output_mb=2) as engine:
        if how == "background":
            result = engine.run("yes flood", background=True)
        else:
            result = engine.run("sleep 0.3; yes flood", timeout_s=0.1, policy=AUTO)
        assert result.job is not None
        tail, note, sig = _ended(engine, result.job.id)
        notice = "[bashfleet: the output passed this host's cap of 2 MiB; the job was stopped]"
        assert notice in tail
        assert tail.endswith("[background process failed: signal: 15 (SIGTERM)]\n")
        assert note is not None and "cap of 2 MiB" in note and sig == 15
        # Stopped near the cap (the runner watches it): 2 MiB, plus what `yes` writes in
        # the runner's last pause and the grace.
        assert os.stat(load_record(result.job.id, engine.settings).output_path).st_size < 200e6


@needs_cgroups
def test_cgroup_caps_memory(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, limit_memory_mb=64) as engine:
        result = engine.run("grep -c bashfleet /proc/self/cgroup; "
                            "python3 -c 'x = bytearray(256 * 1024 * 1024)'")
        assert result.limit_hit == "memory", result
        assert result.signal == signal.SIGKILL or result.exit_code == 137
        assert int(result.stdout.split()[0]) >= 1  # it ran in a bashfleet cgroup
        fine = engine.run("python3 -c 'x = bytearray(8 * 1024 * 1024)'; echo ok")
        assert (fine.stdout, fine.limit_hit) == ("ok\n", None)


@needs_cgroups
@pytest.mark.parametrize("isolation", ["process", "none"])
def test_cgroup_caps_processes(tmp_path: Path, janitor: Janitor, isolation: str) -> None:
    with engine_with(tmp_path, janitor, limit_procs=16, isolation=isolation) as engine:
        result = engine.run("for i in $(seq 40); do sleep 2 & done; wait", timeout_s=60)
        assert result.limit_hit == "processes", result
        assert "fork" in result.stderr


BUSY_SECOND = (
    "python3 -c 'import os, time\nstart = time.time()\nwhile time.time() - start < 1: pass\n"
    "print(round(os.times().user + os.times().system, 2))'"
)


@needs_cgroups
def test_cgroup_caps_cpu_bandwidth(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, limit_cpus=0.2) as engine:
        capped = float(engine.run(BUSY_SECOND).stdout)
    with engine_with(tmp_path / "free", janitor) as engine:
        free = float(engine.run(BUSY_SECOND).stdout)
    # A second of busy loop gets at most a fifth of a CPU second under the cap (about as
    # much as it gets when the machine is busy, so the uncapped one only has to do better).
    assert capped <= 0.3 and free > capped, (capped, free)


@pytest.fixture(name="shared_dir")
def _shared_dir_fixture() -> Iterator[Path]:
    """A directory another user can enter and write (pytest's tmp_path is 0700 root)."""
    folder = Path(tempfile.mkdtemp(prefix="bashfleet-runas-"))
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@needs_root
@pytest.mark.parametrize("isolation", ["process", "none"])
def test_run_as_runs_calls_as_that_user(
    shared_dir: Path, janitor: Janitor, isolation: str
) -> None:
    nobody = pwd.getpwnam("nobody")
    settings = Settings(state_dir=shared_dir / "state", host="t", run_as="nobody",
                        isolation=isolation)
    work = shared_dir / "work"
    work.mkdir(mode=0o777)
    work.chmod(0o777)
    engine = Engine(settings, janitor, work)
    try:
        result = engine.run("id -u; id -g; echo $USER; touch mine; cd /; export LEFT=1",
                            capture_state=True)
        assert result.stdout.splitlines() == [str(nobody.pw_uid), str(nobody.pw_gid), "nobody"]
        assert (work / "mine").stat().st_uid == nobody.pw_uid
        assert (result.cwd_after, result.env_changes.get("LEFT")) == ("/", "1")
        job = engine.run("id -u > job-uid", background=True)
        assert job.job is not None
        _ended(engine, job.job.id)
        assert (work / "job-uid").read_text() == f"{nobody.pw_uid}\n"
    finally:
        sandbox.close_all()


def test_run_as_an_unknown_user_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="no such user"):
        Settings(run_as="no-such-user-bashfleet")


# ---------------------------------------------------------- what still works inside


def test_session_state_is_captured_inside(engine: Engine) -> None:
    result = engine.run("cd /; export FROM_SANDBOX=yes; unset HOME", capture_state=True)
    assert result.cwd_after == "/"
    assert result.env_changes == {"FROM_SANDBOX": "yes"}
    assert "HOME" in result.env_removed
    assert list(engine.settings.spill_dir.glob("*.state")) == []


def test_a_background_job_runs_in_its_own_sandbox(engine: Engine) -> None:
    result = engine.run("ps -eo pid= | wc -l; echo $$", background=True)
    assert result.job is not None
    tail, _, _ = _ended(engine, result.job.id)
    count, pid = tail.split("\n\n\n")[0].split()
    assert int(pid) == 2 and int(count) <= 4

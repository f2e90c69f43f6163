"""The workspace sandbox, attacked: what a command may not see, keep, write, reach or
exceed, and what the calls of one workspace share.

Each test is one attack (or one guarantee) against real bubblewrap, keepers and cgroups
(v1 on the development VM). The `20_N` tests replay attacks that once worked, as the
attacker ran them. Positive controls run the same attack where it must work (the
workspace's own files, a call's own processes), so a test that passes is known to be
able to fail.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from privilege import require_root

from bashfleet import worker
from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.engine.call import run_call
from bashfleet.worker.engine.isolate import launcher
from bashfleet.worker.engine.jobs.jobs import check_job, load_record
from bashfleet.worker.engine.workspaces import throwaway_pool
from bashfleet.worker.engine.workspaces.throwaway_pool import throwaways
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import Call, Policy, WorkspaceSpec

from .engine_helpers import (
    Engine,
    Janitor,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    _plain_engine_fixture,  # noqa: F401 - fixture
    alive,
    engine_with,
    run_user_ids,
    wait_until,
)
from .sandbox_helpers import (
    PROBE,
    Workspaces,
    _job_end,
    _spaces_fixture,  # noqa: F401 - fixture
    needs_bubblewrap,
)

pytestmark = needs_bubblewrap

PROBE_BWRAP = sandbox.bwrap_path(Settings(host="probe")) or "bwrap"

SIGNING_KEY = "sk-planted-9c4e1f7a2b"
LEVELS = ["process", "strict"]


@pytest.fixture(name="strict_engine")
def _strict_engine_fixture(tmp_path: Path, janitor: Janitor) -> Iterator[Engine]:
    with engine_with(tmp_path, janitor, isolation="strict") as engine:
        yield engine


@pytest.fixture(name="level_engine", params=LEVELS)
def _level_engine_fixture(tmp_path: Path, janitor: Janitor,
                          request: pytest.FixtureRequest) -> Iterator[Engine]:
    """The engine at each sandboxed level (every attack runs against both)."""
    with engine_with(tmp_path, janitor, isolation=request.param) as engine:
        yield engine


def _encodings(secret: str) -> list[str]:
    """The forms of a secret a command could print it in (as the attacks did)."""
    import base64  # noqa: PLC0415
    import codecs  # noqa: PLC0415

    return [secret, secret[::-1], ".".join(secret), base64.b64encode(secret.encode()).decode(),
            secret.encode().hex(), codecs.encode(secret, "rot13")]


# -------------------------------------------- attacks that once worked, replayed


@pytest.mark.parametrize("level", LEVELS)
def test_20_1_secret_files_are_unreachable_whatever_the_encoding(
    tmp_path: Path, janitor: Janitor, level: str
) -> None:
    # The attack: `bashfleet run "sed 's/./&./g' /path/to/signing.key"` printed the key
    # (redaction knows a few encodings; `sed` or rot13 got any secret out). Every file a
    # setting names is hidden (the *_FILE settings too), wherever it is.
    key_file, url_file = tmp_path / "signing.key", tmp_path / "redis.url"
    key_file.write_text(SIGNING_KEY)
    url_file.write_text("redis://:hunter2-redis-pass@127.0.0.1:6390/0")
    work = tmp_path / "work"
    work.mkdir()
    in_workspace = work / "admin.key"
    in_workspace.write_text("admin-key-planted-31a9")
    os.chmod(in_workspace, 0o644)
    with engine_with(tmp_path, janitor, isolation=level, signing_key_file=key_file,
                     redis_url_file=url_file, secret_files=(str(in_workspace),)) as engine:
        files = [key_file, url_file, in_workspace]
        command = "; ".join(
            f"sed 's/./&./g' {f}; base64 {f}; rev {f}; xxd -p {f}; tr a-z n-za-m < {f}"
            for f in files) + "; env"
        result = engine.run(command)
        printed = result.stdout + result.stderr
        for secret in (SIGNING_KEY, "hunter2-redis-pass", "admin-key-planted-31a9"):
            for form in _encodings(secret):
                assert form not in printed, form
        assert engine.run("echo ok > fine; cat fine").stdout == "ok\n"  # the workspace works


@pytest.mark.parametrize("level", LEVELS)
def test_20_3_no_call_can_change_the_installed_package_or_the_host(
    tmp_path: Path, janitor: Janitor, level: str
) -> None:
    # The attack: a call (root, host writable) rewrote worker/engine/isolate/job_supervisor.py;
    # the next job's supervisor ran that code outside any sandbox.
    target = Path(worker.__file__).parent / "engine" / "isolate" / "job_supervisor.py"
    before = target.read_bytes()
    with engine_with(tmp_path, janitor, isolation=level) as engine:
        multi = sandbox.host_ids(engine.settings) is not None
        result = engine.run(
            f"echo 'import os; os.system(\"id\")' >> {target}; echo rc=$?; "
            f"touch {target.parent}/planted.py; echo rc=$?; "
            "touch /etc/bashfleet-planted /usr/bin/planted /var/planted; echo rc=$?; "
            "cat /proc/self/uid_map")
        lines = result.stdout.splitlines()
        assert lines[:2] == ["rc=1", "rc=1"], result.stderr
        # Read-only, or not even in the view (a checkout under /tmp: a workspace's /tmp is
        # its own).
        assert any(reason in result.stderr for reason in (
            "Read-only file system", "Permission denied", "No such file or directory"))
        # The host's system directories are read-only in every workspace (with ids of its
        # own too: the host's files keep the host's owners; apt-get is an image's).
        assert lines[2] == "rc=1"
        inside, outside, _ = lines[3].split()
        assert outside != "0" and (inside == "0") == multi
        # A throwaway workspace each: nothing of one call's layer is in the next.
        if multi:
            assert engine.run("touch /planted && echo made").stdout == "made\n"
        assert engine.run("test -e /planted || echo gone").stdout == "gone\n"
    assert target.read_bytes() == before
    assert not (target.parent / "planted.py").exists()
    for planted in ("/etc/bashfleet-planted", "/usr/bin/planted", "/var/planted"):
        assert not Path(planted).exists(), planted


@pytest.mark.parametrize("level", LEVELS)
def test_20_4_calls_have_no_capability_and_no_raw_socket(
    tmp_path: Path, janitor: Janitor, level: str
) -> None:
    # The attack: a call kept CAP_NET_RAW and read the Redis password off `lo` with a
    # raw packet socket. Now: no capability on the host, no_new_privs, never root there
    # (with ids of its own, a call is root of its user namespace: capabilities there,
    # which reach nothing of the host's: not its network's raw sockets).
    with engine_with(tmp_path, janitor, isolation=level) as engine:
        multi = sandbox.host_ids(engine.settings) is not None
        result = engine.run(
            "grep -E '^(Cap|NoNewPrivs)' /proc/self/status; cut -c1-30 /proc/self/uid_map; "
            "python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)' "
            "2>&1 | tail -1; python3 -c 'import socket; "
            "socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)' 2>&1 | tail -1")
        lines = result.stdout.splitlines()
        caps = dict(line.split(":\t") for line in lines[:6])
        if not multi:
            for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
                assert caps[name] == "0000000000000000", (name, caps)
        assert caps["NoNewPrivs"] == "1"
        inside, outside, _ = lines[6].split()
        assert outside != "0" and (inside == "0") == multi
        assert "PermissionError" in lines[7] and "PermissionError" in lines[8]


def test_20_6_another_fleets_state_output_and_sessions_are_out_of_reach(
    tmp_path: Path, janitor: Janitor
) -> None:
    # The attack: two workers on one machine; owner A's command read owner B's kept
    # output on the other worker and wrote into B's interactive session through its
    # supervisor's socket (paths listed in /proc/net/unix).
    (tmp_path / "b").mkdir()
    with engine_with(tmp_path / "b", janitor) as fleet_b, engine_with(tmp_path, janitor) as fleet_a:
        ws_b = workspaces.create(WorkspaceSpec(owner="B"), fleet_b.settings)
        try:
            kept = fleet_b.run("seq 1 300000", workspace=ws_b.id, cwd=None, owner="B",
                               policy=Policy(name="pipe", spill_min_bytes=0))
            assert kept.spill is not None and kept.spill.stdout_path
            session = fleet_b.run("cat", workspace=ws_b.id, cwd=None, owner="B", stdin="pty",
                                  timeout_s=1)
            assert session.job is not None
            record = load_record(session.job.id, fleet_b.settings)
            sockets = [ws_b.socket_path, record.socket_path]
            probe = "; ".join([
                f"cat {kept.spill.stdout_path} | tail -1",
                f"ls {fleet_b.settings.state_dir} {Path(ws_b.out_dir).parent}",
                f"ls {ws_b.path}",
                "grep -c bashfleet /proc/net/unix",
                *[f"python3 -c 'import socket; s = socket.socket(socket.AF_UNIX, "
                  f"socket.SOCK_SEQPACKET); s.connect(\"{p}\"); print(\"connected\")'"
                  for p in sockets],
            ])
            attack = fleet_a.run(probe, owner="A")
            assert "300000" not in attack.stdout
            assert "connected" not in attack.stdout
            assert attack.stdout.count("No such file") + attack.stderr.count("No such file") >= 4
            # Positive control: B's own next call reads its kept output.
            own = fleet_b.run(f"tail -1 {kept.spill.stdout_path}", workspace=ws_b.id,
                              cwd=None, owner="B")
            assert own.stdout == "300000\n"
        finally:
            workspaces.delete(ws_b.id, fleet_b.settings)


def test_the_keeper_refuses_a_call_with_a_nul_byte_and_serves_on(
    engine: Engine, spaces: Workspaces,
) -> None:
    """A NUL in a call's cwd, command or environment (the worker's models refuse one
    first) is refused by the keeper itself, by whichever way it would start the call:
    never split into other fields, and the keeper serves the next call."""
    record = spaces.new()
    assert record.socket_path is not None
    null = os.open(os.devnull, os.O_RDWR)
    base: dict[str, object] = {"argv": ["bash", "-c", "true"], "env": {"PATH": "/usr/bin:/bin"},
                               "cwd": "/", "targets": [0, 1, 2]}
    try:
        for change in ({"argv": ["bash", "-c", "true\0PATH=/x"]}, {"cwd": "/\0-1"},
                       {"env": {"PATH": "/usr/bin\0X=1"}}, {"env": {"A\0B": "1"}}):
            conn = launcher.KeeperConnection.connect(record.socket_path)
            try:
                with pytest.raises(launcher.SandboxError) as refused:
                    conn.start(base | change, [null] * 3)  # type: ignore[arg-type]
                assert refused.value.errno == errno.EINVAL, refused.value
            finally:
                conn.close()
    finally:
        os.close(null)
    assert spaces.run(record, "echo served").stdout == "served\n"


def test_the_keeper_answers_its_worker_only(engine: Engine, spaces: Workspaces) -> None:
    record = spaces.new()
    assert record.socket_path is not None
    conn = launcher.KeeperConnection.connect(record.socket_path)  # the worker: served
    # Its pid in the workspace: 1, or the keeper's beside its holder (which is pid 1).
    assert conn.ping() >= 1
    conn.close()
    require_root("another user's connection: a worker that is not root runs calls as "
                 "itself, and its socket is out of every call's view")
    ids = run_user_ids()
    assert ids is not None  # a root worker runs calls as its run user
    # Another user that reached the socket (it cannot: the state directory is 0700, and
    # hidden from every workspace): only the keeper's own check is left to refuse it.
    os.chmod(record.socket_path, 0o666)  # noqa: S103
    read_end, write_end = os.pipe()
    held = os.open(record.socket_path, os.O_PATH)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports and exits
        answer = b"error"
        try:
            os.setgid(ids[1])
            os.setuid(ids[0])
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
                sock.settimeout(10)
                sock.connect(f"/proc/self/fd/{held}")
                sock.send(b"?{}")
                answer = b"closed:" + sock.recv(100)
        except OSError as exc:
            answer = f"error: {exc}".encode()
        finally:
            os.write(write_end, answer)
            os._exit(0)
    os.close(write_end)
    os.close(held)
    os.waitpid(child, 0)
    with os.fdopen(read_end, "rb") as reader:
        got = reader.read()
    # Connected (the socket let it), then dropped without an answer: closed, reset (the
    # keeper closed with the request unread), or a broken pipe (closed before the send).
    assert got == b"closed:" or got.startswith((b"error: [Errno 104]", b"error: [Errno 32]")), got


# ---------------------------------------------------------- what a call cannot see


def test_no_process_of_the_worker_or_of_another_workspace_is_visible(
    engine: Engine, spaces: Workspaces
) -> None:
    one, two = spaces.new(), spaces.new()
    started = spaces.run(one, "sleep 300 & echo $!")
    pid_in_one = int(started.stdout)
    in_two = spaces.run(two, "ps -eo pid=,args=")
    assert "sleep 300" not in in_two.stdout
    assert len(in_two.stdout.splitlines()) <= 3  # the keeper, bash, ps
    in_one = spaces.run(one, f"ps -o args= -p {pid_in_one}")
    assert in_one.stdout.strip() == "sleep 300"
    assert str(os.getpid()) not in spaces.run(one, "ls /proc").stdout.split()


def test_the_worker_environment_is_unreadable(engine: Engine, janitor: Janitor) -> None:
    holder = subprocess.Popen(["sleep", "300"], start_new_session=True,
                              env={"PATH": os.defpath, "BASHFLEET_SIGNING_KEY": SIGNING_KEY})
    janitor.popen(holder)
    result = engine.run(f"cat /proc/{holder.pid}/environ; cat /proc/1/environ; "
                        "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done")
    assert SIGNING_KEY not in result.stdout + result.stderr


def test_state_directories_are_hidden(engine: Engine) -> None:
    state = engine.settings.state_dir
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    (state / "fleet.json").write_text('{"key": "planted"}')
    result = engine.run(f"ls -A {state}; cat {state}/fleet.json; ls -A "
                        f"{engine.settings.workspace_root_dir()}")
    assert "planted" not in result.stdout
    assert "fleet.json" not in result.stdout


# ------------------------------------------------------- what a workspace's calls share


def test_a_server_left_running_answers_the_next_call(engine: Engine,
                                                     spaces: Workspaces) -> None:
    # Real agent trajectories: `(python3 -m http.server &)` then `curl` gave 000.
    record = spaces.new()
    port = _free_port()
    started = spaces.run(record, f"(python3 -m http.server {port} >/dev/null 2>&1 &); "
                                 f"for i in $(seq 100); do curl -s -o /dev/null "
                                 f"localhost:{port} && break; sleep 0.05; done; echo up")
    assert started.stdout == "up\n" and started.duration_s < 20
    answer = spaces.run(record, f"curl -s -o /dev/null -w '%{{http_code}}' localhost:{port}")
    assert answer.stdout == "200"
    nohup = spaces.run(record, "nohup sleep 300 >/dev/null 2>&1 & echo $!")
    pid = nohup.stdout.strip()
    # The next call may start before the process left behind has exec'd sleep (it is
    # bash, then nohup, on its way): it waits for the name, at most 5 s, then looks.
    found = spaces.run(record, f"for i in $(seq 100); do [ \"$(cat /proc/{pid}/comm)\" = sleep ] "
                               "&& break; sleep 0.05; done; pgrep -x sleep")
    assert found.stdout.strip() == pid


def test_kill_minus_pgid_from_the_next_call_ends_a_job(engine: Engine,
                                                      spaces: Workspaces) -> None:
    # The modes dialect's `<reminder>To stop: kill -9 -PGID</reminder>`, run as the next call.
    record = spaces.new()
    job = spaces.run(record, "sleep 300", background=True)
    assert job.job is not None and job.job.host_pid is not None
    assert job.job.pgid == job.job.pid != job.job.host_pid
    killed = spaces.run(record, f"kill -9 -{job.job.pgid}; echo rc=$?")
    assert killed.stdout == "rc=0\n"
    ended = _job_end(engine, job.job.id)
    assert ended.signal == signal.SIGKILL
    output = spaces.run(record, f"cat {job.job.output_path}")  # its <output_file> too
    assert "[background process failed: signal: 9 (SIGKILL)]" in output.stdout


def test_tmp_and_home_are_the_workspaces_own(engine: Engine, spaces: Workspaces) -> None:
    one, two = spaces.new(), spaces.new()
    spaces.run(one, "echo one > /tmp/note; echo home > ~/note; echo shm > /dev/shm/note")
    assert spaces.run(one, "cat /tmp/note ~/note /dev/shm/note").stdout == "one\nhome\nshm\n"
    seen = spaces.run(two, "cat /tmp/note ~/note /dev/shm/note 2>&1 | grep -c 'No such'")
    assert seen.stdout == "3\n"
    assert not Path("/tmp/note").exists() or Path("/tmp/note").read_text() != "one\n"


def test_a_throwaway_call_leaves_nothing_running_nor_anything_for_the_next(
    engine: Engine,
) -> None:
    # A duration of this test's own: other modules' calls run `sleep 300` meanwhile.
    nap = f"300.{time.monotonic_ns() % 10**6:06d}"
    first = run_call(Call(call_id="t-left-1", command=f"sleep {nap} & echo $! > mark; "
                          "echo secret > /tmp/left; echo home > ~/left; echo started"),
                     settings=engine.settings)
    assert first.error is None and first.stdout == "started\n"
    for _ in range(3):  # recycled or fresh: never the last call's files
        later = run_call(Call(call_id=f"t-left-{time.monotonic_ns()}",
                              command="ls -A; cat /tmp/left ~/left 2>&1; pgrep -x sleep; true"),
                         settings=engine.settings)
        assert "mark" not in later.stdout and "secret" not in later.stdout
        assert "home" not in later.stdout.replace("No such", "")
    wait_until(lambda: not [p for p in psutil.process_iter(["cmdline"])
                            if p.info["cmdline"] == ["sleep", nap] and alive(p.pid)],
               what="the throwaway's sleep to end")


@pytest.mark.parametrize("left", ["ipc", "shm"])
def test_a_throwaway_calls_ipc_objects_and_shm_files_never_reach_the_next_call(
    engine: Engine, left: str,
) -> None:
    """System V IPC objects, or a /dev/shm file, a throwaway call leaves make its
    workspace unfit for another call (its keeper says so after the call's status went
    out): that workspace is not given back, and the next calls see none of them."""
    def ready() -> list[str]:
        return [record.id for (state, _), records in throwaways.ready.items()
                if state == engine.settings.state_dir for record in records]

    count = "ipcs -m -q -s | grep -c '^0x'; ls -A /dev/shm"
    make = ("ipcmk -M 4096 && ipcmk -Q && ipcmk -S 1" if left == "ipc"
            else "echo x > /dev/shm/left")
    assert engine.run("true", cwd=None).exit_code == 0
    wait_until(lambda: bool(ready()), what="a throwaway given back")
    reused = ready()[-1]  # the next call takes the last given back
    made = engine.run(f"{{ {make}; }} >/dev/null && {count}", cwd=None)
    # They were made, in its namespaces.
    assert made.stdout == ("3\n" if left == "ipc" else "0\nleft\n"), made
    assert reused not in ready()
    for _ in range(3):
        later = engine.run(f"{count}; echo looked", cwd=None)
        assert later.stdout == "0\nlooked\n", later


def test_a_throwaway_reused_by_its_stamps_never_shows_a_call_what_the_last_one_made(
    engine: Engine,
) -> None:
    # After a call, a throwaway's directories are checked by the stamps of the last full
    # look while those hold (`untouched`): here they do, and the next call writes its
    # /tmp, HOME and, with ids of its own (a root worker's: only then is its root its
    # own to write), its root layer, deep in a directory it makes and at the top. (No
    # cwd: a call's workspace at a path of its own is made for it, never pooled.)
    layered = sandbox.host_ids(engine.settings) is not None
    watched = ("/tmp", "/home", *(["/layer/upper"] if layered else []))

    def ready() -> list[str]:
        return [record.id for (state, _), records in throwaways.ready.items()
                if state == engine.settings.state_dir for record in records]

    def next_one_trusted() -> bool:
        assert engine.run("true", cwd=None).exit_code == 0
        pool = ready()  # a call takes the last given back
        kept = throwaway_pool.looks.kept(pool[-1]) if pool else []
        return all(any(root.endswith(end) for root in kept) for end in watched)

    wait_until(next_one_trusted, what="a throwaway whose stamps are kept")
    reused = ready()[-1]
    plant = ("mkdir -p /deep/er && echo secret > /deep/er/left && echo top > /top-left && "
             if layered else "")
    made = engine.run(f"{plant}mkdir /tmp/d ~/d && echo made", cwd=None)
    assert made.stdout == "made\n", made.stderr
    assert reused not in ready()  # found changed: deleted, not given back
    for _ in range(3):
        later = engine.run("for f in /deep/er/left /deep /top-left; do "
                           "test -e $f && echo found $f; done; ls -A /tmp ~; echo looked",
                           cwd=None)
        lines = later.stdout.splitlines()
        assert "d" not in lines and not any(line.startswith("found") for line in lines)
        assert lines[-1] == "looked", later.stdout


def test_deleting_a_workspace_ends_its_processes_jobs_and_files(
    engine: Engine, spaces: Workspaces
) -> None:
    record = spaces.new()
    job = spaces.run(record, "sleep 300", background=True)
    left = spaces.run(record, "sleep 301 & echo $!; touch here")
    assert job.job is not None and job.job.host_pid is not None
    host_job = job.job.host_pid
    assert workspaces.delete(record.id, engine.settings)
    assert not alive(host_job) and record.keeper_pid is not None
    assert not alive(record.keeper_pid)
    assert not Path(record.path).exists()
    assert not workspaces.state_path(engine.settings, record.id).exists()
    ended = check_job(load_record(job.job.id, engine.settings), settings=engine.settings)
    assert not ended.running and ended.signal == signal.SIGKILL
    assert ended.note is not None and "workspace" in ended.note
    assert left.exit_code == 0


def test_an_unused_workspace_is_reaped_when_its_ttl_passes(engine: Engine,
                                                          spaces: Workspaces) -> None:
    record = spaces.new(ttl_s=1.0)
    spaces.run(record, "sleep 300 &")
    used = workspaces.last_used(record, engine.settings)
    assert used is not None
    assert workspaces.reap(engine.settings, now=used + 0.5) == []
    reaped = workspaces.reap(engine.settings, now=used + 2.0)
    assert [r.id for r in reaped] == [record.id]
    assert record.keeper_pid is not None and not alive(record.keeper_pid)
    assert not Path(record.path).exists()


def test_a_workspace_at_an_allowed_path_shows_its_directory_and_mounts(
    tmp_path: Path, janitor: Janitor
) -> None:
    src = tmp_path / "src"
    (src / "app").mkdir(parents=True)
    (src / "other").mkdir()
    (src / "other" / "secret.txt").write_text("other workspace")
    ids = run_user_ids()
    if ids is not None:
        os.chown(src / "app", *ids)
    with engine_with(tmp_path, janitor, workspace_allow=(str(src),)) as engine:
        record = workspaces.create(WorkspaceSpec(path=str(src / "app"),
                                                 mounts={"/logs": "logs"}), engine.settings)
        try:
            result = engine.run("pwd; echo built > out; echo log > /logs/agent.txt; "
                                f"cat {src}/other/secret.txt 2>&1 | grep -c 'No such'",
                                workspace=record.id, cwd=None)
            assert result.stdout == f"{src / 'app'}\nbuilt\n".replace("built\n", "") + "1\n"
            assert (src / "app" / "out").read_text() == "built\n"
            assert (src / "app" / "logs" / "agent.txt").read_text() == "log\n"
        finally:
            workspaces.delete(record.id, engine.settings)
        assert (src / "app" / "out").exists()  # an existing directory is not removed
        outside = workspaces.create
        with pytest.raises(workspaces.WorkspaceError, match="not under a root"):
            outside(WorkspaceSpec(path=str(tmp_path)), engine.settings)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


def test_strict_has_no_network(tmp_path: Path, janitor: Janitor, strict_engine: Engine,
                               listener: int) -> None:
    with engine_with(tmp_path / "host", janitor, network_host_ok=True) as engine:
        # Positive control: a call in the host's network reaches the listener.
        assert engine.run(_connect(listener), network="host").stdout == "connected\n"
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
    with engine_with(tmp_path / "net", janitor, isolation="strict", sandbox_network=True,
                     network_host_ok=True) as engine:
        # The host's default policy (egress: never the host's loopback), or the host's own.
        assert engine.run(_connect(listener)).stdout == "refused\n"
        assert engine.run(_connect(listener), network="host").stdout == "connected\n"
        assert engine.run(_connect(listener), network=False).stdout == "refused\n"


def test_a_process_call_can_cut_its_network(engine: Engine, listener: int) -> None:
    assert engine.run(_connect(listener), network=False).stdout == "refused\n"


# ------------------------------------------------------------ isolation decisions


def test_a_call_may_ask_for_stronger_isolation_never_weaker(
    engine: Engine, strict_engine: Engine
) -> None:
    stronger = engine.run("touch /etc/bashfleet-test 2>/dev/null; "
                          "ls /proc | grep -c '^[0-9]'", isolation="strict")
    assert stronger.error is None and int(stronger.stdout) < 10  # its own PID namespace
    assert not Path("/etc/bashfleet-test").exists()
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
        result = engine.run(f"test -d /proc/{os.getpid()} && echo visible")
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

"""A call's first process as a program (isolate/spawn.c): a keeper posix_spawns it
through /proc/self/fd instead of forking itself, or started it before the call came
(`--ready`: a throwaway workspace's next call). What a call gets must not depend on
which of the three started it; the fork stays for a keeper the spawner cannot serve."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from privilege import needs_root

from bashfleet.worker.engine import holder, sandbox, workspaces
from bashfleet.worker.engine.isolate import SPAWN_NAME, kernel, syscall_filter
from bashfleet.worker.engine.workspaces import store, throwaway_pool
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceSpec

from .engine_helpers import (
    SPAWNER_FILTER,
    Engine,
    _engine_fixture,  # noqa: F401 - the `engine` fixture
    _janitor_fixture,  # noqa: F401 - the `janitor` fixture
    holds_open,
    wait_until,
)

pytestmark = needs_root("a user namespace mapped to other host ids, as a keeper's")

#: What a call can see of how it was started: ids, groups, cwd, its session, limits,
#: capabilities, privileges, filter, ignored signals, descriptors, environment. Not what
#: bash changes as it runs (its blocked signals, a pipeline's pipes while it starts one).
PROBE = r"""
exec 2>&1
id -u; id -g; id -G; pwd; ulimit -n; ulimit -Hn; ulimit -Sf; ulimit -Hf
read -r _ _ _ _ _ sid _ < /proc/$$/stat; [ "$sid" = "$$" ] && echo session-leader
grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp|Seccomp_filters|SigIgn):' \
    /proc/$$/status
cat /proc/$$/uid_map /proc/$$/gid_map
fds=(/proc/$$/fd/*); echo "${fds[*]##*/}"; readlink /proc/$$/fd/200
trap -p
umask
env | sort
"""


@pytest.fixture(name="spawner")
def _spawner_fixture(tmp_path: Path) -> Iterator[int]:
    path = holder.spawner(Settings(state_dir=tmp_path / "state"))
    assert path is not None, holder.find(Settings(state_dir=tmp_path / "state"))
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    yield fd
    os.close(fd)


@pytest.fixture(name="place")
def _place_fixture() -> Iterator[Path]:
    """A directory the namespace's users can reach (pytest's own is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="bashfleet-spawner-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture(name="userns")
def _userns_fixture() -> Iterator[int]:
    # Host ids far above any account's: what a workspace's slot maps.
    fd = kernel.new_user_namespace("0 3900000000 65536\n", "0 3900000000 65536\n")
    yield fd
    os.close(fd)


def _run(tmp_path: Path, how: str, spawner: int, who: kernel.Identity, *,
         seccomp: bytes | None, cwd: str, argv: list[str], env: dict[str, str]) -> str:
    """What `argv` printed, started by the keeper's fork (`fork`) or the spawner."""
    out = tmp_path / f"{how}-{uuid.uuid4().hex[:6]}.out"
    out.touch()
    os.chown(out, 3900000000 + who.uid, 3900000000 + who.gid)
    null = os.open(os.devnull, os.O_RDONLY)
    sink = os.open(out, os.O_WRONLY)
    extra = os.open(os.devnull, os.O_WRONLY)
    memfd = -1
    try:
        stdio, targets = [null, sink, sink, extra], [0, 1, 2, 200]
        if how == "fork":
            pid = kernel.spawn(None, argv, env, stdio, targets, cwd=cwd, who=who,
                               open_files=512, file_size=3 << 20,
                               seccomp=kernel.syscall_filter(seccomp) if seccomp else None)
        else:
            if seccomp:
                memfd = os.memfd_create("filter", os.MFD_CLOEXEC)
                os.write(memfd, seccomp)
            if how == "ready":
                ready = kernel.ready_spawn(spawner, who, memfd)
                started = kernel.start_ready(ready, None, argv, env, stdio, targets, cwd=cwd,
                                             open_files=512, file_size=3 << 20)
            else:
                started = kernel.spawn_through(spawner, None, argv, env, stdio, targets,
                                               cwd=cwd, who=who, open_files=512,
                                               file_size=3 << 20, filter_fd=memfd)
            assert started is not None
            pid = started
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, out.read_text()
    finally:
        for fd in (null, sink, extra, memfd):
            if fd >= 0:
                os.close(fd)
    return out.read_text()


@pytest.mark.parametrize("uid", [0, 1000])
@pytest.mark.parametrize("filtered", [False, True])
def test_a_call_is_the_same_whichever_started_it(place: Path, spawner: int, userns: int,
                                                 uid: int, filtered: bool) -> None:
    work = place / "work"
    work.mkdir()
    os.chown(work, 3900000000 + uid, 3900000000 + uid)
    who = kernel.Identity(uid, uid, (uid, 5), userns)
    program = syscall_filter.for_mode("default", platform.machine()) if filtered else None
    if filtered:
        assert program is not None
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "WITH SPACE": "a=b c\nd", "EMPTY": ""}
    seen = {how: _run(place, how, spawner, who, seccomp=program, cwd=str(work),
                      argv=["bash", "-c", PROBE], env=env)
            for how in ("fork", "spawner", "ready")}
    assert seen["fork"] == seen["spawner"] == seen["ready"]
    lines = seen["spawner"].splitlines()
    # RLIMIT_FSIZE of 3 MiB, soft and hard: 3072 of bash's 1 KiB blocks.
    assert lines[:8] == [str(uid), str(uid), f"{uid} 5", str(work), "512", "512", "3072",
                         "3072"]
    assert "session-leader" in lines
    assert ("Seccomp:\t2" in lines) is filtered and ("NoNewPrivs:\t1" in lines) is filtered
    assert ("CapEff:\t0000000000000000" in lines) is (uid != 0)
    # Its descriptors, listed by bash itself with no pipeline in flight (a pipeline's
    # pipes are bash's for a moment): the four given, and bash's own three (its 10 and
    # 251, the glob's directory): nothing the starter passed itself is left open.
    listed = [line.split() for line in lines if line.startswith("0 1 ")]
    assert len(listed) == 1 and {"0", "1", "2", "200"} <= set(listed[0]), lines
    assert len(listed[0]) <= 7, listed[0]
    assert "/dev/null" in lines
    assert "WITH SPACE=a=b c" in lines and "EMPTY=" in lines and "d" in lines
    # What this process ignores (SIGPIPE, SIGXFSZ; the C library's 32 and 33 in a
    # posix_spawn child) is back to its default.
    (ignored,) = [int(line.split()[1], 16) for line in lines if line.startswith("SigIgn:")]
    for signum in (13, 25, 32, 33):
        assert not ignored & 1 << (signum - 1), (signum, hex(ignored))


@pytest.mark.parametrize("ready", [False, True])
def test_what_failed_is_said_as_the_fork_says_it(place: Path, spawner: int,
                                                  userns: int, ready: bool) -> None:
    tmp_path = place
    (tmp_path / "a").mkdir()
    tool = tmp_path / "a" / "tool"
    tool.write_text("#!/bin/sh\necho ran > \"$PWD/marker\"\n")
    tool.chmod(0o755)
    os.chown(tmp_path, 3900000000, 3900000000)
    who = kernel.Identity(0, 0, (), userns)
    null = os.open(os.devnull, os.O_RDWR)
    try:
        def through(executable: str | None, argv: list[str], path: str, cwd: Path) -> int:
            if ready:
                pid = kernel.start_ready(kernel.ready_spawn(spawner, who), executable, argv,
                                         {"PATH": path}, [null, null, null], [0, 1, 2],
                                         cwd=str(cwd))
            else:
                pid = kernel.spawn_through(spawner, executable, argv, {"PATH": path},
                                           [null, null, null], [0, 1, 2], cwd=str(cwd),
                                           who=who)
            assert pid is not None
            return pid

        # PATH entries relative to the cwd, as execvp takes them: searched in the child.
        assert os.waitpid(through(None, ["tool"], "b:a", tmp_path), 0)[1] == 0
        assert (tmp_path / "marker").read_text() == "ran\n"
        with pytest.raises(FileNotFoundError) as missing:
            through(None, ["tool"], "/nonexistent", tmp_path)
        assert missing.value.filename == "tool"
        with pytest.raises(FileNotFoundError) as bad_cwd:
            through("/bin/true", ["true"], "", tmp_path / "gone")
        assert bad_cwd.value.filename == str(tmp_path / "gone")
        (tmp_path / "plain").write_text("not a program\n")
        with pytest.raises(PermissionError) as denied:
            through(str(tmp_path / "plain"), ["plain"], "", tmp_path)
        assert denied.value.filename == str(tmp_path / "plain")
        # A descriptor it would pass on has one of the call's numbers: the keeper forks.
        assert kernel.spawn_through(spawner, None, ["true"], {}, [null], [spawner],
                                    cwd="/", who=who) is None
    finally:
        os.close(null)


def test_a_ready_spawner_it_cannot_use_is_not_used(place: Path, spawner: int,
                                                   userns: int) -> None:
    """A ready spawner that failed its own steps, ended, or would be given its control
    socket's number is not handed the call (None: the keeper starts it the usual way,
    nothing of it run); one whose keeper goes away ends by itself."""
    marker = place / "ran"
    argv = ["sh", "-c", f"echo ran > {marker}"]
    env = {"PATH": "/usr/bin:/bin"}
    os.chown(place, 3900000000, 3900000000)
    null = os.open(os.devnull, os.O_RDWR)
    try:
        def ends(pid: int) -> int:
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

        # Its own steps failed (a descriptor that is not a user namespace): it said so.
        bad = kernel.ready_spawn(spawner, kernel.Identity(0, 0, (), null))
        assert ends(bad.pid) == 127
        assert kernel.start_ready(bad, None, argv, env, [null] * 3, [0, 1, 2], cwd="/") is None
        # Killed while it waited.
        killed = kernel.ready_spawn(spawner, kernel.Identity(0, 0, (), userns))
        kernel.end_ready(killed)
        assert ends(killed.pid) == -9
        gone = kernel.ReadySpawn(killed.pid, *_dead_socket())
        assert kernel.start_ready(gone, None, argv, env, [null] * 3, [0, 1, 2], cwd="/") is None
        # A target is its control socket's number.
        taken = kernel.ready_spawn(spawner, kernel.Identity(0, 0, (), userns))
        assert kernel.start_ready(taken, None, argv, env, [null], [taken.child_fd],
                                  cwd="/") is None
        assert ends(taken.pid) == 0  # its keeper's end closed: it ends, running nothing
        # A NUL inside a field (the worker's models refuse one; the keeper checks again):
        # it would shift every field after it, an environment variable into its argv.
        nuls: list[tuple[list[str], dict[str, str], str]] = [
            ([*argv[:2], argv[2] + "\0PATH=/x"], env, "/"), (argv, env, "/\0-1"),
            (argv, {"PATH": "/usr/bin\0FAKE=1"}, "/")]
        for nul_argv, nul_env, nul_cwd in nuls:
            held = kernel.ready_spawn(spawner, kernel.Identity(0, 0, (), userns))
            assert kernel.start_ready(held, None, nul_argv, nul_env, [null] * 3, [0, 1, 2],
                                      cwd=nul_cwd) is None
            assert ends(held.pid) == 0
        assert not marker.exists()
        # The same call through one that can: it runs (the cases above could have).
        fine = kernel.ready_spawn(spawner, kernel.Identity(0, 0, (), userns))
        pid = kernel.start_ready(fine, None, argv, env, [null] * 3, [0, 1, 2], cwd="/")
        assert pid == fine.pid and ends(pid) == 0
        assert marker.read_text() == "ran\n"
    finally:
        os.close(null)


def _dead_socket() -> tuple[socket.socket, int]:
    """A control socket whose other end is closed (its spawner ended), and that end's
    number."""
    mine, theirs = socket.socketpair()
    number = theirs.fileno()
    theirs.close()
    return mine, number


def test_a_workspace_with_ids_starts_its_calls_by_the_spawner(engine: Engine) -> None:
    """The suite's calls go the spawner's way (so every test of a call tests it): the
    keeper holds the binary, and still does after calls ran."""
    spawner = holder.spawner(engine.settings)
    assert spawner is not None
    record = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    try:
        assert record.ids is not None and record.keeper_pid is not None

        assert holds_open(record, os.path.realpath(spawner))
        assert not holds_open(record, SPAWNER_FILTER)  # made at its first call
        for _ in range(3):
            result = engine.run("echo $((6 * 7))", workspace=record.id, cwd=None, owner="o")
            assert result.error is None and result.stdout == "42\n", result
        missing = engine.run("no-such-tool-here", workspace=record.id, cwd=None, owner="o")
        assert missing.exit_code == 127 and "no-such-tool-here" in missing.stderr
        assert holds_open(record, SPAWNER_FILTER)
    finally:
        workspaces.delete(record.id, engine.settings)


#: A call's own start, in clock ticks since boot (/proc/PID/stat's 22nd field: the same
#: number whichever PID namespace reads it).
START_TICKS = "read -r -a stat < /proc/$$/stat; echo ${stat[21]}"


def _ready_spawners(settings: Settings) -> dict[int, int]:
    """The ready spawners (`--ready`) of the keepers of a state directory's workspaces:
    {host pid: start ticks}."""
    found = {}
    for record in store.local_records(settings):
        try:
            keeper = psutil.Process(record.keeper_pid) if record.keeper_pid else None
            for process in keeper.children() if keeper else ():
                if process.cmdline()[:2] == [SPAWN_NAME, "--ready"]:
                    found[process.pid] = _start_ticks(process.pid)
        except (psutil.Error, FileNotFoundError, ProcessLookupError):
            continue  # gone between its listing and the read of its start (a killed one)
    return found


def _start_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def _ticks_now() -> int:
    return round(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


def test_a_throwaway_workspaces_call_is_started_before_it_comes(engine: Engine) -> None:
    """A throwaway workspace's keeper starts its next call's spawner ahead (as the
    workspace is made, and once a call's processes ended): the call's process is one
    that was waiting before the call was sent, with everything a call gets (the test
    above: which way started it does not show)."""
    # The pool's throwaways made (as a consumer starts), each with its spawner waiting.
    throwaway_pool.throwaways.fill(engine.settings)
    full = throwaway_pool._pool_size(engine.settings)

    def all_waiting() -> dict[int, int] | None:
        found = _ready_spawners(engine.settings)
        return found if len(found) >= full else None

    waiting = wait_until(all_waiting, what="the throwaways' spawners")
    # Clock ticks go by after the last of them started: a call spawned now could not
    # have their start (it would be later).
    sent_after = max(waiting.values()) + 2
    wait_until(lambda: _ticks_now() >= sent_after, what="two clock ticks")
    assert _ready_spawners(engine.settings) == waiting
    second = engine.run(f"{START_TICKS}; grep ^Seccomp: /proc/$$/status", cwd=None)
    assert second.error is None, second
    ticks, seccomp = second.stdout.split("\n")[:2]
    assert int(ticks) in waiting.values() and int(ticks) < sent_after, (ticks, waiting)
    assert seccomp == "Seccomp:\t2", second.stdout
    # The one it took was that call's, and is gone; once the call's processes ended, its
    # keeper started the next one (the workspace, left clean, serves another call).
    taken = set(waiting) - set(_ready_spawners(engine.settings))
    assert len(taken) == 1
    wait_until(lambda: len(_ready_spawners(engine.settings)) == full,
               what="the next call's spawner")


def test_a_call_whose_ready_spawner_was_killed_starts_the_usual_way(engine: Engine) -> None:
    """A ready spawner gone before its call (killed, here from outside) is not handed
    the call: the keeper starts it as before, and makes the next one ready after it."""
    throwaway_pool.throwaways.fill(engine.settings)
    full = throwaway_pool._pool_size(engine.settings)

    def all_waiting() -> dict[int, int] | None:
        found = _ready_spawners(engine.settings)
        return found if len(found) >= full else None

    for pid in wait_until(all_waiting, what="the throwaways' spawners"):
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not _ready_spawners(engine.settings), what="them gone")
    sent_at = _ticks_now()
    ran = engine.run(f"{START_TICKS}; grep ^Seccomp: /proc/$$/status", cwd=None)
    assert ran.error is None and ran.exit_code == 0, ran
    ticks, seccomp = ran.stdout.split("\n")[:2]
    assert int(ticks) >= sent_at and seccomp == "Seccomp:\t2", ran.stdout
    wait_until(lambda: _ready_spawners(engine.settings), what="a spawner made ready again")


def test_a_host_without_a_spawner_says_so_at_start(engine: Engine, tmp_path: Path) -> None:
    """A prebuilt spawner that is not one (a holder given for it, say) is not used, and
    the worker says at start that its keepers fork their calls, and why."""
    not_one = tmp_path / "not-a-spawner"
    not_one.write_text("#!/bin/sh\nexit 2\n")
    not_one.chmod(0o755)
    _, warnings = sandbox.startup_problems(engine.settings)
    assert not [w for w in warnings if "spawner" in w], warnings
    given = engine.settings.model_copy(update={"spawner": not_one})
    assert holder.spawner(given) is None
    _, warnings = sandbox.startup_problems(given)
    said = [w for w in warnings if "fork of themselves" in w]
    assert said and str(not_one) in said[0], warnings

"""The seccomp filter of sandboxed calls, and each workspace's own session keyring, on
real keepers: the system calls the default container profiles refuse fail with EPERM
from a call, and the same probe run with the filter lifted (`seccomp=unconfined`) shows
they would otherwise have run; everyday tools work under it.

The keyring test runs with the filter lifted: the filter refuses add_key and keyctl
anyway, and what is tested is the keyring a call would reach were they allowed.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from privilege import needs_root

from bashfleet.client import Fleet
from bashfleet.client.cli import common, jobs
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.wire.models import Isolation, WorkspaceSpec

from .conftest import WorkerFactory
from .engine_helpers import (
    Engine,
    Janitor,
    _janitor_fixture,  # noqa: F401 - the `janitor` fixture
    _throwaway_threads,
    engine_with,
    wait_until,
)

pytestmark = needs_root("a root worker's workspaces")

#: Each call the profiles refuse, made through ctypes, with arguments that make it fail
#: harmlessly (or succeed) when it is allowed: the errno name it ended with, or "ok".
PROBE = r"""
import ctypes, errno, json
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    result = libc.syscall(nr, *args)
    return errno.errorcode.get(ctypes.get_errno(), "?") if result < 0 else "ok"
buf = ctypes.create_string_buffer(1 << 16)
print(json.dumps({
    "add_key": call(248, b"user", b"bf-probe", b"v", 1, -3),   # session keyring
    "keyctl": call(250, 0, -3, 0),                               # GET_KEYRING_ID
    "io_uring_setup": call(425, 1, None),                        # EFAULT when allowed
    "userfaultfd": call(323, 1),                                 # UFFD_USER_MODE_ONLY
    "bpf": call(321, 0, buf, 1 << 16),                           # E2BIG when allowed
}))
"""
KEYCTL = 250  # x86_64
REFUSED = ("add_key", "keyctl", "io_uring_setup", "userfaultfd", "bpf")


def probe(engine: Engine, ws_id: str) -> dict[str, str]:
    result = engine.run(f"python3 -c '{PROBE}'", workspace=ws_id, cwd=None)
    assert result.error is None and result.exit_code == 0, result
    answer: dict[str, str] = json.loads(result.stdout)
    return answer


@pytest.fixture(name="filtered")
def _filtered_fixture(tmp_path: Path, janitor: Janitor) -> Iterator[Engine]:
    with engine_with(tmp_path / "filtered", janitor) as engine:
        assert sandbox.host_ids(engine.settings) is not None, (
            "this host gives workspaces no ids of their own: run scripts/bootstrap.sh")
        yield engine


@pytest.fixture(name="unconfined")
def _unconfined_fixture(tmp_path: Path, janitor: Janitor) -> Iterator[Engine]:
    with engine_with(tmp_path / "unconfined", janitor, seccomp="unconfined") as engine:
        yield engine


@pytest.mark.parametrize("isolation", ["process", "strict"])
def test_a_call_cannot_make_the_calls_containers_are_refused(
        filtered: Engine, unconfined: Engine, isolation: Isolation) -> None:
    loose = workspaces.create(WorkspaceSpec(isolation=isolation), unconfined.settings)
    tight = workspaces.create(WorkspaceSpec(isolation=isolation), filtered.settings)
    try:
        # Positive control: without the filter none of them is EPERM (each reached the
        # kernel's own code for it), so the probe can tell the filter's refusal apart.
        allowed = probe(unconfined, loose.id)
        assert all(allowed[name] != "EPERM" for name in REFUSED), allowed
        assert allowed["add_key"] == "ok" and allowed["keyctl"] == "ok", allowed
        refused = probe(filtered, tight.id)
        assert refused == dict.fromkeys(REFUSED, "EPERM"), refused
    finally:
        workspaces.delete(loose.id, unconfined.settings)
        workspaces.delete(tight.id, filtered.settings)


def test_a_throwaway_call_and_its_background_job_run_under_it(filtered: Engine) -> None:
    result = filtered.run(f"python3 -c '{PROBE}' > probe.json & wait; cat probe.json")
    assert result.error is None, result
    assert json.loads(result.stdout) == dict.fromkeys(REFUSED, "EPERM"), result


EVERYDAY = """set -e
bash -c 'echo bash ok'
python3 -c 'import ssl, sqlite3, subprocess, threading, multiprocessing as m
with m.Pool(2) as p: print("python ok", sum(p.map(abs, [-1, -2])))'
git init -q repo && cd repo && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m first
git log --oneline | wc -l | sed 's/^/git commits: /' && cd ..
pip --version >/dev/null && echo pip ok
printf 'int main(void){return 7;}' > m.c && cc -o m m.c && { ./m || echo "cc ok: $?"; }
sleep 0.2 & wait $! && echo jobs ok
tar czf t.tgz repo && tar tzf t.tgz >/dev/null && echo tar ok
unshare -r true && echo userns ok
"""


@pytest.mark.parametrize("isolation", ["process", "strict"])
def test_everyday_tools_work_under_it(filtered: Engine, isolation: Isolation) -> None:
    record = workspaces.create(WorkspaceSpec(isolation=isolation), filtered.settings)
    try:
        result = filtered.run(EVERYDAY, workspace=record.id, cwd=None)
        assert result.exit_code == 0, result
        assert result.stdout.splitlines() == [
            "bash ok", "python ok 3", "git commits: 1", "pip ok", "cc ok: 7", "jobs ok",
            "tar ok", "userns ok"], result
        assert probe(filtered, record.id)["add_key"] == "EPERM"
    finally:
        workspaces.delete(record.id, filtered.settings)


def test_a_terminal_call_runs_under_it(filtered: Engine) -> None:
    record = workspaces.create(WorkspaceSpec(), filtered.settings)
    try:
        result = filtered.run(
            "python3 -c 'import os, termios; print(\"tty\", os.isatty(0), "
            "len(termios.tcgetattr(1)))'; "
            f"python3 -c '{PROBE}'", workspace=record.id, cwd=None, stdin="pty", timeout_s=20.0)
        lines = result.stdout.replace("\r", "").splitlines()
        assert lines[0] == "tty True 7", result
        assert json.loads(lines[1]) == dict.fromkeys(REFUSED, "EPERM"), result
    finally:
        workspaces.delete(record.id, filtered.settings)


def test_the_host_says_which_filter_its_calls_get(filtered: Engine, unconfined: Engine) -> None:
    assert sandbox.probe(filtered.settings).seccomp == "default"
    assert sandbox.probe(unconfined.settings).seccomp == "unconfined"


#: A key in the call's session keyring (add), or the same name looked up there (read).
KEYS = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
SESSION = -3
if sys.argv[1] == "add":
    key = libc.syscall(248, b"user", b"bf-secret", b"s3cr3t-value", 12, SESSION)
    print("added" if key > 0 else "add failed")
else:
    key = libc.syscall(250, 10, SESSION, b"user", b"bf-secret", 0)  # KEYCTL_SEARCH
    buf = ctypes.create_string_buffer(64)
    n = libc.syscall(250, 11, key, buf, 64) if key > 0 else -1      # KEYCTL_READ
    print(buf.raw[:n].decode() if n > 0 else "no key")
"""


@pytest.fixture(name="keyed")
def _keyed_fixture(tmp_path: Path, janitor: Janitor) -> Iterator[Engine]:
    """An engine without the filter, whose worker process has a session keyring of its
    own, as one under systemd has (a service's own keyring), before its sandbox starts:
    what every keeper would otherwise pass on to its calls."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(KEYCTL, 1, f"bf-test-{os.getpid()}".encode()) > 0  # JOIN_SESSION_KEYRING
    with engine_with(tmp_path / "keyed", janitor, seccomp="unconfined") as engine:
        yield engine


@pytest.mark.parametrize("isolation", ["process", "strict"])
def test_two_workspaces_share_no_session_keyring(keyed: Engine, isolation: Isolation) -> None:
    unconfined = keyed
    owner_a = workspaces.create(WorkspaceSpec(owner="a", isolation=isolation),
                                unconfined.settings)
    owner_b = workspaces.create(WorkspaceSpec(owner="b", isolation=isolation),
                                unconfined.settings)
    try:
        for record in (owner_a, owner_b):
            (Path(record.path) / "keys.py").write_text(KEYS)
        added = unconfined.run("python3 keys.py add", workspace=owner_a.id, cwd=None,
                               owner="a")
        assert added.stdout == "added\n", added
        # Positive control: A's next call finds it in the session keyring it shares with
        # its workspace's other calls.
        again = unconfined.run("python3 keys.py read", workspace=owner_a.id, cwd=None,
                               owner="a")
        assert again.stdout == "s3cr3t-value\n", again
        stolen = unconfined.run("python3 keys.py read", workspace=owner_b.id, cwd=None,
                                owner="b")
        assert stolen.stdout == "no key\n", stolen
    finally:
        workspaces.delete(owner_a.id, unconfined.settings)
        workspaces.delete(owner_b.id, unconfined.settings)


def _ready_throwaways(engine: Engine) -> int:
    """The engine's ready throwaways (the pool is the process's: other engines' too)."""
    with workspaces.throwaways.lock:
        return sum(len(records) for (state_dir, _), records
                   in workspaces.throwaways.ready.items()
                   if state_dir == engine.settings.state_dir)


def test_a_reused_throwaway_workspace_brings_no_key_along(keyed: Engine) -> None:
    """A throwaway workspace whose call left nothing serves the next call, maybe another
    owner's: its keyring is new all the same."""
    # The pool made ahead first, so that the next call's workspace is the last given back.
    assert keyed.run("true", cwd=None).exit_code == 0
    wait_until(lambda: not _throwaway_threads(), what="the throwaway pool's threads")
    where = "; readlink /proc/self/ns/pid >&2"
    reused = 0
    # The pool may discard a workspace rather than keep it (its recycling lost a race
    # with a busy machine): the pair is tried again until the second call did run in the
    # first one's keeper, and no pair may carry the key.
    for _ in range(10):
        full = _ready_throwaways(keyed)
        added = keyed.run(f"python3 -c '{KEYS}' add{where}", owner="a", cwd=None)
        assert added.stdout == "added\n", added
        # Given back (by the pool's recycling thread) before the next call takes one; a
        # workspace it deleted instead leaves the pool short, and the pair is tried again.
        with contextlib.suppress(AssertionError):
            wait_until(lambda full=full: _ready_throwaways(keyed) >= full, timeout=15,  # type: ignore[misc]
                       what="the workspace given back to the pool")
        after = keyed.run(f"python3 -c '{KEYS}' read{where}", owner="b", cwd=None)
        assert after.stdout == "no key\n", after
        wait_until(lambda: not _throwaway_threads(), what="the throwaway pool's threads")
        if after.stderr == added.stderr:
            reused += 1
            break
    # The second call ran in the first one's workspace (its keeper), not a new one.
    assert reused, "no call ran in the workspace the call before it gave back"


def test_real_workers_filter_calls_and_hosts_says_so(workers: WorkerFactory,
                                                      redis_server: RedisServer) -> None:
    """Through the fleet: a host with the default filter and one with it lifted
    (`BASHFLEET_SECCOMP=unconfined`); `hosts` tells them apart, and so do their calls."""
    tight = workers.start(f"tight-{os.getpid()}", wait=False)
    loose = workers.start(f"loose-{os.getpid()}", wait=False,
                          env={"BASHFLEET_SECCOMP": "unconfined"})
    for worker in (tight, loose):
        worker.wait_ready(workers.client)
    with Fleet(redis_url=redis_server.url) as fleet:
        infos = {info.host: info for info in fleet.hosts()}
        said = {host: jobs.isolation_text(common.dump(probe_) if (
            probe_ := infos[host].sandbox) is not None else None)
                for host in (tight.host, loose.host)}
        assert "seccomp default" in said[tight.host], said
        assert "seccomp unconfined" in said[loose.host], said
        answers = {worker.host: json.loads(fleet.run(f"python3 -c '{PROBE}'",
                                                     host=worker.host).stdout)
                   for worker in (tight, loose)}
    assert answers[tight.host] == dict.fromkeys(REFUSED, "EPERM"), answers
    assert all(answers[loose.host][name] != "EPERM" for name in REFUSED), answers

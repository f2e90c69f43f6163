"""Snapshots and forks through a real fleet (`Workspace.snapshot`, `fork`, `restore`,
`Fleet.workspace(snapshot=...)`, `Fleet.snapshots`, `delete_snapshot`), as an
orchestrator's RL loop drives them."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import pytest
from privilege import needs_root

from bashfleet.client import Fleet, LimitReached, SnapshotMoveError, UnknownSnapshot
from bashfleet.client.redis_server import RedisServer

from .conftest import WorkerFactory, WorkerProcess
from .registry import Registry, free_port

pytestmark = needs_root("snapshots need workspaces with ids of their own (a root worker)")

#: A repository an agent-like script makes: one bug, one test that finds it.
#: How many beat loops run: processes whose args name the beats file, less those whose
#: parent is one (the loop's fork for `date`, before its exec, shows the loop's args).
ONE_LOOP = ("ps -e -o ppid=,pid=,args= | awk '/[b]eats/ {up[$2] = $1} "
            "END {n = 0; for (p in up) if (!(up[p] in up)) n++; print n}'")

REPO = (
    "set -e; mkdir repo && cd repo && git init -q && "
    "printf 'def add(a, b):\\n    return a - b\\n' > calc.py && "
    "printf 'from calc import add\\nprint(\"sum\", add(2, 3))\\n"
    "assert add(2, 3) == 5\\n' > test_calc.py && printf '__pycache__/\\n' > .gitignore && "
    "git add -A && git -c user.email=a@b -c user.name=a commit -qm init"
)


@pytest.fixture(name="host", scope="module")
def _host_fixture(session_workers: WorkerFactory) -> Iterator[WorkerProcess]:
    """One host, its owners capped at 10 workspaces and 6 snapshots (to reach them)."""
    yield from session_workers.module_host("snp", env={"BASHFLEET_LIMIT_WORKSPACES": "10",
                                                       "BASHFLEET_LIMIT_SNAPSHOTS": "6"})


def owner() -> str:
    return f"tenant-{uuid.uuid4().hex[:8]}"


def test_the_rl_pattern_snapshot_fork_patch_and_test(host: WorkerProcess,
                                                      redis_server: RedisServer) -> None:
    """An agent's repository, snapshotted; 8 forks each apply another patch and run the
    tests: their results differ as the patches do; the source is untouched and its
    background job served throughout."""
    with Fleet(redis_server.url, owner=owner()) as fleet, fleet.workspace(host="snp") as ws:
        assert ws.run(REPO).exit_code == 0
        beat = ws.run("while :; do date +%s%N >> /tmp/beats; sleep 0.02; done",
                      mode="background").job
        assert beat is not None
        snap = ws.snapshot(tags={"step": "0"})
        assert snap.workspace == ws.id and snap.base == "host" and snap.bytes > 0
        assert [s.id for s in fleet.snapshots()] == [snap.id]
        forks = ws.fork(8)
        assert len({f.id for f in forks}) == 8 and all(f.path == ws.path for f in forks)
        patches = ["a + b", "b + a", "a - b", "a * b", "a + b + 0", "abs(a) + b", "a ** b",
                   "5"]
        expected = [0, 0, 1, 1, 0, 0, 1, 0]
        for fork, patch in zip(forks, patches, strict=True):
            fork.run(f"cd repo && sed -i 's/return .*/return {patch}/' calc.py")
        results = [f.run("cd repo && python3 test_calc.py") for f in forks]
        assert [r.exit_code for r in results] == expected
        assert {r.stdout for r in results} >= {"sum 5\n", "sum -1\n", "sum 6\n", "sum 8\n"}
        # Each fork's change is its own.
        assert forks[3].run("cat repo/calc.py").stdout.endswith("return a * b\n")
        assert forks[0].run("cd repo && git status --short").stdout == " M calc.py\n"
        # The source: untouched, its job still running and writing.
        assert ws.run("cat repo/calc.py").stdout.endswith("return a - b\n")
        assert ws.run("cd repo && git status --short").stdout == ""
        before = int(ws.run("wc -l < /tmp/beats").stdout)
        time.sleep(0.3)
        assert int(ws.run("wc -l < /tmp/beats").stdout) > before
        assert ws.check(beat.id).running
        # A fork has the files of that instant and no process of the source's.
        assert ws.run(ONE_LOOP).stdout == "1\n"
        assert forks[1].run("ps -e -o args= | grep -c '[b]eats' || true").stdout == "0\n"
        for fork in forks:
            assert fork.delete()
        assert fleet.delete_snapshot(snap)
        assert fleet.snapshots() == []
        assert not fleet.delete_snapshot(snap.id)


def test_forks_of_an_unchanged_workspace_stand_on_one_snapshot(
    host: WorkerProcess, redis_server: RedisServer,
) -> None:
    """An episode's forks, then the next episode's from the same state: they stand on the
    first's snapshot (no copy, no place more in the owner's quota); a change makes the
    next fork's snapshot anew, and each fork has the files of its own instant."""
    with Fleet(redis_server.url, owner=owner()) as fleet, fleet.workspace(host="snp") as ws:
        assert ws.run(REPO).exit_code == 0
        written = time.monotonic()
        # Stamps are trusted once every ctime is older than the margin (`fork_reuse`).
        while time.monotonic() - written < 0.3:
            time.sleep(0.05)  # the files' ctimes aging: what is waited for is time
        first = ws.fork(2)
        second = ws.fork(3)
        snaps = {f.view.snapshot for f in first + second}
        assert len(snaps) == 1 and None not in snaps
        assert ws.run("echo changed >> repo/calc.py").exit_code == 0
        (third,) = ws.fork(1)
        assert third.view.snapshot not in snaps
        assert first[0].run("tail -1 repo/calc.py").stdout == "    return a - b\n"
        assert third.run("tail -1 repo/calc.py").stdout == "changed\n"
        for fork in [*first, *second, third]:
            assert fork.delete()
        assert fleet.snapshots() == []


def test_a_workspace_from_a_snapshot_and_restore(host: WorkerProcess,
                                                 redis_server: RedisServer) -> None:
    with Fleet(redis_server.url, owner=owner()) as fleet, fleet.workspace(host="snp") as ws:
        ws.run("echo v1 > state.txt")
        first = ws.snapshot()
        ws.run("echo v2 > state.txt; sleep 300 &")
        with fleet.workspace(snapshot=first) as other:
            assert other.host == "snp" and other.path == ws.path
            assert other.view.snapshot == first.id
            assert other.run("cat state.txt").stdout == "v1\n"
        done = ws.restore(first)
        assert (done.workspace, done.snapshot) == (ws.id, first.id) and done.ended >= 1
        assert ws.run("cat state.txt").stdout == "v1\n"
        assert ws.info().processes == 0
        # A snapshot is this owner's alone.
        with Fleet(redis_server.url, owner=owner()) as stranger:
            with pytest.raises(UnknownSnapshot):
                stranger.workspace(snapshot=first.id)
            assert not stranger.delete_snapshot(first.id)
            assert stranger.snapshots() == []
        with pytest.raises(UnknownSnapshot):
            fleet.workspace(snapshot="s" + "0" * 15)


def test_caps_leave_nothing_half_made(host: WorkerProcess, redis_server: RedisServer) -> None:
    with Fleet(redis_server.url, owner=owner()) as fleet, fleet.workspace(host="snp") as ws:
        ws.run("echo x > f")
        # Past the owner's cap of workspaces (10, one held): refused, none left.
        with pytest.raises(LimitReached):
            ws.fork(10)
        assert [w.id for w in fleet.workspaces()] == [ws.id]
        # Past the owner's cap of snapshots (6).
        kept = [ws.snapshot() for _ in range(6)]
        with pytest.raises(LimitReached) as caught:
            ws.snapshot()
        assert "BASHFLEET_LIMIT_SNAPSHOTS" in str(caught.value)
        assert len(fleet.snapshots()) == 6
        for snap in kept:
            assert fleet.delete_snapshot(snap)
        assert ws.run("cat f").stdout == "x\n"  # the source unharmed


@pytest.fixture(name="across", scope="module")
def _across_fixture(session_workers: WorkerFactory, image_registry: Registry
                    ) -> Iterator[tuple[WorkerProcess, WorkerProcess, WorkerProcess]]:
    """Two hosts whose snapshots travel through the session's registry, and one whose
    registry for snapshots is down (nothing listens there)."""
    env = {"BASHFLEET_REGISTRY_AUTH_FILE": str(image_registry.auth_file),
           "BASHFLEET_REGISTRY_CERTS_DIR": str(image_registry.certs_dir),
           "BASHFLEET_SNAPSHOT_REGISTRY": f"{image_registry.url}/fleet/snapshots"}
    down = {**env, "BASHFLEET_SNAPSHOT_REGISTRY": f"127.0.0.1:{free_port()}/fleet/snapshots"}
    hosts = [session_workers.module_host(name, env=each)
             for name, each in (("snpa", env), ("snpb", env), ("snpdown", down))]
    started = [next(host) for host in hosts]
    try:
        yield started[0], started[1], started[2]
    finally:
        for host in hosts:
            with contextlib.suppress(StopIteration):
                next(host)


def test_a_workspace_from_a_snapshot_on_another_host(
        across: tuple[WorkerProcess, ...], redis_server: RedisServer) -> None:
    """A snapshot of a fork (two layers) made into a workspace on another host: both its
    layers fetched there through the registry, each once."""
    with Fleet(redis_server.url, owner=owner()) as fleet, fleet.workspace(host="snpa") as ws:
        ws.run("mkdir -p proj && echo base > proj/a && echo gone > proj/b")
        first = ws.snapshot()
        with fleet.workspace(snapshot=first) as fork:
            assert fork.host == "snpa"  # the snapshot's host, when none is asked
            fork.run("echo forked > proj/c && rm proj/b")
            second = fork.snapshot()
        with fleet.workspace(snapshot=second, host="snpb") as there:
            assert there.host == "snpb" and there.path == ws.path
            assert there.run("cat proj/a proj/c; ls proj").stdout.split() == [
                "base", "forked", "a", "c"]
        pushed = {s.id: s.pushed for s in fleet.snapshots()}
        assert pushed[first.id] and pushed[second.id]  # each layer pushed once, by digest
        assert "@sha256:" in str(pushed[second.id])
        with fleet.workspace(snapshot=second, host="snpb") as again:  # held there now
            assert again.run("cat proj/c").stdout == "forked\n"
        # A fork asked for on the other host: the same, in one call.
        forks = ws.fork(2, host="snpb")
        assert [f.host for f in forks] == ["snpb", "snpb"]
        assert forks[1].run("cat proj/a").stdout == "base\n"
        for made in forks:
            made.delete()
        # The original and the other host's workspaces never changed the source.
        assert ws.run("ls proj").stdout.split() == ["a", "b"]


def test_a_host_with_no_registry_for_snapshots_or_a_dead_one_says_so(
        across: tuple[WorkerProcess, ...], host: WorkerProcess,
        redis_server: RedisServer) -> None:
    with Fleet(redis_server.url, owner=owner()) as fleet:
        with fleet.workspace(host="snp") as ws:  # no BASHFLEET_SNAPSHOT_REGISTRY there
            snap = ws.snapshot()
            with pytest.raises(SnapshotMoveError) as caught:
                fleet.workspace(snapshot=snap, host="snpb")
            assert caught.value.kind == "unavailable"
            assert "BASHFLEET_SNAPSHOT_REGISTRY" in str(caught.value)
            assert ws.run("echo still").stdout == "still\n"
        with fleet.workspace(host="snpdown") as ws:
            ws.run("echo x > f")
            snap = ws.snapshot()
            with pytest.raises(SnapshotMoveError) as caught:
                fleet.workspace(snapshot=snap, host="snpa")
            assert caught.value.kind == "unavailable" and "127.0.0.1" in str(caught.value)
            assert not [s for s in fleet.snapshots() if s.pushed]
            assert ws.run("cat f").stdout == "x\n"  # the source unharmed
        # Nothing half-made on the hosts that were asked: no workspace, no layer.
        assert all(w.host != "snpa" for w in fleet.workspaces())

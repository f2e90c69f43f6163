"""Snapshots and forks through a real fleet (`Workspace.snapshot`, `fork`, `restore`,
`Fleet.workspace(snapshot=...)`, `Fleet.snapshots`, `delete_snapshot`), as an
orchestrator's RL loop drives them."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest

from client import Fleet, LimitReached, UnknownSnapshot
from client.redis_server import RedisServer

from .conftest import WorkerFactory, WorkerProcess

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="snapshots need workspaces with "
                                "ids of their own (a root worker)")

#: A repository an agent-like script makes: one bug, one test that finds it.
REPO = (
    "set -e; mkdir repo && cd repo && git init -q && "
    "printf 'def add(a, b):\\n    return a - b\\n' > calc.py && "
    "printf 'from calc import add\\nprint(\"sum\", add(2, 3))\\n"
    "assert add(2, 3) == 5\\n' > test_calc.py && "
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
        assert ws.run("ps -e -o args= | grep -c '[b]eats'").stdout == "1\n"
        assert forks[1].run("ps -e -o args= | grep -c '[b]eats' || true").stdout == "0\n"
        for fork in forks:
            assert fork.delete()
        assert fleet.delete_snapshot(snap)
        assert fleet.snapshots() == []
        assert not fleet.delete_snapshot(snap.id)


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

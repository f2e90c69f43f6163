"""Snapshots on a host that keeps its workspaces' layers on an XFS image with reflink
(`BASHFLEET_LAYER_IMAGE_GB`): the worker mounts it at start and says so; a snapshot's
files share their extents with the source's, hold what the source held at that instant
and stay so when the source writes on."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from privilege import needs_root

from bashfleet.client import Fleet
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import mountinfo
from bashfleet.worker.engine.snapshots import layer_fs, snapshot_store
from bashfleet.worker.settings import Settings

from .conftest import WorkerFactory, WorkerProcess

pytestmark = [
    needs_root("a root worker (ids, a loop mount)"),
    pytest.mark.skipif(shutil.which("mkfs.xfs") is None
                       or not os.path.exists("/dev/loop-control"),
                       reason="no mkfs.xfs (Debian's xfsprogs) or no loop device"),
]

#: Files of every size in the workspace's directory and its own `/`, and their sums.
FILL = ("set -e; mkdir -p repo /pkg; head -c 20971520 /dev/urandom > repo/big; "
        "for i in 1 2 3 4 5 6 7 8; do head -c $((i * 3000)) /dev/urandom > repo/s$i; done; "
        "head -c 5242880 /dev/urandom > /pkg/lib; echo hello > /pkg/small")
SUMS = "md5sum repo/big repo/s1 repo/s8 /pkg/lib /pkg/small"


@pytest.fixture(name="host", scope="module")
def _host_fixture(session_workers: WorkerFactory) -> Iterator[WorkerProcess]:
    """A host with the layer image; its mounts undone once it stopped (a worker leaves
    them for its next start)."""
    hosts = session_workers.module_host("xfs", env={"BASHFLEET_LAYER_IMAGE_GB": "2"})
    worker = next(hosts)
    try:
        yield worker
    finally:
        for _ in hosts:  # stops it, ends its jobs and workspaces
            pass
        layer_fs.release(Settings(state_dir=worker.state_dir,
                                  workspace_root=worker.workspace_root))


def _fs_type(path: Path) -> str:
    return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True,
                          text=True, check=True).stdout.strip()


def _shared_extents(path: Path) -> int:
    out = subprocess.run(["filefrag", "-v", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return sum("shared" in line for line in out.splitlines() if line.strip()[:1].isdigit())


def test_a_snapshot_on_the_image_clones_and_keeps_its_instant(
        host: WorkerProcess, redis_server: RedisServer) -> None:
    settings = Settings(state_dir=host.state_dir, workspace_root=host.workspace_root)
    assert "workspace layers and snapshots on" in host.log() and "(XFS, reflink)" in host.log()
    with Fleet(redis_server.url, owner=f"o-{uuid.uuid4().hex[:8]}") as fleet, \
            fleet.workspace(host="xfs") as ws:
        assert ws.run(FILL).exit_code == 0
        before = ws.run(SUMS).stdout
        assert len(before.splitlines()) == 5
        beat = ws.run("while :; do date +%s%N > /tmp/beat; sleep 0.01; done",
                      mode="background").job
        assert beat is not None
        snap = ws.snapshot()
        layer = snapshot_store.layer_path(settings, snap.id)
        big = layer / "work" / "repo" / "big"
        assert _fs_type(layer) == "xfs" and _fs_type(Path(ws.path)) == "xfs"
        # Shared with the source's file, not a copy of its 20 MiB.
        assert _shared_extents(big) >= 1 and big.stat().st_size == 20 * 2**20
        # The source writes on: in place, appended, replaced, removed.
        changed = ws.run("set -e; printf XXXX | dd of=repo/big bs=1 seek=4096 conv=notrunc "
                         "status=none; echo more >> /pkg/small; head -c 100 /dev/zero > repo/s1; "
                         "rm /pkg/lib; " + SUMS.replace("/pkg/lib ", "") + " 2>&1")
        assert changed.exit_code == 0
        assert changed.stdout.splitlines()[0] != before.splitlines()[0]
        # A workspace from the snapshot sees the files as they were when it was taken.
        with fleet.workspace(snapshot=snap) as other:
            assert other.run(SUMS).stdout == before
        assert ws.check(beat.id).running


def test_only_a_root_host_left_on_ext4_is_told_what_the_image_would_change(
        two_hosts: tuple[WorkerProcess, WorkerProcess], host: WorkerProcess) -> None:
    hint = "BASHFLEET_LAYER_IMAGE_GB=64 keeps layers and snapshots on an XFS image"
    plain = two_hosts[0]
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        entry = mountinfo.holding(handle.read(), str(plain.state_dir.resolve()))
    assert entry is not None
    told = entry.fs_type == "ext4" and os.geteuid() == 0
    # The whole log: these hosts have served other modules since they said it.
    assert (hint in plain.log_path.read_text(errors="replace")) is told, entry
    assert hint not in host.log_path.read_text(errors="replace")  # it said what it did

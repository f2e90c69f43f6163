"""Snapshots and forks in the engine: a workspace's own layers frozen, new workspaces on them.

Every test first proves that what it checks could have happened (the source really wrote,
a fork really changed a file) before it asserts what must not have.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from privilege import needs_root

from bashfleet.worker.engine import teardown, workspaces
from bashfleet.worker.engine.images import images
from bashfleet.worker.engine.snapshots import fork_delta, fork_reuse, snapshot_store, snapshots
from bashfleet.worker.engine.workspaces import disk, lifecycle, store, untouched, usage
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceRecord, WorkspaceSpec

from .engine_helpers import (
    Engine,
    Janitor,
    _engine_fixture,  # noqa: F401 - the `engine` fixture
    _janitor_fixture,  # noqa: F401 - the `janitor` fixture
    engine_with,
    wait_until,
)
from .registry import Registry
from .sandbox_helpers import needs_cgroups

pytestmark = needs_root("workspaces with ids of their own need a root worker")


def _sh(engine: Engine, ws_id: str, command: str) -> str:
    result = engine.run(command, workspace=ws_id, cwd=None, owner="o")
    assert result.error is None and result.exit_code == 0, result
    return result.stdout


def test_a_fork_has_the_source_files_everywhere_and_changes_its_own(engine: Engine) -> None:
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    try:
        _sh(engine, source.id, (
            "mkdir -p repo && echo one > repo/a.txt && echo tmp > /tmp/t && "
            "echo home > ~/h && mkdir -p /opt2 && echo root > /opt2/r && "
            "cp /bin/true ./suid && chmod 4755 ./suid"))
        snap, paused = snapshots.take(source, engine.settings, ttl_s=600)
        assert snap.layers == (snap.id,) and snap.path == source.path
        assert paused is None or paused < 1000
        layer = snapshot_store.layer_path(engine.settings, snap.id)
        # The ids of the source's slot became the image-like 0..65535 in the layer.
        assert os.stat(layer / "work" / "repo" / "a.txt").st_uid == 0
        assert os.stat(layer / "work" / "suid").st_mode & stat.S_ISUID
        fork = workspaces.create(WorkspaceSpec(owner="o", snapshot=snap.id), engine.settings)
        try:
            assert fork.path == source.path and fork.dir is not None and fork.dir != fork.path
            assert fork.ids != source.ids
            seen = _sh(engine, fork.id, (
                "cat repo/a.txt /tmp/t ~/h /opt2/r; stat -c %u repo/a.txt; pwd"))
            assert seen.split() == ["one", "tmp", "home", "root", "0", source.path]
            _sh(engine, fork.id, "echo two > repo/a.txt; rm /tmp/t; echo new > repo/b.txt")
            assert _sh(engine, fork.id, "cat repo/a.txt repo/b.txt; ls /tmp/t || true"
                       ).split() == ["two", "new"]
            # The source never saw the fork's changes; the snapshot's layer is unchanged.
            assert _sh(engine, source.id, "cat repo/a.txt /tmp/t; ls repo").split() == [
                "one", "tmp", "a.txt"]
            assert (layer / "work" / "repo" / "a.txt").read_text() == "one\n"
            # What the fork changed is in its own directory on the host, not the source's.
            assert (Path(fork.dir) / "repo" / "b.txt").read_text() == "new\n"
            assert not (Path(source.path) / "repo" / "b.txt").exists()
        finally:
            workspaces.delete(fork.id, engine.settings)
        # Deleting the fork left the source's directory alone.
        assert (Path(source.path) / "repo" / "a.txt").read_text() == "one\n"
    finally:
        workspaces.delete(source.id, engine.settings)


def test_the_source_keeps_running_while_it_is_snapshotted(engine: Engine) -> None:
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    try:
        # The count is replaced, never truncated in place: a read never sees it empty.
        started = engine.run("(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; "
                             "mv /tmp/count.new /tmp/count; sleep 0.01; done) >/dev/null 2>&1 "
                             "& echo started", workspace=source.id, cwd=None, owner="o")
        assert started.exit_code == 0
        before = int(_sh(engine, source.id, "until [ -s /tmp/count ]; do sleep 0.05; done; "
                         "cat /tmp/count"))
        snap, _ = snapshots.take(source, engine.settings)
        # Thawed: its loop goes on (within seconds, however loaded the host).
        after = int(_sh(engine, source.id, f"for i in $(seq 100); do c=$(cat /tmp/count); "
                        f"[ $c -gt {before} ] && break; sleep 0.05; done; cat /tmp/count"))
        assert after > before
        fork = workspaces.create(WorkspaceSpec(owner="o", snapshot=snap.id), engine.settings)
        try:
            # A fork has the files, no processes: its counter stands still.
            one = _sh(engine, fork.id, "cat /tmp/count; ps -e -o comm= | grep -c sleep || true")
            count, sleeping = one.split()
            assert int(count) >= before and sleeping == "0"
        finally:
            workspaces.delete(fork.id, engine.settings)
    finally:
        workspaces.delete(source.id, engine.settings)


def test_a_snapshot_of_a_fork_stands_on_the_first(engine: Engine) -> None:
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    made = [source.id]
    try:
        _sh(engine, source.id, "echo 1 > f1; echo x > gone")
        first, _ = snapshots.take(source, engine.settings)
        fork = workspaces.create(WorkspaceSpec(owner="o", snapshot=first.id), engine.settings)
        made.append(fork.id)
        _sh(engine, fork.id, "echo 2 > f2; rm gone")
        second, _ = snapshots.take(fork, engine.settings)
        assert second.layers == (second.id, first.id)
        grand = workspaces.create(WorkspaceSpec(owner="o", snapshot=second.id), engine.settings)
        made.append(grand.id)
        assert _sh(engine, grand.id, "cat f1 f2; ls").split() == ["1", "2", "f1", "f2"]
        # The first cannot go while the second stands on it: deleted, it is kept.
        assert snapshots.remove(first.id, engine.settings)
        assert snapshot_store.layer_path(engine.settings, first.id).is_dir()
        for ws_id in made[1:]:
            workspaces.delete(ws_id, engine.settings)
        made[1:] = []
        assert snapshots.remove(second.id, engine.settings)
        snapshots.collect(engine.settings)
        assert not snapshot_store.layer_path(engine.settings, first.id).exists()
        assert not snapshot_store.layer_path(engine.settings, second.id).exists()
    finally:
        for ws_id in made:
            workspaces.delete(ws_id, engine.settings)


def _fork_snapshot(engine: Engine, source: WorkspaceRecord, **tags: str) -> str:
    """A snapshot taken as `fork` takes one (hidden, kept the grace); its id."""
    snap, _ = snapshots.take(workspaces.load(source.id, engine.settings), engine.settings,
                             ttl_s=snapshots.HIDDEN_GRACE_S, hidden=True, tags=tags)
    return snap.id


def _past_the_margin(since: float) -> None:
    """Wait until what was written before `since` (time.time()) is older than the margin
    a fork's stamps need to be trusted (`fork_reuse`)."""
    wait_until(lambda: time.time() - since > untouched.MARGIN_S + 0.05,
               what="the files' ctimes to age past the margin")


def test_a_fork_of_an_unchanged_workspace_stands_on_its_last_forks_snapshot(
    engine: Engine,
) -> None:
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    made: list[str] = []
    try:
        _sh(engine, source.id, "mkdir -p repo && echo one > repo/a.txt && echo t > /tmp/t")
        _past_the_margin(time.time())
        first = _fork_snapshot(engine, source)
        made_at = snapshot_store.load(first, engine.settings).created_at
        layers = sorted(p.name for p in snapshot_store.snapshots_dir(engine.settings).iterdir())
        # Nothing changed: the same snapshot, renewed, and no copy made.
        assert _fork_snapshot(engine, source) == first
        assert snapshot_store.load(first, engine.settings).created_at > made_at
        assert sorted(p.name for p in snapshot_store.snapshots_dir(engine.settings).iterdir()
                      ) == layers
        # Other tags, or a snapshot that is not a fork's: taken anew.
        tagged = _fork_snapshot(engine, source, step="2")
        assert tagged != first
        plain, _ = snapshots.take(source, engine.settings)
        assert plain.id not in (first, tagged)
        # A change of the same size (only its times and ctime tell it): taken anew, and
        # a fork of each sees its own instant.
        _sh(engine, source.id, "echo two > repo/a.txt")
        second = _fork_snapshot(engine, source, step="2")
        assert second not in (first, tagged)
        for snap_id, seen in ((first, "one"), (second, "two")):
            fork = workspaces.create(WorkspaceSpec(owner="o", snapshot=snap_id),
                                     engine.settings)
            made.append(fork.id)
            assert _sh(engine, fork.id, "cat repo/a.txt /tmp/t").split() == [seen, "t"]
        # A call that changes nothing (its output kept outside the layers) keeps the
        # last fork's snapshot good, once the change before it aged past the margin.
        written = time.time()
        _sh(engine, source.id, "cat repo/a.txt")
        _past_the_margin(written)
        third = _fork_snapshot(engine, source, step="3")
        assert _fork_snapshot(engine, source, step="3") == third
        # A removed snapshot is never stood on again.
        assert snapshots.remove(third, engine.settings)
        fourth = _fork_snapshot(engine, source, step="3")
        assert fourth != third
        assert _fork_snapshot(engine, source, step="3") == fourth
        # One made (or renewed) past half the grace is not stood on either.
        stale = snapshot_store.load(fourth, engine.settings)
        snapshot_store.save(stale.model_copy(update={
            "created_at": time.time() - fork_reuse.REUSE_WITHIN_S - 1}), engine.settings)
        assert _fork_snapshot(engine, source, step="3") != fourth
    finally:
        for ws_id in made:
            workspaces.delete(ws_id, engine.settings)
        workspaces.delete(source.id, engine.settings)


#: A process that maps `m.bin` shared and writable, writes A through the mapping, then
#: the next letter at each SIGUSR1: a write to a page dirty already changes the file
#: with its times kept (no fault, no time update) until the page is written back.
MAPPER = (
    "head -c 4096 /dev/zero > m.bin; python3 -c '\n"
    "import mmap, os, signal, time\n"
    "f = open(\"m.bin\", \"r+b\"); m = mmap.mmap(f.fileno(), 4096); m[0:1] = b\"A\"\n"
    "signal.signal(signal.SIGUSR1, lambda *a: m.__setitem__(0, m[0] + 1))\n"
    "open(\"/tmp/mapper.pid\", \"w\").write(str(os.getpid()))\n"
    "time.sleep(300)' > /dev/null 2>&1 &"
)


def test_a_fork_of_a_workspace_that_maps_a_file_shared_takes_a_snapshot_anew(
    engine: Engine,
) -> None:
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    try:
        assert engine.run(MAPPER, workspace=source.id, cwd=None, owner="o").exit_code == 0
        wait_until(lambda: _sh(engine, source.id, "cat /tmp/mapper.pid 2>/dev/null || true"),
                   what="the mapper's first write")
        host_file = Path(workspaces.load(source.id, engine.settings).host_dir()) / "m.bin"
        _past_the_margin(time.time())
        # A write-back between the fork and the write (a sync of the host's) makes the
        # write change the file's times: tried again until one left them as they were.
        for letter in b"BCDEFGH":
            first = _fork_snapshot(engine, source)
            before = os.stat(host_file)
            _sh(engine, source.id, "kill -USR1 $(cat /tmp/mapper.pid)")
            wait_until(lambda: host_file.read_bytes()[0] == letter,  # noqa: B023
                       what="the mapper's write")
            after = os.stat(host_file)
            if (after.st_mtime_ns, after.st_ctime_ns) == (before.st_mtime_ns,
                                                         before.st_ctime_ns):
                break
        # The change could have gone unseen: the file's stamps are as they were.
        assert (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == (
            before.st_size, before.st_mtime_ns, before.st_ctime_ns)
        second = _fork_snapshot(engine, source)
        assert second != first
        fork = workspaces.create(WorkspaceSpec(owner="o", snapshot=second), engine.settings)
        try:
            assert _sh(engine, fork.id, "head -c 1 m.bin") == chr(letter)
        finally:
            workspaces.delete(fork.id, engine.settings)
    finally:
        workspaces.delete(source.id, engine.settings)


def test_a_fork_of_a_workspace_whose_limits_changed_takes_a_snapshot_anew(
    engine: Engine,
) -> None:
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    try:
        _sh(engine, source.id, "echo x > f")
        _past_the_margin(time.time())
        first = _fork_snapshot(engine, source)
        assert _fork_snapshot(engine, source) == first
        # What a fork takes from its workspace besides files (here its limits) changed.
        record = workspaces.load(source.id, engine.settings)
        changed = record.model_copy(update={"limits": record.limits.model_copy(
            update={"disk_mb": 4096})})
        workspaces.save(changed, engine.settings)
        again = _fork_snapshot(engine, source)
        assert again != first
        assert snapshot_store.load(again, engine.settings).limits.disk_mb == 4096
    finally:
        workspaces.delete(source.id, engine.settings)


#: What a workspace shows of its own files, to compare a fork with its source: every
#: entry of its directory with its kind, mode, link target and content, and /tmp/t.
SHOW = ("find . -mindepth 1 -printf '%y %m %p %l\\n' | sort; "
        "find . -type f | sort | xargs -r md5sum; cat /tmp/t")


def _own_layers(engine: Engine, snap_id: str, source: WorkspaceRecord) -> tuple[str, ...]:
    """The snapshots of `snap_id`'s chain that are its source's forks' own (the lowers
    its source stands on left out)."""
    layers = snapshot_store.load(snap_id, engine.settings).layers
    return layers[:len(layers) - len(source.lowers)]


def _sees_as_source(engine: Engine, source: WorkspaceRecord, snap_id: str,
                    made: list[str]) -> None:
    """A workspace made from `snap_id` shows what `source` shows now."""
    fork = workspaces.create(WorkspaceSpec(owner="o", snapshot=snap_id), engine.settings)
    made.append(fork.id)
    assert _sh(engine, fork.id, SHOW) == _sh(engine, source.id, SHOW)


def test_a_fork_of_a_changed_workspace_copies_only_what_changed_over_its_last_fork(
    engine: Engine,
) -> None:
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    made: list[str] = []
    try:
        _sh(engine, source.id, (
            "mkdir -p repo/old/deep repo/re repo/keep && echo a > repo/a && echo b > repo/b "
            "&& echo x > repo/old/deep/x && echo 1 > repo/re/one && echo 2 > repo/re/two "
            "&& echo f > repo/was_file && mkdir repo/was_dir && echo i > repo/was_dir/i "
            "&& for i in $(seq 50); do echo $i > repo/keep/$i; done && echo t > /tmp/t"))
        before = _sh(engine, source.id, SHOW)
        _past_the_margin(time.time())
        first = _fork_snapshot(engine, source)
        assert _own_layers(engine, first, source) == (first,)
        _sh(engine, source.id, (
            "echo A > repo/a && rm repo/b && rm -rf repo/old && rm -rf repo/re && mkdir repo/re "
            "&& echo 2 > repo/re/two && rm repo/was_file && mkdir repo/was_file "
            "&& echo n > repo/was_file/n && rm -rf repo/was_dir && echo d > repo/was_dir "
            "&& mkdir -p repo/new/sub && echo s > repo/new/sub/s && ln -s a repo/link "
            "&& chmod 700 repo/keep/7 && echo t2 > /tmp/t && rm -f ~/.bash_history"))
        second = _fork_snapshot(engine, source)
        # Thin: it stands on the first, and holds what changed, not the 49 files kept.
        assert _own_layers(engine, second, source) == (second, first)
        thin = snapshot_store.layer_path(engine.settings, second) / "work"
        kept = sorted(p.name for p in (thin / "repo" / "keep").iterdir())
        assert kept == ["7"]
        assert stat.S_ISCHR(os.lstat(thin / "repo" / "b").st_mode)  # a whiteout
        assert os.lstat(thin / "repo" / "b").st_rdev == 0
        _sees_as_source(engine, source, second, made)
        # The first fork's snapshot still shows the workspace as it was then.
        fork = workspaces.create(WorkspaceSpec(owner="o", snapshot=first), engine.settings)
        made.append(fork.id)
        assert _sh(engine, fork.id, SHOW) == before
        # What changed just before the second fork was too young to be trusted (unless
        # this machine took longer than the margin to get to the fork): the next fork
        # copies it again, over the second; once all is older than the margin, a fork
        # stands on the last one.
        remembered = snapshots._last_forks.last(source.id)
        assert remembered is not None and remembered.snap_id == second
        young = any(stamp[fork_reuse.CTIME_AT] == fork_reuse.UNTRUSTED_CTIME
                    for listing in remembered.listings.values()
                    for stamp, _ in listing.values())
        third = _fork_snapshot(engine, source)
        assert _own_layers(engine, third, source) == (
            (third, second, first) if young else (second, first))
        _past_the_margin(time.time())
        fourth = _fork_snapshot(engine, source)
        assert _fork_snapshot(engine, source) == fourth
        _sees_as_source(engine, source, fourth, made)
        # A chain is at most MAX_CHAIN deep: past it, a change takes a whole copy.
        chain = _own_layers(engine, fourth, source)
        while len(chain) < fork_delta.MAX_CHAIN:
            _sh(engine, source.id, f"echo {len(chain)} > repo/a")
            chain = _own_layers(engine, _fork_snapshot(engine, source), source)
        _sh(engine, source.id, "echo AA > repo/a")
        whole = _fork_snapshot(engine, source)
        assert _own_layers(engine, whole, source) == (whole,)
        _sees_as_source(engine, source, whole, made)
        # A chain goes when nothing stands on it any more, its base once its top went.
        for ws_id in made:
            workspaces.delete(ws_id, engine.settings)
        made.clear()
        later = time.time() + snapshots.HIDDEN_GRACE_S + 1
        gone = {r.id for r in snapshots.collect(engine.settings, now=later)}
        assert {first, second, third, fourth, *chain, whole} <= gone
        assert not snapshot_store.local_records(engine.settings)
    finally:
        for ws_id in made:
            workspaces.delete(ws_id, engine.settings)
        workspaces.delete(source.id, engine.settings)


def test_a_fork_over_an_opaque_directory_takes_a_whole_copy(engine: Engine) -> None:
    base = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    made: list[str] = []
    try:
        _sh(engine, base.id, "mkdir -p repo/d && echo old > repo/d/old")
        snap, _ = snapshots.take(base, engine.settings)
        source = workspaces.create(WorkspaceSpec(owner="o", snapshot=snap.id), engine.settings)
        made.append(source.id)
        # A directory of the snapshot beneath removed and made again: the overlay marks
        # the new one opaque (nothing beneath shows through it).
        _sh(engine, source.id, "rm -rf repo/d && mkdir repo/d && echo p > repo/d/p "
            "&& echo q > repo/d/q")
        upper = Path(workspaces.load(source.id, engine.settings).host_dir())
        assert any(a.endswith("overlay.opaque") for a in os.listxattr(upper / "repo" / "d")), \
            "the overlay did not mark the directory opaque"
        _past_the_margin(time.time())
        _fork_snapshot(engine, source)
        _sh(engine, source.id, "echo P > repo/d/p")
        # A thin layer would make that directory, opaque as its source is, over the first
        # fork's: q would be hidden. A whole copy is taken instead.
        second = _fork_snapshot(engine, source)
        assert _own_layers(engine, second, source) == (second,)
        fork = workspaces.create(WorkspaceSpec(owner="o", snapshot=second), engine.settings)
        made.append(fork.id)
        assert _sh(engine, fork.id, "ls repo/d && cat repo/d/p").split() == ["p", "q", "P"]
    finally:
        for ws_id in reversed(made):
            workspaces.delete(ws_id, engine.settings)
        workspaces.delete(base.id, engine.settings)


def test_a_project_workspace_cannot_be_snapshotted(engine: Engine, tmp_path: Path) -> None:
    del tmp_path
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    try:
        workspaces.save(source.model_copy(update={"fresh": False}), engine.settings)
        with pytest.raises(snapshot_store.SnapshotError) as caught:
            snapshots.take(workspaces.load(source.id, engine.settings), engine.settings)
        assert caught.value.kind == "invalid" and "path=" in caught.value.message
        assert not any(snapshot_store.snapshots_dir(engine.settings).glob("s*"))
    finally:
        workspaces.save(source, engine.settings)
        workspaces.delete(source.id, engine.settings)


def test_restore_puts_the_files_back_and_ends_the_processes(engine: Engine) -> None:
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    try:
        _sh(engine, source.id, "echo good > f; mkdir -p d && echo keep > d/k")
        snap, _ = snapshots.take(source, engine.settings)
        engine.run("sleep 300 >/dev/null 2>&1 & echo bg", workspace=source.id, cwd=None,
                   owner="o")
        _sh(engine, source.id, "echo bad > f; rm -r d; echo extra > x")
        assert workspaces.processes(workspaces.load(source.id, engine.settings))
        restored, ended = workspaces.restore(source.id, snap.id, engine.settings)
        assert ended >= 1 and restored.id == source.id and restored.path == source.path
        assert not workspaces.processes(restored)
        assert _sh(engine, source.id, "cat f d/k; ls").split() == ["good", "keep", "d", "f"]
        # A restore twice over (its own snapshot under it again) stays right.
        _sh(engine, source.id, "echo again > f")
        restored, _ = workspaces.restore(source.id, snap.id, engine.settings)
        assert _sh(engine, source.id, "cat f").strip() == "good"
        # Another owner's snapshot is not this workspace's to restore to.
        other = workspaces.create(WorkspaceSpec(owner="p"), engine.settings)
        try:
            with pytest.raises(workspaces.WorkspaceError) as caught:
                workspaces.restore(other.id, snap.id, engine.settings)
            assert caught.value.kind == "not_found"
        finally:
            workspaces.delete(other.id, engine.settings)
    finally:
        workspaces.delete(source.id, engine.settings)


def _cgroup_named_for(record: WorkspaceRecord) -> list[str]:
    """The directories of the workspace's cgroup that are not named `ws-<its id>` or do
    not hold its keeper (deploy/OPERATIONS.md: an operator finds it by that name)."""
    wrong = []
    for path in record.cgroup:
        procs = (Path(path) / "cgroup.procs").read_text().split()
        if Path(path).name != f"ws-{record.id}" or str(record.keeper_pid) not in procs:
            wrong.append(path)
    return wrong


@needs_cgroups
def test_each_workspace_cgroup_is_named_for_it_however_it_was_made(engine: Engine) -> None:
    """A fresh workspace and a fork take the id their blank keeper's cgroup was named
    for; a restore keeps its workspace's id on a new keeper, whose cgroup is renamed."""
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    try:
        assert source.cgroup and _cgroup_named_for(source) == []
        snap, _ = snapshots.take(source, engine.settings)
        fork = workspaces.create(WorkspaceSpec(owner="o", snapshot=snap.id), engine.settings)
        try:
            assert fork.cgroup and _cgroup_named_for(fork) == []
        finally:
            workspaces.delete(fork.id, engine.settings)
        restored, _ = workspaces.restore(source.id, snap.id, engine.settings)
        assert restored.keeper_pid != source.keeper_pid
        assert restored.cgroup and _cgroup_named_for(restored) == []
    finally:
        workspaces.delete(source.id, engine.settings)


def test_the_reaper_leaves_a_workspace_held_for_a_change(engine: Engine) -> None:
    """A restore ends the old keeper before it starts the new one: in between, to the
    host supervisor's reaper, the workspace looks like one whose sandbox ended."""
    ws = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    try:
        assert ws.keeper_pid is not None
        with store.changing(engine.settings, ws.id) as held:
            assert held
            os.kill(ws.keeper_pid, signal.SIGKILL)
            wait_until(lambda: not usage.keeper_alive(ws), what="its keeper's end")
            assert workspaces.reap(engine.settings) == []
            assert workspaces.record_path(engine.settings, ws.id).exists()
            assert workspaces.state_path(engine.settings, ws.id).is_dir()
        # Let go of, it is what it looks like: reaped.
        assert [r.id for r in workspaces.reap(engine.settings)] == [ws.id]
        assert not workspaces.record_path(engine.settings, ws.id).exists()
        assert not store.lock_path(engine.settings, ws.id).exists()
    finally:
        workspaces.delete(ws.id, engine.settings)


def test_a_snapshot_waits_for_a_change_of_its_workspace(engine: Engine) -> None:
    """A snapshot never copies layers a restore or a deletion is removing: it waits, then
    takes the workspace as it is."""
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    taken: list[str] = []
    try:
        _sh(engine, source.id, "echo kept > f")
        with store.changing(engine.settings, source.id):
            thread = threading.Thread(target=lambda: taken.append(
                snapshots.take(source, engine.settings)[0].id))
            thread.start()
            thread.join(timeout=1.0)
            assert thread.is_alive() and taken == []  # held: it waits
        thread.join(timeout=60)
        assert len(taken) == 1
        layer = snapshot_store.layer_path(engine.settings, taken[0])
        assert (layer / "work" / "f").read_text() == "kept\n"
        workspaces.delete(source.id, engine.settings)
        with pytest.raises(snapshot_store.SnapshotError) as caught:
            snapshots.take(source, engine.settings)
        assert caught.value.kind == "not_found"
    finally:
        workspaces.delete(source.id, engine.settings)


def test_restores_beside_a_reaper_that_never_stops(engine: Engine) -> None:
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    stop = threading.Event()
    reaped: list[str] = []

    def reaper() -> None:
        while not stop.is_set():
            reaped.extend(r.id for r in workspaces.reap(engine.settings))

    try:
        _sh(engine, source.id, "echo good > f")
        snap, _ = snapshots.take(source, engine.settings)
        thread = threading.Thread(target=reaper, daemon=True)
        thread.start()
        try:
            for _ in range(8):
                _sh(engine, source.id, "echo bad > f")
                workspaces.restore(source.id, snap.id, engine.settings)
                assert _sh(engine, source.id, "cat f").strip() == "good"
        finally:
            stop.set()
            thread.join(timeout=60)
        assert reaped == []
    finally:
        workspaces.delete(source.id, engine.settings)


def _held(engine: Engine, ws_id: str) -> bool:
    """Whether someone holds the workspace for a change now."""
    with store.changing(engine.settings, ws_id, wait=False) as free:
        return not free


def test_a_fork_deleted_is_gone_at_the_answer_and_its_end_finished_under_its_lock(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """`delete(finish_later=True)` answers once the fork is gone for every caller; until
    its files are removed it keeps the lock, its snapshot is still in use, and the reaper
    leaves it. Its files' removal is held here, so each of these is seen, not raced."""
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    release = threading.Event()
    real_remove = disk.remove_files

    def held_remove(record: WorkspaceRecord, settings: Settings) -> None:
        release.wait(60)
        real_remove(record, settings)

    try:
        _sh(engine, source.id, "echo one > f")
        snap, _ = snapshots.take(source, engine.settings)
        fork = workspaces.create(WorkspaceSpec(owner="o", snapshot=snap.id), engine.settings)
        _sh(engine, fork.id, "echo mine > g")
        state = workspaces.state_path(engine.settings, fork.id)
        assert fork.dir is not None and (Path(fork.dir) / "g").exists() and state.is_dir()
        assert snapshots.remove(snap.id, engine.settings)  # kept: the fork stands on it
        monkeypatch.setattr(disk, "remove_files", held_remove)
        assert workspaces.delete(fork.id, engine.settings, finish_later=True) is True
        with pytest.raises(store.WorkspaceError):
            store.load(fork.id, engine.settings)
        assert fork.id not in [r.id for r in workspaces.local_records(engine.settings)]
        assert _held(engine, fork.id)
        # A second deletion (any change of it) waits for the first to be finished.
        again: list[bool] = []
        second = threading.Thread(target=lambda: again.append(workspaces.delete(
            fork.id, engine.settings, finish_later=True)))
        second.start()
        second.join(timeout=0.5)
        assert second.is_alive() and again == []
        assert store.ending_path(engine.settings, fork.id).exists() and state.is_dir()
        assert workspaces.reap(engine.settings) == []
        snapshots.collect(engine.settings)
        assert snapshot_store.layer_path(engine.settings, snap.id).is_dir()
        release.set()
        second.join(timeout=60)
        assert again == [False]
        wait_until(lambda: not _held(engine, fork.id), what="the deletion's end")
        assert fork.keeper_pid is not None and not usage.keeper_alive(fork)
        assert not state.exists() and not Path(fork.dir).exists()
        assert not store.ending_path(engine.settings, fork.id).exists()
        assert [r.id for r in snapshots.collect(engine.settings)] == [snap.id]
    finally:
        release.set()
        workspaces.delete(source.id, engine.settings)


def test_the_reaper_finishes_a_deletion_its_process_left_half_done(engine: Engine) -> None:
    """A process that set a record aside and died before the files went: the reaper ends
    the rest."""
    ws = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    try:
        _sh(engine, ws.id, "echo f > f")
        state = workspaces.state_path(engine.settings, ws.id)
        assert ws.keeper_pid is not None and state.is_dir()
        os.kill(ws.keeper_pid, signal.SIGKILL)
        os.replace(store.record_path(engine.settings, ws.id),
                   store.ending_path(engine.settings, ws.id))
        wait_until(lambda: not usage.keeper_alive(ws), what="its keeper's end")
        assert state.is_dir() and Path(ws.path).is_dir()
        assert [r.id for r in workspaces.reap(engine.settings)] == [ws.id]
        assert not state.exists() and not Path(ws.path).exists()
        assert not store.ending_path(engine.settings, ws.id).exists()
        assert not store.lock_path(engine.settings, ws.id).exists()
    finally:
        workspaces.delete(ws.id, engine.settings)


@needs_cgroups
def test_a_deletion_whose_cgroup_still_holds_a_process_leaves_it_to_the_reaper(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process the keeper's end did not take (here one of the host's, moved into the
    workspace's cgroup) keeps the group from going: the record stays set aside, gone for
    every caller, and the reaper removes the group once it is empty. Before, the record
    went with the files and the group was nobody's for good."""
    monkeypatch.setattr(lifecycle, "CGROUP_GONE_S", 0.2, raising=False)
    ws = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    lodger = subprocess.Popen(["sleep", "600"])
    try:
        assert ws.cgroup and all(os.path.isdir(path) for path in ws.cgroup)
        for path in ws.cgroup:
            Path(path, "cgroup.procs").write_text(str(lodger.pid))
        state = workspaces.state_path(engine.settings, ws.id)
        assert workspaces.delete(ws.id, engine.settings) is True
        with pytest.raises(store.WorkspaceError):
            store.load(ws.id, engine.settings)
        assert ws.id not in [r.id for r in workspaces.local_records(engine.settings)]
        assert not state.exists()
        assert all(os.path.isdir(path) for path in ws.cgroup)
        assert store.ending_path(engine.settings, ws.id).exists()
        assert workspaces.reap(engine.settings) == []  # still held: left for the next pass
        assert all(os.path.isdir(path) for path in ws.cgroup)
        lodger.kill()
        lodger.wait()
        assert [r.id for r in workspaces.reap(engine.settings)] == [ws.id]
        assert not any(os.path.exists(path) for path in ws.cgroup)
        assert not store.ending_path(engine.settings, ws.id).exists()
        assert not store.lock_path(engine.settings, ws.id).exists()
    finally:
        lodger.kill()
        lodger.wait()
        workspaces.delete(ws.id, engine.settings)
        workspaces.finish_endings(engine.settings)


@needs_cgroups
def test_a_restore_whose_old_cgroup_still_holds_a_process_sets_it_aside_for_the_reaper(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process the old keeper's end did not take (here one of the host's, moved into
    the workspace's cgroup) keeps that group from going. The restore still succeeds:
    the old group steps aside under a name of its own, with a note the reaper removes
    it by once it is empty, and the new keeper's group takes the workspace's name.
    Before, the restore failed making a group of the same name, and the old group was
    nobody's for good."""
    monkeypatch.setattr(lifecycle, "CGROUP_GONE_S", 0.2, raising=False)
    ws = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    lodger = subprocess.Popen(["sleep", "600"])

    def notes() -> list[Path]:
        return sorted(engine.settings.workspaces_dir.glob("*.held-cgroup"))

    try:
        _sh(engine, ws.id, "echo good > f")
        snap, _ = snapshots.take(ws, engine.settings)
        _sh(engine, ws.id, "echo bad > f")
        assert ws.cgroup
        for path in ws.cgroup:
            Path(path, "cgroup.procs").write_text(str(lodger.pid))
        restored, _ = workspaces.restore(ws.id, snap.id, engine.settings)
        assert _sh(engine, ws.id, "cat f").strip() == "good"
        assert _cgroup_named_for(restored) == []
        assert len(notes()) == 1
        held = json.loads(notes()[0].read_text())["cgroup"]
        assert [path.rsplit("-held-", 1)[0] for path in held] == list(ws.cgroup)
        assert all(str(lodger.pid) in Path(path, "cgroup.procs").read_text().split()
                   for path in held)
        assert workspaces.reap(engine.settings) == []  # still held: left for the next pass
        assert len(notes()) == 1 and all(os.path.isdir(path) for path in held)
        lodger.kill()
        lodger.wait()
        workspaces.reap(engine.settings)
        assert notes() == [] and not any(os.path.exists(path) for path in held)
        assert _cgroup_named_for(workspaces.load(ws.id, engine.settings)) == []
    finally:
        lodger.kill()
        lodger.wait()
        workspaces.delete(ws.id, engine.settings)
        workspaces.remove_held_groups(engine.settings)


def test_ending_a_host_finishes_the_deletions_its_worker_left_half_done(
        engine: Engine) -> None:
    """`bashfleet down` (teardown.end_host) after a worker stopped while a deletion it had
    answered went on behind: the rest is done then, cgroup included."""
    ws = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    state = workspaces.state_path(engine.settings, ws.id)
    assert ws.keeper_pid is not None and state.is_dir()
    os.kill(ws.keeper_pid, signal.SIGKILL)
    os.replace(store.record_path(engine.settings, ws.id),
               store.ending_path(engine.settings, ws.id))
    wait_until(lambda: not usage.keeper_alive(ws), what="its keeper's end")
    ended = teardown.end_host(engine.settings)
    assert ended.workspaces == 1
    assert not state.exists() and not Path(ws.path).exists()
    assert not store.ending_path(engine.settings, ws.id).exists()
    assert not any(os.path.exists(path) for path in ws.cgroup)


def test_a_workspace_past_its_disk_cap_is_not_snapshotted(engine: Engine) -> None:
    source = workspaces.create(WorkspaceSpec(owner="o", limits={"disk_mb": 1}),
                               engine.settings)
    try:
        _sh(engine, source.id, "head -c 3000000 /dev/zero > big")
        with pytest.raises(snapshot_store.SnapshotError) as caught:
            snapshots.take(source, engine.settings)
        assert caught.value.kind == "limit" and "disk cap of 1 MiB" in caught.value.message
        assert not any(snapshot_store.snapshots_dir(engine.settings).glob("*"))
        _sh(engine, source.id, "rm big")  # unharmed: once under its cap, it may be taken
        snap, _ = snapshots.take(source, engine.settings)
        assert snapshot_store.layer_path(engine.settings, snap.id).is_dir()
    finally:
        workspaces.delete(source.id, engine.settings)


@pytest.fixture(name="images_engine")
def _images_engine_fixture(tmp_path: Path, janitor: Janitor,
                           image_registry: Registry) -> Iterator[Engine]:
    with engine_with(tmp_path, janitor, registry_auth_file=image_registry.auth_file,
                     registry_certs_dir=image_registry.certs_dir) as made:
        yield made


def test_a_snapshot_of_an_image_workspace_forks_on_its_image(
        images_engine: Engine, registry_images: dict[str, str]) -> None:
    """Its base is the image by digest; gone from the host, it is pulled again (the
    snapshot's files over it); gone from its registry too, a clear error."""
    engine = images_engine
    source = workspaces.create(WorkspaceSpec(owner="o", image=registry_images["debian"]),
                               engine.settings)
    try:
        _sh(engine, source.id, "echo on-image > /root/mine; rm /etc/issue")
        snap, _ = snapshots.take(source, engine.settings)
        assert snap.image is not None and snap.base().endswith(snap.image.digest)
        fork = workspaces.create(WorkspaceSpec(owner="o", snapshot=snap.id), engine.settings)
        try:
            assert fork.image is not None and fork.image.digest == snap.image.digest
            seen = _sh(engine, fork.id, "cat /root/mine; test -e /etc/issue || echo gone; "
                       "cat /etc/debian_version")
            assert seen.split()[:2] == ["on-image", "gone"]
        finally:
            workspaces.delete(fork.id, engine.settings)
        # Its image gone from the host (no workspace uses it once the source goes): a
        # new workspace from the snapshot pulls it again, by digest.
        workspaces.delete(source.id, engine.settings)
        busy = images.in_use(engine.settings) - {snap.image.digest}
        assert images.remove(snap.image.digest, engine.settings, busy)
        again = workspaces.create(WorkspaceSpec(owner="o", snapshot=snap.id), engine.settings)
        try:
            assert _sh(engine, again.id, "cat /root/mine").strip() == "on-image"
        finally:
            workspaces.delete(again.id, engine.settings)
        # A pinned image its registry no longer has (and this host not either): said so.
        gone = snap.image.model_copy(update={"digest": "sha256:" + "0" * 64})
        snapshot_store.save(snap.model_copy(update={"image": gone}), engine.settings)
        with pytest.raises(workspaces.WorkspaceError) as caught:
            workspaces.create(WorkspaceSpec(owner="o", snapshot=snap.id), engine.settings)
        assert f"snapshot {snap.id} stands on image" in caught.value.message
        assert not [r for r in workspaces.local_records(engine.settings) if r.owner == "o"]
    finally:
        workspaces.delete(source.id, engine.settings)


def test_files_that_come_and_go_while_it_copies_never_fail_a_snapshot(engine: Engine) -> None:
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    try:
        churn = engine.run("(while :; do for i in $(seq 200); do echo x > /tmp/churn.$i; done; "
                           "rm -f /tmp/churn.*; done) >/dev/null 2>&1 & echo started",
                           workspace=source.id, cwd=None, owner="o")
        assert churn.exit_code == 0
        for _ in range(5):
            snap, _ = snapshots.take(source, engine.settings)
            # The snapshot is the instant it was frozen at: never a file half there.
            fork = workspaces.create(WorkspaceSpec(owner="o", snapshot=snap.id), engine.settings)
            try:
                sizes = _sh(engine, fork.id, "cat /tmp/churn.* 2>/dev/null | sort -u").strip()
                assert sizes in ("", "x")
            finally:
                workspaces.delete(fork.id, engine.settings)
    finally:
        workspaces.delete(source.id, engine.settings)


#: A tenant's job against the copy: `p` (its own directory, whose `etc/` holds a file
#: named as the host's secret) and `q` (a link to the host's `/`) exchanged for ever
#: (renameat2 RENAME_EXCHANGE): a copy that walks `p/etc/NAME` by path while the
#: workspace runs reads the host's `/etc/NAME` half of the time.
SWAPPER = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("p/etc", exist_ok=True)
for i in range(300):
    open(f"p/etc/{i:03}", "w").write("mine")
open("p/etc/NAME", "w").write("mine")
os.symlink("HOST", "q")
open("swapping", "w").close()
while True:
    libc.syscall(316, -100, b"p", -100, b"q", 2)  # renameat2(..., RENAME_EXCHANGE)
"""


def test_a_directory_swapped_for_a_link_mid_copy_brings_no_host_file_into_a_fork(
        engine: Engine, tmp_path: Path) -> None:
    name = f"bf-secret-{os.urandom(4).hex()}"
    # A host directory that holds an `etc/` with a file only the host's root reads: the
    # link the swapper puts in the copy's way points there. Not `/` itself: a copy that
    # went through such a link would copy the whole host, /proc included (a read of
    # /proc/kmsg never ends).
    host = tmp_path / "host"
    (host / "etc").mkdir(parents=True)
    secret = host / "etc" / name
    secret.write_text("host root's only\n")
    secret.chmod(0o600)
    source = workspaces.create(WorkspaceSpec(owner="o"), engine.settings)
    try:
        (Path(source.path) / "swap.py").write_text(
            SWAPPER.replace("NAME", name).replace("HOST", str(host)))
        assert _sh(engine, source.id, "nohup python3 swap.py >/dev/null 2>&1 & "
                   "while [ ! -e swapping ]; do sleep 0.05; done; echo swapping") == "swapping\n"
        # The attack works on a copy as the host's root by path (what snapshots were).
        hits = 0
        for attempt in range(30):
            copy = tmp_path / f"cp{attempt}"
            subprocess.run(["cp", "-a", "-T", source.path, str(copy)], check=False,
                           capture_output=True)
            leaked = [copy / "p" / "etc" / name, copy / "q" / "etc" / name]
            hits += any(p.is_file() and not p.is_symlink() and "host root" in p.read_text()
                        for p in leaked)
            subprocess.run(["rm", "-rf", str(copy)], check=True)
            if hits:
                break
        assert hits, "the swap never raced a path-walking copy: the probe proves nothing"
        taken = 0
        for _ in range(20):
            if taken == 5:
                break
            try:
                snap, _ = snapshots.take(source, engine.settings)
            except snapshot_store.SnapshotError as exc:
                # The swapper may still outrun a copy: refused whole, never a host byte.
                assert "changed while it was copied" in str(exc), exc
                continue
            taken += 1
            fork = workspaces.create(WorkspaceSpec(owner="o", snapshot=snap.id), engine.settings)
            try:
                seen = engine.run(f"cat p/etc/{name} q/etc/{name} 2>&1; "
                                  "grep -rl 'host root' . 2>/dev/null | head -3",
                                  workspace=fork.id, cwd=None, owner="o")
                assert "host root" not in seen.stdout, seen.stdout
                layer = snapshot_store.layer_path(engine.settings, snap.id)
                found = subprocess.run(["grep", "-rl", "--no-messages", "host root", str(layer)],
                                       capture_output=True, text=True, check=False).stdout
                assert found == "", found
            finally:
                workspaces.delete(fork.id, engine.settings)
        assert taken == 5, "no snapshot could be taken under the swapper"
    finally:
        workspaces.delete(source.id, engine.settings)
        secret.unlink()

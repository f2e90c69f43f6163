"""bashfleet.worker.engine.cgroups: reading /proc, where groups go, what is written into them.

The file-system parts run on a directory tree that stands in for cgroupfs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from privilege import require_root

from bashfleet.worker.engine import cgroups
from bashfleet.worker.engine.cgroups import CgroupLimits, Hierarchy, Mount, Plan, Support

# This development VM: cgroup v1 per controller, an empty v2 tree at .../unified.
V1_CGROUP = """\
9:name=systemd:/
8:pids:/
4:memory:/process_api/abc
2:cpu,cpuacct:/svc
0::/
"""
V1_MOUNTINFO = """\
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
35 30 0:31 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
36 30 0:32 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
"""
# A systemd host with cgroup v2 only; the worker in its (delegated) service's cgroup.
V2_CGROUP = "0::/system.slice/bashfleet.service\n"
V2_MOUNTINFO = "29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_parse_proc_cgroup() -> None:
    assert cgroups.parse_proc_cgroup(V1_CGROUP) == {
        "name=systemd": "/", "pids": "/", "memory": "/process_api/abc", "cpu": "/svc",
        "cpuacct": "/svc", "": "/",
    }
    assert cgroups.parse_proc_cgroup(V2_CGROUP + "garbage\n") == {
        "": "/system.slice/bashfleet.service",
    }


def test_parse_mountinfo() -> None:
    assert cgroups.parse_mountinfo(V1_MOUNTINFO) == [
        Mount("/sys/fs/cgroup/unified", "v2", ()),
        Mount("/sys/fs/cgroup/cpu,cpuacct", "v1", ("cpu",)),
        Mount("/sys/fs/cgroup/memory", "v1", ("memory",)),
        Mount("/sys/fs/cgroup/pids", "v1", ("pids",)),
        Mount("/sys/fs/cgroup/systemd", "v1", ()),
    ]
    escaped = r"40 30 0:40 / /mnt/my\040cgroups rw - cgroup2 none rw" + "\n"
    assert cgroups.parse_mountinfo(escaped) == [Mount("/mnt/my cgroups", "v2", ())]


@pytest.mark.parametrize(
    ("cgroup", "mountinfo", "wanted", "expected"),
    [
        # Hybrid: v1 carries the controllers (the v2 tree has none of them).
        (V1_CGROUP, V1_MOUNTINFO, ("memory", "pids"), Plan("v1", (
            Hierarchy("/sys/fs/cgroup/memory/process_api/abc/bashfleet", ("memory",)),
            Hierarchy("/sys/fs/cgroup/pids/bashfleet", ("pids",)),
        ))),
        (V1_CGROUP, V1_MOUNTINFO, ("cpu",), Plan("v1", (
            Hierarchy("/sys/fs/cgroup/cpu,cpuacct/svc/bashfleet", ("cpu",)),
        ))),
        # Pure v2: one tree, under the worker's own cgroup.
        (V2_CGROUP, V2_MOUNTINFO, ("memory", "pids", "cpu"), Plan(
            "v2",
            (Hierarchy("/sys/fs/cgroup/system.slice/bashfleet.service/bashfleet",
                       ("memory", "pids", "cpu")),),
            owner="/sys/fs/cgroup/system.slice/bashfleet.service",
        )),
        ("0::/\n", V2_MOUNTINFO, ("pids",), Plan(
            "v2", (Hierarchy("/sys/fs/cgroup/bashfleet", ("pids",)),), owner="/sys/fs/cgroup",
        )),
        # Nothing wanted, nothing mounted.
        (V1_CGROUP, V1_MOUNTINFO, (), Plan(None, problem="no limit needs a cgroup")),
        ("", "", ("pids",), Plan(None, problem="no cgroup hierarchy with the pids controller")),
    ],
)
def test_plan(cgroup: str, mountinfo: str, wanted: tuple[str, ...], expected: Plan) -> None:
    assert cgroups.plan(cgroup, mountinfo, wanted) == expected


def test_plan_v1_without_a_controller_falls_back_to_the_v2_tree() -> None:
    mountinfo = "\n".join(line for line in V1_MOUNTINFO.splitlines() if "pids" not in line)
    laid_out = cgroups.plan(V1_CGROUP, mountinfo, ("pids",))
    assert laid_out.version == "v2"  # hybrid: `detect` then finds no pids controller there
    assert laid_out.hierarchies[0].base == "/sys/fs/cgroup/unified/bashfleet"


LIMITS = CgroupLimits(memory_bytes=256 << 20, pids=100, cpus=1.5)


@pytest.mark.parametrize(
    ("version", "controller", "files"),
    [
        ("v1", "memory", [("memory.limit_in_bytes", "268435456"),
                          ("memory.memsw.limit_in_bytes", "268435456")]),
        ("v2", "memory", [("memory.max", "268435456"), ("memory.swap.max", "0")]),
        ("v1", "pids", [("pids.max", "100")]),
        ("v2", "pids", [("pids.max", "100")]),
        ("v1", "cpu", [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "150000")]),
        ("v2", "cpu", [("cpu.max", "150000 100000")]),
    ],
)
def test_limit_files(version: str, controller: str, files: list[tuple[str, str]]) -> None:
    assert cgroups.limit_files(version, controller, LIMITS) == files  # type: ignore[arg-type]
    assert cgroups.limit_files(version, controller, CgroupLimits()) == []  # type: ignore[arg-type]


def test_limits_say_which_controllers_they_need() -> None:
    assert LIMITS.controllers() == ("memory", "pids", "cpu")
    assert CgroupLimits(pids=5).controllers() == ("pids",)
    assert CgroupLimits().controllers() == ()


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        ("low 0\nhigh 0\nmax 12\noom 1\noom_kill 3\n", "oom_kill", 3),
        ("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n", "oom_kill", 2),
        ("max 7\n", "max", 7),
        ("max 7\n", "oom_kill", 0),
        ("", "max", 0),
    ],
)
def test_read_counter(text: str, key: str, value: int) -> None:
    assert cgroups.read_counter(text, key) == value


def test_counter_files() -> None:
    assert cgroups.counter_files("v2", "memory") == [("memory.events", "oom_kill")]
    assert cgroups.counter_files("v1", "memory") == [("memory.oom_control", "oom_kill")]
    assert cgroups.counter_files("v1", "pids") == [("pids.events", "max")]
    assert cgroups.counter_files("v2", "cpu") == []


def test_join_line() -> None:
    assert cgroups.join_line([]) == ""
    line = cgroups.join_line([201, 202])
    first, second, end = line.split("\n")
    assert first.startswith("echo 0 >&201 && echo 0 >&202 || {")
    assert "exit 126" in first
    assert (second, end) == ("exec 201>&- 202>&-", "")


# --------------------------------------------------------------- on a stand-in tree


@pytest.fixture(name="support")
def _support_fixture(tmp_path: Path) -> Support:
    base = tmp_path / "pids" / "bashfleet"
    base.mkdir(parents=True)
    return Support("v1", (Hierarchy(str(base), ("pids",)),))


def test_create_writes_the_limits_and_counts_hits(support: Support) -> None:
    group = cgroups.create(support, CgroupLimits(pids=42), owner=4242)
    (path, controllers), = group.paths
    assert Path(path).name.startswith("4242-") and controllers == ("pids",)
    assert (Path(path) / "pids.max").read_text() == "42"
    assert group.hits() == ()
    (Path(path) / "pids.events").write_text("max 3\n")
    assert group.hits() == ("pids",)
    assert group.hits() == ()  # counted once


def test_create_refuses_without_support() -> None:
    with pytest.raises(OSError, match="nope"):
        cgroups.create(Support(None, problem="nope"), CgroupLimits(pids=1))


def test_pool_reuses_empty_groups_only(support: Support) -> None:
    pool = cgroups.GroupPool(support, CgroupLimits(pids=8), max_idle=1)
    group = pool.acquire()
    procs = Path(group.paths[0][0]) / "cgroup.procs"
    procs.write_text("")
    pool.release(group)
    assert pool.acquire() is group  # empty: reused
    procs.write_text("1234\n")  # a daemon of the last call is still in it
    pool.release(group)
    assert pool.acquire() is not group


def test_sweep_removes_empty_groups_of_dead_owners(support: Support) -> None:
    base = Path(support.hierarchies[0].base)
    for name in ("111-1", "222-1", "not-ours"):
        (base / name).mkdir()
    removed = cgroups.sweep(support, alive=lambda pid: pid == 222)
    assert removed == 1
    assert sorted(p.name for p in base.iterdir()) == ["222-1", "not-ours"]


def test_a_cgroup_not_marked_as_delegated_is_not_ours_as_root(tmp_path: Path) -> None:
    (tmp_path / "cgroup.procs").write_text("")
    assert cgroups.delegated(str(tmp_path)) == (os.geteuid() != 0)


def _v2_owner(tmp_path: Path, procs: str) -> tuple[Path, Plan]:
    owner = tmp_path / "bashfleet.service"
    owner.mkdir()
    (owner / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (owner / "cgroup.subtree_control").write_text("\n")
    (owner / "cgroup.procs").write_text(procs)
    laid_out = Plan("v2", (Hierarchy(str(owner / "bashfleet"), ("memory", "pids")),),
                    owner=str(owner))
    return owner, laid_out


def test_v2_delegated_cgroup_is_prepared(tmp_path: Path) -> None:
    owner, laid_out = _v2_owner(tmp_path, "")
    try:
        os.setxattr(owner, "user.delegate", b"1")
    except OSError:
        pytest.skip("no user xattrs on this file system")
    cgroups._prepare_v2(laid_out)
    # Controllers handed down to `bashfleet`, and by it to the groups it will hold.
    assert (owner / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (owner / "bashfleet" / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (owner / "bashfleet-worker").is_dir()


def test_v2_refuses_a_cgroup_not_delegated(tmp_path: Path) -> None:
    owner, laid_out = _v2_owner(tmp_path, "123\n")
    require_root("as another user the directory counts as delegated")
    with pytest.raises(OSError, match="not delegated"):
        cgroups._prepare_v2(laid_out)
    assert (owner / "cgroup.subtree_control").read_text() == "\n"  # untouched


def test_v2_refuses_missing_controllers(tmp_path: Path) -> None:
    owner, laid_out = _v2_owner(tmp_path, "")
    (owner / "cgroup.controllers").write_text("cpu io\n")
    with pytest.raises(OSError, match="not delegated"):
        cgroups._prepare_v2(laid_out)


def test_members_are_the_pids_of_a_group_and_of_the_groups_beneath_it(tmp_path: Path) -> None:
    group = tmp_path / "ws-1"
    (group / "call-a").mkdir(parents=True)
    (group / "cgroup.procs").write_text("10\n11\n")
    (group / "call-a" / "cgroup.procs").write_text("12\n")
    other = tmp_path / "freezer" / "ws-1"
    other.mkdir(parents=True)
    (other / "cgroup.procs").write_text("11\n13\n")
    # Every hierarchy's, once each.
    assert cgroups.members([str(group), str(other)]) == [10, 11, 12, 13]
    assert cgroups.members([]) is None
    assert cgroups.members([str(tmp_path / "gone")]) == []  # no group there: no process
    # A group beneath removed while it was read (its file gone) held no process.
    (group / "call-a" / "cgroup.procs").unlink()
    assert sorted(cgroups.members([str(group)]) or []) == [10, 11]
    (group / "call-a" / "cgroup.procs").write_text("not a pid\n")
    assert cgroups.members([str(group)]) is None  # what it cannot read: cannot tell
    (group / "call-a" / "cgroup.procs").write_text("12\n")
    (group / "cgroup.procs").unlink()
    assert cgroups.members([str(group)]) is None  # the group's own file gone: cannot tell

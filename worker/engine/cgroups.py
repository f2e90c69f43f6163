"""Per-call cgroups: memory, process and CPU caps, where the host lets the worker make them.

Where: under the worker's own cgroup (read from /proc/self/cgroup), in a `bashfleet`
directory, so whatever limits the worker itself lives under still bind its calls.

- cgroup v2 (most hosts today, under systemd): the worker's cgroup must be delegated to
  it (`Delegate=yes`). The v2 rule "no processes in a cgroup that hands controllers to
  its children" is met the way systemd documents: the worker's own processes move to a
  `bashfleet-worker` leaf beside `bashfleet`.
- cgroup v1 (as root): one directory per controller hierarchy (memory, pids, cpu).
- neither: the ulimit line (`bashfleet.worker.engine.limits`) is all there is.

Joining: the worker opens the group's `cgroup.procs` files and passes them on; whoever
gets them writes `0` (itself) into each before any process of the call exists, so none
can start outside (the kernel checks the credentials of whoever opened the file, not
the writer's). A sandbox runner joins its group once, and every bash it spawns is born
there; an unsandboxed call's command joins with its first line. Groups are named
`<owner pid>-<n>`: a worker sweeps away empty groups of owners that died.

Costs measured here (cgroup v1, memory + pids + cpu): making a group with its limits
0.16 ms, removing an empty one 0.02 ms; a sandbox runner keeps one group for all the
calls it serves, so a call pays neither.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from bashfleet.worker.engine.isolate.job_supervisor import open_procs_files
from bashfleet.worker.engine.mountinfo import unescape

#: Controllers a call's limits may need, and the limit each one carries.
CONTROLLERS = ("memory", "pids", "cpu")
GROUP_DIR = "bashfleet"
WORKER_LEAF = "bashfleet-worker"
CPU_PERIOD_US = 100_000
_GROUP_NAME = re.compile(r"(\d+)-\d+")


@dataclass(frozen=True)
class CgroupLimits:
    """What a call's cgroup caps; None: no cap (and no controller needed for it)."""

    memory_bytes: int | None = None
    pids: int | None = None
    cpus: float | None = None

    def controllers(self) -> tuple[str, ...]:
        """The controllers these limits need."""
        wanted = {"memory": self.memory_bytes, "pids": self.pids, "cpu": self.cpus}
        return tuple(name for name in CONTROLLERS if wanted[name] is not None)


@dataclass(frozen=True)
class Hierarchy:
    """One place groups are made: a v1 controller's hierarchy, or the v2 tree."""

    base: str
    """The directory groups go into (`.../bashfleet`)."""
    controllers: tuple[str, ...]
    """The controllers of ours it carries."""


@dataclass(frozen=True)
class Plan:
    """Where this process's groups would go, read from /proc alone (no checks yet)."""

    version: Literal["v1", "v2"] | None
    hierarchies: tuple[Hierarchy, ...] = ()
    problem: str | None = None
    owner: str = ""
    """v2: the worker's own cgroup directory (the parent of `bashfleet`)."""


# ---------------------------------------------------------------------- pure parsing


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup -> {controller: path}; the v2 line ("0::/path") under ""."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            found[""] = path
        for name in controllers.split(","):
            if name:
                found[name] = path
    return found


@dataclass(frozen=True)
class Mount:
    """A cgroup file system mount, from /proc/self/mountinfo."""

    point: str
    version: Literal["v1", "v2"]
    controllers: tuple[str, ...]
    """v1: the controllers mounted there (from the super options); v2: none listed."""


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup and cgroup2 mounts listed in /proc/self/mountinfo."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        point = unescape(fields[4])
        if tail[0] == "cgroup2":
            mounts.append(Mount(point, "v2", ()))
        elif tail[0] == "cgroup":
            names = tuple(o for o in tail[2].split(",") if o in (*CONTROLLERS, "freezer"))
            mounts.append(Mount(point, "v1", names))
    return mounts


def plan(cgroup_text: str, mountinfo_text: str, wanted: Iterable[str]) -> Plan:
    """Where groups with the `wanted` controllers would go: v2 on a pure v2 host (the tree
    at /sys/fs/cgroup) or where v1 lacks a wanted controller; else v1 (a hybrid host's
    v2 tree at /sys/fs/cgroup/unified has its controllers bound to v1)."""
    wanted = tuple(wanted)
    if not wanted:
        return Plan(None, problem="no limit needs a cgroup")
    own = parse_proc_cgroup(cgroup_text)
    mounts = parse_mountinfo(mountinfo_text)
    v2 = next((m for m in mounts if m.version == "v2"), None)
    v1 = _plan_v1(own, mounts, wanted)
    if v2 is not None and "" in own and (v1.problem is not None or v2.point == "/sys/fs/cgroup"):
        owner = _join(v2.point, own[""])
        return Plan("v2", (Hierarchy(_join(owner, GROUP_DIR), wanted),), owner=owner)
    return v1


def _plan_v1(own: Mapping[str, str], mounts: list[Mount], wanted: tuple[str, ...]) -> Plan:
    hierarchies: list[Hierarchy] = []
    for name in wanted:
        mount = next((m for m in mounts if m.version == "v1" and name in m.controllers), None)
        if mount is None or name not in own:
            return Plan(None, problem=f"no cgroup hierarchy with the {name} controller")
        hierarchies.append(Hierarchy(_join(_join(mount.point, own[name]), GROUP_DIR), (name,)))
    return Plan("v1", tuple(_merge(hierarchies)))


def _merge(hierarchies: list[Hierarchy]) -> Iterable[Hierarchy]:
    # Co-mounted controllers (cpu,cpuacct with cpu wanted twice, say) share one directory.
    by_base: dict[str, tuple[str, ...]] = {}
    for item in hierarchies:
        by_base[item.base] = by_base.get(item.base, ()) + item.controllers
    return (Hierarchy(base, names) for base, names in by_base.items())


def _join(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/")).rstrip("/") or "/"


def limit_files(version: Literal["v1", "v2"], controller: str,
                limits: CgroupLimits) -> list[tuple[str, str]]:
    """(file, value) to write into a new group for `controller`, in order."""
    if controller == "memory" and limits.memory_bytes is not None:
        size = str(limits.memory_bytes)
        if version == "v2":
            return [("memory.max", size), ("memory.swap.max", "0")]
        # v1: memsw (memory + swap) must be written after the memory limit it bounds.
        return [("memory.limit_in_bytes", size), ("memory.memsw.limit_in_bytes", size)]
    if controller == "pids" and limits.pids is not None:
        return [("pids.max", str(limits.pids))]
    if controller == "cpu" and limits.cpus is not None:
        quota = max(1000, int(limits.cpus * CPU_PERIOD_US))
        if version == "v2":
            return [("cpu.max", f"{quota} {CPU_PERIOD_US}")]
        return [("cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu.cfs_quota_us", str(quota))]
    return []


def counter_files(version: Literal["v1", "v2"], controller: str) -> list[tuple[str, str]]:
    """(file, key) of the counters that tell that a limit was hit."""
    if controller == "memory":
        return [("memory.events" if version == "v2" else "memory.oom_control", "oom_kill")]
    if controller == "pids":
        return [("pids.events", "max")]
    return []


def read_counter(text: str, key: str) -> int:
    """The value of `key` in a flat-keyed cgroup file ("key value" lines); 0 if absent."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


# --------------------------------------------------------------------------- the host


@dataclass(frozen=True)
class Support:
    """Whether this process can make cgroups, and where."""

    version: Literal["v1", "v2"] | None
    hierarchies: tuple[Hierarchy, ...] = ()
    problem: str | None = None


def _read(path: str) -> str:
    # os.open/os.read: a text file object costs ~15 us more per read, and a call reads
    # its group's counters after it ends.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 65536)]
        while chunks[-1]:
            chunks.append(os.read(fd, 65536))
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(value)


def detect(wanted: Iterable[str]) -> Support:
    """What this process can do, for groups with the `wanted` controllers.

    v2 may move the worker's own processes into a leaf (see the module docstring).
    """
    try:
        laid_out = plan(_read("/proc/self/cgroup"), _read("/proc/self/mountinfo"), wanted)
    except OSError as exc:
        return Support(None, problem=f"cannot read /proc: {exc}")
    if laid_out.version is None:
        return Support(None, problem=laid_out.problem)
    try:
        if laid_out.version == "v2":
            _prepare_v2(laid_out)
        else:
            for item in laid_out.hierarchies:
                os.makedirs(item.base, exist_ok=True)
        # A base left by an earlier worker proves nothing: a container's cgroup file
        # system is mounted read-only. Only a group made and removed does.
        for item in laid_out.hierarchies:
            trial = os.path.join(item.base, f"probe-{os.getpid()}")
            os.mkdir(trial)
            os.rmdir(trial)
    except OSError as exc:
        return Support(None, problem=f"cgroup {laid_out.version} not usable by this worker: {exc}")
    return Support(laid_out.version, laid_out.hierarchies)


def _prepare_v2(laid_out: Plan) -> None:
    """Controllers enabled for `bashfleet`'s children, the worker's processes moved out of
    its cgroup when they must be."""
    (item,) = laid_out.hierarchies
    owner = laid_out.owner
    available = _read(os.path.join(owner, "cgroup.controllers")).split()
    missing = [name for name in item.controllers if name not in available]
    if missing:
        raise OSError(errno.ENOTSUP, f"controllers {missing} are not delegated to "
                      f"{owner} (systemd: Delegate=yes)")
    enable = " ".join(f"+{name}" for name in item.controllers)
    enabled = set(_read(os.path.join(owner, "cgroup.subtree_control")).split())
    if not set(item.controllers) <= enabled:
        if owner != "/sys/fs/cgroup":
            if not delegated(owner):
                raise OSError(errno.EACCES, f"{owner} is not delegated to the worker "
                              "(systemd: Delegate=yes)")
            _move_own_processes(owner)
        _write(os.path.join(owner, "cgroup.subtree_control"), enable)
    os.makedirs(item.base, exist_ok=True)
    _write(os.path.join(item.base, "cgroup.subtree_control"), enable)


def delegated(owner: str) -> bool:
    """True when the cgroup `owner` is the worker's to divide: systemd marks delegated
    cgroups (`trusted.delegate`, `user.delegate`); a worker that is not root can only
    write there if it was delegated. Root in someone else's cgroup (a login session)
    must not move that session's processes."""
    for name in ("trusted.delegate", "user.delegate"):
        with contextlib.suppress(OSError):
            if os.getxattr(owner, name) == b"1":
                return True
    return os.geteuid() != 0 and os.access(os.path.join(owner, "cgroup.procs"), os.W_OK)


def _move_own_processes(owner: str) -> None:
    """Move every process of the worker's cgroup into its `bashfleet-worker` leaf."""
    leaf = os.path.join(owner, WORKER_LEAF)
    os.makedirs(leaf, exist_ok=True)
    for _ in range(5):  # processes forked meanwhile: go round again
        pids = _read(os.path.join(owner, "cgroup.procs")).split()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                _write(os.path.join(leaf, "cgroup.procs"), pid)


_serial = itertools.count(1)


@dataclass
class Group:
    """One cgroup (a directory per hierarchy) for the calls of a runner, or one call."""

    version: Literal["v1", "v2"]
    paths: list[tuple[str, tuple[str, ...]]]
    """(directory, its controllers)."""
    baseline: dict[str, int] = field(default_factory=dict)

    def procs_fds(self) -> list[int]:
        """Open `cgroup.procs` of each directory for writing (close-on-exec)."""
        return open_procs_files(path for path, _ in self.paths)

    def counters(self) -> dict[str, int]:
        """{controller: count of limit hits so far}."""
        counts: dict[str, int] = {}
        for path, names in self.paths:
            for name in names:
                for filename, key in counter_files(self.version, name):
                    with contextlib.suppress(OSError):
                        counts[name] = read_counter(_read(os.path.join(path, filename)), key)
        return counts

    def hits(self) -> tuple[str, ...]:
        """Controllers whose limit was hit since the last call to `hits` (or creation)."""
        now = self.counters()
        hit = tuple(name for name, count in now.items() if count > self.baseline.get(name, 0))
        self.baseline = now
        return hit

    def remove(self, timeout: float = 2.0) -> bool:
        """Remove the directories, waiting up to `timeout` for the last processes to go."""
        deadline = time.monotonic() + timeout
        left = [path for path, _ in self.paths]
        while left:
            left = [path for path in left if not _rmdir(path)]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return not left


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def create(support: Support, limits: CgroupLimits, *, owner: int | None = None,
           name: str | None = None) -> Group:
    """A new group with `limits` (OSError when the host refuses). `name`: a workspace's
    (`ws-<id>`: never swept for its maker's exit, it outlives the worker), else
    `<owner pid>-<serial>`."""
    if support.version is None:
        raise OSError(errno.ENOTSUP, support.problem or "no cgroups")
    name = name or f"{owner or os.getpid()}-{next(_serial)}"
    group = Group(support.version, [])
    try:
        for item in support.hierarchies:
            path = os.path.join(item.base, name)
            os.mkdir(path)
            group.paths.append((path, item.controllers))
            for controller in item.controllers:
                _write_limits(path, support.version, controller, limits)
    except OSError:
        group.remove(timeout=0)
        raise
    group.baseline = group.counters()
    return group


def write_limits(group: Group, limits: CgroupLimits) -> None:
    """Write `limits` into an existing group (a blank workspace's, once claimed)."""
    for path, controllers in group.paths:
        for controller in controllers:
            _write_limits(path, group.version, controller, limits)


def rename(group: Group, name: str) -> Group:
    """The group under a new name (rename(2) of its directories; its processes stay)."""
    paths = []
    for path, controllers in group.paths:
        target = os.path.join(os.path.dirname(path), name)
        os.rename(path, target)
        paths.append((target, controllers))
    return Group(group.version, paths, group.baseline)


def _write_limits(path: str, version: Literal["v1", "v2"], controller: str,
                  limits: CgroupLimits) -> None:
    for filename, value in limit_files(version, controller, limits):
        target = os.path.join(path, filename)
        if filename.startswith(("memory.memsw", "memory.swap")) and not os.path.exists(target):
            continue  # no swap accounting on this kernel
        _write(target, value)


def is_empty(group: Group) -> bool:
    """True when no process is in the group (a call's daemons may still be)."""
    try:
        return all(not _read(os.path.join(path, "cgroup.procs")).strip() for path, _ in group.paths)
    except OSError:
        return False


def members(paths: Iterable[str]) -> list[int] | None:
    """The pids in a group (its directories `paths`, one a hierarchy) and in the groups
    beneath it, in any of its hierarchies; None when a directory of it cannot be read
    (or it has none). A group beneath it removed meanwhile held none (only an empty
    group can be removed)."""
    paths = list(paths)
    if not paths:
        return None
    found: set[int] = set()
    for path in paths:
        for folder, _, _ in os.walk(path):
            try:
                text = _read(os.path.join(folder, "cgroup.procs"))
                found.update(int(pid) for pid in text.split())
            except OSError as exc:
                removed = isinstance(exc, FileNotFoundError) or exc.errno == errno.ENODEV
                if folder == path or not removed:
                    return None
            except ValueError:
                return None
    return sorted(found)


class GroupPool:
    """Groups kept for reuse: making one costs 0.16 ms, checking that one is empty 0.01.

    A group goes back to the pool once its call ended; it is reused only when empty
    (a call left nothing running in it), else removed once it is.
    """

    def __init__(self, support: Support, limits: CgroupLimits, max_idle: int = 8) -> None:
        self.support = support
        self.limits = limits
        self.max_idle = max_idle
        self.idle: list[Group] = []
        self.lock = threading.Lock()

    def acquire(self) -> Group:
        """An empty group with the pool's limits."""
        while True:
            with self.lock:
                group = self.idle.pop() if self.idle else None
            if group is None:
                return create(self.support, self.limits)
            if is_empty(group):
                # Its baseline is what the counters said when its last call ended, and
                # an empty group counts nothing since.
                return group
            _remove_later(group)

    def release(self, group: Group) -> None:
        """Take a group back after its call."""
        with self.lock:
            if len(self.idle) < self.max_idle:
                self.idle.append(group)
                return
        _remove_later(group)

    def close(self) -> None:
        """Remove the idle groups (they are empty, or were when they were taken back)."""
        with self.lock:
            idle, self.idle = self.idle, []
        for group in idle:
            group.remove()


def _remove_later(group: Group) -> None:
    # Off the call's path: the group's last processes may take a moment to go.
    threading.Thread(target=group.remove, kwargs={"timeout": 10.0},
                     name="bashfleet-cgroup-rm", daemon=True).start()


def sweep(support: Support, alive: Callable[[int], bool]) -> int:
    """Remove the empty groups of owners that are gone; how many were removed."""
    removed = 0
    for item in support.hierarchies:
        with contextlib.suppress(OSError):
            for name in os.listdir(item.base):
                match = _GROUP_NAME.fullmatch(name)
                if match is None or alive(int(match.group(1))):
                    continue
                removed += _rmdir(os.path.join(item.base, name))
    return removed


def join_line(fds: Iterable[int]) -> str:
    """The bash line that moves the shell into its cgroup (writing `0` into each procs
    file passed as fd N), refusing to run the command when it cannot."""
    fds = list(fds)
    if not fds:
        return ""
    writes = " && ".join(f"echo 0 >&{fd}" for fd in fds)
    # Closed at once: an fd opened by root would let the command move other processes.
    closes = " ".join(f"{fd}>&-" for fd in fds)
    failed = "{ echo 'bashfleet: could not join the call cgroup' >&2; exit 126; }"
    return f"{writes} || {failed}\nexec {closes}\n"


def freeze(paths: Iterable[str], *, timeout: float = 2.0) -> bool:
    """Pause every process of a group (its directories `paths`): v2's `cgroup.freeze`, or
    v1's freezer hierarchy (`freezer.state`) when the group has a directory there; wait
    until the kernel says they all are. False where it cannot (no freezer for the
    group): the caller goes on without a pause and says so."""
    for path in paths:
        v2 = os.path.join(path, "cgroup.freeze")
        v1 = os.path.join(path, "freezer.state")
        try:
            if os.path.exists(v2):
                _write(v2, "1")
                return _wait_for(os.path.join(path, "cgroup.events"), "frozen 1", path, timeout)
            if os.path.exists(v1):
                _write(v1, "FROZEN")
                return _wait_for(v1, "FROZEN", path, timeout)
        except OSError:
            thaw([path])
            return False
    return False


def _wait_for(events: str, word: str, path: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    delay = 0.0002
    while time.monotonic() < deadline:
        text = _read(events)
        if word in text and (word != "FROZEN" or text.strip() == "FROZEN"):
            return True
        time.sleep(delay)
        delay = min(delay * 2, 0.005)
    thaw([path])
    return False


def thaw(paths: Iterable[str]) -> None:
    """Let a frozen group's processes run again (nothing where it has no freezer)."""
    for path in paths:
        for name, value in (("cgroup.freeze", "0"), ("freezer.state", "THAWED")):
            target = os.path.join(path, name)
            if os.path.exists(target):
                with contextlib.suppress(OSError):
                    _write(target, value)

"""The sandbox of a call: which isolation it gets, the bubblewrap layout, and the runners.

Isolation levels, weakest first (`Settings.isolation` sets the host's default, a call
may ask for more with `Call.isolation`, never for less):

- `none`: plain `bash -c`, as before sandboxes (only when the host is told so, or has
  no working bubblewrap under `auto`: then `probe` says why and the worker warns).
- `process`: bubblewrap: its own PID namespace with a fresh /proc (no process of the
  worker is visible, so neither are their environments and keys), everything the call
  started dies when its bash ends, the worker's state directory (spill files, job
  records, a local fleet's fleet.json) and the secret files the settings name are
  hidden, /dev is minimal and /sys read-only. A call running as root keeps Docker's
  default capabilities without CAP_MKNOD (no mount, no ptrace, no raw disk).
- `strict`: also a read-only root with writable workspace paths, a private /tmp, and no
  network unless the host allows it.

How calls get there (see `worker.engine.launcher` for the processes and the numbers):
one launcher per layout and worker process, started once through bwrap; runners forked
by it, each pid 1 of a PID namespace of its own, serving calls one after the other.
A pool keeps idle runners; a runner whose launcher died keeps serving, and a new
launcher is started for new runners. Background jobs get a launcher of their own from
their detached supervisor, so they outlive the worker as before.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import functools
import logging
import os
import pwd
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from worker.engine import cgroups, launcher, limits
from worker.engine.launcher import (
    STATE_FD,
    LauncherClient,
    RunnerClient,
    RunnerLostError,
    RunnerProcess,
    SandboxError,
)
from worker.engine.memo import TimedMemo
from worker.settings import Settings, default_state_dir
from worker.wire.models import Isolation, SandboxProbe

log = logging.getLogger("bashfleet.sandbox")

LEVELS: tuple[Isolation, ...] = ("none", "process", "strict")
#: The environment bwrap and the launcher run with: nothing of the worker's.
LAUNCHER_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
#: Seconds to wait for a launcher or a runner to answer.
ANSWER_TIMEOUT_S = 10.0


class IsolationError(Exception):
    """A call's isolation cannot be granted: `kind` is `invalid` or `unavailable`."""

    def __init__(self, kind: Literal["invalid", "unavailable"], message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


# --------------------------------------------------------------- what a call gets (pure)


@dataclass(frozen=True)
class Choice:
    """The sandbox a call runs in."""

    level: Isolation
    network: bool


def host_default(configured: str, available: bool) -> Isolation:
    """The host's default level: `auto` is `process` where bubblewrap works, else `none`."""
    if configured == "auto":
        return "process" if available else "none"
    if configured in LEVELS:
        return configured
    raise ValueError(f"unknown isolation {configured!r}")


def decide(
    *,
    configured: str,
    available: bool,
    reason: str | None,
    asked: Isolation | None,
    network: bool | None,
    host_network: bool,
) -> Choice:
    """The sandbox of a call, or IsolationError: stronger than the host's default is
    granted, weaker refused (`invalid`); a sandbox where bubblewrap does not work is
    `unavailable`. Cutting the network needs a sandbox, so it means at least `process`."""
    default = host_default(configured, available)
    level = asked or default
    if LEVELS.index(level) < LEVELS.index(default):
        raise IsolationError(
            "invalid", f"this host runs calls with isolation {default!r}; a call may ask for "
            f"stronger isolation, never weaker (asked for {level!r})",
        )
    granted = True if level != "strict" else host_network
    if network and not granted:
        raise IsolationError(
            "invalid", "this host gives strict calls no network (sandbox_network is off); "
            "a call cannot ask for it",
        )
    if network is False and level == "none":
        level = "process"
    if level != "none" and not available:
        raise IsolationError(
            "unavailable", f"isolation {level!r} needs bubblewrap, which does not work on "
            f"this host: {reason or 'unknown reason'}",
        )
    return Choice(level, granted if network is None else network)


# ------------------------------------------------------------------ the layout (pure)


@dataclass(frozen=True)
class Layout:
    """What a launcher's mount namespace looks like (bwrap builds it once)."""

    strict: bool
    hidden_dirs: tuple[str, ...] = ()
    hidden_files: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    """`strict`: paths bound read-write over the read-only root."""
    rootless: bool = False
    """The worker is not root: bwrap makes a user namespace, and the launcher needs its
    capabilities in it to make namespaces and mounts."""


def outermost(paths: Sequence[str]) -> tuple[str, ...]:
    """The paths with duplicates and those inside another one dropped, sorted."""
    unique = sorted(set(paths))
    kept: list[str] = []
    for path in unique:
        if not any(_inside(path, outer) for outer in kept):
            kept.append(path)
    return tuple(kept)


def _inside(path: str, outer: str) -> bool:
    return path == outer or path.startswith(outer.rstrip("/") + "/")


def plan_layout(
    *, strict: bool, hidden: Sequence[tuple[str, bool]], writable: Sequence[str],
    rootless: bool,
) -> Layout:
    """The layout for `hidden` (path, is a directory) and `writable` paths (all real,
    existing paths). Hidden wins: a writable path inside a hidden one is dropped, a
    hidden file inside a hidden directory needs nothing of its own."""
    dirs = outermost([path for path, is_dir in hidden if is_dir])
    files = tuple(sorted({
        path for path, is_dir in hidden
        if not is_dir and not any(_inside(path, d) for d in dirs)
    }))
    kept = outermost([w for w in writable if not any(_inside(w, d) for d in dirs)])
    if not strict:
        kept = ()
    return Layout(strict, dirs, files, kept, rootless)


def bwrap_args(bwrap: str, layout: Layout, command: Sequence[str]) -> list[str]:
    """The bwrap command line that runs `command` (the launcher) in `layout`.

    Writable binds come before the hiding, so a secret inside a workspace stays hidden.
    """
    args = [bwrap]
    if layout.strict:
        args += ["--ro-bind", "/", "/", "--dev", "/dev"]
        for path in layout.writable:
            args += ["--bind", path, path]
    else:
        args += ["--dev-bind", "/", "/", "--dev", "/dev", "--ro-bind", "/sys", "/sys"]
    for path in layout.hidden_dirs:
        args += ["--tmpfs", path, "--remount-ro", path]
    for path in layout.hidden_files:
        args += ["--ro-bind", "/dev/null", path]
    if layout.rootless:
        args += ["--cap-add", "ALL"]
    return [*args, "--", *command]


def parse_bwrap_version(text: str) -> str | None:
    """`bubblewrap 0.8.0` -> `0.8.0`."""
    match = re.search(r"bubblewrap\s+(\S+)", text)
    return match.group(1) if match else None


# --------------------------------------------------------------- the host (filesystem)


def launcher_command() -> list[str]:
    """How bwrap runs the launcher: this Python, isolated, no site packages."""
    return [sys.executable, "-I", "-S", launcher.__file__ or "launcher.py"]


def hidden_paths(settings: Settings) -> list[tuple[str, bool]]:
    """(real path, is a directory) of what sandboxed calls must not see: the state
    directory, the default one (a local fleet's fleet.json lives there), the secret
    files and the `sandbox_hidden` paths; those that exist."""
    settings.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    wanted = [settings.state_dir, default_state_dir(), *map(Path, settings.secret_files),
              *map(Path, settings.sandbox_hidden)]
    found: list[tuple[str, bool]] = []
    for path in wanted:
        real = os.path.realpath(os.path.expanduser(str(path)))
        if os.path.exists(real):
            found.append((real, os.path.isdir(real)))
    return found


def layout_for(settings: Settings, strict: bool) -> Layout:
    """This host's layout for `process` (strict=False) or `strict` calls."""
    writable = [os.path.realpath(os.path.expanduser(p)) for p in settings.sandbox_writable]
    return plan_layout(
        strict=strict, hidden=hidden_paths(settings),
        writable=[p for p in writable if os.path.isdir(p)], rootless=os.geteuid() != 0,
    )


def bwrap_path(settings: Settings) -> str | None:
    """The bwrap executable, looked up on PATH (and the usual places)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), LAUNCHER_ENV["PATH"]])
    return shutil.which(settings.bwrap, path=search)


@dataclass(frozen=True)
class User:
    """Who calls run as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def run_as_user(settings: Settings) -> User | None:
    """The `run_as` user, or None when calls run as the worker's own user."""
    if settings.run_as is None:
        return None
    entry = pwd.getpwnam(settings.run_as)
    if entry.pw_uid == os.geteuid():
        return None
    if os.geteuid() != 0:
        raise SandboxError(errno.EPERM, f"run_as={settings.run_as!r} needs a worker started "
                           "as root")
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return User(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)


def user_env(user: User | None) -> dict[str, str]:
    """What a call's environment says about its user."""
    if user is None:
        return {}
    return {"HOME": user.home, "USER": user.name, "LOGNAME": user.name}


def extra_groups(user: User) -> tuple[int, ...]:
    """The user's supplementary groups (for Popen's extra_groups)."""
    return tuple(g for g in user.groups if g != user.gid)


# ------------------------------------------------------------------------ the runners


@dataclass(frozen=True)
class Kind:
    """What a runner is made for, besides its launcher's layout."""

    network: bool
    user: User | None

    def spec(self) -> dict[str, Any]:
        """The `N` message to the launcher."""
        spec: dict[str, Any] = {"network": self.network}
        if self.user is not None:
            spec.update(uid=self.user.uid, gid=self.user.gid, groups=list(self.user.groups))
        return spec


@dataclass
class Slot:
    """A runner and the cgroup its calls run in."""

    runner: RunnerClient
    group: cgroups.Group | None
    pool: Pool
    kind: Kind

    def discard(self, *, wait: bool = False) -> None:
        """Close the runner and remove its cgroup (off the call's path unless `wait`:
        the runner and its call's last processes may take a moment to go)."""
        self.runner.close()
        if self.group is None:
            return
        if wait:
            self.group.remove()
        else:
            threading.Thread(target=self.group.remove, name="bashfleet-cgroup-rm",
                             daemon=True).start()


class SandboxedProcess(RunnerProcess):
    """A call in a runner: pid is bash's host pid (also its process group)."""

    def __init__(self, slot: Slot, pid: int) -> None:
        super().__init__(slot.runner, pid)
        self.slot = slot
        self.hits: tuple[str, ...] = ()
        """The cgroup limits the call hit (`memory`, `pids`), known once it ended."""

    def ended(self) -> None:
        if self.slot.group is not None:
            self.hits = self.slot.group.hits()
        if self.runner.reusable:
            self.slot.pool.release(self.slot)
        else:
            self.slot.discard()


@dataclass
class Pool:
    """A launcher for one layout, and its idle runners."""

    bwrap: str
    layout: Layout
    limits: cgroups.CgroupLimits
    support: cgroups.Support
    max_idle: int
    client: LauncherClient | None = None
    idle: dict[Kind, list[Slot]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False

    def _launcher(self) -> LauncherClient:
        if self.client is None or not self.client.alive():
            self._drop_launcher()
            argv = bwrap_args(self.bwrap, self.layout, launcher_command())
            self.client = LauncherClient(argv, LAUNCHER_ENV)
        return self.client

    def _drop_launcher(self) -> None:
        if self.client is not None:
            self.client.close(timeout=0.5)  # reaps its bwrap, killing it if need be
            self.client = None

    def acquire(self, kind: Kind) -> Slot:
        """An idle runner of `kind`, or a new one."""
        with self.lock:
            if self.closed:
                raise SandboxError(errno.ESHUTDOWN, "the sandbox pool is closed")
            idle = self.idle.get(kind)
            if idle:
                return idle.pop()
            return self._new_slot(kind)

    def _new_slot(self, kind: Kind) -> Slot:
        group = None
        if self.support.version is not None and self.limits.controllers():
            group = cgroups.create(self.support, self.limits)
        fds = group.procs_fds() if group is not None else []
        try:
            try:
                runner = self._launcher().runner(kind.spec(), fds, ANSWER_TIMEOUT_S)
            except RunnerLostError:
                # The launcher died since we last used it: once more with a new one.
                self._drop_launcher()
                runner = self._launcher().runner(kind.spec(), fds, ANSWER_TIMEOUT_S)
        except BaseException:
            if group is not None:
                group.remove(timeout=0)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        return Slot(runner, group, self, kind)

    def release(self, slot: Slot) -> None:
        """Take a runner back once its call ended cleanly."""
        with self.lock:
            idle = self.idle.setdefault(slot.kind, [])
            if self.closed or len(idle) >= self.max_idle:
                slot.discard()
            else:
                idle.append(slot)

    def close(self) -> None:
        """Close every idle runner (removing their cgroups) and the launcher; busy
        runners finish their calls."""
        with self.lock:
            self.closed = True
            slots = [slot for kind in self.idle.values() for slot in kind]
            self.idle.clear()
            for slot in slots:
                slot.runner.close()  # all at once: they exit in parallel
            for slot in slots:
                slot.discard(wait=True)
            self._drop_launcher()


_pools: dict[tuple[str, Layout, cgroups.CgroupLimits], Pool] = {}
_pools_lock = threading.Lock()
#: Most launchers one process keeps: each distinct layout (state directory) has one, and
#: tests make many; the least recently made is closed past this.
MAX_POOLS = 8


#: (the settings that shape a layout, level) -> its pool, looked up again after 10 s
#: (a secret file created meanwhile is then hidden too). Working it out (hidden paths
#: resolved, bwrap found on PATH) cost ~0.1 ms of a call's 0.25 ms in the sandbox.
_chosen_pools: TimedMemo[tuple[object, ...], Pool] = TimedMemo(ttl_s=10.0)


def pool_for(settings: Settings, level: Isolation) -> Pool:
    """The pool of this process for `settings` at `level` (`process` or `strict`)."""
    key = (
        level, settings.bwrap, settings.state_dir, settings.secret_files,
        settings.sandbox_hidden, settings.sandbox_writable, settings.concurrency,
        settings.limit_memory_mb, settings.limit_procs, settings.limit_cpus, settings.cgroups,
    )
    pool = _chosen_pools.get(key, lambda: _pool_for(settings, level))
    if pool.closed:
        _chosen_pools.forget(key)
        pool = _chosen_pools.get(key, lambda: _pool_for(settings, level))
    return pool


def _pool_for(settings: Settings, level: Isolation) -> Pool:
    bwrap = bwrap_path(settings)
    if bwrap is None:
        raise SandboxError(errno.ENOENT, f"bubblewrap ({settings.bwrap}) not found")
    layout = layout_for(settings, strict=level == "strict")
    limits, support = cgroup_plan(settings)
    key = (bwrap, layout, limits)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None or pool.closed:
            pool = Pool(bwrap, layout, limits, support, max_idle=settings.concurrency)
            _pools[key] = pool
            _trim_pools()
    return pool


def _trim_pools() -> None:
    while len(_pools) > MAX_POOLS:
        oldest = next(iter(_pools))
        _pools.pop(oldest).close()


@atexit.register
def close_all() -> None:
    """Close every pool of this process: idle runners and launchers exit, idle cgroups
    are removed."""
    with _pools_lock:
        pools = list(_pools.values())
        groups = list(_group_pools.values())
        _pools.clear()
        _group_pools.clear()
        _chosen_pools.clear()
    for pool in pools:
        pool.close()
    for group_pool in groups:
        group_pool.close()


def spawn(
    settings: Settings,
    choice: Choice,
    command: str,
    *,
    cwd: str,
    env: Mapping[str, str],
    executable: str | None,
    fds: Sequence[int],
    state_fd: int | None = None,
    grace_s: float = 0.0,
) -> SandboxedProcess:
    """Start `bash -c COMMAND` in a runner. `fds` are the call's stdin, stdout, stderr;
    `state_fd` lands on STATE_FD. The runner is in its cgroup already: so is bash. The
    runner stops the call (group SIGTERM, `grace_s`, SIGKILL) once its output passes
    the cap."""
    pool = pool_for(settings, choice.level)
    paths = strict_paths(pool.layout.writable, cwd) if pool.layout.strict else []
    kind = Kind(choice.network, run_as_user(settings))
    for attempt in range(2):
        slot = pool.acquire(kind)
        request = _request(command, cwd, env, executable, choice=choice, paths=paths)
        request.update(output_cap=output_cap(settings), kill_grace_s=grace_s)
        if state_fd is not None:
            request["targets"].append(STATE_FD)
        passed = [*fds, *([state_fd] if state_fd is not None else [])]
        try:
            pid = slot.runner.start(request, passed, ANSWER_TIMEOUT_S)
        except RunnerLostError:
            slot.discard()  # an idle runner that was killed meanwhile: try a fresh one
            if attempt:
                raise
            continue
        except SandboxError:
            if slot.runner.reusable:
                slot.pool.release(slot)  # the call could not start; the runner is fine
            else:
                slot.discard()
            raise
        return SandboxedProcess(slot, pid)
    raise AssertionError("unreachable")  # pragma: no cover


def _request(
    command: str, cwd: str, env: Mapping[str, str], executable: str | None, *,
    choice: Choice, paths: Sequence[tuple[str, bool]],
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "argv": ["bash", "-c", command], "executable": executable, "cwd": cwd,
        "env": dict(env), "targets": [0, 1, 2],
    }
    if choice.level == "strict":
        request.update(private_tmp=True, paths=[[p, w] for p, w in paths])
    return request


def job_spec(
    settings: Settings, choice: Choice, command: str, *, cwd: str, env: Mapping[str, str],
    grace_s: float,
) -> dict[str, Any]:
    """What a job's supervisor needs to run `command` in its own launcher and runner."""
    bwrap = bwrap_path(settings)
    if bwrap is None:
        raise SandboxError(errno.ENOENT, f"bubblewrap ({settings.bwrap}) not found")
    layout = layout_for(settings, strict=choice.level == "strict")
    paths = strict_paths(layout.writable, cwd) if layout.strict else []
    return {
        "argv": bwrap_args(bwrap, layout, launcher_command()),
        "env": LAUNCHER_ENV,
        "runner": Kind(choice.network, run_as_user(settings)).spec(),
        "request": {
            **_request(command, cwd, env, None, choice=choice, paths=paths),
            "output_cap": output_cap(settings), "kill_grace_s": grace_s,
        },
    }


def strict_paths(writable: Sequence[str], cwd: str) -> list[tuple[str, bool]]:
    """`strict`: the paths a call must see after its private /tmp is mounted, and
    whether each is writable: the layout's workspace paths, else the cwd."""
    if writable:
        visible = [(path, True) for path in writable]
        if not any(_inside(cwd, path) for path in writable):
            visible.append((cwd, False))
        return visible
    return [(cwd, True)]


# --------------------------------------------------------------------- cgroups, limits


def host_limits(settings: Settings) -> limits.ResourceLimits:
    """This host's per-call resource limits."""
    return limits.ResourceLimits(
        memory_mb=settings.limit_memory_mb, cpu_s=settings.limit_cpu_s,
        file_mb=settings.limit_file_mb, procs=settings.limit_procs,
    )


def ulimit_limits(settings: Settings) -> limits.ResourceLimits:
    """The limits the ulimit line sets: all but those a call's cgroup carries."""
    carried, support = cgroup_plan(settings)
    host = host_limits(settings)
    if support.version is None:
        return host
    return dataclasses.replace(
        host,
        memory_mb=None if carried.memory_bytes is not None else host.memory_mb,
        procs=None if carried.pids is not None else host.procs,
    )


def ulimit_line(settings: Settings) -> str:
    """The ulimit line of a call's command (`limits.ulimit_prefix` of `ulimit_limits`)."""
    return _ulimit_line(ulimit_limits(settings))


@functools.lru_cache(maxsize=64)
def _ulimit_line(chosen: limits.ResourceLimits) -> str:
    return limits.ulimit_prefix(chosen)


def output_cap(settings: Settings) -> int | None:
    """Bytes of output one call or job may write; None: no cap."""
    mib = settings.limit_output_mb
    return None if mib is None else mib * 1024 * 1024



_cgroup_support: TimedMemo[tuple[str, tuple[str, ...]], cgroups.Support] = TimedMemo(ttl_s=3600.0)


def cgroup_limits(settings: Settings) -> cgroups.CgroupLimits:
    """The limits of `settings` that a cgroup carries."""
    return _cgroup_limits(settings.limit_memory_mb, settings.limit_procs, settings.limit_cpus)


@functools.lru_cache(maxsize=64)
def _cgroup_limits(
    memory_mb: int | None, pids: int | None, cpus: float | None
) -> cgroups.CgroupLimits:
    memory = memory_mb * 1024 * 1024 if memory_mb is not None else None
    return cgroups.CgroupLimits(memory_bytes=memory, pids=pids, cpus=cpus)


def cgroup_plan(settings: Settings) -> tuple[cgroups.CgroupLimits, cgroups.Support]:
    """The cgroup limits of a call and whether this process can make groups for them
    (found out once per process, then remembered)."""
    limits = cgroup_limits(settings)
    wanted = limits.controllers()
    if settings.cgroups == "off" or not wanted:
        reason = "cgroups are off (settings)" if wanted else "no limit needs a cgroup"
        return limits, cgroups.Support(None, problem=reason)
    return limits, _cgroup_support.get((settings.cgroups, wanted), lambda: _detect(wanted))


_group_pools: dict[tuple[cgroups.Support, cgroups.CgroupLimits], cgroups.GroupPool] = {}


def group_pool(settings: Settings) -> cgroups.GroupPool | None:
    """The pool of cgroups for unsandboxed calls of `settings`; None: no cgroups."""
    carried, support = cgroup_plan(settings)
    if support.version is None:
        return None
    key = (support, carried)
    with _pools_lock:
        pool = _group_pools.get(key)
        if pool is None:
            pool = _group_pools[key] = cgroups.GroupPool(support, carried, settings.concurrency)
    return pool


def _detect(wanted: tuple[str, ...]) -> cgroups.Support:
    support = cgroups.detect(wanted)
    if support.version is not None:
        cgroups.sweep(support, _alive)
        _made.append(support)
    return support


#: Where this process made groups: at its exit, the empty ones of its own are removed
#: (a job whose supervisor was killed, a runner killed from outside leave theirs).
_made: list[cgroups.Support] = []


@atexit.register
def _sweep_own() -> None:
    own = os.getpid()
    for support in _made:
        cgroups.sweep(support, lambda pid: pid != own and _alive(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ------------------------------------------------------------------------------ probe


_probes: TimedMemo[tuple[str, str], tuple[str | None, str | None]] = TimedMemo(ttl_s=3600.0)


def bwrap_status(settings: Settings) -> tuple[str | None, str | None]:
    """(bubblewrap's version, None) when it works here, else (version or None, why not).

    Found out once per process and bwrap setting: it starts a launcher and runs `true`.
    """
    key = (settings.bwrap, str(os.geteuid()))
    return _probes.get(key, lambda: _try_bwrap(settings))


def _try_bwrap(settings: Settings) -> tuple[str | None, str | None]:
    path = bwrap_path(settings)
    if path is None:
        return None, (f"bubblewrap ({settings.bwrap}) is not installed "
                      "(Debian: apt-get install bubblewrap)")
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10,
                              env=LAUNCHER_ENV, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{path} does not run: {exc}"
    version = parse_bwrap_version(done.stdout + done.stderr)
    problem = _smoke_test(path)
    return version, problem


def _smoke_test(bwrap: str) -> str | None:
    """Run `true` in a launcher with no hidden paths; None when it worked."""
    layout = Layout(strict=False, rootless=os.geteuid() != 0)
    client = None
    try:
        client = LauncherClient(bwrap_args(bwrap, layout, launcher_command()), LAUNCHER_ENV)
        runner = client.runner(Kind(True, None).spec(), (), ANSWER_TIMEOUT_S)
        with open(os.devnull, "r+b") as null:
            fds = [null.fileno()] * 3
            runner.start({"argv": ["true"], "cwd": "/", "env": {"PATH": LAUNCHER_ENV["PATH"]},
                          "targets": [0, 1, 2]}, fds, ANSWER_TIMEOUT_S)
        status = runner.wait_status(ANSWER_TIMEOUT_S)
        runner.close()
    except (OSError, TimeoutError) as exc:
        return f"bubblewrap cannot start the sandbox here: {exc}"
    finally:
        if client is not None:
            client.close()
    return None if status == 0 else f"a sandboxed `true` failed (status {status})"


def availability(settings: Settings) -> tuple[bool, str | None]:
    """(bubblewrap works, why not) for this host. The first time it does not, under
    `auto`, the process logs a warning: its calls run unsandboxed."""
    if settings.isolation == "none":
        return False, "isolation is none (settings)"
    _, problem = bwrap_status(settings)
    if problem is not None and settings.isolation == "auto" and problem not in _warned:
        _warned.add(problem)
        log.warning("calls run WITHOUT a sandbox: %s", problem)
    return problem is None, problem


_warned: set[str] = set()


def probe(settings: Settings) -> SandboxProbe:
    """This host's isolation, for the host record and `bashfleet hosts`: its default
    level, bubblewrap's version or why calls run unsandboxed, the cgroup version or why
    there is none, and the user calls run as. Cached per process (it runs bwrap once)."""
    version, problem = bwrap_status(settings) if settings.isolation != "none" else (None, None)
    level = host_default(settings.isolation, problem is None and settings.isolation != "none")
    if settings.isolation == "none":
        problem = "isolation is none (settings)"
    _, support = cgroup_plan(settings)
    return SandboxProbe(
        isolation=level, configured=settings.isolation, bwrap=version if problem is None else None,
        problem=problem, cgroup=support.version, cgroup_problem=support.problem,
        run_as=settings.run_as,
    )


def startup_problems(settings: Settings) -> tuple[list[str], list[str]]:
    """(errors, warnings) for a worker starting with `settings`: errors refuse the start
    (a sandbox asked for and not working, `run_as` without root), warnings are shown
    (calls run unsandboxed, no cgroups)."""
    errors: list[str] = []
    warnings: list[str] = []
    try:
        run_as_user(settings)
    except OSError as exc:
        errors.append(exc.strerror or str(exc))
    found = probe(settings)
    if found.problem is not None and settings.isolation in ("process", "strict"):
        errors.append(f"isolation {settings.isolation!r} is configured but {found.problem}")
    elif found.isolation == "none":
        warnings.append(f"calls run WITHOUT a sandbox: {found.problem}; a command can read "
                        "this worker's processes, environment and files")
    if found.cgroup is None and cgroup_limits(settings).controllers():
        warnings.append(f"calls get no cgroup of their own ({found.cgroup_problem}); "
                        "memory and process limits fall back to ulimit")
    return errors, warnings


def warm(settings: Settings) -> None:
    """Start the launcher and one idle runner of the host's default kind now, so that the
    first call does not wait for them (a consumer calls this at start)."""
    available, _ = availability(settings)
    level = host_default(settings.isolation, available)
    if level == "none":
        return
    choice = decide(configured=settings.isolation, available=True, reason=None, asked=None,
                    network=None, host_network=settings.sandbox_network)
    pool = pool_for(settings, choice.level)
    with contextlib.suppress(OSError):
        pool.release(pool.acquire(Kind(choice.network, run_as_user(settings))))

"""A host's sandbox: which isolation a workspace gets, who its calls run as, the zygote.

Isolation levels, weakest first (`Settings.isolation` sets the host's default, a
workspace may ask for more, never for less):

- `none`: plain `bash -c` in a directory, no namespace (only when the host is told so;
  `bashfleet worker` refuses to start where the sandbox cannot work, unless told
  `--isolation none`; only the local `bashfleet up` falls back, loudly).
- `process`: a workspace of its own (`bashfleet.worker.engine.isolate.keeper`): one PID
  namespace for its calls and jobs, a mount view with the host read-only, its directory,
  /tmp and HOME its own, every bashfleet state directory and secret file hidden
  (`bashfleet.worker.engine.layout`);
  a network namespace of its own (its policy: `bashfleet.worker.engine.network.network`).
- `strict`: also no network (policy `none`) unless the host allows it
  (`sandbox_network`), and /home and /root hidden.

Every sandboxed workspace has a network namespace of its own; its policy (`none`,
`egress`, `allow=...`, `host`) is built by `bashfleet.worker.engine.network.network`.
Every sandboxed call runs under a system call filter
(`bashfleet.worker.engine.isolate.syscall_filter`, the host's `seccomp` setting) and a session
keyring of its workspace's own.

Calls never run as root nor as the worker's user: a root worker runs them as its run user
(`run_as`), every capability dropped, no_new_privs; a worker that is not root runs them
as itself inside a user namespace (bubblewrap's), with no capability.

How a workspace is made: each worker process keeps a zygote
(`bashfleet.worker.engine.isolate.launcher`, one Python started once through bubblewrap) that forks
a keeper per workspace. See
`bashfleet.worker.engine.workspaces` for the workspaces themselves.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import platform
import pwd
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from bashfleet.worker.engine import cgroups, holder, id_slots, isolate, resources
from bashfleet.worker.engine.isolate import job_supervisor, launcher, syscall_filter
from bashfleet.worker.engine.isolate.launcher import KeeperConnection, LauncherClient, SandboxError
from bashfleet.worker.engine.memo import TimedMemo
from bashfleet.worker.engine.network import network
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import Isolation, SandboxProbe
from bashfleet.worker.wire.network import NetworkPolicy

log = logging.getLogger("bashfleet.sandbox")

LEVELS: tuple[Isolation, ...] = ("none", "process", "strict")
#: The environment bwrap and the zygote run with: nothing of the worker's.
LAUNCHER_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
#: Seconds to wait for a zygote or keeper to answer: longer than a keeper's own setup
#: deadline (launcher.KEEPER_SETUP_S), so the zygote's reason arrives before we give up.
ANSWER_TIMEOUT_S = launcher.KEEPER_SETUP_S + 5.0
#: The run user a root worker uses when `run_as` is not set, when the account exists.
DEFAULT_RUN_USER = "bashfleet-run"
FALLBACK_RUN_USER = "nobody"


class IsolationError(Exception):
    """A call's isolation cannot be granted: `kind` is `invalid` or `unavailable`."""

    def __init__(self, kind: Literal["invalid", "unavailable"], message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


# --------------------------------------------------------------- what a call gets (pure)


@dataclass(frozen=True)
class Choice:
    """The sandbox a workspace (and so its calls) gets."""

    level: Isolation
    network: NetworkPolicy


NONE = NetworkPolicy(mode="none")
HOST = NetworkPolicy(mode="host")
EGRESS = NetworkPolicy(mode="egress")


def host_default(configured: str, available: bool) -> Isolation:
    """The host's default level: `auto` is `process` where bubblewrap works, else `none`."""
    if configured == "auto":
        return "process" if available else "none"
    if configured in LEVELS:
        return configured
    raise ValueError(f"unknown isolation {configured!r}")


@dataclass(frozen=True)
class NetworkRules:
    """What this host grants workspaces' networks (`bashfleet.worker.engine.network.network`)."""

    default: NetworkPolicy = EGRESS
    """The policy of a workspace that asks for none."""
    host_ok: bool = False
    """`host` may be asked for (`BASHFLEET_NETWORK_HOST_OK`)."""
    problem: str | None = None
    """Why this host cannot filter (`egress` and `allow` unavailable), when it cannot."""
    allow_problem: str | None = None
    """Why this host cannot give `allow` (a worker that is not root), when it cannot."""


def decide(
    *,
    configured: str,
    available: bool,
    reason: str | None,
    asked: Isolation | None,
    network: NetworkPolicy | None,
    host_network: bool,
    rules: NetworkRules = NetworkRules(),
) -> Choice:
    """The sandbox of a workspace, or IsolationError: stronger than the host's default is
    granted, weaker refused (`invalid`); a sandbox where bubblewrap does not work is
    `unavailable`. A network policy other than `host` needs a sandbox (its own network
    namespace), so it means at least `process`; `strict` gets `none` unless the host
    grants it the network (`sandbox_network`)."""
    default = host_default(configured, available)
    level = asked or default
    if LEVELS.index(level) < LEVELS.index(default):
        raise IsolationError(
            "invalid", f"this host runs calls with isolation {default!r}; a call may ask for "
            f"stronger isolation, never weaker (asked for {level!r})",
        )
    policy = network if network is not None else _default_policy(level, host_network, rules)
    _check_network(policy, level, host_network, rules, asked=network is not None)
    if policy.mode != "host" and level == "none":
        level = "process"
    if level != "none" and not available:
        raise IsolationError(
            "unavailable", f"isolation {level!r} needs bubblewrap, which does not work on "
            f"this host: {reason or 'unknown reason'}",
        )
    return Choice(level, policy)


def _default_policy(level: Isolation, host_network: bool, rules: NetworkRules) -> NetworkPolicy:
    if level == "none":
        return HOST  # no sandbox: the host's namespace, as every process of the host
    if level == "strict" and not host_network:
        return NONE
    # Where the default cannot be given: no network, never the host's (an operator asks
    # for `host` by name), and the worker says so at start (`startup_problems`).
    if rules.default.mode in ("egress", "allow") and rules.problem is not None:
        return NONE
    if rules.default.mode == "host" and not rules.host_ok:
        return NONE
    return rules.default


def _check_network(policy: NetworkPolicy, level: Isolation, host_network: bool,
                   rules: NetworkRules, *, asked: bool) -> None:
    if not asked:
        return
    if level == "strict" and policy.mode != "none" and not host_network:
        raise IsolationError(
            "invalid", "this host gives strict calls no network (sandbox_network is off); "
            "a call cannot ask for it",
        )
    if policy.mode == "host" and not rules.host_ok and level != "none":
        raise IsolationError(
            "invalid", "this host keeps workspaces out of its own network namespace "
            "(BASHFLEET_NETWORK_HOST_OK is off): ask for `egress`, `allow=...` or `none`",
        )
    if policy.mode in ("egress", "allow") and rules.problem is not None:
        raise IsolationError(
            "unavailable", f"network policy {policy} needs a host that filters workspaces' "
            f"networks, and this one cannot: {rules.problem}",
        )
    if policy.mode == "allow" and rules.allow_problem is not None:
        raise IsolationError("unavailable", f"network policy {policy} is not available "
                             f"on this host: {rules.allow_problem}")


def parse_bwrap_version(text: str) -> str | None:
    """`bubblewrap 0.8.0` -> `0.8.0`."""
    match = re.search(r"bubblewrap\s+(\S+)", text)
    return match.group(1) if match else None


def zygote_argv(bwrap: str, rootless: bool) -> list[str]:
    """How bwrap runs the zygote: the host as it is (each keeper builds its own view), and
    for a worker that is not root a user namespace with the capabilities to make the
    others (calls get none of them:
    `bashfleet.worker.engine.isolate.kernel.drop_privileges_of_children`)."""
    args = [bwrap, "--dev-bind", "/", "/"]
    if rootless:
        args += ["--cap-add", "ALL"]
    return [*args, "--", *isolate.command("launcher")]


# ------------------------------------------------------------------------- who runs it


@dataclass(frozen=True)
class User:
    """Who a root worker's calls run as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def run_user(settings: Settings) -> User | None:
    """The run user of a root worker (never root: SandboxError); None when the worker is
    not root (calls run as itself, in a user namespace). Looked up once a minute (its
    groups cost a scan of the group database: 0.1 ms a call)."""
    return _run_users.get((settings.run_as, os.geteuid()), lambda: _run_user(settings))


_run_users: TimedMemo[tuple[str | None, int], User | None] = TimedMemo(ttl_s=60.0)


def _run_user(settings: Settings) -> User | None:
    if os.geteuid() != 0:
        if settings.run_as is not None and _uid_of(settings.run_as) != os.geteuid():
            raise SandboxError(errno.EPERM, f"run_as={settings.run_as!r} needs a worker "
                               "started as root")
        return None
    name = settings.run_as or (DEFAULT_RUN_USER if _exists(DEFAULT_RUN_USER)
                               else FALLBACK_RUN_USER)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise SandboxError(errno.ENOENT, f"run_as: no such user {name!r}") from None
    if entry.pw_uid == 0:
        raise SandboxError(errno.EPERM, f"run_as={name!r} is root: calls never run as root")
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return User(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _uid_of(name: str) -> int:
    return pwd.getpwnam(name).pw_uid


def run_user_name(settings: Settings) -> str:
    """Who calls run as, for `bashfleet hosts`."""
    try:
        user = run_user(settings)
    except OSError:
        return settings.run_as or "?"
    if user is not None:
        return user.name
    with contextlib.suppress(KeyError):
        return pwd.getpwuid(os.geteuid()).pw_name
    return str(os.geteuid())


def extra_groups(user: User) -> tuple[int, ...]:
    """The user's supplementary groups (for Popen's extra_groups)."""
    return tuple(g for g in user.groups if g != user.gid)


# ------------------------------------------------------------------------ the zygote


def bwrap_path(settings: Settings) -> str | None:
    """The bwrap executable, looked up on PATH (and the usual places)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), LAUNCHER_ENV["PATH"]])
    return shutil.which(settings.bwrap, path=search)


class Zygote:
    """This process's zygote: started on first use, started again if it died. Threads
    ask it at once (`LauncherClient` matches the answers); the lock guards only starting
    and dropping it."""

    def __init__(self) -> None:
        self.client: LauncherClient | None = None
        self.lock = threading.Lock()

    def keeper(self, settings: Settings, spec: dict[str, object], fds: Sequence[int]) -> int:
        """A new keeper of `spec` (its host pid), its view built."""
        for attempt in range(2):
            client = self._client(settings)
            try:
                return client.keeper({"seccomp": settings.seccomp, **spec}, fds,
                                     ANSWER_TIMEOUT_S)
            except launcher.KeeperLostError:
                self._drop(client)
                if attempt:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def wake(self, settings: Settings, holder: int, link: int, given: Sequence[int],
             cgroup: Sequence[str]) -> int:
        """A service forked into the sleeping workspace whose holder's pidfd is
        `holder` (`LauncherClient.wake`), joining the cgroup directories `cgroup`: its
        host pid."""
        cgroup_fds = job_supervisor.open_procs_files(cgroup) if cgroup else []
        try:
            return self._client(settings).wake(holder, link, given, cgroup_fds,
                                               ANSWER_TIMEOUT_S)
        finally:
            for fd in cgroup_fds:
                os.close(fd)

    def _client(self, settings: Settings) -> LauncherClient:
        with self.lock:
            if self.client is None or not self.client.alive():
                self._drop_locked(self.client)
                bwrap = bwrap_path(settings)
                if bwrap is None:
                    raise SandboxError(errno.ENOENT,
                                       f"bubblewrap ({settings.bwrap}) not found")
                self.client = LauncherClient(zygote_argv(bwrap, os.geteuid() != 0),
                                             LAUNCHER_ENV)
            return self.client

    def _drop(self, client: LauncherClient | None) -> None:
        """Close `client` if it is still this process's zygote (another thread may have
        started the next one already)."""
        with self.lock:
            self._drop_locked(client)

    def _drop_locked(self, client: LauncherClient | None) -> None:
        if client is not None and client is self.client:
            client.close(timeout=0.5)
            self.client = None

    def close(self) -> None:
        """Close the zygote (its keepers live on)."""
        with self.lock:
            self._drop_locked(self.client)


zygote = Zygote()
#: What else `close_all` ends (the workspaces' pools of ready keepers register here).
_closers: list[Callable[[], None]] = []


def on_close(closer: Callable[[], None]) -> None:
    """Have `close_all` call `closer` too."""
    _closers.append(closer)


@atexit.register
def close_all() -> None:
    """End what this process made ahead (ready keepers, throwaway workspaces nobody took)
    and close its zygote; the workspaces in use and their keepers live on."""
    for closer in list(_closers):
        closer()
    zygote.close()


# ------------------------------------------------------------------------------ probe


_probes: TimedMemo[tuple[str, str], tuple[str | None, str | None]] = TimedMemo(ttl_s=3600.0)
_probe_lock = threading.Lock()
#: Tries of the sandbox's probe before it is said not to work (a loaded machine can time
#: one out): a host must never run calls unsandboxed for a passing fault.
PROBE_TRIES = 3


def bwrap_status(settings: Settings) -> tuple[str | None, str | None]:
    """(bubblewrap's version, None) when the sandbox works here, else (version or None,
    why not). Found out once per process and bwrap setting (the threads that ask at once
    wait for one probe): it makes a workspace's namespaces and mounts, and runs `true` in
    it, tried again before it is said not to work."""
    key = (settings.bwrap, str(os.geteuid()))
    with _probe_lock:
        return _probes.get(key, lambda: _probe(settings))


def _probe(settings: Settings) -> tuple[str | None, str | None]:
    found: tuple[str | None, str | None] = (None, None)
    for _ in range(PROBE_TRIES):
        found = _try_bwrap(settings)
        if found[1] is None or "not installed" in found[1]:
            return found
    return found


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
    return parse_bwrap_version(done.stdout + done.stderr), _smoke_test(path)


def _smoke_test(bwrap: str) -> str | None:
    """Make a keeper with a view (a tmpfs, a read-only bind, /proc) and run `true` in it;
    None when it worked."""
    client = None
    with tempfile.TemporaryDirectory(prefix="bashfleet-probe-") as scratch:
        root = os.path.join(scratch, "root")
        os.mkdir(root)
        plan = [["private"], ["tmpfs", root, 0o755], ["mkdir", f"{root}/usr", 0o755],
                ["rbind_ro", "/usr", f"{root}/usr"], ["mkdir", f"{root}/proc", 0o555],
                ["proc", f"{root}/proc"]]
        listener = launcher.listen(os.path.join(scratch, "k.sock"))
        try:
            client = LauncherClient(zygote_argv(bwrap, os.geteuid() != 0), LAUNCHER_ENV)
            # Bound to this process: a worker stopped while it probes would otherwise leave
            # the probe's keeper running for ever (nothing names it).
            pid = client.keeper({"plan": plan, "network": True, "worker_uid": os.geteuid(),
                                 "maker": os.getpid(), "bound_to_maker": True},
                                [listener.fileno()], ANSWER_TIMEOUT_S)
            status = _run_true(os.path.join(scratch, "k.sock"), pid)
        except (OSError, TimeoutError) as exc:
            return f"bubblewrap cannot start the sandbox here: {exc}"
        finally:
            listener.close()
            if client is not None:
                client.close()
    return None if status == 0 else f"a sandboxed `true` failed (status {status})"


def _run_true(path: str, keeper_pid: int) -> int:
    conn = KeeperConnection.connect(path)
    try:
        with open(os.devnull, "r+b") as null:
            conn.start({"argv": ["/usr/bin/true"], "cwd": "/", "env": {"PATH": "/usr/bin"},
                        "targets": [0, 1, 2]}, [null.fileno()] * 3, ANSWER_TIMEOUT_S)
        return conn.wait_status(ANSWER_TIMEOUT_S)
    finally:
        conn.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(keeper_pid, 9)


def availability(settings: Settings) -> tuple[bool, str | None]:
    """(the sandbox works, why not) for this host. The first time it does not, under
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
    # What a workspace gets: its keeper's group has every controller a call may limit.
    support = resources.cgroup_support(settings, cgroups.CONTROLLERS)
    return SandboxProbe(
        isolation=level, configured=settings.isolation, bwrap=version if problem is None else None,
        problem=problem, cgroup=support.version, cgroup_problem=support.problem,
        run_as=run_user_name(settings),
        tenancy="multi" if host_ids(settings) is not None and problem is None else "single",
        id_slots=(found.slots if (found := host_ids(settings)) is not None else 0),
        id_range=settings.id_range,
        id_problem=id_scope_problem(settings) if host_ids(settings) is not None else None,
        network=str(_default_policy(level, settings.sandbox_network, rules))
        if (rules := network_rules(settings)) else "",
        network_host=settings.network_host_ok, network_problem=rules.problem,
        seccomp=seccomp_text(settings.seccomp) if level != "none" else "",
        layers=("overlay" if host_ids(settings) is not None and problem is None
                else "read-only host" if level != "none" else ""),
    )


def seccomp_text(mode: str) -> str:
    """What the host's `seccomp` setting gives on this machine, for `hosts`."""
    if mode == "default" and syscall_filter.for_mode(mode, platform.machine()) is None:
        return f"unconfined (no system call table for {platform.machine()})"
    return mode


def network_rules(settings: Settings) -> NetworkRules:
    """What this host grants workspaces' networks (`Settings.network_*`, its tools)."""
    return NetworkRules(default=NetworkPolicy(mode=settings.network_default),
                        host_ok=settings.network_host_ok, problem=network.support(settings),
                        allow_problem=network.allow_support(settings))


def host_ids(settings: Settings) -> id_slots.HostIds | None:
    """The subordinate ids this host gives its workspaces (None: single-tenant). Read
    again after a minute (an operator who adds them needs no restart)."""
    return _host_ids.get((settings.run_as, os.geteuid(), settings.id_range),
                         lambda: _read_host_ids(settings))


_host_ids: TimedMemo[tuple[str | None, int, str | None], id_slots.HostIds | None] = \
    TimedMemo(ttl_s=60.0)


def _read_host_ids(settings: Settings) -> id_slots.HostIds | None:
    try:
        user = run_user(settings)
    except OSError:
        return None
    return id_slots.host_ids(user.name, only=settings.id_range) if user is not None else None


def id_scope_problem(settings: Settings) -> str | None:
    """Why this worker's workspaces' ids may not be the machine's alone (None: its lock
    directory is provably the machine's, or the operator gave it a range of its own)."""
    if settings.id_range is not None:
        return None
    return _id_scope.get(str(settings.id_lock_dir),
                         lambda: id_slots.lock_scope(settings.id_lock_dir))


_id_scope: TimedMemo[str, str | None] = TimedMemo(ttl_s=600.0)


def startup_problems(settings: Settings) -> tuple[list[str], list[str]]:
    """(errors, warnings) for a worker starting with `settings`: errors refuse the start
    (a sandbox asked for and not working, a run user that cannot be), warnings are shown
    (calls run unsandboxed, no cgroups)."""
    errors: list[str] = []
    warnings: list[str] = []
    try:
        run_user(settings)
    except OSError as exc:
        errors.append(exc.strerror or str(exc))
    if settings.id_range is not None and os.geteuid() == 0:
        user = run_user(settings) if not errors else None
        bad = id_slots.range_problem(user.name, settings.id_range) if user is not None else None
        if bad is not None:
            errors.append(bad)
    found = probe(settings)
    if found.id_problem is not None:
        warnings.append(f"workspaces' host ids may not be this machine's alone: "
                        f"{found.id_problem}")
    if found.problem is not None and settings.isolation in ("process", "strict"):
        errors.append(f"isolation {settings.isolation!r} is configured but {found.problem}")
    elif found.isolation == "none":
        warnings.append(f"calls run WITHOUT a sandbox: {found.problem}; a command can read "
                        "this worker's processes, environment and files")
    if found.network_problem is not None and found.isolation != "none" \
            and settings.network_default != "none":
        warnings.append(f"workspaces get no network (policy `none`; `egress` is refused "
                        f"when asked for): {found.network_problem}")
    if settings.keeper_idle_s and found.isolation != "none":
        _, no_holder = holder.find(settings)
        if no_holder is not None:
            warnings.append(f"idle workspaces keep their keepers awake (~2 MiB each): "
                            f"{no_holder}")
    if found.isolation != "none" and host_ids(settings) is not None:
        _, no_spawner = holder.find_spawner(settings)
        if no_spawner is not None:
            warnings.append(f"keepers start calls by a fork of themselves (~3 ms a call "
                            f"more than by the spawner): {no_spawner}")
    if found.cgroup is None and settings.cgroups != "off":
        warnings.append(f"workspaces get no cgroup of their own ({found.cgroup_problem}): "
                        "memory and process limits fall back to ulimit (per process, not "
                        "per workspace), CPU bandwidth is not limited")
    return errors, warnings


__all__ = ["SandboxError"]

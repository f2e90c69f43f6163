"""What a workspace's processes see: which host paths are hidden or protected in
its view, the view's specification, the user they run as inside (an image's user
parsed from its files), and their environment, shell and HOME.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bashfleet import worker
from bashfleet.worker.engine import id_slots, layout, sandbox
from bashfleet.worker.engine.memo import TimedMemo
from bashfleet.worker.engine.snapshots import snapshot_store
from bashfleet.worker.engine.workspaces import store
from bashfleet.worker.engine.workspaces.store import WorkspaceError
from bashfleet.worker.settings import Settings, secret_paths
from bashfleet.worker.state_dir import default_state_dir
from bashfleet.worker.wire.models import (
    ImageInfo,
    WorkspaceRecord,
)

# ------------------------------------------------------------------ the view (impure)


#: (state dirs and workspace roots registered on this machine), re-read after 10 s.
_known: TimedMemo[str, tuple[str, ...]] = TimedMemo(ttl_s=10.0)
_registered: set[tuple[str, str]] = set()


def _registry_dirs() -> list[Path]:
    """Where this user's workers register their state directories and workspace roots:
    the default state directory, and the one of the user's passwd home (which an
    XDG_STATE_HOME of a test or a service may differ from)."""
    home = pwd.getpwuid(os.geteuid()).pw_dir
    dirs = {default_state_dir() / "known", Path(home) / ".local/state/bashfleet/known"}
    return sorted(dirs)


def register_known(settings: Settings) -> None:
    """Record this worker's state directory and workspace root where every worker of this
    user looks for the directories to hide (two fleets on one machine hide each other's)."""
    added = False
    for path in (str(settings.state_dir), str(settings.workspace_root_dir())):
        for registry in _registry_dirs():
            if (str(registry), path) in _registered:
                continue
            with contextlib.suppress(OSError):
                registry.mkdir(parents=True, exist_ok=True, mode=0o700)
                name = hashlib.sha256(path.encode()).hexdigest()[:24]
                (registry / name).write_text(path, encoding="utf-8")
                _registered.add((str(registry), path))
                added = True
    if added:
        _known.clear()


def known_dirs() -> tuple[str, ...]:
    """Every state directory and workspace root registered on this machine (this user's)."""
    return _known.get("", _read_known)


def _read_known() -> tuple[str, ...]:
    """The registered directories that still exist; the entries of those gone (a test's
    temporary fleet, a removed state directory) are dropped on the way. An entry's path
    is read and resolved once (`_resolved`: its file never changes, a new path is a new
    file): a look every 10 s is a listing and a stat a directory, not a read and a
    resolution of each (on a machine with hundreds registered, 50-150 ms on the path of
    the workspace made next)."""
    found: set[str] = set()
    seen: set[tuple[str, int]] = set()
    for registry in _registry_dirs():
        with contextlib.suppress(OSError), os.scandir(registry) as listing:
            for entry in listing:
                with contextlib.suppress(OSError):
                    key = (entry.path, entry.inode())
                    real = _resolved.get(key)
                    if real is None:
                        path = Path(entry.path).read_text("utf-8").strip()
                        real = _resolved[key] = os.path.realpath(path) if path else ""
                    if real and os.path.isdir(real):
                        found.add(real)
                        seen.add(key)
                    else:
                        os.unlink(entry.path)
    for key in set(_resolved) - seen:
        del _resolved[key]
    return tuple(sorted(found))


#: (registry entry, its inode) -> the real path it registers ("" for none).
_resolved: dict[tuple[str, int], str] = {}


def hidden_paths(settings: Settings, record: WorkspaceRecord) -> list[str]:
    """What a workspace's calls must not see (the workspace's own paths are bound back)."""
    home = pwd.getpwuid(os.geteuid()).pw_dir
    wanted = [
        str(settings.state_dir), str(default_state_dir()),
        os.path.join(home, ".local/state/bashfleet"), os.path.join(home, ".config/bashfleet"),
        str(settings.workspace_root_dir()), "/etc/bashfleet", *settings.workspace_allow,
        *settings.sandbox_hidden, *map(str, secret_paths(settings)),
        # The login sessions' runtime directories: ssh-agent's and D-Bus's sockets, which
        # a read-only bind does not stop a connect() to.
        "/run/user",
    ]
    if record.isolation == "strict":
        wanted += ["/home", "/root"]
    return wanted


def protected_paths() -> list[str]:
    """What no call may change even inside a writable root: the installed package and
    the Python that runs the worker."""
    package = os.path.dirname(os.path.realpath(worker.__file__ or ""))
    # Its sibling `client` (the engine never imports it): installed side by side.
    found = {package, os.path.join(os.path.dirname(package), "client")}
    found |= {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    found.add(os.path.dirname(os.path.realpath(sys.executable)))
    return sorted(p for p in found if p and p != "/")


def view_spec(record: WorkspaceRecord, settings: Settings, user: sandbox.User | None,
              *, image_root: str | None = None, prebuilt: bool = False) -> layout.ViewSpec:
    """What `record`'s view is made of, looked up on this host now."""
    register_known(settings)
    state = Path(os.path.realpath(store.state_path(settings, record.id)))
    dirs: list[str] = []
    files: list[str] = []
    writable, _ = layout.existing(settings.sandbox_writable)
    if image_root is None:  # an image's view holds nothing of the host's to hide
        dirs, files = layout.existing(hidden_paths(settings, record))
        # Real and existing already (looked up once every 10 s).
        own = (home_of(user, record), record.path, record.out_dir, *record.mounts, *writable)
        dirs += could_show(known_dirs(), own)
    lowers = snapshot_store.chain_paths(record, settings) if record.lowers else ()
    hosts = state / "layer" / layout.ETC_HOSTS
    return layout.ViewSpec(
        root=str(state / "layer" / "merged" if prebuilt else state / "root"),
        workspace=record.path, workspace_dir=record.dir, lowers=lowers,
        out_dir=record.out_dir,
        tmp=str(state / "tmp"), var_tmp=str(state / "vartmp"), home=str(state / "home"),
        home_view=home_of(user, record), home_in_root=image_root is not None,
        entries=() if image_root else host_entries(),
        hidden_dirs=tuple(dirs), hidden_files=tuple(files), writable=tuple(writable),
        protected=tuple(protected_paths()), mounts=record.mounts,
        has_var_tmp=os.path.isdir("/var/tmp"),
        layers=str(state / "layer") if record.ids is not None else None,
        image=image_root,
        etc_hosts=str(hosts) if image_root is None and record.ids is not None
        and hosts.is_file() else None,
        project=record.ids is not None and not record.fresh, prebuilt=prebuilt,
    )


#: Where a view has its own directories, not the host's (`layout.OWN_ENTRIES`, /var/tmp).
OWN_AREAS = ("/tmp", "/var/tmp", "/proc", "/dev")


def could_show(paths: Sequence[str], own: Sequence[str]) -> list[str]:
    """The host directories of `paths` whose hiding can change the plan of a view whose
    own paths (HOME, directory, outputs, mounts, writable roots) are among `own`: all but
    those in the view's own /tmp, /var/tmp, /proc or /dev (the rule `layout.plan_view`
    applies) that hold none of its own paths and lie in none (a writable root in a
    hidden directory is hidden). Known state directories are mostly tests' temporary
    ones, hundreds on a developer's machine: left out here, they cost the plan nothing.
    By string prefix and a set of the own paths' ancestors, not `layout.inside` per
    pair: ~1,000 paths in well under a millisecond."""
    in_area = tuple(f"{area}/" for area in OWN_AREAS)
    mine = [path.rstrip("/") for path in own if path.rstrip("/")]
    holding = {"/".join(path.split("/")[:n]) for path in mine
               for n in range(2, path.count("/") + 2)}  # each own path and its ancestors
    inner = tuple(f"{path}/" for path in mine)
    return [path for path in paths
            if not (path in OWN_AREAS or path.startswith(in_area))
            or path in holding or path.startswith(inner)]


def host_entries() -> tuple[layout.Entry, ...]:
    """The entries of the host's `/`, listed again whenever `/` changed (another process
    makes and removes top-level directories: a stale listing made new workspaces fail)."""
    try:
        changed = os.stat("/").st_mtime_ns
    except OSError:
        changed = 0
    return _entries.get(str(changed), lambda: layout.host_entries("/"))


_entries: TimedMemo[str, tuple[layout.Entry, ...]] = TimedMemo(ttl_s=60.0)


@dataclass(frozen=True)
class Inside:
    """Who a workspace's calls are inside its user namespace."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def inside_user(user: str | None, image: ImageInfo | None, image_root: str | None) -> Inside:
    """Who a workspace's calls run as inside its user namespace: the user it was made for
    (`user`: a name, `uid` or `uid:gid`), else the image's `USER`, else root. Names are
    looked up in the passwd and group files of its root filesystem (read without
    following a link out of it)."""
    wanted = user or (image.user if image is not None else "") or ""
    return parse_user(wanted, lambda name: _read_in_root(image_root or "/", name))


def parse_user(wanted: str, read: Callable[[str], str]) -> Inside:
    """`name`, `uid`, `name:group` or `uid:gid` -> who that is inside, by the passwd and
    group text `read("etc/passwd")` gives; WorkspaceError when unknown. Its HOME: its
    passwd entry's (root's /root), else `/home/<uid>` (made in the workspace's layer)."""
    if not wanted:
        return Inside(0, 0, (), "/root")
    user, _, group = wanted.partition(":")
    passwd = [line.split(":") for line in _safe(read, "etc/passwd").splitlines()]
    groups = [line.split(":") for line in _safe(read, "etc/group").splitlines()]
    entry = next((f for f in passwd if len(f) >= 6 and user in (f[0], f[2])), None)
    if entry is None and not user.isdigit():
        raise WorkspaceError("invalid", f"no user {user!r} in the workspace's /etc/passwd")
    uid = int(entry[2]) if entry is not None else int(user)
    gid = int(entry[3]) if entry is not None else uid
    if group:
        found = next((f for f in groups if len(f) >= 3 and group in (f[0], f[2])), None)
        if found is None and not group.isdigit():
            raise WorkspaceError("invalid", f"no group {group!r} in the workspace's /etc/group")
        gid = int(found[2]) if found is not None else int(group)
    name = entry[0] if entry is not None else None
    extra = sorted({int(f[2]) for f in groups if len(f) >= 4 and f[2].isdigit() and name
                    and name in f[3].split(",")} - {gid})
    if not (0 <= uid < id_slots.SLOT_SIZE and 0 <= gid < id_slots.SLOT_SIZE):
        raise WorkspaceError("invalid", f"user {wanted!r} is outside the workspace's ids "
                             f"(0-{id_slots.SLOT_SIZE - 1})")
    home = entry[5] if entry is not None else ""
    if not home.startswith("/") or home in ("/", "/nonexistent") or layout.inside(home, "/tmp"):
        home = "/root" if uid == 0 else f"/home/{uid}"
    return Inside(uid, gid, tuple(g for g in extra if g < id_slots.SLOT_SIZE), home)


def _safe(read: Callable[[str], str], name: str) -> str:
    try:
        return read(name)
    except (OSError, UnicodeDecodeError):
        return ""


def _read_in_root(root: str, rel: str) -> str:
    """A small file of a root filesystem, every component opened without following a
    link (an image's /etc/passwd may be a link to the host's /etc/shadow)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        parts = rel.split("/")
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
        file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        with os.fdopen(file_fd, "rb") as handle:
            return handle.read(1 << 20).decode("utf-8")
    finally:
        os.close(fd)


def workspace_env(record: WorkspaceRecord) -> dict[str, str]:
    """What a call's environment holds of its workspace (ids of its own): its image's ENV
    (the engine's hardening goes over it) and, for root, USER and LOGNAME."""
    env: dict[str, str] = {}
    for item in record.image.env if record.image is not None else []:
        name, sep, value = item.partition("=")
        if sep and name and name != "HOME":
            env[name] = value
    if not record.user and not (record.image and record.image.user):
        env.update(USER="root", LOGNAME="root")
    return env


def shell_of(record: WorkspaceRecord) -> str:
    """What runs a command in the workspace: bash, or `sh` in an image without bash."""
    return record.image.shell if record.image is not None else "bash"


def home_of(user: sandbox.User | None, record: WorkspaceRecord | None = None) -> str:
    """Where HOME is in a workspace's view, for `user` (None: the worker's own): /root for
    a workspace with ids of its own (its calls are root inside); else the user's home
    directory when the host has it or it can be made on the view's root
    (`/nonexistent`), else a directory of the workspace's /tmp."""
    if record is not None and record.ids is not None:
        return record.home or "/root"
    home = os.path.normpath(user.home if user is not None else os.path.expanduser("~"))
    usable = os.path.isabs(home) and home != "/" and (
        os.path.isdir(home) or os.path.dirname(home) == "/")
    return home if usable and not layout.inside(home, "/tmp") else "/tmp/home"

"""The workspaces of this host: made, found, used, reaped.

A workspace is a directory on this host plus the namespaces its calls share (its keeper:
`bashfleet.worker.engine.keeper`). Its record is a JSON file in the state directory
(`workspaces/<id>.json`, its mtime the time it was last used), beside its keeper's socket
and its private /tmp, /var/tmp and HOME. Its directory is either fresh
(`<workspace root>/<id>`, made and removed by the worker) or an existing directory under
a root the operator allows (`workspace_allow`). Its calls' kept output and its jobs'
output go to `<workspace root>/.out/<id>`, read-only in its view at the same path.

Workspaces are leases: unused for their TTL (or deleted by their owner), the host reaps
them (`reap`, run by the host supervisor): its keeper killed (so every process in it),
its cgroup and its files removed, its jobs' ends recorded. A call without a workspace
gets a throwaway one from a pool (`throwaways`), removed once it and its jobs end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import queue
import shutil
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bashfleet.worker.engine import (
    cgroups,
    ids,
    job_records,
    launcher,
    layout,
    network,
    procs,
    resources,
    sandbox,
    snapshots,
)
from bashfleet.worker.engine.launcher import (
    KeeperConnection,
    KeeperLostError,
    KeeperProcess,
    SandboxError,
)
from bashfleet.worker.engine.memo import TimedMemo
from bashfleet.worker.settings import Settings, default_state_dir, secret_paths
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.models import (
    ImageInfo,
    SnapshotRecord,
    WorkspaceRecord,
    WorkspaceSpec,
    WorkspaceView,
)
from bashfleet.worker.wire.network import NetworkPolicy

log = logging.getLogger("bashfleet.workspaces")

#: How often a workspace's keeper looks at its lease, and how long past its TTL (or its
#: record's removal) it ends the workspace itself when no worker of its host did.
LEASE_LOOK_S = 30.0
LEASE_GRACE_S = 300.0
#: Seconds a workspace deletion waits for its keeper (and so its processes) to be gone.
KEEPER_END_S = 10.0
#: Most bytes a disk usage count looks at files for before it stops counting.
USAGE_FILES_LIMIT = 200_000


class WorkspaceError(ToolError):
    """A workspace could not be made, found or used."""


def new_id() -> str:
    """A workspace id unique across hosts and time."""
    return f"w{uuid.uuid4().hex[:15]}"


# ------------------------------------------------------------------------------ paths


def record_path(settings: Settings, ws_id: str) -> Path:
    """The workspace's record."""
    return settings.workspaces_dir / f"{ws_id}.json"


def state_path(settings: Settings, ws_id: str) -> Path:
    """Its private /tmp, /var/tmp, HOME, and the mount point of its view's root."""
    return settings.workspaces_dir / ws_id


def socket_path(settings: Settings, ws_id: str) -> Path:
    """Its keeper's socket."""
    return settings.workspaces_dir / f"{ws_id}.sock"


def out_dir(settings: Settings, ws_id: str) -> Path:
    """Where its output files go (the same path in its view, read-only there)."""
    return settings.workspace_root_dir() / ".out" / ws_id


# --------------------------------------------------------------------------- records


def save(record: WorkspaceRecord, settings: Settings) -> None:
    """Write the record atomically (its mtime is its last use)."""
    path = record_path(settings, record.id)
    tmp = path.with_name(f".{record.id}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(record.model_dump_json())
    os.replace(tmp, path)
    _loaded.pop((settings.workspaces_dir, record.id), None)


#: (directory, id) -> (mtime, record): a call reads its workspace's record once (a stat
#: after that), not a JSON parse per call.
_loaded: dict[tuple[Path, str], tuple[int, WorkspaceRecord]] = {}


def load(ws_id: str, settings: Settings) -> WorkspaceRecord:
    """The record of workspace `ws_id` on this host; WorkspaceError `not_found`."""
    if not _valid_id(ws_id):
        raise WorkspaceError("not_found", f"no such workspace: {ws_id!r}")
    path = record_path(settings, ws_id)
    try:
        mtime = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        raise WorkspaceError("not_found", f"no such workspace on host {settings.host}: "
                             f"{ws_id}") from None
    cached = _loaded.get((settings.workspaces_dir, ws_id))
    if cached is not None and cached[0] == mtime:
        return cached[1]
    try:
        record = WorkspaceRecord.model_validate_json(path.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise WorkspaceError("not_found", f"workspace {ws_id} is unreadable: {exc}") from None
    _loaded[(settings.workspaces_dir, ws_id)] = (mtime, record)
    return record


def _valid_id(ws_id: str) -> bool:
    return len(ws_id) == 16 and ws_id[0] == "w" and all(c in "0123456789abcdef" for c in ws_id[1:])


def local_records(settings: Settings) -> list[WorkspaceRecord]:
    """Every workspace record kept on this host."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(settings.workspaces_dir):
            if entry.name.endswith(".json") and _valid_id(entry.name[:-5]):
                with contextlib.suppress(WorkspaceError):
                    found.append(load(entry.name[:-5], settings))
    return found


def touch(record: WorkspaceRecord, settings: Settings) -> None:
    """Mark it used now (a call, a control call, a file operation, `renew`)."""
    path = record_path(settings, record.id)
    with contextlib.suppress(FileNotFoundError):
        os.utime(path)
        _loaded[(settings.workspaces_dir, record.id)] = (os.stat(path).st_mtime_ns, record)


def last_used(record: WorkspaceRecord, settings: Settings) -> float | None:
    """When it was last used (None: its record is gone)."""
    try:
        return os.stat(record_path(settings, record.id)).st_mtime
    except FileNotFoundError:
        return None


def view(record: WorkspaceRecord, settings: Settings, *, count: bool = False) -> WorkspaceView:
    """What a client is shown of it (`count`: its disk bytes and processes too)."""
    used = last_used(record, settings)
    return WorkspaceView(
        id=record.id, host=record.host, owner=record.owner, path=record.path,
        isolation=record.isolation, network=record.network, ttl_s=record.ttl_s,
        created_at=record.created_at, last_used_at=used,
        expires_at=None if used is None else used + record.ttl_s, session=record.session,
        tags=record.tags, limits=record.limits, run_as=record.run_as,
        image=f"{record.image.ref}@{record.image.digest}" if record.image is not None else None,
        disk_bytes=disk_bytes(record, settings) if count else None,
        processes=len(processes(record)) if count else None,
        snapshot=record.lowers[0] if record.lowers else None,
    )


# ------------------------------------------------------------------------- making one


def create(spec: WorkspaceSpec, settings: Settings, *, throwaway: bool = False,
           ws_id: str | None = None) -> WorkspaceRecord:
    """Make a workspace as `spec` asks (its keeper ready for calls); WorkspaceError
    (`invalid`, `unavailable`, `spawn_failed`) when it cannot be."""
    snapshot = None
    if spec.snapshot is not None:
        snapshot, spec = _from_snapshot(spec, settings)
    choice = choose(spec, settings)
    user = _user(settings)
    if snapshot is not None and (choice.level == "none" or sandbox.host_ids(settings) is None):
        raise WorkspaceError("unavailable", f"host {settings.host} is single-tenant (`bashfleet "
                             "hosts`): a workspace made from a snapshot needs ids of its own")
    if (spec.image or spec.build) and (choice.level == "none"
                                       or sandbox.host_ids(settings) is None):
        raise WorkspaceError("unavailable", "an image needs a host that gives each workspace "
                             "host ids of its own (a root worker whose run user has "
                             "subordinate ids; `bashfleet hosts` says `single-tenant`)")
    image, image_root = _image(spec, settings, snapshot)
    blank = None
    if choice.level != "none":
        try:
            # Made from a snapshot, its host layers stand on the snapshot's: built at claim.
            blank = blanks.take(settings, blank_kind(choice.network),
                                prebuilt=image_root is None and snapshot is None)
        except OSError as exc:
            raise WorkspaceError("spawn_failed", f"could not make the workspace's sandbox: "
                                 f"{exc.strerror or exc}") from exc
    try:
        return _create(spec, settings, choice, user, blank, image, image_root,
                       throwaway=throwaway, ws_id=ws_id, snapshot=snapshot)
    except BaseException:
        if blank is not None:
            blank.end()  # never claimed, or its claim failed: its id slot freed with it
        raise


def _create(spec: WorkspaceSpec, settings: Settings, choice: sandbox.Choice,  # noqa: PLR0917
            user: sandbox.User | None, blank: Blank | None, image: ImageInfo | None,
            image_root: str | None, *, throwaway: bool, ws_id: str | None,
            snapshot: SnapshotRecord | None = None) -> WorkspaceRecord:
    slot = blank.slot if blank is not None else None
    if (spec.image or spec.build) and slot is None:
        raise WorkspaceError("unavailable", "this host gave the workspace no ids of its own "
                             "(its subordinate ids changed?): an image needs them")
    ws_id = ws_id or new_id()
    inside = inside_user(spec.user, image, image_root) if slot is not None else None
    owner = ((slot.uid + inside.uid, slot.gid + inside.gid) if slot is not None and inside
             else (user.uid, user.gid) if user else None)
    path, fresh = _directory(spec.path or project_dir(spec.near, settings), ws_id, settings,
                             owner)
    granted = resources.granted(spec.limits, settings)
    lowers: tuple[str, ...] = ()
    shown_at = path
    mounts = spec.mounts
    if snapshot is not None:
        # Its directory is where its snapshot's was in the view (every path an agent saw
        # there works); what it changes there is kept in the fresh one made above.
        lowers, shown_at = snapshot.layers, snapshot.path
        mounts = {**snapshot.mounts, **spec.mounts}
    record = WorkspaceRecord(
        id=ws_id, host=settings.host, owner=spec.owner, path=shown_at, fresh=fresh,
        out_dir=str(out_dir(settings, ws_id)), isolation=choice.level, network=choice.network,
        ttl_s=spec.ttl_s or settings.workspace_ttl_s, created_at=time.time(), limits=granted,
        mounts=_mounts(mounts, path, owner if fresh else _run_user_ids(user),
                       make=snapshot is None),
        session=spec.session, tags=spec.tags, throwaway=throwaway,
        run_as=user.name if user else sandbox.run_user_name(settings),
        image=image, ids=(slot.uid, ids.SLOT_SIZE) if slot is not None else None,
        user=spec.user, home=inside.home if inside is not None else None,
        lowers=lowers, dir=path if path != shown_at else None,
    )
    try:
        _make_dirs(record, settings, user, blank, image_root=image_root, owner=owner)
        if blank is not None:
            record = _start_keeper(record, settings, user, blank, inside=inside,
                                   image_root=image_root)
        save(record, settings)
    except BaseException:
        _remove_files(record, settings)
        raise
    return record


def _from_snapshot(spec: WorkspaceSpec, settings: Settings
                   ) -> tuple[SnapshotRecord, WorkspaceSpec]:
    """The snapshot a workspace is made from (on this host), and the spec it gives: its
    base, user and isolation are the snapshot's; its limits unless the spec says."""
    if spec.image or spec.build or spec.path:
        raise WorkspaceError("invalid", "a workspace made from a snapshot stands on the "
                             "snapshot's image or host root, in its directory: `image`, "
                             "`build` and `path` cannot change that")
    try:
        snapshot = snapshots.load(str(spec.snapshot), settings)
    except snapshots.SnapshotError as exc:
        raise WorkspaceError(exc.kind, exc.message) from None
    if snapshot.deleted or (snapshot.owner != spec.owner and spec.owner):
        raise WorkspaceError("not_found", f"no such snapshot on host {settings.host}: "
                             f"{snapshot.id}")
    limits = spec.limits if spec.limits.model_dump(exclude_none=True) else snapshot.limits
    return snapshot, spec.model_copy(update={
        "user": snapshot.user, "limits": limits, "near": None,
        "isolation": spec.isolation or snapshot.isolation,
        "network": snapshot.network if spec.network is None else spec.network,
    })


def _image(spec: WorkspaceSpec, settings: Settings, snapshot: SnapshotRecord | None = None
           ) -> tuple[ImageInfo | None, str | None]:
    """The image the workspace stands on, pulled or built now when this host has not
    got it (None: the host's own root)."""
    if snapshot is not None and snapshot.image is not None:
        from bashfleet.worker.engine import images  # noqa: PLC0415 - only image workspaces need it

        try:
            info, root = images.ensure_pinned(snapshot.image, settings)
        except ToolError as exc:
            raise WorkspaceError(exc.kind, f"snapshot {snapshot.id} stands on image "
                                 f"{snapshot.base()}: {exc.message}") from None
        return info, str(root)
    if not (spec.image or spec.build):
        return None, None
    from bashfleet.worker.engine import images  # noqa: PLC0415 - only image workspaces need it

    try:
        if spec.build:
            info, root = images.build(spec.build, settings)
        else:
            info, root = images.ensure(str(spec.image), settings)
    except ToolError as exc:
        raise WorkspaceError(exc.kind, exc.message) from None
    return info, str(root)


def _run_user_ids(user: sandbox.User | None) -> tuple[int, int] | None:
    """Who a project's new mount directories belong to: the run user, whose files a
    project's are (shown as the workspace root's where workspaces have ids of their
    own); a worker that is not root makes them as itself."""
    return (user.uid, user.gid) if user is not None else None


def choose(spec: WorkspaceSpec, settings: Settings) -> sandbox.Choice:
    """The isolation a workspace gets (WorkspaceError when it asks for what this host
    refuses)."""
    available, reason = sandbox.availability(settings)
    try:
        return sandbox.decide(
            configured=settings.isolation, available=available, reason=reason,
            asked=spec.isolation, network=spec.network, host_network=settings.sandbox_network,
            rules=sandbox.network_rules(settings),
        )
    except sandbox.IsolationError as exc:
        raise WorkspaceError(exc.kind, exc.message) from None


def blank_kind(policy: NetworkPolicy) -> str:
    """The kind of blank keeper a policy's workspace is made from: `host` (the host's
    namespace), `egress` (its link and rules made ahead), else `none` (a namespace of its
    own with its loopback only; `allow` is put in force at the claim)."""
    return policy.mode if policy.mode in ("host", "egress") else "none"


def _user(settings: Settings) -> sandbox.User | None:
    try:
        return sandbox.run_user(settings)
    except OSError as exc:
        raise WorkspaceError("spawn_failed", exc.strerror or str(exc)) from None


def project_dir(cwd: str | None, settings: Settings) -> str | None:
    """The directory under an allowed root an absolute `cwd` is in (the root's child that
    holds it: the project), else None (a fresh workspace). The project must exist, the
    cwd need not: a missing or non-directory cwd in a project is the call's error to
    report, from the project (a session opened there stays there)."""
    if cwd is None or not os.path.isabs(cwd):
        return None
    real = os.path.realpath(cwd)
    root = allowed_root(real, settings)
    if root is None:
        return None
    rest = os.path.relpath(real, root)
    project = root if rest == "." else os.path.join(root, rest.split(os.sep)[0])
    return project if os.path.isdir(project) else None


def allowed_root(path: str, settings: Settings) -> str | None:
    """The allowed root (`workspace_allow`) `path` is under, or None."""
    for root in settings.workspace_allow:
        real = os.path.realpath(os.path.expanduser(root))
        if layout.inside(path, real):
            return real
    return None


def _directory(asked: str | None, ws_id: str, settings: Settings,
               owner: tuple[int, int] | None) -> tuple[str, bool]:
    """(its directory, whether it is fresh): an existing directory under an allowed root,
    or a new one in the workspace root (0700 and root's when the worker is: no other
    local account finds or reads a workspace), owned by `owner` (the workspace's root)."""
    if asked is None:
        root = settings.workspace_root_dir()
        _ensure_dir(root, 0o700)
        path = root / ws_id
        path.mkdir(mode=0o755)
        if owner is not None:
            os.chown(path, *owner)
        return str(path), True
    if not os.path.isabs(asked):
        raise WorkspaceError("invalid", f"a workspace's path is absolute: {asked!r}")
    real = os.path.realpath(asked)
    if not os.path.isdir(real):
        raise WorkspaceError("bad_cwd", f"Working directory does not exist: {asked}")
    if allowed_root(real, settings) is None or layout.inside(real, "/proc") \
            or layout.inside(real, "/dev") or layout.inside(real, str(settings.state_dir)):
        roots = ", ".join(settings.workspace_allow) or "none"
        raise WorkspaceError("invalid", f"{asked} is not under a root this host allows for "
                             f"workspaces (workspace_allow: {roots})")
    return real, False


def _mounts(asked: dict[str, str], path: str,
            owner: tuple[int, int] | None, *, make: bool = True) -> dict[str, str]:
    """`{view path: subdirectory}` -> `{view path: host directory}`, made in the
    workspace when missing (owned by `owner`). Each is opened beneath the workspace one
    component at a time without following a symbolic link: the directory is a command's
    to change, and a link planted there must never make the worker (root) create, chown
    or bind a directory elsewhere."""
    mounts: dict[str, str] = {}
    for view_path, sub in asked.items():
        clean = os.path.normpath(view_path)
        if not os.path.isabs(view_path) or clean == "/" or layout.inside(clean, "/proc") \
                or layout.inside(clean, "/dev"):
            raise WorkspaceError("invalid", f"a mount's path is absolute and not /, /proc "
                                 f"or /dev: {view_path!r}")
        host = os.path.normpath(os.path.join(path, sub))
        if not layout.inside(host, path):
            raise WorkspaceError("invalid", f"a mount's source is inside the workspace: {sub!r}")
        if host != path and make:  # a snapshot's are in its layer already
            try:
                _make_beneath(path, os.path.relpath(host, path), owner)
            except OSError as exc:
                raise WorkspaceError("invalid", f"a mount's source {sub!r}: "
                                     f"{exc.strerror or exc}") from None
        if make and clean != path and layout.inside(clean, path):
            # Its mount point is in the workspace's directory (the same path on the host):
            # made here, as its owner, not by the keeper through a project's id map (where
            # the keeper's root is no id: EOVERFLOW).
            try:
                _make_beneath(path, os.path.relpath(clean, path), owner)
            except OSError as exc:
                raise WorkspaceError("invalid", f"a mount's path {view_path!r}: "
                                     f"{exc.strerror or exc}") from None
        mounts[clean] = host
    return mounts


def _make_beneath(base: str, rel: str, owner: tuple[int, int] | None) -> None:
    """Make the directory `rel` beneath `base` (and its parents), never following a
    symbolic link (ELOOP, ENOTDIR where one is); new ones owned by `owner`."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in rel.split(os.sep):
            if part in ("", ".", ".."):
                raise OSError(errno.EINVAL, "not a plain relative path")
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
                made = True
            except FileExistsError:
                made = False
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                              | os.O_CLOEXEC, dir_fd=fd)
            except (NotADirectoryError, OSError) as exc:
                if exc.errno in (errno.ENOTDIR, errno.ELOOP) and stat.S_ISLNK(
                        os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                    raise OSError(errno.ELOOP, f"{part} is a symbolic link (a mount never "
                                  "follows one)") from None
                raise
            os.close(fd)
            fd = nxt
            if made and owner is not None:
                os.fchown(fd, *owner)
    finally:
        os.close(fd)


def _ensure_dir(path: Path, mode: int) -> None:
    if not path.is_dir():
        path.mkdir(mode=mode, parents=True, exist_ok=True)
        path.chmod(mode)


def _make_dirs(record: WorkspaceRecord, settings: Settings, user: sandbox.User | None,
               blank: Blank | None = None, *, image_root: str | None = None,
               owner: tuple[int, int] | None = None) -> None:
    _ensure_dir(settings.workspaces_dir, 0o700)
    _ensure_dir(Path(record.out_dir).parent, 0o700)
    out = Path(record.out_dir)
    out.mkdir(mode=0o755, exist_ok=True)  # kept by a restore
    # This host's mark on it: its kept output outlives the workspace, until `bashfleet
    # gc` (`bashfleet.worker.retention`) removes it.
    (settings.workspaces_dir / f"{record.id}.out").write_text(record.out_dir, encoding="utf-8")
    state = state_path(settings, record.id)
    state.mkdir(mode=0o700)
    for name, mode in (("tmp", 0o1777), ("vartmp", 0o1777), ("home", 0o700), ("root", 0o700)):
        (state / name).mkdir(mode=mode)
        (state / name).chmod(mode)  # the umask took the sticky bit
    slot = blank.slot if blank is not None else None
    if slot is not None and blank is not None:
        os.chown(state / "home", *(owner or (slot.uid, slot.gid)))
        if blank.layers is not None:
            # Made (and mounted) ahead with its blank keeper: the overlays follow the move.
            os.rename(blank.layers, state / "layer")
            blank.layers = None
        elif record.lowers:
            _make_snapshot_layers(record, settings, slot, image_root)
        else:
            _make_layers(state / "layer", slot, image_root)
            if image_root is not None and record.image is not None and record.image.workdir:
                _make_workdir(state / "layer" / "upper" / "root", image_root,
                              record.image.workdir, slot)
    elif user is not None:
        os.chown(state / "home", user.uid, user.gid)


def _make_layers(layers: Path, slot: ids.Slot, image_root: str | None) -> None:
    """The workspace's own layers: for `/` and for each host entry shown through its user
    namespace, an upper directory (what its calls change) whose owner and mode are those
    of the directory it lies over as the workspace sees it (an overlay shows its upper
    root's), and a work directory the overlay needs."""
    for name in ("upper", "work", "empty"):
        (layers / name).mkdir(mode=0o700 if name != "empty" else 0o755, parents=True)
    _upper(layers, "root", os.stat(image_root) if image_root else None, slot)
    if image_root is not None:
        _seed_network_files(layers / "upper" / "root", image_root, slot)
    if image_root is None:
        for entry in IDMAPPED_ENTRIES:
            with contextlib.suppress(FileNotFoundError):
                info = os.stat(f"/{entry}", follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    _upper(layers, layout.upper_name(entry), info, slot)


def _make_snapshot_layers(record: WorkspaceRecord, settings: Settings, slot: ids.Slot,
                          image_root: str | None) -> None:
    """The layers of a workspace made from snapshots: empty uppers, each with the owner
    and mode of the newest snapshot's layer of it (what an overlay shows of its root),
    and work directories for its own directories' overlays too."""
    layers = state_path(settings, record.id) / "layer"
    for name in ("upper", "work", "empty"):
        (layers / name).mkdir(mode=0o700 if name != "empty" else 0o755, parents=True)
    newest = snapshots.layer_path(settings, record.lowers[0])
    del image_root  # the snapshot's layer of `/` has its image's root's owner and mode
    _upper(layers, "root", os.stat(newest / "root"), slot)
    for entry in IDMAPPED_ENTRIES:  # the host's real directories only, as `_make_layers`
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.stat(f"/{entry}", follow_symlinks=False).st_mode):
                name = layout.upper_name(entry)
                _upper(layers, name, os.stat(newest / name), slot)
    state = state_path(settings, record.id)
    own = {"home": state / "home", "tmp": state / "tmp", "vartmp": state / "vartmp",
           "work": Path(record.host_dir())}
    for name, upper in own.items():
        (layers / "work" / f"own.{name}").mkdir(mode=0o700)
        info = os.stat(newest / name)
        os.chown(upper, _shifted(info.st_uid, slot.uid), _shifted(info.st_gid, slot.gid))
        upper.chmod(stat.S_IMODE(info.st_mode))


#: What an image's workspace finds in its /etc for the network, as a container does
#: (its own to change: the files are in its upper layer).
HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def _seed_network_files(upper: Path, image_root: str, slot: ids.Slot) -> None:
    """/etc/hosts and the host's /etc/resolv.conf in an image workspace's own layer (an
    image's are empty or missing: names would not resolve)."""
    try:
        lower = os.stat(os.path.join(image_root, "etc"), follow_symlinks=False)
    except OSError:
        return
    if not stat.S_ISDIR(lower.st_mode):
        return
    etc = upper / "etc"
    etc.mkdir(mode=stat.S_IMODE(lower.st_mode))
    os.chown(etc, _shifted(lower.st_uid, slot.uid), _shifted(lower.st_gid, slot.gid))
    try:
        resolv = Path("/etc/resolv.conf").read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        resolv = ""
    for name, text in (("hosts", HOSTS), ("resolv.conf", resolv)):
        fd = os.open(etc / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            os.fchown(handle.fileno(), slot.uid, slot.gid)


def _make_workdir(upper: Path, image_root: str, workdir: str, slot: ids.Slot) -> None:
    """An image's WORKDIR, made in the workspace's own layer when the image has not got
    it (as container runtimes make it): each directory it lies in copied up with the
    image's owner and mode (an overlay shows its upper directory's), the new ones the
    workspace root's. A link on the way: left alone (the call's cwd error says so)."""
    lower, upper_dir = image_root, upper
    for part in [p for p in os.path.normpath(workdir).split("/") if p]:
        lower = os.path.join(lower, part)
        upper_dir = upper_dir / part
        try:
            info: os.stat_result | None = os.lstat(lower)
        except FileNotFoundError:
            info = None
        if info is not None and not stat.S_ISDIR(info.st_mode):
            return
        if upper_dir.exists():
            continue
        upper_dir.mkdir(mode=stat.S_IMODE(info.st_mode) if info else 0o755)
        os.chown(upper_dir, *((_shifted(info.st_uid, slot.uid), _shifted(info.st_gid, slot.gid))
                              if info else (slot.uid, slot.gid)))


def _shifted(host_id: int, first: int) -> int:
    """An image's (or the host's) id as the workspace's user namespace shows it."""
    return first + host_id if host_id < ids.SLOT_SIZE else host_id


def _upper(layers: Path, name: str, lower: os.stat_result | None, slot: ids.Slot) -> None:
    upper = layers / "upper" / name
    upper.mkdir(mode=0o755)
    (layers / "work" / name).mkdir(mode=0o700)
    if lower is None:
        os.chown(upper, slot.uid, slot.gid)
        return
    os.chown(upper, _shifted(lower.st_uid, slot.uid), _shifted(lower.st_gid, slot.gid))
    upper.chmod(stat.S_IMODE(lower.st_mode))


#: Entries of the host's `/` a workspace with ids of its own sees through its user
#: namespace, each an overlay with an upper layer of its own: the system's directories,
#: where package managers write (`apt-get install`, `pip install` into /usr/local).
#: Host root's files there are the workspace root's (secrets masked: `private_entries`);
#: every other entry (/home, /opt, /srv, /root...) is shown read-only with the host's
#: ids, which are nobody's in the workspace: a 0700 directory there stays shut to it.
IDMAPPED_ENTRIES = ("bin", "etc", "lib", "lib32", "lib64", "libx32", "sbin", "usr", "var")


def _start_keeper(record: WorkspaceRecord, settings: Settings, user: sandbox.User | None,
                  blank: Blank, *, inside: Inside | None,
                  image_root: str | None = None) -> WorkspaceRecord:
    """Claim a blank keeper for the workspace (made ahead: `Blanks`), name its socket and
    cgroup after it, write its limits, and have it build the workspace's view."""
    slot = blank.slot
    spec = view_spec(record, settings, user, image_root=image_root, prebuilt=blank.prebuilt)
    _make_mount_uppers(spec)
    plan = layout.plan_view(spec)
    body: dict[str, object] = {
        "plan": plan, "bound_to_maker": record.throwaway,
        "open_files": record.limits.open_files,
        "lease": {"dir": str(settings.workspaces_dir),
                  "name": record_path(settings, record.id).name, "ttl_s": record.ttl_s,
                  "look_s": LEASE_LOOK_S, "grace_s": LEASE_GRACE_S},
    }
    if slot is not None:
        # The run user's files (projects, shared writable roots: theirs on the host, as
        # on a single-tenant host) are the workspace root's through that map.
        body["ids"] = {"uid": slot.uid, "gid": slot.gid, "count": ids.SLOT_SIZE,
                       "shared": [user.uid, user.gid] if user is not None else None}
        who = inside or Inside(0, 0, (), "/root")
        body["user"] = [who.uid, who.gid, list(who.groups)]
    elif user is not None:
        body.update(uid=user.uid, gid=user.gid, groups=list(user.groups))
    sock_path = str(socket_path(settings, record.id))
    try:
        os.rename(blank.socket_path, sock_path)
        group = _claim_group(blank, record)
        conn = KeeperConnection.connect(sock_path)
        try:
            conn.claim(body)
        finally:
            connections.give_back(record.id, conn)
    except OSError as exc:
        raise WorkspaceError("spawn_failed", f"could not make the workspace's sandbox: "
                             f"{exc.strerror or exc}") from exc
    blank.forget()
    _claim_network(record, settings, blank)
    if slot is not None:
        skeleton = layer_listing(state_path(settings, record.id) / "layer" / "upper")
        _skeleton_path(settings, record.id).write_text(json.dumps(skeleton), encoding="utf-8")
    return record.model_copy(update={
        "keeper_pid": blank.pid, "keeper_start": blank.start, "socket_path": sock_path,
        "cgroup": tuple(path for path, _ in group.paths) if group is not None else (),
    })


def _make_mount_uppers(spec: layout.ViewSpec) -> None:
    """The upper layers of host entries that are overlays only to hold a mount point
    (`layout.mount_entries`): owner and mode the host's directory's, as it is shown."""
    for name in layout.mount_entries(spec):
        upper = Path(str(spec.layers)) / "upper" / layout.upper_name(name)
        if upper.is_dir():
            continue
        info = os.stat(f"/{name}", follow_symlinks=False)
        upper.mkdir(mode=0o755)
        os.chown(upper, info.st_uid, info.st_gid)
        upper.chmod(stat.S_IMODE(info.st_mode))
        (Path(str(spec.layers)) / "work" / layout.upper_name(name)).mkdir(mode=0o700)


def _claim_network(record: WorkspaceRecord, settings: Settings, blank: Blank) -> None:
    """The workspace's network as its policy says, before its first call: a blank's made
    ahead (`egress`, `none`, `host`) is it already; `allow` is put in force now."""
    state = blank.net
    if record.network.mode == "allow":
        try:
            state = network.apply(blank.pid, record.id, state, record.network, settings)
        except (OSError, subprocess.SubprocessError) as exc:
            raise WorkspaceError("spawn_failed", f"could not put network policy "
                                 f"{record.network} in force: {exc}") from exc
    if state.link is not None:  # none (no file: no link, no guard) costs no write
        network.save_state(settings, record.id, state)


def _claim_group(blank: Blank, record: WorkspaceRecord) -> cgroups.Group | None:
    if blank.group is None:
        return None
    group = cgroups.rename(blank.group, f"ws-{record.id}")
    blank.group = group
    cgroups.write_limits(group, resources.cgroup_limits(record.limits))
    group.baseline = group.counters()
    return group


#: Workspace id -> its cgroup as last read (the counters' baseline lives there: one read
#: after each call says which limit its processes hit since the last one).
_groups: dict[str, cgroups.Group] = {}


def group_of(record: WorkspaceRecord) -> cgroups.Group | None:
    """The workspace's cgroup (its counters: which limits its processes hit)."""
    if not record.cgroup:
        return None
    known = _groups.get(record.id)
    if known is not None and known.paths[0][0] == record.cgroup[0]:
        return known
    if len(_groups) > 4096:
        _groups.clear()
    _groups[record.id] = group = _read_group(record)
    group.hits()  # its baseline: what it hit before this process looked
    return group


def _read_group(record: WorkspaceRecord) -> cgroups.Group:
    version: Literal["v1", "v2"] = (
        "v2" if os.path.exists(os.path.join(record.cgroup[0], "cgroup.controllers")) else "v1")
    controllers = tuple(resources.cgroup_limits(record.limits).controllers())
    return cgroups.Group(version, [(path, controllers) for path in record.cgroup])


# --------------------------------------------------------------------- blank keepers


@dataclass
class Blank:
    """A keeper made ahead: its namespaces and cgroup ready, no view yet."""

    pid: int
    start: float | None
    socket_path: str
    group: cgroups.Group | None
    note: Path
    """Its file in the state directory (who made it): the reaper ends the blanks of a
    worker process that died."""
    slot: ids.Slot | None = None
    """Its host ids (the keeper holds their slot's lock; `fd` here is -1)."""
    layers: Path | None = None
    """Its layers, made ahead and mounted in its namespace (moved into the workspace's
    state when claimed)."""
    prebuilt: bool = False
    """Its `/` (the host's, in layers) is built: a claim binds the workspace's own paths."""
    net: network.State = dataclasses.field(default_factory=network.State)
    """Its network, made ahead (an `egress` blank's link and rules)."""
    ended: bool = False

    def end(self) -> None:
        """Kill it and remove what it held (a blank never claimed, or a failed claim)."""
        if self.ended:
            return
        self.ended = True
        with contextlib.suppress(ProcessLookupError):
            if self.start is None or procs.is_same_process(self.pid, self.start):
                os.kill(self.pid, 9)
        for path in (self.socket_path, str(self.note)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if self.layers is not None:
            threading.Thread(target=_remove_when_free, args=(self.layers,), daemon=True,
                             name="bashfleet-blank-end").start()
        if self.group is not None:
            threading.Thread(target=self.group.remove, kwargs={"timeout": 10.0},
                             daemon=True, name="bashfleet-blank-end").start()

    def forget(self) -> None:
        """It is a workspace now: its note goes."""
        self.ended = True
        with contextlib.suppress(FileNotFoundError):
            self.note.unlink()


def _remove_when_free(path: Path) -> None:
    """Remove a blank's layers once its namespace (where they were mounted) is gone."""
    deadline = time.monotonic() + 10.0
    while True:
        remove_tree(path)
        if not path.exists() or time.monotonic() > deadline:
            return
        time.sleep(0.05)  # the dead keeper's mounts are let go of a moment later


class Blanks:
    """Blank keepers made ahead, per network kind (`blank_kind`), in this process (a few:
    `workspace_pool`)."""

    def __init__(self) -> None:
        self.ready: dict[tuple[Path, str, bool], list[Blank]] = {}
        self.lock = threading.Lock()
        self.filling: set[tuple[Path, str, bool]] = set()
        self.threads: list[threading.Thread] = []

    def take(self, settings: Settings, kind: str, *, prebuilt: bool = True) -> Blank:
        """A blank keeper (made now when none is ready); more are made in the background.
        `prebuilt`: with the host's root in layers built ahead (an image's workspace wants
        its own `/`)."""
        key = (settings.state_dir, kind, prebuilt)
        with self.lock:
            ready = self.ready.get(key, [])
            blank = ready.pop() if ready else None
        self._fill_later(settings, kind, prebuilt)
        if blank is not None and (blank.start is None or procs.is_same_process(blank.pid,
                                                                              blank.start)):
            return blank
        if blank is not None:
            blank.end()
        return make_blank(settings, kind, prebuilt=prebuilt)

    def _fill_later(self, settings: Settings, kind: str, prebuilt: bool) -> None:
        key = (settings.state_dir, kind, prebuilt)
        with self.lock:
            if key in self.filling or len(self.ready.get(key, [])) >= settings.workspace_pool:
                return
            self.filling.add(key)
        thread = threading.Thread(target=self._fill, args=(settings, kind, prebuilt),
                                  daemon=True, name="bashfleet-blanks")
        with self.lock:
            self.threads = [t for t in self.threads if t.is_alive()] + [thread]
        thread.start()

    def _fill(self, settings: Settings, kind: str, prebuilt: bool) -> None:
        key = (settings.state_dir, kind, prebuilt)
        try:
            while len(self.ready.get(key, [])) < settings.workspace_pool:
                blank = make_blank(settings, kind, prebuilt=prebuilt)
                with self.lock:
                    self.ready.setdefault(key, []).append(blank)
        except OSError as exc:
            log.warning("could not make a keeper ahead: %s", exc)
        finally:
            with self.lock:
                self.filling.discard(key)

    def close(self) -> None:
        """End the blanks this process made (at its exit), those being made too."""
        with self.lock:
            threads = list(self.threads)
        for thread in threads:
            thread.join(timeout=launcher.KEEPER_SETUP_S)
        with self.lock:
            ready = [blank for blanks_ in self.ready.values() for blank in blanks_]
            self.ready.clear()
        for blank in ready:
            blank.end()


blanks = Blanks()
sandbox.on_close(blanks.close)


def make_blank(settings: Settings, net: str, *, prebuilt: bool = False) -> Blank:
    """A blank keeper: forked by the zygote into new namespaces, in a cgroup of its own;
    on a host that gives workspaces ids of their own, with a slot of them, its user
    namespace made, and (`prebuilt`) the host's root in layers of its own mounted."""
    _ensure_dir(settings.workspaces_dir, 0o700)
    name = f"blank-{uuid.uuid4().hex[:15]}"
    sock_path = str(settings.workspaces_dir / f"{name}.sock")
    note = settings.workspaces_dir / f"{name}.blank"
    slot = _claim_ids(settings)
    layers = settings.workspaces_dir / f"{name}.layer" if slot is not None and prebuilt \
        else None
    # `network` True: the host's namespace; else a namespace of its own.
    spec: dict[str, object] = {"network": net == "host", "worker_uid": os.geteuid(),
                               "maker": os.getpid()}
    group = None
    try:
        if slot is not None:
            spec["ids"] = {"uid": slot.uid, "gid": slot.gid, "count": ids.SLOT_SIZE}
            spec["slot"] = True
        if layers is not None and slot is not None:
            _make_layers(layers, slot, None)
            spec["prebuild"] = layout.prebuild_steps(str(layers), host_entries(),
                                                     frozenset(IDMAPPED_ENTRIES))
        with contextlib.suppress(OSError):
            group = resources.blank_group(settings, f"ws-{name}")
        listener = launcher.listen(sock_path)
    except BaseException:
        if slot is not None:
            slot.close()
        if layers is not None:
            remove_tree(layers)
        raise
    fds = group.procs_fds() if group is not None else []
    try:
        # `maker`: a blank keeper ends with the worker process that made it ahead (none
        # else would claim it); a claimed one lives on (a workspace outlives its worker).
        pid = sandbox.zygote.keeper(settings, spec, [listener.fileno(), *fds,
                                                     *([slot.fd] if slot else [])])
    except OSError:
        if group is not None:
            group.remove(timeout=0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sock_path)
        if layers is not None:
            remove_tree(layers)
        raise
    finally:
        listener.close()
        for fd in fds:
            os.close(fd)
        if slot is not None:
            slot.close()  # the keeper holds the lock now, for its life
    blank = Blank(pid, procs.start_time(pid), sock_path, group, note,
                  slot=dataclasses.replace(slot, fd=-1) if slot is not None else None,
                  layers=layers, prebuilt=layers is not None)
    if net == "egress":
        _blank_network(blank, settings)
    note.write_text(json.dumps({"pid": pid, "start": blank.start, "maker": os.getpid(),
                                "maker_start": procs.start_time(os.getpid()),
                                "cgroup": [p for p, _ in group.paths] if group else [],
                                "layers": str(layers) if layers else None}),
                    encoding="utf-8")
    return blank


def _blank_network(blank: Blank, settings: Settings) -> None:
    """An `egress` blank's link and rules, made ahead (off the workspace's path)."""
    try:
        blank.net = network.apply(blank.pid, None, network.State(), sandbox.EGRESS, settings)
    except BaseException:
        blank.end()
        raise


def _claim_ids(settings: Settings) -> ids.Slot | None:
    """Host ids of the workspace's own (None: a single-tenant host)."""
    host = sandbox.host_ids(settings)
    if host is None:
        return None
    return ids.claim(host, first=int.from_bytes(os.urandom(2), "big"))


def reap_blanks(settings: Settings) -> int:
    """End the blank keepers of worker processes that died; how many."""
    ended = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(settings.workspaces_dir):
            if not entry.name.endswith(".blank"):
                continue
            with contextlib.suppress(OSError, ValueError, KeyError):
                info = json.loads(Path(entry.path).read_text("utf-8"))
                maker_start = info.get("maker_start")
                if maker_start is not None and procs.is_same_process(info["maker"], maker_start):
                    continue
                group = cgroups.Group("v2", [(p, ()) for p in info.get("cgroup", [])])
                layers = info.get("layers")
                Blank(info["pid"], info.get("start"), entry.path[:-6] + ".sock", group,
                      Path(entry.path), layers=Path(layers) if layers else None).end()
                ended += 1
    return ended


# ------------------------------------------------------------------ the view (impure)


#: (state dirs and workspace roots registered on this machine), re-read after 10 s.
_known: TimedMemo[str, tuple[str, ...]] = TimedMemo(ttl_s=10.0)
_registered: set[tuple[str, str]] = set()


def _registry_dirs() -> list[Path]:
    """Where this user's workers register their state directories and workspace roots:
    the default state directory, and the one of the user's passwd home (which an
    XDG_STATE_HOME of a test or a service may differ from)."""
    import pwd  # noqa: PLC0415

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
    temporary fleet, a removed state directory) are dropped on the way."""
    found: set[str] = set()
    for registry in _registry_dirs():
        with contextlib.suppress(OSError), os.scandir(registry) as listing:
            for entry in listing:
                with contextlib.suppress(OSError):
                    path = Path(entry.path).read_text("utf-8").strip()
                    if path and os.path.isdir(path):
                        found.add(os.path.realpath(path))
                    else:
                        os.unlink(entry.path)
    return tuple(sorted(found))


def hidden_paths(settings: Settings, record: WorkspaceRecord) -> list[str]:
    """What a workspace's calls must not see (the workspace's own paths are bound back)."""
    import pwd  # noqa: PLC0415

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
    from bashfleet import worker  # noqa: PLC0415

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
    state = Path(os.path.realpath(state_path(settings, record.id)))
    dirs: list[str] = []
    files: list[str] = []
    if image_root is None:  # an image's view holds nothing of the host's to hide
        dirs, files = layout.existing(hidden_paths(settings, record))
        dirs += known_dirs()  # real and existing already (looked up once every 10 s)
        if record.ids is not None:
            private_dirs, private_files = private_entries()
            dirs += private_dirs
            files += private_files
    writable, _ = layout.existing(settings.sandbox_writable)
    lowers = snapshots.chain_paths(record, settings) if record.lowers else ()
    return layout.ViewSpec(
        root=str(state / "layer" / "merged" if prebuilt else state / "root"),
        workspace=record.path, workspace_dir=record.dir, lowers=lowers,
        out_dir=record.out_dir,
        tmp=str(state / "tmp"), var_tmp=str(state / "vartmp"), home=str(state / "home"),
        home_view=home_of(user, record),
        entries=() if image_root else host_entries(),
        hidden_dirs=tuple(dirs), hidden_files=tuple(files), writable=tuple(writable),
        protected=tuple(protected_paths()), mounts=record.mounts,
        has_var_tmp=os.path.isdir("/var/tmp"),
        layers=str(state / "layer") if record.ids is not None else None,
        image=image_root, idmapped=frozenset(IDMAPPED_ENTRIES),
        project=record.ids is not None and not record.fresh, prebuilt=prebuilt,
    )


def host_entries() -> tuple[layout.Entry, ...]:
    """The entries of the host's `/`, listed again whenever `/` changed (another process
    makes and removes top-level directories: a stale listing made new workspaces fail)."""
    try:
        changed = os.stat("/").st_mtime_ns
    except OSError:
        changed = 0
    return _entries.get(str(changed), lambda: layout.host_entries("/"))


_entries: TimedMemo[str, tuple[layout.Entry, ...]] = TimedMemo(ttl_s=60.0)


def private_entries() -> tuple[list[str], list[str]]:
    """(directories, files) under the system directories a workspace sees as its root's
    (/etc, /var) that other users of the host may not read: host root's secrets (shadow,
    TLS and ssh host keys, service state), masked in its view. Found again when one of
    the directories where services keep such things changed (a service installed since),
    and at least once a minute; to a depth of four below /etc and /var. Empty files and
    empty directories hide nothing and stay (apt's and dpkg's locks and download
    directories: a workspace's `apt-get install` needs them)."""
    stamps = []
    for folder in PRIVATE_WATCHED:
        with contextlib.suppress(OSError):
            stamps.append(os.stat(folder).st_mtime_ns)
    return _private.get(str(stamps), _find_private)


_private: TimedMemo[str, tuple[list[str], list[str]]] = TimedMemo(ttl_s=60.0)
PRIVATE_DEPTH = 4
#: Where a service's install makes a private directory: a change in one lists again.
PRIVATE_WATCHED = ("/etc", "/etc/ssl", "/etc/ssh", "/var", "/var/lib", "/var/cache",
                   "/var/log", "/var/spool", "/var/backups", "/var/mail")


def _find_private() -> tuple[list[str], list[str]]:
    dirs: list[str] = []
    files: list[str] = []
    stack = [("/etc", 0), ("/var", 0)]
    while stack:
        folder, depth = stack.pop()
        with contextlib.suppress(OSError), os.scandir(folder) as listing:
            for entry in listing:
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        if info.st_mode & 0o005 != 0o005:
                            if os.listdir(entry.path):
                                dirs.append(entry.path)
                        elif depth < PRIVATE_DEPTH and entry.path not in ("/var/tmp",):
                            stack.append((entry.path, depth + 1))
                    elif stat.S_ISREG(info.st_mode) and not info.st_mode & 0o004 \
                            and info.st_size > 0:
                        files.append(entry.path)
    return dirs, files


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
    if not (0 <= uid < ids.SLOT_SIZE and 0 <= gid < ids.SLOT_SIZE):
        raise WorkspaceError("invalid", f"user {wanted!r} is outside the workspace's ids "
                             f"(0-{ids.SLOT_SIZE - 1})")
    home = entry[5] if entry is not None else ""
    if not home.startswith("/") or home in ("/", "/nonexistent") or layout.inside(home, "/tmp"):
        home = "/root" if uid == 0 else f"/home/{uid}"
    return Inside(uid, gid, tuple(g for g in extra if g < ids.SLOT_SIZE), home)


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


# ---------------------------------------------------------------- calls in a workspace


class _Connections:
    """Idle connections to keepers, per workspace, in this process."""

    def __init__(self) -> None:
        self.idle: dict[str, list[KeeperConnection]] = {}
        self.lock = threading.Lock()

    def take(self, record: WorkspaceRecord) -> KeeperConnection:
        with self.lock:
            idle = self.idle.get(record.id)
            if idle:
                return idle.pop()
        if record.socket_path is None:
            raise KeeperLostError(2, f"workspace {record.id} has no sandbox")
        return KeeperConnection.connect(record.socket_path)

    def give_back(self, ws_id: str, conn: KeeperConnection) -> None:
        with self.lock:
            idle = self.idle.setdefault(ws_id, [])
            if conn.reusable and len(idle) < 8:
                idle.append(conn)
                return
        conn.close()

    def drop(self, ws_id: str) -> None:
        with self.lock:
            idle = self.idle.pop(ws_id, [])
        for conn in idle:
            conn.close()


connections = _Connections()


class WorkspaceProcess(KeeperProcess):
    """A call in a workspace; its connection goes back to the pool when it ended."""

    def __init__(self, record: WorkspaceRecord, conn: KeeperConnection, started: object) -> None:
        super().__init__(conn, started)  # type: ignore[arg-type]
        self.record = record

    def ended(self) -> None:
        if self.conn.clean is not None:
            recycled[self.record.id] = self.conn.clean
        connections.give_back(self.record.id, self.conn)


#: Workspace id -> whether its throwaway call left it clean (its keeper said so in the
#: call's status); read once by `Throwaways.end`.
recycled: dict[str, bool] = {}


def start(record: WorkspaceRecord, request: dict[str, object], fds: list[int],
          timeout: float = sandbox.ANSWER_TIMEOUT_S) -> WorkspaceProcess:
    """Start a call in the workspace; SandboxError when it could not (KeeperLostError:
    the workspace is gone)."""
    for attempt in range(2):
        conn = connections.take(record)
        try:
            started = conn.start(request, fds, timeout)
        except KeeperLostError:
            conn.close()
            if attempt:
                raise
            continue  # an idle connection whose keeper restarted: a fresh one
        except SandboxError:
            connections.give_back(record.id, conn)
            raise
        return WorkspaceProcess(record, conn, started)
    raise AssertionError("unreachable")  # pragma: no cover


# -------------------------------------------------------------------------- its state


def processes(record: WorkspaceRecord) -> list[int]:
    """Host pids of the processes running in the workspace (its keeper excluded)."""
    if record.keeper_pid is None or not keeper_alive(record):
        return []
    try:
        ns = os.stat(f"/proc/{record.keeper_pid}/ns/pid").st_ino
    except OSError:
        return []
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == record.keeper_pid:
            continue
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{name}/ns/pid").st_ino == ns:
                found.append(int(name))
    return found


def keeper_alive(record: WorkspaceRecord) -> bool:
    """True while the workspace's keeper (so its namespaces) lives."""
    if record.keeper_pid is None:
        return record.isolation == "none"
    if record.keeper_start is None:
        return procs.start_time(record.keeper_pid) is not None
    return procs.is_same_process(record.keeper_pid, record.keeper_start)


def disk_bytes(record: WorkspaceRecord, settings: Settings) -> int:
    """Bytes the workspace holds on disk: its directory (when fresh), /tmp, /var/tmp,
    HOME, its output and its own layers (what it changed of its `/`)."""
    state = state_path(settings, record.id)
    roots = [state / "tmp", state / "vartmp", state / "home", Path(record.out_dir),
             state / "layer" / "upper"]
    if record.fresh:
        roots.append(Path(record.host_dir()))
    return sum(_tree_bytes(root) for root in roots)


def _tree_bytes(root: Path) -> int:
    total = 0
    seen = 0
    stack = [str(root)]
    while stack and seen < USAGE_FILES_LIMIT:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as listing:
            for entry in listing:
                seen += 1
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
    return total


def full_path(settings: Settings, ws_id: str) -> Path:
    """The flag a workspace over its disk cap has (its bytes, when last counted)."""
    return settings.workspaces_dir / f"{ws_id}.full"


def over_disk_cap(record: WorkspaceRecord, settings: Settings) -> int | None:
    """The bytes a workspace held when last counted over its disk cap; None: under it."""
    try:
        return int(full_path(settings, record.id).read_text("ascii") or 0)
    except (OSError, ValueError):
        return None


def disk_cap_notice(record: WorkspaceRecord, used: int) -> str:
    """What every call of a workspace over its disk cap is told."""
    cap = record.limits.disk_mb
    return (f"\n[bashfleet: workspace {record.id} holds {used / 2**20:.0f} MiB on disk, past its "
            f"cap of {cap} MiB: its background jobs were stopped and new ones are refused "
            "until files are removed (its directory, /tmp, HOME)]\n")


def check_disk(record: WorkspaceRecord, settings: Settings) -> int | None:
    """Count a capped workspace's bytes; past the cap flag it and stop its background
    jobs (the call that freed space removes the flag at the next count). Its bytes
    when over, else None."""
    cap = record.limits.disk_mb
    if cap is None:
        return None
    used = disk_bytes(record, settings)
    flag = full_path(settings, record.id)
    if used <= cap * 2**20:
        flag.unlink(missing_ok=True)
        return None
    flag.write_text(str(used), encoding="ascii")
    from bashfleet.worker.engine import jobs  # noqa: PLC0415 - jobs imports this module

    for job in job_records.running_in(settings, record.id):
        jobs.kill_job(job, settings=settings, grace_s=2.0)
        job_records.write_status(job, -15, note=f"stopped: workspace {record.id} passed its "
                                 f"disk cap of {cap} MiB", replace=True)
    return used


# --------------------------------------------------------------------------- its end


def delete(ws_id: str, settings: Settings, *, note: str = "its workspace was deleted") -> bool:
    """End a workspace: its keeper killed (so every process in it), its jobs' ends
    recorded, its cgroup and files removed. False when there was none."""
    try:
        record = load(ws_id, settings)
    except WorkspaceError:
        return False
    connections.drop(ws_id)
    _end_keeper(record)
    job_records.end_workspace_jobs(settings, ws_id, note)
    for path in record.cgroup:
        cgroups.Group("v2", [(path, ())]).remove(timeout=2.0)
    _remove_files(record, settings)
    full_path(settings, ws_id).unlink(missing_ok=True)
    record_path(settings, ws_id).unlink(missing_ok=True)
    _loaded.pop((settings.workspaces_dir, ws_id), None)
    return True


def restore(ws_id: str, snap_id: str, settings: Settings) -> tuple[WorkspaceRecord, int]:
    """Put a workspace's files back to a snapshot's: its processes ended (how many, in
    the answer), its own layers replaced by empty ones over the snapshot's; its id,
    path, owner, session, tags and lease kept. WorkspaceError (`invalid`, `not_found`)
    before anything is touched when the snapshot cannot be its."""
    record = load(ws_id, settings)
    try:
        snapshot = snapshots.load(snap_id, settings)
    except snapshots.SnapshotError as exc:
        raise WorkspaceError(exc.kind, exc.message) from None
    if snapshot.deleted or snapshot.owner != record.owner:
        raise WorkspaceError("not_found", f"no such snapshot on host {settings.host}: "
                             f"{snap_id}")
    base = "host" if record.image is None else f"{record.image.ref}@{record.image.digest}"
    if snapshot.path != record.path or snapshot.base() != base or record.ids is None:
        raise WorkspaceError("invalid", (
            f"snapshot {snap_id} is of a workspace in {snapshot.path} on {snapshot.base()}; "
            f"workspace {ws_id} is in {record.path} on {base}: restore it to a snapshot "
            "of itself (or of one it was made from), or make a new workspace from this one"))
    if snapshot.image is not None:
        _image(WorkspaceSpec(), settings, snapshot)  # held (or pulled) before it is undone
    ended = len(processes(record))
    connections.drop(ws_id)
    _end_keeper(record)
    job_records.end_workspace_jobs(settings, ws_id, f"its workspace was restored to {snap_id}")
    for path in record.cgroup:
        cgroups.Group("v2", [(path, ())]).remove(timeout=2.0)
    _remove_files(record, settings)
    full_path(settings, ws_id).unlink(missing_ok=True)
    spec = WorkspaceSpec(owner=record.owner, snapshot=snap_id, isolation=record.isolation,
                         network=record.network, ttl_s=record.ttl_s, limits=record.limits,
                         session=record.session, tags=record.tags)
    try:
        made = create(spec, settings, ws_id=ws_id)
    except BaseException:
        record_path(settings, ws_id).unlink(missing_ok=True)  # nothing of it is left
        raise
    made = made.model_copy(update={"created_at": record.created_at})
    save(made, settings)
    return made, ended


def set_network(ws_id: str, policy: NetworkPolicy, settings: Settings) -> WorkspaceRecord:
    """Put another network policy in force in a live workspace (its processes keep
    running; connections the new policy refuses are cut). `host` is the namespace a
    workspace was made in: never changed to or from (WorkspaceError `invalid`)."""
    record = load(ws_id, settings)
    if record.keeper_pid is None or not keeper_alive(record):
        raise WorkspaceError("invalid", f"workspace {ws_id} has no sandbox (isolation "
                             f"{record.isolation!r}): its network is the host's")
    if (policy.mode == "host") != (record.network.mode == "host"):
        raise WorkspaceError("invalid", f"workspace {ws_id} was made "
                             f"{'in' if record.network.mode == 'host' else 'out of'} the "
                             "host's network namespace, which a live workspace cannot "
                             "leave or join: make a new one")
    try:
        sandbox.decide(configured=settings.isolation, available=True, reason=None,
                       asked=record.isolation, network=policy,
                       host_network=settings.sandbox_network, rules=sandbox.network_rules(settings))
    except sandbox.IsolationError as exc:
        raise WorkspaceError(exc.kind, exc.message) from None
    with _network_lock:
        state = network.load_state(settings, ws_id)
        try:
            state = network.apply(record.keeper_pid, ws_id, state, policy, settings)
        except (OSError, subprocess.SubprocessError) as exc:
            raise WorkspaceError("spawn_failed", f"could not put network policy {policy} "
                                 f"in force: {exc}") from exc
        finally:
            network.save_state(settings, ws_id, state)
        record = record.model_copy(update={"network": policy})
        save(record, settings)
    return record


#: One policy change at a time in this process (a change reads, then writes, `<id>.net`).
_network_lock = threading.Lock()


def _end_keeper(record: WorkspaceRecord) -> None:
    if record.keeper_pid is None or not keeper_alive(record):
        return
    try:
        pidfd = os.pidfd_open(record.keeper_pid)
    except ProcessLookupError:
        return
    try:
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.keeper_pid, 9)  # pid 1 of its namespace: the kernel ends them all
        launcher.readable(pidfd, KEEPER_END_S)
    finally:
        os.close(pidfd)


def _remove_files(record: WorkspaceRecord, settings: Settings) -> None:
    remove_tree(state_path(settings, record.id))
    with contextlib.suppress(OSError):  # an output directory with nothing kept in it
        os.rmdir(record.out_dir)
        (settings.workspaces_dir / f"{record.id}.out").unlink()
    socket_path(settings, record.id).unlink(missing_ok=True)
    network.state_path(settings, record.id).unlink(missing_ok=True)
    network.denied_path(settings, record.id).unlink(missing_ok=True)
    Path(f"{network.denied_path(settings, record.id)}.seen").unlink(missing_ok=True)
    own_dir = record.host_dir()
    if record.fresh and layout.inside(own_dir, str(settings.workspace_root_dir())) \
            and own_dir != str(settings.workspace_root_dir()):
        remove_tree(Path(own_dir))


def remove_tree(path: Path) -> None:
    """Remove a tree a call may have made hard to remove (directories without write or
    execute permission for the worker that is not root)."""
    def unlock(func: object, failed: str, exc: object) -> None:
        del func, exc
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            os.chmod(failed, 0o700)
        with contextlib.suppress(OSError):
            if os.path.isdir(failed) and not os.path.islink(failed):
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)

    if path.exists() or path.is_symlink():
        shutil.rmtree(path, onerror=unlock)


def reap(settings: Settings, now: float | None = None) -> list[WorkspaceRecord]:
    """Delete the workspaces unused past their TTL and those whose keeper is gone. The
    host supervisor runs this every few seconds."""
    now = time.time() if now is None else now
    reaped: list[WorkspaceRecord] = []
    for record in local_records(settings):
        used = last_used(record, settings)
        if used is None:
            continue
        expired = now - used > record.ttl_s
        if not expired and keeper_alive(record):
            check_disk(record, settings)
            continue
        if expired or not keeper_alive(record):
            note = "its workspace expired (unused past its TTL)" if expired else \
                "its workspace's sandbox ended"
            if delete(record.id, settings, note=note):
                reaped.append(record)
    reap_blanks(settings)
    return reaped


# ----------------------------------------------------------------- throwaway workspaces


def _left_nothing(record: WorkspaceRecord, settings: Settings) -> bool:
    """No file in its directory, /tmp, /var/tmp, HOME or output directory but the mount
    points its view made (a workspace path under /tmp has its parents made in its /tmp)."""
    state = state_path(settings, record.id)
    skeleton = _skeleton(record)
    return all(_only(path, skeleton if path.name == "tmp" else set()) for path in (
        Path(record.path), state / "tmp", state / "vartmp", state / "home",
        Path(record.out_dir))) and _layer_unchanged(record, settings)


def layer_listing(upper: Path) -> list[list[object]]:
    """Every entry of a workspace's upper layers, with its type, mode and owner: what its
    view's build left there (mount points), to tell later whether a call changed any."""
    found: list[list[object]] = []
    stack = [upper]
    while stack:
        folder = stack.pop()
        with contextlib.suppress(OSError), os.scandir(folder) as listing:
            for entry in listing:
                info = entry.stat(follow_symlinks=False)
                found.append([os.path.relpath(entry.path, upper), info.st_mode, info.st_uid,
                              info.st_gid, info.st_size if not stat.S_ISDIR(info.st_mode)
                              else 0])
                if stat.S_ISDIR(info.st_mode):
                    stack.append(Path(entry.path))
    return sorted(found, key=lambda item: str(item[0]))


def _skeleton_path(settings: Settings, ws_id: str) -> Path:
    return state_path(settings, ws_id) / "layer.skeleton"


def _layer_unchanged(record: WorkspaceRecord, settings: Settings) -> bool:
    """A workspace with layers of its own: its upper layers hold just what its view's
    build put there (a throwaway's next call, maybe another owner's, sees nothing of this
    one's, in /usr or anywhere)."""
    if record.ids is None:
        return True
    upper = state_path(settings, record.id) / "layer" / "upper"
    try:
        kept = json.loads(_skeleton_path(settings, record.id).read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return bool(kept == layer_listing(upper))


def _skeleton(record: WorkspaceRecord) -> set[str]:
    """Paths (relative to /tmp) of the mount points the view made in its /tmp."""
    found: set[str] = set()
    for path in (record.path, record.out_dir, *record.mounts):
        if layout.inside(path, "/tmp") and path != "/tmp":
            parts = os.path.relpath(path, "/tmp").split(os.sep)
            found.update(os.sep.join(parts[:n]) for n in range(1, len(parts) + 1))
    return found


def _only(root: Path, skeleton: set[str], prefix: str = "") -> bool:
    """`root` holds nothing but the directories of `skeleton` (relative paths)."""
    try:
        with os.scandir(root) as listing:
            for entry in listing:
                rel = f"{prefix}{entry.name}"
                if rel not in skeleton or not entry.is_dir(follow_symlinks=False):
                    return False
                if not _only(Path(entry.path), skeleton, f"{rel}{os.sep}"):
                    return False
    except OSError:
        return False
    return True


#: How long a throwaway workspace may go without a call before the reaper takes it: longer
#: than any call or job may run (a background job's 24 h), so one in use is never reaped.
THROWAWAY_TTL_S = 25 * 3600.0


def _pool_size(settings: Settings) -> int:
    """Throwaway workspaces kept ready: a consumer's slots can all start a call at once."""
    return max(settings.workspace_pool, settings.concurrency)


class Throwaways:
    """Workspaces made ahead for calls without one (a consumer's slots' worth), so such a
    call does not wait the few milliseconds one takes to make; given back after a call
    that left nothing in it (`end`), by one thread of this process."""

    def __init__(self) -> None:
        self.ready: dict[tuple[Path, sandbox.Choice], list[WorkspaceRecord]] = {}
        self.lock = threading.Lock()
        self.filling: set[tuple[Path, sandbox.Choice]] = set()
        self.ended: queue.SimpleQueue[tuple[WorkspaceRecord, Settings] | None] = \
            queue.SimpleQueue()
        self.recycler: threading.Thread | None = None

    def take(self, settings: Settings, spec: WorkspaceSpec) -> WorkspaceRecord:
        """A throwaway workspace for `spec` (its owner set, marked used now)."""
        if spec.path is not None:
            return create(spec.model_copy(update={"ttl_s": THROWAWAY_TTL_S}), settings,
                          throwaway=True)
        choice = choose(spec, settings)
        key = (settings.state_dir, choice)
        record = self._pop(key)
        if record is None:
            # None ready: make this one now, and some ahead for the calls that follow
            # (those that end give theirs back: `end`).
            self._refill_later(settings, choice)
            return create(spec.model_copy(update={"ttl_s": THROWAWAY_TTL_S}), settings,
                          throwaway=True)
        touch(record, settings)
        # Its owner and tags are this call's: held here, not written (no call reads them
        # from its record; the next call that takes it gets its own).
        return record.model_copy(update={"owner": spec.owner, "tags": spec.tags})

    def _pop(self, key: tuple[Path, sandbox.Choice]) -> WorkspaceRecord | None:
        with self.lock:
            ready = self.ready.get(key, [])
            while ready:
                record = ready.pop()
                if keeper_alive(record):
                    return record
        return None

    def _refill_later(self, settings: Settings, choice: sandbox.Choice) -> None:
        key = (settings.state_dir, choice)
        with self.lock:
            if key in self.filling or len(self.ready.get(key, [])) >= _pool_size(settings):
                return
            self.filling.add(key)
        threading.Thread(target=self._refill, args=(settings, choice), daemon=True,
                         name="bashfleet-throwaways").start()

    def _refill(self, settings: Settings, choice: sandbox.Choice) -> None:
        key = (settings.state_dir, choice)
        spec = WorkspaceSpec(isolation=choice.level, network=choice.network,
                             ttl_s=THROWAWAY_TTL_S)
        try:
            while len(self.ready.get(key, [])) < _pool_size(settings):
                record = create(spec, settings, throwaway=True)
                with self.lock:
                    self.ready.setdefault(key, []).append(record)
        except (OSError, WorkspaceError) as exc:
            log.warning("could not make a throwaway workspace ahead: %s", exc)
        finally:
            with self.lock:
                self.filling.discard(key)

    def fill(self, settings: Settings) -> None:
        """Make the host default's throwaways now (a consumer's start)."""
        spec = WorkspaceSpec()
        self._refill_later(settings, choose(spec, settings))

    def end(self, record: WorkspaceRecord, settings: Settings, *, jobs_left: bool) -> None:
        """After its call: made ready for another call when nothing of this one is left in
        it, else removed (off the call's path, by the recycling thread); while a job it
        started runs, removed once that ends (its keeper exits then; the reaper removes
        the rest)."""
        if jobs_left and record.keeper_pid is not None:
            try:
                conn = connections.take(record)
                conn.exit_when_idle()
                connections.give_back(record.id, conn)
                return
            except OSError:
                pass
        if jobs_left:
            return  # an unsandboxed one: reaped with its TTL once its jobs ended
        # Sandboxed: its keeper killed what the call left and said it is clean.
        # Unsandboxed: no namespace holds its processes apart, so none is promised (a
        # call sees and reaches every process and file of the worker's user anyway):
        # an empty directory serves the next call, as the old runner's cwd did.
        clean = recycled.pop(record.id, None) if record.keeper_pid is not None else True
        if clean and record.fresh and _left_nothing(record, settings) \
                and self._give_back(record, settings):
            return  # nothing of the call is left in it
        self.ended.put((record, settings))
        with self.lock:
            if self.recycler is None or not self.recycler.is_alive():
                self.recycler = threading.Thread(target=self._recycle_loop, daemon=True,
                                                 name="bashfleet-recycler")
                self.recycler.start()

    def _recycle_loop(self) -> None:
        while (item := self.ended.get()) is not None:
            try:
                self._recycle_or_delete(*item)
            except Exception:  # the thread lives on for the next ones
                log.exception("could not recycle or delete workspace %s", item[0].id)

    def _recycle_or_delete(self, record: WorkspaceRecord, settings: Settings) -> None:
        """Back to the ready ones when its call left nothing: no process, no file in its
        directory, /tmp, /var/tmp, HOME or output directory (a kept output is another's
        to read only), nothing in /dev/shm, no IPC object. Else deleted."""
        clean = False
        if record.fresh and record.keeper_pid is not None:
            try:
                conn = connections.take(record)
                clean = conn.recycle()
                connections.give_back(record.id, conn)
            except OSError:
                clean = False
        if not (clean and _left_nothing(record, settings) and self._give_back(record, settings)):
            delete(record.id, settings)

    def _give_back(self, record: WorkspaceRecord, settings: Settings) -> bool:
        """Back to the ready ones, if the pool has room."""
        key = (settings.state_dir, sandbox.Choice(record.isolation, record.network))
        with self.lock:
            ready = self.ready.setdefault(key, [])
            if len(ready) >= _pool_size(settings):
                return False
            ready.append(record.model_copy(update={"owner": "", "tags": {}}))
        return True

    def close(self) -> None:
        """Delete the ready ones nobody took."""
        with self.lock:
            ready = [(key[0], record) for key, records in self.ready.items()
                     for record in records]
            self.ready.clear()
        for state_dir, record in ready:
            delete_at(state_dir, record)


throwaways = Throwaways()
sandbox.on_close(throwaways.close)


def delete_at(state_dir: Path, record: WorkspaceRecord) -> None:
    """Delete `record`'s workspace kept in `state_dir` (its keeper, files, cgroup)."""
    settings = Settings(state_dir=state_dir, host=record.host,
                        workspace_root=Path(record.out_dir).parent.parent)
    delete(record.id, settings)

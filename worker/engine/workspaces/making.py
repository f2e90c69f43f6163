"""Making a workspace: its directory, its layers and mounts, its keeper.

A workspace's directory is either fresh (`<workspace root>/<id>`, made and removed by
the worker) or an existing directory under a root the operator allows
(`workspace_allow`). Its root filesystem is the host's or an image's, or a snapshot's
layers over them, with a writable layer of its own. A blank keeper from the pool
(`blank_pool`) is claimed when one fits; otherwise a keeper is started for it here.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from bashfleet.worker.engine import cgroups, holder, id_slots, layout, resources, sandbox
from bashfleet.worker.engine.isolate.launcher import (
    KeeperConnection,
)
from bashfleet.worker.engine.network import network
from bashfleet.worker.engine.snapshots import snapshot_store
from bashfleet.worker.engine.workspaces import blank_pool, disk, keeper_calls, store, visibility
from bashfleet.worker.engine.workspaces.store import WorkspaceError
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.models import (
    ImageInfo,
    SnapshotRecord,
    WorkspaceRecord,
    WorkspaceSpec,
)
from bashfleet.worker.wire.network import NetworkPolicy

# ------------------------------------------------------------------------- making one


def create(spec: WorkspaceSpec, settings: Settings, *, throwaway: bool = False,
           ws_id: str | None = None,
           admit: Callable[[str], None] | None = None) -> WorkspaceRecord:
    """Make a workspace as `spec` asks (its keeper ready for calls); WorkspaceError
    (`invalid`, `unavailable`, `spawn_failed`) when it cannot be. Its id: `ws_id`, else
    the one its blank keeper's cgroup is named for, else a new one; `admit` is given it
    before the keeper is claimed, and what it raises ends the making."""
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
    image, image_root = image_of(spec, settings, snapshot)
    blank = None
    if choice.level != "none":
        try:
            # Made from a snapshot, its host layers stand on the snapshot's: built at claim.
            blank = blank_pool.blanks.take(settings, blank_kind(choice.network),
                                prebuilt=image_root is None and snapshot is None)
        except OSError as exc:
            raise WorkspaceError("spawn_failed", f"could not make the workspace's sandbox: "
                                 f"{exc.strerror or exc}") from exc
    try:
        ws_id = ws_id or (blank.ws_id if blank is not None else None) or store.new_id()
        if admit is not None:
            admit(ws_id)
        return _create(spec, settings, choice, user, blank, image, image_root,
                       throwaway=throwaway, ws_id=ws_id, snapshot=snapshot)
    except BaseException:
        if blank is not None:
            blank.end()  # never claimed, or its claim failed: its id slot freed with it
        raise


def _create(spec: WorkspaceSpec, settings: Settings, choice: sandbox.Choice,  # noqa: PLR0917
            user: sandbox.User | None, blank: blank_pool.Blank | None, image: ImageInfo | None,
            image_root: str | None, *, throwaway: bool, ws_id: str,
            snapshot: SnapshotRecord | None = None) -> WorkspaceRecord:
    slot = blank.slot if blank is not None else None
    if (spec.image or spec.build) and slot is None:
        raise WorkspaceError("unavailable", "this host gave the workspace no ids of its own "
                             "(its subordinate ids changed?): an image needs them")
    inside = visibility.inside_user(spec.user, image, image_root) if slot is not None else None
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
        out_dir=str(store.out_dir(settings, ws_id)), isolation=choice.level, network=choice.network,
        ttl_s=spec.ttl_s or settings.workspace_ttl_s, created_at=time.time(), limits=granted,
        mounts=_mounts(mounts, path, owner if fresh else _run_user_ids(user),
                       make=snapshot is None),
        session=spec.session, tags=spec.tags, throwaway=throwaway,
        run_as=user.name if user else sandbox.run_user_name(settings),
        image=image, ids=(slot.uid, id_slots.SLOT_SIZE) if slot is not None else None,
        user=spec.user, home=inside.home if inside is not None else None,
        lowers=lowers, dir=path if path != shown_at else None,
    )
    try:
        _make_dirs(record, settings, user, blank, image_root=image_root, owner=owner)
        if blank is not None:
            record = _start_keeper(record, settings, user, blank, inside=inside,
                                   image_root=image_root)
        store.save(record, settings)
        if blank is not None:
            # Its note goes only now that the record names its keeper and cgroup: a
            # claim that failed is ended with it (`create`), and a worker killed before
            # this leaves the reaper the note (`reap_blanks`).
            blank.forget()
    except BaseException:
        disk.remove_files(record, settings)
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
        snapshot = snapshot_store.load(str(spec.snapshot), settings)
    except snapshot_store.SnapshotError as exc:
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


def image_of(spec: WorkspaceSpec, settings: Settings, snapshot: SnapshotRecord | None = None
           ) -> tuple[ImageInfo | None, str | None]:
    """The image the workspace stands on, pulled or built now when this host has not
    got it (None: the host's own root)."""
    if snapshot is not None and snapshot.image is not None:
        from bashfleet.worker.engine.images import images  # noqa: PLC0415 - only image workspaces need it

        try:
            info, root = images.ensure_pinned(snapshot.image, settings)
        except ToolError as exc:
            raise WorkspaceError(exc.kind, f"snapshot {snapshot.id} stands on image "
                                 f"{snapshot.base()}: {exc.message}") from None
        return info, str(root)
    if not (spec.image or spec.build):
        return None, None
    from bashfleet.worker.engine.images import images  # noqa: PLC0415 - only image workspaces need it

    try:
        if spec.build:
            info, root = images.build(spec.build, settings, network=spec.build_network)
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


#: The most blank keepers a fork keeps made ahead for the next (each an idle keeper).
BURST_MAX = 16


def make_ahead(source: WorkspaceRecord | SnapshotRecord, settings: Settings,
               count: int) -> None:
    """Have the blank keepers of `count` workspaces from a snapshot of `source` (or from
    snapshot `source`) made or on their way (a fork's burst, at most BURST_MAX): the
    missing ones are made side by side in the background. A fork asks before its
    snapshot is taken (they are made meanwhile, not after it, one claim waiting on each)
    and again once its workspaces are made, so that the next fork of that size finds
    them ready (sixteen forks with their blanks made at once took 230-370 ms on a loaded
    2-core machine, most of it making the blanks: more than a whole fork may take); a
    host fetching a snapshot from the registry asks as its pull starts."""
    if source.isolation != "none" and sandbox.host_ids(settings) is not None:
        blank_pool.blanks.ahead(settings, blank_kind(source.network), prebuilt=False,
                                count=min(count, BURST_MAX))


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
        disk.ensure_dir(root, 0o700)
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


def _make_dirs(record: WorkspaceRecord, settings: Settings, user: sandbox.User | None,
               blank: blank_pool.Blank | None = None, *, image_root: str | None = None,
               owner: tuple[int, int] | None = None) -> None:
    disk.ensure_dir(settings.workspaces_dir, 0o700)
    disk.ensure_dir(Path(record.out_dir).parent, 0o700)
    out = Path(record.out_dir)
    out.mkdir(mode=0o755, exist_ok=True)  # kept by a restore
    # This host's mark on it: its kept output outlives the workspace, until `bashfleet
    # gc` (`bashfleet.worker.retention`) removes it.
    (settings.workspaces_dir / f"{record.id}.out").write_text(record.out_dir, encoding="utf-8")
    state = store.state_path(settings, record.id)
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
            disk.make_snapshot_layers(record, settings, slot, image_root,
                                      snapshot_store.layer_path(settings, record.lowers[0]))
        else:
            disk.make_layers(state / "layer", slot, image_root)
            upper = state / "layer" / "upper" / "root"
            if image_root is not None and record.image is not None and record.image.workdir:
                disk.make_dir_in_image(upper, image_root, record.image.workdir, slot)
            if image_root is not None and record.home and owner is not None:
                # Its HOME is the image's (its .bashrc and .profile: a login shell's conda
                # activation), made in its layer, its user's, only when the image has none.
                disk.make_dir_in_image(upper, image_root, record.home, slot, owner=owner)
    elif user is not None:
        os.chown(state / "home", user.uid, user.gid)


def _start_keeper(record: WorkspaceRecord, settings: Settings, user: sandbox.User | None,
                  blank: blank_pool.Blank, *, inside: visibility.Inside | None,
                  image_root: str | None = None) -> WorkspaceRecord:
    """Claim a blank keeper for the workspace (made ahead: `Blanks`), name its socket and
    cgroup after it, write its limits, and have it build the workspace's view."""
    slot = blank.slot
    spec = visibility.view_spec(record, settings, user, image_root=image_root,
                                prebuilt=blank.prebuilt)
    _make_mount_uppers(spec)
    plan = layout.plan_view(spec)
    body: dict[str, object] = {
        "plan": plan, "bound_to_maker": record.throwaway,
        "open_files": record.limits.open_files,
        "lease": {"dir": str(settings.workspaces_dir),
                  "name": store.record_path(settings, record.id).name, "ttl_s": record.ttl_s,
                  "look_s": store.LEASE_LOOK_S, "grace_s": store.LEASE_GRACE_S},
    }
    if settings.keeper_idle_s and not record.throwaway:
        # Its keeper sleeps when idle, a holder keeping the workspace (where one is built).
        body.update(holder=holder.find(settings)[0], idle_s=settings.keeper_idle_s)
    if slot is not None:
        # Its calls start as a vfork of the spawner, not a fork of the keeper (where the
        # holder binary is built): with ids of its own, the spawner's are never a call's.
        body["spawner"] = holder.spawner(settings)
        # The run user's files (projects, shared writable roots: theirs on the host, as
        # on a single-tenant host) are the workspace root's through that map.
        body["ids"] = {"uid": slot.uid, "gid": slot.gid, "count": id_slots.SLOT_SIZE,
                       "shared": [user.uid, user.gid] if user is not None else None}
        who = inside or visibility.Inside(0, 0, (), "/root")
        body["user"] = [who.uid, who.gid, list(who.groups)]
    elif user is not None:
        body.update(uid=user.uid, gid=user.gid, groups=list(user.groups))
    sock_path = str(store.socket_path(settings, record.id))
    try:
        os.rename(blank.socket_path, sock_path)
        group = _claim_group(blank, record)
        conn = KeeperConnection.connect(sock_path)
        try:
            conn.claim(body)
        finally:
            keeper_calls.connections.give_back(record.id, conn)
    except OSError as exc:
        raise WorkspaceError("spawn_failed", f"could not make the workspace's sandbox: "
                             f"{exc.strerror or exc}") from exc
    _claim_network(record, settings, blank)
    if slot is not None:
        upper = store.state_path(settings, record.id) / "layer" / "upper"
        # What its view's mounts cover is left out: no call can change it.
        covered = disk.covered_by_mounts(disk.view_mount_points(blank.pid), os.listdir(upper))
        skeleton = {"listing": disk.layer_listing(upper, covered), "covered": sorted(covered)}
        disk.skeleton_path(settings, record.id).write_text(json.dumps(skeleton),
                                                                     encoding="utf-8")
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


def _claim_network(record: WorkspaceRecord, settings: Settings, blank: blank_pool.Blank) -> None:
    """The workspace's network as its policy says, before its first call: a blank's made
    ahead (`egress`, `none`, `host`) is it already; `allow` is put in force now."""
    state = blank.net
    if record.network.mode == "allow":
        try:
            state = network.apply(blank.pid, record.id, state, record.network, settings)
        except (OSError, subprocess.SubprocessError) as exc:
            raise WorkspaceError("spawn_failed", f"could not put network policy "
                                 f"{record.network} in force: {exc}") from exc
    if state.link is not None or state.pasta is not None:  # none costs no write
        network.save_state(settings, record.id, state)


def _claim_group(blank: blank_pool.Blank, record: WorkspaceRecord) -> cgroups.Group | None:
    if blank.group is None:
        return None
    group = blank.group
    if record.id != blank.ws_id:  # an id its maker chose (a restore keeps its own)
        blank.hold(cgroups.rename(group, f"ws-{record.id}"))
        group = blank.group
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
    if version == "v2":
        return cgroups.Group(version, [(path, controllers) for path in record.cgroup])
    # v1: a directory per hierarchy, each with its own controllers' counters. Looked up
    # once (the group is kept): otherwise every call's end tries every counter file in
    # every directory, and most are not there.
    return cgroups.Group(version, [
        (path, tuple(name for name in controllers if any(
            os.path.exists(os.path.join(path, filename))
            for filename, _ in cgroups.counter_files(version, name))))
        for path in record.cgroup])

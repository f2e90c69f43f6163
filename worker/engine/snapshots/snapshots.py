"""Snapshots: a workspace's own layers, frozen read-only, that new workspaces stand on.

A workspace with ids of its own keeps what its calls change in directories of its own:
the upper layer of its `/`, its `/tmp`, `/var/tmp`, HOME and directory. A snapshot is a copy of
them, taken while the cgroup freezer holds its processes still (they go on after, their
streams and jobs untouched), with the ids shifted to the image's own (0-65535), so that
it is a layer like an image's: shown through any workspace's user namespace.

    snapshots/<id>.json        its record (`SnapshotRecord`): what it stands on
    snapshots/<id>/layer/      root/ home/ tmp/ vartmp/ work/

A workspace made from one (`fork`, `snapshot=`, `restore`) has the snapshot's layers,
and those it stood on, between an empty upper layer of its own and its base: made in
the time of any workspace, whatever the snapshot holds. A snapshot lives its TTL, and
past it (or deleted) as long as a workspace or a later snapshot stands on it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from bashfleet.worker.engine import cgroups, id_slots, layout, procs
from bashfleet.worker.engine.snapshots import fork_delta, fork_reuse, snapshot_store, tree_copy
from bashfleet.worker.engine.snapshots.snapshot_store import SnapshotError
from bashfleet.worker.engine.workspaces import disk, store, usage
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.models import SnapshotRecord, WorkspaceRecord

#: Seconds a copy may take before the snapshot is given up (its source thawed at once).
COPY_TIMEOUT_S = 600.0
#: Seconds a snapshot made by `fork` is kept before its forks stand on it.
HIDDEN_GRACE_S = fork_reuse.HIDDEN_GRACE_S
#: The id an id of no workspace's slot becomes in a snapshot (nobody).
OVERFLOW_ID = 65534


# ------------------------------------------------------------------------------ taking


def own_dirs(ws: WorkspaceRecord, settings: Settings) -> list[tuple[Path, str]]:
    """(host directory, layer name) of everything a workspace changed of its files."""
    state = store.state_path(settings, ws.id)
    upper = state / "layer" / "upper"
    found = [(upper / "root", "root")]
    found += [(state / "home", "home"), (state / "tmp", "tmp"), (state / "vartmp", "vartmp"),
              (Path(ws.host_dir()), "work")]
    return found


def take(ws: WorkspaceRecord, settings: Settings, *, ttl_s: float | None = None,
         tags: Mapping[str, str] | None = None, hidden: bool = False,
         snap_id: str | None = None) -> tuple[SnapshotRecord, float | None]:
    """Snapshot workspace `ws`: (its record, ms its processes were paused; None when the
    host has no freezer for it). The workspace goes on as it was; on any failure nothing
    of the snapshot is left."""
    with store.changing(settings, ws.id):  # not beside a restore or deletion of it
        try:
            ws = store.load(ws.id, settings)  # as it is now (a restore gives it a new keeper)
        except store.WorkspaceError:
            raise SnapshotError("not_found", f"no such workspace on host {settings.host}: "
                                f"{ws.id}") from None
        return _take_held(ws, settings, ttl_s=ttl_s, tags=tags, hidden=hidden,
                          snap_id=snap_id)


def _take_held(ws: WorkspaceRecord, settings: Settings, *, ttl_s: float | None,
               tags: Mapping[str, str] | None, hidden: bool, snap_id: str | None
               ) -> tuple[SnapshotRecord, float | None]:
    if ws.ids is None:
        raise SnapshotError("unavailable", (
            f"host {settings.host} is single-tenant (`bashfleet hosts`): a snapshot needs "
            "a workspace with ids and layers of its own"))
    if not ws.fresh:
        raise SnapshotError("invalid", (
            f"workspace {ws.id}'s directory {ws.path} is the host's (made with `path=`), "
            "not its own: a snapshot holds a workspace's own files only; make the workspace "
            "without `path` and upload the project into it"))
    # Counted now (the host counts capped workspaces every few seconds: not enough).
    used = usage.check_disk(ws, settings) if ws.limits.disk_mb is not None else None
    if used is not None:
        raise SnapshotError("limit", (
            f"workspace {ws.id} holds {used / 2**20:.0f} MiB, past its disk cap of "
            f"{ws.limits.disk_mb} MiB: remove files before taking a snapshot of it"))
    snap_id = snap_id or snapshot_store.new_id()
    first = ws.ids[0]

    def shifted(uid: int, gid: int) -> tuple[int, int]:
        return image_id(uid, first), image_id(gid, first)

    if hidden:
        again = _fork_again(ws, settings, tags or {}, snap_id, shifted,
                            ttl_s=ttl_s or settings.snapshot_ttl_s)
        if again is not None:
            return again
    staging = _staged(settings, snap_id)
    try:
        copy_started, mapped = time.time(), [True]

        def look_at_maps(frozen: bool) -> None:
            mapped[0] = not frozen or _maps_files_shared(ws)

        paused_ms, listings = _copy_frozen(ws, own_dirs(ws, settings), staging / "layer",
                                           ids=shifted,
                                           on_frozen=look_at_maps if hidden else None)
        layer = staging / "layer"
        size = _settle_copy(layer, listings)
        for name in snapshot_store.LAYER_NAMES:
            (layer / name).mkdir(mode=0o755, exist_ok=True)
        record = SnapshotRecord(
            id=snap_id, created_at=time.time(), ttl_s=ttl_s or settings.snapshot_ttl_s,
            bytes=size, tags=dict(tags or {}), layers=(snap_id, *ws.lowers), hidden=hidden,
            **_from_workspace(ws, settings),
        )
    except BaseException:
        disk.remove_tree(staging)
        raise
    _seal(staging, record, settings)
    if hidden and not mapped[0]:
        _last_forks.remember(ws.id, fork_reuse.LastFork(snap_id, first, listings),
                             copy_started)
    elif hidden:
        _last_forks.forget(ws.id)
    return record, paused_ms


def _staged(settings: Settings, snap_id: str) -> Path:
    """A new snapshot's staging directory (its `layer/` made, empty)."""
    base = snapshot_store.snapshots_dir(settings)
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    staging = base / f".{snap_id}.tmp"
    (staging / "layer").mkdir(mode=0o700, parents=True)
    return staging


def _seal(staging: Path, record: SnapshotRecord, settings: Settings) -> None:
    """The snapshot staged at `staging` made the host's, as `record` says; on any
    failure nothing of it is left."""
    kept = snapshot_store.snapshots_dir(settings) / record.id
    try:
        os.rename(staging, kept)
    except BaseException:
        disk.remove_tree(staging)
        raise
    try:
        snapshot_store.save(record, settings)
    except BaseException:
        disk.remove_tree(kept)
        raise


def _maps_files_shared(ws: WorkspaceRecord) -> bool:
    """Whether a process of `ws` maps a file shared and writable (or that cannot be told):
    it can change the file with its times kept, so the stamps of a copy taken now cannot
    tell whether the workspace changed since (`fork_reuse`)."""
    pids = cgroups.members(ws.cgroup)
    return pids is None or any(procs.maps_shared_writable(pid) for pid in pids)


def _from_workspace(ws: WorkspaceRecord, settings: Settings) -> dict[str, object]:
    """What a snapshot's record takes from its workspace as it is (besides its layers)."""
    return {
        "host": settings.host, "owner": ws.owner, "workspace": ws.id, "path": ws.path,
        "image": ws.image, "user": ws.user, "home": ws.home, "limits": ws.limits,
        "isolation": ws.isolation, "network": ws.network,
        "mounts": {view_path: os.path.relpath(host, ws.host_dir())
                   for view_path, host in ws.mounts.items()},
    }


# ------------------------------------------------------------------ a fork's snapshot again

#: The last fork of each workspace this process took (`fork_reuse`).
_last_forks = fork_reuse.ForkMemory()


def _fork_again(ws: WorkspaceRecord, settings: Settings, tags: Mapping[str, str],
                snap_id: str, ids: tree_copy.IdMap, *, ttl_s: float
                ) -> tuple[SnapshotRecord, float | None] | None:
    """The snapshot of `ws`'s next fork made from its last fork's, when that one may
    stand beneath it (`fork_reuse`): the last one renewed when `ws` has not changed
    since, else a thin snapshot `snap_id` (kept `ttl_s`) over it of what changed
    (`fork_delta`), copied while `ws` is frozen: (its record, ms `ws` was paused).
    None: take a whole copy."""
    found = _last_fork(ws, settings, tags)
    if found is None:
        return None
    last, record = found
    sources = own_dirs(ws, settings)
    started, started_at = time.monotonic(), time.time()
    thin: tuple[Path, int] | None = None
    mapped = True
    frozen = cgroups.freeze(ws.cgroup)
    try:
        listed = {name: _listing(src) for src, name in sources}
        if listed != last.listings:
            own = len(record.layers) - len(ws.lowers)
            deltas = fork_delta.plan(last.listings, listed) \
                if frozen and own < fork_delta.MAX_CHAIN else None
            thin = None if deltas is None else _copy_thin(sources, settings, snap_id, deltas,
                                                           ids)
            if thin is None:
                return None
            mapped = _maps_files_shared(ws)
    finally:
        if frozen:
            cgroups.thaw(ws.cgroup)
    paused_ms = (time.monotonic() - started) * 1000 if frozen else None
    if thin is None:  # unchanged: the last fork's snapshot stands for this one
        renewed = record.model_copy(update={"created_at": time.time()})
        snapshot_store.save(renewed, settings)
        return renewed, paused_ms
    staging, size = thin
    made = SnapshotRecord(
        id=snap_id, created_at=time.time(), ttl_s=ttl_s, bytes=size,
        tags=dict(tags), layers=(snap_id, *record.layers), hidden=True,
        **_from_workspace(ws, settings))
    _seal(staging, made, settings)
    if mapped:
        _last_forks.forget(ws.id)
    else:
        _last_forks.remember(ws.id, fork_reuse.LastFork(snap_id, last.first_id, listed),
                             started_at)
    return made, paused_ms


def _last_fork(ws: WorkspaceRecord, settings: Settings, tags: Mapping[str, str]
               ) -> tuple[fork_reuse.LastFork, SnapshotRecord] | None:
    """`ws`'s last fork remembered, with its snapshot's record, when a fork of `ws` now
    may stand on that snapshot: the same id slot, lowers, tags and settings, the
    snapshot hidden, kept and young (`fork_reuse`)."""
    last = _last_forks.last(ws.id)
    if last is None or ws.ids is None or ws.ids[0] != last.first_id:
        return None
    try:
        record = snapshot_store.load(last.snap_id, settings)
    except SnapshotError:  # collected, or deleted by its id
        _last_forks.forget(ws.id)
        return None
    described = _from_workspace(ws, settings)
    own = len(record.layers) - len(ws.lowers)  # the last fork's own snapshots, its first
    if (record.deleted or not record.hidden or not fork_reuse.young(record.created_at, time.time())
            or own < 1 or record.layers[own:] != tuple(ws.lowers) or record.tags != dict(tags)
            or any(getattr(record, name) != value for name, value in described.items())):
        return None
    return last, record


#: Extended attributes of an overlay's layer that speak of the layers beneath it. A
#: thin snapshot given one where it stacks on the last fork's is given up for a copy:
#: an opaque directory stacked on the last fork's would hide what that one holds.
_BENEATH_ATTRS = ("overlay.opaque", "overlay.redirect", "overlay.metacopy")


def _copy_thin(sources: list[tuple[Path, str]], settings: Settings, snap_id: str,
               deltas: Mapping[str, fork_delta.LayerDelta], ids: tree_copy.IdMap
               ) -> tuple[Path, int] | None:
    """Stage snapshot `snap_id` as each own layer's thin snapshot (`fork_delta`), from
    its source (the workspace frozen): what changed copied, directories made as they
    are now, whiteouts for what went. (Where it is staged, the bytes it holds); None,
    with nothing left, when something went anyway, or an overlay attribute is where the
    thin layer stacks on the last fork's (take a copy)."""
    staging = _staged(settings, snap_id)
    layer, total = staging / "layer", 0
    try:
        for src, name in sources:
            delta = deltas[name]
            dest = layer / name
            os.mkdir(dest, 0o700)
            if tree_copy.copy_entries(str(src), str(dest), delta.copy, ids=ids):
                disk.remove_tree(staging)
                return None
            tree_copy.make_dirs(str(src), str(dest), delta.dirs, ids=ids)
            tree_copy.whiteouts(str(src), str(dest), delta.whiteouts, ids=ids)
            made = _entries_of(dest)
            _settle_dirs(src, dest, [rel for rel, is_dir in made if is_dir], ids)
            size = _thin_bytes(dest, made, set(delta.copy))
            if size is None:
                disk.remove_tree(staging)
                return None
            total += size
        for name in snapshot_store.LAYER_NAMES:
            (layer / name).mkdir(mode=0o755, exist_ok=True)
        os.chown(layer, 0, 0)  # the layer directory itself is the snapshot's, not a copy
    except BaseException:
        disk.remove_tree(staging)
        raise
    return staging, total


def _entries_of(root: Path) -> list[tuple[str, bool]]:
    """Every entry of a tree of the host's own (`root` itself as ''), as (relative path,
    whether it is a directory), never following a link."""
    found, stack = [("", True)], [(str(root), "")]
    while stack:
        folder, prefix = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                is_dir = entry.is_dir(follow_symlinks=False)
                found.append((f"{prefix}{entry.name}", is_dir))
                if is_dir:
                    stack.append((entry.path, f"{prefix}{entry.name}/"))
    return found


#: Extended attributes of an overlay's layer that speak of the layers beneath it. A
#: thin snapshot given one where it stacks on the last fork's is given up for a copy:
#: an opaque directory stacked on the last fork's would hide what that one holds.
_BENEATH_ATTRS = ("overlay.opaque", "overlay.redirect", "overlay.metacopy")


def _thin_bytes(root: Path, entries: list[tuple[str, bool]], whole: set[str]) -> int | None:
    """The bytes a thin layer's `entries` hold; None when one carries an overlay
    attribute that speaks of what is beneath it (`_BENEATH_ATTRS`; opaque only matters
    for a directory stacked on the last fork's, not one copied whole or beneath one)."""
    total = 0
    for rel, is_dir in entries:
        path = os.path.join(root, rel) if rel else str(root)
        stacked = is_dir and not (rel and fork_delta.under(rel, whole))
        for attr in os.listxattr(path, follow_symlinks=False):
            if attr.endswith(_BENEATH_ATTRS[1:]) or (stacked and attr.endswith(_BENEATH_ATTRS[0])):
                return None
        total += os.lstat(path).st_blocks * 512
    return total


#: What tells that an entry changed: kind and mode, inode, owner, size, and both times
#: (the kernel gives a change after a look at them a new ctime: multigrain timestamps).
Stamp = tuple[int, int, int, int, int, int, int]


def _listing(root: Path) -> dict[str, tuple[Stamp, int]]:
    """Every entry under `root` (relative path -> its stamp and its blocks), `root`
    itself as ``, each directory opened beneath the one that listed it (a directory a
    command swaps for a link is listed as the link it is then, never followed). Listed
    while the workspace runs, an entry may go between its directory's read and its own
    look: it is not listed (it was not there to copy)."""
    found: dict[str, tuple[Stamp, int]] = {}
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        found[""] = _stamp(os.fstat(top))
        stack = [(top, "")]
        while stack:
            fd, prefix = stack.pop()
            try:
                with os.scandir(fd) as listing:
                    names = [entry.name for entry in listing]
                for name in names:
                    with contextlib.suppress(FileNotFoundError):
                        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        found[f"{prefix}{name}"] = _stamp(info)
                        if stat.S_ISDIR(info.st_mode):
                            with contextlib.suppress(OSError):
                                stack.append((tree_copy.open_beneath(fd, name),
                                              f"{prefix}{name}/"))
            finally:
                if fd != top:
                    os.close(fd)
    finally:
        os.close(top)
    return found


def stamps(looks: Mapping[str, os.stat_result]) -> dict[str, tuple[Stamp, int]]:
    """A copy's looks at what it took (`tree_copy.copy_tree`'s `copied`) as a listing."""
    return {rel: _stamp(info) for rel, info in looks.items()}


def _stamp(info: os.stat_result) -> tuple[Stamp, int]:
    return ((info.st_mode, info.st_ino, info.st_uid, info.st_gid, info.st_size,
             info.st_mtime_ns, info.st_ctime_ns), info.st_blocks)


def _copy_frozen(ws: WorkspaceRecord, sources: list[tuple[Path, str]], dest: Path, *,
                 ids: tree_copy.IdMap | None = None,
                 on_frozen: Callable[[bool], None] | None = None,
                 ) -> tuple[float | None, dict[str, dict[str, tuple[Stamp, int]]]]:
    """Copy `sources` into `dest` (each under its layer name, owners mapped by `ids`) as
    they are at one instant: copied while the workspace runs, then, its processes
    frozen, what changed meanwhile copied again (its pause is that, not the whole copy).
    The ms they were paused, and what each layer held then (`_settle_copy` makes the
    copy that). `on_frozen(frozen)` is called at that instant, before the thaw."""
    # The workspace runs meanwhile: an entry it removes (or swaps) while the copy walks
    # is left out, not an error; the frozen pass below settles it. What the copy took is
    # stamped as it took it (no listing of its own beforehand: one walk fewer, and a
    # directory swapped for a link and back while it ran shows as the link it took).
    copied: dict[str, dict[str, os.stat_result]] = {name: {} for _, name in sources}
    gone_first = dict(zip([name for _, name in sources], _copy_layers(
        [(src, dest / name, None, copied[name]) for src, name in sources], ws, ids=ids),
        strict=True))
    before = {name: stamps(looks) for name, looks in copied.items()}
    started = time.monotonic()
    frozen = cgroups.freeze(ws.cgroup)
    try:
        after = {name: _listing(src) for src, name in sources}
        again: list[CopyJob] = []
        settle = []
        for src, name in sources:
            # What the first copy left out is copied again whatever its stamps say.
            rels, dirs = _catch_up(dest / name, before[name], after[name],
                                   missed=gone_first[name])
            if rels:
                again.append((src, dest / name, rels, None))
            settle.append((src, dest / name, dirs))
        gone = [rel for missing in _copy_layers(again, ws, ids=ids) for rel in missing]
        if gone and frozen:
            raise SnapshotError("internal", f"workspace {ws.id}'s {gone[0]} changed while "
                                "it was frozen; take the snapshot again")
        for src, copy, dirs in settle:
            _settle_dirs(src, copy, dirs, ids)
        if on_frozen is not None:
            on_frozen(frozen)
    finally:
        if frozen:
            cgroups.thaw(ws.cgroup)
    return (time.monotonic() - started) * 1000 if frozen else None, after


def _catch_up(copy: Path, before: dict[str, tuple[Stamp, int]],
              after: dict[str, tuple[Stamp, int]], *, missed: Sequence[str] = ()
              ) -> tuple[list[str], list[str]]:
    """Bring `copy` (made from its source around when `before` listed it) to the source
    as `after` lists it: what went is removed here; the entries that must be copied again, and the
    directories whose own metadata must be set again after them.

    The copy is this host's own (a directory the workspace cannot reach): what it holds
    is looked at, never followed, so a link the first copy took where `after` lists a
    directory is replaced, not written through."""
    for rel in sorted(set(before) - set(after), key=len, reverse=True):
        _remove(copy, rel)
    # What the first copy left out (gone, or swapped for another kind, as it came to
    # it) is copied again whatever its stamps say.
    left_out = set(missed)
    changed = sorted(rel for rel, (stamp, _) in after.items()
                     if before.get(rel, (None,))[0] != stamp or rel in left_out)
    again: list[str] = []
    fresh_dirs: list[str] = []
    kept_dirs: list[str] = []
    for rel in changed:
        if any(rel.startswith(d + "/") for d in fresh_dirs):
            continue  # copied with the new directory holding it
        kind = stat.S_IFMT(after[rel][0][0])
        if kind == stat.S_IFDIR and _kind_in_copy(copy, rel) == stat.S_IFDIR:
            kept_dirs.append(rel)  # its entries are listed on their own
            continue
        if rel:
            _remove(copy, rel)  # made again whole: a file, a link, a new directory
            again.append(rel)
            if kind == stat.S_IFDIR:
                fresh_dirs.append(rel)
    return again, kept_dirs


def _beneath(copy: Path, rel: str) -> str | None:
    """`rel` in the copy with its parent resolved, when that parent is a directory of the
    copy (None: a link the copy holds is on the way)."""
    parent = os.path.realpath(os.path.join(copy, os.path.dirname(rel)))
    if not layout.inside(parent, os.path.realpath(copy)):
        return None
    return os.path.join(parent, os.path.basename(rel)) if rel else parent


def _kind_in_copy(copy: Path, rel: str) -> int | None:
    target = _beneath(copy, rel)
    try:
        return None if target is None else stat.S_IFMT(os.lstat(target).st_mode)
    except FileNotFoundError:
        return None


def _remove(copy: Path, rel: str) -> None:
    """Remove `rel` from the copy, never following a link (one on the way: it goes with
    the link, replaced where it is)."""
    target = _beneath(copy, rel)
    if target is None or not rel:
        return
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(target, ignore_errors=True)
    else:
        os.unlink(target)


def _settle_dirs(src: Path, copy: Path, dirs: list[str], ids: tree_copy.IdMap | None = None
                 ) -> None:
    """Give directories of the copy their source's owner (mapped by `ids`), mode, xattrs
    and times (each opened beneath its root on both sides: nothing is followed)."""
    src_root = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    copy_root = os.open(copy, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for rel in sorted(dirs, key=len, reverse=True):
            try:
                source = tree_copy.open_beneath(src_root, rel)
            except OSError as exc:
                if exc.errno in tree_copy.GONE:
                    continue
                raise
            try:
                target = tree_copy.open_beneath(copy_root, rel)
            except OSError as exc:
                os.close(source)
                if exc.errno in tree_copy.GONE:
                    continue
                raise
            try:
                tree_copy.settle(source, target, os.fstat(source), ids)
            finally:
                os.close(source)
                os.close(target)
    finally:
        os.close(src_root)
        os.close(copy_root)


#: A copy of a layer: (source, copy, the entries to copy again (None: the whole tree),
#: where a whole tree's copy says what it took each entry as).
CopyJob = tuple[Path, Path, "list[str] | None", "dict[str, os.stat_result] | None"]


def _copy_layers(jobs: list[CopyJob], ws: WorkspaceRecord, *,
                 ids: tree_copy.IdMap | None = None) -> list[list[str]]:
    """Run copies of layers at once (the cost is per file, the kernel's, which the
    host's cores share: the copies release the interpreter while the kernel copies),
    owners mapped by `ids`; what each left out (gone or changed while it ran);
    SnapshotError naming the first that failed. The first runs on the calling thread,
    the others on the host's copier threads; none is left running when this returns."""
    def one(job: CopyJob) -> list[str]:
        src, dest, rels, copied = job
        if rels is None:
            return tree_copy.copy_tree(str(src), str(dest), copied, ids=ids)
        return tree_copy.copy_entries(str(src), str(dest), rels, ids=ids)

    if not jobs:
        return []
    futures = [_copiers().submit(one, job) for job in jobs[1:]]
    outcomes: list[list[str] | BaseException] = []
    try:
        outcomes.append(one(jobs[0]))
    except BaseException as exc:  # the others still end first: they write into its copy
        outcomes.append(exc)
    for future in futures:
        try:
            outcomes.append(future.result(timeout=COPY_TIMEOUT_S))
        except BaseException as exc:
            outcomes.append(exc)
    wait(futures)  # one that timed out too: its copy is not removed under it
    gone: list[list[str]] = []
    for outcome in outcomes:
        if isinstance(outcome, OSError):
            raise SnapshotError("internal", f"could not copy workspace {ws.id}'s "
                                f"layers: {outcome}") from outcome
        if isinstance(outcome, BaseException):
            raise outcome
        gone.append(outcome)
    return gone


#: Threads that copy a snapshot's other layers beside its own thread, kept from one
#: snapshot to the next: a thread started per snapshot waited to be scheduled, 1-3 ms
#: of a `fork(1)` in a busy consumer (py-spy).
_copier_pool: ThreadPoolExecutor | None = None
_copier_lock = threading.Lock()
COPIER_THREADS = 4


def _copiers() -> ThreadPoolExecutor:
    global _copier_pool  # noqa: PLW0603 - one pool a process, made at its first snapshot
    with _copier_lock:
        if _copier_pool is None:
            _copier_pool = ThreadPoolExecutor(COPIER_THREADS,
                                              thread_name_prefix="bashfleet-copy")
        return _copier_pool


def _forget_copiers() -> None:
    # A forked child has none of the pool's threads: work queued on it would never run.
    global _copier_pool, _copier_lock
    _copier_pool, _copier_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_copiers)


def image_id(host_id: int, first: int) -> int:
    """A host id of a workspace whose slot starts at `first`, as its snapshot keeps it:
    its slot's own as 0-65535 (what any workspace's user namespace shows as its own
    again), host root's (whiteouts the overlay made) as 0, any other nobody's."""
    if first <= host_id < first + id_slots.SLOT_SIZE:
        return host_id - first
    return 0 if host_id == 0 else OVERFLOW_ID


def _settle_copy(layer: Path, listings: dict[str, dict[str, tuple[Stamp, int]]]) -> int:
    """The copied layers made what `listings` say the workspace held at the frozen
    instant: an entry the first copy took that was gone by then (made and removed while
    it ran) removed (its owners were set as the copy made it: `image_id`). Walks the
    copy itself, never following a link. The bytes it holds."""
    total = 0
    for name, listing in listings.items():
        stack = [(str(layer / name), "")]
        while stack:
            folder, prefix = stack.pop()
            with os.scandir(folder) as entries:
                for entry in entries:
                    rel = f"{prefix}{entry.name}"
                    info = entry.stat(follow_symlinks=False)
                    listed = listing.get(rel)
                    if listed is None:
                        _remove(layer / name, rel)
                        continue
                    if stat.S_IFMT(listed[0][0]) != stat.S_IFMT(info.st_mode):
                        raise SnapshotError("internal", f"{name}/{rel} changed while it was "
                                            "copied; take the snapshot again")
                    total += int(info.st_blocks) * 512
                    if stat.S_ISDIR(info.st_mode):
                        stack.append((entry.path, f"{rel}/"))
        total += int(os.lstat(layer / name).st_blocks) * 512
    os.chown(layer, 0, 0)  # the layer directory itself is the snapshot's, not a copy
    return total


# ---------------------------------------------------------------------------- lifetime


def in_use(settings: Settings) -> set[str]:
    """Snapshots a live workspace (one being deleted too: its view may still be
    mounted) or a kept snapshot of this host stands on."""
    used: set[str] = set()
    for ws in store.local_records(settings):
        used.update(ws.lowers)
    for ws_id in store.ending_ids(settings):
        ending = store.load_ending(ws_id, settings)
        if ending is not None:
            used.update(ending.lowers)
    for snapshot in snapshot_store.local_records(settings):
        if not snapshot.deleted and not _expired(snapshot):
            used.update(snapshot.layers[1:])
    return used


def _expired(record: SnapshotRecord, now: float | None = None) -> bool:
    return (now or time.time()) >= record.expires_at


def remove(snap_id: str, settings: Settings) -> bool:
    """Delete a snapshot: its layer goes now unless a workspace or a later snapshot
    stands on it (then it is unlisted, and goes with the last of them). False when this
    host has none of that id."""
    try:
        record = snapshot_store.load(snap_id, settings)
    except SnapshotError:
        return False
    if record.deleted:
        return False
    if snap_id in in_use(settings):
        snapshot_store.save(record.model_copy(update={"deleted": True}), settings)
    else:
        _remove_files(snap_id, settings)
    return True


def _remove_files(snap_id: str, settings: Settings) -> None:
    snapshot_store.record_path(settings, snap_id).unlink(missing_ok=True)
    disk.remove_tree(snapshot_store.snapshots_dir(settings) / snap_id)


def collectable(settings: Settings, now: float | None = None) -> list[SnapshotRecord]:
    """The snapshots `collect` would remove now (not those freed by removing these)."""
    used = in_use(settings)
    moment = now or time.time()
    return [r for r in snapshot_store.local_records(settings) if r.id not in used
            and (r.deleted or _expired(r, moment)
                 or (r.hidden and moment - r.created_at > HIDDEN_GRACE_S))]


def collect(settings: Settings, now: float | None = None) -> list[SnapshotRecord]:
    """Remove the snapshots past their TTL, deleted or made for forks that are gone,
    that nothing stands on any more (and staging left by a crash); those this host
    pushed go from the fleet's registry too. The removed."""
    removed = []
    # Repeated: removing a snapshot can free the one under it.
    while gone := collectable(settings, now):
        for record in gone:
            _remove_files(record.id, settings)
            if record.pushed and record.host == settings.host:
                _forget_pushed(record, settings)
            removed.append(record)
    with contextlib.suppress(FileNotFoundError), \
            os.scandir(snapshot_store.snapshots_dir(settings)) as listing:
        for entry in listing:
            if entry.name.startswith(".") and entry.name.endswith(".tmp") and \
                    time.time() - entry.stat(follow_symlinks=False).st_mtime > COPY_TIMEOUT_S:
                disk.remove_tree(Path(entry.path))
    return removed


def _forget_pushed(record: SnapshotRecord, settings: Settings) -> None:
    """Delete a removed snapshot's layer from the fleet's registry (a registry that is
    down keeps it: its own garbage collection, or the next push of that id, is left)."""
    from bashfleet.worker.engine.snapshots import snapshot_registry  # noqa: PLC0415 - only pushed ones need it

    try:
        # Its tag names it there (pushed as `<repository>:<id>`).
        repository = str(record.pushed).rsplit("@", 1)[0]
        snapshot_registry.delete(f"{repository}:{record.id}", settings)
    except (ToolError, OSError) as exc:
        logging.getLogger("bashfleet.worker").warning(
            "snapshot %s: could not delete it from the registry: %s", record.id, exc)

"""A workspace's directories on this host's disk: its own layers made, owned by the ids
of its slot (`make_layers`, `make_snapshot_layers`, and what an image's layer is seeded
with), its files removed (`remove_files`, `remove_tree`: also what a call made hard to
remove), and the listing of a fresh layer that tells a throwaway workspace's later
reuse whether a call changed it (`layer_listing`, `skeleton_path`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
from collections.abc import Iterable
from pathlib import Path

from bashfleet.worker.engine import hostname, id_slots, layout
from bashfleet.worker.engine.isolate import kernel
from bashfleet.worker.engine.network import network
from bashfleet.worker.engine.workspaces import store, untouched
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceRecord


def ensure_dir(path: Path, mode: int) -> None:
    if not path.is_dir():
        path.mkdir(mode=mode, parents=True, exist_ok=True)
        path.chmod(mode)


def make_layers(layers: Path, slot: id_slots.Slot, image_root: str | None) -> None:
    """The workspace's own layers: for `/`, an upper directory (what its calls change)
    whose owner and mode are those of the image's root as the workspace sees it (an
    overlay shows its upper root's; over the host, the workspace root's own), and a
    work directory the overlay needs."""
    for name in ("upper", "work", "empty"):
        (layers / name).mkdir(mode=0o700 if name != "empty" else 0o755, parents=True)
    _upper(layers, "root", os.stat(image_root) if image_root else None, slot)
    if image_root is not None:
        _seed_network_files(layers / "upper" / "root", image_root, slot)
    else:
        _seed_hostname(layers, slot)


def make_snapshot_layers(record: WorkspaceRecord, settings: Settings, slot: id_slots.Slot,
                         image_root: str | None, newest: Path) -> None:
    """The layers of a workspace made from snapshots: empty uppers, each with the owner
    and mode of the newest snapshot's layer of it (`newest`: what an overlay shows of its
    root), and work directories for its own directories' overlays too."""
    layers = store.state_path(settings, record.id) / "layer"
    for name in ("upper", "work", "empty"):
        (layers / name).mkdir(mode=0o700 if name != "empty" else 0o755, parents=True)
    _upper(layers, "root", os.stat(newest / "root"), slot)
    if image_root is None:  # an image's /etc/hosts is in its snapshot's layer of `/`
        _seed_hostname(layers, slot)
    state = store.state_path(settings, record.id)
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


def _seed_network_files(upper: Path, image_root: str, slot: id_slots.Slot) -> None:
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
    hosts = hostname.with_hostname(HOSTS, socket.gethostname()) or HOSTS
    for name, text in (("hosts", hosts), ("resolv.conf", resolv)):
        _write_own(etc / name, text, slot)


def _write_own(path: Path, text: str, slot: id_slots.Slot) -> None:
    """A new file of the workspace root's in one of its own layers."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        os.fchown(handle.fileno(), slot.uid, slot.gid)


def _seed_hostname(layers: Path, slot: id_slots.Slot) -> None:
    """Where the host's /etc/hosts does not name the hostname its calls see, the
    workspace's own copy of it that does (`layers/hosts`, shown over the host's
    read-only /etc/hosts in its view: `layout.ViewSpec.etc_hosts`); the host's is
    unchanged."""
    try:
        text = Path("/etc/hosts").read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return
    hosts = hostname.with_hostname(text, socket.gethostname())
    if hosts is not None:
        _write_own(layers / layout.ETC_HOSTS, hosts, slot)


def make_dir_in_image(upper: Path, image_root: str, path: str, slot: id_slots.Slot, *,
                       owner: tuple[int, int] | None = None) -> None:
    """A directory of an image's (its WORKDIR, its user's HOME), made in the workspace's
    own layer when the image has not got it (as container runtimes make it); where the
    image has it, nothing (a copy in the layer would show other times and link counts
    than `docker exec` does). Each directory it lies in copied up with the image's owner
    and mode (an overlay shows its upper directory's), the new ones `owner`'s (host ids;
    None: the workspace root's). A link on the way: left alone (the call's cwd error says
    so)."""
    parts = [p for p in os.path.normpath(path).split("/") if p]
    if os.path.isdir(os.path.join(image_root, *parts)) and not any(
            os.path.islink(os.path.join(image_root, *parts[:n + 1])) for n in range(len(parts))):
        return
    lower, upper_dir = image_root, upper
    for part in parts:
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
                              if info else owner or (slot.uid, slot.gid)))


def _shifted(host_id: int, first: int) -> int:
    """An image's (or the host's) id as the workspace's user namespace shows it."""
    return first + host_id if host_id < id_slots.SLOT_SIZE else host_id


def _upper(layers: Path, name: str, lower: os.stat_result | None, slot: id_slots.Slot) -> None:
    upper = layers / "upper" / name
    upper.mkdir(mode=0o755)
    (layers / "work" / name).mkdir(mode=0o700)
    if lower is None:
        os.chown(upper, slot.uid, slot.gid)
        return
    os.chown(upper, _shifted(lower.st_uid, slot.uid), _shifted(lower.st_gid, slot.gid))
    upper.chmod(stat.S_IMODE(lower.st_mode))


def remove_files(record: WorkspaceRecord, settings: Settings) -> None:
    remove_tree(store.state_path(settings, record.id))
    with contextlib.suppress(OSError):  # an output directory with nothing kept in it
        os.rmdir(record.out_dir)
        (settings.workspaces_dir / f"{record.id}.out").unlink()
    store.socket_path(settings, record.id).unlink(missing_ok=True)
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


def layer_listing(upper: Path, covered: frozenset[str] = frozenset()) -> list[list[object]]:
    """Every entry of a workspace's upper layers, with its type, mode and owner: what its
    view's build left there (mount points), to tell later whether a call changed any.
    `covered` (`covered_by_mounts`) are left out, with what they hold."""
    return untouched.listing_with_stamps(os.fspath(upper), skip=covered)[0]


def view_mount_points(keeper_pid: int) -> list[str]:
    """The mount points of a workspace's view (its keeper's mount namespace, paths as
    its processes see them); none when they cannot be read."""
    try:
        with open(f"/proc/{keeper_pid}/mountinfo", "rb") as info:
            return kernel.mount_points(info.read())
    except OSError:
        return []


def covered_by_mounts(mount_points: Iterable[str], uppers: Iterable[str]) -> frozenset[str]:
    """The paths below a workspace's `upper/` that a mount of its view covers: `root/P`
    for a mount point `/P` (`/`'s own layer), `top.N/P` for `/N/P` where `/N` is an
    overlay of its own (`layout.upper_name`). No process of the workspace can reach
    them: what it does at `/P` is done in the mount, which it cannot take away (its
    users hold no capability over the view's mount namespace, and a namespace of their
    own gets its mounts locked), so a call cannot change them, and a throwaway's check
    that its call changed nothing need not look at them."""
    names = set(uppers)
    covered: set[str] = set()
    for point in mount_points:
        rel = os.path.normpath(point).strip("/")
        if not point.startswith("/") or not rel:
            continue
        covered.add(f"root/{rel}")
        top, _, below = rel.partition("/")
        if below and layout.upper_name(top) in names:
            covered.add(f"{layout.upper_name(top)}/{below}")
    return frozenset(covered)


def skeleton_path(settings: Settings, ws_id: str) -> Path:
    return store.state_path(settings, ws_id) / "layer.skeleton"

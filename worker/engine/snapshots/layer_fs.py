"""A file system that shares extents for workspaces' layers, on a host whose own cannot.

A snapshot copies a workspace's files (`tree_copy`): where the file system clones
(FICLONE: XFS with reflink, btrfs) the copy shares the files' extents and costs per file,
not per byte. On a host whose state directory is on ext4, `layer_image_gb` has a root
worker keep them on an XFS image instead:

    <state_dir>/layers.xfs                      the image (sparse: it takes what it holds)
    <state_dir>/layers/                         its mount (a loop device)
    <state_dir>/layers/workspace-state  <-  `workspaces_dir`, a link to it (upper layers)
    <state_dir>/layers/snapshots        <-  the snapshots' directory, a link to it
    <state_dir>/layers/workspaces       the workspaces' directories (`workspace_root_dir`
                                        answers it while it is there: a workspace's
                                        directory is bound at its path in its view,
                                        where a link on the way would not be followed)

All three on one file system and one mount: a snapshot clones from the first and the
last into the second, and an overlay's upper and work directories must be on the same
mount (bind mounts of the three would be three mounts). Made at the worker's start when
missing, and left mounted when it stops: the next start finds them in place and uses
them again (after a reboot it mounts the image again). A directory that already holds
files of its own is never replaced (they would vanish from sight): the worker says so
and keeps the plain directories.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from bashfleet.worker.engine import mountinfo
from bashfleet.worker.settings import Settings

IMAGE_NAME = "layers.xfs"
#: Seconds mkfs or mount may take (mkfs.xfs of a sparse image: well under one).
TOOL_TIMEOUT_S = 60.0
#: Smallest image mkfs.xfs makes.
MIN_BYTES = 300 * 2**20


def image_path(settings: Settings) -> Path:
    return settings.state_dir / IMAGE_NAME


def mount_path(settings: Settings) -> Path:
    return settings.layer_mount


def targets(settings: Settings) -> dict[str, Path]:
    """Each directory of the image (its name there) -> the link to it."""
    return {"workspace-state": settings.workspaces_dir,
            "snapshots": settings.state_dir / "snapshots"}


def prepare(settings: Settings) -> tuple[bool, str] | None:
    """Put the layers on the image when `layer_image_gb` asks for it: whether they are
    on it, and what was done or why not (the plain directories are then used). None when
    not asked. Not asked any more while the state directory links into the image, it is
    mounted again all the same (what those links hold lives there), and said so."""
    mount = mount_path(settings)
    linked = any(_links_to(t, mount / n) for n, t in targets(settings).items())
    if settings.layer_image_gb is None and not linked:
        return None
    if settings.layer_image_gb is None and not image_path(settings).exists():
        return False, (f"{', '.join(map(str, targets(settings).values()))} link into "
                       f"{mount}, whose image {image_path(settings)} is gone: remove the "
                       "links (or set layer_image_gb to make a new image)")
    problem = _missing_means()
    if problem is None:
        problem = _busy_targets(settings)
    if problem is not None:
        return False, f"workspace layers stay on the state directory's file system: {problem}"
    image = image_path(settings)
    did = [] if settings.layer_image_gb is not None else [
        "layer_image_gb is not set, but the state directory links into the image"]
    try:
        if not image.exists() and settings.layer_image_gb is not None:
            make_image(image, settings.layer_image_gb * 2**30)
            did.append(f"made {image} (XFS, reflink, {settings.layer_image_gb} GiB sparse)")
        if not _mounted_here(mount):
            mount.mkdir(mode=0o700, exist_ok=True)
            mount_image(image, mount)
            did.append(f"mounted it on {mount}")
        for name, target in targets(settings).items():
            real = mount / name
            real.mkdir(mode=0o700, exist_ok=True)
            if _links_to(target, real):
                continue
            if target.is_dir():
                target.rmdir()  # empty (`_busy_targets`)
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            target.symlink_to(real, target_is_directory=True)
            did.append(f"linked {target} to it")
        (mount / "workspaces").mkdir(mode=0o700, exist_ok=True)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return False, (f"workspace layers stay on the state directory's file system: "
                       f"could not set up {image}: {exc}")
    what = "; ".join(did) if did else f"{image} already in place"
    return True, f"workspace layers and snapshots on {mount} (XFS, reflink): {what}"


#: File systems whose inode allocator passes over recently freed inodes one by one (ext4's
#: `recently_deleted`: an inode freed in the last minute, five when its table block is
#: not yet written, is not reused): on a host that makes and deletes workspaces all the
#: time, every mkdir and create of a new workspace's layers walks past them. Measured
#: here under churn (`bench_snapshots`, runs back to back): `fork(1)` 108-209 ms and a
#: fresh workspace 36-47 ms on ext4, 38-43 ms and 14-18 ms on the XFS image; on ext4
#: back at 54 ms once the kernel's caches were dropped.
SLOW_UNDER_CHURN = frozenset({"ext4"})


def plain_layers_hint(settings: Settings, mountinfo_text: str) -> str | None:
    """What a root worker that was not asked for the image says at start when its
    workspaces' layers are on ext4 (None otherwise): what that costs, and the setting."""
    if settings.layer_image_gb is not None or os.geteuid() != 0:
        return None
    path = settings.workspaces_dir
    while not path.exists() and path != path.parent:
        path = path.parent  # not made yet: the file system it will be made on
    entry = mountinfo.holding(mountinfo_text, str(path.resolve()))
    fs = entry.fs_type if entry is not None else None
    if fs not in SLOW_UNDER_CHURN:
        return None
    return (f"workspace layers on {fs} ({settings.workspaces_dir}): a snapshot copies its "
            f"files' bytes, and while workspaces come and go {fs} makes each new one "
            "slower (it will not reuse an inode freed in the last minutes); "
            "BASHFLEET_LAYER_IMAGE_GB=64 keeps layers and snapshots on an XFS image with "
            "reflink instead (deploy/OPERATIONS.md)")


def make_image(image: Path, size: int) -> None:
    """A sparse file of `size` bytes holding a fresh XFS with reflink."""
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, max(size, MIN_BYTES))
    finally:
        os.close(fd)
    try:
        _run([_tool("mkfs.xfs"), "-q", "-m", "reflink=1", str(image)])
    except BaseException:
        image.unlink(missing_ok=True)
        raise


def mount_image(image: Path, mount: Path) -> None:
    """Mount the image on `mount` through a loop device (mount(8) takes a free one)."""
    _run(["mount", "-t", "xfs", "-o", "loop,noatime", str(image), str(mount)])


def unmount(path: Path) -> None:
    """Unmount `path` (a loop device's mount frees its device)."""
    _run(["umount", str(path)])


def release(settings: Settings) -> None:
    """Undo `prepare` (the links, then the image's mount): for tests and operators; a
    worker leaves them for its next start. A mount a process still uses (a workspace's
    keeper that has not gone yet) is detached, and goes with the last of them."""
    mount = mount_path(settings)
    for name, target in targets(settings).items():
        if _links_to(target, mount / name):
            target.unlink()
    if not _mounted_here(mount):
        return
    try:
        unmount(mount)
    except ValueError:
        _run(["umount", "--lazy", str(mount)])


def _missing_means() -> str | None:
    if os.geteuid() != 0:
        return "the worker is not root (mounting an image needs root)"
    if not os.path.exists("/dev/loop-control"):
        return "no loop device (/dev/loop-control is missing)"
    if shutil.which("mkfs.xfs") is None:
        return "mkfs.xfs is not installed (apt-get install xfsprogs)"
    return None


def _busy_targets(settings: Settings) -> str | None:
    """Why a target may not be replaced by a link: it holds files of its own, or it is
    another link."""
    mount = mount_path(settings)
    for name, target in targets(settings).items():
        if _links_to(target, mount / name):
            continue
        if target.is_symlink():
            return f"{target} is a link to {os.readlink(target)}: remove it to use the image"
        try:
            with os.scandir(target) as listing:
                if any(True for _ in listing):
                    return (f"{target} already holds files (workspaces made before): "
                            "empty it, or move them, to put it on the image")
        except FileNotFoundError:
            continue
    return None


def _mounted_here(mount: Path) -> bool:
    return mount.is_dir() and os.path.ismount(mount)


def _links_to(target: Path, real: Path) -> bool:
    return target.is_symlink() and os.readlink(target) == str(real)


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ValueError(f"{name} is not installed")
    return found


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S,
                          check=False)
    if done.returncode != 0:
        raise ValueError(f"{' '.join(argv[:2])}... failed: {done.stderr.strip()[:300]}")

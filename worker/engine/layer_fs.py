"""A file system that shares extents for workspaces' layers, on a host whose own cannot.

A snapshot copies a workspace's files (`tree_copy`): where the file system clones
(FICLONE: XFS with reflink, btrfs) the copy shares the files' extents and costs per file,
not per byte. On a host whose state directory is on ext4, `layer_image_gb` has a root
worker keep them on an XFS image instead:

    <state_dir>/layers.xfs                      the image (sparse: it takes what it holds)
    <state_dir>/layers/                         its mount (a loop device)
    <state_dir>/layers/workspace-state  ->  bound on `workspaces_dir` (upper layers...)
    <state_dir>/layers/snapshots        ->  bound on the snapshots' directory
    <state_dir>/layers/workspaces       ->  bound on `workspace_root_dir()`

All three on one file system: a snapshot clones from the first and the last into the
second (a rename never crosses them). Made at the worker's start when missing, and left
mounted when it stops: the next start finds them in place and uses them again. A
directory that already holds files of its own is never mounted over (they would vanish
from sight): the worker says so and keeps the plain directories.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from bashfleet.worker.settings import Settings

IMAGE_NAME = "layers.xfs"
MOUNT_NAME = "layers"
#: Seconds mkfs or mount may take (mkfs.xfs of a sparse image: well under one).
TOOL_TIMEOUT_S = 60.0
#: Smallest image mkfs.xfs makes.
MIN_BYTES = 300 * 2**20


def image_path(settings: Settings) -> Path:
    return settings.state_dir / IMAGE_NAME


def mount_path(settings: Settings) -> Path:
    return settings.state_dir / MOUNT_NAME


def targets(settings: Settings) -> dict[str, Path]:
    """Each directory of the image (its name there) -> where it is bound."""
    return {"workspace-state": settings.workspaces_dir,
            "snapshots": settings.state_dir / "snapshots",
            "workspaces": settings.workspace_root_dir()}


def prepare(settings: Settings) -> tuple[bool, str] | None:
    """Put the layers on the image when `layer_image_gb` asks for it: whether they are
    on it, and what was done or why not (the plain directories are then used). None when
    not asked."""
    if settings.layer_image_gb is None:
        return None
    problem = _missing_means()
    if problem is None:
        problem = _busy_targets(settings)
    if problem is not None:
        return False, f"workspace layers stay on the state directory's file system: {problem}"
    image, mount = image_path(settings), mount_path(settings)
    did = []
    try:
        if not image.exists():
            make_image(image, settings.layer_image_gb * 2**30)
            did.append(f"made {image} (XFS, reflink, {settings.layer_image_gb} GiB sparse)")
        if not _mounted_here(mount):
            mount.mkdir(mode=0o700, exist_ok=True)
            mount_image(image, mount)
            did.append(f"mounted it on {mount}")
        dev = os.stat(mount).st_dev
        for name, target in targets(settings).items():
            if _on(target, dev):
                continue
            (mount / name).mkdir(mode=0o700, exist_ok=True)
            target.mkdir(mode=0o700, parents=True, exist_ok=True)
            _run(["mount", "--bind", str(mount / name), str(target)])
            did.append(f"bound {target}")
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return False, (f"workspace layers stay on the state directory's file system: "
                       f"could not set up {image}: {exc}")
    what = "; ".join(did) if did else f"{image} already in place"
    return True, f"workspace layers and snapshots on {mount} (XFS, reflink): {what}"


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
    """Undo `prepare` (the binds, then the image's mount): for tests and operators; a
    worker leaves them for its next start."""
    dev = os.stat(mount_path(settings)).st_dev if _mounted_here(mount_path(settings)) else None
    for target in targets(settings).values():
        if dev is not None and _on(target, dev) and os.path.ismount(target):
            unmount(target)
    if dev is not None:
        unmount(mount_path(settings))


def _missing_means() -> str | None:
    if os.geteuid() != 0:
        return "the worker is not root (mounting an image needs root)"
    if not os.path.exists("/dev/loop-control"):
        return "no loop device (/dev/loop-control is missing)"
    if shutil.which("mkfs.xfs") is None:
        return "mkfs.xfs is not installed (apt-get install xfsprogs)"
    return None


def _busy_targets(settings: Settings) -> str | None:
    """Why a target may not be mounted over: it holds files of its own."""
    mount = mount_path(settings)
    dev = os.stat(mount).st_dev if _mounted_here(mount) else None
    for target in targets(settings).values():
        if dev is not None and _on(target, dev):
            continue
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


def _on(target: Path, dev: int) -> bool:
    try:
        return os.stat(target).st_dev == dev
    except FileNotFoundError:
        return False


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

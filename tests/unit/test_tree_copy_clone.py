"""bashfleet.worker.engine.snapshots.tree_copy's file data on a real XFS with reflink (shared
extents: the copy takes no blocks of its own) and where the file system cannot share
them (ext4, tmpfs: copied, FICLONE asked once per pair of devices); and
bashfleet.worker.engine.snapshots.layer_fs, which puts a worker's layers on such an XFS."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from privilege import needs_root

from bashfleet.worker.engine.snapshots import layer_fs, tree_copy
from bashfleet.worker.settings import Settings

MIB = 1 << 20
pytestmark = needs_root("mounts (an XFS image, a tmpfs)")
needs_xfs = pytest.mark.skipif(
    shutil.which("mkfs.xfs") is None or not os.path.exists("/dev/loop-control"),
    reason="no mkfs.xfs (Debian's xfsprogs) or no loop device")


@pytest.fixture
def xfs(tmp_path: Path) -> Iterator[Path]:
    """A fresh XFS with reflink, mounted (a sparse image: it takes what it holds)."""
    image, mount = tmp_path / "xfs.img", tmp_path / "xfs"
    layer_fs.make_image(image, layer_fs.MIN_BYTES)
    mount.mkdir()
    layer_fs.mount_image(image, mount)
    try:
        yield mount
    finally:
        layer_fs.unmount(mount)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.fixture
def ioctls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The requests of every ioctl the copy makes (made for real), FICLONE's memory of
    unsupported devices cleared before and after."""
    asked: list[int] = []
    real = fcntl.ioctl

    def counting(fd: int, request: int, *args: Any) -> Any:
        asked.append(request)
        return real(fd, request, *args)

    tree_copy._NO_CLONE.clear()
    monkeypatch.setattr(fcntl, "ioctl", counting)
    yield asked
    tree_copy._NO_CLONE.clear()


def _shared(path: Path) -> bool:
    """Whether filefrag marks every extent of the file as shared with another."""
    out = subprocess.run(["filefrag", "-v", str(path)], capture_output=True, text=True,
                         check=True).stdout
    extents = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    return bool(extents) and all("shared" in line for line in extents)


def _free(path: Path) -> int:
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def _sync(path: Path) -> None:
    """Written out, so that the free space counts the blocks delayed allocation holds."""
    subprocess.run(["sync", "-f", str(path)], check=True)


@needs_xfs
def test_on_xfs_the_copy_shares_the_files_extents(xfs: Path, ioctls: list[int]) -> None:
    src = xfs / "src"
    (src / "deep").mkdir(parents=True)
    data = os.urandom(50 * MIB)
    (src / "deep" / "big").write_bytes(data)
    (src / "small").write_bytes(b"x" * 5000)
    _sync(xfs)
    free = _free(xfs)
    assert tree_copy.copy_tree(str(src), str(xfs / "copy")) == []
    _sync(xfs)
    copy = xfs / "copy" / "deep" / "big"
    assert copy.read_bytes() == data
    assert _shared(copy) and _shared(src / "deep" / "big")
    # 50 MiB copied would take 50 MiB; shared, the copy's metadata only.
    assert free - _free(xfs) < 4 * MIB
    assert ioctls.count(tree_copy.FICLONE) == 2
    # The copy is its own file: a write to the source leaves it as it was.
    with open(src / "deep" / "big", "r+b") as handle:
        handle.write(b"changed")
    assert copy.read_bytes() == data


@pytest.mark.parametrize("where", ["ext4", "tmpfs"])
def test_where_nothing_is_shared_the_bytes_are_copied_and_clone_asked_once(
        where: str, tmp_path: Path, request: pytest.FixtureRequest, ioctls: list[int]) -> None:
    """ext4 to ext4 (the file system cannot clone) and ext4 to tmpfs (two file systems)."""
    dest_root = tmp_path if where == "ext4" else request.getfixturevalue("tmpfs")
    src = tmp_path / "src"
    src.mkdir()
    files = {f"f{i}": os.urandom(70_000 + i) for i in range(20)}
    for name, data in files.items():
        (src / name).write_bytes(data)
    assert tree_copy.copy_tree(str(src), str(dest_root / "copy")) == []
    assert {p.name: p.read_bytes() for p in (dest_root / "copy").iterdir()} == files
    assert ioctls.count(tree_copy.FICLONE) == 1
    devices = (os.stat(src).st_dev, os.stat(dest_root).st_dev)
    assert {devices} == tree_copy._NO_CLONE
    # A second copy between the same devices asks no more.
    assert tree_copy.copy_entries(str(src), str(dest_root / "copy"), ["f3"]) == []
    assert (dest_root / "copy" / "f3").read_bytes() == files["f3"]
    assert ioctls.count(tree_copy.FICLONE) == 1


def test_only_an_unsupported_clone_is_remembered(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A clone that fails for another reason (no space) falls to the copy, and the next
    file asks again; one the file system cannot do is not asked again."""
    (tmp_path / "a").write_bytes(b"abc")
    answers = [errno.ENOSPC, errno.EOPNOTSUPP]
    asked: list[int] = []

    def failing(fd: int, request: int, *args: Any) -> Any:
        asked.append(request)
        raise OSError(answers.pop(0), "no")

    monkeypatch.setattr(fcntl, "ioctl", failing)
    tree_copy._NO_CLONE.clear()
    try:
        for name in ("b", "c", "d"):
            src = os.open(tmp_path / "a", os.O_RDONLY)
            dst = os.open(tmp_path / name, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                tree_copy._data(src, dst, (1, 2))
            finally:
                os.close(src)
                os.close(dst)
            assert (tmp_path / name).read_bytes() == b"abc"
        assert len(asked) == 2 and {(1, 2)} == tree_copy._NO_CLONE
    finally:
        tree_copy._NO_CLONE.clear()


def _settings(tmp_path: Path, gb: int | None) -> Settings:
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    return Settings(state_dir=state, workspace_root=tmp_path / "roots", layer_image_gb=gb)


def test_layer_image_is_off_unless_asked(tmp_path: Path) -> None:
    assert layer_fs.prepare(_settings(tmp_path, None)) is None
    assert not (tmp_path / "state" / layer_fs.IMAGE_NAME).exists()


def test_a_directory_holding_files_is_never_mounted_over(tmp_path: Path) -> None:
    settings = _settings(tmp_path, 1)
    settings.workspaces_dir.mkdir()
    (settings.workspaces_dir / "w1.out").write_text("kept")
    on, said = layer_fs.prepare(settings) or (None, "")
    assert on is False and "already holds files" in said and str(settings.workspaces_dir) in said
    assert not layer_fs.image_path(settings).exists()
    assert (settings.workspaces_dir / "w1.out").read_text() == "kept"


@needs_xfs
def test_the_layers_go_on_one_reflink_xfs_and_stay_for_the_next_start(tmp_path: Path) -> None:
    settings = _settings(tmp_path, 1)
    on, said = layer_fs.prepare(settings) or (None, "")
    try:
        assert on is True, said
        assert "made" in said and "mounted" in said
        devs = {os.stat(t).st_dev for t in layer_fs.targets(settings).values()}
        assert devs == {os.stat(layer_fs.mount_path(settings)).st_dev}
        assert os.stat(settings.state_dir).st_dev not in devs
        # Fresh workspaces are made on it, under no link (their view binds that path).
        root = settings.workspace_root_dir()
        assert root == layer_fs.mount_path(settings) / "workspaces" and root.is_dir()
        assert os.stat(root).st_dev in devs and not root.is_symlink()
        # The image is sparse: a 1 GiB file system takes its log (64 MiB) of the host's disk.
        assert os.stat(layer_fs.image_path(settings)).st_blocks * 512 < 128 * MIB
        (settings.workspaces_dir / "kept").write_text("here")
        # A second start (the worker stopped without unmounting) uses them as they are.
        on, said = layer_fs.prepare(settings) or (None, "")
        assert on is True and "already in place" in said
        assert (settings.workspaces_dir / "kept").read_text() == "here"
        # A reboot (the image unmounted) and the setting gone: the state directory's
        # links lead into the image, so it is mounted again all the same.
        layer_fs.unmount(layer_fs.mount_path(settings))
        assert not (settings.workspaces_dir / "kept").exists()
        on, said = layer_fs.prepare(_settings(tmp_path, None)) or (None, "")
        assert on is True and "is not set" in said and "mounted it" in said, said
        assert (settings.workspaces_dir / "kept").read_text() == "here"
    finally:
        layer_fs.release(settings)
    assert not os.path.ismount(layer_fs.mount_path(settings))
    assert not any(t.exists() or t.is_symlink() for t in layer_fs.targets(settings).values())
    assert settings.workspace_root_dir() == tmp_path / "roots"


@pytest.mark.parametrize("case", [
    (1000, True, True, "not root"),
    (0, False, True, "no loop device"),
    (0, True, False, "apt-get install xfsprogs"),
])
def test_a_host_that_cannot_mount_the_image_says_why_and_keeps_its_directories(
        case: tuple[int, bool, bool, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """(effective uid, a loop device, mkfs.xfs, what the worker says)."""
    euid, loop, mkfs, said = case
    settings = _settings(tmp_path, 1)
    real_exists = os.path.exists
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    monkeypatch.setattr(os.path, "exists", lambda p: loop if p == "/dev/loop-control"
                        else real_exists(p))
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/sbin/mkfs.xfs" if mkfs else None)
    on, why = layer_fs.prepare(settings) or (None, "")
    assert on is False and said in why, why
    assert not layer_fs.image_path(settings).exists()
    assert settings.workspace_root_dir() == tmp_path / "roots"

"""Build a workspace's mount view: carry out a plan of mount steps (a list of JSON lists).

Standard library only: a keeper runs it as `python -I -S`, as pid 1 of the workspace's
new PID namespace, in a mount namespace of its own, before any call runs. The plan is
made by the worker (`bashfleet.worker.engine.layout.plan_view`, pure and tested), so what a
workspace sees is decided in one place and only carried out here.

Steps (sources are host paths, resolved before the new root replaces the old one):

    ["private"]                          the mount tree private (nothing propagates out)
    ["tmpfs", path, mode]                a fresh tmpfs (nosuid, nodev)
    ["mkdir", path, mode]                a directory (and its parents) where missing
    ["rbind_ro", src, dst]               src and every mount under it, read-only
    ["bind", src, dst, writable]         src (a directory) at dst
    ["bind_file", src, dst, writable]    src (a file) at dst, made if missing
    ["symlink", target, path]
    ["devices", dev]                     a minimal /dev: tmpfs, the usual nodes, a fresh
                                         devpts, /dev/shm
    ["proc", path]                       this PID namespace's /proc, /proc/sys read-only
    ["remount_ro", path]                 one mount read-only
    ["pivot", root]                      root becomes / and the old root goes away
    ["overlay", lowers, upper, work, dst]
                                         an overlay at dst (nosuid, nodev): `lowers` a
                                         list of [path, idmapped], top first; idmapped
                                         ones are shown through the workspace's user
                                         namespace (host root's files are its root's)
                                         from a private copy of their mount tree
    ["idbind", src, dst]                 src at dst, writable, through the project's id
                                         map (the host's run user is the workspace's root)
    ["idbind", src, dst, True]           the same for a root every workspace may write;
                                         one that is not the run user's and any user may
                                         write (sticky and world-writable, as /tmp) is
                                         bound as it is: each workspace writes there as
                                         its own host ids, as a local account would

A bind's source is opened one component at a time without following a symbolic link
(the keeper is root on the host, and a workspace's own directories are a command's to
change: a link planted there must never send a bind elsewhere), and every bind is
nosuid and nodev: a set-user-id file a call makes stays inert in every view.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Sequence
from typing import Any

from bashfleet.worker.engine.isolate import kernel

#: Device nodes a call gets in its /dev (bound from the host's), as bubblewrap gives.
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_DEV_LINKS = (("/proc/self/fd", "fd"), ("/proc/self/fd/0", "stdin"),
              ("/proc/self/fd/1", "stdout"), ("/proc/self/fd/2", "stderr"),
              ("pts/ptmx", "ptmx"))
_TMPFS_FLAGS = kernel.MS_NOSUID | kernel.MS_NODEV


#: The workspace's user namespace (a descriptor) while a plan is carried out: what its
#: idmapped layers map their ids through; and the project's map (its run user the
#: workspace's root) for `idbind`.
_userns = [-1, -1]


def carry_out(plan: Sequence[Sequence[Any]], *, userns_fd: int = -1,
              project_fd: int = -1) -> None:
    """Carry out every step of `plan`; OSError (naming the step) when one fails."""
    _userns[:] = [userns_fd, project_fd]
    _gone.clear()
    for step in plan:
        action = _ACTIONS.get(str(step[0]))
        if action is None:
            raise OSError(22, f"unknown mount step {step[0]!r}")
        try:
            action(*step[1:])
        except OSError as exc:
            raise OSError(exc.errno, f"{step[0]} {' '.join(map(str, step[1:3]))}: "
                          f"{exc.strerror or exc}") from exc


def _private() -> None:
    kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)


def _tmpfs(path: str, mode: int) -> None:
    kernel.mount("tmpfs", path, "tmpfs", _TMPFS_FLAGS, f"mode={mode:o}")


#: Hidden directories that were gone by the time their tmpfs was mounted (another
#: process makes and removes directories of the host's `/`): nothing there to hide, nor
#: to make read-only after. One that comes back later shows, as one made after the view
#: was built does.
_gone: set[str] = set()


def _hide(path: str, mode: int) -> None:
    """A hidden directory's empty tmpfs; none when the directory went since the plan."""
    try:
        _tmpfs(path, mode)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise
        _gone.add(path)


def _hide_ro(path: str) -> None:
    """A hidden directory's tmpfs made read-only (none when `_hide` found it gone, or
    when it went since: the host's rmdir took the tmpfs on it with it)."""
    if path in _gone:
        return
    try:
        kernel.remount_read_only(path)
    except FileNotFoundError:
        if os.path.lexists(path):
            raise
        _gone.add(path)


def _mkdir(path: str, mode: int) -> None:
    if not os.path.isdir(path):
        os.makedirs(path, mode)


def _rbind_ro(src: str, dst: str) -> None:
    try:
        kernel.mount(src, dst, None, kernel.MS_BIND | kernel.MS_REC)
    except FileNotFoundError:
        if not os.path.lexists(src):
            # An entry of the host's `/` removed since it was listed (another process
            # makes and removes top-level directories): nothing to show.
            with contextlib.suppress(OSError):
                os.rmdir(dst)
            return
        raise
    kernel.set_tree_attrs(dst, kernel.MOUNT_ATTR_RDONLY | kernel.MOUNT_ATTR_NOSUID
                          | kernel.MOUNT_ATTR_NODEV)


def _bind(src: str, dst: str, writable: bool) -> None:
    fd = open_no_links(src)
    try:
        _bind_opened(fd, dst, writable)
    finally:
        os.close(fd)


def _bind_opened(fd: int, dst: str, writable: bool) -> None:
    kernel.mount(f"/proc/self/fd/{fd}", dst, None, kernel.MS_BIND | kernel.MS_REC)
    kernel.set_tree_attrs(dst, kernel.MOUNT_ATTR_NOSUID | kernel.MOUNT_ATTR_NODEV
                          | (0 if writable else kernel.MOUNT_ATTR_RDONLY))


def _idbind(src: str, dst: str, shared: bool = False) -> None:
    """A project's directory at `dst`, writable, its run user's files the workspace
    root's (and what its root makes, the run user's on the host). `shared`: a root every
    workspace may write, bound as it is when it is a shared /tmp-like directory (the map
    shows only the run user: another owner's directory would be nobody's, shut to every
    write however open its mode). Where the kernel cannot map it (a file system that
    takes no id map, as overlayfs, or a mount under it that takes none), it is shown
    read-only with the host's ids instead: a workspace that cannot write there, not one
    that cannot start."""
    fd = open_no_links(src)
    try:
        if shared and _open_to_all(os.fstat(fd)):
            _bind_opened(fd, dst, writable=True)
            return
        try:
            tree = kernel.idmapped_tree(f"/proc/self/fd/{fd}", _userns[1], read_only=False)
        except OSError as exc:
            if exc.errno not in UNMAPPABLE:
                raise
            _bind_opened(fd, dst, writable=False)
            return
    finally:
        os.close(fd)
    try:
        kernel.attach(tree, dst)
    finally:
        os.close(tree)


#: What mount_setattr(2) answers for a tree it cannot idmap: EINVAL (the file system,
#: or one mounted under it, takes no id map), EPERM and EOPNOTSUPP (kernels and file
#: systems without it).
UNMAPPABLE = frozenset({errno.EINVAL, errno.EPERM, errno.EOPNOTSUPP})


def _open_to_all(found: os.stat_result) -> bool:
    """Sticky and writable by every user (as /tmp): each user's files its own there."""
    return bool(found.st_mode & stat.S_ISVTX and found.st_mode & stat.S_IWOTH
                and found.st_mode & stat.S_IXOTH)


def open_no_links(path: str) -> int:
    """An O_PATH descriptor of the directory `path` (absolute, real), every component
    opened without following a symbolic link: ELOOP where one is a link."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in [p for p in path.split("/") if p]:
            if part == "..":
                raise OSError(22, f"a path with '..' in it: {path}")
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError as exc:
        os.close(fd)
        if (exc.errno == 20 and os.path.islink(path)) or exc.errno == 40:  # ENOTDIR, ELOOP
            raise OSError(40, f"a symbolic link where a directory was expected: {path}"
                          ) from None
        raise
    return fd


def _overlay(lowers: Sequence[Sequence[Any]], upper: str, work: str, dst: str) -> None:
    """An overlay at `dst`: its upper and work directories are the workspace's (made by
    the worker, owned by its root); idmapped lowers are first attached beside `work`."""
    paths = []
    for index, (source, idmapped) in enumerate(lowers):
        path = source
        if idmapped:
            staged = f"{work}.lower{index}"
            _mkdir(staged, 0o700)
            tree = kernel.idmapped_tree(path, _userns[0])
            try:
                kernel.attach(tree, staged)
            finally:
                os.close(tree)
            path = staged
        paths.append(path)
    options = f"lowerdir={':'.join(paths)},upperdir={upper},workdir={work}"
    kernel.mount("overlay", dst, "overlay", kernel.MS_NOSUID | kernel.MS_NODEV, options)


def _bind_file(src: str, dst: str, writable: bool) -> None:
    if not os.path.lexists(dst):
        os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    kernel.mount(src, dst, None, kernel.MS_BIND)
    if not writable:
        kernel.remount_read_only(dst)


def _symlink(target: str, path: str) -> None:
    if not os.path.lexists(path):
        os.symlink(target, path)


def _devices(dev: str) -> None:
    """A minimal /dev at `dev`, as bubblewrap's --dev makes it."""
    kernel.mount("tmpfs", dev, "tmpfs", kernel.MS_NOSUID | kernel.MS_NOEXEC, "mode=755")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            _bind_file(f"/dev/{name}", f"{dev}/{name}", writable=True)
    os.mkdir(f"{dev}/pts", 0o755)
    kernel.mount("devpts", f"{dev}/pts", "devpts", kernel.MS_NOSUID | kernel.MS_NOEXEC,
                 "newinstance,ptmxmode=0666,mode=620")
    os.mkdir(f"{dev}/shm", 0o755)
    kernel.mount("tmpfs", f"{dev}/shm", "tmpfs", _TMPFS_FLAGS, "mode=1777")
    for target, name in _DEV_LINKS:
        os.symlink(target, f"{dev}/{name}")
    kernel.remount_read_only(dev)


def _proc(path: str) -> None:
    """This PID namespace's /proc (we are its pid 1), with the parts that would let a
    privileged process change the host read-only, as bubblewrap does."""
    flags = kernel.MS_NOSUID | kernel.MS_NODEV | kernel.MS_NOEXEC
    kernel.mount("proc", path, "proc", flags)
    for name in ("sys", "sysrq-trigger", "irq", "bus"):
        target = f"{path}/{name}"
        try:
            kernel.mount(target, target, None, kernel.MS_BIND | kernel.MS_REC)
        except OSError:
            continue  # not on this kernel
        kernel.mount(None, target, None, kernel.MS_REMOUNT | kernel.MS_BIND | flags
                     | kernel.MS_RDONLY)


def _pivot(root: str) -> None:
    old = f"{root}/.old"
    os.mkdir(old, 0o700)
    kernel.pivot_root(root, old)
    os.chdir("/")
    kernel.umount("/.old")
    with contextlib.suppress(OSError):
        os.rmdir("/.old")


_ACTIONS: dict[str, Callable[..., None]] = {
    "private": _private, "tmpfs": _tmpfs, "hide": _hide, "hide_ro": _hide_ro,
    "mkdir": _mkdir, "rbind_ro": _rbind_ro,
    "bind": _bind, "bind_file": _bind_file, "symlink": _symlink, "devices": _devices,
    "proc": _proc, "remount_ro": kernel.remount_read_only, "pivot": _pivot, "overlay": _overlay,
    "idbind": _idbind,
}

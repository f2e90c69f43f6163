"""Copy a workspace's directory tree as the host's root without following a path its
commands can change: every directory is opened beneath the one that listed it
(`O_NOFOLLOW`), every file through its own descriptor, so a directory swapped for a
symbolic link mid-copy (`renameat2(RENAME_EXCHANGE)` from a job that watches the copy)
makes that entry fail to open, never sends the copy into the host's files.

What `cp -a` keeps, kept: kinds (files, directories, links, FIFOs, sockets, devices such
as an overlay's whiteouts), owners, modes (set-id bits after the owner), extended
attributes (an overlay's `trusted.overlay.*` too), times, hard links within the copy;
file data shared where the file system can (FICLONE), else copied in the kernel
(copy_file_range). Owners may be mapped on the way (`ids`: a snapshot keeps a
workspace's ids as an image's), each set once, with the copy's other metadata.

    copy_tree(src, dest)                   the whole tree of src as dest (made here)
    copy_entries(src, dest, ["a/b", ...])  those entries of src again, into dest's tree
    make_dirs(src, dest, ["a", ...])       those directories of src, without what they hold
    whiteouts(src, dest, ["a/c", ...])     an overlay's whiteout at each, in dest's tree

Entries that go while they are copied (the workspace runs meanwhile) are left out and
named in the answer: the caller copies again once the workspace is frozen.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

#: ioctl FICLONE: the destination shares the source's extents (XFS with reflink, btrfs).
FICLONE = 0x40049409
#: What opening an entry that changed under the copy answers: gone (ENOENT), swapped
#: for a link (ELOOP, or ENOTDIR for a link on the way), for another kind (ENXIO: a FIFO
#: opened without a reader; ENOTDIR: a file where a directory was).
GONE = frozenset({errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ENXIO})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

#: Maps a source's (uid, gid) to the copy's.
IdMap = Callable[[int, int], tuple[int, int]]


class ChangedError(OSError):
    """An entry that changed kind between its look and its open."""


@dataclass
class _Copy:
    """One copy's state: the hard links seen (source (device, inode) -> where the first
    copy of it went, as (directory path in dest, name)), and what went meanwhile."""

    dest_root: int
    links: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)
    gone: list[str] = field(default_factory=list)
    copied: dict[str, os.stat_result] = field(default_factory=dict)
    """What each entry was copied as: relative path -> its look as it was copied (a
    file's through the descriptor its bytes were then read from)."""
    ids: IdMap | None = None
    dest_dev: int = -1
    """The copy's device (one file system: the copy is the host's own)."""


def copy_tree(src: str, dest: str, copied: dict[str, os.stat_result] | None = None, *,
              ids: IdMap | None = None) -> list[str]:
    """Copy the tree at `src` (a real directory path of the host's own) to `dest` (which
    must not exist); the entries that went while it was copied (relative paths). Into
    `copied`, each entry's look as it was copied (`src` itself as ''): a later look that
    differs means the copy may not hold it as it is then (a directory swapped for a link
    and back keeps its own look, not the link's the copy took). `ids`: the copy's
    owners."""
    src_fd = os.open(src, _DIR_FLAGS)
    try:
        info = os.fstat(src_fd)
        copied = copied if copied is not None else {}
        copied[""] = info
        os.mkdir(dest, 0o700)
        dest_fd = os.open(dest, _DIR_FLAGS)
        try:
            state = _Copy(dest_fd, copied=copied, ids=ids,
                          dest_dev=os.fstat(dest_fd).st_dev)
            _fill(src_fd, dest_fd, "", state)
            settle(src_fd, dest_fd, info, ids)
        finally:
            os.close(dest_fd)
    finally:
        os.close(src_fd)
    return state.gone


def copy_entries(src: str, dest: str, rels: Iterable[str], *, ids: IdMap | None = None
                 ) -> list[str]:
    """Copy each entry `rels` names (relative to `src`; a directory with all it holds)
    to the same place under `dest`, whose directories on the way must be directories
    already (a missing one is made, with its source's owner, mode and times); the
    entries that went meanwhile. `ids`: the copy's owners."""
    src_root = os.open(src, _DIR_FLAGS)
    dest_root = os.open(dest, _DIR_FLAGS)
    state = _Copy(dest_root, ids=ids, dest_dev=os.fstat(dest_root).st_dev)
    try:
        for rel in rels:
            parent, name = os.path.split(rel)
            try:
                src_dir = open_beneath(src_root, parent)
            except OSError as exc:
                if exc.errno not in GONE:
                    raise
                state.gone.append(rel)
                continue
            try:
                dest_dir = _dest_dir(src_root, dest_root, parent, ids)
                try:
                    _copy_entry(src_dir, dest_dir, name, rel, state, fresh=False)
                finally:
                    os.close(dest_dir)
            finally:
                os.close(src_dir)
    finally:
        os.close(src_root)
        os.close(dest_root)
    return state.gone


def make_dirs(src: str, dest: str, rels: Iterable[str], *, ids: IdMap | None = None
              ) -> None:
    """Each directory `rels` names made under `dest` as its source under `src` is (owner
    mapped by `ids`, mode, extended attributes, times), with those on the way, where
    missing; none of what the source directories hold."""
    src_root = os.open(src, _DIR_FLAGS)
    dest_root = os.open(dest, _DIR_FLAGS)
    try:
        for rel in rels:
            os.close(_dest_dir(src_root, dest_root, rel, ids))
    finally:
        os.close(src_root)
        os.close(dest_root)


def whiteouts(src: str, dest: str, rels: Iterable[str], *, ids: IdMap | None = None,
              owner: tuple[int, int] = (0, 0)) -> None:
    """An overlay's whiteout (the device 0:0, owned by `owner`) at each of `rels` under
    `dest`, whose directories on the way are made as their sources under `src` where
    missing (as `copy_entries` makes them; `ids`: their owners)."""
    src_root = os.open(src, _DIR_FLAGS)
    dest_root = os.open(dest, _DIR_FLAGS)
    try:
        for rel in rels:
            parent, name = os.path.split(rel)
            dest_dir = _dest_dir(src_root, dest_root, parent, ids)
            try:
                os.mknod(name, stat.S_IFCHR, os.makedev(0, 0), dir_fd=dest_dir)
                os.chown(name, *owner, dir_fd=dest_dir, follow_symlinks=False)
            finally:
                os.close(dest_dir)
    finally:
        os.close(src_root)
        os.close(dest_root)


def open_beneath(root: int, rel: str) -> int:
    """A descriptor of the directory `rel` under the directory `root`, each component
    opened without following a link ('' is `root` again)."""
    fd = os.dup(root)
    for part in [p for p in rel.split("/") if p]:
        if part in (".", ".."):
            os.close(fd)
            raise OSError(errno.EINVAL, f"not a plain relative path: {rel}")
        try:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _dest_dir(src_root: int, dest_root: int, rel: str, ids: IdMap | None = None) -> int:
    """The directory `rel` of the copy, missing ones on the way made as their sources."""
    fd = os.dup(dest_root)
    done = ""
    for part in [p for p in rel.split("/") if p]:
        done = f"{done}/{part}" if done else part
        try:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            source = open_beneath(src_root, done)
            try:
                info = os.fstat(source)
                os.mkdir(part, 0o700, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                settle(source, nxt, info, ids)
            finally:
                os.close(source)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        fd = nxt
    return fd


def _fill(src_dir: int, dest_dir: int, prefix: str, state: _Copy) -> None:
    """Copy every entry of `src_dir` into `dest_dir` (made by this copy, not settled)."""
    with os.scandir(src_dir) as listing:
        # The kind the directory's listing gives (no system call): a regular file is
        # opened at once, without a look first (`_copy_listed_file`).
        names = [(entry.name, entry.is_file(follow_symlinks=False)) for entry in listing]
    owned = _new_owner(dest_dir)
    for name, regular in names:
        # `dest_dir` is this copy's own, its metadata set once it is filled: what is
        # made in it inherits nothing (no default ACL yet), and holds nothing yet.
        rel = f"{prefix}{name}"
        if not regular or not _copy_listed_file(
                src_dir, dest_dir, name, rel, state, owned=owned):
            _copy_entry(src_dir, dest_dir, name, rel, state, fresh=True)


def _new_owner(dest_dir: int) -> tuple[int, int]:
    """The owner a file made in `dest_dir` gets: this process's (file system) ids, the
    directory's group where it has the set-group-id bit (inherited from the directory
    the copy was made in)."""
    info = os.fstat(dest_dir)
    group = info.st_gid if info.st_mode & stat.S_ISGID else os.getegid()
    return os.geteuid(), group


def _copy_listed_file(src_dir: int, dest_dir: int, name: str, rel: str, state: _Copy, *,
                      owned: tuple[int, int]) -> bool:
    """Copy an entry the listing gave as a regular file into a directory this copy made
    (nothing there by that name), looked at through the descriptor its bytes are read
    from: one look, not a look by name and another once open. False (nothing done) when
    it is no regular file any more once open: the caller copies it as what it is then
    (`_copy_entry`). An entry gone, or swapped for a link (`O_NOFOLLOW`), is named in
    `state.gone`."""
    try:
        src_fd = os.open(name, _FILE_FLAGS, dir_fd=src_dir)
    except OSError as exc:
        if exc.errno not in GONE:
            raise
        state.gone.append(rel)
        return True
    try:
        info = os.fstat(src_fd)
        if not stat.S_ISREG(info.st_mode):
            return False
        state.copied[rel] = info
        _place_file(src_fd, dest_dir, name, info, state, fresh=True, owned=owned)
        return True
    except OSError as exc:
        if exc.errno not in GONE:
            raise
        state.copied.pop(rel, None)
        state.gone.append(rel)
        return True
    finally:
        os.close(src_fd)


def _copy_entry(src_dir: int, dest_dir: int, name: str, rel: str, state: _Copy, *,
                fresh: bool) -> None:
    """Copy one entry (a directory with what it holds); an entry that went, or changed
    kind, is named in `state.gone` instead. `fresh`: `dest_dir` was made by this copy and
    is not settled yet (an entry made in it has no extended attributes of its own)."""
    try:
        info = os.stat(name, dir_fd=src_dir, follow_symlinks=False)
        if not fresh:  # a directory this copy made holds nothing yet
            _remove_in(dest_dir, name)
        kind = stat.S_IFMT(info.st_mode)
        state.copied[rel] = info
        if kind == stat.S_IFDIR:
            _copy_dir(src_dir, dest_dir, name, rel, info=info, state=state, fresh=fresh)
            return
        if kind == stat.S_IFREG:
            state.copied[rel] = _copy_file(src_dir, dest_dir, name, info, state, fresh=fresh)
            return
        if kind == stat.S_IFLNK:
            os.symlink(_link_target(src_dir, name), name, dir_fd=dest_dir)
        else:  # FIFOs, sockets, devices (an overlay's whiteout is the device 0:0)
            os.mknod(name, info.st_mode, info.st_rdev, dir_fd=dest_dir)
        _settle_at(dest_dir, name, info, state.ids)
    except OSError as exc:
        if exc.errno not in GONE and not isinstance(exc, ChangedError):
            raise
        state.copied.pop(rel, None)
        state.gone.append(rel)


def _copy_dir(src_dir: int, dest_dir: int, name: str, rel: str, *, info: os.stat_result,
              state: _Copy, fresh: bool) -> None:
    src_fd = os.open(name, _DIR_FLAGS, dir_fd=src_dir)
    try:
        if not _same(os.fstat(src_fd), info):
            raise ChangedError(errno.ESTALE, f"{rel} changed while it was copied")
        os.mkdir(name, 0o700, dir_fd=dest_dir)
        dest_fd = os.open(name, _DIR_FLAGS, dir_fd=dest_dir)
        try:
            _fill(src_fd, dest_fd, f"{rel}/", state)
            settle(src_fd, dest_fd, info, state.ids, fresh=fresh)
        finally:
            os.close(dest_fd)
    finally:
        os.close(src_fd)


def _copy_file(src_dir: int, dest_dir: int, name: str, info: os.stat_result,
               state: _Copy, *, fresh: bool) -> os.stat_result:
    """Copy a regular file; its look through the descriptor its bytes were read from."""
    src_fd = os.open(name, _FILE_FLAGS, dir_fd=src_dir)
    try:
        opened = os.fstat(src_fd)
        if not stat.S_ISREG(opened.st_mode) or not _same(opened, info):
            raise ChangedError(errno.ESTALE, f"{name} changed while it was copied")
        _place_file(src_fd, dest_dir, name, opened, state, fresh=fresh)
    finally:
        os.close(src_fd)
    return opened


def _place_file(src_fd: int, dest_dir: int, name: str, info: os.stat_result, state: _Copy,
                *, fresh: bool, owned: tuple[int, int] | None = None) -> None:
    """Make the copy of the opened regular file `src_fd` (looked at as `info`) as `name`
    in `dest_dir`: a hard link to the copy of a file copied before under another name,
    else its bytes, then its metadata (`settle`; `owned`, the owner it is made with
    where known), remembered for the links to it still to come."""
    if info.st_nlink > 1 and _linked(dest_dir, name, info, state):
        return
    dest_fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                      | os.O_CLOEXEC, 0o600, dir_fd=dest_dir)
    try:
        _data(src_fd, dest_fd, (info.st_dev, state.dest_dev))
        settle(src_fd, dest_fd, info, state.ids, fresh=fresh, owned=owned)
    finally:
        os.close(dest_fd)
    if info.st_nlink > 1:
        state.links[(info.st_dev, info.st_ino)] = (_path_of(dest_dir, state), name)


#: What FICLONE answers where the file systems cannot share extents: the source's and the
#: copy's devices are then remembered (`_NO_CLONE`) and never asked again.
CLONE_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY})
#: (source device, copy device) pairs where FICLONE is unsupported: an ext4 or tmpfs copy
#: pays one failed ioctl per process and pair, not one per file.
_NO_CLONE: set[tuple[int, int]] = set()


def _data(src_fd: int, dest_fd: int, devices: tuple[int, int] | None = None) -> None:
    """The bytes: shared extents where the file system can (`devices`, the source's and
    the copy's st_dev, says where it was found it cannot), else copied in the kernel (to
    the end of the file, which may have grown since it was looked at)."""
    if devices not in _NO_CLONE:
        try:
            fcntl.ioctl(dest_fd, FICLONE, src_fd)
            return
        except OSError as exc:
            # Anything else (ENOSPC, EIO...) is left to the copy, which says it plainly.
            if exc.errno in CLONE_UNSUPPORTED and devices is not None:
                _NO_CLONE.add(devices)
    while True:
        try:
            done = os.copy_file_range(src_fd, dest_fd, 1 << 30)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            _plain_copy(src_fd, dest_fd)
            return
        if done == 0:
            return


def _plain_copy(src_fd: int, dest_fd: int) -> None:
    while chunk := os.read(src_fd, 1 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dest_fd, view):]


def _link_target(src_dir: int, name: str) -> str:
    """A link's target; ChangedError when it is a link no more (readlink(2) says EINVAL:
    swapped for a directory between the look and the read)."""
    try:
        return os.readlink(name, dir_fd=src_dir)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise ChangedError(errno.ESTALE, f"{name} changed while it was copied") from None
        raise


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino, stat.S_IFMT(a.st_mode)) == \
        (b.st_dev, b.st_ino, stat.S_IFMT(b.st_mode))


def settle(src_fd: int, dest_fd: int, info: os.stat_result, ids: IdMap | None = None, *,
           fresh: bool = False, owned: tuple[int, int] | None = None) -> None:
    """Owner (mapped by `ids`), mode (set-id bits after the owner, which clears them),
    extended attributes (those the source has not, removed, unless the copy is `fresh`:
    made by this copy, with none of its own) and times of the opened source (`info`: as
    it was looked at) on the opened copy. `owned`: the owner the copy was made with,
    where known (a file this copy just made, its mode 0600): not set again."""
    owner = _owner(info, ids)
    if owner != owned:
        os.fchown(dest_fd, *owner)
    os.fchmod(dest_fd, stat.S_IMODE(info.st_mode))
    wanted = set(os.listxattr(src_fd))
    for attr in () if fresh else set(os.listxattr(dest_fd)) - wanted:
        with contextlib.suppress(OSError):
            os.removexattr(dest_fd, attr)
    for attr in wanted:
        with contextlib.suppress(OSError):  # one gone meanwhile, or not ours to set
            os.setxattr(dest_fd, attr, os.getxattr(src_fd, attr))
    os.utime(dest_fd, ns=(info.st_atime_ns, info.st_mtime_ns))


def _owner(info: os.stat_result, ids: IdMap | None) -> tuple[int, int]:
    return (info.st_uid, info.st_gid) if ids is None else ids(info.st_uid, info.st_gid)


def _settle_at(dest_dir: int, name: str, info: os.stat_result, ids: IdMap | None = None
               ) -> None:
    """`settle` for an entry that cannot be opened (a link, a FIFO, a device): by name
    in its directory, never following it. A link's mode is not its own to set; the
    extended attributes of links and special files are not kept."""
    os.chown(name, *_owner(info, ids), dir_fd=dest_dir, follow_symlinks=False)
    if not stat.S_ISLNK(info.st_mode):
        os.chmod(name, stat.S_IMODE(info.st_mode), dir_fd=dest_dir)
    os.utime(name, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=dest_dir,
             follow_symlinks=False)


def _linked(dest_dir: int, name: str, info: os.stat_result, state: _Copy) -> bool:
    """A hard link to the copy of a file copied before under another name."""
    first = state.links.get((info.st_dev, info.st_ino))
    if first is None:
        return False
    folder, first_name = first
    first_dir = open_beneath(state.dest_root, folder)
    try:
        os.link(first_name, name, src_dir_fd=first_dir, dst_dir_fd=dest_dir,
                follow_symlinks=False)
    except FileNotFoundError:
        return False  # its first copy went (removed again by a later catch-up)
    finally:
        os.close(first_dir)
    return True


def _path_of(dest_dir: int, state: _Copy) -> str:
    """The path of an open directory of the copy, relative to its root (the copy is the
    host's own: no command can move it meanwhile)."""
    here = os.readlink(f"/proc/self/fd/{dest_dir}")
    root = os.readlink(f"/proc/self/fd/{state.dest_root}")
    rel = os.path.relpath(here, root)
    return "" if rel == "." else rel


def _remove_in(dest_dir: int, name: str) -> None:
    """Clear the place of `name` in the copy (a catch-up copies an entry again)."""
    try:
        info = os.stat(name, dir_fd=dest_dir, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        fd = os.open(name, _DIR_FLAGS, dir_fd=dest_dir)
        try:
            with os.scandir(fd) as listing:
                names = [entry.name for entry in listing]
            for inner in names:
                _remove_in(fd, inner)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=dest_dir)
    else:
        os.unlink(name, dir_fd=dest_dir)

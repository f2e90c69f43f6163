"""Unpacking a tar that came out of a workspace, safely, on every Python bashfleet runs on.

A download's archive is written by a workspace's tar, in a place a model's commands can
write: it may hold anything. tarfile's own extraction filters (`filter="data"`) arrived
in 3.11.4 and Debian 12's python3 is 3.11.2, so the boundary is drawn here, by hand,
before anything is written: every member is checked and one bad member refuses the
whole archive (`UnsafeMemberError`), the destination untouched.

A member is refused when its name is absolute or has a `..` component, when it is not
a regular file, directory, symlink or hard link (a device, a FIFO), and when where it
lands, or where its link points, is outside the destination. So are the shapes no tar
writes on which tarfile itself can loop for ever (a `.` or empty component inside a
name, a link in place of a directory or inside a file, a hard link to anything but a
file archived before it). "Where" is found as the
kernel would find it at that member's turn: through the symlinks the archive made
before it (`x -> .` then `x/y -> ..` escapes, though each looks harmless alone) and
those the destination already held; each member is remembered where it landed, not
under its name (a link made as `a/l` through `a -> d` is met by later members as `d/l`:
so CVE-2025-4517's chain, whose short names reach a link that climbs out only once
resolved, is refused). Each member is extracted without
setuid/setgid/sticky bits, owned by whoever unpacks (never chown'd to the archive's ids
when the caller is root).
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

#: Symlinks followed while resolving one path before it counts as a loop (Linux's own).
MAX_LINK_DEPTH = 40
#: Whether this Python's tarfile has extraction filters (3.11.4 and later).
HAS_FILTERS = hasattr(tarfile, "fully_trusted_filter")

#: A symlink's target by its path relative to the destination ("a/b"), None when that
#: path is no symlink.
LinkLookup = Callable[[str], "str | None"]


class UnsafeMemberError(ValueError):
    """An archive member that would land outside the destination, or is not a plain file,
    directory or link; the message names it and says why."""


def name_parts(name: str) -> list[str]:
    """The components of a member's name (a leading `./` and a directory's trailing `/`
    dropped: what tar writes); UnsafeMemberError when it is absolute, climbs (`..`), or
    has a `.` or empty component elsewhere (no tar writes those, and tarfile itself can
    loop for ever on a link named `b/.`)."""
    if name.startswith("/"):
        raise UnsafeMemberError(f"{name!r}: an absolute path")
    body = (name[2:] if name.startswith("./") else name).rstrip("/")
    if body in ("", "."):
        return []
    parts = body.split("/")
    if ".." in parts:
        raise UnsafeMemberError(f"{name!r}: a '..' component")
    if "" in parts or "." in parts:
        raise UnsafeMemberError(f"{name!r}: not a plain path (a '.' or empty component)")
    return parts


def resolve(parts: Sequence[str], link: LinkLookup, depth: int = 0) -> list[str] | None:
    """Where `parts` (relative to the destination) lead once every symlink on the way,
    the last component's too, is followed; None when they leave the destination (or
    loop)."""
    if depth > MAX_LINK_DEPTH:
        return None
    where: list[str] = []
    for part in parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not where:
                return None
            where.pop()
            continue
        where.append(part)
        target = link("/".join(where))
        if target is not None:
            followed = follow(where[:-1], target, link, depth + 1)
            if followed is None:
                return None
            where = followed
    return where


def follow(directory: Sequence[str], target: str, link: LinkLookup,
           depth: int = 0) -> list[str] | None:
    """Where a symlink in `directory` pointing at `target` leads; None when outside."""
    if target.startswith("/"):
        return None
    return resolve([*directory, *target.split("/")], link, depth)


@dataclass
class Extraction:
    """What the destination holds at a member's turn, as far as the checks need: the
    archive's symlinks, files and directories made before it, and the destination's own
    symlinks and directories (`on_disk`, `disk_dir`)."""

    on_disk: LinkLookup
    disk_dir: Callable[[str], bool]
    made: dict[str, str] = field(default_factory=dict)
    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)

    def link(self, path: str) -> str | None:
        """The symlink at `path` then (its target), or None."""
        return self.made[path] if path in self.made else self.on_disk(path)

    def is_dir(self, path: str) -> bool:
        """Whether a directory (not a link to one) is at `path` then."""
        return path not in self.made and (path in self.dirs or self.disk_dir(path))

    def add(self, member: tarfile.TarInfo) -> None:
        """Note what extracting a checked `member` leaves, where it lands: its path with
        the links on the way followed, as the kernel follows them (a link made as `a/l`
        through `a -> d` is the link `d/l` for every later member), and its parents
        (tarfile makes the directories a member's path names)."""
        parts = name_parts(member.name)
        if not parts:
            return
        parent = resolve(parts[:-1], self.link) or []  # inside: checked
        for end in range(1, len(parent) + 1):
            self.dirs.add("/".join(parent[:end]))
        if member.issym():  # replaces what is there (never a directory: checked)
            path = "/".join([*parent, parts[-1]])
            self.files.discard(path)
            self.made[path] = member.linkname
            return
        path = "/".join(resolve(parts, self.link) or [])  # written through a final link
        (self.dirs if member.isdir() else self.files).add(path)


def check_member(member: tarfile.TarInfo, state: Extraction) -> None:
    """UnsafeMemberError unless `member` stays inside the destination as it is then
    (`state`)."""
    parts = name_parts(member.name)
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeMemberError(f"{member.name!r}: a device or FIFO, not a file")
    if not parts:
        if member.isdir():
            return  # the destination itself ("./")
        raise UnsafeMemberError(f"{member.name!r}: no name")
    # A symlink replaces what is at its path; anything else is written through it.
    landing = resolve(parts[:-1], state.link) if member.issym() else resolve(parts, state.link)
    if landing is None:
        raise UnsafeMemberError(f"{member.name!r}: its path leads outside through a symlink")
    parent = resolve(parts[:-1], state.link)
    if parent and "/".join(parent) in state.files:
        # (A link whose directory is a file fails, and tarfile then extracts what it
        # names in its place, which can loop for ever.)
        raise UnsafeMemberError(f"{member.name!r}: its directory is a file")
    if member.issym() or member.islnk():
        check_link(member, parts, landing, state)


def check_link(member: tarfile.TarInfo, parts: list[str], landing: list[str],
               state: Extraction) -> None:
    """A symlink must point inside; a hard link to a file archived before it (what tar
    writes: one to anything else, the destination's own files included, is refused);
    neither may take the place of a directory (tarfile then extracts what the link names
    instead, and can loop for ever)."""
    target = member.linkname
    where = "/".join([*landing, parts[-1]] if member.issym() else landing)
    if state.is_dir(where):
        raise UnsafeMemberError(f"{member.name!r}: a link over a directory")
    if member.issym():
        if follow(parts[:-1], target, state.link) is None:
            raise UnsafeMemberError(f"{member.name!r}: a symlink to {target!r}, outside")
        return
    if target.startswith("/") or resolve(target.split("/"), state.link) is None:
        raise UnsafeMemberError(f"{member.name!r}: a hard link to {target!r}, outside")
    # link(2) follows the links on the way to its target, not a last one.
    target_parts = name_parts(target)
    directory = resolve(target_parts[:-1], state.link)
    if directory is None or "/".join([*directory, *target_parts[-1:]]) not in state.files:
        raise UnsafeMemberError(f"{member.name!r}: a hard link to {target!r}, no earlier file")


def check_members(members: Sequence[tarfile.TarInfo], on_disk: LinkLookup,
                  disk_dir: Callable[[str], bool] = lambda path: False) -> None:
    """Check each member in extraction order (UnsafeMemberError at the first bad one),
    against what the archive made before it and what the destination held (`on_disk`:
    its symlinks, `disk_dir`: its directories)."""
    state = Extraction(on_disk, disk_dir)
    for member in members:
        check_member(member, state)
        state.add(member)


def disk_dirs(destination: str) -> Callable[[str], bool]:
    """Whether the destination already holds a directory (not a symlink) at a path."""
    def is_dir(path: str) -> bool:
        full = os.path.join(destination, path)
        return os.path.isdir(full) and not os.path.islink(full)
    return is_dir


def disk_links(destination: str) -> LinkLookup:
    """The symlinks the destination already holds (none when it does not exist yet)."""
    def link(path: str) -> str | None:
        full = os.path.join(destination, path)
        return os.readlink(full) if os.path.islink(full) else None
    return link


def tame_in_place(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """`member` as it is written: permission bits only, owned by the caller."""
    member.mode &= 0o777
    member.uid, member.gid = os.geteuid(), os.getegid()
    member.uname = member.gname = ""
    return member


def extract(archive: tarfile.TarFile, destination: str) -> None:
    """Extract every member into `destination` (made if missing) once all are checked;
    UnsafeMemberError, with nothing written, when one is not safe."""
    members = archive.getmembers()
    check_members(members, disk_links(destination), disk_dirs(destination))
    os.makedirs(destination, exist_ok=True)
    # Tamed where they are, not copied: a hard link tarfile cannot make (its name is
    # taken) is written as a copy of its target, which tarfile looks up by identity among
    # the archive's own members.
    tame = [tame_in_place(member) for member in members]
    if HAS_FILTERS:
        # The filter that changes nothing: every Python unpacks the same members the same
        # way (3.14's default, `data`, would second-guess the checks above).
        archive.extractall(destination, members=tame, filter="fully_trusted")  # noqa: S202
    else:
        archive.extractall(destination, members=tame)  # noqa: S202 - checked above

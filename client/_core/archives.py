"""Unpacking a tar that came out of a workspace, safely, on every Python bashfleet runs on.

A download's archive is written by a workspace's tar, in a place a model's commands can
write: it may hold anything. tarfile's own extraction filters (`filter="data"`) arrived
in 3.11.4 and Debian 12's python3 is 3.11.2, so the boundary is drawn here, by hand,
before anything is written: every member is checked and one bad member refuses the
whole archive (`UnsafeMemberError`), the destination untouched.

A member is refused when its name is absolute or has a `..` component, when it is not
a regular file, directory, symlink or hard link (a device, a FIFO), and when where it
lands, or where its link points, is outside the destination. "Where" is found as the
kernel would find it at that member's turn: through the symlinks the archive made
before it (`x -> .` then `x/y -> ..` escapes, though each looks harmless alone) and
those the destination already held. What is extracted is a copy of each member without
setuid/setgid/sticky bits, owned by whoever unpacks (never chown'd to the archive's ids
when the caller is root).
"""

from __future__ import annotations

import copy
import os
import tarfile
from collections.abc import Callable, Sequence

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
    """The components of a member's name (`.` and empty ones dropped); UnsafeMemberError
    when it is absolute or climbs (`..`)."""
    if name.startswith("/"):
        raise UnsafeMemberError(f"{name!r}: an absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UnsafeMemberError(f"{name!r}: a '..' component")
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


def check_member(member: tarfile.TarInfo, link: LinkLookup, files: set[str]) -> None:
    """UnsafeMemberError unless `member` stays inside the destination, its symlinks so far
    (the archive's earlier ones, the destination's own) told by `link`, a hard link to
    one of the earlier `files` of the archive (its normalized names)."""
    parts = name_parts(member.name)
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeMemberError(f"{member.name!r}: a device or FIFO, not a file")
    if not parts:
        if member.isdir():
            return  # the destination itself ("./")
        raise UnsafeMemberError(f"{member.name!r}: no name")
    # A symlink replaces what is at its path; anything else is written through it.
    landing = resolve(parts[:-1], link) if member.issym() else resolve(parts, link)
    if landing is None:
        raise UnsafeMemberError(f"{member.name!r}: its path leads outside through a symlink")
    if member.issym() and follow(parts[:-1], member.linkname, link) is None:
        raise UnsafeMemberError(f"{member.name!r}: a symlink to {member.linkname!r}, outside")
    if member.islnk():
        check_hard_link(member, link, files)


def check_hard_link(member: tarfile.TarInfo, link: LinkLookup, files: set[str]) -> None:
    """A hard link is a reference to a file archived before it (what tar writes): one to
    anything else, the destination's own files included, is refused."""
    target = member.linkname
    if target.startswith("/") or resolve(target.split("/"), link) is None:
        raise UnsafeMemberError(f"{member.name!r}: a hard link to {target!r}, outside")
    if "/".join(name_parts(target)) not in files:
        raise UnsafeMemberError(f"{member.name!r}: a hard link to {target!r}, no earlier file")


def check_members(members: Sequence[tarfile.TarInfo], on_disk: LinkLookup) -> None:
    """Check each member in extraction order (UnsafeMemberError at the first bad one): the
    archive's symlinks made before it, else those `on_disk` tells, are on its way."""
    made: dict[str, str] = {}
    files: set[str] = set()

    def link(path: str) -> str | None:
        return made[path] if path in made else on_disk(path)

    for member in members:
        check_member(member, link, files)
        path = "/".join(name_parts(member.name))
        if member.issym():
            made[path] = member.linkname
        elif member.isreg() or member.islnk():
            files.add(path)


def disk_links(destination: str) -> LinkLookup:
    """The symlinks the destination already holds (none when it does not exist yet)."""
    def link(path: str) -> str | None:
        full = os.path.join(destination, path)
        return os.readlink(full) if os.path.islink(full) else None
    return link


def tamed(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """A copy of `member` as it is written: permission bits only, owned by the caller."""
    copied = copy.copy(member)
    copied.mode = member.mode & 0o777
    copied.uid, copied.gid = os.geteuid(), os.getegid()
    copied.uname = copied.gname = ""
    return copied


def extract(archive: tarfile.TarFile, destination: str) -> None:
    """Extract every member into `destination` (made if missing) once all are checked;
    UnsafeMemberError, with nothing written, when one is not safe."""
    members = archive.getmembers()
    check_members(members, disk_links(destination))
    os.makedirs(destination, exist_ok=True)
    tame = [tamed(member) for member in members]
    if HAS_FILTERS:
        # The filter that changes nothing: every Python unpacks the same members the same
        # way (3.14's default, `data`, would second-guess the checks above).
        archive.extractall(destination, members=tame, filter="fully_trusted")  # noqa: S202
    else:
        archive.extractall(destination, members=tame)  # noqa: S202 - checked above

"""Archives a hostile workspace could send as a directory download: unpacked as they
are, each writes outside the directory it is unpacked into, or makes a device there.

Standard library only, and written for every Python bashfleet runs on: the client's own
member checks (`bashfleet.client._core.archives`) must hold on Debian 12's python3 (3.11.2, whose
tarfile has no extraction filters) as on the newest, and the tests run these archives
through both.

    archives = crafted(dest)   # {name: Crafted}, built for unpacking into `dest`
"""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Crafted:
    """An archive, and the path outside `dest` it writes when unpacked as it is (None:
    it writes inside, something no download may hold: a device)."""

    data: bytes
    target: Path | None


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _member(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o755
    return info, None


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = 0o644
    return info, data


def realpath_overflow(target_name: str) -> bytes:
    """CVE-2025-4517's shape: symlinks `a`..`p` to directories of 247-character names,
    nested 16 deep, so that a path through them is short while what it leads to passes
    PATH_MAX; a link there climbs back 16 levels (`os.path.realpath`, which the `data`
    filter relies on, gives up on the way and sees it inside); a link through it climbs
    one more, and a file is written through that one: beside the destination."""
    comp, steps = "d" * 247, "abcdefghijklmnop"
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    path = ""
    for step in steps:
        members.append(_member(os.path.join(path, comp), tarfile.DIRTYPE))
        members.append(_member(os.path.join(path, step), tarfile.SYMTYPE, comp))
        path = os.path.join(path, comp)
    deep_link = os.path.join("/".join(steps), "l" * 254)
    members.append(_member(deep_link, tarfile.SYMTYPE, "../" * len(steps)))
    members.append(_member("escape", tarfile.SYMTYPE, deep_link + "/.."))
    members.append(_file(f"escape/{target_name}", b"pwned by realpath overflow\n"))
    return _tar(members)


def link_chain(target_name: str) -> bytes:
    """Two links harmless alone: `x -> .`, then `x/y -> ..` (made in the destination
    itself, pointing above it); a file written through `y`."""
    return _tar([_member("x", tarfile.SYMTYPE, "."), _member("x/y", tarfile.SYMTYPE, ".."),
                 _file(f"y/{target_name}", b"pwned by a link chain\n")])


def crafted(dest: Path) -> dict[str, Crafted]:
    """The archives, each built to write `dest`'s sibling `canary-<name>` (an absolute
    path for those that name one) when unpacked into `dest` as it is."""
    side = dest.parent
    target = {name: side / f"canary-{name}" for name in
              ("overflow", "chain", "absolute", "dotdot", "link-out")}
    return {
        "overflow": Crafted(realpath_overflow(target["overflow"].name), target["overflow"]),
        "chain": Crafted(link_chain(target["chain"].name), target["chain"]),
        "absolute": Crafted(_tar([_file(str(target["absolute"]), b"pwned by a path\n")]),
                            target["absolute"]),
        "dotdot": Crafted(_tar([_file(f"../{target['dotdot'].name}", b"pwned by ..\n")]),
                          target["dotdot"]),
        "link-out": Crafted(_tar([
            _member("out", tarfile.SYMTYPE, str(side)),
            _file(f"out/{target['link-out'].name}", b"pwned through a link\n")]),
            target["link-out"]),
        "device": Crafted(_tar([_file("plain", b"plain\n"), _device("null")]), None),
    }


def _device(name: str) -> tuple[tarfile.TarInfo, None]:
    info, _ = _member(name, tarfile.CHRTYPE)
    info.devmajor, info.devminor, info.mode = 1, 3, 0o666
    return info, None


def unpack_naively(data: bytes, dest: Path) -> None:
    """What a client that trusts the archive does: tarfile's extraction, no filter."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        if hasattr(tarfile, "fully_trusted_filter"):
            archive.extractall(dest, filter="fully_trusted")  # noqa: S202 - the point
        else:
            archive.extractall(dest)  # noqa: S202 - the point

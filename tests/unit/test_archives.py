"""Unpacking a workspace's tar: crafted archives that try to leave the destination are
refused whole, nothing written, on every Python (Debian 12's 3.11.2 has no tarfile
filters: these checks are the boundary there)."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bashfleet.client._core import archives
from bashfleet.client._core.workspaces import pack, unpack
from bashfleet.client.errors import WorkspaceFileError


@dataclass(frozen=True)
class Entry:
    """One member of a crafted archive."""

    name: str
    kind: bytes = tarfile.REGTYPE
    link: str = ""
    data: bytes = b"x"
    mode: int = 0o644


def tar_of(*entries: Entry) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type = entry.kind
            info.linkname = entry.link
            info.mode = entry.mode
            info.uid = info.gid = 4242
            payload = entry.data if entry.kind == tarfile.REGTYPE else b""
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def walk(root: Path) -> list[Path]:
    """Every path under `root`, symlinks not followed (an archive may leave `a -> .`)."""
    found = []
    for folder, dirs, files in os.walk(root):
        found += [Path(folder) / name for name in (*dirs, *files)]
    return found


def tree(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in walk(root)}


UNSAFE = {
    "absolute": [Entry("/etc/owned")],
    "dotdot": [Entry("../owned")],
    "dotdot inside": [Entry("a/../../owned")],
    "absolute symlink": [Entry("l", tarfile.SYMTYPE, "/etc")],
    "symlink up": [Entry("l", tarfile.SYMTYPE, "../outside")],
    "symlink up from a directory": [Entry("d/", tarfile.DIRTYPE),
                                    Entry("d/l", tarfile.SYMTYPE, "../..")],
    "link chain": [Entry("x", tarfile.SYMTYPE, "."), Entry("x/y", tarfile.SYMTYPE, "..")],
    "file through a link out": [Entry("d/", tarfile.DIRTYPE),
                                Entry("d/l", tarfile.SYMTYPE, "../../.."),
                                Entry("d/l/owned")],
    # Each link harmless where it is looked at by name; `a/l` is made through `a -> d`,
    # so it is `d/l`, and `d/l/..` climbs out (CVE-2025-4517's chain, in five members).
    "a link made through a link": [Entry("d/", tarfile.DIRTYPE), Entry("a", tarfile.SYMTYPE, "d"),
                                   Entry("a/l", tarfile.SYMTYPE, ".."),
                                   Entry("e", tarfile.SYMTYPE, "d/l/.."), Entry("e/owned")],
    "link loop": [Entry("a", tarfile.SYMTYPE, "b"), Entry("b", tarfile.SYMTYPE, "a"),
                  Entry("a/f")],
    "absolute hard link": [Entry("h", tarfile.LNKTYPE, "/etc/passwd")],
    "hard link up": [Entry("h", tarfile.LNKTYPE, "../outside")],
    "hard link through a link": [Entry("l", tarfile.SYMTYPE, "."),
                                 Entry("h", tarfile.LNKTYPE, "l/../outside")],
    # Harmless-looking, but tarfile itself loops for ever on some (a link it cannot make
    # in place is replaced by what it names, which can be that link again).
    "a '.' component": [Entry("b/b/b"), Entry("b/.", tarfile.SYMTYPE, "a/..")],
    "an empty component": [Entry("a//b")],
    "a symlink over a directory": [Entry("d/", tarfile.DIRTYPE), Entry("d", tarfile.SYMTYPE, "e")],
    "a symlink over a parent": [Entry("b/b"), Entry("b", tarfile.SYMTYPE, "b")],
    "a link in a file": [Entry("f"), Entry("l", tarfile.SYMTYPE, "f"),
                         Entry("l/x", tarfile.SYMTYPE, "y")],
    "character device": [Entry("tty", tarfile.CHRTYPE)],
    "block device": [Entry("sda", tarfile.BLKTYPE)],
    "fifo": [Entry("pipe", tarfile.FIFOTYPE)],
}


@pytest.mark.parametrize("entries", UNSAFE.values(), ids=UNSAFE.keys())
def test_an_unsafe_member_refuses_the_whole_archive(tmp_path: Path,
                                                    entries: list[Entry]) -> None:
    destination = tmp_path / "in" / "dest"
    data = tar_of(Entry("first.txt"), *entries, Entry("last.txt"))
    with pytest.raises(WorkspaceFileError, match=r"refused to unpack into .*dest: '"):
        unpack(data, destination)
    assert tree(tmp_path) == set()  # nothing written, not even the destination


def test_a_symlink_the_destination_already_holds_is_followed(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    destination = tmp_path / "dest"
    destination.mkdir()
    (destination / "up").symlink_to("../outside")
    (destination / "same").symlink_to(".")
    for entries in ([Entry("up/owned")], [Entry("same/l", tarfile.SYMTYPE, "..")]):
        with pytest.raises(WorkspaceFileError, match="outside"):
            unpack(tar_of(*entries), destination)
    assert tree(tmp_path / "outside") == set()


def test_a_plain_tree_is_unpacked_with_links_inside_and_no_special_bits(
        tmp_path: Path) -> None:
    data = tar_of(
        Entry("./", tarfile.DIRTYPE, mode=0o755),  # as `tar -c -C dir .` writes it
        Entry("./bin/", tarfile.DIRTYPE, mode=0o755),
        Entry("./bin/tool", data=b"#!/bin/sh\n", mode=0o4755),
        Entry("./bin/alias", tarfile.SYMTYPE, "tool"),
        Entry("./lib", tarfile.SYMTYPE, "bin"),
        Entry("./lib/through", data=b"y"),
        Entry("./hard", tarfile.LNKTYPE, "./bin/tool", mode=0o755),
    )
    unpack(data, tmp_path / "dest")
    dest = tmp_path / "dest"
    assert (dest / "bin" / "alias").read_text() == "#!/bin/sh\n"
    assert (dest / "bin" / "through").read_text() == "y"
    assert (dest / "hard").read_text() == "#!/bin/sh\n"
    mode = (dest / "bin" / "tool").stat().st_mode
    assert stat.S_IMODE(mode) == 0o755  # executable, but never setuid
    assert (dest / "bin" / "tool").stat().st_uid == os.geteuid()  # not the archive's 4242


def test_a_packed_directory_comes_back_whole(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "f.txt").write_text("hello")
    (source / "link").symlink_to("sub/f.txt")
    unpack(pack(source), tmp_path / "copy")
    assert (tmp_path / "copy" / "link").read_text() == "hello"
    assert tree(tmp_path / "copy") == {"sub", "sub/f.txt", "link"}


@pytest.mark.parametrize(("entries", "contents"), [
    # A hard link onto its own name, and one onto a name an earlier file took: tarfile
    # cannot link where the name is taken, and writes a copy of the link's target.
    ([Entry("a/a/a"), Entry("a/a/a", tarfile.LNKTYPE, "a/a/a")], {"a/a/a": b"x"}),
    ([Entry("b", data=b"y"), Entry("a"), Entry("a", tarfile.LNKTYPE, "b")],
     {"a": b"y", "b": b"y"}),
], ids=["link-to-itself", "link-over-a-file"])
def test_a_hard_link_whose_name_is_taken_lands_as_a_copy_of_its_target(
        tmp_path: Path, entries: list[Entry], contents: dict[str, bytes]) -> None:
    unpack(tar_of(*entries), tmp_path / "dest")
    for name, data in contents.items():
        assert (tmp_path / "dest" / name).read_bytes() == data


def test_a_corrupt_archive_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceFileError, match="could not unpack"):
        unpack(b"not a tar at all" * 64, tmp_path / "dest")


def test_resolve_follows_links_as_the_kernel_would() -> None:
    links = {"x": ".", "d/l": "../e", "loop": "loop"}
    assert archives.resolve(["x", "x", "f"], links.get) == ["f"]
    assert archives.resolve(["d", "l", "g"], links.get) == ["e", "g"]
    assert archives.resolve(["x", ".."], links.get) is None
    assert archives.resolve(["loop"], links.get) is None


NAMES = st.lists(st.sampled_from(["a", "b", ".", ".."]), min_size=1, max_size=3).map(
    "/".join)
ENTRIES = st.lists(st.builds(
    Entry,
    name=NAMES | NAMES.map(lambda name: "/" + name),
    kind=st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE,
                          tarfile.LNKTYPE]),
    link=NAMES | NAMES.map(lambda name: "/" + name),
), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ENTRIES)
def test_whatever_the_archive_nothing_lands_outside(entries: list[Entry]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        outer = Path(scratch)
        destination = outer / "dest"
        try:
            unpack(tar_of(*entries), destination)
        except WorkspaceFileError as exc:
            # Refused (nothing written) or failed by tarfile itself part way, after the
            # checks passed (a hard link to a missing file, a file over a directory).
            assert "refused" in str(exc) or destination.exists() or "could not" in str(exc)
            if "refused" in str(exc):
                assert tree(outer) == set()
        except OSError:
            pass  # tarfile's own failure on a clash of members, inside the destination
        assert {p.name for p in outer.iterdir()} <= {"dest"}
        root = os.path.realpath(destination)
        for path in walk(destination):
            if path.is_symlink():
                real = os.path.realpath(path)
                assert real == root or real.startswith(root + os.sep), (path, real)

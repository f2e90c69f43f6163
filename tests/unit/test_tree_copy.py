"""bashfleet.worker.engine.snapshots.tree_copy: what `cp -a` keeps, kept; nothing followed, even a
directory swapped for a link between the copy's look at it and its open."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from privilege import needs_root

from bashfleet.worker.engine.snapshots import tree_copy

pytestmark = needs_root("owners, devices, trusted xattrs")


def _tree(root: Path) -> dict[str, tuple[object, ...]]:
    """Everything `cp -a` keeps of each entry, inode numbers as groups of hard links."""
    found: dict[str, tuple[object, ...]] = {}
    inodes: dict[int, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in sorted([*dirs, *files]):
            path = Path(folder) / name
            info = path.lstat()
            rel = str(path.relative_to(root))
            content: object = None
            if stat.S_ISREG(info.st_mode):
                content = path.read_bytes()
            elif stat.S_ISLNK(info.st_mode):
                content = os.readlink(path)
            xattrs = () if stat.S_ISLNK(info.st_mode) else tuple(sorted(
                (n, os.getxattr(path, n, follow_symlinks=False))
                for n in os.listxattr(path, follow_symlinks=False)))
            link_group = inodes.setdefault(info.st_ino, rel) if info.st_nlink > 1 \
                and stat.S_ISREG(info.st_mode) else None
            mtime = None if stat.S_ISLNK(info.st_mode) else info.st_mtime_ns
            found[rel] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), info.st_uid,
                          info.st_gid, info.st_rdev, content, xattrs, link_group, mtime)
    return found


def _layer(src: Path) -> None:
    """An overlay upper layer's kinds: files, a set-user-id one of another owner, a hard
    link, a link, a FIFO, a whiteout (device 0:0), an opaque directory."""
    (src / "etc" / "deep").mkdir(parents=True)
    (src / "etc" / "conf").write_text("conf\n")
    (src / "etc" / "deep" / "big").write_bytes(os.urandom(300_000))
    tool = src / "tool"
    tool.write_bytes(b"#!/bin/sh\n")
    os.chown(tool, 100_000, 100_005)
    tool.chmod(0o4755)
    os.link(src / "etc" / "conf", src / "etc" / "deep" / "conf-link")
    (src / "lnk").symlink_to("/etc/shadow")
    os.mkfifo(src / "fifo")
    os.mknod(src / "etc" / "removed", stat.S_IFCHR | 0o000, os.makedev(0, 0))
    os.setxattr(src / "etc" / "deep", "trusted.overlay.opaque", b"y")
    os.setxattr(src / "etc" / "conf", "user.note", b"kept")
    os.chown(src / "etc", 100_000, 100_000)
    os.utime(src / "etc", ns=(1_000_000_000, 2_000_000_000))


def test_the_copy_keeps_what_cp_a_keeps(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _layer(src)
    subprocess.run(["cp", "-a", "-T", str(src), str(tmp_path / "cp")], check=True)
    assert tree_copy.copy_tree(str(src), str(tmp_path / "ours")) == []
    assert _tree(tmp_path / "ours") == _tree(tmp_path / "cp")
    assert stat.S_IMODE((tmp_path / "ours" / "tool").stat().st_mode) == 0o4755


def test_a_directory_swapped_for_a_link_between_look_and_open_is_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race a tenant's job runs against a snapshot: `p` is a directory when looked
    at, and a link to a host directory when opened (RENAME_EXCHANGE, here done at that
    very moment). The copy leaves `p` out (the frozen pass copies it again as what it is
    then), and holds nothing of the host's directory."""
    canary = tmp_path / "host-etc"
    canary.mkdir()
    (canary / "shadow").write_text("root's only\n")
    canary.chmod(0o700)
    src = tmp_path / "src"
    (src / "p" / "etc").mkdir(parents=True)
    (src / "p" / "etc" / "mine").write_text("mine\n")
    real_copy_dir = tree_copy._copy_dir

    def swap_then_copy(src_dir: int, dest_dir: int, name: str, rel: str,
                       **rest: Any) -> None:
        if name == "p":
            (src / "p").rename(src / "p.real")
            (src / "p").symlink_to(canary)
        real_copy_dir(src_dir, dest_dir, name, rel, **rest)

    monkeypatch.setattr(tree_copy, "_copy_dir", swap_then_copy)
    gone = tree_copy.copy_tree(str(src), str(tmp_path / "copy"))
    assert gone == ["p"]
    copied = [str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*")]
    assert not any("shadow" in name for name in copied), copied
    # The catch-up copies `p` as what it is now: the link itself, not what it leads to.
    monkeypatch.undo()
    assert tree_copy.copy_entries(str(src), str(tmp_path / "copy"), ["p"]) == []
    assert os.readlink(tmp_path / "copy" / "p") == str(canary)


def test_a_link_on_the_way_to_an_entry_of_a_catch_up_is_not_followed(tmp_path: Path) -> None:
    canary = tmp_path / "host"
    (canary / "etc").mkdir(parents=True)
    (canary / "etc" / "shadow").write_text("root's only\n")
    src = tmp_path / "src"
    src.mkdir()
    (src / "p").symlink_to(canary)
    (tmp_path / "copy").mkdir()
    assert tree_copy.copy_entries(str(src), str(tmp_path / "copy"), ["p/etc/shadow"]) == [
        "p/etc/shadow"]
    assert list((tmp_path / "copy").iterdir()) == []


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "a/c", "b/d", "a/c/e"]),
                          st.sampled_from(["file", "dir", "link"]), st.binary(max_size=64)),
                max_size=12))
def test_any_tree_copies_as_cp_a_copies_it(tmp_path_factory: pytest.TempPathFactory,
                                           entries: list[tuple[str, str, bytes]]) -> None:
    base = tmp_path_factory.mktemp("any")
    src = base / "src"
    src.mkdir()
    for rel, kind, data in entries:
        path = src / rel
        if path.parent.is_dir() and not path.parent.is_symlink() and not os.path.lexists(path):
            if kind == "file":
                path.write_bytes(data)
            elif kind == "dir":
                path.mkdir()
            else:
                path.symlink_to(data.hex() or "x")
    subprocess.run(["cp", "-a", "-T", str(src), str(base / "cp")], check=True)
    assert tree_copy.copy_tree(str(src), str(base / "ours")) == []
    assert _tree(base / "ours") == _tree(base / "cp")


def test_a_link_swapped_for_a_directory_between_look_and_read_is_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The swap the other way round: `q` a link when looked at, a directory when its
    target is read (readlink says EINVAL): left out for the frozen pass, not a failure."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "q").symlink_to("/")
    real_target = tree_copy._link_target

    def swap_then_read(src_dir: int, name: str) -> str:
        if name == "q":
            (src / "q").unlink()
            (src / "q").mkdir()
        return real_target(src_dir, name)

    monkeypatch.setattr(tree_copy, "_link_target", swap_then_read)
    assert tree_copy.copy_tree(str(src), str(tmp_path / "copy")) == ["q"]


def _swap_after_listing(monkeypatch: pytest.MonkeyPatch, swap: Callable[[], None]) -> None:
    """Run `swap` once the copy listed the source's top directory, before it opens any
    of its entries (the copy asks who owns what it makes in between)."""
    real_owner = tree_copy._new_owner
    done: list[bool] = []

    def swap_then_look(dest_dir: int) -> tuple[int, int]:
        if not done:
            done.append(True)
            swap()
        return real_owner(dest_dir)

    monkeypatch.setattr(tree_copy, "_new_owner", swap_then_look)


def test_a_file_listed_then_swapped_for_a_link_is_left_out_and_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A regular file when listed, a link to a host file when opened: left out for the
    frozen pass (`O_NOFOLLOW`), nothing of the host's file copied."""
    canary = tmp_path / "shadow"
    canary.write_text("root's only\n")
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("mine\n")
    (src / "g").write_text("kept\n")

    def swap() -> None:
        (src / "f").unlink()
        (src / "f").symlink_to(canary)

    _swap_after_listing(monkeypatch, swap)
    assert tree_copy.copy_tree(str(src), str(tmp_path / "copy")) == ["f"]
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["g"]
    assert (tmp_path / "copy" / "g").read_text() == "kept\n"


@pytest.mark.parametrize("kind", ["dir", "fifo"])
def test_a_file_listed_then_swapped_for_another_kind_is_copied_as_it_is_then(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """A regular file when listed, a directory or a FIFO once opened: copied as what it
    is then, as `cp -a` of the tree at that moment would (the look is the opened one)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("mine\n")

    def swap() -> None:
        (src / "f").unlink()
        if kind == "dir":
            (src / "f").mkdir()
            (src / "f" / "inner").write_text("inside\n")
        else:
            os.mkfifo(src / "f")

    _swap_after_listing(monkeypatch, swap)
    assert tree_copy.copy_tree(str(src), str(tmp_path / "ours")) == []
    subprocess.run(["cp", "-a", "-T", str(src), str(tmp_path / "cp")], check=True)
    assert _tree(tmp_path / "ours") == _tree(tmp_path / "cp")


def test_a_copy_made_in_a_set_group_id_directory_keeps_its_sources_groups(
        tmp_path: Path) -> None:
    """Files made under a set-group-id directory take its group: the copy sets each
    file's group to its source's all the same (not taking the one it was made with)."""
    parent = tmp_path / "sgid"
    parent.mkdir()
    os.chown(parent, 0, 4242)
    parent.chmod(0o2775)
    src = tmp_path / "src"
    src.mkdir()
    (src / "root-owned").write_text("0:0\n")
    (src / "other").write_text("5:6\n")
    os.chown(src / "other", 5, 6)
    assert tree_copy.copy_tree(str(src), str(parent / "copy")) == []
    owners = {p.name: (p.stat().st_uid, p.stat().st_gid) for p in (parent / "copy").iterdir()}
    assert owners == {"root-owned": (0, 0), "other": (5, 6)}


def test_owners_are_mapped_as_the_copy_makes_each_entry(tmp_path: Path) -> None:
    """`ids` maps every entry's owner (files, directories, links, the top), set once as
    each is made: set-id bits survive it, the rest is `cp -a`'s."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_text("x")
    (src / "tool").write_text("#!/bin/sh\n")
    (src / "link").symlink_to("d/f")
    for path, owner in ((src, 100000), (src / "d", 100001), (src / "d" / "f", 100002),
                        (src / "tool", 100000), (src / "link", 100003)):
        os.lchown(path, owner, owner + 10)
    os.chmod(src / "tool", 0o4755)  # noqa: S103 - set-user-id kept: a copy, never run

    def shifted(uid: int, gid: int) -> tuple[int, int]:
        return uid - 100000, gid - 100000

    assert tree_copy.copy_tree(str(src), str(tmp_path / "copy"), ids=shifted) == []
    copy = tmp_path / "copy"
    owners = {rel: (os.lstat(copy / rel).st_uid, os.lstat(copy / rel).st_gid)
              for rel in (".", "d", "d/f", "tool", "link")}
    assert owners == {".": (0, 10), "d": (1, 11), "d/f": (2, 12), "tool": (0, 10),
                      "link": (3, 13)}
    assert stat.S_IMODE(os.lstat(copy / "tool").st_mode) == 0o4755
    assert tree_copy.copy_entries(str(src), str(copy), ["d/f"], ids=shifted) == []
    assert (os.lstat(copy / "d" / "f").st_uid, os.lstat(copy / "d" / "f").st_gid) == (2, 12)


def test_a_catch_up_removes_extended_attributes_the_source_has_not(tmp_path: Path) -> None:
    """Into a directory the copy did not just make (a catch-up's), what a new entry
    inherits there is not taken for the source's: attributes it has not are removed."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("x")
    copy = tmp_path / "copy"
    assert tree_copy.copy_tree(str(src), str(copy)) == []
    (copy / "f").unlink()
    real_open = os.open

    def open_with_attr(path: object, flags: int, *args: object, **kwargs: object) -> int:
        fd = real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]
        if flags & os.O_CREAT:
            os.setxattr(fd, "user.inherited", b"1")  # as a default ACL would give it
        return fd

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "open", open_with_attr)
        assert tree_copy.copy_entries(str(src), str(copy), ["f"]) == []
    assert os.listxattr(copy / "f") == []


def test_make_dirs_and_whiteouts_make_what_they_name_with_their_parents(tmp_path: Path) -> None:
    """A thin snapshot's directories (without what they hold) and whiteouts, the
    directories on the way made as their sources, owners mapped."""
    src = tmp_path / "src"
    (src / "a" / "b" / "c").mkdir(parents=True)
    (src / "a" / "b" / "c" / "kept").write_text("not copied")
    for path, owner in ((src, 100000), (src / "a", 100001), (src / "a" / "b", 100002),
                        (src / "a" / "b" / "c", 100003)):
        os.chown(path, owner, owner)
    os.chmod(src / "a" / "b", 0o500)
    os.utime(src / "a", ns=(1_000_000_000, 2_000_000_000))
    dest = tmp_path / "thin"
    dest.mkdir()

    def shifted(uid: int, gid: int) -> tuple[int, int]:
        return uid - 100000, gid - 100000

    tree_copy.make_dirs(str(src), str(dest), ["a/b/c"], ids=shifted)
    tree_copy.whiteouts(str(src), str(dest), ["a/gone", "a/b/also"], ids=shifted)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == [
        "a", "a/b", "a/b/also", "a/b/c", "a/gone"]
    assert [os.lstat(dest / rel).st_uid for rel in ("a", "a/b", "a/b/c")] == [1, 2, 3]
    assert stat.S_IMODE(os.lstat(dest / "a" / "b").st_mode) == 0o500
    for rel in ("a/gone", "a/b/also"):
        info = os.lstat(dest / rel)
        assert stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(0, 0)
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0)

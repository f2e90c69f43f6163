"""The stamps that tell a throwaway workspace's directories unchanged without listing
them: trusted only once every ctime in them is older than the margin, and broken by any
change below their root, however deep."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bashfleet.worker.engine.workspaces import untouched

from .test_layer_listing import NAMES, TREES, _make

SECOND = 10**9


def _stamps(*ctimes_s: float) -> untouched.TreeStamps:
    return tuple((f"e{n}", (1, n, 0o40755, 0, 0, 0, 0, int(c * SECOND)))
                 for n, c in enumerate(ctimes_s))


@pytest.mark.parametrize(("ctimes", "now", "margin", "trusted"), [
    ((100.0,), 100.3, 0.2, True),
    ((100.0, 100.1), 100.3, 0.2, True),
    ((100.0, 100.2), 100.3, 0.2, False),   # one too young: a change may share its tick
    ((100.0,), 100.0, 0.2, False),
    ((100.0,), 99.0, 0.2, False),          # a ctime from after the look
    ((), 100.0, 0.2, False),                # no stamp stands for nothing
])
def test_stamps_are_trusted_once_every_ctime_is_older_than_the_margin(
        ctimes: tuple[float, ...], now: float, margin: float, trusted: bool) -> None:
    assert untouched.trusted(_stamps(*ctimes), now, margin) is trusted


def _old_enough(root: Path, margin_s: float) -> untouched.TreeStamps:
    """The tree's stamps once they can be trusted (waits until its newest ctime is
    `margin_s` old)."""
    deadline = time.monotonic() + 10
    while True:
        _, stamps = untouched.listing_with_stamps(str(root))
        if untouched.trusted(stamps, time.time(), margin_s):
            return stamps
        assert time.monotonic() < deadline, "the tree's ctimes never aged"
        time.sleep(margin_s / 4)  # waiting for the clock to pass the margin


def _entries(root: Path) -> list[Path]:
    return sorted(root.rglob("*"), key=str)


# Each takes the tree's root and an index into its entries (of any kind), and changes
# something below the root.
def _new_file(root: Path, pick: int) -> None:
    dirs = [root, *(p for p in _entries(root) if p.is_dir() and not p.is_symlink())]
    (dirs[pick % len(dirs)] / "planted").write_text("x")


def _new_dir(root: Path, pick: int) -> None:
    dirs = [root, *(p for p in _entries(root) if p.is_dir() and not p.is_symlink())]
    (dirs[pick % len(dirs)] / "planted.d").mkdir()


def _removed(root: Path, pick: int) -> None:
    entries = _entries(root)
    if not entries:
        return _new_file(root, pick)
    target = entries[pick % len(entries)]
    if target.is_dir():
        for inner in sorted(target.rglob("*"), key=lambda p: -len(str(p))):
            inner.rmdir() if inner.is_dir() else inner.unlink()
        target.rmdir()
    else:
        target.unlink()
    return None


def _renamed(root: Path, pick: int) -> None:
    entries = _entries(root)
    if not entries:
        return _new_dir(root, pick)
    target = entries[pick % len(entries)]
    target.rename(target.with_name(target.name + "~"))
    return None


def _chmod(root: Path, pick: int) -> None:
    entries = [root, *_entries(root)]
    target = entries[pick % len(entries)]
    os.chmod(target, 0o700 if (target.stat().st_mode & 0o777) != 0o700 else 0o755)


def _touched(root: Path, pick: int) -> None:
    # The times set back to what they were: only the ctime tells.
    entries = [root, *_entries(root)]
    target = entries[pick % len(entries)]
    info = target.stat()
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))


def _xattr(root: Path, pick: int) -> None:
    entries = [root, *_entries(root)]
    os.setxattr(entries[pick % len(entries)], "user.planted", b"1")


def _rewritten(root: Path, pick: int) -> None:
    files = [p for p in _entries(root) if p.is_file()]
    if not files:
        return _new_file(root, pick)
    target = files[pick % len(files)]
    target.write_bytes(target.read_bytes())  # same bytes, same size
    return None


CHANGES: list[Callable[[Path, int], None]] = [
    _new_file, _new_dir, _removed, _renamed, _chmod, _touched, _xattr, _rewritten]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=st.dictionaries(NAMES, TREES, max_size=4),
       change=st.sampled_from(CHANGES), pick=st.integers(0, 50))
def test_any_change_below_the_root_breaks_its_stamps(
        tmp_path_factory: pytest.TempPathFactory, tree: dict[str, object],
        change: Callable[[Path, int], None], pick: int) -> None:
    root = Path(os.path.realpath(tmp_path_factory.mktemp("upper")))
    _make(root, tree)
    stamps = _old_enough(root, 0.02)
    assert untouched.still(str(root), stamps)  # a look changes nothing
    change(root, pick)
    assert not untouched.still(str(root), stamps)


def test_the_listing_is_the_layer_listing_and_lists_parents_before_entries(
        tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_text("12345")
    (tmp_path / "l").symlink_to("/etc")
    listing, stamps = untouched.listing_with_stamps(str(tmp_path))
    assert [item[0] for item in listing] == ["a", "a/b", "a/b/f", "l"]
    assert listing[2][4] == 5 and listing[0][4] == 0
    order = [rel for rel, _ in stamps]
    assert order[0] == "" and order.index("a") < order.index("a/b") < order.index("a/b/f")
    assert untouched.listing_with_stamps(str(tmp_path / "missing")) == ([], ())


@pytest.mark.parametrize(("made", "skeleton", "fine"), [
    ([], [], True),
    (["d/"], ["d"], True),
    (["d/", "d/e/"], ["d", "d/e"], True),
    (["d/", "d/x"], ["d"], False),          # a file below a mount point's directory
    (["d"], ["d"], False),                  # a file where a directory is the skeleton's
    (["d/", "other/"], ["d"], False),
    (["d/", "d/e/"], ["d"], False),
])
def test_only_the_skeletons_directories_may_be_there(
        tmp_path: Path, made: list[str], skeleton: list[str], fine: bool) -> None:
    for rel in made:
        if rel.endswith("/"):
            (tmp_path / rel).mkdir(parents=True)
        else:
            (tmp_path / rel).write_text("x")
    ok, stamps = untouched.only_skeleton(str(tmp_path), skeleton)
    assert ok is fine
    if fine:
        assert sorted(rel for rel, _ in stamps) == sorted(["", *skeleton])
    assert untouched.only_skeleton(str(tmp_path / "missing"), skeleton) == (False, ())


def _counted_look(root: Path) -> tuple[Callable[[], tuple[bool, untouched.TreeStamps]],
                                        list[int]]:
    """A full look at `root` (an empty directory must be), and the list each look adds
    to."""
    calls: list[int] = []

    def look() -> tuple[bool, untouched.TreeStamps]:
        calls.append(1)
        return untouched.only_skeleton(str(root), ())

    return look, calls


def test_kept_stamps_spare_the_look_until_they_break(tmp_path: Path) -> None:
    looks = untouched.Looks()
    look, calls = _counted_look(tmp_path)
    later = time.time() + 10  # as if the look came well after the tree's last change
    assert looks.unchanged("w1", str(tmp_path), look, now=lambda: later)
    assert looks.kept("w1") == [str(tmp_path)]
    assert looks.unchanged("w1", str(tmp_path), look) and len(calls) == 1
    (tmp_path / "planted").write_text("x")
    assert not looks.unchanged("w1", str(tmp_path), look) and len(calls) == 2
    assert looks.kept("w1") == []  # a look that found it changed keeps nothing


def test_young_stamps_are_not_kept(tmp_path: Path) -> None:
    looks = untouched.Looks()
    look, calls = _counted_look(tmp_path)
    (tmp_path / "d").mkdir()
    os.rmdir(tmp_path / "d")  # its parent's ctime is now
    assert looks.unchanged("w1", str(tmp_path), look)
    assert looks.kept("w1") == []
    assert looks.unchanged("w1", str(tmp_path), look) and len(calls) == 2


def test_stamps_are_held_for_so_many_trees_and_forgotten_per_workspace(
        tmp_path: Path) -> None:
    looks = untouched.Looks(held=2)
    later = time.time() + 10
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        look = functools.partial(untouched.only_skeleton, str(tmp_path / name), ())
        assert looks.unchanged(f"w{name}", str(tmp_path / name), look, now=lambda: later)
    assert looks.kept("wa") == [] and looks.kept("wc") == [str(tmp_path / "c")]
    looks.forget("wc")
    assert looks.kept("wc") == [] and looks.kept("wb") == [str(tmp_path / "b")]

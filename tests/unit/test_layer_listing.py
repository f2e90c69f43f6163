"""A throwaway workspace's upper layer, listed after every call to tell whether the call
changed it: the listing names each entry by its path below the layer, as relpath would."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.worker.engine.isolate import kernel
from bashfleet.worker.engine.workspaces import disk


def _by_relpath(upper: Path) -> list[list[object]]:
    """The listing as it was first written (relpath of every entry), the reference."""
    found: list[list[object]] = []
    for folder, dirs, files in os.walk(upper):
        for name in dirs + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            found.append([os.path.relpath(path, upper), info.st_mode, info.st_uid, info.st_gid,
                          0 if stat.S_ISDIR(info.st_mode) else info.st_size])
    return sorted(found, key=lambda item: str(item[0]))


NAMES = st.text(alphabet="ab.-_ é", min_size=1, max_size=4).filter(
    lambda name: name not in {".", ".."})
TREES = st.recursive(st.binary(max_size=8), lambda inner: st.dictionaries(NAMES, inner,
                                                                           max_size=4),
                     max_leaves=12)


def _make(root: Path, tree: object) -> None:
    assert isinstance(tree, dict)
    for name, inner in tree.items():
        if isinstance(inner, dict):
            (root / name).mkdir()
            _make(root / name, inner)
        else:
            (root / name).write_bytes(inner)


@settings(max_examples=60, deadline=None)
@given(tree=st.dictionaries(NAMES, TREES, max_size=5))
def test_the_listing_is_what_relpath_gives(tmp_path_factory: pytest.TempPathFactory,
                                           tree: dict[str, object]) -> None:
    root = Path(os.path.realpath(tmp_path_factory.mktemp("upper")))
    _make(root, tree)
    (root / "link").symlink_to("/etc")  # listed as a link, never followed
    expected = _by_relpath(root)
    assert disk.layer_listing(root) == expected
    assert disk.layer_listing(Path(f"{root}/")) == expected
    assert disk.layer_listing(root / "missing") == []


def test_a_relative_layer_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "upper" / "d").mkdir(parents=True)
    (tmp_path / "upper" / "d" / "f").write_text("x")
    monkeypatch.chdir(tmp_path)
    assert [item[0] for item in disk.layer_listing(Path("upper"))] == ["d", "d/f"]
    assert disk.layer_listing(Path("upper")) == _by_relpath(Path("upper"))


@pytest.mark.parametrize(("points", "uppers", "covered"), [
    ([], ["root"], set()),
    (["/"], ["root"], set()),                              # `/` is the layer's own
    (["/", "/usr", "/proc/sys"], ["root"], {"root/usr", "root/proc/sys"}),
    (["/srv", "/srv/ws/w1"], ["root", "top.srv"], {"root/srv", "root/srv/ws/w1",
                                                    "top.srv/ws/w1"}),
    (["/srv/ws/w1"], ["root"], {"root/srv/ws/w1"}),         # no overlay of /srv's own
    (["/a b/c"], ["root", "top.a b"], {"root/a b/c", "top.a b/c"}),
    (["/usr/"], ["root"], {"root/usr"}),
    (["relative", "/usr/../etc"], ["root"], {"root/etc"}),  # as the kernel resolves it
])
def test_the_mounts_of_a_view_cover_their_paths_in_its_layers(
        points: list[str], uppers: list[str], covered: set[str]) -> None:
    assert disk.covered_by_mounts(points, uppers) == covered


def test_a_listing_leaves_out_what_is_covered_and_what_it_holds(tmp_path: Path) -> None:
    for path in ("root/usr/local", "root/var", "top.srv/ws"):
        (tmp_path / path).mkdir(parents=True)
    (tmp_path / "root" / "usr" / "local" / "f").write_text("x")
    covered = frozenset({"root/usr", "top.srv/ws"})
    names = [item[0] for item in disk.layer_listing(tmp_path, covered)]
    assert names == ["root", "root/var", "top.srv"]
    assert len(disk.layer_listing(tmp_path)) == 7


def test_a_views_mount_points_are_read_from_its_mountinfo() -> None:
    text = (b"22 1 0:21 / / rw - overlay overlay rw\n"
            b"23 22 8:1 /usr /usr ro,nosuid - ext4 /dev/sda1 ro\n"
            b"24 22 8:1 /srv/a\\040b /srv/a\\040b rw - ext4 /dev/sda1 rw\n"
            b"\n")
    assert kernel.mount_points(text) == ["/", "/usr", "/srv/a b"]

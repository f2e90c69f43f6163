"""A throwaway workspace's upper layer, listed after every call to tell whether the call
changed it: the listing names each entry by its path below the layer, as relpath would."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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

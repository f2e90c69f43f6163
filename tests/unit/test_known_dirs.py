"""The registry of state directories every workspace's view hides: read whole once, then
each look is a listing and a stat of the directories (`visibility._read_known`); those a
view cannot show are left out of its plan (`visibility.could_show`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bashfleet.worker.engine.layout import Entry, ViewSpec, plan_view
from bashfleet.worker.engine.workspaces import visibility


@pytest.fixture(name="registry")
def _registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "known"
    folder.mkdir()
    monkeypatch.setattr(visibility, "_registry_dirs", lambda: [folder])
    monkeypatch.setattr(visibility, "_resolved", {})
    return folder


def test_registered_directories_are_found_by_their_real_path(registry: Path,
                                                            tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "link").symlink_to(state)
    (registry / "a").write_text(f"{tmp_path / 'link'}\n", encoding="utf-8")
    assert visibility._read_known() == (str(state.resolve()),)
    assert visibility._read_known() == (str(state.resolve()),)  # from what it resolved


def test_a_directory_gone_is_dropped_with_its_entry_though_it_was_resolved(
        registry: Path, tmp_path: Path) -> None:
    kept, gone = tmp_path / "kept", tmp_path / "gone"
    kept.mkdir()
    gone.mkdir()
    (registry / "k").write_text(str(kept), encoding="utf-8")
    (registry / "g").write_text(str(gone), encoding="utf-8")
    assert visibility._read_known() == tuple(sorted((str(kept), str(gone))))
    gone.rmdir()
    assert visibility._read_known() == (str(kept),)
    assert sorted(os.listdir(registry)) == ["k"]
    assert list(visibility._resolved) == [(str(registry / "k"), (registry / "k").stat().st_ino)]


def test_a_new_entry_is_read_when_it_appears(registry: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    (registry / "1").write_text(str(first), encoding="utf-8")
    assert visibility._read_known() == (str(first),)
    (registry / "2").write_text(str(second), encoding="utf-8")
    assert visibility._read_known() == (str(first), str(second))


def test_an_empty_entry_is_dropped(registry: Path) -> None:
    (registry / "e").write_text("\n", encoding="utf-8")
    assert visibility._read_known() == ()
    assert os.listdir(registry) == []


# ------------------------------------------------ which of them a view's plan may need

ENTRIES = (Entry("usr", "dir"), Entry("etc", "dir"), Entry("tmp", "dir"), Entry("var", "dir"),
           Entry("home", "dir"), Entry("srv", "dir"))
#: State directories as a developer's machine registers them: tests' temporary ones under
#: /tmp and /var/tmp, some holding a workspace's own paths, and a few elsewhere.
KNOWN = ("/tmp/t1/state", "/tmp/t2", "/tmp/ws/w1/inner-state", "/tmp/ws/w1", "/var/tmp/x",
         "/srv/state", "/srv/ws/w1/.state", "/home/runner/.local/state/bashfleet", "/dev/shm/s",
         "/proc/1", "/tmpfoo/state", "/var/tmpx")


@pytest.mark.parametrize("own", [
    {"workspace": "/srv/ws/w1", "out_dir": "/srv/ws/.out/w1", "home_view": "/home/runner"},
    {"workspace": "/tmp/ws/w1", "out_dir": "/tmp/ws/.out/w1", "home_view": "/root",
     "mounts": {"/tmp/t2/m": "/tmp/ws/w1/m"}},
    {"workspace": "/srv/ws/w1", "out_dir": "/srv/ws/.out/w1", "home_view": "/root",
     "writable": ("/var/tmp/x/share", "/tmp/t1")},
], ids=["outside-tmp", "under-tmp-with-a-mount", "writable-roots-under-tmp"])
def test_the_known_dirs_a_view_cannot_show_change_nothing_in_its_plan(own: dict[str, Any]
                                                                      ) -> None:
    fields: dict[str, Any] = dict(
        root="/state/w1/root", tmp="/state/w1/tmp", var_tmp="/state/w1/vartmp",
        home="/state/w1/home", entries=ENTRIES, layers="/state/w1/layer", **own)
    writable = tuple(fields.get("writable", ()))
    kept = visibility.could_show(KNOWN, (
        fields["home_view"], fields["workspace"], fields["out_dir"],
        *fields.get("mounts", {}), *writable))
    assert len(kept) < len(KNOWN)  # some were dropped: the comparison below is not vacuous
    every = plan_view(ViewSpec(hidden_dirs=("/state", *KNOWN), **fields))
    fewer = plan_view(ViewSpec(hidden_dirs=("/state", *kept), **fields))
    assert fewer == every


@pytest.mark.parametrize(("path", "own", "shown"), [
    ("/srv/state", (), True),
    ("/tmp/t1/state", (), False),
    ("/tmp/t1/state", ("/tmp/t1",), True),
    ("/tmp/t1", ("/tmp/t1",), True),  # its own path itself: layout decides
    ("/tmp/t1", ("/tmp/t1/share",), True),  # a writable root in it is hidden with it
    ("/var/tmp/x", (), False),
    ("/tmpfoo/state", (), True),
    ("/dev/shm/s", ("/srv/ws",), False),
    ("/tmp", ("/tmp/ws/w1",), True),
    ("/tmp", ("/srv/ws",), False),
    ("/tmp/ws/w10", ("/tmp/ws/w1",), False),  # a prefix of its name is not its parent
    ("/tmp/ws/w1/deep/er", ("/tmp/ws/w1/",), True),
])
def test_could_show(path: str, own: tuple[str, ...], shown: bool) -> None:
    assert visibility.could_show([path], own) == ([path] if shown else [])

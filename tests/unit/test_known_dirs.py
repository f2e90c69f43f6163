"""The registry of state directories every workspace's view hides: read whole once, then
each look is a listing and a stat of the directories (`visibility._read_known`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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

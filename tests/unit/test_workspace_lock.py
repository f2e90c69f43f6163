"""The lock a change of a whole workspace holds (`store.changing`): the reaper skips a
workspace held, a deletion's unlinking of the lock file never lets two hold it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from bashfleet.worker.engine.workspaces import store
from bashfleet.worker.settings import Settings

WS = "w0123456789abcde"


@pytest.fixture(name="settings")
def _settings_fixture(tmp_path: Path) -> Settings:
    made = Settings(state_dir=tmp_path)
    made.workspaces_dir.mkdir()
    return made


def test_a_held_workspace_is_not_held_again_without_waiting(settings: Settings) -> None:
    with store.changing(settings, WS) as first:
        assert first
        with store.changing(settings, WS, wait=False) as second:
            assert not second
    with store.changing(settings, WS, wait=False) as again:
        assert again


def test_a_waiter_whose_lock_file_was_unlinked_takes_the_new_one(settings: Settings) -> None:
    """A deletion unlinks the lock file while it holds it: a waiter that opened the old
    file must not hold that one while a newcomer holds the new one."""
    holding = threading.Event()
    order: list[str] = []

    def waiter() -> None:
        holding.wait()
        with store.changing(settings, WS) as held:
            assert held
            order.append("waiter")
            assert store.lock_path(settings, WS).exists()

    thread = threading.Thread(target=waiter)
    thread.start()
    with store.changing(settings, WS):
        holding.set()
        thread.join(timeout=0.2)
        assert thread.is_alive()  # it waits for this holder
        store.lock_path(settings, WS).unlink()
    thread.join(timeout=30)
    assert order == ["waiter"]
    # The file the waiter took is the one now at the path: a newcomer waits for no one.
    with store.changing(settings, WS, wait=False) as newcomer:
        assert newcomer


@pytest.mark.parametrize("bad", ["", "../w0123456789abcd", "w0123456789abcdE", "x" * 16])
def test_only_a_workspace_id_names_a_lock(settings: Settings, bad: str) -> None:
    with pytest.raises(store.WorkspaceError), store.changing(settings, bad):
        pass
    assert list(settings.workspaces_dir.iterdir()) == []

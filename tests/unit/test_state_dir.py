"""A state directory another user made is never trusted.

`/tmp/bashfleet-<uid>` was used even when another user had created it; that user then
swapped fleet.json and received root's next command. The default is now per user
(`$XDG_STATE_HOME/bashfleet`), and a directory (or fleet.json) that is not this user's
alone is refused, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from privilege import needs_root

from bashfleet.client import local
from bashfleet.client._core.settings import UnsafeStateError
from bashfleet.client.errors import FleetUnavailable
from bashfleet.client.fleet import resolve_url
from bashfleet.worker.settings import Settings, get_settings
from bashfleet.worker.state_dir import check_state_dir

NOBODY = 65534


def test_the_default_state_dir_is_the_users_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("BASHFLEET_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert Settings().state_dir == tmp_path / "xdg" / "bashfleet"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Settings().state_dir == tmp_path / "home" / ".local" / "state" / "bashfleet"


def test_a_fresh_state_dir_is_made_private(tmp_path: Path) -> None:
    made = check_state_dir(tmp_path / "fresh" / "state")
    assert made.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("problem", [
    pytest.param("another owner", marks=needs_root("chown to another user")),
    "writable by others", "a symlink"])
def test_an_untrusted_state_dir_is_refused(tmp_path: Path, problem: str) -> None:
    state = tmp_path / "state"
    if problem == "a symlink":
        (tmp_path / "elsewhere").mkdir()
        state.symlink_to(tmp_path / "elsewhere")
    else:
        state.mkdir(mode=0o700)
    if problem == "another owner":
        os.chown(state, NOBODY, NOBODY)
    elif problem == "writable by others":
        state.chmod(0o777)
    with pytest.raises(ValueError, match=r"refusing|not a directory"):
        check_state_dir(state)


@pytest.fixture
def fresh_settings() -> Iterator[None]:
    """`get_settings` read again (it is cached per process) around a test that sets
    BASHFLEET_* variables: the client finds the local fleet through it."""
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@needs_root("chown to another user")
def test_a_planted_fleet_json_is_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_settings: None
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("BASHFLEET_STATE_DIR", str(state))
    settings = Settings()
    planted = local.FleetState(redis_url="redis://attacker.example:6379/0", redis_owned=False)
    local.save_state(planted, settings)
    assert local.load_state(settings) == planted  # ours: read
    path = local.state_path(settings)
    os.chown(path, NOBODY, NOBODY)  # another user's file
    with pytest.raises(UnsafeStateError, match="not a file of this user's alone"):
        local.load_state(settings)
    path.unlink()
    (tmp_path / "theirs.json").write_text(planted.model_dump_json())
    path.symlink_to(tmp_path / "theirs.json")
    with pytest.raises(FleetUnavailable, match="not trusted"):
        resolve_url()
    os.chown(state, NOBODY, NOBODY)
    with pytest.raises(FleetUnavailable, match="belongs to uid 65534"):
        resolve_url()

"""A client's settings (`bashfleet.client._core.settings`) read the variables they share
with the worker's settings as those do: the same URL, keys, owner and state directory
from the same environment, files included; and a bad value is one line naming it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bashfleet.client._core.settings import ClientSettings, SettingsError, client_settings
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.owner_keys import OwnerKey

FLEET_KEY = "fleet-key-0123456789abcdef"
OWNER_KEY = OwnerKey.issue(FLEET_KEY, "team-a").text


@pytest.fixture
def bare_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No BASHFLEET_* of the suite's; HOME and XDG_STATE_HOME of the test's own."""
    for name in [n for n in os.environ if n.upper().startswith("BASHFLEET_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    return tmp_path


def _secret(value: object) -> str | None:
    return None if value is None else str(value.get_secret_value())  # type: ignore[attr-defined]


@pytest.mark.parametrize("env", [
    {},
    {"BASHFLEET_REDIS_URL": "redis://127.0.0.1:7000/0", "BASHFLEET_SIGNING_KEY": FLEET_KEY,
     "BASHFLEET_ADMIN_KEY": "admin", "BASHFLEET_OWNER": "user:alice"},
    {"bashfleet_redis_url": "redis://127.0.0.1:7001/0", "bashfleet_owner": "team-b"},
    {"BASHFLEET_REDIS_URL": "", "BASHFLEET_SIGNING_KEY": ""},
    {"BASHFLEET_SIGNING_KEY": OWNER_KEY},
    {"BASHFLEET_OWNER_KEY": OWNER_KEY, "BASHFLEET_SIGNING_KEY": FLEET_KEY},
    {"BASHFLEET_STATE_DIR": "/srv/state", "XDG_STATE_HOME": "/srv/xdg"},
    {"XDG_STATE_HOME": "/srv/xdg"},
    {"BASHFLEET_SIGNING_KEY_FILE": "{dir}/key", "BASHFLEET_REDIS_URL_FILE": "{dir}/url",
     "BASHFLEET_ADMIN_KEY_FILE": "{dir}/admin", "BASHFLEET_OWNER_KEY_FILE": "{dir}/owner"},
    {"BASHFLEET_SIGNING_KEY": "given", "BASHFLEET_SIGNING_KEY_FILE": "{dir}/key"},
])
def test_a_client_reads_what_the_worker_settings_read(
    bare_environment: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
) -> None:
    files = bare_environment
    for name, text in (("key", FLEET_KEY), ("url", "redis://127.0.0.1:7002/0"),
                       ("admin", "admin-from-file"), ("owner", OWNER_KEY)):
        (files / name).write_text(text + "\n")
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(dir=files))
    ours, theirs = client_settings(), Settings()
    assert ours.redis_url == theirs.redis_url_value()
    assert ours.signing_key == _secret(theirs.signing_key)
    assert ours.admin_key == _secret(theirs.admin_key)
    assert ours.owner_key == _secret(theirs.owner_key)
    assert ours.owner == theirs.owner
    assert ours.state_dir == theirs.state_dir
    assert ours.client_owner_key() == theirs.client_owner_key()
    assert ours.owner_name() == theirs.owner_name()


@pytest.mark.parametrize(("env", "line"), [
    ({"BASHFLEET_OWNER": "bad owner!"},
     "BASHFLEET_OWNER='bad owner!' is not allowed: 1 to 64 letters, digits or _ . : @ -"),
    ({"BASHFLEET_SIGNING_KEY_FILE": "/nonexistent/key"},
     "BASHFLEET_SIGNING_KEY_FILE: cannot read signing_key from /nonexistent/key: No such "
     "file or directory"),
])
def test_a_bad_value_is_one_line_naming_it(env: dict[str, str], line: str) -> None:
    with pytest.raises(SettingsError) as caught:
        ClientSettings.read(env)
    assert str(caught.value).startswith(line) and "\n" not in str(caught.value)


def test_the_settings_are_read_again_only_when_their_variables_change(
    bare_environment: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = client_settings()
    assert client_settings() is first  # once per process...
    monkeypatch.setenv("BASHFLEET_OWNER", "team-c")
    again = client_settings()  # ...while the environment holds
    assert again is not first and again.owner == "team-c"
    monkeypatch.setenv("UNRELATED", "1")
    assert client_settings() is again

"""What a client reads from its environment: where the fleet is, the keys it signs with,
whose calls it makes, and where `bashfleet up` records a local fleet.

The worker's settings (`bashfleet.worker.settings.Settings`: sixty knobs, pydantic-settings
and the engine's defaults behind them) are not a client's: a client reads its six
`BASHFLEET_*` variables here, as the worker's settings read the same ones (a unit test
holds the two readings together), once per process while they hold (`client_settings`).
Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from bashfleet.worker.state_dir import check_state_dir, default_state_dir
from bashfleet.worker.wire.owner_keys import OwnerKey, is_owner_key

PREFIX = "BASHFLEET_"
#: What BASHFLEET_OWNER may be (the worker settings' `owner`).
OWNER_SETTING_PATTERN = r"^[A-Za-z0-9_.:@-]{1,64}$"
#: The settings a file may hold instead (`BASHFLEET_<NAME>_FILE`: a mounted secret).
FROM_FILES = ("redis_url", "signing_key", "admin_key", "owner_key")
#: Variables besides BASHFLEET_* that the settings depend on (the default state directory).
ALSO_READ = ("XDG_STATE_HOME", "HOME")


class SettingsError(ValueError):
    """A BASHFLEET_* variable a client cannot use: the message is one line that names it."""


class UnsafeStateError(ValueError):
    """The local fleet's state is not this user's alone: it is not read."""


class ClientSettings(NamedTuple):
    """A client's configuration (`read` from the environment). A named tuple, not a
    dataclass: `dataclasses` loads `inspect`, which a CLI's plain call cannot afford."""

    state_dir: Path
    """Where `bashfleet up` records a local fleet (BASHFLEET_STATE_DIR)."""
    redis_url: str | None = None
    """The fleet's Redis URL (BASHFLEET_REDIS_URL); None: the local fleet's, if one runs."""
    signing_key: str | None = None
    """The fleet key, or an owner key (BASHFLEET_SIGNING_KEY); None: the local fleet's."""
    admin_key: str | None = None
    """The admin key (BASHFLEET_ADMIN_KEY); None: the local fleet's."""
    owner_key: str | None = None
    """An owner key (BASHFLEET_OWNER_KEY): the client acts as that owner only."""
    owner: str | None = None
    """Whose calls these are (BASHFLEET_OWNER); None: the owner key's, else the user's."""

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> ClientSettings:
        """The settings `environ` gives (variable names in any case, as the worker's
        settings take them); SettingsError for one a client cannot use."""
        values = {name[len(PREFIX):].lower(): value for name, value in environ.items()
                  if name.upper().startswith(PREFIX)}
        for name in FROM_FILES:
            path = values.get(f"{name}_file")
            if values.get(name) is None and path:
                values[name] = _read_secret_file(Path(path), name)
        owner = values.get("owner")
        if owner is not None and not re.fullmatch(OWNER_SETTING_PATTERN, owner):
            raise SettingsError(
                f"BASHFLEET_OWNER={owner!r} is not allowed: 1 to 64 letters, digits or "
                f"_ . : @ -, e.g. user:alice or team-ci (the pattern {OWNER_SETTING_PATTERN})")
        state_dir = values.get("state_dir")
        return cls(
            redis_url=values.get("redis_url") or None, signing_key=values.get("signing_key"),
            admin_key=values.get("admin_key"), owner_key=values.get("owner_key"), owner=owner,
            state_dir=Path(state_dir) if state_dir is not None else default_state_dir(),
        )

    def client_owner_key(self) -> OwnerKey | None:
        """The owner key: BASHFLEET_OWNER_KEY, else an owner key given as
        BASHFLEET_SIGNING_KEY; None for a fleet key (or none). ValueError for a malformed
        one."""
        if self.owner_key:
            return OwnerKey.parse(self.owner_key)
        if self.signing_key and is_owner_key(self.signing_key):
            return OwnerKey.parse(self.signing_key)
        return None

    def owner_name(self) -> str:
        """Who this client's calls belong to without a session: `owner`, else the owner
        its owner key names, else the user."""
        if self.owner:
            return self.owner
        try:
            key = self.client_owner_key()
        except ValueError:
            key = None
        return key.owner if key is not None else f"user:{_login_name()}"


def _read_secret_file(path: Path, name: str) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SettingsError(f"BASHFLEET_{name.upper()}_FILE: cannot read {name} from {path}: "
                            f"{exc.strerror}") from None


def _login_name() -> str:
    import pwd  # noqa: PLC0415 - POSIX only, and only for the default owner

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


_read: tuple[tuple[tuple[str, str], ...], ClientSettings] | None = None


def client_settings() -> ClientSettings:
    """This process's settings: read from the environment once, and again only when a
    variable they are read from changed since (a test, a program that sets
    BASHFLEET_OWNER before it makes its next client)."""
    global _read  # noqa: PLW0603 - one reading per process, by design
    read_from = tuple(sorted((name, value) for name, value in os.environ.items()
                             if name.upper().startswith(PREFIX) or name in ALSO_READ))
    if _read is None or _read[0] != read_from:
        _read = (read_from, ClientSettings.read(os.environ))
    return _read[1]


# --------------------------------------------------------------------- local fleet


def local_fleet_path(settings: ClientSettings) -> Path:
    """Where `bashfleet up` records the local fleet (fleet.json: its Redis URL, keys)."""
    return settings.state_dir / "fleet" / "fleet.json"


def local_fleet(settings: ClientSettings) -> dict[str, Any] | None:
    """The local fleet's record as `bashfleet up` wrote it, or None (none recorded, or
    not one that reads).

    UnsafeStateError when the state directory or fleet.json is not this user's alone:
    whoever could write it would choose the Redis (and the key) our calls go to.
    """
    path = local_fleet_path(settings)
    try:
        check_state_dir(settings.state_dir)
        info = path.lstat()
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise UnsafeStateError(str(exc)) from None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or (
        info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise UnsafeStateError(
            f"{path} is not a file of this user's alone (a symlink, another owner, or "
            "writable by others): refusing to read the fleet's address from it"
        )
    try:
        record = json.loads(path.read_text("utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def local_text(settings: ClientSettings, name: str, *, url: str | None = None) -> str | None:
    """A text field of the local fleet's record (`redis_url`, `signing_key`,
    `admin_key`); with `url`, only when that fleet's Redis is at `url`."""
    record = local_fleet(settings)
    if record is None or (url is not None and record.get("redis_url") != url):
        return None
    value = record.get(name)
    return value if isinstance(value, str) else None

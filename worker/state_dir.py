"""The state directory: where it is when none is configured, and the check that it is
this user's alone. A worker keeps its spill, job and workspace files there; `bashfleet up`
records the local fleet there, where a client finds it. Standard library only: a
client reads it without the worker's settings.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def default_state_dir() -> Path:
    """The state directory when none is configured (also where `bashfleet up` keeps a
    local fleet's fleet.json, which sandboxed calls must never read). Per user:
    `$XDG_STATE_HOME/bashfleet`, else `~/.local/state/bashfleet`.

    Never a shared directory such as /tmp: another user who creates `/tmp/bashfleet-<uid>`
    first would own what the fleet reads (a planted fleet.json sent root's next command
    to that user's Redis). `check_state_dir` refuses a directory the user does not own.
    """
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(base) / "bashfleet"


def check_state_dir(path: Path) -> Path:
    """Create the state directory (0700) or check it: owned by this user and writable
    by nobody else. ValueError, saying why, for one that is not safe to trust."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = path.lstat()
    except OSError as exc:
        raise ValueError(f"state directory {path} is unusable: {exc.strerror}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"state directory {path} is not a directory (a symlink?)")
    if info.st_uid != os.geteuid():
        raise ValueError(
            f"state directory {path} belongs to uid {info.st_uid}, not to this user "
            f"({os.geteuid()}): refusing to use it (set BASHFLEET_STATE_DIR)"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(
            f"state directory {path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}):"
            " refusing to use it (chmod go-w, or set BASHFLEET_STATE_DIR)"
        )
    return path

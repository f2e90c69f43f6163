"""What runs inside a workspace's namespaces, or beside them as a process of its own: the
zygote and its keepers, the mount view, the keeper's messages, the seccomp filter, job
supervisors and interactive relays, and the network helpers (the `allow` guard, the
nftables loader, the rootless tether).

Standard library only, every module here: these run as `python -I -S` (fast to start, no
site-packages, immune to the caller's PYTHON* variables), so nothing outside this package
and the standard library can be imported. A test holds every module to it. Each process
is started the one way `command` builds, through `bootstrap.py`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

#: The one script every process of this package is started through (see its docstring).
BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap.py")

#: The modules that run as a process of their own (each has a `__main__` block).
ENTRIES = ("launcher", "job_supervisor", "netguard", "nft_helper", "usernet_tether")


def command(entry: str, *args: str) -> list[str]:
    """The command line that runs `entry` (one of ENTRIES) with `args`."""
    if entry not in ENTRIES:
        raise ValueError(f"{entry!r} is not a process of its own: one of {ENTRIES}")
    return [sys.executable, "-I", "-S", BOOTSTRAP, entry, *args]


def runs(cmdline: Sequence[str] | bytes, entry: str) -> bool:
    """Whether a process's command line (`/proc/PID/cmdline`'s bytes, or its arguments)
    is `entry` started by `command`."""
    args = ([part.decode("utf-8", "replace") for part in cmdline.split(b"\0")]
            if isinstance(cmdline, bytes) else list(cmdline))
    return any(arg.endswith(f"{os.sep}isolate{os.sep}bootstrap.py") and args[i + 1:i + 2] == [entry]
               for i, arg in enumerate(args))


#: argv[0] of a workspace's holder (`holder.c`), pid 1 of a workspace whose keeper sleeps.
HOLDER_NAME = "bashfleet-holder"
#: argv[0] of a call's first process (`spawn.c`, a binary of its own: `holder.spawner`).
SPAWN_NAME = "bashfleet-spawn"


def is_keeper(cmdline: bytes) -> bool:
    """Whether a process's command line (`/proc/PID/cmdline`) is a keeper's (a fork of
    the zygote, `launcher`) or a holder's."""
    return cmdline.split(b"\0", 1)[0] == HOLDER_NAME.encode() or runs(cmdline, "launcher")

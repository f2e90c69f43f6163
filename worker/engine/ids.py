"""Host ids for workspaces' user namespaces: each live workspace a range of its own.

A root worker maps each workspace's user namespace onto 65,536 host uids and gids that
no other live workspace on the machine uses: a slice of the subordinate ids the operator
gave the run user (`/etc/subuid` and `/etc/subgid`, written by `scripts/bootstrap.sh` and
the deploy files). Inside, a call is root (or the image's user); on the host it is an
id of its workspace alone, so one tenant's files, processes and kernel keyring are never
another's.

Slots are claimed with a lock on a file per slot in a directory every worker on the
machine shares (`LOCK_DIR`), whatever its state directory: two fleets on one machine
(a user's own `bashfleet up` beside a test's) never hand out the same range. The
keeper of the workspace holds the locked descriptor for as long as it lives, so a slot
is free again the moment its keeper is gone, however it ended (a kill, a crash, the
host's reboot): nothing to clean up, nothing to leak.

A host without subordinate ids for its run user (or a worker that is not root) cannot
give each workspace ids of its own: it is *single-tenant*, said in `bashfleet hosts`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

#: Ids per workspace: a container's usual 16 bits (uid 65534, nobody, included).
SLOT_SIZE = 65536
#: Shared by every worker on the machine: slots are machine-wide, not per fleet.
LOCK_DIR = Path("/run/bashfleet/ids")


@dataclass(frozen=True)
class Range:
    """Subordinate ids: `count` of them from `start`."""

    start: int
    count: int

    @property
    def slots(self) -> int:
        return self.count // SLOT_SIZE


@dataclass(frozen=True)
class HostIds:
    """The uids and gids a host's workspaces are given slices of."""

    uids: Range
    gids: Range

    @property
    def slots(self) -> int:
        return min(self.uids.slots, self.gids.slots)


def parse_subids(text: str, names: tuple[str, ...]) -> Range | None:
    """The largest range `/etc/subuid` (or subgid) text gives any of `names` (a user's
    name or uid as text); None when it gives none. Malformed lines are skipped, as
    shadow's tools skip them."""
    best: Range | None = None
    for line in text.splitlines():
        fields = line.strip().split(":")
        if len(fields) != 3 or fields[0] not in names:
            continue
        if not (fields[1].isdigit() and fields[2].isdigit()):
            continue
        found = Range(int(fields[1]), int(fields[2]))
        if found.count >= SLOT_SIZE and (best is None or found.count > best.count):
            best = found
    return best


def host_ids(user: str, *, subuid: str = "/etc/subuid",
             subgid: str = "/etc/subgid") -> HostIds | None:
    """What this host may give its workspaces (None: nothing; single-tenant). Only a
    root worker can write another process's id maps without `newuidmap`."""
    if os.geteuid() != 0:
        return None
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return None
    names = (user, str(uid))
    try:
        uids = parse_subids(Path(subuid).read_text("utf-8"), names)
        gids = parse_subids(Path(subgid).read_text("utf-8"), names)
    except OSError:
        return None
    if uids is None or gids is None:
        return None
    return HostIds(uids, gids)


@dataclass(frozen=True)
class Slot:
    """One workspace's slice: host uid and gid `uid`, `gid` are its root."""

    index: int
    uid: int
    gid: int
    fd: int
    """The locked slot file: the keeper holds it for its life."""

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def slot_ids(ids: HostIds, index: int) -> tuple[int, int]:
    """The first host uid and gid of slot `index`."""
    return ids.uids.start + index * SLOT_SIZE, ids.gids.start + index * SLOT_SIZE


def claim(ids: HostIds, *, first: int = 0, lock_dir: Path = LOCK_DIR) -> Slot:
    """A free slot, locked (OSError ENOSPC when every slot is taken). `first`: where to
    start looking (spreads the claims of many processes)."""
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    total = ids.slots
    for step in range(total):
        index = (first + step) % total
        fd = os.open(lock_dir / str(index), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
                     | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        uid, gid = slot_ids(ids, index)
        return Slot(index, uid, gid, fd)
    raise OSError(errno.ENOSPC, f"every one of this host's {total} workspace id ranges is "
                  "in use")

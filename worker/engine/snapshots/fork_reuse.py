"""A fork's snapshot used again by the next fork of a workspace that has not changed.

An orchestrator forks one prepared workspace again and again (sixteen forks an
episode, the next episode from the same state). Each fork takes a snapshot: a copy of
every file the workspace changed, ~20 ms for a few hundred files on this ext4 before
the first fork is made. When the workspace has not changed since its last fork, that
copy would hold what the last fork's snapshot holds: the next fork stands on that
snapshot instead, and pays a listing of the workspace (frozen) rather than a copy.

"Not changed" is told by the stamps of every entry of the workspace's own layers
(`snapshots.Stamp`: kind and mode, inode, owner, size, mtime and ctime), listed while
its processes are frozen, against the stamps the last fork's copy settled on (listed
frozen too). A ctime is the one time no process can set: a change after a look gets a
later one, unless the file system's clock gives the same ctime twice (a coarse clock's
tick). So a copy's stamp is trusted only when its ctime is at least `untouched.MARGIN_S`
older than the moment the copy started: a change after its thaw is then in a later
tick, with a later ctime. An entry changed just before the copy is remembered as
changed (`UNTRUSTED_CTIME`): the next fork copies it again (`fork_delta`), whatever its
stamp says then.

A hidden snapshot that nothing stands on is collected `HIDDEN_GRACE_S` after it was
made. One is used again only within `REUSE_WITHIN_S` of its making (half the grace),
and renewed as it is (made again, as far as its lifetime goes): the forks that stand on
it get the whole grace to be made, as those of a fresh snapshot do, and no collection
of the host can have chosen it meanwhile.

The memory is the process's (the control consumer's, where forks are taken), at most
`REMEMBERED` workspaces; a restart forgets it, and the next fork copies.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from bashfleet.worker.engine.workspaces import untouched

#: Seconds a hidden snapshot stays collectable-proof (`snapshots.HIDDEN_GRACE_S`).
HIDDEN_GRACE_S = 120.0
#: Seconds after its making (or last renewal) within which a fork's snapshot is used
#: again: half the grace, so that the host's collection is never about to take it.
REUSE_WITHIN_S = HIDDEN_GRACE_S / 2
#: Workspaces whose last fork a process remembers.
REMEMBERED = 1024

#: Layer name -> (relative path -> (stamp, blocks)): what `snapshots._listing` gives for
#: each of a workspace's own layers.
Listings = Mapping[str, Mapping[str, tuple[tuple[int, ...], int]]]

#: Where a stamp (`snapshots.Stamp`) keeps the entry's ctime, in ns.
CTIME_AT = 6
#: The ctime a remembered stamp is given when its own was too young to be trusted: no
#: entry has it, so the entry counts as changed at the next fork.
UNTRUSTED_CTIME = -1


@dataclass(frozen=True)
class LastFork:
    """A workspace's last fork: its snapshot, the first host id of the workspace's slot
    then (the snapshot's owners were shifted by it), and what the copy settled on."""

    snap_id: str
    first_id: int
    listings: Listings


def remembered(listings: Listings, copy_started: float,
               margin_s: float = untouched.MARGIN_S) -> Listings:
    """`listings` as the next fork compares against them: each entry whose ctime is not
    `margin_s` older than `copy_started` stamped `UNTRUSTED_CTIME` (changed, whatever
    it shows next)."""
    limit = (copy_started - margin_s) * 1e9
    return {name: {rel: (stamp if stamp[CTIME_AT] < limit else
                         (*stamp[:CTIME_AT], UNTRUSTED_CTIME, *stamp[CTIME_AT + 1:]), blocks)
                   for rel, (stamp, blocks) in listing.items()}
            for name, listing in listings.items()}


def young(created_at: float, now: float) -> bool:
    """Whether a snapshot made (or renewed) at `created_at` may be used again at `now`."""
    return 0 <= now - created_at < REUSE_WITHIN_S


class ForkMemory:
    """The last fork of each workspace, for the next fork of it (thread-safe)."""

    def __init__(self, size: int = REMEMBERED) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._last: OrderedDict[str, LastFork] = OrderedDict()

    def remember(self, ws_id: str, last: LastFork, copy_started: float) -> None:
        """Keep `last` as `ws_id`'s last fork, the stamps too young to be trusted kept
        as changed (`remembered`)."""
        kept = LastFork(last.snap_id, last.first_id, remembered(last.listings, copy_started))
        with self._lock:
            self._last[ws_id] = kept
            self._last.move_to_end(ws_id)
            while len(self._last) > self.size:
                self._last.popitem(last=False)

    def last(self, ws_id: str) -> LastFork | None:
        """What is kept of `ws_id`'s last fork, if anything."""
        with self._lock:
            return self._last.get(ws_id)

    def forget(self, ws_id: str) -> None:
        with self._lock:
            self._last.pop(ws_id, None)

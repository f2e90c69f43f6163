"""Whether the directories a throwaway workspace's call could write are as its view left
them, told by the stamps of a look that found them so, when those stamps can be trusted.

After every throwaway call the worker checks that the call left nothing behind (the next
call may be another owner's): its directory, /tmp, /var/tmp, HOME and output directory
hold only their mount points, and its upper layer holds only what its view's build put
there. Listing all of that reads ~20 directories and looks at every entry: 0.3-0.4 ms of
the exec consumer's CPU on every call.

A look that found a tree as it must be keeps the stamps of every entry it saw, the
tree's root first and each directory before what it holds. Any change below the root
changes the stamp of some entry it keeps: making, removing or renaming an entry changes
its directory's modification and change times (ctime), and a new entry deeper down
needs a directory on its way made (which changes that directory's parent) or changed;
a change of owner, mode, extended attribute or times changes the entry's own ctime,
which no process can set (utimensat sets it to now). So while every kept stamp is what
`os.lstat` says again, the tree is as the look found it, and the check is one lstat an
entry instead of a listing.

Unless the clock gives the same ctime twice. A file system stamps ctime from a clock
that may advance in ticks (a few ms; kernels without multigrain timestamps): a change in
the same tick as the change a stamp recorded can leave the stamp as it was. Stamps are
therefore trusted only when every ctime they hold is at least `MARGIN_S` older than the
look that took them: a later change is then in a later tick, with a later ctime. A look
that finds younger ones keeps nothing, and the next check looks in full again.

Stamps are kept per (workspace, directory) in this process, at most `HELD` of them;
a workspace's go when it is deleted or its check fails.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator

#: What tells that an entry changed: device, inode, kind and mode, owner, size and both
#: times (the ctime the one a process cannot choose).
Stamp = tuple[int, int, int, int, int, int, int, int]
#: A tree's stamps: (path below its root, stamp), the root ('') first, each directory
#: before its entries.
TreeStamps = tuple[tuple[str, Stamp], ...]

#: Seconds a ctime must be older than the look that saw it for its stamp to be trusted
#: (a coarse clock's tick is 1-10 ms; this leaves room for a slow look).
MARGIN_S = 0.2
#: Trees whose stamps one process keeps (a consumer's throwaways hold ~6 each).
HELD = 4096


def stamp_of(info: os.stat_result) -> Stamp:
    """An entry's stamp from its lstat."""
    return (info.st_dev, info.st_ino, info.st_mode, info.st_uid, info.st_gid,
            info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def trusted(stamps: TreeStamps, now: float, margin_s: float = MARGIN_S) -> bool:
    """Whether `stamps`, taken at `now` (time.time()), may stand for their tree: every
    ctime in them is at least `margin_s` older."""
    newest = max((entry[1][7] for entry in stamps), default=0)
    return bool(stamps) and newest <= (now - margin_s) * 1e9


def still(root: str, stamps: TreeStamps) -> bool:
    """Every entry `stamps` keep is there under `root` with the same stamp. Parents are
    looked at before their entries, so by the time a path is looked up through a
    directory, that directory is known to be the one the look saw (not a link put in
    its place)."""
    for rel, kept in stamps:
        try:
            info = os.lstat(f"{root}/{rel}" if rel else root)
        except OSError:
            return False
        if stamp_of(info) != kept:
            return False
    return True


class Looks:
    """The trusted stamps of the trees this process checked, by (workspace id, root)."""

    def __init__(self, held: int = HELD) -> None:
        self._held = held
        self._lock = threading.Lock()
        self._stamps: dict[tuple[str, str], TreeStamps] = {}

    def unchanged(self, ws_id: str, root: str,
                  look: Callable[[], tuple[bool, TreeStamps]], *,
                  now: Callable[[], float] = time.time) -> bool:
        """Whether the tree at `root` is as it must be: by its trusted stamps when they
        still hold, else by `look()` (a full look: is it as it must be, and the stamps
        of what it saw), whose stamps are kept when it found the tree so and they can be
        trusted."""
        key = (ws_id, root)
        with self._lock:
            kept = self._stamps.get(key)
        if kept is not None and still(root, kept):
            return True
        started = now()
        fine, stamps = look()
        with self._lock:
            if fine and trusted(stamps, started):
                if key not in self._stamps and len(self._stamps) >= self._held:
                    self._stamps.pop(next(iter(self._stamps)))  # the oldest kept
                self._stamps[key] = stamps
            else:
                self._stamps.pop(key, None)
        return fine

    def kept(self, ws_id: str) -> list[str]:
        """The roots of a workspace whose stamps are kept (trusted)."""
        with self._lock:
            return [root for (ws, root) in self._stamps if ws == ws_id]

    def forget(self, ws_id: str) -> None:
        """Drop a workspace's stamps (it is deleted, or was found changed)."""
        with self._lock:
            for key in [key for key in self._stamps if key[0] == ws_id]:
                del self._stamps[key]


def only_skeleton(root: str, skeleton: Iterable[str]) -> tuple[bool, TreeStamps]:
    """Whether `root` holds nothing but the directories `skeleton` names (paths below
    it, each with its parents), and the stamps of what was seen. Anything that cannot
    be looked at counts as not so."""
    wanted = set(skeleton)
    stamps: list[tuple[str, Stamp]] = []
    try:
        for rel, info in _walk(root, strict=True):
            if rel and (rel not in wanted or not stat.S_ISDIR(info.st_mode)):
                return False, ()
            stamps.append((rel, stamp_of(info)))
    except OSError:
        return False, ()
    return True, tuple(stamps)


def listing_with_stamps(root: str, skip: frozenset[str] = frozenset()
                        ) -> tuple[list[list[object]], TreeStamps]:
    """Every entry below `root` (path below it, mode, owner, size of a file: what
    `disk.layer_listing` gives), sorted by path, and the stamps of the root and every
    entry. A directory that cannot be read is listed as far as it could be. The paths
    `skip` names are left out, with what they hold."""
    found: list[list[object]] = []
    stamps: list[tuple[str, Stamp]] = []
    try:
        for rel, info in _walk(os.path.normpath(root), strict=False, skip=skip):
            stamps.append((rel, stamp_of(info)))
            if rel:
                found.append([rel, info.st_mode, info.st_uid, info.st_gid,
                              0 if stat.S_ISDIR(info.st_mode) else info.st_size])
    except OSError:
        return [], ()  # the root itself is gone
    found.sort(key=lambda item: str(item[0]))
    return found, tuple(stamps)


def _walk(root: str, *, strict: bool, skip: frozenset[str] = frozenset()
          ) -> Iterator[tuple[str, os.stat_result]]:
    """(path below `root`, lstat) of `root` ('') and of every entry below it, each
    directory before what it holds, never following a link, but for the paths `skip`
    names and what they hold. OSError when the root cannot be looked at; for a
    directory that cannot be read on the way, OSError when `strict`, else what it
    listed so far."""
    yield "", os.lstat(root)
    stack = [""]
    while stack:
        prefix = stack.pop()
        try:
            with os.scandir(f"{root}/{prefix}" if prefix else root) as listing:
                for entry in listing:
                    if skip and f"{prefix}{entry.name}" in skip:
                        continue
                    info = entry.stat(follow_symlinks=False)
                    yield f"{prefix}{entry.name}", info
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(f"{prefix}{entry.name}/")
        except OSError:
            if strict:
                raise

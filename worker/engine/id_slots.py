"""Id slots: host ids for workspaces' user namespaces, each live workspace a slot (a range
of 65,536 uids and gids) of its own.

A root worker maps each workspace's user namespace onto 65,536 host uids and gids that
no other live workspace on the machine uses: a slice of the subordinate ids the operator
gave the run user (`/etc/subuid` and `/etc/subgid`, written by `scripts/bootstrap.sh` and
the deploy files). Inside, a call is root (or the image's user); on the host it is an
id of its workspace alone, so one tenant's files, processes and kernel keyring are never
another's.

Slots are claimed machine-wide: a workspace's uids and gids are locked as byte ranges
(open file description locks, `F_OFD_SETLK`) of one file in a directory every worker on
the machine shares (`Settings.id_lock_dir`), whatever its state directory: two fleets
on one machine (a user's own `bashfleet up` beside a test's), two containers binding
the host's directory, or workers whose ranges overlap only in part never hand out the
same ids, since the kernel refuses any two overlapping locks. The keeper of the
workspace holds the locked descriptor for as long as it lives, so a slot is free again
the moment its keeper is gone, however it ended (a kill, a crash, the host's reboot):
nothing to clean up, nothing to leak.

A lock only protects workers that see the same file. A worker in a container with a
lock directory of its own cannot know what the host's other workers hold: `lock_scope`
says whether this worker's directory is provably the machine's, and the operator may
give each worker a range of its own (`Settings.id_range`) where it cannot be.

A host without subordinate ids for its run user (or a worker that is not root) cannot
give each workspace ids of its own: it is *single-tenant*, said in `bashfleet hosts`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import struct
from dataclasses import dataclass
from pathlib import Path

from bashfleet.worker.engine import mountinfo

#: Ids per workspace: a container's usual 16 bits (uid 65534, nobody, included).
SLOT_SIZE = 65536
#: Shared by every worker on the machine: slots are machine-wide, not per fleet.
LOCK_DIR = Path("/run/bashfleet/ids")
#: The file whose byte ranges are the ids: uid N is byte N, gid N byte GID_OFFSET + N.
LOCK_FILE = "ids.lock"
GID_OFFSET = 1 << 32
#: `struct flock` (x86_64 and aarch64 alike): type, whence, start, length, pid, padding.
_FLOCK = "hhqqi4x"


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


def subid_ranges(text: str, names: tuple[str, ...]) -> list[Range]:
    """Every range `/etc/subuid` (or subgid) text gives any of `names` (a user's name or
    uid as text). Malformed lines are skipped, as shadow's tools skip them."""
    found: list[Range] = []
    for line in text.splitlines():
        fields = line.strip().split(":")
        if len(fields) != 3 or fields[0] not in names:
            continue
        if not (fields[1].isdigit() and fields[2].isdigit()):
            continue
        found.append(Range(int(fields[1]), int(fields[2])))
    return found


def parse_subids(text: str, names: tuple[str, ...]) -> Range | None:
    """The largest range `/etc/subuid` (or subgid) text gives any of `names`; None when
    it gives none of a slot at least."""
    best: Range | None = None
    for found in subid_ranges(text, names):
        if found.count >= SLOT_SIZE and (best is None or found.count > best.count):
            best = found
    return best


def parse_range(text: str) -> Range:
    """`start:count` (an operator's `id_range`); ValueError when malformed or smaller
    than one slot."""
    start, sep, count = text.partition(":")
    if not (sep and start.isdigit() and count.isdigit()):
        raise ValueError(f"id range {text!r}: expected start:count, e.g. 1073741824:655360")
    if int(count) < SLOT_SIZE:
        raise ValueError(f"id range {text!r}: fewer ids than one workspace needs ({SLOT_SIZE})")
    return Range(int(start), int(count))


def within(inner: Range, outers: list[Range]) -> bool:
    """`inner` lies wholly inside one of `outers`."""
    return any(o.start <= inner.start and inner.start + inner.count <= o.start + o.count
               for o in outers)


def host_ids(user: str, *, subuid: str = "/etc/subuid", subgid: str = "/etc/subgid",
             only: str | None = None) -> HostIds | None:
    """What this host may give its workspaces (None: nothing; single-tenant). Only a
    root worker can write another process's id maps without `newuidmap`. `only`: the
    operator's `start:count` (None when it is not within the user's subordinate uids and
    gids: `range_problem` says why)."""
    if os.geteuid() != 0:
        return None
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return None
    names = (user, str(uid))
    try:
        uid_text = Path(subuid).read_text("utf-8")
        gid_text = Path(subgid).read_text("utf-8")
    except OSError:
        return None
    return granted(uid_text, gid_text, names, only)


def granted(uid_text: str, gid_text: str, names: tuple[str, ...],
            only: str | None = None) -> HostIds | None:
    """The ids `/etc/subuid` and `/etc/subgid` texts give the user `names` name: all of
    them, or `only` (`start:count`) when it lies within both (else None)."""
    if only is None:
        uids = parse_subids(uid_text, names)
        gids = parse_subids(gid_text, names)
        return HostIds(uids, gids) if uids is not None and gids is not None else None
    try:
        chosen = parse_range(only)
    except ValueError:
        return None
    if within(chosen, subid_ranges(uid_text, names)) \
            and within(chosen, subid_ranges(gid_text, names)):
        return HostIds(chosen, chosen)
    return None


def range_problem(user: str, only: str, *, subuid: str = "/etc/subuid",
                  subgid: str = "/etc/subgid") -> str | None:
    """Why the operator's `start:count` cannot be this host's (None: it can)."""
    try:
        chosen = parse_range(only)
    except ValueError as exc:
        return str(exc)
    try:
        uid = pwd.getpwnam(user).pw_uid
        uid_text = Path(subuid).read_text("utf-8")
        gid_text = Path(subgid).read_text("utf-8")
    except (KeyError, OSError) as exc:
        return f"id range {only}: cannot read {user}'s subordinate ids: {exc}"
    names = (user, str(uid))
    for kind, text, where in (("uids", uid_text, subuid), ("gids", gid_text, subgid)):
        if not within(chosen, subid_ranges(text, names)):
            return (f"id range {only} is not within the subordinate {kind} {where} gives "
                    f"{user}")
    return None


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


def claim(ids: HostIds, *, first: int = 0, lock_dir: Path = LOCK_DIR,
          legacy: bool = False) -> Slot:
    """A free slot, locked (OSError ENOSPC when every slot is taken). `first`: where to
    start looking (spreads the claims of many processes). `legacy`: `ids` is all of the
    run user's range, whose slots earlier versions locked as a file per slot number
    (`<lock_dir>/<index>`): a slot whose file a keeper of theirs still holds is taken."""
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    total = ids.slots
    # One open file description per claim: OFD locks of two descriptions conflict even
    # within one process, and the keeper that is handed this one holds its locks alone.
    fd = os.open(lock_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
    try:
        for step in range(total):
            index = (first + step) % total
            uid, gid = slot_ids(ids, index)
            if legacy and _held_before(lock_dir, index):
                continue
            if not _lock(fd, uid):
                continue
            if not _lock(fd, GID_OFFSET + gid):
                _unlock(fd, uid)
                continue
            return Slot(index, uid, gid, fd)
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    raise OSError(errno.ENOSPC, f"every one of this host's {total} workspace id ranges is "
                  "in use")


def _held_before(lock_dir: Path, index: int) -> bool:
    """Whether a keeper started by an earlier version holds slot `index` (its flock)."""
    try:
        fd = os.open(lock_dir / str(index), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _lock(fd: int, start: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET,
                                                       start, SLOT_SIZE, 0))
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _unlock(fd: int, start: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK, fcntl.F_UNLCK, os.SEEK_SET,
                                                   start, SLOT_SIZE, 0))


def held(uid: int, gid: int, *, lock_dir: Path = LOCK_DIR) -> bool:
    """Whether any of the slot's uids or gids is claimed now (by any worker sharing
    `lock_dir`)."""
    try:
        fd = os.open(lock_dir / LOCK_FILE, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        for start in (uid, GID_OFFSET + gid):
            answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, struct.pack(
                _FLOCK, fcntl.F_WRLCK, os.SEEK_SET, start, SLOT_SIZE, 0))
            if struct.unpack(_FLOCK, answer)[0] != fcntl.F_UNLCK:
                return True
        return False
    finally:
        os.close(fd)


#: The pid namespace of the machine's own init (`PROC_PID_INIT_INO`): a process in it is
#: not in a container's.
_INIT_PID_NS = 0xEFFFFFFC


def lock_scope(lock_dir: Path, *, proc: str = "/proc") -> str | None:
    """Why claims under `lock_dir` may not be seen by every worker of the machine (None:
    they are). Provably the machine's: the directory the machine's init sees at that
    path (a worker in the host's namespaces), or one bound into this container from
    outside it (the deploy files bind the host's); not: a container's own directory."""
    try:
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        in_host_pids = os.stat(f"{proc}/self/ns/pid").st_ino == _INIT_PID_NS
        mine = os.stat(lock_dir)
    except OSError as exc:
        return f"cannot tell whether {lock_dir} is the machine's: {exc}"
    if in_host_pids:
        return _init_sees(lock_dir, mine, proc)
    try:
        with open(f"{proc}/self/mountinfo", encoding="utf-8") as handle:
            mount_text = handle.read()
    except OSError as exc:
        return f"cannot tell whether {lock_dir} is the machine's: {exc}"
    if bound_from_outside(mount_text, str(lock_dir)):
        return None
    return (f"this worker runs in a container and {lock_dir} is its own: a worker in "
            "another container or on the host may give a workspace's ids (bind the "
            "host's directory there, or give each worker an id_range of its own)")


def _init_sees(lock_dir: Path, mine: os.stat_result, proc: str) -> str | None:
    """A worker in the machine's pid namespace: its lock directory is the machine's when
    the machine's init sees the same one at that path."""
    try:
        init = os.stat(f"{proc}/1/root{lock_dir}")
    except PermissionError:
        # An init this root may not look into (a supervisor in a user namespace of its
        # own above us): the machine's own pid namespace is the best proof left.
        return None
    except OSError:
        init = None
    if init is not None and (init.st_dev, init.st_ino) == (mine.st_dev, mine.st_ino):
        return None
    return (f"{lock_dir} is not the one the machine's init sees (a private mount "
            "namespace): another worker of this machine may give a workspace's ids")


def bound_from_outside(mountinfo_text: str, path: str) -> bool:
    """Whether the mount `path` lies on (the deepest mount point holding it) is a
    directory bound from elsewhere (a host path or a volume: its root in its file system
    is not `/`) rather than this container's own root or a tmpfs of its own."""
    entry = mountinfo.holding(mountinfo_text, path)
    return entry is not None and entry.root != "/"

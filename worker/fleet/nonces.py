"""The nonces of the signed messages a host accepted, remembered by the host itself.

Redis records each nonce too (the claim of a call, `registry.use_nonce`), but Redis is
exactly what an attacker who captured a message can write to: delete the nonce key
and the call record, push the message again, and a Redis-only check runs it twice.
So each host also keeps the nonces it accepted, until their message expires, in an
append-only file on its own disk, `<state_dir>/nonces/host.log`, shared by its two
consumer processes (a message taken by the command consumer and pushed again onto the
control queue is a replay too) and read back when they restart.

One line per nonce, `<expiry> <nonce>`. Every use holds an exclusive lock on a lock
file beside it (`flock`, so both consumers, and each consumer's threads, take turns):
read what the other process appended since this one last looked, decide, append. The
file is rewritten without its expired lines when it has grown past COMPACT_LINES; the
other process sees the new file (another inode) and reads it whole. One lock, one
`fstat`, one short read and one short write per signed message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

#: Lines past which the file is rewritten without its expired nonces.
COMPACT_LINES = 50_000
#: The file of a host's nonces, under its state directory.
HOST_FILE = Path("nonces") / "host.log"


def parse_lines(text: str, now: float) -> dict[str, float]:
    """The unexpired nonces of complete `<expiry> <nonce>` lines (a torn or garbled line
    is skipped)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        expiry, _, nonce = line.partition(" ")
        try:
            if nonce and float(expiry) > now:
                found[nonce] = float(expiry)
        except ValueError:
            continue  # a torn line (a process died writing it)
    return found


class NonceMemory:
    """Nonces seen before their expiry, by any process of the host: `first_use` is False
    for a replay. Thread- and process-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        self._lock = threading.Lock()
        self._expiries: dict[str, float] = {}
        self._inode: int | None = None
        self._fd: int | None = None
        """The file, open for reading and appending while it is the same file."""
        self._read_to = 0
        self._lines = 0
        self._torn = False
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Open for the memory's life: the threads of this process take turns on
        # `_lock`, the processes of the host on this descriptor's flock.
        self._lock_fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def first_use(self, nonce: str, expires: float) -> bool:
        """Record `nonce` (valid until `expires`); False when it was seen already, by this
        process or another of the host, now or before a restart."""
        now = time.time()
        with self._lock, self._file_lock():
            self._catch_up(now)
            seen = self._expiries.get(nonce)
            if seen is not None and seen > now:
                return False
            self._expiries[nonce] = expires
            self._append(f"{expires:.3f} {nonce}\n")
            if self._lines > COMPACT_LINES:
                self._compact(now)
        return True

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _catch_up(self, now: float) -> None:
        """Read what was appended since this process last looked (all of it when the file
        is new to it: its first use, or another process compacted it). The file stays
        open between uses: a use that finds nothing new costs one stat."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._forget_file()
            return
        fd = self._fd
        if fd is None or info.st_ino != self._inode or info.st_size < self._read_to:
            self._forget_file()
            fd, info = self._open(os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        if info.st_size <= self._read_to:
            return
        data = os.pread(fd, info.st_size - self._read_to, self._read_to)
        self._read_to += len(data)
        text = data.decode("ascii", "replace")
        if text:
            self._torn = not text.endswith("\n")
        self._expiries.update(parse_lines(text, now))
        self._lines += text.count("\n")

    def _open(self, flags: int) -> tuple[int, os.stat_result]:
        """Open the file as this process's (nothing of it read yet): its descriptor, and
        what it is now."""
        self._fd = fd = os.open(self.path, flags, 0o600)
        info = os.fstat(fd)
        self._inode = info.st_ino
        return fd, info

    def _forget_file(self) -> None:
        """Drop what was read of a file that is gone or was replaced."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._inode, self._read_to, self._lines = None, None, 0, 0
        self._expiries, self._torn = {}, False

    def _append(self, line: str) -> None:
        if self._torn:  # a process died mid-line: start ours on a line of its own
            line = "\n" + line
            self._torn = False
        fd = self._fd
        if fd is None:  # the host's first nonce (or the file was removed)
            fd, _ = self._open(os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC)
        data = line.encode("ascii", "replace")
        os.write(fd, data)
        self._read_to += len(data)
        self._lines += 1

    def _compact(self, now: float) -> None:
        self._expiries = {n: e for n, e in self._expiries.items() if e > now}
        tmp = self.path.with_suffix(".tmp")
        text = "".join(f"{e:.3f} {n}\n" for n, e in self._expiries.items())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(text)
        os.replace(tmp, self.path)
        expiries = self._expiries
        self._forget_file()
        self._open(os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        self._expiries = expiries
        self._read_to = len(text.encode("ascii"))
        self._lines = len(self._expiries)

"""The nonces of the signed messages a consumer accepted, remembered by the worker itself.

Redis records each nonce too (the claim of a call, `registry.use_nonce`), but Redis is
exactly what an attacker who captured a message can write to: delete the nonce key
and the call record, push the message again, and a Redis-only check runs it twice.
So each consumer also keeps the nonces it accepted, until their message expires, in
memory and in an append-only file on its own disk (read back when it restarts).

One line per nonce, `<expiry> <nonce>`; the file is rewritten without the expired
lines when it has grown past COMPACT_LINES. One short write per signed message.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

#: Lines past which the file is rewritten without its expired nonces.
COMPACT_LINES = 50_000


class NonceMemory:
    """Nonces seen before their expiry: `first_use` is False for a replay. Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._expiries: dict[str, float] = {}
        self._lines = 0
        self._load()

    def _load(self) -> None:
        now = time.time()
        try:
            text = self.path.read_text(encoding="ascii", errors="replace")
        except FileNotFoundError:
            return
        for line in text.splitlines():
            expiry, _, nonce = line.partition(" ")
            try:
                if float(expiry) > now and nonce:
                    self._expiries[nonce] = float(expiry)
            except ValueError:
                continue  # a torn last line (the process died writing it)
        self._lines = len(self._expiries)

    def first_use(self, nonce: str, expires: float) -> bool:
        """Record `nonce` (valid until `expires`); False when it was seen already."""
        now = time.time()
        with self._lock:
            seen = self._expiries.get(nonce)
            if seen is not None and seen > now:
                return False
            self._expiries[nonce] = expires
            self._append(f"{expires:.3f} {nonce}\n")
            if self._lines > COMPACT_LINES:
                self._compact(now)
        return True

    def _append(self, line: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line.encode("ascii", "replace"))
        finally:
            os.close(fd)
        self._lines += 1

    def _compact(self, now: float) -> None:
        self._expiries = {n: e for n, e in self._expiries.items() if e > now}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(f"{e:.3f} {n}\n" for n, e in self._expiries.items()), "ascii")
        os.replace(tmp, self.path)
        self._lines = len(self._expiries)

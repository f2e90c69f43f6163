"""Values computed at most once per time-to-live: checks too costly for every call.

The engine reuses a spill directory's free-space verdict and the bash found on a PATH,
procs the boot time; each of those changes rarely, and re-checking it on every call
was a syscall (or several) of a short call's overhead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TimedMemo(Generic[K, V]):
    """`compute()`'s value per key, reused for `ttl_s` seconds; at most `kept` keys.

    Thread-safe enough for its use: an entry is one tuple, replaced whole, so threads
    racing on a stale entry at worst both compute it.
    """

    def __init__(self, ttl_s: float, kept: int = 64) -> None:
        self.ttl_s = ttl_s
        self.kept = kept
        self._entries: dict[K, tuple[V, float]] = {}

    def get(self, key: K, compute: Callable[[], V]) -> V:
        """The value for `key`: the one computed less than `ttl_s` ago, else a new one."""
        now = time.monotonic()
        cached = self._entries.get(key)
        if cached is not None and now - cached[1] < self.ttl_s:
            return cached[0]
        value = compute()
        if len(self._entries) >= self.kept:
            self._entries.clear()  # one key or a few in a worker; many only in tests
        self._entries[key] = (value, now)
        return value

    def forget(self, key: K) -> None:
        """Compute `key` again next time."""
        self._entries.pop(key, None)

    def clear(self) -> None:
        """Compute every key again next time."""
        self._entries.clear()

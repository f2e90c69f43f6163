"""What Redis spent on a burst of calls: commands (`INFO commandstats`), CPU (`INFO
cpu`), and the memory the burst left behind (the keys it created, their sizes and TTLs).

Taken around each side's bursts in `bench_fleet` (and `bench_scale`): a snapshot
before, one after, and the difference divided by the calls. Everything Redis did in
the window counts (heartbeats, the consumers' polls, task events): that is what a call
costs a fleet too. The snapshots' own INFO commands are left out.

Memory is read key by key (`MEMORY USAGE`, `PTTL`) for the keys that appeared during
the window, after it (the reads are not in the CPU or command counts): what is left at
once, what is still there once the reply's TTL has passed (computed from each key's
TTL, not waited for), and what the calls hold at steady state, bytes x seconds kept
per call: the memory one call per second of sustained load keeps in Redis. A key with
no TTL counts as kept for good (`forever`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import redis

#: Commands the measurement itself sends (never counted).
OWN_COMMANDS = frozenset({"info", "scan", "memory|usage", "memory", "pttl", "type"})


@dataclass(frozen=True)
class Snapshot:
    """Redis' counters at one moment."""

    commands: Counter[str]
    cpu_s: float
    used_memory: int
    usec: Counter[str] = field(default_factory=Counter)
    """Microseconds Redis spent in each command so far (a script's own time includes
    the commands it ran, which count on their own too)."""


def snapshot(client: redis.Redis) -> Snapshot:
    """The command counts by name, the CPU Redis used so far, its used memory."""
    stats = client.info("commandstats")
    commands: Counter[str] = Counter()
    usec: Counter[str] = Counter()
    for name, value in stats.items():
        command = str(name).removeprefix("cmdstat_")
        if command not in OWN_COMMANDS:
            commands[command] = int(value["calls"])
            usec[command] = int(value["usec"])
    cpu = client.info("cpu")
    memory = client.info("memory")
    return Snapshot(commands, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
                    int(memory["used_memory"]), usec)


@dataclass
class Spent:
    """What Redis spent over some windows (summed), and over how many calls."""

    calls: int = 0
    commands: Counter[str] = field(default_factory=Counter)
    cpu_s: float = 0.0
    memory_delta: int = 0
    usec: Counter[str] = field(default_factory=Counter)

    def add(self, before: Snapshot, after: Snapshot, calls: int) -> None:
        """Count one window of `calls` calls in."""
        self.calls += calls
        self.commands.update(after.commands - before.commands)
        self.usec.update(after.usec - before.usec)
        self.cpu_s += after.cpu_s - before.cpu_s
        self.memory_delta += after.used_memory - before.used_memory

    def commands_per_call(self) -> float:
        """Commands Redis ran per call (those run inside scripts included)."""
        return sum(self.commands.values()) / max(1, self.calls)

    def cpu_ms_per_call(self) -> float:
        """Redis CPU per call, ms."""
        return self.cpu_s / max(1, self.calls) * 1e3

    def top(self, count: int | None = None) -> str:
        """The commands run, most first, per call: `2.0 EVALSHA, 1.0 LPUSH, ...` (every
        one run at least once per 20 calls, unless `count` names fewer)."""
        calls = max(1, self.calls)
        return ", ".join(f"{n / calls:.1f} {name.upper()}"
                         for name, n in self.commands.most_common(count) if n / calls >= 0.05)

    def top_time(self, count: int = 8) -> str:
        """Where Redis' command time went, per call, most first: `EVALSHA 31.2 us, ...`
        (a script's time includes its inner commands', which are listed too)."""
        calls = max(1, self.calls)
        return ", ".join(f"{name.upper()} {us / calls:.1f} us"
                         for name, us in self.usec.most_common(count) if us / calls >= 0.05)


def keys(client: redis.Redis) -> set[str]:
    """Every key Redis holds now."""
    return {str(key) for key in client.scan_iter(count=1000)}


@dataclass
class Left:
    """The keys some calls left in Redis: bytes now, bytes past a horizon, byte-seconds."""

    calls: int = 0
    bytes_now: int = 0
    bytes_after: int = 0
    byte_seconds: float = 0.0
    forever: int = 0
    kinds: Counter[str] = field(default_factory=Counter)

    def add(self, client: redis.Redis, new_keys: set[str], calls: int, horizon_s: float) -> None:
        """Count the keys `calls` calls made (`new_keys`) in: their size and TTL now."""
        self.calls += calls
        with client.pipeline(transaction=False) as pipe:
            for key in sorted(new_keys):
                pipe.memory_usage(key, samples=0)
                pipe.pttl(key)
            answers = pipe.execute()
        for index, key in enumerate(sorted(new_keys)):
            size, pttl = answers[2 * index], answers[2 * index + 1]
            if size is None or pttl == -2:  # gone meanwhile
                continue
            self.bytes_now += int(size)
            self.kinds[kind_of(key)] += int(size)
            if pttl == -1:
                self.forever += 1
                self.bytes_after += int(size)
                continue
            self.byte_seconds += int(size) * pttl / 1000
            if pttl / 1000 > horizon_s:
                self.bytes_after += int(size)

    def per_call(self, value: float) -> float:
        """`value` divided by the calls."""
        return value / max(1, self.calls)

    def sustained_mb(self) -> float:
        """MB Redis holds per call/s of sustained load (bytes x seconds kept per call)."""
        return self.per_call(self.byte_seconds) / 1e6

    def top(self) -> str:
        """Bytes per call by kind of key: `call 310 B, reply 820 B`."""
        return ", ".join(f"{kind} {self.per_call(size):.0f} B"
                         for kind, size in self.kinds.most_common(6))


def kind_of(key: str) -> str:
    """A key's kind: `bashfleet:call:abc` -> `call`, `celery-task-meta-x` -> `celery-task-meta`."""
    if key.startswith("bashfleet:"):
        return key.split(":")[1]
    if key.startswith("celery-task-meta"):
        return "celery-task-meta"
    return key.partition(":")[0]

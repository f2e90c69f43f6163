"""Where the control requests that take time run: an owner's lane, never the control
consumer's own threads.

The control consumer answers `check`, `kill`, `cancel` and the other instant requests on
its few threads (`consumer.CTL_CONCURRENCY`). A request that may take time would hold
one: a file read blocks as long as the file lets it (a FIFO: until a writer comes), a
workspace built from a Dockerfile takes minutes, an interactive read waits for output.
Four of those from one tenant would freeze every owner's checks and kills on the host.
So such a request is verified and read on a control thread, then handed to its owner's
lane; a thread of the lane acts and answers (the same sealed reply, on the same channel).

    control thread:  verify -> read the request -> instant?  act, answer
                                                └─ else: Lanes.submit(owner, work)
    lane thread:                                   act (with its deadline), answer

An owner has at most `per_owner` threads at once and `queue` requests waiting; a host at
most `host` threads for every owner together. A free thread goes to the owner served
least recently that has work (an owner new to the lanes first), so an owner with a
hundred requests waiting delays another's by one turn at most, never by its queue.
Past an owner's queue a request is refused at once (`limit`). A request that waited past
its message's expiry (its caller stopped waiting) is answered as such, not acted on.

Threads are started per request (~0.1 ms) and end with it: an idle host holds none.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.errors import ToolError

log = logging.getLogger("bashfleet.worker")

#: Seconds kept between a request's deadline and its message's expiry: its answer must
#: reach the caller before the caller stops waiting.
ANSWER_MARGIN_S = 1.0
#: Requests an owner may have waiting in a lane (past them: `limit` at once).
QUEUE = 64

_current = threading.local()


def time_left(cap_s: float) -> float:
    """Seconds the request this thread acts on may still take: at most `cap_s`, less
    when its caller stops waiting sooner (its message's expiry, less ANSWER_MARGIN_S)."""
    expires_at: float | None = getattr(_current, "expires_at", None)
    if expires_at is None:
        return cap_s
    return max(0.0, min(cap_s, expires_at - ANSWER_MARGIN_S - time.time()))


@dataclass(frozen=True)
class Work:
    """A request handed to a lane: `act` acts and answers; `expire` answers that it
    waited too long (called instead, once `expires_at` passed, on `time.time()`'s clock)."""

    act: Callable[[], object]
    expire: Callable[[], object]
    expires_at: float | None = None


@dataclass
class _Lane:
    waiting: deque[Work] = field(default_factory=deque)
    running: int = 0


class Lanes:
    """Per-owner bounded lanes over a host-wide cap of threads (see the module's doc)."""

    def __init__(self, name: str, *, per_owner: int, host: int, queue: int) -> None:
        self.name = name
        self.per_owner, self.host, self.queue = per_owner, host, queue
        self._lock = threading.Lock()
        # In turn order: the owner served last goes to the end.
        self._lanes: OrderedDict[str, _Lane] = OrderedDict()
        self._running = 0

    def submit(self, owner: str, work: Work) -> None:
        """Queue `work` in `owner`'s lane (started at once when a thread is free);
        ToolError `limit` when the owner already has `queue` requests waiting."""
        with self._lock:
            lane = self._lanes.get(owner)
            if lane is None:  # served least recently of all: first in line
                lane = self._lanes[owner] = _Lane()
                self._lanes.move_to_end(owner, last=False)
            if len(lane.waiting) >= self.queue:
                raise ToolError("limit", (
                    f"owner {owner or '(none)'} has {len(lane.waiting)} {self.name} requests "
                    f"waiting on this host behind {lane.running} running, the most allowed: "
                    "retry once some have been answered"))
            lane.waiting.append(work)
            picked = self._pick()
        self._start(picked)

    def busy(self) -> dict[str, tuple[int, int]]:
        """Owner -> (requests running, waiting): for tests and a host's log."""
        with self._lock:
            return {owner: (lane.running, len(lane.waiting))
                    for owner, lane in self._lanes.items()}

    def _pick(self) -> list[tuple[str, Work]]:
        """Take work for every free thread, an owner at a time in turn (lock held)."""
        picked = []
        while self._running < self.host:
            owner = next((name for name, lane in self._lanes.items()
                          if lane.waiting and lane.running < self.per_owner), None)
            if owner is None:
                break
            lane = self._lanes[owner]
            picked.append((owner, lane.waiting.popleft()))
            lane.running += 1
            self._running += 1
            self._lanes.move_to_end(owner)  # its turn is taken: last in line
        return picked

    def _start(self, picked: list[tuple[str, Work]]) -> None:
        for owner, work in picked:
            threading.Thread(target=self._run, args=(owner, work), daemon=True,
                             name=f"bashfleet-{self.name}").start()

    def _run(self, owner: str, work: Work) -> None:
        _current.expires_at = work.expires_at
        try:
            if work.expires_at is not None and time.time() > work.expires_at:
                work.expire()
            else:
                work.act()
        except Exception:  # a lane thread must free its place whatever happens
            log.exception("a %s request of owner %s failed in its lane", self.name, owner)
        finally:
            with self._lock:
                lane = self._lanes[owner]
                lane.running -= 1
                self._running -= 1
                if not lane.running and not lane.waiting:
                    del self._lanes[owner]
                picked = self._pick()
            self._start(picked)


#: The lanes of this process, by kind (made from the settings at their first use).
_hosts: dict[str, Lanes] = {}
_hosts_lock = threading.Lock()
#: Kills, cancels and interactive reads waiting at once, every owner's together: a
#: thread each, parked in a sleep or a poll (cheap), so many more than the work lane's.
WAITS_HOST = 512


def for_host(settings: Settings, kind: Literal["work", "waits"]) -> Lanes:
    """This process's lanes of `kind`: `work` (files, transfers' starts, workspaces,
    snapshots, images: `lane_threads_per_owner` per owner) or `waits` (kills, cancels
    and interactive reads, which wait on processes: as many per owner as the sessions
    an owner may run)."""
    with _hosts_lock:
        found = _hosts.get(kind)
        if found is None:
            if kind == "work":
                found = Lanes("work", per_owner=settings.lane_threads_per_owner,
                              host=settings.lane_threads, queue=QUEUE)
            else:
                found = Lanes("waits", per_owner=settings.interactive_max_per_owner,
                              host=WAITS_HOST, queue=QUEUE)
            _hosts[kind] = found
        return found

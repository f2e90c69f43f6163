"""A throwaway keeper's ready spawners (`Keeper.make_ready`): used when they can take
their call, and no longer started once several in a row could not (one that fails its
own steps would every time), the kernel's side played by stand-ins."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from bashfleet.worker.engine.isolate import keeper, kernel

WHO = kernel.Identity(0, 0, (), 5)


class Kernel:
    """What the keeper asks of `kernel` about spawners, recorded; `usable` decides
    whether a ready spawner takes its call."""

    def __init__(self) -> None:
        self.usable = True
        self.readied = 0
        self.through = 0
        self.ended: list[int] = []

    def ready_spawn(self, spawner: int, who: kernel.Identity, filter_fd: int) -> Any:
        self.readied += 1
        mine, theirs = socket.socketpair()
        theirs.close()
        return kernel.ReadySpawn(1000 + self.readied, mine, 99)

    def start_ready(self, ready: kernel.ReadySpawn, *args: Any, **kwargs: Any) -> int | None:
        ready.close()
        return ready.pid if self.usable else None

    def end_ready(self, ready: kernel.ReadySpawn) -> None:
        self.ended.append(ready.pid)
        ready.close()

    def spawn_through(self, *args: Any, **kwargs: Any) -> int:
        self.through += 1
        return 2000 + self.through


@pytest.fixture(name="played")
def _played_fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[keeper.Keeper, Kernel]]:
    fake = Kernel()
    for name in ("ready_spawn", "start_ready", "end_ready", "spawn_through"):
        monkeypatch.setattr(kernel, name, getattr(fake, name))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    before = signal.getsignal(signal.SIGCHLD)
    made = keeper.Keeper(listener, worker_uid=0, who=WHO, host_proc=-1)
    made.spawner = 7
    try:
        yield made, fake
    finally:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, before)
        listener.close()


BODY: Any = {"argv": ["bash", "-c", "true"], "env": {}, "cwd": "/"}


def test_a_ready_spawner_takes_the_call_and_the_next_is_made_after_it(
        played: tuple[keeper.Keeper, Kernel]) -> None:
    made, fake = played
    made.make_ready()
    made.make_ready()  # one at a time
    assert fake.readied == 1
    assert made._start(BODY, [], [0, 1, 2]) == 1001
    assert made.ready is None and fake.through == 0
    made.make_ready()
    assert fake.readied == 2


def test_ready_spawners_that_cannot_take_their_call_stop_being_made(
        played: tuple[keeper.Keeper, Kernel]) -> None:
    made, fake = played
    fake.usable = False
    for n in range(keeper.READY_MISSES):
        made.make_ready()
        assert made._start(BODY, [], [0, 1, 2]) == 2001 + n  # started the usual way
    assert fake.ended == [1001, 1002, 1003][:keeper.READY_MISSES]
    made.make_ready()
    assert made.ready is None and fake.readied == keeper.READY_MISSES
    assert made._start(BODY, [], [0, 1, 2]) == 2001 + keeper.READY_MISSES

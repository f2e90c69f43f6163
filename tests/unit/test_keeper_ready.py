"""A throwaway keeper's ready spawners (`Keeper.make_ready`): used when they can take
their call, and no longer started once several in a row could not (one that fails its
own steps would every time), the kernel's side played by stand-ins."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bashfleet.worker.engine.isolate import keeper, kernel, proto

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


def test_an_output_caps_first_look_comes_once_the_call_could_write(
        played: tuple[keeper.Keeper, Kernel], monkeypatch: pytest.MonkeyPatch) -> None:
    """A look as the call starts finds nothing written and waits the longest before the
    next: a flood had 50 ms to run past the cap (16-71 MiB over a 2 MiB cap measured).
    The first look comes after the shortest wait instead, as a job supervisor's does."""
    made, _ = played
    monkeypatch.setattr(kernel, "host_pid", lambda pid, proc: pid)
    monkeypatch.setattr(kernel, "start_ticks", lambda pid, proc: 1)
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    out_read, out_write = os.pipe()
    try:
        conn = keeper.Conn(ours)
        request: Any = {**BODY, "targets": [1], "output_cap": 1 << 20}
        made._spawn(conn, request, [out_write])
        tracked = made.tracked[2001]
        assert tracked.watch is not None
        assert tracked.next_look == pytest.approx(100.0 + proto.CAP_MIN_WAIT_S)
        looks: list[float] = []

        def step() -> tuple[bool, float]:
            looks.append(clock[0])
            return False, proto.CAP_MAX_WAIT_S

        monkeypatch.setattr(tracked.watch, "step", step)
        made._tick()  # at once: not yet
        clock[0] += proto.CAP_MIN_WAIT_S
        made._tick()
        assert looks == [clock[0]]
    finally:
        for tracked in made.tracked.values():
            tracked.close()
        ours.close()
        theirs.close()
        os.close(out_read)

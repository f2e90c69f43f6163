"""Interactive sessions through the fleet: real Redis, real workers, real PTYs.

A session's stdin is held by its job supervisor; writes go through the owning host's
control queue from any client of the owner, reads return every byte once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from bashfleet.client import AsyncFleet, Fleet
from bashfleet.client.errors import CallRejected, UnknownJob
from bashfleet.worker.wire.control import Collect

from .conftest import WorkerFactory, WorkerProcess

SETTLE = Collect(wait_s=10, settle_s=0.3)


@pytest.fixture(scope="module")
def host(session_workers: WorkerFactory) -> Iterator[WorkerProcess]:
    yield from session_workers.module_host("inter")


@pytest.fixture
def owner_fleets(redis_server: object, host: WorkerProcess) -> Iterator[tuple[Fleet, Fleet]]:
    """Two clients of one owner (two agents' processes), and nothing else."""
    url = host.url
    first, second = Fleet(url, owner="session:inter-a"), Fleet(url, owner="session:inter-a")
    yield first, second
    first.close()
    second.close()


def _until(fleet: Fleet, job: str, text: str, timeout: float = 15.0) -> str:
    """Read until `text` shows up (every read returns new output only)."""
    seen = ""
    deadline = time.monotonic() + timeout
    while text not in seen:
        assert time.monotonic() < deadline, f"{text!r} never came; got {seen!r}"
        seen += fleet.read(job, collect=Collect(wait_s=2, settle_s=0.05)).output
    return seen


def test_python_repl_in_a_pty_driven_from_two_clients(
    owner_fleets: tuple[Fleet, Fleet], host: WorkerProcess
) -> None:
    first, second = owner_fleets
    started = first.run("python3 -i", host=host.host, stdin="pty", timeout=15)
    assert started.job is not None and started.backgrounded, started
    assert started.input_wait is not None and started.input_wait.prompt == ">>> "
    job = started.job.id
    out = second.write_stdin(job, "print(6*7)\n", collect=SETTLE)
    assert "42" in out.output and out.running and out.stdin_open
    # No repeats: the first client's read starts after what the second one got.
    again = first.write_stdin(job, "print('x'*3)\n", collect=SETTLE)
    assert "42" not in again.output and "xxx" in again.output
    # Ctrl-C reaches the foreground process (Python prints KeyboardInterrupt, lives on).
    first.write_stdin(job, "import time; time.sleep(30)\n", collect=Collect(wait_s=0.3))
    out = first.write_stdin(job, "\u0003", collect=Collect(wait_s=5, settle_s=0.3))
    assert "KeyboardInterrupt" in out.output, out
    ended = first.write_stdin(job, "exit(4)\n", collect=Collect(wait_s=10))
    assert not ended.running and ended.exit_code == 4
    late = first.write_stdin(job, "more\n")  # its end was read: nothing more to deliver to
    assert not late.running and late.note == "the input was not delivered: the process had ended"


def test_another_owner_cannot_write(owner_fleets: tuple[Fleet, Fleet], host: WorkerProcess) -> None:
    first, _ = owner_fleets
    started = first.run("cat", host=host.host, stdin="pipe", timeout=0.5)
    assert started.job is not None
    stranger = Fleet(host.url, owner="session:someone-else")
    try:
        with pytest.raises(UnknownJob):
            stranger.write_stdin(started.job.id, "hi\n")
    finally:
        stranger.close()
    out = first.write_stdin(started.job.id, "hello\n", collect=SETTLE)
    assert out.output == "hello\n"
    closed = first.close_stdin(started.job.id, collect=Collect(wait_s=10))
    assert not closed.running and closed.exit_code == 0


def test_a_session_outlives_its_worker(workers: WorkerFactory) -> None:
    """The supervisor holds the PTY: a restarted worker's control consumer reaches it."""
    worker = workers.start("inter-restart")
    fleet = Fleet(worker.url, owner="session:restart")
    try:
        started = fleet.run("python3 -i -q", host=worker.host, stdin="pty", timeout=10)
        assert started.job is not None and started.input_wait is not None
        assert worker.stop() is not None
        workers.start("inter-restart")
        out = fleet.write_stdin(started.job.id, "print(6*7)\n", collect=SETTLE)
        assert "42" in out.output and out.running
        ended = fleet.close_stdin(started.job.id, collect=Collect(wait_s=10))
        assert not ended.running and ended.exit_code == 0
    finally:
        fleet.close()


def test_a_long_wait_is_answered_past_the_control_timeout(
    owner_fleets: tuple[Fleet, Fleet], host: WorkerProcess
) -> None:
    """A read may wait longer than a plain control call: the client waits as long."""
    first, _ = owner_fleets
    started = first.run("sleep 1; echo late; sleep 30", host=host.host, stdin="closed",
                        timeout=0.2)
    assert started.job is not None and started.backgrounded
    out = first.read(started.job.id, collect=Collect(wait_s=20, settle_s=0.2))
    assert out.output == "late\n" and out.running
    first.kill(started.job.id)


def test_async_fleet_drives_a_session(host: WorkerProcess) -> None:
    """AsyncFleet's session calls are its own (redis.asyncio), with Fleet's answers."""

    async def main() -> None:
        async with AsyncFleet(host.url, owner="session:inter-async") as fleet:
            started = await fleet.run("cat", host=host.host, stdin="pipe", timeout=0.5)
            assert started.job is not None
            job = started.job.id
            out = await fleet.write_stdin(job, "hello async\n", collect=SETTLE)
            assert out.output == "hello async\n" and out.running
            with pytest.raises(CallRejected, match="no terminal to resize"):
                await fleet.resize(job, 30, 100)
            ended = await fleet.close_stdin(job, collect=Collect(wait_s=10))
            assert not ended.running and ended.exit_code == 0

    asyncio.run(main())

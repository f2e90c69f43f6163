"""A blank keeper waiting for its claim (`keeper._claimed`) ends once the worker process
that made it is gone, even after its listener looked readable and held no connection by
the time it accepted: it goes back to waiting, which watches its maker too. Before, it
blocked in accept for good (one was found left over after a CI run, its maker and its
state directory long gone)."""

from __future__ import annotations

import os
import signal
import socket
import time

from bashfleet.worker.engine.isolate import keeper

WAIT_S = 10.0


def _exit_status_within(pid: int, seconds: float) -> int | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)  # polling a child's end, with a deadline
    return None


def test_a_readiness_with_no_connection_left_does_not_hold_it_past_its_maker() -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind("\0bashfleet-test-claim-" + os.urandom(6).hex())
    listener.listen(4)
    maker_read, maker_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(maker_write)
            seen = [False]
            real = keeper._first_ready

            def once_readable(fds: list[int]) -> int:
                # The poll said "a connection": taken by the time accept runs.
                if not seen[0]:
                    seen[0] = True
                    return listener.fileno()
                return real(fds)

            keeper._first_ready = once_readable
            keeper._claimed(listener, {"maker_fd": maker_read, "worker_uid": os.getuid()})
        finally:
            os._exit(3)  # returned or raised: not what a maker's end does
    os.close(maker_read)
    os.close(maker_write)  # the maker is gone: its descriptor reads end-of-file
    try:
        status = _exit_status_within(pid, WAIT_S)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert status == 0, f"the keeper did not end (status {status})"
    finally:
        listener.close()

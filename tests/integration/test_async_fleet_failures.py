"""AsyncFleet when one call among many gathered ones fails: the failure reaches the
caller as itself, the others' calls are cancelled on the fleet (withdrawn while queued,
killed while running), and nothing else breaks on the way out (no errors of the
client's own plumbing at shutdown). Run in a child interpreter, the one running these
tests, as a user's program would (Debian 12's own python3 3.11.2 included: run this file
with a virtualenv of it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest
import redis

from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import procs

from .conftest import WorkerProcess, wait_for

Hosts = tuple[WorkerProcess, WorkerProcess]

PROGRAM = textwrap.dedent("""
    import asyncio, contextlib, sys
    from bashfleet.client import AsyncFleet, HostUnavailable

    async def main(url: str, tag: str, closes: bool) -> None:
        fleet = AsyncFleet(url)
        async with (fleet if closes else contextlib.nullcontext(fleet)):
            async def fails_once_all_are_sent() -> None:
                while fleet.in_flight < 400:
                    await asyncio.sleep(0.01)
                await fleet.run("true", host="no-such-host")

            calls = [fleet.run("sleep 60", host=("alpha", "beta")[i % 2], timeout=120,
                               call_id=f"{tag}-{i}") for i in range(400)]
            await asyncio.gather(fails_once_all_are_sent(), *calls)

    try:
        asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] == "close"))
    except HostUnavailable:
        print("failed as expected")
""")


@pytest.mark.parametrize("closes", ["close", "no-close"])
def test_one_failed_call_among_many_cancels_the_others_and_breaks_nothing(
    two_hosts: Hosts, redis_server: RedisServer, redis_client: redis.Redis, closes: str,
) -> None:
    tag = f"g{time.monotonic_ns()}"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", PROGRAM, redis_server.url, tag, closes],
                          check=False, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "failed as expected\n"
    # Nothing of the client's own plumbing on the way out: no generator that could not
    # be closed, no task destroyed while pending.
    assert done.stderr == "", done.stderr[-3000:]
    assert time.monotonic() - started < 45  # never the 60 s of the calls

    # Every other call was sent, and every one is cancelled: withdrawn while it was
    # queued, its processes killed while it ran. A running one is `cancelling` from its
    # kill until its exec task records its end, which a loaded host may not have done
    # by the time the program exits: waited for, well within the calls' 60 s.
    def states() -> Counter[str]:
        return Counter(str(redis_client.hget(f"bashfleet:call:{tag}-{i}", "state"))
                       for i in range(400))

    wait_for(lambda: states() == {"cancelled": 400}, 30, "every call to end cancelled")
    assert states() == {"cancelled": 400}
    wait_for(lambda: not any(procs.find_call_processes(None, f"{tag}-{i}")
                             for i in range(400)), 30, "the running calls' processes to end")

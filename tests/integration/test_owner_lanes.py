"""One owner key, however many sub-owners it names, holds one owner's share of a host's
threads for slow control requests, with a real worker.

The attack: an owner key may sign as any of its sub-owners (`team::0`, `team::1`, ...).
The host's lanes used to count each sub-owner as an owner of its own, so one key took
every lane thread of a host by spreading its slow requests over sub-owners (8 builds as
two sub-owners on a host of 8 threads), and another owner's request waited for them to
end. Here the host has 2 lane threads, 1 per owner: team's slow reads as three
sub-owners (its workspaces' `stat` hangs until the host's file deadline) would take both
threads; bob's read must still be answered at once. `tests/unit/test_lane_owner.py`
shows the lanes keyed the old way (by sub-owner) letting the flood take the host.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from bashfleet.client import Fleet
from bashfleet.client.errors import BashfleetError
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.wire.owner_keys import OwnerKey

from .conftest import WorkerFactory, WorkerProcess, wait_for

HOST = "lanekeys"
#: The host's file deadline: team's hanging reads end by it, so a victim answered well
#: within it was not waiting for them.
FILE_DEADLINE_S = 15.0
#: What bob's read may take while team's reads hang (the old way: the deadline).
PROMPT_S = 4.0
#: The workspace's `stat` (its own to replace): says it started, then hangs.
HANG = ("printf '#!/bin/sh\\ntouch /tmp/stat-started\\nexec sleep 3600\\n' "
        "> /usr/local/bin/stat && chmod +x /usr/local/bin/stat && echo x > f")


@pytest.fixture(name="host", scope="module")
def _host_fixture(session_workers: WorkerFactory) -> Iterator[WorkerProcess]:
    yield from session_workers.module_host(HOST, env={
        "BASHFLEET_LANE_THREADS": "2", "BASHFLEET_LANE_THREADS_PER_OWNER": "1",
        "BASHFLEET_FILE_OP_TIMEOUT_S": str(FILE_DEADLINE_S)})


def _client(url: str, key: OwnerKey, owner: str, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    """A client holding `key` only (no fleet key), acting as `owner`."""
    with monkeypatch.context() as env:
        env.setenv("BASHFLEET_OWNER_KEY", key.text)
        env.delenv("BASHFLEET_SIGNING_KEY", raising=False)
        env.delenv("BASHFLEET_ADMIN_KEY", raising=False)
        return Fleet(url, owner=owner)


def _started(fleet: Fleet, workspace: str) -> bool:
    """Whether the workspace's hanging `stat` was started by a read of the host."""
    ran = fleet.run("test -e /tmp/stat-started && echo yes || echo no", workspace=workspace)
    return ran.stdout.strip() == "yes"


def test_sub_owners_of_one_key_share_its_lane(
    host: WorkerProcess, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet_key = os.environ["BASHFLEET_SIGNING_KEY"]
    team_key, bob_key = (OwnerKey.issue(fleet_key, name) for name in ("team", "bob"))
    team = [_client(redis_server.url, team_key, f"team::{n}", monkeypatch) for n in range(3)]
    bob = _client(redis_server.url, bob_key, "bob", monkeypatch)
    clients = [*team, bob]
    try:
        # Their /usr/local/bin their own (a mount of their directory's bin/), as an image
        # workspace's is: the host's is read-only to every workspace.
        hostile = [each.workspace(host=HOST, mounts={"/usr/local/bin": "bin"}) for each in team]
        for ws in hostile:
            assert ws.run(HANG).exit_code == 0
        victim = bob.workspace(host=HOST)
        victim.write_file("note", b"bob's")
        # Each sub-owner asks for a slow read at once, each on a thread of its own.
        outcomes: dict[int, BaseException | None] = {}

        def read(n: int) -> None:
            try:
                hostile[n].read_file("f")
                outcomes[n] = None
            except BaseException as exc:  # recorded: the test says what it expected
                outcomes[n] = exc

        threads = [threading.Thread(target=read, args=(n,)) for n in range(3)]
        for thread in threads:
            thread.start()
        # One of them holds a lane thread (its `stat` runs): the attack is under way.
        wait_for(lambda: any(_started(team[n], hostile[n].id) for n in range(3)), 30,
                 "a hanging stat of team's to start")
        began = time.monotonic()
        assert victim.read_file("note") == b"bob's"
        took = time.monotonic() - began
        still = [thread.is_alive() for thread in threads]
        running = [n for n in range(3) if _started(team[n], hostile[n].id)]
        for thread in threads:
            thread.join(4 * FILE_DEADLINE_S)
    finally:
        for each in clients:
            each.close()
    print(f"\nbob's read while team's hang: {took * 1000:.0f} ms; team's started: {running}")
    assert took < PROMPT_S, took
    assert all(still), "team's reads ended before bob's was answered: proves nothing"
    # team's key held one thread at a time (its share), whatever sub-owners it named.
    assert len(running) == 1, running
    assert len(outcomes) == 3 and all(isinstance(error, BashfleetError)
                                      for error in outcomes.values()), outcomes

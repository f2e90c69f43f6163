"""Where new workspaces go on a fleet of several live hosts: spread over them (the
owner's fewest first), whether made at once by one client or one after another by
several, not all on the host whose name sorts first."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
import redis

from bashfleet.client import AsyncFleet, Fleet
from bashfleet.client.redis_server import RedisServer

from .conftest import WorkerFactory, WorkerProcess

LABEL = "spread"
HOSTS = ("spread-a", "spread-b", "spread-c")


@pytest.fixture(scope="module")
def three_hosts(redis_server: RedisServer, redis_client: redis.Redis,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    """Three idle hosts of one label, started in parallel."""
    factory = WorkerFactory(redis_server.url, redis_client, tmp_path_factory.mktemp("spread"))
    try:
        started = [factory.start(host, labels=(LABEL,), wait=False) for host in HOSTS]
        for worker in started:
            worker.wait_ready(redis_client)
        yield started
    finally:
        factory.cleanup()


def owner() -> str:
    return f"spreader-{uuid.uuid4().hex[:8]}"


def test_twelve_workspaces_made_at_once_spread_over_three_hosts(
    three_hosts: list[WorkerProcess], redis_server: RedisServer,
) -> None:
    async def make_twelve() -> list[str]:
        async with AsyncFleet(redis_server.url, owner=owner()) as fleet:
            made = await asyncio.gather(*(fleet.workspace(label=LABEL) for _ in range(12)))
            hosts = [ws.host for ws in made]
            await asyncio.gather(*(ws.delete() for ws in made))
        return hosts

    placed = Counter(asyncio.run(make_twelve()))
    assert set(placed) == set(HOSTS)
    assert min(placed.values()) >= 3, placed


def test_workspaces_made_one_by_one_by_many_clients_spread_too(
    three_hosts: list[WorkerProcess], redis_server: RedisServer,
) -> None:
    tenant = owner()
    made = []
    try:
        for _ in range(6):
            with Fleet(redis_server.url, owner=tenant) as fleet:  # a new client each time
                made.append(fleet.workspace(label=LABEL))
        assert Counter(ws.host for ws in made) == dict.fromkeys(HOSTS, 2)
    finally:
        for ws in made:
            ws.delete()

"""AsyncFleet, natively asynchronous: the message it pushes is kombu's, a real worker
runs it, one process holds hundreds of calls in flight on a bounded number of threads,
the in-flight limit, a cancelled awaiting task cancels its call, signed calls. What both
clients do alike (control calls, sessions, owners, cancels, a dead worker...) is tested
once per client in `test_client_api.py`."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psutil
import pytest
import redis

from bashfleet.client import AsyncFleet, CallNotRun
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import procs
from bashfleet.worker.fleet.celery_apps import client_celery
from bashfleet.worker.wire.messages import task_message

from .conftest import WorkerFactory, WorkerProcess, wait_for
from .test_hardening_signing import HOST as SIGNED_HOST
from .test_hardening_signing import KEY
from .test_hardening_signing import keyed as keyed  # noqa: PLC0414 - the fixture

Hosts = tuple[WorkerProcess, WorkerProcess]


def _pushed_by_kombu(url: str, client: redis.Redis, queue: str, **options: Any) -> dict[str, Any]:
    app = client_celery(url)
    try:
        app.send_task(queue=queue, **options)
    finally:
        app.close()
    raw = client.rpop(queue)
    assert isinstance(raw, str)
    return dict(json.loads(raw))


def _comparable(message: dict[str, Any]) -> dict[str, Any]:
    """A message without what differs between two sends (tag, sender, expiry instant)."""
    message["properties"].pop("delivery_tag")
    message["headers"].pop("origin")
    message["headers"]["expires"] = bool(message["headers"]["expires"])
    return message


@pytest.mark.parametrize("expires", [None, 30.0])
def test_message_is_what_kombu_pushes(
    redis_server: RedisServer, redis_client: redis.Redis, expires: float | None
) -> None:
    queue = "bashfleet.capture-test.exec"
    args = [{"call_id": "c-cap", "command": "echo héllo \"quoted\" ✓"}]
    options: dict[str, Any] = {
        "name": "bashfleet.exec", "args": args, "task_id": "c-cap",
        "reply_to": "bashfleet:replies:abc", "ignore_result": True,
        "argsrepr": "{'command': '<redacted>'}", "kwargsrepr": "{}",
    }
    if expires is not None:
        options["expires"] = expires
    theirs = _pushed_by_kombu(redis_server.url, redis_client, queue, **options)
    ours = json.loads(task_message(
        "bashfleet.exec", args, task_id="c-cap", queue=queue,
        reply_to="bashfleet:replies:abc", argsrepr="{'command': '<redacted>'}",
        expires_s=expires, now=datetime.now(UTC),
    ))
    assert base64.b64decode(ours["body"]) == base64.b64decode(theirs["body"])
    assert _comparable(ours) == _comparable(theirs)


def test_a_real_worker_runs_what_it_pushes(two_hosts: Hosts, redis_server: RedisServer) -> None:
    async def main() -> list[str]:
        async with AsyncFleet(redis_server.url) as fleet:
            results = await asyncio.gather(
                fleet.run("echo one; echo two >&2", host="alpha"),
                fleet.run("printf 'héllo'", host="beta"),
                fleet.run("exit 3"),
            )
        return [f"{r.stdout}|{r.stderr}|{r.exit_code}" for r in results]

    assert asyncio.run(main()) == ["one\n|two\n|0", "héllo||0", "||3"]


@pytest.fixture(scope="module")
def wide_hosts(
    redis_server: RedisServer, redis_client: redis.Redis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Hosts]:
    """Two hosts of 200 command slots each."""
    factory = WorkerFactory(redis_server.url, redis_client, tmp_path_factory.mktemp("wide"))
    try:
        first = factory.start("wide-1", concurrency=200, wait=False)
        second = factory.start("wide-2", concurrency=200, wait=False)
        first.wait_ready(redis_client)
        second.wait_ready(redis_client)
        yield first, second
    finally:
        factory.cleanup()


class ThreadPeak:
    """The most threads this process had while it ran (sampled every 10 ms)."""

    def __init__(self) -> None:
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._done.wait(0.01):
            self.peak = max(self.peak, me.num_threads())

    def __enter__(self) -> ThreadPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def test_four_hundred_calls_in_flight_on_few_threads(
    wide_hosts: Hosts, redis_server: RedisServer
) -> None:
    async def main() -> tuple[list[int], float, float]:
        async with AsyncFleet(redis_server.url) as fleet:
            started = time.monotonic()
            hosts = ("wide-1", "wide-2")
            results = await asyncio.gather(*(
                fleet.run(f"sleep 1; echo {i}", host=hosts[i % 2], timeout=120)
                for i in range(400)
            ))
            wall = time.monotonic() - started
        slowest = max(r.duration_s for r in results)
        failed = [(r.exit_code, r.error, r.stderr[-300:]) for r in results if r.exit_code != 0]
        assert not failed, f"{len(failed)} calls failed: {failed[:3]}"
        return [int(r.stdout) for r in results], wall, slowest

    with ThreadPeak() as threads:
        outputs, wall, slowest = asyncio.run(main())
    print(f"\n400 x `sleep 1` over 2 hosts x 200 slots: wall {wall:.2f}s, slowest call "
          f"{slowest:.2f}s on its worker, peak threads of this process {threads.peak}")
    assert outputs == list(range(400))
    assert threads.peak <= 32
    # 68 s with a thread per call (6 at a time); what this shows is the threads, not the
    # seconds: a loaded two-core machine took 15.3 s once workspaces had layers.
    assert wall < 30.0


def test_in_flight_limit_is_kept(two_hosts: Hosts, redis_server: RedisServer) -> None:
    async def main() -> int:
        peak = 0
        async with AsyncFleet(redis_server.url, max_in_flight=2) as fleet:
            async def sample() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, fleet.in_flight)
                    await asyncio.sleep(0.005)

            sampler = asyncio.create_task(sample())
            results = await asyncio.gather(*(fleet.run("sleep 0.3") for _ in range(6)))
            sampler.cancel()
            assert all(r.exit_code == 0 for r in results)
        return peak

    assert asyncio.run(main()) == 2


def test_cancelling_the_awaiting_task_cancels_the_call(
    two_hosts: Hosts, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    async def main() -> None:
        async with AsyncFleet(redis_server.url) as fleet:
            call = asyncio.create_task(fleet.run("sleep 30", host="alpha", call_id="c-atask"))
            for _ in range(1000):
                if redis_client.hget("bashfleet:call:c-atask", "state") == "running":
                    break
                await asyncio.sleep(0.01)
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
        # Leaving the block waited for the cancel to be sent.

    started = time.monotonic()
    asyncio.run(main())
    wait_for(lambda: redis_client.hget("bashfleet:call:c-atask", "state") == "cancelled", 15,
             "the call to end cancelled")
    assert time.monotonic() - started < 15
    assert not procs.find_call_processes(None, "c-atask")


def test_signed_calls_and_control(
    keyed: WorkerProcess, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> tuple[str | None, bool | None]:
        async with AsyncFleet(redis_server.url) as fleet:
            try:
                result = await fleet.run("sleep 30", host=SIGNED_HOST, mode="background")
            except CallNotRun as refused:
                return refused.kind, None
            assert result.job is not None
            running = (await fleet.check(result.job.id)).running
            await fleet.kill(result.job.id)
            return None, running

    monkeypatch.setenv("BASHFLEET_SIGNING_KEY", KEY)
    assert asyncio.run(main()) == (None, True)
    monkeypatch.delenv("BASHFLEET_SIGNING_KEY")
    assert asyncio.run(main()) == ("unauthorized", None)

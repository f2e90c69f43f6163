"""Job events through the real fleet: `bashfleet events` and `bashfleet wait` in other
processes, `Fleet.wait` / `AsyncFleet.wait`, one `ended` event per job however many
see its end, and `wait` / `events` across a Redis restart."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import cast

import redis

from client import AsyncFleet, Fleet, WaitTimeout
from client._core.events import parse_entry
from client.records import last_seq
from client.redis_server import RedisServer
from worker.wire import names
from worker.wire.events import JobEvent

from .conftest import WorkerFactory, WorkerProcess, wait_for

Hosts = tuple[WorkerProcess, WorkerProcess]


def _cli(url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "BASHFLEET_REDIS_URL": url}  # the suite's key and state dir
    return subprocess.Popen(
        [sys.executable, "-m", "client.cli", *args], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running after {timeout}s: {out!r} {err!r}") from None
    return proc.returncode, out, err


def _stream_events(client: redis.Redis, job_id: str) -> list[JobEvent]:
    entries = cast("list[tuple[str, dict[str, str]]]", client.xrange(names.EVENTS_KEY, "-", "+"))
    found = (parse_entry(i, f) for i, f in entries)
    return [e for e in found if e is not None and e.job_id == job_id]


def test_events_and_wait_from_other_processes(
    two_hosts: Hosts, fleet: Fleet, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    since = last_seq(redis_client)
    agent = f"a17-{uuid.uuid4().hex[:8]}"  # jobs of other tests have tags too
    listener = _cli(redis_server.url, "events", "--json", "--count", "2", "--since", since,
                    "--tag", f"agent={agent}")
    other = fleet.run("sleep 30", host="alpha", mode="background", tags={"agent": "a9"})
    started = fleet.run("sleep 1; exit 3", host="beta", mode="background",
                        tags={"agent": agent})
    assert started.job is not None and other.job is not None
    job = started.job.id
    waiter = _cli(redis_server.url, "wait", job)
    timed_out = _cli(redis_server.url, "wait", other.job.id, "--timeout", "0.5")

    code, out, err = _finish(waiter)
    assert code == 3, err
    assert f"[job {job} on beta: exited with code 3 after" in err
    code, out, err = _finish(listener)
    assert code == 0, err
    seen = [JobEvent.model_validate_json(line) for line in out.splitlines()]
    assert [(e.kind, e.job_id, e.host) for e in seen] == [("started", job, "beta"),
                                                         ("ended", job, "beta")]
    assert seen[1].exit_code == 3 and seen[1].tags == {"agent": agent}
    assert seen[1].duration_s is not None and 0.9 <= seen[1].duration_s < 10
    assert seen[1].output_path == started.job.output_path
    assert _finish(timed_out)[0] == 124
    # A check of the ended job publishes its end again: still one `ended` event.
    assert fleet.check(job).exit_code == 3
    assert [e.kind for e in _stream_events(redis_client, job)] == ["started", "ended"]
    # ps by tag.
    listed = _cli(redis_server.url, "ps", "--json", "--tag", f"agent={agent}")
    code, out, err = _finish(listed)
    assert code == 0, err
    assert [row["id"] for row in json.loads(out)] == [job]
    fleet.kill(other.job.id)


def test_wait_and_async_wait(two_hosts: Hosts, fleet: Fleet, redis_server: RedisServer) -> None:
    started = fleet.run("sleep 0.5; exit 5", host="alpha", mode="background")
    assert started.job is not None
    view = fleet.wait(started.call_id, timeout=30)  # the call that started it works too
    assert (view.id, view.state, view.exit_code) == (started.job.id, "ended", 5)
    assert fleet.wait(started.job.id, timeout=0.1).exit_code == 5  # ended: at once

    async def main() -> None:
        async with AsyncFleet(redis_server.url) as afleet:
            job = (await afleet.run("sleep 60", host="beta", mode="background")).job
            assert job is not None
            try:
                await afleet.wait(job.id, timeout=0.5)
                raise AssertionError("wait did not time out")
            except WaitTimeout as exc:
                assert exc.id == job.id
            waiting = asyncio.create_task(afleet.wait(job.id, timeout=30))
            stream = afleet.events(kinds=("ended",), host="beta")
            heard = asyncio.create_task(anext(stream))
            await asyncio.sleep(0.3)  # both listening
            await afleet.kill(job.id)
            ended = await waiting
            assert ended.state == "ended" and ended.signal is not None
            event = await asyncio.wait_for(heard, 30)
            assert (event.job_id, event.kind) == (job.id, "ended")
            await stream.aclose()

    asyncio.run(main())


def test_wait_and_events_across_a_redis_restart(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", password="events-restart")
    server.start()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    factory = WorkerFactory(server.url, client, tmp_path)
    fleet = Fleet(server.url)
    try:
        factory.start("phoenix")
        job = fleet.run("sleep 3; exit 7", host="phoenix", mode="background").job
        assert job is not None
        since = last_seq(client)
        results: dict[str, object] = {}

        def wait() -> None:
            with Fleet(server.url) as other:
                results["view"] = other.wait(job.id, timeout=90)

        def listen() -> None:
            with Fleet(server.url) as other:
                for event in other.events(since=since):
                    if event.kind == "ended":
                        results["event"] = event
                        return

        threads = [threading.Thread(target=wait), threading.Thread(target=listen)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # both subscribed
        server.stop()  # the job ends while Redis is away
        time.sleep(4)
        server.start()  # same data (append-only file)
        for thread in threads:
            thread.join(60)
        assert not any(t.is_alive() for t in threads)
        view, event = results["view"], results["event"]
        assert getattr(view, "exit_code", None) == 7
        assert isinstance(event, JobEvent) and (event.job_id, event.exit_code) == (job.id, 7)
        wait_for(lambda: fleet.hosts()[0].alive, 30, "the worker back")
    finally:
        fleet.close()
        factory.cleanup()
        client.close()
        server.stop()

"""Job events through the real fleet: `bashfleet events` and `bashfleet wait` in other
processes, `Fleet.wait` / `AsyncFleet.wait`, one `ended` event per job however many
see its end, and `wait` / `events` across a Redis restart."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import cast

import redis

from bashfleet.client import AsyncFleet, Fleet, WaitTimeout, records
from bashfleet.client._core.constants import CLOCK_SKEW_S
from bashfleet.client._core.events import parse_entry
from bashfleet.client.local import FleetState, save_state
from bashfleet.client.records import last_seq
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import names
from bashfleet.worker.wire.events import JobEvent

from .conftest import RECORD_KEYS, WorkerFactory, WorkerProcess, wait_for

Hosts = tuple[WorkerProcess, WorkerProcess]


def _cli(url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "BASHFLEET_REDIS_URL": url}  # the suite's key and state dir
    return subprocess.Popen(
        [sys.executable, "-m", "bashfleet.client.cli", *args], env=env, text=True,
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
    found = (parse_entry(i, f, RECORD_KEYS) for i, f in entries)
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


def _wipe(server: RedisServer) -> None:
    """Remove a stopped server's data: it starts again empty (a restart that lost it)."""
    for path in server.data_dir.iterdir():
        if path.name.startswith(("appendonly", "dump")):
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _events_of(out: str) -> list[tuple[str, str]]:
    return [(e.kind, e.job_id) for e in map(JobEvent.model_validate_json, out.splitlines())]


class _Printed:
    """What a listener process prints, line by line, as it prints it."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line)

    def events(self) -> list[tuple[str, str]]:
        """The events printed so far."""
        self._thread.join(0.1)
        return _events_of("".join(self.lines))


def test_events_across_a_redis_restart_that_lost_its_data(tmp_path: Path) -> None:
    """After such a restart the workers publish their jobs again, and `bashfleet events`
    used to print their events again (old ones, out of order, one it had shown). It
    prints each event once, and says once that Redis is away."""
    server = RedisServer(tmp_path / "redis", password="events-wipe")
    server.start()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    factory = WorkerFactory(server.url, client, tmp_path)
    fleet = Fleet(server.url)
    errors = (tmp_path / "listener.err").open("w+")
    listener: subprocess.Popen[str] | None = None
    try:
        factory.start("replayer")
        old = [fleet.run(command, host="replayer", mode="background").job
               for command in ("sleep 120", "true")]
        assert all(job is not None for job in old)
        past = time.time() + CLOCK_SKEW_S + 1
        wait_for(lambda: time.time() > past, CLOCK_SKEW_S + 5, "the old jobs to be the past")
        listener = subprocess.Popen(
            [sys.executable, "-m", "bashfleet.client.cli", "events", "--json", "--count", "2",
             "--since", last_seq(client)],
            env={**os.environ, "BASHFLEET_REDIS_URL": server.url}, text=True,
            stdout=subprocess.PIPE, stderr=errors,
        )
        printed = _Printed(listener)
        shown = fleet.run("sleep 120", host="replayer", mode="background").job
        assert shown is not None
        wait_for(lambda: printed.events() == [("started", shown.id)], 30, "the job's start")
        server.stop()
        _wipe(server)
        server.start()
        # The worker finds its host record gone and publishes every job again.
        wait_for(lambda: _stream_events(client, shown.id), 60, "the jobs published again")
        wait_for(lambda: records.host_alive_token(client, "replayer"), 30, "the worker back")
        fleet.kill(shown.id)
        assert listener.wait(60) == 0
        assert printed.events() == [("started", shown.id), ("ended", shown.id)]
        errors.seek(0)
        said = errors.read()
        assert said.count("unreachable") == 1, said
    finally:
        if listener is not None and listener.poll() is None:
            listener.kill()
            listener.wait()
        errors.close()
        fleet.close()
        factory.cleanup()
        client.close()
        server.stop()


def test_events_pick_up_a_local_fleet_brought_down_and_up(tmp_path: Path) -> None:
    """`bashfleet events` started before `down` / `up` used to hang silently for ever on
    the old fleet's address. It keeps trying, says so once, and hears the new fleet
    (found, as at its start, through the local fleet's state)."""
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    settings = Settings(state_dir=state_dir)
    first = RedisServer(tmp_path / "redis-1", password="fleet-one")
    second = RedisServer(tmp_path / "redis-2", password="fleet-two")
    first.start()
    save_state(FleetState(redis_url=first.url, redis_owned=True), settings)
    env = {k: v for k, v in os.environ.items() if k != "BASHFLEET_REDIS_URL"}
    env["BASHFLEET_STATE_DIR"] = str(state_dir)
    tag = f"phoenix={uuid.uuid4().hex[:8]}"
    listener = subprocess.Popen(
        [sys.executable, "-m", "bashfleet.client.cli",
         "events", "--json", "--count", "1", "--tag", tag],
        env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    factories: list[WorkerFactory] = []
    clients: list[redis.Redis] = []
    try:
        one = redis.Redis.from_url(first.url, decode_responses=True)
        clients.append(one)
        wait_for(lambda: int(one.pubsub_numsub(names.EVENTS_CHANNEL)[0][1]) > 0, 30,
                 "the listener to subscribe")
        first.stop()  # `bashfleet down`
        second.start()  # `bashfleet up`: another Redis, another port
        save_state(FleetState(redis_url=second.url, redis_owned=True), settings)
        two = redis.Redis.from_url(second.url, decode_responses=True)
        clients.append(two)
        factories.append(WorkerFactory(second.url, two, tmp_path / "fleet-2"))
        factories[0].start("reborn")
        wait_for(lambda: int(two.pubsub_numsub(names.EVENTS_CHANNEL)[0][1]) > 0, 30,
                 "the listener to find the new fleet")
        with Fleet(second.url) as fleet:
            job = fleet.run("true", host="reborn", mode="background",
                            tags=dict([tag.split("=")])).job
        assert job is not None
        code, out, err = _finish(listener, 60)
        assert code == 0, err
        assert _events_of(out) == [("started", job.id)]
        assert err.count("unreachable") == 1, err
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()
        for factory in factories:
            factory.cleanup()
        for each in clients:
            each.close()
        second.stop()
        first.stop()

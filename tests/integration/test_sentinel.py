"""Redis Sentinel: a primary, a replica and three sentinels, real processes on loopback;
workers, clients and Flower reach the primary through `sentinel://`, and keep working
when it is killed under load: calls in flight complete or fail with a clear error, none
runs twice, jobs stay checkable and killable, new calls go through within seconds."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from bashfleet.client import AsyncFleet, BashfleetError, Fleet
from bashfleet.client.redis_server import RedisServer, find_redis_server, free_port
from bashfleet.worker.fleet.connect import redis_client
from bashfleet.worker.wire.models import CallResult

from .conftest import WorkerFactory, WorkerProcess, end_group, wait_for
from .engine_helpers import give_to_run_user

MASTER = "bashfleet-primary"
PASSWORD = "sentinel-test-secret"


class ReplicaServer(RedisServer):
    """A redis-server that replicates `primary_port` (and could be promoted)."""

    def __init__(self, data_dir: Path, primary_port: int) -> None:
        super().__init__(data_dir, password=PASSWORD)
        self.primary_port = primary_port

    def config_lines(self) -> list[str]:
        return [*super().config_lines(), f"replicaof 127.0.0.1 {self.primary_port}",
                f"masterauth {PASSWORD}"]


class Sentinel:
    """One `redis-server --sentinel` process on 127.0.0.1, owned by this object."""

    def __init__(self, data_dir: Path, primary_port: int) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.primary_port = primary_port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "sentinel.conf"  # sentinel rewrites it: its own file
        conf.write_text("\n".join([
            f"port {self.port}", "bind 127.0.0.1", "daemonize no", f"dir {self.data_dir}",
            f"logfile {self.data_dir / 'sentinel.log'}",
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary_port} 2",
            f"sentinel auth-pass {MASTER} {PASSWORD}",
            f"sentinel down-after-milliseconds {MASTER} 1000",
            f"sentinel failover-timeout {MASTER} 10000",
            f"sentinel parallel-syncs {MASTER} 1",
        ]) + "\n")
        self.proc = subprocess.Popen(
            [find_redis_server(), str(conf), "--sentinel"], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=2)

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Cluster:
    """The Redis side of the test: who is primary, the URL every process uses."""

    primary: RedisServer
    replica: ReplicaServer
    sentinels: list[Sentinel]
    url: str
    workers: WorkerFactory
    worker: WorkerProcess


def _sentinels_ready(sentinels: list[Sentinel]) -> bool:
    for sentinel in sentinels:
        try:
            master = dict(sentinel.client().sentinel_master(MASTER))  # type: ignore[arg-type]
        except redis.RedisError:
            return False
        if int(master.get("num-other-sentinels", 0)) < 2 or int(master.get("num-slaves", 0)) < 1:
            return False
    return True


def _replicating(replica: ReplicaServer) -> bool:
    info = redis.Redis(port=replica.port, password=PASSWORD).info("replication")
    return info.get("master_link_status") == "up"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("sentinel")
    primary = RedisServer(base / "primary", password=PASSWORD)
    primary.start()
    replica = ReplicaServer(base / "replica", primary.port)
    sentinels = [Sentinel(base / f"sentinel-{i}", primary.port) for i in range(3)]
    client: redis.Redis | None = None
    factory: WorkerFactory | None = None
    try:
        replica.start()
        wait_for(lambda: _replicating(replica), 30, "the replica to sync")
        for sentinel in sentinels:
            sentinel.start()
        wait_for(lambda: _sentinels_ready(sentinels), 60, "the sentinels to find each other",
                 interval=0.2)
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in sentinels)
        url = f"sentinel://:{PASSWORD}@{hosts}/0?master={MASTER}"
        client = redis_client(url)
        factory = WorkerFactory(url, client, base)
        worker = factory.start("sentinel-host", concurrency=8)
        yield Cluster(primary, replica, sentinels, url, factory, worker)
    finally:
        if factory is not None:
            factory.cleanup()
        if client is not None:
            client.close()
        for sentinel in sentinels:
            sentinel.stop()
        replica.stop()
        primary.stop()


def _flower_workers(port: int) -> set[str] | None:
    token = base64.b64encode(b"u:p").decode()
    request = urllib.request.Request(  # only the local Flower's http:// URL
        f"http://127.0.0.1:{port}/api/workers?status=1",
        headers={"Authorization": f"Basic {token}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            return set(json.loads(response.read())) or None
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return None


def test_flower_through_sentinel(cluster: Cluster, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
    env["BASHFLEET_REDIS_URL"] = cluster.url
    with open(tmp_path / "flower.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bashfleet.worker.fleet.app", "flower",
             "--address=127.0.0.1", f"--port={port}", "--basic-auth=u:p"],
            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # The names bashfleet.worker.fleet.flower gives the two consumers.
        wanted = {"calls@sentinel-host", "control@sentinel-host"}
        # Flower learns each consumer from its own heartbeat event: wait for both.
        wait_for(lambda: wanted <= (_flower_workers(port) or set()), 60,
                 "Flower to list the host", interval=0.5)
    finally:
        end_group(proc)


@dataclass
class Outcome:
    """One call of the load: when it was sent, and how it ended."""

    call_id: str
    sent_at: float
    ended_at: float
    ok: bool
    error: str | None


def _ledger_command(call_id: str, ledger: Path) -> str:
    """A load call's command: its id into the ledger (what ran, how often), then a pause.
    The call runs in the ledger's directory (a project the host allows: its workspace),
    where it can write and the test reads."""
    return f"echo {call_id} >> {ledger}; sleep 0.2"


def _judged(result: CallResult) -> tuple[bool, str | None]:
    """(ran fine, the error's message) of a load call's result."""
    error = result.error.message if result.error else None
    return result.exit_code == 0 and result.error is None, error


async def _load(url: str, ledger: Path, stop_at: float) -> list[Outcome]:
    """Calls, 12 in flight at a time, until `stop_at`: each appends its id to `ledger`."""
    outcomes: list[Outcome] = []
    async with AsyncFleet(url) as fleet:
        async def caller(lane: int) -> None:
            number = 0
            while time.monotonic() < stop_at:
                number += 1
                call_id = f"c-sentinel-{lane}-{number}"
                sent = time.monotonic()
                try:
                    ok, error = _judged(await fleet.run(
                        _ledger_command(call_id, ledger), host="sentinel-host", call_id=call_id,
                        cwd=str(ledger.parent),
                    ))
                except BashfleetError as exc:
                    ok, error = False, f"{type(exc).__name__}: {exc}"
                outcomes.append(Outcome(call_id, sent, time.monotonic(), ok, error))
                if not ok:
                    await asyncio.sleep(0.2)

        await asyncio.gather(*(caller(lane) for lane in range(12)))
    return outcomes


def _sync_load(url: str, ledger: Path, stop_at: float, outcomes: list[Outcome]) -> None:
    """The same with the blocking client, one call at a time."""
    with Fleet(url) as fleet:
        number = 0
        while time.monotonic() < stop_at:
            number += 1
            call_id = f"c-sentinel-sync-{number}"
            sent = time.monotonic()
            try:
                ok, error = _judged(fleet.run(
                    _ledger_command(call_id, ledger), host="sentinel-host", call_id=call_id,
                    cwd=str(ledger.parent),
                ))
            except BashfleetError as exc:
                ok, error = False, f"{type(exc).__name__}: {exc}"
            outcomes.append(Outcome(call_id, sent, time.monotonic(), ok, error))
            if not ok:
                time.sleep(0.2)  # pacing retries of a load generator


def test_failover_under_load(cluster: Cluster) -> None:
    fleet = Fleet(cluster.url)
    try:
        job = fleet.run("sleep 300", host="sentinel-host", mode="background").job
        assert job is not None
        ledger = cluster.worker.project() / "ran.log"
        ledger.touch()
        give_to_run_user(ledger)  # the calls append to it, as the project's run user
        started = time.monotonic()
        killed_at = started + 3.0

        blocking: list[Outcome] = []
        sync_caller = threading.Thread(
            target=_sync_load, args=(cluster.url, ledger, started + 25.0, blocking)
        )

        async def main() -> list[Outcome]:
            load = asyncio.create_task(_load(cluster.url, ledger, started + 25.0))
            await asyncio.sleep(killed_at - time.monotonic())
            assert cluster.primary.pid is not None
            os.kill(cluster.primary.pid, signal.SIGKILL)  # the primary dies, mid-load
            return await load

        sync_caller.start()
        outcomes = asyncio.run(main())
        sync_caller.join(60)
        assert not sync_caller.is_alive()
        outcomes += blocking
        ran = Counter(ledger.read_text().split())
        twice = [call for call, count in ran.items() if count > 1]
        failed = [o for o in outcomes if not o.ok]
        after = [o for o in outcomes if o.ok and o.sent_at > killed_at]
        back_after = min((o.ended_at for o in after), default=float("inf")) - killed_at
        print(f"\nfailover: {len(outcomes)} calls, {len(outcomes) - len(failed)} ok, "
              f"{len(failed)} failed with an error, {len(twice)} ran twice; first call sent "
              f"after the kill answered {back_after:.1f}s after it")
        for outcome in failed[:5]:
            print(f"  {outcome.call_id}: {outcome.error}")
        assert not twice, f"ran twice: {twice}"
        assert all(o.error for o in failed)  # every failure says what happened
        assert all(ran[o.call_id] == 1 for o in outcomes if o.ok)
        assert back_after < 20.0
        assert len(after) > 10
        assert any(o.ok and o.call_id.startswith("c-sentinel-sync") and o.sent_at > killed_at
                   for o in outcomes)
        # The job of the dead primary's time: still checkable and killable.
        assert fleet.check(job.id).running
        assert fleet.kill(job.id).signal is not None
        assert fleet.run("echo after", host="sentinel-host").stdout == "after\n"
    finally:
        fleet.close()
        cluster.primary.stop()  # reaped (it was SIGKILLed)


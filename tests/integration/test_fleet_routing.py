"""Routing: calls reach the asked host, jobs are reached from any client, errors are typed."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import uuid
from typing import Any

import pytest
import redis

from client import (
    AsyncFleet,
    CallRejected,
    Fleet,
    FleetUnavailable,
    HostUnavailable,
    UnknownJob,
    records,
)
from client.redis_server import RedisServer, free_port
from worker.engine import procs
from worker.wire.models import CheckResult, Policy, TailLines

from .conftest import WorkerProcess, wait_for

Hosts = tuple[WorkerProcess, WorkerProcess]


def test_call_runs_on_the_asked_host(two_hosts: Hosts, fleet: Fleet) -> None:
    # Output longer than the policy shows is spilled on the host that ran it.
    policy = Policy(truncation=TailLines(max_lines=5))
    for worker in two_hosts:
        result = fleet.run("seq 1000", host=worker.host, policy=policy)
        assert result.host == worker.host
        assert result.exit_code == 0
        assert result.stdout.splitlines() == [str(n) for n in range(996, 1001)]
        assert result.spill is not None and result.spill.stdout_path is not None
        assert result.spill.host == worker.host
        assert result.spill.stdout_path.startswith(str(worker.state_dir))
        # The full output is read back from the host that holds it.
        chunk = fleet.read_output(result.call_id, limit=20)
        assert chunk.text.startswith("1\n2\n3\n")
        assert chunk.path == result.spill.stdout_path and not chunk.eof


def test_call_without_host_runs_on_a_live_host(two_hosts: Hosts, fleet: Fleet) -> None:
    result = fleet.run("echo anywhere")
    assert result.stdout == "anywhere\n"
    # Any live host of the session's Redis (other modules' hosts may share it).
    live = {info.host for info in fleet.hosts() if info.alive}
    assert {w.host for w in two_hosts} <= live
    assert result.host in live


def test_call_to_a_pool_runs_on_a_labelled_host(two_hosts: Hosts, fleet: Fleet) -> None:
    assert fleet.run("true", label="gpu").host == "beta"
    with pytest.raises(HostUnavailable):
        fleet.run("true", label="tpu")


def test_session_pins_its_host(two_hosts: Hosts, fleet: Fleet) -> None:
    session = f"s{uuid.uuid4().hex[:8]}"
    first = fleet.run("true", session=session)
    assert all(fleet.run("true", session=session).host == first.host for _ in range(3))


def test_background_job_is_reached_from_another_client(
    two_hosts: Hosts, redis_server: RedisServer
) -> None:
    starter, other = Fleet(redis_server.url), Fleet(redis_server.url)
    try:
        started = starter.run(
            "for i in 1 2 3; do echo line$i; done; sleep 60", host="beta", mode="background"
        )
        assert started.backgrounded and started.job is not None
        job = started.job
        assert job.host == "beta" and job.output_path.startswith(str(two_hosts[1].state_dir))

        def all_lines() -> CheckResult | None:
            checked = other.check(job.id, offset=0)
            return checked if "line3" in checked.output else None

        first = wait_for(all_lines, 10, "the job's output")
        assert first.host == "beta" and first.running
        # "Since the last check" is kept in Redis: shared by every client.
        assert starter.check(job.id).output == ""
        # A call id reaches the job it started; a policy cuts what a check shows.
        cut = other.check(
            started.call_id, offset=0, truncation=TailLines(max_lines=1)
        )
        assert cut.id == job.id and cut.output == "line3\n"
        assert cut.output_truncation is not None and cut.output_truncation.total_lines == 3

        listed = {view.id: view for view in starter.jobs(host="beta")}
        assert listed[job.id].state == "running" and listed[job.id].running
        assert job.id in {view.id for view in other.jobs()}

        killed = other.kill(job.id)
        assert killed.host == "beta" and not killed.running
        assert killed.signal is not None or killed.exit_code is not None
        after = starter.check(job.id)
        assert not after.running
        assert {view.id: view for view in starter.jobs("beta")}[job.id].state == "ended"
    finally:
        starter.close()
        other.close()


def test_unknown_ids_raise_unknown_job(two_hosts: Hosts, fleet: Fleet) -> None:
    for call in (
        lambda: fleet.check("jnosuchjob0000"),
        lambda: fleet.kill("jnosuchjob0000"),
        lambda: fleet.read_output("cnosuchcall"),
        lambda: fleet.cancel("cnosuchcall"),
        lambda: fleet.check("../../etc/passwd"),
    ):
        with pytest.raises(UnknownJob):
            call()


def test_dead_or_unknown_host_raises_before_sending(two_hosts: Hosts, fleet: Fleet) -> None:
    started = time.monotonic()
    with pytest.raises(HostUnavailable, match="nosuchhost"):
        fleet.run("touch /tmp/should-never-exist", host="nosuchhost")
    assert time.monotonic() - started < 1.0
    with pytest.raises(CallRejected):
        fleet.run("true", host="bad host!")


def test_invalid_calls_are_rejected(two_hosts: Hosts, fleet: Fleet) -> None:
    cases: list[dict[str, Any]] = [
        {"command": ""}, {"command": "a\x00b"}, {"command": "true", "timeout": -1},
        {"command": "true", "mode": "weird"}, {"command": "true", "env": {"A=B": "c"}},
    ]
    for kwargs in cases:
        command = str(kwargs.pop("command"))
        with pytest.raises(CallRejected):
            fleet.run(command, **kwargs)


def test_unreachable_redis_is_fleet_unavailable() -> None:
    url = f"redis://:s3cretpass@127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    with pytest.raises(FleetUnavailable) as info:
        Fleet(url).run("true")
    assert time.monotonic() - started < 3.0
    assert "s3cretpass" not in str(info.value)
    assert "127.0.0.1" in str(info.value)


def test_hosts_lists_the_fleet(two_hosts: Hosts, fleet: Fleet) -> None:
    infos = {info.host: info for info in fleet.hosts()}
    for worker in two_hosts:
        info = infos[worker.host]
        assert info.alive and info.ready and info.slots == 2 and info.pid == worker.pid
    assert infos["beta"].labels == ("gpu",)


def test_cancel_a_running_call(two_hosts: Hosts, fleet: Fleet, redis_client: redis.Redis) -> None:
    call_id = f"c{uuid.uuid4().hex[:12]}"
    results: list[object] = []
    runner = threading.Thread(
        target=lambda: results.append(fleet.run("sleep 30", host="alpha", call_id=call_id))
    )
    runner.start()
    wait_for(lambda: records.call_record(redis_client, call_id).get("pgid"), 10, "the spawn")
    started = time.monotonic()
    assert fleet.cancel(call_id)
    runner.join(10)
    assert not runner.is_alive()
    result = results[0]
    assert time.monotonic() - started < 5
    assert getattr(result, "signal", None) is not None
    error = getattr(result, "error", None)
    assert error is not None and "cancelled" in error.message
    assert records.call_record(redis_client, call_id)["state"] == "cancelled"
    assert not fleet.cancel(call_id)  # ended already


def _append_run(results: list[object], fleet: Fleet, command: str, host: str,
                call_id: str) -> None:
    results.append(fleet.run(command, host=host, call_id=call_id))


def test_cancel_as_soon_as_a_call_is_claimed(
    two_hosts: Hosts, fleet: Fleet, redis_client: redis.Redis
) -> None:
    """Cancelled between its claim and its process showing in Redis (a canceller may
    find no process yet): the worker sees the cancel at its first wake-up and kills."""
    def claimed(call_id: str) -> bool:
        return records.call_record(redis_client, call_id).get("state") == "running"

    for _ in range(5):
        call_id = f"c{uuid.uuid4().hex[:12]}"
        results: list[object] = []
        runner = threading.Thread(
            target=_append_run, args=(results, fleet, "sleep 30", "alpha", call_id)
        )
        runner.start()
        wait_for(functools.partial(claimed, call_id), 10, "the claim", interval=0.001)
        started = time.monotonic()
        assert fleet.cancel(call_id)
        runner.join(10)
        assert not runner.is_alive()
        assert time.monotonic() - started < 5
        error = getattr(results[0], "error", None)
        assert error is not None and "cancelled" in error.message
        assert records.call_record(redis_client, call_id)["state"] == "cancelled"
        assert not procs.find_call_processes(None, call_id)


def test_async_fleet(two_hosts: Hosts, redis_server: RedisServer) -> None:
    async def main() -> list[str]:
        async with AsyncFleet(redis_server.url) as fleet:
            results = await asyncio.gather(
                fleet.run("echo one", host="alpha"), fleet.run("echo two", host="beta")
            )
            hosts = await fleet.hosts()
            assert {h.host for h in hosts} >= {"alpha", "beta"}
            return [f"{r.host}:{r.stdout.strip()}" for r in results]

    assert asyncio.run(main()) == ["alpha:one", "beta:two"]


def test_worker_settings_are_not_redacted_from_output(two_hosts: Hosts, fleet: Fleet) -> None:
    # The worker's own BASHFLEET_* settings are scrubbed from commands; plain ones (host
    # id, state directory) must not be treated as secrets and redacted from output.
    alpha = two_hosts[0]
    command = f"echo alpha {alpha.state_dir}; env | cut -d= -f1 | grep ^BASHFLEET_"
    result = fleet.run(command, host="alpha")
    assert result.stdout == f"alpha {alpha.state_dir}\nBASHFLEET_CALL_MARKER\n"

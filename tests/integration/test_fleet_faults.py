"""Faults: a worker that dies mid-call, restarts, a duplicate host id, a crashed consumer."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import redis

from bashfleet.client import Fleet, FleetUnavailable, HostUnavailable, WorkerLost, records
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import procs
from bashfleet.worker.fleet import registry
from bashfleet.worker.wire import names
from bashfleet.worker.wire.models import CallResult, JobView

from .conftest import WorkerFactory, WorkerProcess, wait_for

#: A dead worker must show within seconds: heartbeat TTL plus the client's polling.
LOST_WITHIN_S = names.ALIVE_TTL_S + 3.0


class Pending:
    """A `Fleet.run` in a thread: its result or its error, and when it came."""

    def __init__(self, fleet: Fleet, command: str, host: str, call_id: str,
                 cwd: Path | None = None) -> None:
        self.result: CallResult | None = None
        self.error: BaseException | None = None
        self.finished_at: float | None = None
        self._thread = threading.Thread(target=self._run,
                                        args=(fleet, command, host, call_id, cwd))
        self._thread.start()

    def _run(self, fleet: Fleet, command: str, host: str, call_id: str,
             cwd: Path | None) -> None:
        try:
            self.result = fleet.run(command, host=host, call_id=call_id,
                                    cwd=str(cwd) if cwd else None)
        except BaseException as exc:
            self.error = exc
        self.finished_at = time.monotonic()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the call did not return"


def _spawned(client: redis.Redis, call_id: str) -> dict[str, str]:
    def spawned() -> dict[str, str] | None:
        record = records.call_record(client, call_id)
        return record if record.get("pgid") else None

    return wait_for(spawned, 15, "the spawn")


def _alive(pid: int) -> bool:
    stat = procs.read_stat(pid)
    return stat is not None and stat.state not in ("Z", "X")


def _gone(marker: str) -> bool:
    return not procs.find_call_processes(None, marker)


def _redis_ports(worker: WorkerProcess) -> set[int]:
    """Local ports of the worker's connections (supervisor and consumers) to Redis."""
    group = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children()]
    return {
        conn.laddr.port for proc in group for conn in proc.net_connections(kind="tcp")
        if conn.raddr and conn.status == psutil.CONN_ESTABLISHED
    }


def _connections_closed(client: redis.Redis, ports: set[int]) -> bool:
    """True once Redis dropped every connection from `ports` (a dead worker's)."""
    return not any(
        int(str(info.get("addr", ":0")).rsplit(":", 1)[1]) in ports
        for info in client.client_list()
    )


def test_worker_killed_mid_call_is_lost_and_never_runs_twice(
    workers: WorkerFactory, fleet: Fleet, redis_client: redis.Redis
) -> None:
    worker = workers.start("gamma")
    # The call's workspace is a project the host allows: what it writes, the test reads.
    project = worker.project()
    target = project / "once.txt"
    call_id = f"cfault{uuid.uuid4().hex[:8]}"
    pending = Pending(fleet, f"sleep 3; echo once >> {target}", "gamma", call_id, project)
    _spawned(redis_client, call_id)
    ports = _redis_ports(worker)

    worker.kill_group()  # the supervisor and both consumers
    killed_at = time.monotonic()
    # Its throwaway workspace ends with the worker process that made it (nobody would
    # ever use it again): the orphaned command goes with it, before it writes.
    wait_for(lambda: _gone(call_id), 10, "the orphaned command to end with its worker")
    # Until Redis has dropped the dead consumer's connection, its pending BRPOP may still
    # take a message (then withdrawn as lost: test_hardening_faults covers that).
    wait_for(lambda: _connections_closed(redis_client, ports), 10, "Redis to drop the worker")
    # A call sent while the host is down (its lock not yet expired) waits in its queue.
    waiting = Pending(fleet, "echo waited", "gamma", f"cwait{uuid.uuid4().hex[:8]}")
    restarted = workers.start("gamma", wait=False)
    pending.join(LOST_WITHIN_S + 5)
    assert isinstance(pending.error, WorkerLost), pending.result
    assert pending.finished_at is not None and pending.finished_at - killed_at < LOST_WITHIN_S
    restarted.wait_ready(redis_client)
    wait_for(lambda: _gone(call_id), 10, "the orphaned command to be killed")
    assert records.call_record(redis_client, call_id)["state"] == "lost"
    lines = target.read_text().splitlines() if target.exists() else []
    assert len(lines) <= 1, "the command ran twice"
    assert lines == [], "the orphan should have ended before it wrote"
    # The restarted worker ran the call that waited, and serves new ones.
    waiting.join(20)
    assert waiting.result is not None and waiting.result.stdout == "waited\n", waiting.error
    assert fleet.run("echo back", host="gamma").stdout == "back\n"
    # The file was there for a call to write: the orphan's line is missing because it
    # never ran, not because it could not write.
    fleet.run(f"echo after >> {target}", host="gamma", cwd=str(project))
    assert target.read_text() == "after\n"


def test_dead_worker_is_noticed_without_a_restart(
    workers: WorkerFactory, fleet: Fleet, redis_client: redis.Redis
) -> None:
    worker = workers.start("epsilon")
    call_id = f"clost{uuid.uuid4().hex[:8]}"
    pending = Pending(fleet, "sleep 60", "epsilon", call_id)
    _spawned(redis_client, call_id)
    worker.kill_group()
    killed_at = time.monotonic()
    pending.join(LOST_WITHIN_S + 5)
    assert isinstance(pending.error, WorkerLost)
    assert pending.finished_at is not None
    lost_after = pending.finished_at - killed_at
    print(f"\nWorkerLost {lost_after:.1f}s after the worker was killed")
    assert lost_after < LOST_WITHIN_S
    # The host is reported dead, calls to it are refused before sending.
    assert not {h.host: h for h in fleet.hosts()}["epsilon"].alive
    with pytest.raises(HostUnavailable):
        fleet.run("true", host="epsilon")
    # The restart ends the orphan.
    workers.start("epsilon")
    wait_for(lambda: _gone(call_id), 10, "the orphaned sleep to be killed")


def test_a_call_sent_on_a_stale_sight_of_a_stopped_host_is_withdrawn_by_the_watch(
    workers: WorkerFactory, fleet: Fleet, redis_client: redis.Redis
) -> None:
    # A send does not look up a host a send found alive within HOST_SEEN_ALIVE_S. Here
    # that window outlasts the host's stop: the next call goes out unchecked, to a host
    # whose lock is gone. The watch must find it (the lock read at its next pass),
    # withdraw it and say so, and the host, back, must not run it.
    worker = workers.start("theta")
    project = worker.project()
    fleet._seen_alive.window_s = 3600.0
    assert fleet.run("true", host="theta").exit_code == 0  # seen alive
    assert worker.stop() == 0
    assert redis_client.get(names.alive_key("theta")) is None  # released: stopped
    marker = project / "ran"
    call_id = f"cstale{uuid.uuid4().hex[:8]}"
    with pytest.raises(WorkerLost, match="no live worker is left in host theta"):
        fleet.run(f"echo ran > {marker}", host="theta", call_id=call_id, cwd=str(project))
    assert records.call_record(redis_client, call_id)["state"] == "abandoned"
    assert redis_client.llen(names.exec_queue("theta")) == 1  # it was sent, unchecked
    workers.start("theta")
    wait_for(lambda: redis_client.llen(names.exec_queue("theta")) == 0, 30,
             "the restarted host to take the message")
    wait_for(lambda: records.stored_reply(redis_client, call_id) is not None, 30,
             "the restarted host to refuse the call")
    assert records.call_record(redis_client, call_id)["state"] == "abandoned"
    assert not marker.exists()


def test_job_that_ends_while_its_worker_is_down_reports_its_exit(
    workers: WorkerFactory, fleet: Fleet, redis_client: redis.Redis
) -> None:
    worker = workers.start("delta")
    short = fleet.run("sleep 1; echo bye; exit 7", host="delta", mode="background").job
    long = fleet.run("sleep 120", host="delta", mode="background").job
    assert short is not None and long is not None
    worker.kill_group()
    # The job's own supervisor records its end, with no worker alive.
    status = Path(workers.state_dir("delta")) / "jobs" / f"{short.id}.status.json"
    wait_for(status.exists, 15, "the short job to end")

    workers.start("delta")
    # Re-adopted from the host's disk: the ended job has its exit code, the live one runs.
    def published() -> dict[str, JobView] | None:
        views = {view.id: view for view in fleet.jobs(host="delta")}
        ended = short.id in views and views[short.id].state == "ended"
        return views if ended else None

    views = wait_for(published, 10, "the restarted worker to publish the jobs")
    assert views[short.id].exit_code == 7
    assert views[long.id].state == "running"
    checked = fleet.check(short.id, offset=0)
    assert not checked.running and checked.exit_code == 7 and "bye" in checked.output
    assert fleet.check(long.id).running
    assert not fleet.kill(long.id).running


def test_second_worker_with_the_same_host_id_refuses(
    two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet
) -> None:
    alpha = two_hosts[0]
    twin = WorkerProcess(
        "alpha", alpha.url, state_dir=alpha.state_dir.parent / "alpha-twin",
        log_dir=alpha.log_path.parent,
    )
    done = subprocess.run(
        twin.args(), env=twin.env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0
    assert "host id 'alpha' is taken" in done.stderr
    assert f"pid {alpha.pid}" in done.stderr
    # The first worker is untouched.
    assert fleet.run("echo still", host="alpha").stdout == "still\n"
    assert {h.host: h for h in fleet.hosts()}["alpha"].pid == alpha.pid


def test_crashed_consumer_is_restarted_and_its_calls_lost(
    workers: WorkerFactory, fleet: Fleet, redis_client: redis.Redis
) -> None:
    workers.start("zeta")
    exec_pid = int(registry.host_record(redis_client, "zeta")["exec_ready"])
    call_id = f"ccrash{uuid.uuid4().hex[:8]}"
    pending = Pending(fleet, "sleep 60", "zeta", call_id)
    _spawned(redis_client, call_id)
    os.kill(exec_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    pending.join(15)
    assert isinstance(pending.error, WorkerLost)
    assert pending.finished_at is not None and pending.finished_at - killed_at < 5
    wait_for(lambda: _gone(call_id), 10, "the call's processes to be killed")
    # The supervisor started a new command consumer.
    def new_consumer() -> bool:
        pid = registry.host_record(redis_client, "zeta").get("exec_ready")
        return bool(pid) and int(pid or 0) != exec_pid

    wait_for(new_consumer, 40, "a new command consumer")
    assert fleet.run("echo again", host="zeta").stdout == "again\n"


def test_fleet_survives_a_redis_restart(tmp_path: Path) -> None:
    # A Redis of its own: this test stops it.
    server = RedisServer(tmp_path / "redis", password="restartpw")
    server.start()
    factory = WorkerFactory(server.url, redis.Redis.from_url(server.url, decode_responses=True),
                            tmp_path)
    fleet = Fleet(server.url)
    try:
        factory.start("eta")
        assert fleet.run("echo before", host="eta").stdout == "before\n"
        port = server.port
        server.stop()
        with pytest.raises(FleetUnavailable) as info:
            fleet.run("true", host="eta")
        assert "restartpw" not in str(info.value)
        server = RedisServer(tmp_path / "redis", port=port, password="restartpw")
        server.start()
        # The worker reconnects (its heartbeat and both consumers); so does the client.
        def answers() -> CallResult | None:
            with contextlib.suppress(FleetUnavailable, HostUnavailable):
                return fleet.run("echo after", host="eta")
            return None

        assert wait_for(answers, 30, "the fleet to work again").stdout == "after\n"
    finally:
        fleet.close()
        factory.cleanup()
        server.stop()


def test_consumers_end_with_their_supervisor(
    workers: WorkerFactory, fleet: Fleet, redis_client: redis.Redis
) -> None:
    worker = workers.start("theta")
    record = registry.host_record(redis_client, "theta")
    consumers = [int(record["exec_ready"]), int(record["ctl_ready"])]
    call_id = f"corphan{uuid.uuid4().hex[:8]}"
    pending = Pending(fleet, "sleep 60", "theta", call_id)
    _spawned(redis_client, call_id)
    os.kill(worker.pid, signal.SIGKILL)  # the supervisor alone
    killed_at = time.monotonic()
    # Its consumers notice, kill the calls they ran (which answer), and exit.
    wait_for(lambda: not any(map(_alive, consumers)), 10, "the consumers to end")
    wait_for(lambda: _gone(call_id), 10, "the call's processes to be killed")
    pending.join(LOST_WITHIN_S + 5)
    assert pending.finished_at is not None and pending.finished_at - killed_at < LOST_WITHIN_S
    if pending.error is None:
        assert pending.result is not None and pending.result.error is not None
        assert "stopped" in pending.result.error.message
        assert pending.result.signal is not None
    else:
        assert isinstance(pending.error, WorkerLost)


def test_run_exits_125_when_its_worker_is_killed(
    workers: WorkerFactory, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """`bashfleet run` whose worker's supervisor is SIGKILLed: the consumers, stopping,
    kill the command and answer it with its SIGTERM, which read as the command's own
    143; the worker was lost (125)."""
    worker = workers.start("iota")
    env = {**os.environ, "BASHFLEET_REDIS_URL": redis_server.url}
    run = subprocess.Popen(
        [sys.executable, "-m", "bashfleet.client.cli",
         "run", "--host", "iota", "echo begun; sleep 60"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        def busy() -> bool:
            info = records.host_info(redis_client, "iota", keys=worker.record_keys())
            return info is not None and info.busy == 1
        wait_for(busy, 20, "the call to run")
        os.kill(worker.pid, signal.SIGKILL)  # the supervisor alone
        _, err = run.communicate(timeout=LOST_WITHIN_S + 15)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
    assert run.returncode == 125, err
    # Answered by the stopping consumer, or found lost by the client's watch first.
    assert ("bashfleet: worker_lost: the worker was stopped" in err
            or "the command was not run again" in err), err
    # Gone for the next tests too: a host whose heartbeat has not expired yet still looks
    # alive, and a workspace could be placed on it.
    wait_for(lambda: "iota" not in records.live_hosts(redis_client), LOST_WITHIN_S + 5,
             "the host to be seen dead")

"""50 rounds of SIGKILL on a worker at random points of a call.

Each round sends `sleep R; echo ROUND >> FILE` and SIGKILLs, after a random delay, either
the host's command consumer (its supervisor restarts it) or, every fifth round, the
whole worker (supervisor and consumers; the test restarts it). Figures printed: rounds,
results and worker-lost errors with the slowest answer, duplicated lines in FILE
(commands run twice), and processes of killed calls alive after the restart.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from bashfleet.client import Fleet, WorkerLost, records
from bashfleet.worker.engine import procs
from bashfleet.worker.engine.environment import MARKER_VAR
from bashfleet.worker.fleet import registry
from bashfleet.worker.wire import names

from .conftest import WorkerFactory, WorkerProcess, wait_for
from .engine_helpers import give_to_run_user, keepers_under
from .test_fleet_faults import LOST_WITHIN_S, Pending

ROUNDS = int(os.environ.get("BASHFLEET_FAULT_ROUNDS", "50"))
HOST = "kappa"


def _exec_pid(client: redis.Redis) -> int | None:
    pid = registry.host_record(client, HOST).get("exec_ready")
    return int(pid) if pid else None


def _consumer_back(client: redis.Redis, old: int | None) -> int | None:
    pid = _exec_pid(client)
    return pid if pid and pid != old else None


def _kill_consumer(client: redis.Redis) -> None:
    pid = _exec_pid(client)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # a consumer this test's worker started
    wait_for(lambda: _consumer_back(client, pid), 60, "the restarted command consumer")


def _gone(call_id: str) -> Callable[[], bool]:
    return lambda: not procs.find_call_processes(None, call_id)


def _kill_worker(workers: WorkerFactory, worker: WorkerProcess) -> WorkerProcess:
    worker.kill_group()
    return workers.start(HOST, env=worker.extra_env)


@pytest.mark.timeout(300)  # fifty kills and restarts: ~100 s on an idle two-core machine
def test_fifty_rounds_of_sigkill(
    workers: WorkerFactory, fleet: Fleet, redis_client: redis.Redis, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rng = random.Random(20261121)
    # The commands append to a file in a root every call of the host may write (each
    # call runs in a throwaway workspace of its own, gone with it).
    shared = tmp_path / "shared"
    shared.mkdir()
    give_to_run_user(shared)
    env = {"BASHFLEET_SANDBOX_WRITABLE": str(shared)}
    worker = workers.start(HOST, env=env)
    target = shared / "ran.txt"
    completed: list[int] = []
    outcomes: Counter[str] = Counter()
    slowest = 0.0
    survivors = 0
    markers: list[str] = []
    for round_no in range(ROUNDS):
        call_id = f"f{round_no}-{uuid.uuid4().hex[:8]}"
        markers.append(call_id)
        command = f"sleep {rng.uniform(0, 0.6):.2f}; echo {round_no} >> {target}"
        pending = Pending(fleet, command, HOST, call_id)
        time.sleep(rng.uniform(0, 0.8))  # the random point of the call at which to kill
        killed_at = time.monotonic()
        if round_no % 5 == 4:
            worker = _kill_worker(workers, worker)
        else:
            _kill_consumer(redis_client)
        try:
            pending.join(LOST_WITHIN_S + 60)
        except AssertionError:
            record = records.call_record(redis_client, call_id)
            raise AssertionError(f"round {round_no}: no answer; call record {record}") from None
        assert pending.finished_at is not None
        if pending.result is not None:
            outcomes["result"] += 1
            if pending.result.exit_code == 0:
                completed.append(round_no)
        else:
            assert isinstance(pending.error, WorkerLost), pending.error
            outcomes["worker lost"] += 1
            slowest = max(slowest, pending.finished_at - killed_at)
        # Once the host serves again, nothing of the killed call may be running.
        wait_for(_gone(call_id), 15, "the killed call's processes to be gone")
    survivors = sum(len(procs.find_call_processes(None, m)) for m in markers)
    lines = target.read_text().split() if target.exists() else []
    duplicates = sum(count - 1 for count in Counter(lines).values() if count > 1)
    # The file is where the commands wrote: every round that returned a success did.
    assert completed, "some rounds ran to their end"
    assert {str(n) for n in completed} <= set(lines)
    with capsys.disabled():
        print(
            f"\nfault injection: {ROUNDS} SIGKILL rounds, {outcomes['result']} results, "
            f"{outcomes['worker lost']} worker-lost errors (slowest {slowest:.1f}s after "
            f"the kill), {duplicates} commands run twice, {survivors} survivors"
        )
    assert sum(outcomes.values()) == ROUNDS
    assert duplicates == 0
    assert survivors == 0
    assert slowest < LOST_WITHIN_S + 5
    assert fleet.run("echo alive", host=HOST).stdout == "alive\n"
    # Nothing of the killed workers' making lives on: their blank and throwaway
    # workspaces' keepers end with the worker process that made them (a host whose
    # worker dies a few times a day must not fill up with them). Then this one's too.
    worker.kill_group()
    wait_for(lambda: not keepers_under(workers.state_dir(HOST)) or None, 30,
             "the keepers of killed workers to end")


def test_a_call_claimed_but_not_yet_recorded_on_disk_is_lost_not_hung(
    workers: WorkerFactory, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """The consumer dies between claiming a call and writing its spawn record (or after
    removing that record, before recording the end): its supervisor finds the call by
    its Redis record, kills what carries its marker, and says it is lost, so that its
    caller is told so instead of waiting forever."""
    worker = workers.start(HOST)
    consumer = _exec_pid(redis_client)
    assert consumer is not None
    record = registry.host_record(redis_client, HOST)
    call_id = f"u{uuid.uuid4().hex[:10]}"
    redis_client.hset(names.call_key(call_id), mapping={  # recorded as sent, not pushed
        "call_id": call_id, "state": "queued", "queue": names.exec_queue(HOST), "host": HOST,
    })
    redis_client.expire(names.call_key(call_id), names.CALL_TTL_S)
    assert registry.claim_call(redis_client, call_id, HOST, record["instance"], consumer) == "ok"
    # A process of that call which the dead consumer never recorded: found by its marker.
    orphan = subprocess.Popen(
        ["sleep", "300"], env={**os.environ, MARKER_VAR: call_id}, start_new_session=True,
    )
    try:
        os.kill(consumer, signal.SIGKILL)  # a consumer this test's worker started
        state = wait_for(
            lambda: records.call_record(redis_client, call_id).get("state") == "lost", 30,
            "the claimed call to be marked lost",
        )
        assert state
        assert orphan.wait(15) is not None  # killed by the recovery
        assert call_id not in redis_client.smembers(names.running_key(HOST))
        assert "its worker's command consumer died" in records.call_record(
            redis_client, call_id
        )["note"]
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
    assert worker.proc is not None and worker.proc.poll() is None

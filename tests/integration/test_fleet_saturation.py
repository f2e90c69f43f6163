"""Control under saturation: with every command slot busy, control calls answer at once."""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import redis

from bashfleet.client import Fleet, records
from bashfleet.worker.wire.models import CallResult

from .conftest import RECORD_KEYS, WorkerProcess, wait_for

T = TypeVar("T")

#: What "at once" means here, generously for a loaded 2-core machine.
CONTROL_BUDGET_S = 1.0


def test_control_answers_while_every_slot_is_busy(
    two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet, redis_client: redis.Redis
) -> None:
    # A job to control, started while a slot is free.
    job = fleet.run("while true; do echo tick; sleep 0.1; done", host="alpha",
                    mode="background").job
    assert job is not None

    # Fill both command slots of alpha, then queue one more call behind them.
    results: dict[str, CallResult] = {}
    ids = [f"csat{uuid.uuid4().hex[:10]}" for _ in range(3)]
    commands = ["sleep 20", "sleep 20", "echo third"]

    def run(call_id: str, command: str) -> None:
        results[call_id] = fleet.run(command, host="alpha", call_id=call_id)

    threads = [
        threading.Thread(target=run, args=(call_id, command))
        for call_id, command in zip(ids[:2], commands[:2], strict=True)
    ]
    for thread in threads:
        thread.start()
    wait_for(lambda: all(records.call_record(redis_client, c).get("pgid") for c in ids[:2]),
             15, "both slots to run a sleep")
    third = threading.Thread(target=run, args=(ids[2], commands[2]))
    third.start()
    threads.append(third)
    wait_for(lambda: records.call_record(redis_client, ids[2]).get("state"), 5, "the 3rd call")
    info = records.host_info(redis_client, "alpha", keys=RECORD_KEYS)
    assert info is not None and info.busy == 2 == info.slots

    timings: dict[str, float] = {}

    def timed(name: str, action: Callable[[], T]) -> T:
        started = time.monotonic()
        value = action()
        timings[name] = time.monotonic() - started
        return value

    checked = timed("check", lambda: fleet.check(job.id, offset=0))
    assert checked.running and "tick" in checked.output
    timed("read_output", lambda: fleet.read_output(job.id, limit=100))
    timed("jobs", lambda: fleet.jobs(host="alpha"))
    killed = timed("kill", lambda: fleet.kill(job.id))
    assert not killed.running
    print("\ncontrol latency with every slot busy: "
          + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in timings.items()))
    assert all(v < CONTROL_BUDGET_S for v in timings.values()), timings
    # The third call still waits for a slot: no worker took it early.
    assert records.call_record(redis_client, ids[2])["state"] == "queued"

    # Cancelling the sleeps frees the slots; the queued call then runs.
    for call_id in ids[:2]:
        assert timed("cancel", functools.partial(fleet.cancel, call_id))
    for thread in threads:
        thread.join(15)
        assert not thread.is_alive()
    ended = {c: (results[c].exit_code, results[c].signal, results[c].cancelled,
                 results[c].error) for c in ids[:2]}
    assert all(results[c].signal is not None for c in ids[:2]), ended
    assert results[ids[2]].stdout == "third\n"

"""A call's claim travels while its worker prepares the call (`ExecWatcher.starting`
reads it just before bash would start): a call withdrawn before its worker took it may
be prepared, and is never started."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from bashfleet.client import Fleet
from bashfleet.client._sync import records as sync_records
from bashfleet.worker.wire import names
from bashfleet.worker.wire.names import CallState

from .conftest import WorkerProcess


def _withdrawn_before_taken(client: Any, call_id: str, queue: str, host: str | None,
                            message: str, **_: object) -> str:
    """Send a call as a caller that withdrew it at once would leave it: its record
    cancelled, its message pushed all the same (the worker takes it next)."""
    key = names.call_key(call_id)
    client.hset(key, mapping={"call_id": call_id, "state": CallState.CANCELLED})
    client.expire(key, names.FINISHED_TTL_S)
    client.lpush(queue, message)
    return "ok"


def test_a_call_withdrawn_before_its_claim_is_never_started(
    two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet, redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    workspace = fleet.workspace(host=two_hosts[0].host)
    try:
        # What the check below looks for is what such a command leaves when it runs.
        assert workspace.run("touch claimed").exit_code == 0
        assert workspace.run("test -e claimed").exit_code == 0
        monkeypatch.setattr(sync_records, "send_call", _withdrawn_before_taken)
        refused = workspace.run("touch withdrawn")
        monkeypatch.undo()
        assert refused.error is not None and refused.error.kind == "cancelled", refused
        assert "did not run" in refused.error.message
        assert refused.exit_code is None
        # Nothing ran, and the workspace the worker prepared for it serves the next call.
        assert workspace.run("test -e withdrawn").exit_code == 1
        assert workspace.run("echo next").stdout == "next\n"
    finally:
        workspace.delete()


def test_a_throwaway_call_withdrawn_before_its_claim_leaves_the_pool_serving(
    two_hosts: tuple[WorkerProcess, WorkerProcess], fleet: Fleet,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = two_hosts[0].host
    monkeypatch.setattr(sync_records, "send_call", _withdrawn_before_taken)
    for _ in range(3):  # more than one throwaway taken and given back unused
        refused = fleet.run("echo never", host=host)
        assert refused.error is not None and refused.error.kind == "cancelled", refused
        assert refused.stdout == "" and refused.exit_code is None
    monkeypatch.undo()
    assert [fleet.run(f"echo {i}", host=host).stdout for i in range(3)] == [
        f"{i}\n" for i in range(3)]

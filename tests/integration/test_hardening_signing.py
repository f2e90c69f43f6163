"""Signed calls end to end: a keyed worker runs only what a keyed client signed.

Unsigned, tampered, expired, wrongly keyed and replayed messages are refused with an
`unauthorized` error, and nothing runs; Flower's task-sending API (which cannot sign)
cannot run commands either. A worker without a key says so loudly at start.
"""

from __future__ import annotations

import base64
import copy
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bashfleet.client import Fleet, records
from bashfleet.client.errors import CallNotRun, Unauthorized
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.models import CallResult
from bashfleet.worker.wire.names import Task

from .conftest import WorkerFactory, WorkerProcess, raw_exec, wait_for
from .test_fleet_flower import PASSWORD, USER, _try_get, running_flower
from .test_fleet_flower import flower as flower  # noqa: PLC0414 - the fixture

KEY = "test-signing-key-" + "5" * 32
HOST = "signed1"
QUEUE = names.exec_queue(HOST)


class KeyedWorker(WorkerProcess):
    """A worker started with a signing key."""

    def env(self) -> dict[str, str]:
        env = super().env()
        env["BASHFLEET_SIGNING_KEY"] = KEY
        return env


@pytest.fixture
def keyed(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> Iterator[WorkerProcess]:
    factory = WorkerFactory(redis_server.url, redis_client, tmp_path)
    worker = KeyedWorker(HOST, redis_server.url, state_dir=tmp_path / "host",
                         log_dir=tmp_path / "logs")
    worker.start()
    factory.started.append(worker)
    try:
        worker.wait_ready(redis_client)
        yield worker
    finally:
        factory.cleanup()


@pytest.fixture
def signed_fleet(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    monkeypatch.setenv("BASHFLEET_SIGNING_KEY", KEY)
    client = Fleet(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def project(keyed: WorkerProcess) -> Path:
    """Where a call's marker goes: a project the keyed host allows, each call's cwd (its
    workspace), so a call that ran leaves its marker where the test looks."""
    return keyed.project()


def _call(marker: Path, call_id: str) -> dict[str, Any]:
    return {"call_id": call_id, "command": f"touch {marker}", "cwd": str(marker.parent)}


def test_signed_calls_and_control_work(
    keyed: WorkerProcess, signed_fleet: Fleet, project: Path
) -> None:
    result = signed_fleet.run("echo signed", host=HOST)
    assert (result.exit_code, result.stdout) == (0, "signed\n")
    # A signed call leaves its marker where the refused ones below would have.
    marker = project / "signed-ran"
    assert signed_fleet.run(f"touch {marker}", host=HOST, cwd=str(project)).exit_code == 0
    assert marker.exists()
    job = signed_fleet.run("sleep 30", host=HOST, mode="background").job
    assert job is not None
    assert signed_fleet.check(job.id).running
    assert not signed_fleet.kill(job.id).running


@pytest.fixture
def unsigned_fleet(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Fleet]:
    monkeypatch.delenv("BASHFLEET_SIGNING_KEY")
    client = Fleet(redis_server.url)
    yield client
    client.close()


def test_unsigned_call_is_refused_and_nothing_runs(
    keyed: WorkerProcess, unsigned_fleet: Fleet, project: Path
) -> None:
    marker = project / "unsigned-ran"
    with pytest.raises(CallNotRun) as refused:  # this client has no key
        unsigned_fleet.run(f"touch {marker}", host=HOST, cwd=str(project))
    assert refused.value.kind == "unauthorized" and "unsigned" in refused.value.message
    assert not marker.exists()


def test_a_client_with_another_key_is_refused_and_told_so(
    keyed: WorkerProcess, fleet: Fleet, project: Path
) -> None:
    marker = project / "other-key-ran"
    # The worker refuses the call and answers with its own key, which this client does
    # not hold: it cannot trust the answer, and says why instead of showing it.
    with pytest.raises(Unauthorized, match="could not be verified"):
        fleet.run(f"touch {marker}", host=HOST, cwd=str(project))
    assert not marker.exists()


@pytest.mark.parametrize("attack", ["tampered", "expired", "wrong key"])
def test_forged_messages_are_refused(
    keyed: WorkerProcess, signed_fleet: Fleet, project: Path, attack: str
) -> None:
    marker = project / f"{attack.replace(' ', '-')}-ran"
    call_id = f"c{uuid.uuid4().hex[:12]}"
    now = time.time()
    if attack == "tampered":
        envelope = auth.sign(KEY, Task.EXEC, [_call(project / "x", call_id)], now,
                             target=QUEUE)
        envelope["args"][0]["command"] = f"touch {marker}"
    elif attack == "expired":
        envelope = auth.sign(KEY, Task.EXEC, [_call(marker, call_id)], now - 3600,
                             ttl_s=1, target=QUEUE)
    else:
        envelope = auth.sign("some-other-key-" + "0" * 20, Task.EXEC,
                             [_call(marker, call_id)], now, target=QUEUE)
    result = raw_exec(signed_fleet, HOST, [envelope], call_id)
    assert result.error is not None and result.error.kind == "unauthorized", result
    assert not marker.exists() and not (project / "x").exists()


def test_a_replayed_message_is_refused(
    keyed: WorkerProcess, signed_fleet: Fleet, project: Path
) -> None:
    first_id, second_id = f"c{uuid.uuid4().hex[:12]}", f"c{uuid.uuid4().hex[:12]}"
    marker = project / "replayed"
    envelope = auth.sign(KEY, Task.EXEC,
                         [{"call_id": first_id, "command": f"echo once >> {marker}",
                           "cwd": str(project)}], time.time(), target=QUEUE)
    first = raw_exec(signed_fleet, HOST, [envelope], first_id)
    assert first.exit_code == 0, first
    again = raw_exec(signed_fleet, HOST, [copy.deepcopy(envelope)], second_id)
    assert again.error is not None and again.error.kind == "unauthorized"
    assert "replayed" in again.error.message
    assert marker.read_text() == "once\n"


def _send_through_flower(flower: str, marker: Path, call_id: str) -> tuple[int, str]:
    """POST an exec task to Flower's task-sending API (which cannot sign): its status
    and body."""
    body = json.dumps({"args": [_call(marker, call_id)], "queue": names.exec_queue(HOST)})
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    request = urllib.request.Request(  # noqa: S310 - the local Flower's http:// URL
        f"{flower}/api/task/send-task/{Task.EXEC}", data=body.encode(), method="POST",
        headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_flower_cannot_run_commands(keyed: WorkerProcess, flower: str, project: Path) -> None:
    """Flower as it is run by default (read-only) refuses to send a task at all, and
    nothing runs."""
    wait_for(lambda: _try_get(f"{flower}/api/workers?status=1"), 60, "Flower")
    marker = project / "via-flower"
    call_id = f"c{uuid.uuid4().hex[:12]}"
    status, _ = _send_through_flower(flower, marker, call_id)
    assert status == 403
    assert not marker.exists()


def test_a_writable_flower_cannot_run_commands_either(
    keyed: WorkerProcess, redis_server: RedisServer, tmp_path: Path, project: Path,
    redis_client: redis.Redis,
) -> None:
    """An operator who makes Flower writable (`--read_only=false`) still cannot run a
    command through it: its message is not signed, and the worker refuses it."""
    with running_flower(redis_server.url, tmp_path / "flower.log",
                        "--read_only=false") as flower:
        wait_for(lambda: _try_get(f"{flower}/api/workers?status=1"), 60, "Flower")
        marker = project / "via-writable-flower"
        call_id = f"c{uuid.uuid4().hex[:12]}"
        status, body = _send_through_flower(flower, marker, call_id)
        assert status == 200, (status, body)
        task_id = json.loads(body)["task-id"]

        # The worker answers every message, this one too: stored under its task id
        # (Flower names no reply channel of ours).
        answer = wait_for(lambda: records.stored_reply(redis_client, task_id), 30,
                          "the worker's answer to Flower's message")
    result = CallResult.model_validate_json(auth.unseal(auth.keyring([KEY]), auth.REPLY,
                                                         task_id, answer))
    assert result.error is not None and result.error.kind == "unauthorized"
    assert not marker.exists()


class UnkeyedWorker(WorkerProcess):
    """A worker started without a signing key (and, with `insecure`, told to run so)."""

    insecure = False

    def env(self) -> dict[str, str]:
        env = super().env()
        del env["BASHFLEET_SIGNING_KEY"]
        return env

    def args(self) -> list[str]:
        return [*super().args(), *(["--insecure-unsigned"] if self.insecure else [])]


def test_a_worker_without_a_key_refuses_to_start(tmp_path: Path, redis_server: RedisServer) -> None:
    worker = UnkeyedWorker("unkeyed0", redis_server.url, state_dir=tmp_path / "h",
                           log_dir=tmp_path / "logs").start()
    try:
        assert worker.proc is not None and worker.proc.wait(60) == 2
    finally:
        worker.stop()
    assert "no signing key: refusing to start" in worker.log()
    assert "--insecure-unsigned" in worker.log()


def test_an_insecure_unsigned_worker_warns_at_start(
    workers: WorkerFactory, redis_client: redis.Redis, tmp_path: Path
) -> None:
    worker = UnkeyedWorker("unkeyed1", workers.url, state_dir=tmp_path / "h",
                           log_dir=tmp_path / "logs")
    worker.insecure = True
    worker.start()
    workers.started.append(worker)
    worker.wait_ready(redis_client)
    assert "NO SIGNING KEY CONFIGURED" in worker.log()
    assert "anyone who can write to this Redis can run commands" in worker.log()

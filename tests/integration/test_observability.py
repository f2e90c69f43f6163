"""Observability: JSON log lines with call and job ids; queue depth per host.

One worker with `BASHFLEET_LOG_FORMAT=json` and a single command slot serves the
module: its log must be JSON line by line, say when each call starts and ends (and
what control calls did) under the call's or job's id, and never hold a command, its
output or the Redis password. With its slot busy, calls sent to it wait in its queue,
and `hosts()` (and `bashfleet hosts`) count them.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bashfleet.client import Fleet, cli
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.wire.models import CallResult, HostInfo

from .conftest import WorkerFactory, WorkerProcess, wait_for

HOST = "obs1"


class JsonLogWorker(WorkerProcess):
    """A worker that logs one JSON object per line."""

    def env(self) -> dict[str, str]:
        env = super().env()
        env["BASHFLEET_LOG_FORMAT"] = "json"
        return env


@pytest.fixture(scope="module")
def worker(
    redis_server: RedisServer, redis_client: redis.Redis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    base = tmp_path_factory.mktemp("observability")
    factory = WorkerFactory(redis_server.url, redis_client, base)
    started = JsonLogWorker(HOST, redis_server.url, state_dir=base / "host",
                            log_dir=base / "logs", concurrency=1)
    started.start()
    factory.started.append(started)
    try:
        started.wait_ready(redis_client)
        yield started
    finally:
        factory.cleanup()


def entries(path: Path) -> list[dict[str, object]]:
    """Every line of a worker's log, parsed: each one must be a JSON object."""
    parsed = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"log line {number} is not JSON: {line!r}") from None
        assert isinstance(entry, dict), line
        parsed.append(entry)
    return parsed


def about(path: Path, field: str, value: str) -> list[dict[str, object]]:
    return [entry for entry in entries(path) if entry.get(field) == value]


def password_of(url: str) -> str:
    password = urllib.parse.urlsplit(url).password
    assert password, "the session's Redis has a password"
    return password


def test_json_log_lines_follow_a_call_without_its_command(
    worker: WorkerProcess, fleet: Fleet
) -> None:
    marker = f"obs-secret-{uuid.uuid4().hex}"
    call_id = f"obs{uuid.uuid4().hex[:12]}"
    command = f"echo {marker} && exit 3"
    result = fleet.run(command, host=HOST, call_id=call_id, env={"OBS_VALUE": marker})
    assert result.exit_code == 3 and marker in result.stdout

    def start_and_end() -> list[dict[str, object]] | None:
        found = about(worker.log_path, "call_id", call_id)
        return found if len(found) >= 2 else None

    lines = wait_for(start_and_end, 10, "the call's start and end lines")
    start = next(e for e in lines if str(e["message"]).startswith("call started"))
    end = next(e for e in lines if str(e["message"]).startswith("call ended"))
    for entry in (start, end):
        assert {"time", "level", "logger", "host", "pid", "message"} <= set(entry)
        assert entry["host"] == HOST and entry["role"] == "exec" and entry["level"] == "INFO"
    assert start["queue"] == f"bashfleet.{HOST}.exec"
    assert start["command_chars"] == len(command)
    assert end["exit_code"] == 3 and end["signal"] is None and end["timed_out"] is False
    assert end["backgrounded"] is False and isinstance(end["duration_s"], float)

    # Control calls are logged under the job's id, by the control consumer.
    job = fleet.run("sleep 30", host=HOST, mode="background").job
    assert job is not None
    assert fleet.check(job.id).running
    assert not fleet.kill(job.id).running
    actions = wait_for(
        lambda: {str(e.get("action")): e for e in about(worker.log_path, "job_id", job.id)
                 if e.get("action") in ("check", "kill")} or None,
        10, "the check and kill lines",
    )
    assert actions.keys() == {"check", "kill"}
    assert actions["check"]["running"] is True and actions["check"]["role"] == "ctl"
    assert actions["kill"]["running"] is False

    # The supervisor's lines are JSON too; nothing secret anywhere in the log.
    log = worker.log_path.read_text()
    assert any(e["role"] == "supervisor" for e in entries(worker.log_path))
    assert marker not in log and "sleep 30" not in log and "&& exit" not in log
    assert password_of(worker.url) not in log


def test_hosts_counts_the_calls_waiting_in_a_host_queue(
    worker: WorkerProcess, fleet: Fleet, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    results: dict[str, CallResult] = {}
    ids = [f"obsq{uuid.uuid4().hex[:10]}" for _ in range(3)]

    def run(call_id: str, command: str) -> None:
        results[call_id] = fleet.run(command, host=HOST, call_id=call_id)

    def host() -> HostInfo:
        return next(info for info in fleet.hosts() if info.host == HOST)

    busy = threading.Thread(target=run, args=(ids[0], "sleep 30"))
    busy.start()
    wait_for(lambda: host().busy == 1, 10, "the only slot to run the sleep")
    waiting = [threading.Thread(target=run, args=(c, f"echo {c}")) for c in ids[1:]]
    for thread in waiting:
        thread.start()
    try:
        def two_queued() -> HostInfo | None:
            info = host()
            return info if info.queued == 2 else None

        info = wait_for(two_queued, 10, "two calls queued")
        assert (info.busy, info.slots, info.queued) == (1, 1, 2)

        monkeypatch.setenv("BASHFLEET_REDIS_URL", worker.url)
        capsys.readouterr()
        assert cli.main(["hosts"]) == 0
        table = capsys.readouterr().out
        header, *rows = table.splitlines()
        assert "QUEUED" in header.split()
        row = next(r.split() for r in rows if r.startswith(HOST + " "))
        assert row[2:4] == ["1/1", "2"], table
        assert cli.main(["hosts", "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert isinstance(listed, list)
        assert next(h for h in listed if h["host"] == HOST)["queued"] == 2
    finally:
        # The sleep's end frees the slot: the two queued calls run, one after the other.
        assert fleet.cancel(ids[0])
        for thread in [busy, *waiting]:
            thread.join(30)
    assert all(results[c].exit_code == 0 for c in ids[1:])
    assert (host().busy, host().queued) == (0, 0)
    cancel = wait_for(lambda: [e for e in about(worker.log_path, "call_id", ids[0])
                               if e.get("action") == "cancel"], 10, "the cancel line")
    assert cancel[0]["cancelled"] is True and cancel[0]["role"] == "ctl"

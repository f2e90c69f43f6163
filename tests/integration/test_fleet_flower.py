"""Flower, run against the fleet's Redis as a user runs it, shows the hosts and the calls."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client import Fleet
from client.redis_server import RedisServer, free_port

from .conftest import WorkerProcess, wait_for

USER, PASSWORD = "user", "pass"


@pytest.fixture
def flower(redis_server: RedisServer, tmp_path: Path) -> Iterator[str]:
    """`celery -A worker.fleet.app flower` on 127.0.0.1 with basic auth; its base URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
    env["BASHFLEET_REDIS_URL"] = redis_server.url
    log = tmp_path / "flower.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "worker.fleet.app", "flower",
                "--address=127.0.0.1", f"--port={port}", f"--basic-auth={USER}:{PASSWORD}",
            ],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _get(url: str) -> Any:
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    # Only ever the local Flower's http:// URL.
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        return json.loads(response.read())


def _try_get(url: str) -> Any:
    try:
        return _get(url)
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return None


def test_flower_lists_the_hosts_and_the_calls(
    two_hosts: tuple[WorkerProcess, WorkerProcess], flower: str, fleet: Fleet
) -> None:
    def both_hosts() -> set[str] | None:
        workers = _try_get(f"{flower}/api/workers?status=1")
        names = set(workers or ())
        return names if {"exec@alpha", "exec@beta"} <= names else None

    names = wait_for(both_hosts, 60, "Flower to list both hosts", interval=0.5)
    assert {"ctl@alpha", "ctl@beta"} <= names

    # Calls made while Flower watches show up in its task list, by call id.
    ids = {f"cflower{uuid.uuid4().hex[:8]}": host for host in ("alpha", "beta")}
    for call_id, host in ids.items():
        result = fleet.run("echo seen", host=host, call_id=call_id, env={"CALL_ONLY": "v4lue-x9"})
        assert result.exit_code == 0

    def listed() -> dict[str, Any] | None:
        tasks = _try_get(f"{flower}/api/tasks") or {}
        done = all(tasks.get(c, {}).get("state") == "SUCCESS" for c in ids)
        return tasks if done else None

    tasks = wait_for(listed, 30, "Flower to list the calls", interval=0.3)
    for call_id, host in ids.items():
        assert tasks[call_id]["name"] == "bashfleet.exec"
        assert tasks[call_id]["worker"] == f"exec@{host}"
        # Its result column says how it ended (the answer itself went to the caller).
        assert "exit 0" in tasks[call_id]["result"]
        # Its arguments are redacted: neither the command (it may carry a token inline)
        # nor the call's env (it may hold secrets) is shown; the cwd and size are.
        assert "echo seen" not in tasks[call_id]["args"]
        assert "<redacted: 9 chars>" in tasks[call_id]["args"]
        assert "v4lue-x9" not in json.dumps(tasks[call_id])

"""`bashfleet mcp` driven by a client nobody here wrote: the official TypeScript SDK
(`@modelcontextprotocol/sdk`, installed with npm from `ts/package-lock.json`), as agent
harnesses built on it do.

- A 75-second call completes in a client that keeps the SDK's default 60-second request
  timeout and resets it on progress (`resetTimeoutOnProgress`): the server sends
  progress notifications, with the last output lines, while the call runs.
- A call the client aborts (`notifications/cancelled`) is cancelled on its host: its
  processes are gone, its slot is free, and no job is left behind.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from .helpers import Cli, bashfleet_command, local_fleet, typescript_client, wait_for

HOST = "ts-a"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    state_dir = tmp_path_factory.mktemp("ts-fleet")
    with local_fleet(state_dir, "--hosts", HOST, "--no-flower") as cli:
        yield cli


@pytest.fixture(scope="module")
def ts_client() -> Path:
    """The progress and cancellation client, with the TypeScript SDK installed."""
    return typescript_client("progress_client.mjs")


def run_client(
    fleet: Cli, script: Path, dialect: str, *args: str, timeout: float,
    server_options: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run the TypeScript client against `bashfleet mcp --dialect D SERVER_OPTIONS`; its
    JSON report."""
    session = f"ts-{dialect}-{uuid.uuid4().hex[:10]}"
    server = [*bashfleet_command(), "mcp", "--dialect", dialect, "--session", session,
              *server_options]
    env = {**fleet.env, "BASHFLEET_SERVER_COMMAND": json.dumps(server)}
    done = subprocess.run(
        ["node", str(script), *args], env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def processes_running(argv: list[str]) -> list[int]:
    """Pids of live processes whose command line is exactly `argv`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["cmdline"] == argv and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc.pid)
    return found


def busy_slots(fleet: Cli) -> int:
    hosts = json.loads(fleet("hosts", "--json").stdout)
    return sum(host["busy"] for host in hosts if host["host"] == HOST)


def test_a_75_second_call_completes_in_a_client_that_resets_its_timeout_on_progress(
    fleet: Cli, ts_client: Path
) -> None:
    """The pipe dialect's `sleep 75` (its timeout is 120 s) used to fail at 60 s with
    `MCP error -32001: Request timed out`. (The one slow test of the suite.)"""
    command = "for i in $(seq 1 15); do echo tick $i; sleep 5; done; echo finished"
    report = run_client(fleet, ts_client, "pipe", "long", "bash",
                        json.dumps({"command": command}), timeout=150)
    result = report["result"]
    assert result.get("isError") is not True, result
    text = result["content"][0]["text"]
    assert text.startswith("stdout:\ntick 1\n") and "\ntick 15\nfinished\n" in text, text
    assert text.endswith("\n\nexit code: 0"), text
    assert report["seconds"] >= 75
    progress = report["progress"]
    # Every few seconds, never near the 60 s the SDK would wait without one.
    assert len(progress) >= 12, progress
    moments = [0.0] + [note["at"] for note in progress] + [report["seconds"]]
    assert max(b - a for a, b in itertools.pairwise(moments)) < 15
    assert [note["progress"] for note in progress] == sorted(note["progress"] for note in progress)
    messages = [note.get("message", "") for note in progress]
    assert any("last output:\ntick " in message for message in messages), messages


@pytest.mark.parametrize("dialect", ["pipe", "claude"])
def test_an_aborted_call_is_cancelled_on_its_host(
    fleet: Cli, ts_client: Path, dialect: str
) -> None:
    """`notifications/cancelled` used to be ignored; the command ran on, out of every
    tool's reach. (The session's workspace is a project the fleet allows, its `--cwd`:
    the marker the command leaves there, the client sees.)"""
    project = fleet.project()
    marker = project / "running"
    seconds = f"3{uuid.uuid4().int % 10**6:06d}"  # a `sleep` no other test runs
    tool = "Bash" if dialect == "claude" else "bash"
    arguments = {"command": f"touch {marker}; sleep {seconds}"}
    report = run_client(fleet, ts_client, dialect, "cancel", tool, json.dumps(arguments),
                        str(marker), timeout=90, server_options=("--cwd", str(project)))
    assert report["markerSeen"] is True
    assert "the user pressed stop" in report["error"], report
    wait_for(lambda: not processes_running(["sleep", seconds]), "the command to be killed")
    wait_for(lambda: busy_slots(fleet) == 0, "the slot to be freed")
    jobs = json.loads(fleet("ps", "--json").stdout)
    assert [job for job in jobs if job["state"] == "running"] == []
    assert os.path.exists(marker)

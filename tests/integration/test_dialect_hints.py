"""The dialects' hints work for the model: what a dialect's result tells the model to
run (`cat <output_file>`, `kill -9 -<pgid>`, the `Full output:` path, `check_pid`, a
`bash_output` call, an `artifact://` resource, a codex session id) is run as the model's
next call, in the same session, on a sandboxed host, and it works.

Each session's calls run in one workspace (its PID namespace, its mount view): the pid
a dialect shows is the number the next call uses, and the path it shows is a path the
next call reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest

from bashfleet.client import Fleet
from bashfleet.client.dialects import SessionState, ToolText, get_dialect
from bashfleet.client.mcp_server import FleetBackend, ToolServer
from bashfleet.client.redis_server import RedisServer

from .conftest import WorkerFactory, WorkerProcess, wait_for

HOST = "hints"


@pytest.fixture(name="host", scope="module")
def _host_fixture(session_workers: WorkerFactory) -> Iterator[WorkerProcess]:
    """A sandboxed host (the default isolation, as a deployment has it)."""
    yield from session_workers.module_host(HOST)


@pytest.fixture(name="fleet")
def _fleet_fixture(host: WorkerProcess, redis_server: RedisServer) -> Iterator[Fleet]:
    with Fleet(redis_server.url) as fleet:
        yield fleet
        for view in fleet.workspaces():
            fleet.open_workspace(view.id).delete()


def call(fleet: Fleet, dialect: str, tool: str, args: dict[str, object],
         session: SessionState) -> ToolText:
    """One tool call of `dialect`, as an agent harness makes it."""
    return get_dialect(dialect).call(tool, args, fleet, session)


def until(ask: Callable[[], ToolText], holds: Callable[[str], bool], what: str) -> str:
    """The text of `ask()` once `holds(text)`: the model's next calls, repeated."""
    def answer() -> str | None:
        text = ask().text
        return text if holds(text) else None

    return wait_for(answer, 15, what)


def test_modes_output_file_and_kill_minus_pgid(fleet: Fleet) -> None:
    session = SessionState(host=HOST)
    started = call(fleet, "modes", "bash",
                   {"command": "echo started; sleep 300", "mode": "background"}, session)
    found = re.search(r"<pid>(\d+)</pid>\n<output_file>(\S+)</output_file>\n"
                      r"<reminder>To stop: kill -9 -(\d+)</reminder>", started.text)
    assert found, started.text
    pid, output_file, pgid = found.groups()
    def cat() -> ToolText:
        return call(fleet, "modes", "bash", {"command": f"cat {output_file}"}, session)

    read = until(cat, lambda text: text.startswith("started"), "the job's output")
    assert read.startswith("started")
    shown = call(fleet, "modes", "bash", {"command": f"ps -o args= -p {pid}"}, session)
    # The job's pid in the next call's view (bash ran its last command in its place).
    assert shown.text.strip() == "sleep 300", shown.text
    killed = call(fleet, "modes", "bash", {"command": f"kill -9 -{pgid}; echo rc=$?"}, session)
    assert killed.text.strip().endswith("rc=0"), killed.text
    ended = until(cat, lambda text: "[background process failed: signal: 9 (SIGKILL)]" in text,
                  "the completion line")
    assert "started" in ended


def test_pipe_full_output_path_and_check_pid(fleet: Fleet) -> None:
    session = SessionState(host=HOST)
    long = call(fleet, "pipe", "bash", {"command": "seq 1 100000"}, session)
    found = re.search(r"Full output: (\S+)\]", long.text)
    assert found, long.text[-500:]
    tail = call(fleet, "pipe", "bash", {"command": f"tail -1 {found.group(1)}"}, session)
    assert tail.text.startswith("stdout:\n100000\n"), tail.text
    slow = call(fleet, "pipe", "bash", {"command": "echo waiting; sleep 300", "timeout": 1000},
                session)
    pid = re.search(r"backgrounded after [\d.]+s timeout \(pid (\d+)\)", slow.text)
    assert pid, slow.text
    checked = call(fleet, "pipe", "bash", {"check_pid": int(pid.group(1))}, session)
    assert "waiting" in checked.text or "running" in checked.text.lower(), checked.text
    alive = call(fleet, "pipe", "bash", {"command": f"kill -0 {pid.group(1)} && echo alive"},
                 session)
    assert alive.text.startswith("stdout:\nalive\n"), alive.text
    killed = call(fleet, "pipe", "bash", {"kill_pid": int(pid.group(1))}, session)
    assert not killed.is_error, killed.text


def test_claude_full_output_path_and_background_shell(fleet: Fleet) -> None:
    session = SessionState(host=HOST)
    long = call(fleet, "claude", "Bash", {"command": "seq 1 100000"}, session)
    found = re.search(r"Full output: (\S+) on host", long.text)
    assert found, long.text[-500:]
    tail = call(fleet, "claude", "Bash", {"command": f"tail -1 {found.group(1)}"}, session)
    assert tail.text.strip() == "100000", tail.text
    background = call(fleet, "claude", "Bash",
                      {"command": "echo bg-out; sleep 300", "run_in_background": True}, session)
    shell = re.search(r"ID: (\S+)", background.text) or re.search(r"(j[0-9a-f]{15})",
                                                                  background.text)
    assert shell, background.text
    out = until(lambda: call(fleet, "claude", "BashOutput", {"bash_id": shell.group(1)},
                             session), lambda text: "bg-out" in text, "the shell's output")
    assert "bg-out" in out
    assert not call(fleet, "claude", "KillBash", {"bash_id": shell.group(1)}, session).is_error


def test_native_bash_output_and_bash_check(fleet: Fleet) -> None:
    session = SessionState(host=HOST)
    long = call(fleet, "native", "bash", {"command": "seq 1 100000"}, session)
    found = re.search(r"bash_output id=(\S+)", long.text)
    assert found, long.text[-500:]
    more = call(fleet, "native", "bash_output", {"id": found.group(1).rstrip(")")}, session)
    assert not more.is_error and "\n1\n2\n3\n" in more.text[:300], more.text[:300]
    job = call(fleet, "native", "bash", {"command": "echo hi; sleep 300",
                                         "mode": "background"}, session)
    job_id = re.search(r"(j[0-9a-f]{15})", job.text)
    assert job_id, job.text
    checked = until(lambda: call(fleet, "native", "bash_check", {"id": job_id.group(1)},
                                 session), lambda text: "hi" in text, "the job's output")
    assert "hi" in checked
    assert not call(fleet, "native", "bash_kill", {"id": job_id.group(1)}, session).is_error


def test_pi_artifact_is_a_resource_the_model_reads(host: WorkerProcess,
                                                   redis_server: RedisServer) -> None:
    backend = FleetBackend(redis_server.url)
    server = ToolServer(get_dialect("pi"), backend, "pi-hints-1")
    try:
        answer = server.call("bash", {"command": "seq 1 100000"})
        found = re.search(r"Full: (artifact://\S+)\]", answer.text)
        assert found, answer.text[-300:]
        assert server.read_artifact(found.group(1)).startswith("1\n2\n3\n")
        assert server.renew_workspaces() == 1  # the server keeps its workspace alive
    finally:
        runner, _ = backend.connect()
        fleet = runner.fleet  # type: ignore[attr-defined]
        for view in fleet.workspaces():
            fleet.open_workspace(view.id).delete()
        backend.reset()


def test_codex_session_id_reaches_its_process(fleet: Fleet) -> None:
    session = SessionState(host=HOST)
    started = call(fleet, "codex", "exec_command",
                   {"cmd": "read -p 'name? ' n; echo hello $n", "tty": True,
                    "yield_time_ms": 1500}, session)
    found = re.search(r"Process running with session ID (\d+)", started.text)
    assert found, started.text
    answer = call(fleet, "codex", "write_stdin",
                  {"session_id": int(found.group(1)), "chars": "bob\n", "yield_time_ms": 2000},
                  session)
    assert "hello bob" in answer.text, answer.text


def test_every_call_of_a_session_shares_one_workspace(fleet: Fleet) -> None:
    session = SessionState(host=HOST)
    call(fleet, "pipe", "bash", {"command": "echo left > /tmp/note; sleep 300 &"}, session)
    seen = call(fleet, "pipe", "bash", {"command": "cat /tmp/note; pgrep -x sleep | wc -l"},
                session)
    assert seen.text.startswith("stdout:\nleft\n1\n"), seen.text
    assert list(session.workspaces) == [HOST]
    other = SessionState(host=HOST)
    unseen = call(fleet, "pipe", "bash", {"command": "cat /tmp/note 2>&1 | grep -c 'No such'"},
                  other)
    assert unseen.text.startswith("stdout:\n1\n"), unseen.text

"""Interactive sessions in the engine, with real PTYs and pipes, sandboxed and plain.

A session is a job of its own supervisor that holds its stdin; the call waits its yield
and returns earlier when the process ends or waits for input (with its prompt).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from bashfleet.worker.engine.jobs import interactive, jobs
from bashfleet.worker.wire.control import Collect
from bashfleet.worker.wire.models import CallResult, JobRecord, Policy

from .engine_helpers import (
    Engine,
    Janitor,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    _plain_engine_fixture,  # noqa: F401 - fixture
    engine_with,
)

SESSION = Policy(on_timeout="background", kill_grace_s=0.5)
SETTLE = Collect(wait_s=10, settle_s=0.3)


@pytest.fixture(params=["engine", "plain_engine"])
def any_engine(request: pytest.FixtureRequest) -> Engine:
    """Both: sandboxed (the workspace's keeper spawns the shell for the session's
    supervisor) and plain (the supervisor does)."""
    engine: Engine = request.getfixturevalue(request.param)
    return engine


def start(engine: Engine, command: str, stdin: str = "pty", wait: float = 10.0,
          **fields: Any) -> tuple[CallResult, JobRecord]:
    if wait == 0:  # start and return at once
        fields.update(background=True)
    result = engine.run(command, stdin=stdin, timeout_s=wait or 30.0, policy=SESSION, **fields)
    assert result.error is None, result.error
    assert result.job is not None
    return result, jobs.load_record(result.job.id, engine.settings)


def send(engine: Engine, record: JobRecord, text: str, spec: Collect = SETTLE) -> str:
    return interactive.exchange(engine.settings, record, text.encode(), spec).output


def test_read_p_prompt_is_reported_then_answered(any_engine: Engine) -> None:
    started = time.monotonic()
    result, record = start(any_engine, 'read -p "Name: " n; echo "hi $n"')
    assert time.monotonic() - started < 8, "the wait for input was not noticed"
    assert result.backgrounded and result.input_wait is not None
    assert result.input_wait.prompt == "Name: "
    out = interactive.exchange(any_engine.settings, record, b"bob\n", Collect(wait_s=10))
    assert not out.running and out.exit_code == 0
    assert out.output == "bob\nhi bob\n"  # the terminal echoes what was typed


def test_ssh_keygen_prompts_through_dev_tty(any_engine: Engine) -> None:
    key = any_engine.tmp / "id_test"
    # Relative to its cwd (the work directory): unsandboxed, the run user cannot reach
    # the test's directory by its absolute path (pytest's base directory is root's, 0700).
    result, record = start(any_engine, f"ssh-keygen -q -t ed25519 -f {key.name}")
    assert result.input_wait is not None
    assert "passphrase" in result.input_wait.prompt.lower()
    again = interactive.exchange(any_engine.settings, record, b"s3cret-pass\n",
                                 Collect(wait_s=10, settle_s=0.3, input_wait_s=0.5))
    assert "same passphrase" in again.output.lower()
    assert "s3cret" not in again.output  # a passphrase is not echoed
    done = interactive.exchange(any_engine.settings, record, b"s3cret-pass\n",
                                Collect(wait_s=10))
    assert not done.running and done.exit_code == 0, done
    assert key.exists() and Path(f"{key}.pub").exists()


def test_pipe_session_echo_and_eof(any_engine: Engine) -> None:
    result, record = start(any_engine, "cat; echo done", stdin="pipe", wait=0.5)
    assert result.backgrounded and result.stdout == ""
    assert send(any_engine, record, "hello\n") == "hello\n"  # no terminal: no echo
    out = interactive.exchange(any_engine.settings, record, b"", Collect(wait_s=10),
                               close_input=True)
    assert out.output == "done\n" and not out.running and out.exit_code == 0


def test_python_repl_waits_for_input_in_a_pipe_and_a_pty(any_engine: Engine) -> None:
    for stdin in ("pty", "pipe"):
        result, record = start(any_engine, "python3 -i -q", stdin=stdin)
        assert result.input_wait is not None, stdin
        if stdin == "pty":  # a pipe: Python prints its prompt only to a terminal
            assert result.input_wait.prompt == ">>> "
        assert "42" in send(any_engine, record, "print(6*7)\n")
        end = interactive.exchange(any_engine.settings, record, b"exit()\n", Collect(wait_s=10))
        assert not end.running


def test_busy_or_serving_processes_are_not_waiting_for_input(any_engine: Engine) -> None:
    for command in ("sleep 30", "python3 -m http.server 0 --bind 127.0.0.1"):
        result, record = start(any_engine, command, wait=3.5)
        assert result.backgrounded and result.input_wait is None, command
        jobs.kill_job(record, grace_s=0.2, settings=any_engine.settings)


def test_ctrl_c_reaches_the_foreground_process(any_engine: Engine) -> None:
    _, record = start(any_engine, "sleep 60", wait=0.3)
    out = interactive.exchange(any_engine.settings, record, b"\x03", Collect(wait_s=10))
    assert not out.running and out.signal == 2


def test_resize_signals_the_foreground_group(any_engine: Engine) -> None:
    script = "trap 'echo size $(stty size)' WINCH; echo ready; while :; do sleep 0.05; done"
    result, record = start(any_engine, script, wait=1.0, term_size={"rows": 30, "cols": 90})
    assert "ready" in result.stdout
    interactive.resize(record, 40, 100)
    out = interactive.exchange(any_engine.settings, record, b"", SETTLE)
    assert "size 40 100" in out.output
    jobs.kill_job(record, grace_s=0.2, settings=any_engine.settings)


def test_every_byte_is_read_once(any_engine: Engine) -> None:
    """Many small reads of a flood: no repeat, no gap, UTF-8 never split."""
    command = "read go; for i in $(seq 1 3000); do echo \"é line $i\"; done; read x"
    _, record = start(any_engine, command, stdin="pipe", wait=0.0)
    interactive.exchange(any_engine.settings, record, b"go\n", Collect(read=False))
    text = ""
    spec = Collect(wait_s=0.05, max_bytes=997)
    deadline = time.monotonic() + 30
    while "line 3000\n" not in text:
        assert time.monotonic() < deadline
        text += interactive.exchange(any_engine.settings, record, b"", spec).output
    assert text == "".join(f"é line {i}\n" for i in range(1, 3001))
    interactive.exchange(any_engine.settings, record, b"", Collect(wait_s=5), close_input=True)


def test_writes_to_a_closed_session_are_refused(any_engine: Engine) -> None:
    result, record = start(any_engine, "echo out; sleep 30", stdin="closed", wait=0.5)
    assert result.stdout == "out\n" and result.backgrounded
    with pytest.raises(interactive.SessionError, match="stdin is closed"):
        interactive.exchange(any_engine.settings, record, b"x", Collect())
    jobs.kill_job(record, grace_s=0.2, settings=any_engine.settings)


def test_idle_sessions_end_and_owners_are_capped(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, interactive_idle_s=1.0,
                     interactive_max_per_owner=1) as engine:
        _, record = start(engine, "cat", stdin="pipe", wait=0.0, owner="o1")
        refused = engine.run("cat", stdin="pipe", timeout_s=0.1, policy=SESSION, owner="o1")
        assert refused.error is not None and "interactive_max_per_owner" in refused.error.message
        other = engine.run("true", stdin="pipe", timeout_s=5, policy=SESSION, owner="o2")
        assert other.error is None and other.exit_code == 0
        out = interactive.collect(record, 0, Collect(wait_s=10), engine.settings)
        assert not out.running and "idle limit" in out.output


def test_pty_output_cap(tmp_path: Path, janitor: Janitor) -> None:
    with engine_with(tmp_path, janitor, limit_output_mb=1) as engine:
        _, record = start(engine, "yes", wait=0.0)
        out = interactive.collect(record, 0, Collect(wait_s=20, max_bytes=1), engine.settings)
        out = interactive.collect(record, 0, Collect(wait_s=20, max_bytes=1), engine.settings)
        assert not out.running
        tail = Path(record.output_path).read_bytes()[-200:]
        assert b"cap of 1 MiB" in tail


def test_a_big_write_arrives_whole(any_engine: Engine) -> None:
    """More than one datagram of the supervisor's socket, to a slow reader."""
    _, record = start(any_engine, "sleep 0.5; wc -c", stdin="pipe", wait=0.0)
    data = bytes(range(256)) * 1200  # 307,200 bytes
    written = interactive.write(record, data)
    assert written == len(data)
    out = interactive.exchange(any_engine.settings, record, b"", Collect(wait_s=15),
                               close_input=True)
    assert out.output.strip() == str(len(data)) and out.exit_code == 0

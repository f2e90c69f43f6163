"""Interactive processes as people and agents get them: the CLI under a real terminal,
piped stdin, and the codex and native dialects over MCP (stdio) with the Python and the
TypeScript SDK clients, all on a real local fleet (`bashfleet up`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import termios
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .helpers import Cli, bashfleet_command, local_fleet, typescript_client
from .test_mcp import call, mcp

HOST = "inter-e2e"
#: Longest wait for a terminal to show something.
EXPECT_S = 30.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    state_dir = tmp_path_factory.mktemp("inter-fleet")
    with local_fleet(state_dir, "--hosts", HOST, "--no-flower") as cli:
        yield cli


# --------------------------------------------------------------- a terminal, for people


class Terminal:
    """A process on a pseudo-terminal of ours, as a person's terminal emulator runs it."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env,
                                     start_new_session=True)
        os.close(slave)
        self.seen = b""

    def expect(self, pattern: str, timeout: float = EXPECT_S) -> re.Match[bytes]:
        """Read until `pattern` shows up in everything shown since the last match."""
        regex = re.compile(pattern.encode())
        deadline = time.monotonic() + timeout
        while True:
            found = regex.search(self.seen)
            if found is not None:
                self.seen = self.seen[found.end():]
                return found
            left = deadline - time.monotonic()
            assert left > 0, f"{pattern!r} never showed; the terminal shows {self.seen[-2000:]!r}"
            import select  # noqa: PLC0415

            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:  # the process ended and closed its side
                    time.sleep(0.05)

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait(self, timeout: float = EXPECT_S) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        os.close(self.master)


@contextlib.contextmanager
def terminal(cli: Cli, *args: str) -> Iterator[Terminal]:
    term = Terminal([*bashfleet_command(), *args], cli.env)
    try:
        yield term
    finally:
        term.close()


def test_run_tty_detach_write_and_attach(fleet: Cli) -> None:
    with terminal(fleet, "run", "--host", HOST, "--tty", "python3 -q") as term:
        term.expect(">>> ")
        term.send(b"print(6*7)\r")
        term.expect(r"42\r\n>>> ")
        term.send(b"\x1d")  # Ctrl-]: detach, the job keeps running
        job = term.expect(r"detached from job (j[0-9a-f]+)").group(1).decode()
        assert term.wait() == 0
    written = fleet("write", job, "print(1+1)")
    assert written.returncode == 0, written.stderr
    assert "2\n" in written.stdout and "running" in written.stderr
    with terminal(fleet, "attach", job) as term:
        term.expect(f"attached to job {job}")
        term.send(b"import os; print(os.get_terminal_size())\r")
        term.expect(r"columns=100, lines=30")  # the person's window size
        term.send(b"exit(5)\r")
        term.expect("ended: exit code 5")
        assert term.wait() == 5


def test_run_tty_ctrl_c_is_the_remote_terminals(fleet: Cli) -> None:
    with terminal(fleet, "run", "--host", HOST, "--tty",
                  "trap 'echo got INT' INT; echo ready; sleep 30 & wait; echo after") as term:
        term.expect("ready")
        term.send(b"\x03")
        term.expect("got INT")
        term.expect("after")
        assert term.wait() == 0


def test_piped_stdin_is_forwarded(fleet: Cli) -> None:
    sorted_ = fleet("run", "--host", HOST, "sort -r", input="a\nc\nb\n")
    assert sorted_.returncode == 0, sorted_.stderr
    assert sorted_.stdout == "c\nb\na\n"
    data = "".join(f"line {n} ✓\n" for n in range(20_000))  # ~230 KB, several writes
    echoed = fleet("run", "--host", HOST, "cat", input=data, timeout=120)
    assert echoed.returncode == 0 and echoed.stdout == data
    status = fleet("run", "--host", HOST, "read v; echo \"[$v]\"; exit 7", input="x\n")
    assert status.returncode == 7 and status.stdout == "[x]\n"
    ignored = fleet("run", "--host", HOST, "--no-stdin", "cat", input="dropped\n")
    assert ignored.returncode == 0 and ignored.stdout == ""
    refused = fleet("run", "--host", HOST, "--json", "cat", input="x")
    assert refused.returncode == 2 and "--no-stdin" in refused.stderr


# ---------------------------------------------------------------------- agents over MCP


def _session_of(text: str) -> int:
    found = re.search(r"Process running with session ID (\d+)", text)
    assert found is not None, text
    return int(found.group(1))


@pytest.mark.anyio
async def test_codex_drives_a_repl_a_prompt_and_refuses_pipe_writes(fleet: Cli) -> None:
    session = f"e2e-codex-{uuid.uuid4().hex[:10]}"
    async with mcp(fleet, "codex", "--host", HOST, session=session) as client:
        text, error = await call(client, "exec_command",
                                 {"cmd": "python3 -i -q", "tty": True, "login": False})
        assert not error and 'Process is waiting for input after printing: ">>> "' in text
        repl = _session_of(text)
        text, error = await call(client, "write_stdin",
                                 {"session_id": repl, "chars": "print(6*7)\n"})
        assert not error and re.search(r"Output:\n.*42", text, re.S), text
        text, _ = await call(client, "exec_command",
                             {"cmd": "read -p 'Continue? ' a; echo \"got $a\"", "tty": True})
        assert 'after printing: "Continue? "' in text
        prompt = _session_of(text)
        text, _ = await call(client, "write_stdin",
                             {"session_id": prompt, "chars": "yes\n", "yield_time_ms": 5000})
        assert "Process exited with code 0" in text and "got yes" in text
        text, _ = await call(client, "exec_command", {"cmd": "sleep 2; echo slept",
                                                      "yield_time_ms": 250})
        piped = _session_of(text)
        text, error = await call(client, "write_stdin", {"session_id": piped, "chars": "x"})
        assert error
        assert text == "stdin is closed for this session; rerun exec_command with tty=true"
        text, _ = await call(client, "write_stdin", {"session_id": piped})
        assert "Process exited with code 0" in text and "slept" in text
        key = f"/tmp/bashfleet-e2e-{uuid.uuid4().hex[:8]}"
        text, _ = await call(client, "exec_command",
                             {"cmd": f"ssh-keygen -q -t ed25519 -f {key}", "tty": True})
        assert "after printing: \"Enter passphrase" in text, text
        keygen = _session_of(text)
        text, _ = await call(client, "write_stdin", {"session_id": keygen, "chars": "\n",
                                                     "yield_time_ms": 3000})
        assert "same passphrase" in text
        text, _ = await call(client, "write_stdin", {"session_id": keygen, "chars": "\n",
                                                     "yield_time_ms": 5000})
        assert "Process exited with code 0" in text
        await call(client, "exec_command", {"cmd": f"rm -f {key} {key}.pub"})
        text, _ = await call(client, "exec_command", {
            "cmd": "python3 -u -m http.server 0 --bind 127.0.0.1", "tty": True,
            "yield_time_ms": 3000})
        assert "Serving HTTP on 127.0.0.1" in text and "waiting for input" not in text
        server = _session_of(text)
        text, _ = await call(client, "write_stdin", {"session_id": server, "chars": "\u0003",
                                                     "yield_time_ms": 5000})
        assert "Keyboard interrupt received" in text and "Process exited with code 0" in text
    # A second server process of the same session reaches the REPL the first one started.
    async with mcp(fleet, "codex", "--host", HOST, session=session) as client:
        text, error = await call(client, "write_stdin", {
            "session_id": repl, "chars": "import sys; sys.exit(3)\n", "yield_time_ms": 5000})
        assert not error and "Process exited with code 3" in text, text
        text, error = await call(client, "write_stdin", {"session_id": repl})
        assert error and text == f"Unknown session id {repl}"


@pytest.mark.anyio
async def test_native_drives_a_repl_and_a_dev_server(fleet: Cli) -> None:
    async with mcp(fleet, "native", "--host", HOST) as client:
        text, error = await call(client, "bash", {"command": "python3 -i -q", "tty": True})
        assert not error and "WAITING FOR INPUT" in text and '">>> "' in text
        job = re.search(r"job (j[0-9a-f]+)", text)
        assert job is not None
        text, _ = await call(client, "bash_write", {"id": job.group(1), "input": "print(6*7)\n"})
        assert "new output:\nprint(6*7)\n42" in text
        text, _ = await call(client, "bash_write", {"id": job.group(1), "input": "exit()\n"})
        # The write returns once the echo has been quiet for the settle time; on a loaded
        # host the interpreter may end after that, so a look without input reads its end.
        for _ in range(10):
            if "exited with code" in text:
                break
            text, _ = await call(client, "bash_write", {"id": job.group(1), "timeout": 2})
        assert "exited with code 0" in text, text
        server = ("python3 -u -m http.server 0 --bind 127.0.0.1")
        text, _ = await call(client, "bash", {"command": server, "tty": True,
                                              "mode": "background"})
        dev = re.search(r"job (j[0-9a-f]+)", text)
        assert dev is not None
        seen = ""
        for _ in range(20):
            text, _ = await call(client, "bash_write", {"id": dev.group(1), "timeout": 2})
            seen += text
            if "Serving HTTP" in seen:
                break
        port = re.search(r"port (\d+)", seen)
        assert port is not None, seen
        fetch = (f"python3 -c \"import urllib.request as u; print(u.urlopen("
                 f"'http://127.0.0.1:{port.group(1)}/').status)\"")
        text, _ = await call(client, "bash", {"command": fetch})
        assert "200" in text
        text, _ = await call(client, "bash_write", {"id": dev.group(1), "timeout": 3})
        assert '"GET / HTTP/1.1" 200' in text and "WAITING FOR INPUT" not in text
        text, _ = await call(client, "bash_write", {"id": dev.group(1), "input": "\u0003"})
        assert "Keyboard interrupt received" in text and "exited with code 0" in text


def test_typescript_sdk_client_drives_codex_and_native(fleet: Cli) -> None:
    script = typescript_client("mcp_client.mjs")
    for dialect, steps, expected in (
        ("codex", [
            {"tool": "exec_command", "arguments": {"cmd": "python3 -i -q", "tty": True}},
            {"tool": "write_stdin", "arguments": {"session_id": "$SESSION",
                                                  "chars": "print(6*7)\n"}},
            {"tool": "write_stdin", "arguments": {"session_id": "$SESSION", "chars": "exit()\n",
                                                  "yield_time_ms": 5000}},
        ], ["waiting for input", "42", "Process exited with code 0"]),
        ("native", [
            {"tool": "bash", "arguments": {"command": "read -p 'Name? ' n; echo \"hi $n\"",
                                           "tty": True}},
            {"tool": "bash_write", "arguments": {"id": "$JOB", "input": "ts\n"}},
        ], ["WAITING FOR INPUT", "hi ts"]),
    ):
        server = [*bashfleet_command(), "mcp", "--dialect", dialect, "--host", HOST,
                  "--session", f"e2e-ts-{dialect}-{uuid.uuid4().hex[:8]}"]
        done = subprocess.run(["node", str(script), json.dumps(server), json.dumps(steps)],
                              env=fleet.env, capture_output=True, text=True, timeout=180,
                              check=False, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr[-3000:]
        answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        assert len(answer["tools"]) >= 2
        for result, text in zip(answer["results"], expected, strict=True):
            assert text in result["text"], (dialect, result)
            assert not result["isError"], (dialect, result)

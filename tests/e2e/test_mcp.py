"""`bashfleet mcp` as an agent harness runs it: the SDK's stdio client launches the server,
which runs every call on a real local fleet (`bashfleet up`), for each of the five dialects.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
import redis
from mcp import ClientSession, types
from mcp.client.stdio import StdioServerParameters, stdio_client

from worker.wire import auth

from .helpers import Cli, bashfleet_command, kill_recorded, wait_for

REPO = Path(__file__).resolve().parents[2]
HOST = "mcp-a"
DIALECTS = ["pipe", "modes", "pi", "claude", "native"]
#: Longest wait for one MCP answer: a hung server fails the test, not the suite.
READ_TIMEOUT_S = 60.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    cli = Cli(tmp_path_factory.mktemp("mcp-fleet"))
    up = cli("up", "--hosts", HOST, "--no-flower", "--detach", timeout=120)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        yield cli
    finally:
        down = cli("down", timeout=120)
        kill_recorded(cli)
        assert down.returncode == 0, down.stderr


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sessions' working directory (the fleet is local: the host sees it too)."""
    return tmp_path_factory.mktemp("mcp-work")


def _end_server(session: str) -> None:
    """Fallback if the client's shutdown failed: end our server process, by its pid."""
    for proc in psutil.Process().children(recursive=True):
        try:
            if session in proc.cmdline():
                proc.kill()
                proc.wait(10)
        except psutil.Error:
            continue


@asynccontextmanager
async def mcp(
    cli: Cli, dialect: str, *options: str, session: str | None = None
) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session on `bashfleet mcp --dialect D` (a subprocess)."""
    session = session or f"e2e-{dialect}-{uuid.uuid4().hex[:12]}"
    command, *first = bashfleet_command()
    args = [*first, "mcp", "--dialect", dialect, "--session", session, *options]
    params = StdioServerParameters(command=command, args=args, env=cli.env, cwd=REPO)
    log_path = cli.state_dir / f"{session}.log"
    try:
        with log_path.open("w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write, read_timeout_seconds=READ_TIMEOUT_S) as client,
            ):
                await client.initialize()
                yield client
    finally:
        _end_server(session)


async def call(client: ClientSession, tool: str, args: dict[str, Any]) -> tuple[str, bool]:
    """(text, is_error) of one tool call."""
    result = await client.call_tool(tool, args)
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text, result.is_error


def gone(pid: int) -> bool:
    """True once the process is dead (a zombie awaiting its parent counts)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def wait_async(check: Any, what: str, timeout: float = 30.0) -> None:
    """`wait_for` for an async condition (a tool call), backing off between tries."""
    delay = 0.05
    with anyio.move_on_after(timeout):
        while not await check():
            await anyio.sleep(delay)  # polling a job's output: back off while it is quiet
            delay = min(delay * 2, 0.5)
        return
    pytest.fail(f"timed out waiting for {what}")


def session_record(cli: Cli, session: str) -> tuple[dict[str, Any], int]:
    """A session's state as stored in the fleet's Redis, and its TTL."""
    client = redis.Redis.from_url(cli.fleet_state()["redis_url"], decode_responses=True)
    try:
        key = f"bashfleet:session-state:{session}"
        raw = client.get(key)
        assert isinstance(raw, str), f"no session state under {key}"
        # Sealed with the fleet's signing key (a forged state would never be used).
        state = auth.unseal(
            auth.keyring([cli.fleet_state()["signing_key"]]), auth.SESSION_STATE, session, raw
        )
        return json.loads(state), int(client.ttl(key))
    finally:
        client.close()


# ----------------------------------------------------------------- every dialect


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_tools_match_bashfleet_schema(fleet: Cli, workdir: Path, dialect: str) -> None:
    schema = fleet("schema", "--dialect", dialect, "--style", "mcp", "--cwd", str(workdir))
    assert schema.returncode == 0, schema.stderr
    async with mcp(fleet, dialect, "--cwd", str(workdir)) as client:
        listed = await client.list_tools()
    tools = [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in listed.tools]
    assert tools == json.loads(schema.stdout)


def test_unknown_dialect_is_a_usage_error(fleet: Cli) -> None:
    for command in (("mcp", "--dialect", "bogus"), ("schema", "--dialect", "bogus")):
        out = fleet(*command)
        assert out.returncode == 2
        known = "claude, codex, modes, native, pi, pipe"
        assert f"unknown dialect 'bogus'; known dialects: {known}" in out.stderr


# ------------------------------------------------------------------------------ pipe


@pytest.mark.anyio
async def test_pipe(fleet: Cli, workdir: Path) -> None:
    async with mcp(fleet, "pipe", "--cwd", str(workdir)) as client:
        text, error = await call(client, "bash", {"command": "echo hi; echo oops >&2"})
        assert (text, error) == ("stdout:\nhi\n\nstderr:\noops\n\nexit code: 0", False)
        text, error = await call(client, "bash", {"command": "exit 4"})
        assert error and text.endswith("exit code: 4")

        # Past its timeout a command goes on in the background, addressed by its pid.
        text, error = await call(
            client, "bash", {"command": "echo begin; sleep 60", "timeout": 1000}
        )
        assert not error and text.startswith("[Command backgrounded after 1s timeout (pid ")
        pid = int(re.findall(r"\(pid (\d+)\)", text)[0])
        text, error = await call(client, "bash", {"check_pid": pid})
        assert not error and text.startswith(f"[Process {pid} still running.")
        text, error = await call(client, "bash", {"kill_pid": pid})
        assert not error and text.startswith(f"[Process {pid} killed (SIGTERM).")
        wait_for(lambda: gone(pid), f"pid {pid} to end")

        text, error = await call(client, "bash", {"check_pid": 1})
        assert (text, error) == (
            f"Error: no backgrounded process with pid 1 in this session (known pids: {pid})",
            True,
        )
        text, error = await call(client, "bash", {"command": "ls", "check_pid": pid})
        assert error and "give exactly one of command, check_pid or kill_pid" in text


# ----------------------------------------------------------------------------- modes


@pytest.mark.anyio
async def test_modes(fleet: Cli, workdir: Path) -> None:
    async with mcp(fleet, "modes", "--cwd", str(workdir), "--host", HOST) as client:
        assert await call(client, "bash", {"command": "echo x; exit 3"}) == (
            "[command failed: exit code 3]\nx\n",
            True,
        )
        assert await call(client, "bash", {"command": "pwd"}) == (f"{workdir}\n", False)

        text, error = await call(
            client, "bash", {"command": "echo started; sleep 60", "mode": "background"}
        )
        assert not error, text
        match = re.fullmatch(
            r"<pid>(\d+)</pid>\n<output_file>(.+)</output_file>\n"
            r"<reminder>To stop: kill -9 -(\d+)</reminder>",
            text,
        )
        assert match, text
        pgid, output = int(match[1]), Path(match[2])
        wait_for(lambda: output.exists() and "started" in output.read_text(), "the job's output")
        assert not gone(pgid)
        # The seed's way to stop it: kill its group, in a call on the same host.
        assert await call(client, "bash", {"command": f"kill -9 -{pgid}"}) == ("", False)
        wait_for(lambda: gone(pgid), f"pgid {pgid} to end")

        text, error = await call(client, "bash", {"command": "ls", "mode": "turbo"})
        assert error and text.startswith("[invalid input: ")
        assert (await call(client, "bash", {"mode": "slow"}))[1] is True


# -------------------------------------------------------------------------------- pi


@pytest.mark.anyio
async def test_pi(fleet: Cli, workdir: Path) -> None:
    async with mcp(fleet, "pi", "--cwd", str(workdir)) as client:
        assert await call(client, "bash", {"command": "true"}) == ("(no output)", False)
        assert await call(client, "bash", {"command": "echo x; exit 3"}) == (
            "x\n\n\nCommand exited with code 3",
            True,
        )
        assert await call(client, "bash", {"command": "seq 1 10", "head": 3}) == (
            "1\n2\n3\n",
            False,
        )
        assert await call(client, "bash", {"command": "seq 1 10 | tail -n 2"}) == (
            "9\n10\n",
            False,
        )
        assert await call(client, "bash", {"command": "pwd"}) == (f"{workdir}\n", False)
        text, error = await call(client, "bash", {"command": "ls", "cwd": "/no/such/dir"})
        assert error and "/no/such/dir" in text
        text, error = await call(client, "bash", {"command": "ls", "head": "ten"})
        assert error and text.startswith('Validation failed for tool "bash":')
        # pi has no background jobs.


# ---------------------------------------------------------------------------- claude


@pytest.mark.anyio
async def test_claude(fleet: Cli, workdir: Path) -> None:
    async with mcp(fleet, "claude", "--cwd", str(workdir)) as client:
        assert await call(client, "Bash", {"command": "echo hello"}) == ("hello", False)
        assert await call(client, "Bash", {"command": "echo x; exit 3"}) == (
            "Exit code 3\nx",
            True,
        )

        text, error = await call(
            client,
            "Bash",
            {"command": "echo started; sleep 60", "run_in_background": True},
        )
        assert not error and text.startswith("Command running in background with ID: ")
        bash_id = text.rsplit(" ", 1)[1]

        async def started() -> bool:
            text, error = await call(client, "BashOutput", {"bash_id": bash_id})
            assert not error and text.startswith("<status>running</status>"), text
            return "started" in text

        await wait_async(started, "the shell's first line")
        text, error = await call(client, "KillBash", {"bash_id": bash_id})
        assert (text, error) == (
            f"Successfully killed shell: {bash_id} (echo started; sleep 60)",
            False,
        )
        text, _ = await call(client, "BashOutput", {"bash_id": bash_id})
        assert text.startswith("<status>killed</status>")
        text, error = await call(client, "KillBash", {"bash_id": bash_id})
        assert error and "is not running, so cannot be killed (status: killed)" in text

        assert await call(client, "BashOutput", {"bash_id": "nope"}) == (
            "No shell found with ID: nope",
            True,
        )
        text, error = await call(client, "Bash", {"command": "ls", "timeout": 600001})
        assert error and text.startswith(
            "InputValidationError: Bash failed due to the following issue:\ntimeout 600001 ms"
        )


@pytest.mark.anyio
async def test_claude_session_carries_state_across_calls_and_restarts(
    fleet: Cli, workdir: Path
) -> None:
    """FR-009: exports and `cd` persist, in Redis, so a restarted server resumes them."""
    (workdir / "sub").mkdir(exist_ok=True)
    session = f"e2e-claude-state-{uuid.uuid4().hex[:8]}"
    async with mcp(fleet, "claude", "--cwd", str(workdir), session=session) as client:
        assert await call(client, "Bash", {"command": "export GREETING=hi; cd sub"}) == (
            "<system>Tool ran without output or errors</system>",
            False,
        )
        assert await call(client, "Bash", {"command": 'echo "$GREETING"; pwd'}) == (
            f"hi\n{workdir}/sub",
            False,
        )
    stored, ttl = session_record(fleet, session)
    assert stored["env"] == {"GREETING": "hi"}
    assert stored["cwd"] == f"{workdir}/sub"
    assert stored["host"] == HOST  # pinned by its first call
    assert 0 < ttl <= 24 * 3600
    async with mcp(fleet, "claude", session=session) as client:  # a new server process
        assert await call(client, "Bash", {"command": 'echo "$GREETING"; pwd'}) == (
            f"hi\n{workdir}/sub",
            False,
        )


# ---------------------------------------------------------------------------- native


@pytest.mark.anyio
async def test_native(fleet: Cli, workdir: Path) -> None:
    async with mcp(fleet, "native", "--cwd", str(workdir)) as client:
        text, error = await call(client, "bash", {"command": "echo hi"})
        assert not error
        assert text.startswith(f"exit code: 0\nhost {HOST} · call ")
        assert text.endswith(f" · cwd {workdir}\n\nstdout:\nhi")

        text, error = await call(
            client, "bash", {"command": "echo started; sleep 60", "mode": "background"}
        )
        assert not error and text.startswith("started in background as job "), text
        job, pid = re.findall(r"as job (\S+) on host \S+ \(pid (\d+),", text)[0]

        async def started() -> bool:
            text, error = await call(client, "bash_check", {"id": job})
            assert not error and text.startswith(f"job {job} on host {HOST}: running"), text
            return "started" in text

        await wait_async(started, "the job's first line")
        text, error = await call(client, "bash_kill", {"id": job})
        assert not error
        assert text.startswith(f"job {job} on host {HOST}: stopped; killed by signal SIGTERM")
        wait_for(lambda: gone(int(pid)), f"pid {pid} to end")

        text, error = await call(client, "bash_check", {"id": "jnope"})
        assert (text, error) == (
            "[system error: UnknownJob: no such job: jnope (unknown or expired)]",
            True,
        )
        text, error = await call(client, "bash", {"command": "ls", "host": "nohost"})
        assert error and text.startswith("[system error: HostUnavailable: no live worker")
        text, error = await call(client, "bash", {"command": "ls", "timeout": "soon"})
        assert error and "timeout" in text


def test_the_servers_ended_with_their_clients(fleet: Cli) -> None:
    """Every server the tests started ended with its client's shutdown."""
    del fleet
    servers = [
        proc
        for proc in psutil.Process().children(recursive=True)
        if {"mcp", "--dialect"} <= set(proc.cmdline()) and not gone(proc.pid)
    ]
    assert servers == []

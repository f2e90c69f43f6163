"""`bashfleet mcp` as an agent harness runs it: the SDK's stdio client launches the server,
which runs every call on a real local fleet (`bashfleet up`), for each of the five dialects.
"""

from __future__ import annotations

import contextlib
import getpass
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

from bashfleet.worker.wire import auth

from .helpers import Cli, bashfleet_command, local_fleet, wait_for

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
    state_dir = tmp_path_factory.mktemp("mcp-fleet")
    with local_fleet(state_dir, "--hosts", HOST, "--no-flower") as cli:
        yield cli


@pytest.fixture(scope="module")
def workdir(fleet: Cli) -> Path:
    """The sessions' working directory: a project the local fleet allows, so a session
    opened there (`--cwd`) has it as its workspace (the fleet is local: the test sees it
    too)."""
    return fleet.project()


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


def host_process_gone(pid: int) -> bool:
    """True once a process of this machine is dead (a zombie awaiting its parent counts)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def gone(client: ClientSession, tool: str, pid: int) -> bool:
    """True once `pid`, a number the session was shown (its workspace's), no longer runs
    there, as the model's next call sees it (a zombie counts as gone)."""
    command = f"ps -o stat= -p {pid} | grep -qv Z || echo gone-{pid}"
    text, _ = await call(client, tool, {"command": command})
    return f"gone-{pid}" in text


async def wait_async(check: Any, what: str, timeout: float = 30.0) -> None:
    """`wait_for` for an async condition (a tool call), backing off between tries."""
    delay = 0.05
    with anyio.move_on_after(timeout):
        while not await check():
            await anyio.sleep(delay)  # polling a job's output: back off while it is quiet
            delay = min(delay * 2, 0.5)
        return
    pytest.fail(f"timed out waiting for {what}")


def session_record(
    cli: Cli, session: str, kind: str = "session-state"
) -> tuple[dict[str, Any], int]:
    """A session's state (or its `shell`) as stored in the fleet's Redis, and its TTL."""
    client = redis.Redis.from_url(cli.fleet_state()["redis_url"], decode_responses=True)
    try:
        key = f"bashfleet:{kind}:{session}"
        raw = client.get(key)
        assert isinstance(raw, str), f"no session state under {key}"
        # Locked with the fleet's signing key (a forged state would never be used, and
        # no owner's client reads it).
        state = auth.unlock(
            auth.keyring([cli.fleet_state()["signing_key"]]),
            auth.SHELL if kind == "shell" else auth.SESSION_STATE, session, raw,
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
        known = "claude, claude-code, codex, modes, native, pi, pipe"
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
        assert not await gone(client, "bash", pid)
        text, error = await call(client, "bash", {"kill_pid": pid})
        assert not error and text.startswith(f"[Process {pid} killed (SIGTERM).")
        await wait_async(lambda: gone(client, "bash", pid), f"pid {pid} to end")

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
        # The file and the pid are the session's: its next call reads and sees them.
        assert await call(client, "bash", {"command": f"cat {output}"}) == ("started\n", False)
        assert not await gone(client, "bash", pgid)
        # The modes tool's way to stop it: kill its group, in a call on the same host.
        assert await call(client, "bash", {"command": f"kill -9 -{pgid}"}) == ("", False)
        await wait_async(lambda: gone(client, "bash", pgid), f"pgid {pgid} to end")

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
    """Exports and `cd` persist, in Redis, so a restarted server resumes them."""
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
    # The session's shell is a fleet session of the same id: in Redis, with a TTL, and
    # shared with `bashfleet run --session`.
    stored, ttl = session_record(fleet, session, "shell")
    assert stored["env"] == {"GREETING": "hi"}
    assert stored["cwd"] == f"{workdir}/sub"
    assert stored["host"] == HOST  # pinned by its first call
    assert 0 < ttl <= 24 * 3600
    # The CLI shares it as the session's owner (`session:<id>`: its workspace is that
    # owner's); as another owner it is refused, and the session keeps its workspace.
    refused = fleet("run", "--session", session, "pwd")
    assert refused.returncode != 0 and "of another owner" in refused.stderr, refused.stderr
    as_owner = Cli(fleet.state_dir)
    as_owner.env["BASHFLEET_OWNER"] = f"session:{session}"
    shared = as_owner("run", "--session", session, 'echo "$GREETING"; pwd')
    assert shared.stdout == f"hi\n{workdir}/sub\n", shared.stderr
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
        assert not await gone(client, "bash", int(pid))
        text, error = await call(client, "bash_kill", {"id": job})
        assert not error
        assert text.startswith(f"job {job} on host {HOST}: stopped; killed by signal SIGTERM")
        await wait_async(lambda: gone(client, "bash", int(pid)), f"pid {pid} to end")

        text, error = await call(client, "bash_check", {"id": "jnope"})
        assert (text, error) == (
            "[system error: UnknownJob: no such job: jnope (unknown or expired)]",
            True,
        )
        text, error = await call(client, "bash", {"command": "ls", "host": "nohost"})
        assert error and text.startswith("[system error: HostUnavailable: no live worker")
        text, error = await call(client, "bash", {"command": "ls", "timeout": "soon"})
        assert error and "timeout" in text


# ------------------------------------------------------------- long calls, cancellation


@pytest.mark.anyio
async def test_a_long_call_sends_progress_with_its_output(fleet: Cli) -> None:
    """Progress notifications while the call runs, its last output lines as the message."""
    notes: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append((progress, message))

    async with mcp(fleet, "pipe") as client:
        result = await client.call_tool(
            "bash", {"command": "for i in $(seq 1 12); do echo tick $i; sleep 1; done"},
            progress_callback=on_progress,
        )
    assert not result.is_error
    assert len(notes) >= 2, notes
    assert [p for p, _ in notes] == sorted(p for p, _ in notes)
    assert any(m and m.startswith("running for ") and "last output:\ntick " in m
               for _, m in notes), notes


def sleeping(seconds: str) -> list[int]:
    """Pids of live `sleep SECONDS` processes."""
    return [p.pid for p in psutil.process_iter(["cmdline", "status"])
            if p.info["cmdline"] == ["sleep", seconds] and p.info["status"] != "zombie"]


@pytest.mark.anyio
@pytest.mark.parametrize("dialect", ["native", "modes"])
async def test_a_cancelled_request_cancels_its_call(fleet: Cli, dialect: str) -> None:
    """`notifications/cancelled` used to be ignored: the command ran on, out of reach."""
    seconds = f"5{uuid.uuid4().int % 10**6:06d}"
    async with mcp(fleet, dialect) as client:
        with anyio.move_on_after(60) as scope:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(client.call_tool, "bash", {"command": f"sleep {seconds}"})
                await anyio.to_thread.run_sync(
                    lambda: wait_for(lambda: sleeping(seconds), "the command to run")
                )
                tasks.cancel_scope.cancel()  # the client gives up on the request
        assert not scope.cancelled_caught
        wait_for(lambda: not sleeping(seconds), "the command to be killed")
        # The server goes on serving.
        text, error = await call(client, "bash", {"command": "echo still here"})
        assert not error and "still here" in text
    wait_for(lambda: all(h["busy"] == 0 for h in json.loads(fleet("hosts", "--json").stdout)),
             "the slot to be freed")


@pytest.mark.anyio
@pytest.mark.parametrize("tty", [False, True])
async def test_a_cancelled_codex_exec_command_leaves_nothing_running(
    fleet: Cli, tty: bool
) -> None:
    """A cancelled `exec_command` once left its process running as a job the model never
    got a session id for (the other five dialects cleaned up)."""
    seconds = f"6{uuid.uuid4().int % 10**6:06d}"
    async with mcp(fleet, "codex") as client:
        with anyio.move_on_after(60) as scope:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(client.call_tool, "exec_command", {
                    "cmd": f"sleep {seconds}", "yield_time_ms": 20000, "tty": tty,
                })
                await anyio.to_thread.run_sync(
                    lambda: wait_for(lambda: sleeping(seconds), "the command to run")
                )
                tasks.cancel_scope.cancel()  # the client gives up on the request
        assert not scope.cancelled_caught
        # Killed at once (its engine sees the cancel flag at its next look), well before
        # its 20 s yield would have brought the session's first answer back.
        wait_for(lambda: not sleeping(seconds), "the command to be killed", timeout=8)
        text, error = await call(client, "exec_command", {"cmd": "echo still here"})
        assert not error and "still here" in text
    assert not [job for job in json.loads(fleet("ps", "--all", "--json").stdout)
                if seconds in job["command"] and job.get("state") != "ended"]


# --------------------------------------------------------------- sessions, hints, texts


@pytest.mark.anyio
async def test_natives_session_is_a_fleet_session(fleet: Cli, workdir: Path) -> None:
    """The `session` argument's shell is a fleet session, in Redis: another server process
    of the same MCP session (a restart) and the CLI as its owner share it (it used to live
    inside one server's own session). It lives in its maker's workspace, whose owner is
    that MCP session: another MCP session naming it is refused, not run elsewhere."""
    (workdir / "shared").mkdir(exist_ok=True)
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    agent = f"e2e-native-{uuid.uuid4().hex[:8]}"
    async with mcp(fleet, "native", "--cwd", str(workdir), session=agent) as first:
        text, error = await call(first, "bash", {"command": "cd shared; export N=1",
                                                 "session": name})
        assert not error and f"session {name}: ended in {workdir}/shared" in text, text
    async with mcp(fleet, "native", session=agent) as again:  # another server process
        text, error = await call(again, "bash", {"command": "pwd; echo $N", "session": name})
        assert not error and f"stdout:\n{workdir}/shared\n1" in text, text
    as_owner = Cli(fleet.state_dir)
    as_owner.env["BASHFLEET_OWNER"] = f"session:{agent}"
    shared = as_owner("run", "--session", name, "pwd; echo $N")
    assert shared.stdout == f"{workdir}/shared\n1\n", shared.stderr
    async with mcp(fleet, "native") as other:  # another agent's session: another owner
        text, error = await call(other, "bash", {"command": "pwd", "session": name})
        assert error and f"session {name} runs in workspace " in text, text


@pytest.mark.anyio
async def test_natives_hints_are_tool_calls_it_has(fleet: Cli) -> None:
    """The cut notice names `bash_output` (a tool of the model's), which reads the rest
    (it used to name `bashfleet output`, a CLI the call's environment cannot reach)."""
    async with mcp(fleet, "native") as client:
        text, _ = await call(client, "bash", {"command": "seq 1 3000"})
        hint = re.search(r"Full output: bash_output id=(\S+) \(", text)
        assert hint is not None and "bashfleet output" not in text, text
        text, error = await call(client, "bash_output", {"id": hint.group(1)})
    assert not error
    head, body, tail = text.split("\n\n")
    assert head.startswith(f"{hint.group(1)} stdout: bytes 0-")
    assert body.splitlines() == [str(n) for n in range(1, 3001)]
    assert tail == "end of the output"


@pytest.mark.anyio
async def test_natives_kill_counts_the_lines_it_shows(fleet: Cli) -> None:
    """`bash_kill` said "final output (20 lines)" and showed 17 (the trailer was counted)."""
    async with mcp(fleet, "native") as client:
        text, _ = await call(client, "bash", {"command": "seq 1 17; sleep 60",
                                              "mode": "background"})
        job, output = re.findall(r"as job (\S+) .*; output: (\S+)", text)[0]
        wait_for(lambda: Path(output).read_text().count("\n") >= 17, "the job's 17 lines")
        text, error = await call(client, "bash_kill", {"id": job})
    assert not error
    shown = text.split("final output (17 lines):\n", 1)[1]
    assert shown.splitlines() == [str(n) for n in range(1, 18)]


@pytest.mark.anyio
async def test_pis_artifacts_are_resources(fleet: Cli) -> None:
    """`Full: artifact://<id>` names a resource the server lists and reads (it used to
    answer -32601 to both)."""
    full = "".join(f"{n}\n" for n in range(1, 20001))
    async with mcp(fleet, "pi") as client:
        text, error = await call(client, "bash", {"command": "seq 1 20000"})
        artifact = re.search(r"Full: (artifact://\S+)\]$", text)
        assert not error and artifact is not None, text[-300:]
        listed = await client.list_resources()
        assert artifact.group(1) in [str(r.uri) for r in listed.resources]
        read = await client.read_resource(artifact.group(1))
    [content] = read.contents
    assert isinstance(content, types.TextResourceContents) and content.text == full


@pytest.mark.anyio
async def test_three_parallel_claude_calls_keep_the_cd(fleet: Cli) -> None:
    """Three parallel `Bash` calls in a fresh session: a quick `cd /tmp` used to be lost
    to a slower call that did not `cd` and finished later."""
    async with mcp(fleet, "claude") as client:
        async with anyio.create_task_group() as tasks:
            for command in ("cd /tmp; export A=1", "sleep 1; export B=2", "sleep 2; export C=3"):
                tasks.start_soon(call, client, "Bash", {"command": command})
        assert await call(client, "Bash", {"command": "pwd; echo $A$B$C"}) == ("/tmp\n123", False)


@pytest.mark.anyio
async def test_pis_head_and_tail_are_whole_lines(fleet: Cli) -> None:
    """The schema said `number` and 2.5 was refused (`integer, minimum 0`): the schema
    says so now, and the refusal matches it."""
    async with mcp(fleet, "pi") as client:
        listed = await client.list_tools()
        head = listed.tools[0].input_schema["properties"]["head"]
        assert (head["type"], head["minimum"]) == ("integer", 0)
        assert await call(client, "bash", {"command": "seq 10", "head": 3}) == ("1\n2\n3\n", False)
        text, error = await call(client, "bash", {"command": "seq 10", "head": 2.5})
    assert error and "parameter 'head' must be an integer, not a number (2.5)" in text


@pytest.mark.anyio
async def test_claudes_process_list_shows_the_command(fleet: Cli) -> None:
    """The state capture (for the kept cwd and variables) is not in the command line: a
    process list shows the command as the model wrote it."""
    async with mcp(fleet, "claude") as client:
        text, error = await call(client, "Bash", {"command": "tr '\\0' ' ' < /proc/$$/cmdline"})
    assert not error
    assert text == "bash -c tr '\\0' ' ' < /proc/$$/cmdline", text


# ------------------------------------------------------- the workspaces of a session


@asynccontextmanager
async def unnamed_mcp(cli: Cli, dialect: str) -> AsyncIterator[ClientSession]:
    """`bashfleet mcp --dialect D` with no `--session` (a fresh id no one knows), as most
    harnesses start it; its log beside the fleet's state."""
    command, *first = bashfleet_command()
    params = StdioServerParameters(command=command, args=[*first, "mcp", "--dialect", dialect],
                                   env=cli.env, cwd=REPO)
    before = {proc.pid for proc in psutil.Process().children(recursive=True)}
    try:
        with (cli.state_dir / f"unnamed-{uuid.uuid4().hex[:8]}.log").open("w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write, read_timeout_seconds=READ_TIMEOUT_S) as client,
            ):
                await client.initialize()
                yield client
    finally:
        for proc in psutil.Process().children(recursive=True):  # if its shutdown failed
            with contextlib.suppress(psutil.Error):
                if proc.pid not in before and "mcp" in proc.cmdline():
                    proc.kill()
                    proc.wait(10)


def mcp_workspaces(cli: Cli) -> dict[str, dict[str, Any]]:
    """`bashfleet workspace ls --mcp --json`: the workspaces of this user's MCP servers
    (and of the user), by id."""
    done = cli("workspace", "ls", "--mcp", "--json")
    assert done.returncode == 0, done.stderr
    return {view["id"]: view for view in json.loads(done.stdout)}


async def session_workspace(cli: Cli, client: ClientSession) -> dict[str, Any]:
    """The workspace the session's first call made (a job left running in it)."""
    before = mcp_workspaces(cli)
    text, error = await call(client, "Bash", {"command": "sleep 600 & echo started"})
    assert (text, error) == ("started", False)
    made = [view for ws_id, view in mcp_workspaces(cli).items() if ws_id not in before]
    assert len(made) == 1, made
    return made[0]


@pytest.mark.anyio
async def test_an_unnamed_session_ends_its_workspace_when_its_client_goes(fleet: Cli) -> None:
    """Its workspaces stayed, a `sleep` in each, listed nowhere: no one can resume a
    session whose id no one was given."""
    async with unnamed_mcp(fleet, "claude") as client:
        view = await session_workspace(fleet, client)
        assert view["owner"].startswith("session:mcp-")
        assert view["tags"] == {"started_by": f"user:{getpass.getuser()}"}
    # The client closed the server's stdin: the server deleted it on its way out.
    wait_for(lambda: view["id"] not in mcp_workspaces(fleet), "the workspace to end")


@pytest.mark.anyio
async def test_an_unnamed_session_ends_its_workspace_on_sigterm(fleet: Cli) -> None:
    async with unnamed_mcp(fleet, "pipe") as client:
        before = mcp_workspaces(fleet)
        text, error = await call(client, "bash", {"command": "echo started"})
        assert "started" in text and not error, text
        (view,) = [v for ws_id, v in mcp_workspaces(fleet).items() if ws_id not in before]
        (server,) = [proc for proc in psutil.Process().children(recursive=True)
                     if {"mcp", "pipe"} <= set(proc.cmdline())]
        server.terminate()  # a harness ending its servers
        wait_for(lambda: view["id"] not in mcp_workspaces(fleet), "the workspace to end")
        assert server.wait(30) in (0, None)  # ended, cleanly (None: not our child to reap)


@pytest.mark.anyio
async def test_a_named_sessions_workspace_is_kept_listed_and_removable(fleet: Cli) -> None:
    session = f"e2e-keep-{uuid.uuid4().hex[:8]}"
    async with mcp(fleet, "claude", session=session) as client:
        view = await session_workspace(fleet, client)
    # Kept for the next server of the session; `workspace ls` alone shows the user's.
    assert view["id"] in mcp_workspaces(fleet)
    assert mcp_workspaces(fleet)[view["id"]]["owner"] == f"session:{session}"
    assert view["id"] not in fleet("workspace", "ls", "--json").stdout
    listed = fleet("workspace", "ls", "--mcp")
    row = next(line for line in listed.stdout.splitlines() if line.startswith(view["id"]))
    assert row.split()[-1] == f"session:{session}", listed.stdout
    removed = fleet("workspace", "rm", view["id"])
    assert removed.returncode == 0, removed.stderr
    assert view["id"] not in mcp_workspaces(fleet)


def test_the_servers_ended_with_their_clients(fleet: Cli) -> None:
    """Every server the tests started ended with its client's shutdown."""
    del fleet
    servers = [
        proc
        for proc in psutil.Process().children(recursive=True)
        if {"mcp", "--dialect"} <= set(proc.cmdline()) and not host_process_gone(proc.pid)
    ]
    assert servers == []

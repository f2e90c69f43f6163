"""The MCP server in-process: an SDK client over memory streams, the dialects' FakeRunner,
sessions in a RedisSessionStore on fakeredis."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
import anyio.to_thread
import fakeredis
import pytest
import redis
from mcp import Client, types
from mcp.shared.exceptions import MCPError

from bashfleet.client import cli, mcp_server
from bashfleet.client.dialects import (
    DIALECTS,
    Artifact,
    SessionState,
    ToolText,
    get_dialect,
    schemas,
)
from bashfleet.client.dialects.testing import FakeCall, FakeRunner
from bashfleet.client.errors import (
    CallRejected,
    FleetUnavailable,
    HostUnavailable,
    UnknownCall,
    UnknownJob,
    WorkerLost,
)
from bashfleet.client.fleet import Fleet
from bashfleet.client.mcp_server import (
    CallCancelledError,
    CallWatch,
    FleetBackend,
    FleetRunner,
    SessionRunner,
    StaticBackend,
    ToolServer,
    build_server,
)
from bashfleet.client.sessions import RedisSessionStore
from bashfleet.client.shells import ShellState
from bashfleet.worker.wire.control import CheckRequest, KillRequest, ReadOutputRequest
from bashfleet.worker.wire.models import (
    CallResult,
    CheckResult,
    JobHandle,
    OutputChunk,
    RunRequest,
    Spill,
    TruncationInfo,
)

NAMES = sorted(DIALECTS)


def command_args(name: str, command: str) -> dict[str, object]:
    """The first tool's arguments that run `command` (codex calls it `cmd`)."""
    return {"cmd" if name == "codex" else "command": command}
SESSION = "s-test"
JOB = JobHandle(id="j7", host="h1", pid=700, pgid=700, output_path="/jobs/j7.log")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def store() -> RedisSessionStore:
    return RedisSessionStore(fakeredis.FakeRedis(decode_responses=True))


def tool_server(
    name: str, runner: Any, store: RedisSessionStore, **options: str | None
) -> ToolServer:
    return ToolServer(get_dialect(name), StaticBackend(runner, store), SESSION, **options)


@asynccontextmanager
async def connected(server: ToolServer, mode: str = "legacy") -> AsyncIterator[Client]:
    """An SDK client on the server; `legacy`: JSON-RPC over memory streams."""
    async with Client(build_server(server), mode=mode) as client:
        yield client


def text_of(result: types.CallToolResult) -> ToolText:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return ToolText(block.text, is_error=result.is_error)


def done(**fields: Any) -> CallResult:
    return CallResult(call_id="c1", host="h1", **fields)


# ----------------------------------------------------------------------------- tools


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("name", NAMES)
async def test_list_tools_is_the_dialects_mcp_schema(
    name: str, mode: str, store: RedisSessionStore
) -> None:
    async with connected(tool_server(name, FakeRunner(), store), mode) as client:
        listed = await client.list_tools()
    tools = [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in listed.tools]
    assert tools == schemas(get_dialect(name), style="mcp")


@pytest.mark.anyio
async def test_modes_description_shows_the_session_cwd(store: RedisSessionStore) -> None:
    async with connected(tool_server("modes", FakeRunner(), store, cwd="/src/app")) as client:
        listed = await client.list_tools()
    assert listed.tools[0].description is not None
    assert listed.tools[0].description.endswith("<pwd>/src/app</pwd>")
    assert [t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools] == schemas(
        get_dialect("modes"), cwd="/src/app", style="mcp"
    )
    # Without --cwd, the cwd a stored session has.
    store.save(SESSION, SessionState(cwd="/from/redis"))
    async with connected(tool_server("modes", FakeRunner(), store)) as client:
        listed = await client.list_tools()
    assert listed.tools[0].description is not None
    assert "<pwd>/from/redis</pwd>" in listed.tools[0].description


@pytest.mark.anyio
async def test_tools_are_listed_while_the_fleet_is_down() -> None:
    class Down:
        def connect(self) -> Any:
            raise FleetUnavailable("no fleet configured")

        def reset(self) -> None:
            pass

    server = ToolServer(get_dialect("modes"), Down(), SESSION, cwd="/w")
    async with connected(server) as client:
        listed = await client.list_tools()
        answer = text_of(await client.call_tool("bash", {"command": "ls"}))
    assert [t.name for t in listed.tools] == ["bash"]
    assert answer == ToolText("[system error: FleetUnavailable: no fleet configured]", True)


# ------------------------------------------------------------------------------ calls

CALLS: list[tuple[str, str, dict[str, Any], CallResult]] = [
    ("pipe", "bash", {"command": "echo hi"}, done(exit_code=0, stdout="hi\n")),
    ("modes", "bash", {"command": "echo x; exit 3"}, done(exit_code=3, stdout="x\n")),
    ("pi", "bash", {"command": "true"}, done(exit_code=0)),
    ("claude", "Bash", {"command": "echo hi"}, done(exit_code=0, stdout="hi\n")),
    ("native", "bash", {"command": "make"}, done(exit_code=2, stderr="boom\n")),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("name", "tool", "args", "result"), CALLS)
async def test_a_call_gives_the_dialects_text(
    name: str, tool: str, args: dict[str, Any], result: CallResult, store: RedisSessionStore
) -> None:
    expected = get_dialect(name).call(tool, args, FakeRunner(run=[result]), SessionState())
    runner = FakeRunner(run=[result])
    async with connected(tool_server(name, runner, store)) as client:
        answer = text_of(await client.call_tool(tool, args))
    assert answer == expected
    assert runner.last().target == args["command"]


@pytest.mark.anyio
async def test_is_error_is_carried(store: RedisSessionStore) -> None:
    runner = FakeRunner(run=[done(exit_code=3, stdout="x\n"), done(exit_code=0, stdout="ok\n")])
    async with connected(tool_server("modes", runner, store)) as client:
        failed = await client.call_tool("bash", {"command": "echo x; exit 3"})
        fine = await client.call_tool("bash", {"command": "echo ok"})
    assert failed.is_error is True
    assert text_of(failed).text.startswith("[command failed: exit code 3]")
    assert fine.is_error is False
    assert text_of(fine).text == "ok\n"


BAD_CALLS: list[tuple[str, str, Any]] = [
    ("pipe", "bash", {}),
    ("pipe", "bash", {"command": "ls", "check_pid": 5}),
    ("pipe", "bash", {"check_pid": 12345}),
    ("modes", "bash", {"command": "ls", "mode": "turbo"}),
    ("modes", "bash", {"command": 42}),
    ("pi", "bash", {"command": "ls", "head": "ten"}),
    ("pi", "bash", {"command": ""}),
    ("claude", "Bash", {"command": "ls", "timeout": 10**9}),
    ("claude", "BashOutput", {"bash_id": "no-such-shell"}),
    ("claude", "KillBash", {}),
    ("native", "bash", {"command": "ls", "timeout": -1}),
    ("native", "bash_check", {"id": 5}),
    ("native", "bash", {"command": "ls", "nested": {"a": [1, {"b": None}]}}),
    ("native", "no_such_tool", {"command": "ls"}),
    ("claude", "bash", None),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("name", "tool", "args"), BAD_CALLS)
async def test_bad_arguments_are_error_results(
    name: str, tool: str, args: Any, store: RedisSessionStore
) -> None:
    runner = FakeRunner()
    async with connected(tool_server(name, runner, store)) as client:
        bad = await client.call_tool(tool, args)
        assert bad.is_error is True
        assert text_of(bad).text
        # The server is still there, and serves the next call.
        first_tool = get_dialect(name).tools()[0].name
        good = await client.call_tool(first_tool, {"command": "true"})
    assert good.is_error is False
    assert [c.target for c in runner.calls if c.method == "run"] == ["true"]


FLEET_ERRORS = [
    FleetUnavailable("Redis at redis://:**@localhost:6379// is unreachable"),
    HostUnavailable("no live worker for host 'h9' (live hosts: h1)", host="h9"),
    UnknownJob("no job j404"),
    WorkerLost("the worker on h1 was lost while running call c1", call_id="c1", host="h1"),
    CallRejected("invalid call: timeout_s: Input should be less than or equal to 86400"),
]


@pytest.mark.anyio
@pytest.mark.parametrize("error", FLEET_ERRORS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("name", NAMES)
async def test_fleet_errors_are_error_results(
    name: str, error: Exception, store: RedisSessionStore
) -> None:
    failing = FakeRunner(error=error)
    async with connected(tool_server(name, failing, store)) as client:
        tool = get_dialect(name).tools()[0].name
        answer = text_of(await client.call_tool(tool, command_args(name, "make")))
        failing.error = None
        after = await client.call_tool(tool, command_args(name, "true"))
    assert answer.is_error
    assert f"{type(error).__name__}: {error}" in answer.text
    assert after.is_error is False


@pytest.mark.anyio
async def test_a_bug_of_ours_is_an_error_result_not_a_dead_server(
    store: RedisSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = tool_server("native", FakeRunner(), store)
    render = server.dialect.render_run  # type: ignore[attr-defined]

    def buggy(result: CallResult, mode: str, timeout: float | None) -> ToolText:
        if result.call_id == "fake-1":
            raise KeyError("oops")
        return cast(ToolText, render(result, mode, timeout))

    monkeypatch.setattr(server.dialect, "render_run", buggy)
    async with connected(server) as client:
        answer = text_of(await client.call_tool("bash", {"command": "broken"}))
        after = await client.call_tool("bash", {"command": "true"})
    assert answer == ToolText("[system error: internal error: KeyError: 'oops']", True)
    assert after.is_error is False


# ---------------------------------------------------------------------------- session


@pytest.mark.anyio
async def test_the_first_host_pins_the_session(store: RedisSessionStore) -> None:
    runner = FakeRunner(run=[done(exit_code=0), done(exit_code=0)])
    async with connected(tool_server("pipe", runner, store)) as client:
        await client.call_tool("bash", {"command": "hostname"})
        await client.call_tool("bash", {"command": "hostname"})
    assert [c.options["host"] for c in runner.calls] == [None, "h1"]
    assert store.load(SESSION).host == "h1"


@pytest.mark.anyio
async def test_host_and_cwd_options_set_the_session(store: RedisSessionStore) -> None:
    store.save(SESSION, SessionState(host="old", cwd="/old", env={"KEEP": "1"}))
    runner = FakeRunner()
    server = tool_server("modes", runner, store, host="h2", cwd="/src")
    async with connected(server) as client:
        await client.call_tool("bash", {"command": "pwd"})
        await client.call_tool("bash", {"command": "pwd"})
    assert [(c.options["host"], c.options["cwd"]) for c in runner.calls] == [("h2", "/src")] * 2
    assert store.load(SESSION) == SessionState(
        host="h2", cwd="/src", env={"KEEP": "1"}, fleet_session=SESSION
    )
    # The session's shell (shared with `bashfleet run --session`) starts there too.
    assert store.shells.load(SESSION) == ShellState(host="h2", cwd="/src")


@pytest.mark.anyio
async def test_a_restarted_server_resumes_the_session(store: RedisSessionStore) -> None:
    started = done(backgrounded=True, job=JOB)
    first = FakeRunner(run=[started])
    async with connected(tool_server("claude", first, store)) as client:
        answer = text_of(
            await client.call_tool("Bash", {"command": "serve", "run_in_background": True})
        )
    assert answer == ToolText("Command running in background with ID: j7")
    runner = FakeRunner(
        check=[CheckResult(id="j7", host="h1", running=True, output="up\n", offset=3)]
    )
    async with connected(tool_server("claude", runner, store)) as client:  # a new process
        output = text_of(await client.call_tool("BashOutput", {"bash_id": "j7"}))
    assert output == ToolText("<status>running</status>\n\n<stdout>\nup\n</stdout>")
    assert store.load(SESSION).offsets == {"j7": 3}
    # Claude's calls run in the session's shell, which the fleet pins (not the server).
    assert store.load(SESSION).fleet_session == SESSION
    assert first.shells[SESSION].host == "h1"


@pytest.mark.anyio
async def test_claude_state_is_carried_between_calls(store: RedisSessionStore) -> None:
    exported = done(exit_code=0, env_changes={"FOO": "bar"}, cwd_after="/tmp/x")
    runner = FakeRunner(run=[exported, done(exit_code=0, stdout="bar\n")])
    async with connected(tool_server("claude", runner, store)) as client:
        await client.call_tool("Bash", {"command": "cd /tmp/x; export FOO=bar"})
        answer = text_of(await client.call_tool("Bash", {"command": "echo $FOO"}))
    assert answer == ToolText("bar")
    second = runner.calls[1].options
    assert (second["env"], second["cwd"], second["capture_state"]) == (
        {"FOO": "bar"},
        "/tmp/x",
        True,
    )


@pytest.mark.anyio
async def test_calls_run_concurrently_and_both_keep_their_changes(
    store: RedisSessionStore,
) -> None:
    """A long Bash call does not block BashOutput; each one's session changes are kept."""
    store.save(SESSION, SessionState(host="h1", jobs={}, pids={}))
    session = store.load(SESSION)
    session.remember(JOB, "serve")
    store.save(SESSION, session)
    started, release = threading.Event(), threading.Event()

    class Slow(FakeRunner):
        def execute(self, request: RunRequest) -> CallResult:
            started.set()
            assert release.wait(10)
            return super().execute(request)

    runner = Slow(
        run=[done(exit_code=0, env_changes={"BUILT": "1"})],
        check=[CheckResult(id="j7", host="h1", running=True, output="a\n", offset=2)],
    )
    async with connected(tool_server("claude", runner, store)) as client:
        results: dict[str, types.CallToolResult] = {}

        async def build() -> None:
            results["build"] = await client.call_tool("Bash", {"command": "make"})

        async with anyio.create_task_group() as tg:
            tg.start_soon(build)
            assert await anyio.to_thread.run_sync(started.wait, 10)
            with anyio.fail_after(5):
                output = await client.call_tool("BashOutput", {"bash_id": "j7"})
            assert "build" not in results  # answered while the build still ran
            release.set()
    assert text_of(output).text.endswith("<stdout>\na\n</stdout>")
    assert results["build"].is_error is False
    assert store.load(SESSION).offsets == {"j7": 2}
    assert runner.shells[SESSION].env == {"BUILT": "1"}


@pytest.mark.anyio
async def test_a_session_that_cannot_be_saved_says_so(store: RedisSessionStore) -> None:
    class Unsaved(RedisSessionStore):
        def commit(self, session_id: str, base: SessionState, mine: SessionState) -> Any:
            raise redis.ConnectionError("Connection refused")

    unsaved = Unsaved(fakeredis.FakeRedis(decode_responses=True))
    runner = FakeRunner(run=[done(exit_code=0, stdout="hi\n")])
    async with connected(tool_server("pipe", runner, unsaved)) as client:
        answer = text_of(await client.call_tool("bash", {"command": "echo hi"}))
    assert answer.is_error is False
    assert answer.text.endswith(
        "[bashfleet: the session could not be saved: ConnectionError: Connection refused]"
    )


# ------------------------------------------------------------------------ the adapters


class RecordingFleet:
    """Stands for `Fleet`: records the request each method was given."""

    def __init__(self) -> None:
        self.calls: list[RunRequest | CheckRequest | KillRequest] = []

    def execute(self, request: RunRequest, *, check: bool = False) -> CallResult:
        assert not check  # a call that did not run is rendered as text for the model
        self.calls.append(request)
        return done(exit_code=0)

    def check_job(self, request: CheckRequest) -> CheckResult:
        self.calls.append(request)
        return CheckResult(id=request.id, host="h1", running=False, exit_code=0)

    def kill_job(self, request: KillRequest) -> CheckResult:
        self.calls.append(request)
        return CheckResult(id=request.id, host="h1", running=False, signal=15)


def test_fleet_runner_passes_every_request_through() -> None:
    fleet = RecordingFleet()
    runner = FleetRunner(cast(Fleet, fleet))
    policy = get_dialect("claude").policy()
    run = RunRequest(
        command="ls", head=5, unset_env=("LANG",), capture_state=True, mode="slow", policy=policy
    )
    check = CheckRequest(id="j1", offset=0, stderr_offset=7, truncation=policy.truncation)
    kill = KillRequest(id="j1", offset=3)
    runner.execute(run)
    runner.check_job(check)
    runner.kill_job(kill)
    assert fleet.calls == [run, check, kill]


def test_fleet_runner_reports_an_unreachable_fleet() -> None:
    lost: list[bool] = []

    class Unreachable(RecordingFleet):
        def execute(self, request: RunRequest, *, check: bool = False) -> CallResult:
            raise FleetUnavailable("Redis is unreachable")

    runner = FleetRunner(cast(Fleet, Unreachable()), on_unavailable=lambda: lost.append(True))
    with pytest.raises(FleetUnavailable):
        runner.execute(RunRequest(command="ls"))
    assert lost == [True]


def test_session_runner_pins_only_a_host_that_ran_the_call() -> None:
    state = SessionState()
    runner = FakeRunner(run=[CallResult(call_id="c0", host=""), done(exit_code=0)])
    pinned = SessionRunner(runner, state)
    pinned.execute(RunRequest(command="a"))
    assert state.host is None  # never reached a host
    pinned.execute(RunRequest(command="b", capture_state=True))
    assert state.host == "h1"
    pinned.execute(RunRequest(command="c", host="h2"))  # an explicit host wins, keeps the pin
    assert [c.options["host"] for c in runner.calls] == [None, None, "h2"]
    assert runner.calls[1].options["capture_state"] is True
    assert state.host == "h1"
    pinned.check_job(CheckRequest(id="j1", offset=4))
    pinned.kill_job(KillRequest(id="j1"))
    assert [c.method for c in runner.calls[3:]] == ["check", "kill"]


def test_a_dead_pinned_host_says_how_to_move_the_session() -> None:
    dead = HostUnavailable("no live worker for host 'h1' (live hosts: h2)", host="h1")
    pinned = SessionRunner(FakeRunner(error=dead), SessionState(host="h1"))
    with pytest.raises(HostUnavailable) as caught:
        pinned.execute(RunRequest(command="ls", host="h1"))
    assert caught.value.message == (
        "no live worker for host 'h1' (live hosts: h2). This session is pinned to h1; "
        "to move it, restart `bashfleet mcp` with --host and a live host"
    )
    assert caught.value.host == "h1"
    # A host the agent named for one call is its own choice: the error is as it was.
    with pytest.raises(HostUnavailable) as caught:
        SessionRunner(FakeRunner(error=dead), SessionState(host="h2")).execute(
            RunRequest(command="ls", host="h1")
        )
    assert caught.value is dead


@pytest.fixture
def no_fleet(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("BASHFLEET_REDIS_URL", raising=False)
    monkeypatch.setenv("BASHFLEET_STATE_DIR", str(tmp_path))
    yield


@pytest.mark.anyio
@pytest.mark.usefixtures("no_fleet")
async def test_no_fleet_configured_is_an_error_result_until_there_is_one() -> None:
    server = ToolServer(get_dialect("claude"), FleetBackend(), SESSION)
    async with connected(server) as client:
        answer = text_of(await client.call_tool("Bash", {"command": "ls"}))
        listed = await client.list_tools()
    assert answer.is_error
    assert answer.text.startswith("Error: FleetUnavailable: no fleet configured")
    assert [t.name for t in listed.tools] == ["Bash", "BashOutput", "KillBash"]


def test_a_bad_session_id_is_refused_up_front(store: RedisSessionStore) -> None:
    with pytest.raises(ValueError, match="invalid session id"):
        ToolServer(get_dialect("pi"), StaticBackend(FakeRunner(), store), "no spaces please")


# -------------------------------------------------------------------------------- CLI


def test_cli_schema_prints_every_dialect(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert list(printed) == list(DIALECTS)
    for name, tools in printed.items():
        assert tools == schemas(get_dialect(name))


@pytest.mark.parametrize("style", ["anthropic", "openai", "openai-responses", "mcp", "function"])
def test_cli_schema_of_one_dialect(style: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["schema", "--dialect", "modes", "--style", style, "--cwd", "/w"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == schemas(get_dialect("modes"), cwd="/w", style=style)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["schema", "--dialect", "bash"], "unknown dialect 'bash'; known dialects: "
         "claude, claude-code, codex"),
        (["mcp", "--dialect", "bash"], "unknown dialect 'bash'; known dialects: "
         "claude, claude-code, codex"),
        (["mcp", "--dialect", "pi", "--session", "a/b"], "invalid session id 'a/b'"),
        (["mcp", "--dialect", "pi", "--host", "any"], "invalid host id 'any'"),
    ],
)
def test_cli_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_mcp_needs_a_dialect(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["mcp"])
    assert caught.value.code == 2
    assert "--dialect" in capsys.readouterr().err


# ------------------------------------------------------------ progress, cancellation


class Blocking(FakeRunner):
    """A runner whose run blocks until released (or cancelled), with output to tail."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.running = threading.Event()
        self.release = threading.Event()
        self.sent: list[str] = []

    def execute(self, request: RunRequest) -> CallResult:
        assert request.call_id is not None  # chosen before it is sent: a cancel finds it
        self.sent.append(request.call_id)
        self.running.set()
        assert self.release.wait(10)
        return super().execute(request)

    def cancel(self, call_id: str) -> bool:
        super().cancel(call_id)
        self.release.set()  # the killed call answers
        return True

    def read_chunk(self, request: ReadOutputRequest) -> OutputChunk:
        self.calls.append(FakeCall(request))
        text = "step 1\nstep 2\nstep 3\nstep 4\n"
        if request.offset >= len(text):
            return OutputChunk(path="/s/c.out", offset=len(text), next_offset=len(text),
                               size=len(text), text="", eof=True)
        return OutputChunk(path="/s/c.out", offset=request.offset, next_offset=len(text),
                           size=len(text), text=text[request.offset:], eof=True)


@pytest.fixture
def quick_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcp_server, "PROGRESS_INTERVAL_S", 0.05)


@pytest.mark.anyio
@pytest.mark.usefixtures("quick_progress")
async def test_a_long_call_sends_progress_with_its_last_output(store: RedisSessionStore) -> None:
    runner = Blocking(run=[done(exit_code=0, stdout="finished\n")])
    notes: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append((progress, message))
        if len(notes) >= 3:
            runner.release.set()

    async with connected(tool_server("pipe", runner, store)) as client:
        with anyio.fail_after(10):
            result = await client.call_tool(
                "bash", {"command": "make"}, progress_callback=on_progress
            )
    assert text_of(result).text.startswith("stdout:\nfinished")
    assert len(notes) >= 3
    assert [p for p, _ in notes] == sorted(p for p, _ in notes)  # progress only grows
    message = notes[-1][1]
    assert message is not None and message.startswith("running for ")
    assert message.endswith("last output:\nstep 2\nstep 3\nstep 4")
    # The output is read by the call's own id.
    reads = [c.target for c in runner.calls if c.method == "read"]
    assert reads and set(reads) == set(runner.sent)


@pytest.mark.anyio
@pytest.mark.usefixtures("quick_progress")
async def test_no_progress_token_no_progress(store: RedisSessionStore) -> None:
    runner = Blocking(run=[done(exit_code=0)])
    async with (
        connected(tool_server("pipe", runner, store)) as client,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(client.call_tool, "bash", {"command": "make"})
        assert await anyio.to_thread.run_sync(runner.running.wait, 10)
        await anyio.sleep(0.3)  # six progress intervals: none may be sent
        runner.release.set()
    assert [c.method for c in runner.calls] == ["run"]  # never a read for progress


@pytest.mark.anyio
async def test_a_cancelled_request_cancels_its_call(store: RedisSessionStore) -> None:
    runner = Blocking(
        run=[done(exit_code=None, signal=15, cancelled=True)],
        check=[CheckResult(id="j7", host="h1", running=True, output="x\n", offset=2)],
    )
    async with connected(tool_server("claude", runner, store)) as client:
        with anyio.move_on_after(0.5):  # the client gives up: `notifications/cancelled`
            await client.call_tool("Bash", {"command": "sleep 75"})
        with anyio.fail_after(10):
            await anyio.to_thread.run_sync(lambda: _wait_until(lambda: runner.cancelled))
        # The server still serves, and the cancelled call's session was saved.
        session = store.load(SESSION)
        session.remember(JOB, "serve")
        store.save(SESSION, session)
        answer = await client.call_tool("BashOutput", {"bash_id": "j7"})
    assert runner.cancelled == runner.sent  # the very call that was sent
    assert text_of(answer).text.startswith("<status>running</status>")


def _wait_until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)  # waiting for another thread's cancel


def test_a_watch_cancelled_before_its_call_refuses_to_send() -> None:
    watch = CallWatch()
    assert watch.cancel() is None
    with pytest.raises(CallCancelledError):
        watch.next_call_id()
    runner = FakeRunner()
    answer = get_dialect("native").call(
        "bash", {"command": "ls"}, SessionRunner(runner, SessionState(), watch), SessionState()
    )
    assert answer.is_error and "the request was cancelled; nothing was run" in answer.text
    assert runner.calls == []


def test_cancel_retries_until_the_call_is_recorded(store: RedisSessionStore) -> None:
    class Late(FakeRunner):
        tries = 0

        def cancel(self, call_id: str) -> bool:
            self.tries += 1
            if self.tries < 3:
                raise UnknownCall(f"no such call: {call_id}")
            return super().cancel(call_id)

    runner = Late()
    server = tool_server("pipe", runner, store)
    watch = CallWatch()
    call_id = watch.next_call_id()
    server.cancel(watch)
    assert runner.cancelled == [call_id] and runner.tries == 3


def test_a_cancelled_calls_job_is_killed_and_no_session_is_made(
    store: RedisSessionStore,
) -> None:
    """Cancelling a codex `exec_command` once left its process running as a job the
    model never got an id for. Its answer comes back once the cancel went out (the
    session waited its yield): the job it names is killed, nothing is remembered."""
    watch = CallWatch()
    state = SessionState()

    class CancelledMeanwhile(FakeRunner):
        def execute(self, request: RunRequest) -> CallResult:
            watch.cancel()  # `notifications/cancelled` came while the call ran
            return super().execute(request)

    runner = CancelledMeanwhile(run=[done(backgrounded=True, job=JOB, cancelled=True)])
    answer = get_dialect("codex").call(
        "exec_command", {"cmd": "sleep 600", "yield_time_ms": 30000},
        SessionRunner(runner, state, watch), state,
    )
    assert answer.is_error and "job j7, which its call started, was killed" in answer.text
    assert [(c.method, c.target) for c in runner.calls] == [("run", "sleep 600"), ("kill", "j7")]
    assert state.exec_sessions == {}


def test_a_cancel_after_the_call_ended_kills_the_job_it_left(store: RedisSessionStore) -> None:
    """The call had answered (its job running) but the answer was not sent yet when the
    request was cancelled: the job is found by the call's id and killed."""

    class Ended(FakeRunner):
        def cancel(self, call_id: str) -> bool:
            super().cancel(call_id)
            return False  # it had ended

    runner = Ended()
    server = tool_server("codex", runner, store)
    watch = CallWatch()
    call_id = watch.next_call_id()
    server.cancel(watch)
    assert runner.cancelled == [call_id]
    assert [(c.method, c.target) for c in runner.calls] == [("kill", call_id)]


def test_a_cancel_of_a_call_that_started_no_job_kills_nothing(store: RedisSessionStore) -> None:
    class NoJob(FakeRunner):
        def cancel(self, call_id: str) -> bool:
            super().cancel(call_id)
            return False

        def kill_job(self, request: KillRequest) -> CheckResult:
            super().kill_job(request)
            raise UnknownJob(f"no such job: {request.id}")

    runner = NoJob()
    watch = CallWatch()
    watch.next_call_id()
    tool_server("pipe", runner, store).cancel(watch)  # no error
    assert [c.method for c in runner.calls] == ["kill"]


# -------------------------------------------------------------------- resources


@pytest.mark.anyio
async def test_pi_artifacts_are_resources(store: RedisSessionStore) -> None:
    cut = TruncationInfo(direction="tail", truncated=True, limit="bytes", total_lines=9000,
                         total_bytes=90000, shown_lines=500, shown_bytes=51200,
                         shown_ranges=((8501, 9000),))
    kept = done(exit_code=0, stdout="tail\n", stdout_truncation=cut,
                spill=Spill(host="h1", stdout_path="/spill/c1.log", stdout_bytes=90000))
    chunk = OutputChunk(path="/spill/c1.log", offset=0, next_offset=90000, size=90000,
                        text="all of it\n", eof=True)
    runner = FakeRunner(run=[kept], read=[chunk])
    async with connected(tool_server("pi", runner, store)) as client:
        answer = text_of(await client.call_tool("bash", {"command": "seq 9000"}))
        assert answer.text.endswith("Full: artifact://c1]")
        listed = await client.list_resources()
        read = await client.read_resource("artifact://c1")
        with pytest.raises(MCPError, match="Resource not found: artifact://c404"):
            await client.read_resource("artifact://c404")
    [resource] = listed.resources
    assert (resource.uri, resource.name, resource.size) == ("artifact://c1", "c1", 90000)
    assert resource.description == "Full output of `seq 9000` (90000 bytes, kept on host h1)"
    [content] = read.contents
    assert isinstance(content, types.TextResourceContents) and content.text == "all of it\n"
    assert runner.last().request == ReadOutputRequest(id="c1", offset=0, limit=1024 * 1024)


def test_a_large_artifact_says_how_to_read_on(store: RedisSessionStore) -> None:
    session = SessionState()
    session.artifacts["c1"] = Artifact(call_id="c1", host="h1", path="/s/c1.log",
                                       size=5_000_000, command="x", at=0.0)
    store.save(SESSION, session)
    chunk = OutputChunk(path="/s/c1.log", offset=10, next_offset=1_048_586, size=5_000_000,
                        text="...", eof=False)
    server = tool_server("pi", FakeRunner(read=[chunk]), store)
    assert server.read_artifact("artifact://c1?offset=10") == (
        "...\n[artifact continues: bytes 10-1048586 of 5000000 shown; "
        "read artifact://c1?offset=1048586 for more]"
    )
    for bad in ("artifact://", "file://c1", "artifact://c1?offset=-5"):
        with pytest.raises(MCPError, match="Resource not found"):
            server.read_artifact(bad)

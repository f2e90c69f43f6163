"""bashfleet as an OpenAI Agents SDK sandbox, against openai-agents from PyPI and a real
fleet: the client's create / resume / delete, a session's exec, files, `user=`, snapshots
and its PTY pair (Codex's exec_command / write_stdin), the SDK's snapshots on the fleet's
native ones (marked `snapshots`: they need the fleet's snapshots), and an agent run by the
SDK's Runner with a small scripted model (the SDK ships none) whose tool calls run in the
sandbox.
"""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeAlias

import pytest
from agents import Agent, ModelResponse, RunConfig, Runner, Usage, set_tracing_disabled
from agents.models.interface import Model
from agents.run_config import SandboxRunConfig
from agents.sandbox import Manifest, SandboxAgent, User
from agents.sandbox.entries import File
from agents.sandbox.errors import ExecTimeoutError, PtySessionNotFoundError
from agents.sandbox.session import SandboxSession
from agents.sandbox.session.sandbox_client import BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.snapshot import LocalSnapshot, LocalSnapshotSpec
from integration.conftest import WorkerFactory
from integration.registry import Registry
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from bashfleet.client import Fleet
from bashfleet.client.integrations._backend import WorkspaceOptions
from bashfleet.client.integrations.openai_agents import (
    BashfleetSandboxClient,
    BashfleetSandboxClientOptions,
    BashfleetSandboxSession,
    BashfleetSandboxSessionState,
    SnapshotRef,
    pty_output,
    user_name,
    workspace_options,
)
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.wire.models import TruncationInfo
from frameworks.conftest import registry_env

pytestmark = pytest.mark.anyio

HOST = "agents"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def owner(session_workers: WorkerFactory, redis_server: RedisServer,
          image_registry: Registry) -> Iterator[str]:
    """A host for this module's workspaces (pulling from the test registry); the
    environment's settings point at it."""
    session_workers.start(HOST, env=registry_env(image_registry))
    name = f"agents-{uuid.uuid4().hex[:8]}"
    set_tracing_disabled(True)  # offline: no trace export
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BASHFLEET_REDIS_URL", redis_server.url)
        patch.setenv("BASHFLEET_OWNER", name)
        yield name


@pytest.fixture
async def session(owner: str) -> AsyncIterator[SandboxSession]:
    client = BashfleetSandboxClient()
    made = await client.create(options=BashfleetSandboxClientOptions(host=HOST))
    async with made:
        yield made
    await client.delete(made)


def live_ids(redis_url: str, owner: str) -> set[str]:
    with Fleet(redis_url, owner=owner) as fleet:
        return {view.id for view in fleet.workspaces()}


def inner(session: SandboxSession) -> BashfleetSandboxSession:
    found = session._inner
    assert isinstance(found, BashfleetSandboxSession)
    return found


# ----------------------------------------------------------------- the client


def test_options_and_state_are_registered_by_type() -> None:
    options = BaseSandboxClientOptions.parse({"type": "bashfleet", "host": HOST, "ttl_s": 60})
    assert isinstance(options, BashfleetSandboxClientOptions)
    assert (options.host, options.ttl_s) == (HOST, 60)
    assert BashfleetSandboxClientOptions().type == "bashfleet"
    assert BashfleetSandboxClient.backend_id == "bashfleet"
    assert SandboxSessionState._subclass_registry["bashfleet"] is BashfleetSandboxSessionState


def test_the_options_workspace_part() -> None:
    options = BashfleetSandboxClientOptions(label="linux", ttl_s=60, owner="team-a")
    assert workspace_options(options) == WorkspaceOptions(label="linux", ttl_s=60,
                                                          owner="team-a")


def test_pty_output_counts_tokens_only_when_cut() -> None:
    whole = TruncationInfo(direction="tail", truncated=False, limit=None, total_lines=1,
                           total_bytes=3, shown_lines=1, shown_bytes=3)
    cut = whole.model_copy(update={"truncated": True, "total_lines": 900,
                                   "total_bytes": 4001})
    assert pty_output("hi\n", whole, 10) == (b"hi\n", None)
    assert pty_output("hi\n", None, None) == (b"hi\n", None)
    assert pty_output("a…b", cut, 10) == ("Total output lines: 900\n\na…b".encode(), 1001)


def test_the_persistence_options() -> None:
    options = BaseSandboxClientOptions.parse({"type": "bashfleet", "snapshot_ttl_s": 600,
                                              "workspace_persistence": "tar"})
    assert isinstance(options, BashfleetSandboxClientOptions)
    assert (options.workspace_persistence, options.snapshot_ttl_s) == ("tar", 600)
    assert BashfleetSandboxClientOptions().workspace_persistence == "snapshot"
    assert workspace_options(options) == WorkspaceOptions()  # not the workspace's


def test_a_snapshot_reference_round_trips_and_a_tar_is_not_one() -> None:
    ref = SnapshotRef(id="s0123abcd", host="h1", workspace="w42")
    raw = ref.encode()
    assert raw.startswith(b"BASHFLEET_SNAPSHOT_V1\n") and len(raw) < 200
    assert SnapshotRef.decode(raw) == ref
    assert SnapshotRef.decode(b"./\x00\x00 a tar's first member") is None
    assert SnapshotRef.decode(b"BASHFLEET_SNAPSHOT_V1\n{not json") is None
    assert SnapshotRef.decode(b'BASHFLEET_SNAPSHOT_V1\n{"id": "s1"}') is None


def test_user_names() -> None:
    assert [user_name(None), user_name("u"), user_name(User(name="v"))] == [None, "u", "v"]


async def test_create_exec_files_and_delete(owner: str, redis_server: RedisServer) -> None:
    client = BashfleetSandboxClient()
    manifest = Manifest(entries={"notes/hello.txt": File(content=b"hello from the manifest\n")})
    session = await client.create(manifest=manifest,
                                  options=BashfleetSandboxClientOptions(host=HOST))
    workspace = inner(session).workspace
    assert session.state.manifest.root == workspace.path
    async with session:
        shown = await session.exec("cat notes/hello.txt; pwd; whoami")
        lines = shown.stdout.decode().splitlines()
        assert shown.ok() and lines[:2] == ["hello from the manifest", workspace.path]
        await session.write(Path("data/out.bin"), io.BytesIO(b"\x00\xffbytes"))
        assert (await session.read(Path("data/out.bin"))).read() == b"\x00\xffbytes"
        failed = await session.exec("echo oops >&2; exit 3")
        assert (failed.exit_code, failed.stderr) == (3, b"oops\n")
        with pytest.raises(ExecTimeoutError):
            await session.exec("sleep 5", timeout=1)
        assert workspace.id in live_ids(redis_server.url, owner)
    await client.delete(session)
    assert workspace.id not in live_ids(redis_server.url, owner)


async def test_user_runs_as_that_user_from_a_root_workspace(session: SandboxSession
                                                             ) -> None:
    assert (await session.exec("id -un")).stdout == b"root\n"
    for user in ("root", "0", User(name="root")):
        assert (await session.exec("id -un", user=user)).stdout == b"root\n"
    assert (await session.exec("id -un; pwd", user="nobody")).stdout == \
        f"nobody\n{session.state.manifest.root}\n".encode()
    started = await session.pty_exec_start("id -un", user="nobody", yield_time_s=5)
    assert (started.process_id, started.output) == (None, b"nobody\n")
    await session.write(Path("mine.txt"), io.BytesIO(b"x"), user="root")
    assert (await session.read(Path("mine.txt"), user="root")).read() == b"x"


async def test_an_image_session_runs_in_the_image(owner: str,
                                                  registry_images: dict[str, str]) -> None:
    client = BashfleetSandboxClient()
    session = await client.create(options=BashfleetSandboxClientOptions(
        host=HOST, image=registry_images["user"]))
    async with session:
        shown = await session.exec("grep -o bookworm /etc/os-release | head -1; id -u; "
                                   "echo $GREETING")
        assert shown.stdout == b"bookworm\n1000\nhello\n"
        for refused in ("root", "nobody"):
            with pytest.raises(PermissionError, match=f"cannot run as '{refused}'"):
                await session.exec("whoami", user=refused)
    await client.delete(session)


async def test_a_custom_root_is_shown_at_its_path(owner: str) -> None:
    client = BashfleetSandboxClient()
    session = await client.create(manifest=Manifest(root="/project"),
                                  options=BashfleetSandboxClientOptions(host=HOST))
    async with session:
        await session.write(Path("/project/a.txt"), io.BytesIO(b"a"))
        listed = await session.exec("pwd; ls")
        assert listed.stdout.decode().split() == ["/project", "a.txt"]
        assert (await session.read(Path("a.txt"))).read() == b"a"
    await client.delete(session)


async def test_resume_reattaches_then_replaces_an_ended_workspace(owner: str) -> None:
    client = BashfleetSandboxClient()
    first = await client.create(options=BashfleetSandboxClientOptions(host=HOST))
    async with first:
        await first.exec("echo kept > kept.txt")
    payload = json.loads(json.dumps(client.serialize_session_state(first.state)))
    state = client.deserialize_session_state(payload)
    assert isinstance(state, BashfleetSandboxSessionState)
    again = await client.resume(state)
    assert inner(again).workspace.id == inner(first).workspace.id
    async with again:
        assert (await again.exec("cat kept.txt")).stdout == b"kept\n"
    await client.delete(again)
    await client.delete(first)  # gone already: nothing to do

    replaced = await client.resume(client.deserialize_session_state(
        json.loads(json.dumps(payload))))
    fresh = inner(replaced).workspace
    assert fresh.id != state.workspace_id
    assert replaced.state.manifest.root == fresh.path
    async with replaced:
        assert (await replaced.exec("ls")).stdout == b""
    await client.delete(replaced)


async def test_the_sdks_own_file_tools_work_on_it(session: SandboxSession) -> None:
    await session.apply_patch([
        {"type": "create_file", "path": "pkg/mod.py", "diff": "+x = 1\n+y = 2\n"}])
    await session.apply_patch({"type": "update_file", "path": "pkg/mod.py",
                               "diff": "@@\n x = 1\n-y = 2\n+y = 3\n"})
    patched = (await session.read(Path("pkg/mod.py"))).read()
    assert patched.splitlines() == [b"x = 1", b"y = 3"]  # (the SDK's diff drops the last \n)
    assert (await session.exec("cat pkg/mod.py")).stdout == patched
    assert [entry.path.rsplit("/", 1)[-1] for entry in await session.ls("pkg")] == ["mod.py"]
    await session.mkdir("made/deep", parents=True)
    await session.rm("pkg", recursive=True)
    assert (await session.exec("ls")).stdout.split() == [b"made"]


async def test_a_tar_snapshot_round_trips(owner: str) -> None:
    client = BashfleetSandboxClient()
    session = await client.create(options=BashfleetSandboxClientOptions(
        host=HOST, workspace_persistence="tar"))
    async with session:
        await session.exec("mkdir -p src && echo 'print(1)' > src/app.py")
        archive = await inner(session).persist_workspace()
        raw = archive.read()
        assert SnapshotRef.decode(raw) is None and b"src/app.py" in raw
        await session.exec("rm -rf src")
        await inner(session).hydrate_workspace(io.BytesIO(raw))
        assert (await session.exec("cat src/app.py")).stdout == b"print(1)\n"
    await client.delete(session)


# ------------------------------------------------------------------- native snapshots


def snapshot_ids(redis_url: str, owner: str) -> set[str]:
    with Fleet(redis_url, owner=owner) as fleet:
        return {snapshot.id for snapshot in fleet.snapshots()}


@pytest.mark.snapshots
async def test_a_native_snapshot_round_trips_in_place(session: SandboxSession,
                                                      owner: str, redis_server: RedisServer
                                                      ) -> None:
    workspace = inner(session).workspace
    await session.exec("mkdir -p src && echo 'print(1)' > src/app.py")
    raw = (await inner(session).persist_workspace()).read()
    ref = SnapshotRef.decode(raw)
    assert ref is not None and (ref.workspace, ref.host) == (workspace.id, workspace.host)
    assert ref.id in snapshot_ids(redis_server.url, owner)
    await session.exec("echo 'print(2)' > src/app.py; echo later > later.txt")
    await inner(session).hydrate_workspace(io.BytesIO(raw))
    assert inner(session).workspace.id == workspace.id  # restored in place
    assert (await session.exec("cat src/app.py; ls")).stdout == b"print(1)\nsrc\n"
    with Fleet(redis_server.url, owner=owner) as fleet:
        assert fleet.delete_snapshot(ref.id)


@pytest.mark.snapshots
async def test_stop_persists_a_native_snapshot_that_resume_starts_from(
        owner: str, redis_server: RedisServer, tmp_path: Path) -> None:
    """The SDK's round trip: `stop` (leaving the session) persists into the session's
    snapshot (a LocalSnapshot file: a reference, a few bytes); after the workspace is
    gone, `resume` of the saved state starts from a workspace made from the snapshot."""
    client = BashfleetSandboxClient()
    manifest = Manifest(entries={"scratch/tmp.txt": File(content=b"ephemeral\n",
                                                         ephemeral=True)})
    first = await client.create(snapshot=LocalSnapshotSpec(base_path=tmp_path),
                                manifest=manifest,
                                options=BashfleetSandboxClientOptions(host=HOST))
    async with first:
        await first.exec("echo kept > kept.txt")
    (stored,) = tmp_path.iterdir()
    ref = SnapshotRef.decode(stored.read_bytes())
    assert ref is not None and ref.workspace == inner(first).workspace.id
    with Fleet(redis_server.url, owner=owner) as fleet:
        made = fleet.workspace(host=HOST, snapshot=ref.id)  # the plain API sees it too
        try:
            shown = made.run("cat kept.txt; ls scratch; test -e scratch/tmp.txt || echo left out")
            assert shown.stdout == "kept\nleft out\n"  # the ephemeral file set aside
        finally:
            made.delete()
    payload = json.loads(json.dumps(client.serialize_session_state(first.state)))
    await client.delete(first)

    again = await client.resume(client.deserialize_session_state(payload))
    workspace = inner(again).workspace
    assert workspace.id != inner(first).workspace.id
    assert inner(again).made_from == ref.id
    assert again.state.manifest.root == workspace.path
    async with again:
        shown = await again.exec("cat kept.txt scratch/tmp.txt")
        assert shown.stdout == b"kept\nephemeral\n"  # the ephemeral file made again
    await client.delete(again)
    assert workspace.id not in live_ids(redis_server.url, owner)


@pytest.mark.snapshots
async def test_sessions_forked_from_one_persisted_snapshot(
        owner: str, redis_server: RedisServer, tmp_path: Path) -> None:
    """The SDK's fork: `create(snapshot=<a persisted snapshot>)`, n times; each session
    is a workspace made from the native snapshot, apart from the others."""
    client = BashfleetSandboxClient()
    options = BashfleetSandboxClientOptions(host=HOST)
    source = await client.create(snapshot=LocalSnapshotSpec(base_path=tmp_path),
                                 options=options)
    async with source:
        await source.exec("git init -q repo && echo 0 > repo/n")
    persisted = source.state.snapshot
    assert isinstance(persisted, LocalSnapshot)
    await client.delete(source)

    forks = [await client.create(snapshot=persisted, options=options) for _ in range(3)]
    assert len({inner(fork).workspace.id for fork in forks}) == 3
    async with contextlib.AsyncExitStack() as stack:  # all started before any persists
        for number, fork in enumerate(forks):
            assert inner(fork).made_from is not None
            await stack.enter_async_context(fork)
            await fork.exec(f"echo {number} >> repo/n")
            assert inner(fork).made_from is None  # started: nothing restored, none to come
    for number, fork in enumerate(forks):
        shown = await inner(fork).workspace.run("cat repo/n", check=False)
        assert shown.stdout == f"0\n{number}\n"
        await client.delete(fork)
    assert live_ids(redis_server.url, owner).isdisjoint(
        inner(fork).workspace.id for fork in forks)


@pytest.mark.snapshots
async def test_hydrating_another_workspaces_snapshot_moves_the_session(
        session: SandboxSession, owner: str, redis_server: RedisServer) -> None:
    client = BashfleetSandboxClient()
    other = await client.create(options=BashfleetSandboxClientOptions(host=HOST))
    async with other:
        await other.exec("echo theirs > theirs.txt")
        raw = (await inner(other).persist_workspace()).read()
    await client.delete(other)
    before = inner(session).workspace
    await session.exec("echo mine > mine.txt")
    await inner(session).hydrate_workspace(io.BytesIO(raw))
    after = inner(session).workspace
    assert after.id != before.id and inner(session).state.workspace_id == after.id
    assert session.state.manifest.root == after.path
    assert (await session.exec("ls")).stdout == b"theirs.txt\n"
    assert before.id not in live_ids(redis_server.url, owner)


async def test_the_pty_pair_runs_an_interactive_process(session: SandboxSession) -> None:
    started = await session.pty_exec_start(
        "python3", "-q", "-i", shell=False, tty=True, yield_time_s=1.0)
    assert started.process_id is not None and started.exit_code is None
    answered = await session.pty_write_stdin(session_id=started.process_id,
                                             chars="print(6 * 7)\n", yield_time_s=2.0)
    assert b"42" in answered.output and answered.process_id == started.process_id
    ended = await session.pty_write_stdin(session_id=started.process_id,
                                          chars="raise SystemExit(4)\n", yield_time_s=5.0)
    assert (ended.process_id, ended.exit_code) == (None, 4)
    with pytest.raises(PtySessionNotFoundError):
        await session.pty_write_stdin(session_id=started.process_id, chars="")


async def test_a_pipe_process_is_polled_until_it_ends(session: SandboxSession) -> None:
    started = await session.pty_exec_start(
        "echo first; sleep 2; echo second", tty=False, yield_time_s=0.5)
    assert started.process_id is not None and started.output == b"first\n"
    with pytest.raises(RuntimeError, match="stdin is not available"):
        await session.pty_write_stdin(session_id=started.process_id, chars="x")
    polled = await session.pty_write_stdin(session_id=started.process_id, chars="",
                                           yield_time_s=10.0)
    assert (polled.output, polled.exit_code, polled.process_id) == (b"second\n", 0, None)
    quick = await session.pty_exec_start("echo done; exit 2", yield_time_s=5.0)
    assert (quick.output, quick.exit_code, quick.process_id) == (b"done\n", 2, None)


async def test_pty_output_is_cut_to_max_output_tokens(session: SandboxSession) -> None:
    update = await session.pty_exec_start("seq 1 5000", yield_time_s=5.0, max_output_tokens=50)
    text = update.output.decode()
    assert text.startswith("Total output lines: 5000\n\n1\n") and text.endswith("5000\n")
    assert "tokens truncated" in text and update.original_token_count == -(-23893 // 4)


# ----------------------------------------------------------------- end to end


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> ModelResponse:
    return ModelResponse(output=[ResponseFunctionToolCall(
        arguments=json.dumps(arguments), call_id=call_id, name=name, type="function_call",
        id=f"fc_{call_id}", status="completed")], usage=Usage(), response_id=None)


def message(text: str) -> ModelResponse:
    return ModelResponse(output=[ResponseOutputMessage(
        id="msg_1", role="assistant", status="completed", type="message",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])])],
        usage=Usage(), response_id=None)


#: A turn of the script: a response, or one made from the tool outputs the model was
#: sent (a process id the model only learns from an earlier call's output).
Turn: TypeAlias = "ModelResponse | Callable[[list[str]], ModelResponse]"


class ScriptedModel(Model):  # type: ignore[misc]
    """A model that answers from a script, one turn per request, and keeps the tools it
    was offered and the tool outputs it was sent (the SDK ships no fake model)."""

    def __init__(self, turns: list[Turn]) -> None:
        self.turns = list(turns)
        self.tools: list[str] = []
        self.outputs: list[str] = []

    async def get_response(  # noqa: PLR0917 - the SDK's signature
            self, system_instructions: str | None, input: Any, model_settings: Any,
            tools: list[Any], output_schema: Any, handoffs: list[Any], tracing: Any,
            **kwargs: Any) -> ModelResponse:
        self.tools = [tool.name for tool in tools]
        self.outputs = [str(item["output"]) for item in input
                        if isinstance(item, dict) and item.get("type") == "function_call_output"]
        turn = self.turns.pop(0)
        return turn(self.outputs) if callable(turn) else turn

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


def session_id_in(output: str) -> int:
    """The process id an exec_command output gives (`Process running with session ID N`)."""
    line = next(line for line in output.splitlines() if "session ID" in line)
    return int(line.rsplit(" ", 1)[1])


async def test_an_agent_runs_its_tools_in_a_bashfleet_sandbox(
        owner: str, redis_server: RedisServer) -> None:
    model = ScriptedModel([
        tool_call("c1", "exec_command", {"cmd": "echo 'print(6 * 7)' > answer.py && "
                                                "python3 answer.py", "yield_time_ms": 5000}),
        tool_call("c2", "exec_command", {"cmd": "python3 -q -i", "tty": True,
                                         "yield_time_ms": 1000}),
        lambda outputs: tool_call("c3", "write_stdin", {
            "session_id": session_id_in(outputs[-1]), "chars": "print(40 + 2)\n",
            "yield_time_ms": 2000}),
        message("It is 42."),
    ])
    before = live_ids(redis_server.url, owner)
    agent = SandboxAgent(name="calc", instructions="Use the shell.", model=model,
                         default_manifest=Manifest(entries={"README": File(content=b"hi\n")}))
    result = await Runner.run(agent, "What is 6 times 7?", run_config=RunConfig(
        sandbox=SandboxRunConfig(client=BashfleetSandboxClient(),
                                 options=BashfleetSandboxClientOptions(host=HOST))))
    assert result.final_output == "It is 42."
    assert {"exec_command", "write_stdin"} <= set(model.tools)
    first, second, third = model.outputs
    assert "Process exited with code 0" in first and first.rstrip().endswith("42")
    assert "Process running with session ID" in second
    assert "42" in third
    assert live_ids(redis_server.url, owner) == before  # the runner deleted its workspace


async def test_an_agent_runs_its_tools_in_the_image_its_options_name(
        owner: str, redis_server: RedisServer, registry_images: dict[str, str]) -> None:
    model = ScriptedModel([
        tool_call("c1", "exec_command", {"cmd": "grep -o bookworm /etc/os-release | head -1; "
                                                "cat README; id -un", "yield_time_ms": 5000}),
        message("Debian bookworm."),
    ])
    before = live_ids(redis_server.url, owner)
    agent = SandboxAgent(name="os", instructions="Use the shell.", model=model,
                         default_manifest=Manifest(entries={"README": File(content=b"hi\n")}))
    result = await Runner.run(agent, "Which system is this?", run_config=RunConfig(
        sandbox=SandboxRunConfig(client=BashfleetSandboxClient(),
                                 options=BashfleetSandboxClientOptions(
                                     host=HOST, image=registry_images["debian"]))))
    assert result.final_output == "Debian bookworm."
    (output,) = model.outputs
    assert "Process exited with code 0" in output
    assert output.rstrip().endswith("bookworm\nhi\nroot"), output
    assert live_ids(redis_server.url, owner) == before  # the runner deleted its workspace


def test_a_plain_agent_is_not_given_the_sandbox() -> None:
    # The sandbox tools are SandboxAgent's: a plain Agent keeps its own (a sanity check
    # that the end-to-end run above used the sandbox's tools, not tools of its own).
    assert Agent(name="plain").tools == []

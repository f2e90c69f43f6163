"""bashfleet as an inspect-ai sandbox, against inspect-ai from PyPI and a real fleet:
inspect's own provider conformance cases (the 44 `test_*` of
`inspect_ai/util/_sandbox/self_check.py`, pulled in below) with a `bashfleet` environment
as their `sandbox_env`, and a scripted eval whose `mockllm` model calls the bash tool in
the sample's workspace. The environment's own snapshots (`snapshot`, `restore`, `fork`:
inspect has no snapshot methods for a provider) are marked `snapshots`: they need the
fleet's native snapshots.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from inspect_ai import Task, eval_async
from inspect_ai.dataset import Sample
from inspect_ai.model import (
    ChatMessageAssistant,
    ChatMessageTool,
    ModelOutput,
    ModelUsage,
    get_model,
)
from inspect_ai.scorer import includes
from inspect_ai.solver import Generate, Solver, TaskState, generate, solver, use_tools
from inspect_ai.tool import ToolCall, bash
from inspect_ai.util import (
    ComposeConfig,
    OutputLimitExceededError,
    SandboxEnvironment,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandbox,
)
from inspect_ai.util._sandbox import self_check
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv
from inspect_ai.util._sandbox.self_check import *  # noqa: F403 - the conformance cases
from integration.conftest import WorkerFactory
from integration.registry import Registry

from bashfleet.client import Fleet
from bashfleet.client.integrations._backend import Exact
from bashfleet.client.integrations.inspect_ai import (
    BashfleetSandboxConfig,
    BashfleetSandboxEnvironment,
    call_cwd,
    config_of,
    exec_result,
)
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.wire.models import CallResult, SystemError_
from frameworks.conftest import registry_env

pytestmark = pytest.mark.anyio

#: The conformance cases bashfleet cannot pass, and why (docs/frameworks.md names them too).
EXPECTED_FAILURES = {
    "test_exec_as_user": "in a workspace on the host's own root, /run is the host's, read-only: "
                         "adduser cannot take its lock there (it passes in an image's "
                         "workspace: test_exec_as_user_in_an_image)",
    **dict.fromkeys(
        ("test_read_file_not_allowed", "test_write_text_file_without_permissions",
         "test_write_binary_file_without_permissions"),
        "calls and file operations are root in their workspace, as in a container run as "
        "root: a file's mode does not stop them (root holds every capability of its own "
        "namespace)"),
}

HOST = "inspect"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def fleet_env(session_workers: WorkerFactory, redis_server: RedisServer,
              image_registry: Registry) -> Iterator[str]:
    """A host for this module's workspaces (pulling from the test registry); the
    environment's settings point at it, as a user's BASHFLEET_REDIS_URL and
    BASHFLEET_OWNER would."""
    session_workers.start(HOST, env=registry_env(image_registry))
    owner = f"inspect-{uuid.uuid4().hex[:8]}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BASHFLEET_REDIS_URL", redis_server.url)
        patch.setenv("BASHFLEET_OWNER", owner)
        yield owner


@pytest.fixture
async def sandbox_env(fleet_env: str, request: pytest.FixtureRequest
                      ) -> AsyncIterator[SandboxEnvironment]:
    """One sample's environment, made and cleaned up as inspect does."""
    why = EXPECTED_FAILURES.get(request.node.originalname)
    if why is not None:
        request.node.add_marker(pytest.mark.xfail(reason=why, strict=True))
    config = BashfleetSandboxConfig(host=HOST)
    environments = await BashfleetSandboxEnvironment.sample_init("conformance", config, {})
    try:
        yield environments["default"]
    finally:
        await BashfleetSandboxEnvironment.sample_cleanup("conformance", config, environments,
                                                         False)


def test_the_44_conformance_cases_are_all_collected() -> None:
    cases = [name for name in self_check.__all__ if name.startswith("test_")]
    assert len(cases) == 44
    assert all(name in globals() for name in cases)
    assert set(EXPECTED_FAILURES) <= set(cases)


def test_the_entry_point_registers_the_type() -> None:
    assert registry_find_sandboxenv("bashfleet") is BashfleetSandboxEnvironment


async def test_each_sample_gets_its_own_workspace_deleted_at_cleanup(
        fleet_env: str, redis_server: RedisServer) -> None:
    config = BashfleetSandboxConfig(host=HOST, ttl_s=600, tags={"suite": "inspect"})
    one = await BashfleetSandboxEnvironment.sample_init("t", config, {})
    two = await BashfleetSandboxEnvironment.sample_init("t", config, {})
    first, second = one["default"], two["default"]
    assert isinstance(first, BashfleetSandboxEnvironment)
    assert isinstance(second, BashfleetSandboxEnvironment)
    await first.write_file("mine.txt", "one")
    assert (await second.exec(["ls"])).stdout == ""
    ids = {first.workspace.id, second.workspace.id}
    with Fleet(redis_server.url, owner=fleet_env) as fleet:
        live = {view.id: view for view in fleet.workspaces()}
        assert ids <= set(live)
        assert live[first.workspace.id].tags == {"framework": "inspect-ai", "task": "t",
                                                 "suite": "inspect"}
        await BashfleetSandboxEnvironment.sample_cleanup("t", config, one, False)
        await BashfleetSandboxEnvironment.sample_cleanup("t", config, two, True)
        assert ids.isdisjoint(view.id for view in fleet.workspaces())


async def test_the_workspaces_user_is_accepted_by_name_and_uid(
        sandbox_env: SandboxEnvironment) -> None:
    whoami = (await sandbox_env.exec(["whoami"])).stdout.strip()
    uid = (await sandbox_env.exec(["id", "-u"])).stdout.strip()
    for user in (whoami, uid):
        assert (await sandbox_env.exec(["whoami"], user=user)).stdout.strip() == whoami


async def test_output_is_the_commands_own_bytes(sandbox_env: SandboxEnvironment) -> None:
    """Never the fleet's text for a model: escapes, carriage returns, control bytes and
    what looks like a secret all come back as the command wrote them."""
    printed = "\x1b[31mred\x1b[0m\r\nline\x01 token=ghp_" + "a" * 36 + "\n"
    done = await sandbox_env.exec(["printf", "%s", printed])
    assert done.stdout == printed
    both = await sandbox_env.exec(["sh", "-c", "printf 'out\\r\\n'; printf 'err\\033[K' >&2"])
    assert (both.stdout, both.stderr) == ("out\r\n", "err\x1b[K")


async def test_a_missing_cwd_is_file_not_found(sandbox_env: SandboxEnvironment) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        await sandbox_env.exec(["ls"], cwd="nowhere")


async def test_a_read_stops_at_max_bytes(sandbox_env: SandboxEnvironment) -> None:
    assert isinstance(sandbox_env, BashfleetSandboxEnvironment)
    await sandbox_env.write_file("big.txt", "0123456789" * 1000)
    assert await sandbox_env.workspace.read_file("big.txt", max_bytes=3) == b"012"


# ------------------------------------------------------------------ pure parts


@pytest.mark.parametrize(("cwd", "expected"), [
    (None, None), ("/usr/bin", "/usr/bin"), ("sub", "/w/x/sub"), ("a/../b", "/w/x/b"),
    (".", "/w/x"),
])
def test_a_relative_cwd_is_under_the_workspace(cwd: str | None, expected: str | None) -> None:
    assert call_cwd("/w/x", cwd) == expected


#: The output limit of the cases below.
LIMIT = 64


def exact(stdout: bytes = b"", stderr: bytes = b"", **fields: Any) -> Exact:
    return Exact(CallResult(call_id="c1", host=HOST, **fields), stdout, stderr)


@pytest.mark.parametrize(("made", "error"), [
    (exact(timed_out=True), TimeoutError),
    (exact(stderr=b"bash: line 1: /etc/passwd: Permission denied\n", exit_code=126),
     PermissionError),
    (exact(error=SystemError_(kind="bad_cwd", message="no such dir")), FileNotFoundError),
    (exact(error=SystemError_(kind="blocked", message="denied by policy")), PermissionError),
    (exact(error=SystemError_(kind="worker_lost", message="gone")), SandboxUnavailableError),
    (exact(error=SystemError_(kind="limit", message="too many jobs")), RuntimeError),
    (exact(b"x" * (LIMIT + 1), exit_code=0), OutputLimitExceededError),
    (exact(b"", b"x" * (LIMIT + 1), exit_code=0), OutputLimitExceededError),
])
def test_what_a_call_that_did_not_end_well_raises(made: Exact, error: type[Exception]) -> None:
    with pytest.raises(error):
        exec_result(made, LIMIT, f"{LIMIT} bytes")


@pytest.mark.parametrize(("made", "status"), [
    (exact(b"ok\n", exit_code=0), 0), (exact(b"", b"no", exit_code=126), 126),
    (exact(b"x" * LIMIT, exit_code=0), 0), (exact(signal=15), 143),
    (exact(b"\xff\x1b[1m", exit_code=0), 0),
])
def test_what_a_call_that_ran_returns(made: Exact, status: int) -> None:
    done = exec_result(made, LIMIT, f"{LIMIT} bytes")
    assert (done.returncode, done.success) == (status, status == 0)
    assert (done.stdout, done.stderr) == (made.stdout.decode(errors="replace"),
                                          made.stderr.decode(errors="replace"))


def test_a_config_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "bashfleet.yaml"
    path.write_text("label: linux\nttl_s: 600\nlimits:\n  memory_mb: 512\n")
    config = config_of(str(path))
    assert (config.label, config.ttl_s) == ("linux", 600)
    assert config.limits is not None and config.limits.memory_mb == 512
    assert config_of(None) == BashfleetSandboxConfig()
    assert BashfleetSandboxEnvironment.config_deserialize({"host": "h"}) == \
        BashfleetSandboxConfig(host="h")
    typo = tmp_path / "typo.yaml"
    typo.write_text("hots: h\n")
    with pytest.raises(ValueError, match="extra"):
        config_of(str(typo))


def test_docker_configs_are_read_as_one_workspace(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "Dockerfile").write_text("FROM scratch\n")
    assert config_of(str(tmp_path / "img" / "Dockerfile")) == BashfleetSandboxConfig(
        build=str(tmp_path / "img"))
    compose = tmp_path / "compose.yaml"
    compose.write_text("services:\n  default:\n    image: reg.example/app:1\n"
                       "    user: '1000'\n    network_mode: none\n")
    assert config_of(str(compose)) == BashfleetSandboxConfig(
        image="reg.example/app:1", user="1000", network=False)
    compose.write_text("services:\n  default:\n    build: img\n    image: tagged:1\n")
    assert config_of(str(compose)) == BashfleetSandboxConfig(build=str(tmp_path / "img"))
    compose.write_text("services:\n  default:\n    build:\n      context: ./img\n")
    assert config_of(str(compose)).build == str(tmp_path / "img")
    assert BashfleetSandboxEnvironment.is_docker_compatible()


def test_a_compose_file_of_several_services_is_refused(tmp_path: Path) -> None:
    compose = tmp_path / "compose.yaml"
    compose.write_text("services:\n  default:\n    image: a:1\n  db:\n    image: b:1\n")
    with pytest.raises(ValueError, match="one service"):
        config_of(str(compose))
    with pytest.raises(ValueError, match=r"2 services \(default, db\)"):
        config_of(ComposeConfig.model_validate(
            {"services": {"default": {"image": "a:1"}, "db": {"image": "b:1"}}}))


# ------------------------------------------------------------------------- images


async def image_env(config: BashfleetSandboxConfig) -> AsyncIterator[SandboxEnvironment]:
    environments = await BashfleetSandboxEnvironment.sample_init("images", config, {})
    try:
        yield environments["default"]
    finally:
        await BashfleetSandboxEnvironment.sample_cleanup("images", config, environments,
                                                         False)


async def test_an_image_config_runs_in_the_image(fleet_env: str,
                                                 registry_images: dict[str, str]) -> None:
    """An image with a USER: calls run as it, in its WORKDIR, with its ENV; root (or any
    user) when a call asks, as `docker exec -u` does; files written are its USER's."""
    config = BashfleetSandboxConfig(host=HOST, image=registry_images["user"])
    async for env in image_env(config):
        done = await env.exec(["sh", "-c", "id -u; pwd; echo $GREETING"])
        assert done.stdout == "1000\n/work\nhello\n"
        assert (await env.exec(["id", "-u"], user="root")).stdout == "0\n"
        await env.write_file("/tmp/deep/mine.txt", "agent's\n")
        owners = await env.exec(["stat", "-c", "%u", "/tmp/deep", "/tmp/deep/mine.txt"])
        assert owners.stdout == "1000\n1000\n"
        assert await env.read_file("/tmp/deep/mine.txt") == "agent's\n"
        with pytest.raises(PermissionError):
            await env.write_file("/etc/not-mine", "x")
        await env.exec(["sh", "-c", "mkdir -p /work && chown 1000 /work"], user="root")
        await env.write_file("/work/notes.txt", "n\n")
        assert (await env.exec(["cat", "notes.txt"])).stdout == "n\n"


async def test_a_user_config_is_the_only_user(fleet_env: str,
                                              registry_images: dict[str, str]) -> None:
    config = BashfleetSandboxConfig(host=HOST, image=registry_images["debian"], user="1000")
    async for env in image_env(config):
        assert (await env.exec(["id", "-u"])).stdout == "1000\n"
        with pytest.raises(SandboxUserUnsupportedError, match="user 'root'"):
            await env.exec(["id"], user="root")


async def test_a_root_image_workspace_runs_as_root_and_as_other_users(
        fleet_env: str, registry_images: dict[str, str]) -> None:
    config = BashfleetSandboxConfig(host=HOST, image=registry_images["user"], user="root")
    async for env in image_env(config):
        assert (await env.exec(["whoami"], user="root")).stdout == "root\n"
        assert (await env.exec(["id", "-u"], user="1000")).stdout == "1000\n"
        assert (await env.exec(["whoami"], user="nobody")).stdout == "nobody\n"
        fed = await env.exec(["sh", "-c", "cat; echo $X"], input="from stdin\n",
                             env={"X": "kept"}, user="nobody")
        assert fed.stdout == "from stdin\nkept\n"


async def test_exec_as_user_in_an_image(fleet_env: str,
                                        registry_images: dict[str, str]) -> None:
    """inspect's own case: adduser as root, then whoami as root and as the new user."""
    config = BashfleetSandboxConfig(host=HOST, image=registry_images["debian"])
    async for env in image_env(config):
        await self_check.test_exec_as_user(env)


async def test_a_compose_build_is_built_on_the_host(fleet_env: str, tmp_path: Path,
                                                    registry_images: dict[str, str]) -> None:
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(
        f"FROM {registry_images['debian']}\nRUN echo built > /etc/marker\n")
    (tmp_path / "compose.yaml").write_text("services:\n  default:\n    build: ctx\n")
    config = config_of(str(tmp_path / "compose.yaml")).model_copy(update={"host": HOST})
    async for env in image_env(config):
        assert (await env.exec(["cat", "/etc/marker"])).stdout == "built\n"


# ------------------------------------------------------------------- end to end


def bash_call(call_id: str, command: str) -> ModelOutput:
    """The scripted model's turn: call the bash tool (`usage` set: offline, mockllm
    would otherwise fetch a tokenizer to count)."""
    output = ModelOutput.for_tool_call("mockllm/model", "bash", {"command": command},
                                       tool_call_id=call_id)
    output.usage = ModelUsage(input_tokens=10, output_tokens=10, total_tokens=20)
    return output


def answer(text: str) -> ModelOutput:
    output = ModelOutput.from_content("mockllm/model", text)
    output.usage = ModelUsage(input_tokens=10, output_tokens=10, total_tokens=20)
    return output


async def test_an_eval_whose_model_calls_bash_in_the_sample_workspace(
        fleet_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the task's directory: no compose file inspect would find
    model = get_model("mockllm/model", custom_outputs=[
        bash_call("c1", "echo 'print(6 * 7)' > answer.py && python3 answer.py"),
        bash_call("c2", "cat answer.py; whoami; pwd"),
        answer("The answer is 42."),
    ])
    task = Task(
        dataset=[Sample(input="What is 6 times 7? Use bash.", target="42")],
        solver=[use_tools(bash(timeout=60)), generate()],
        scorer=includes(),
        sandbox="bashfleet",  # docs/frameworks.md's line: any live host of the fleet
    )
    [log] = await eval_async(task, model=model, log_dir=str(tmp_path),
                             log_format="json", message_limit=20)
    assert log.status == "success", log.error
    sample = log.samples[0] if log.samples else None
    assert sample is not None
    tools = [message for message in sample.messages if isinstance(message, ChatMessageTool)]
    assert [message.error for message in tools] == [None, None]
    tool_outputs = [message.text for message in tools]
    assert tool_outputs[0] == "42\n"
    cat, user, cwd = tool_outputs[1].splitlines()
    assert cat == "print(6 * 7)" and user and "/w" in cwd
    calls: list[ToolCall] = [call for message in sample.messages
                             if isinstance(message, ChatMessageAssistant)
                             for call in message.tool_calls or []]
    assert [call.function for call in calls] == ["bash", "bash"]
    scores: dict[str, Any] = sample.scores or {}
    assert scores["includes"].value == "C"


async def test_connection_attaches_a_terminal_to_the_samples_workspace(
        sandbox_env: SandboxEnvironment) -> None:
    """`inspect sandbox connect` / the viewer's "connect": the command a person runs gets
    a shell in the sample's workspace (run here under `script`, a terminal of its own)."""
    await sandbox_env.write_file("marker.txt", "in the sample\n")
    connection = await sandbox_env.connection()
    assert connection.type == "bashfleet"
    bin_dir = str(Path(sys.executable).parent)  # where this venv's `bashfleet` is
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    done = await anyio.run_process(
        ["script", "-qec", connection.command, "/dev/null"],
        input=b"cat marker.txt; exit 3\n", env=env, check=False)
    out = done.stdout.decode(errors="replace")
    assert "in the sample" in out, out + done.stderr.decode(errors="replace")
    assert done.returncode == 3


async def test_an_eval_whose_sandbox_names_an_image(
        fleet_env: str, tmp_path: Path, registry_images: dict[str, str]) -> None:
    """`inspect eval` of a task whose sandbox config is a compose file naming an image
    (as a docker task has it): the model's bash calls run in the image."""
    compose = tmp_path / "compose.yaml"
    compose.write_text(f"services:\n  default:\n    image: {registry_images['debian']}\n")
    model = get_model("mockllm/model", custom_outputs=[
        bash_call("c1", "grep -o bookworm /etc/os-release | head -1; whoami; "
                        "test -x /usr/bin/apt-get && echo apt"),
        answer("bookworm"),
    ])
    task = Task(
        dataset=[Sample(input="Which Debian release is this? Use bash.", target="bookworm")],
        solver=[use_tools(bash(timeout=60)), generate()],
        scorer=includes(),
        sandbox=("bashfleet", str(compose)),
    )
    [log] = await eval_async(task, model=model, log_dir=str(tmp_path / "logs"),
                             log_format="json", message_limit=20)
    assert log.status == "success", log.error
    sample = log.samples[0] if log.samples else None
    assert sample is not None
    tools = [message for message in sample.messages if isinstance(message, ChatMessageTool)]
    assert [message.text for message in tools] == ["bookworm\nroot\napt\n"]
    scores: dict[str, Any] = sample.scores or {}
    assert scores["includes"].value == "C"


async def test_a_docker_tasks_compose_file_is_found_beside_it(
        fleet_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        registry_images: dict[str, str]) -> None:
    """`sandbox="bashfleet"` with a compose.yaml in the task's directory, as a docker task
    has it: inspect hands the file over and the sample runs in its image."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "compose.yaml").write_text(
        f"services:\n  default:\n    image: {registry_images['debian']}\n")
    model = get_model("mockllm/model", custom_outputs=[
        bash_call("c1", "grep -o bookworm /etc/os-release | head -1"), answer("bookworm")])
    task = Task(dataset=[Sample(input="Which release?", target="bookworm")],
                solver=[use_tools(bash(timeout=60)), generate()], scorer=includes(),
                sandbox="bashfleet")
    [log] = await eval_async(task, model=model, log_dir=str(tmp_path / "logs"),
                             log_format="json", message_limit=20)
    assert log.status == "success", log.error
    sample = log.samples[0] if log.samples else None
    assert sample is not None
    tools = [message for message in sample.messages if isinstance(message, ChatMessageTool)]
    assert [message.text for message in tools] == ["bookworm\n"]


async def test_an_eval_of_several_services_fails_and_runs_nothing(
        fleet_env: str, tmp_path: Path, redis_server: RedisServer) -> None:
    compose = tmp_path / "compose.yaml"
    compose.write_text("services:\n  default:\n    image: a:1\n  db:\n    image: b:1\n")
    model = get_model("mockllm/model", custom_outputs=[bash_call("c1", "touch ran")])
    task = Task(dataset=[Sample(input="x", target="y")],
                solver=[use_tools(bash(timeout=60)), generate()], scorer=includes(),
                sandbox=("bashfleet", str(compose)))
    with pytest.raises(ValueError, match=r"2 services.*one container"):
        await eval_async(task, model=model, log_dir=str(tmp_path / "logs"),
                         log_format="json", message_limit=20)
    with Fleet(redis_server.url, owner=fleet_env) as fleet:
        assert fleet.workspaces() == []


# ------------------------------------------------------------------- native snapshots


@pytest.mark.snapshots
async def test_snapshot_restore_and_forks_deleted_with_the_sample(
        fleet_env: str, redis_server: RedisServer) -> None:
    config = BashfleetSandboxConfig(host=HOST)
    environments = await BashfleetSandboxEnvironment.sample_init("t", config, {})
    env = environments["default"].as_type(BashfleetSandboxEnvironment)
    await env.write_file("state.txt", "before")
    snapshot = await env.snapshot(tags={"step": "1"})
    assert (snapshot.workspace, snapshot.tags) == (env.workspace.id, {"step": "1"})
    await env.write_file("state.txt", "after")
    forks = await env.fork(2)
    assert [await fork.read_file("state.txt") for fork in forks] == ["after", "after"]
    assert [fork.workspace.path for fork in forks] == [env.workspace.path] * 2
    await forks[0].write_file("state.txt", "mine")
    assert await forks[1].read_file("state.txt") == "after"
    job = await env.workspace.run("sleep 600", mode="background")
    assert job.job is not None
    assert await env.restore(snapshot) >= 1  # the sleep ended
    assert await env.read_file("state.txt") == "before"
    await forks[1].close()  # a fork closed early is not closed twice
    ids = {env.workspace.id, *(fork.workspace.id for fork in forks)}
    await BashfleetSandboxEnvironment.sample_cleanup("t", config, environments, False)
    with Fleet(redis_server.url, owner=fleet_env) as fleet:
        assert ids.isdisjoint(view.id for view in fleet.workspaces())
        assert fleet.delete_snapshot(snapshot.id)  # snapshots outlive the sample


@solver  # type: ignore[untyped-decorator,unused-ignore]
def snapshot_then_fork() -> Solver:
    """A solver that uses the sample's sandbox as inspect gives it (`sandbox()`): writes a
    file, snapshots, changes it, forks twice (each fork sees the change and changes its
    own copy), restores the snapshot and reads the file back."""
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        box = sandbox()
        env = box.as_type(BashfleetSandboxEnvironment)
        await box.write_file("answer.txt", "42")
        snapshot = await env.snapshot()
        await box.write_file("answer.txt", "41")
        forks = await env.fork(2)
        for number, fork in enumerate(forks):
            await fork.exec(["sh", "-c", f"echo {number} >> answer.txt"])
        seen = [await fork.read_file("answer.txt") for fork in forks]
        await env.restore(snapshot)
        state.store.set("forks", seen)
        state.store.set("restored", await box.read_file("answer.txt"))
        state.store.set("deleted", await env.delete_snapshot(snapshot))
        state.output.completion = state.store.get("restored")
        return state
    return solve


@pytest.mark.snapshots
async def test_an_eval_whose_solver_snapshots_forks_and_restores(
        fleet_env: str, tmp_path: Path, redis_server: RedisServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with Fleet(redis_server.url, owner=fleet_env) as fleet:
        before = {view.id for view in fleet.workspaces()}
    task = Task(dataset=[Sample(input="x", target="42")], solver=snapshot_then_fork(),
                scorer=includes(), sandbox=("bashfleet", str(_config_file(tmp_path))))
    [log] = await eval_async(task, model=get_model("mockllm/model"),
                             log_dir=str(tmp_path / "logs"), log_format="json")
    assert log.status == "success", log.error
    sample = log.samples[0] if log.samples else None
    assert sample is not None
    assert sample.store["forks"] == ["410\n", "411\n"]
    assert (sample.store["restored"], sample.store["deleted"]) == ("42", True)
    scores: dict[str, Any] = sample.scores or {}
    assert scores["includes"].value == "C"
    with Fleet(redis_server.url, owner=fleet_env) as fleet:  # the sample's and its forks' gone
        assert {view.id for view in fleet.workspaces()} == before


def _config_file(directory: Path) -> Path:
    config = directory / "bashfleet.yaml"
    config.write_text(f"host: {HOST}\n")
    return config

"""bashfleet as a Harbor environment, against Harbor from PyPI (Python 3.12, .venv-harbor)
and a real fleet.

Harbor ships no conformance suite for environments; these cases drive
`BaseEnvironment`'s methods as Harbor's trial, agents and verifier call them (exec with
env, cwd, timeout and user; files both ways; Harbor's absolute paths), and the end-to-end
run is Harbor's own CLI with its `oracle` agent on a small local task, as a user runs it:
`harbor run -p TASK -a oracle --env bashfleet.client.integrations.harbor:BashfleetEnvironment`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths
from integration.conftest import WorkerFactory, WorkerProcess
from integration.registry import Registry

from bashfleet.client import Fleet
from bashfleet.client.errors import HostUnavailable
from bashfleet.client.integrations.harbor import (
    BashfleetEnvironment,
    ComposeRefusedError,
    TaskImage,
    task_image,
)
from bashfleet.client.redis_server import RedisServer
from frameworks.conftest import registry_env

HOST = "hb"
IMPORT_PATH = "bashfleet.client.integrations.harbor:BashfleetEnvironment"

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(name="host", scope="module")
def _host(session_workers: WorkerFactory, image_registry: Registry) -> WorkerProcess:
    """The module's host, pulling and building from the test registry."""
    return session_workers.start(HOST, env=registry_env(image_registry))


@pytest.fixture(name="owner")
def _owner(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The usual BASHFLEET_* settings name the fleet and the owner."""
    owner = f"harbor-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("BASHFLEET_REDIS_URL", redis_server.url)
    monkeypatch.setenv("BASHFLEET_OWNER", owner)
    return owner


def environment(tmp_path: Path, *, config: EnvironmentConfig | None = None,
                **kwargs: object) -> BashfleetEnvironment:
    """The environment as Harbor's factory makes it from `--env IMPORT_PATH --ek ...`."""
    (tmp_path / "environment").mkdir(exist_ok=True)
    made = EnvironmentFactory.create_environment_from_import_path(
        IMPORT_PATH, environment_dir=tmp_path / "environment", environment_name="t",
        session_id=f"t__{uuid.uuid4().hex[:6]}__env", trial_paths=TrialPaths(tmp_path / "trial"),
        task_env_config=config or EnvironmentConfig(), **{"host": HOST, **kwargs})
    assert isinstance(made, BashfleetEnvironment)
    return made


@pytest.fixture(name="env")
async def _env(host: WorkerProcess, owner: str, tmp_path: Path
               ) -> AsyncIterator[BashfleetEnvironment]:
    made = environment(tmp_path)
    await made.start(force_build=False)
    try:
        yield made
    finally:
        await made.stop(delete=True)


# --------------------------------------------------------------------- pure rules


@pytest.mark.parametrize(("files", "image", "force_build", "expected"), [
    ({}, None, False, None),
    ({}, "reg.example/t:1", False, TaskImage(image="reg.example/t:1")),
    ({"Dockerfile": "FROM x\n"}, None, False, TaskImage(build=".")),
    ({"Dockerfile": "FROM x\n"}, "reg.example/t:1", False, TaskImage(image="reg.example/t:1")),
    ({"Dockerfile": "FROM x\n"}, "reg.example/t:1", True, TaskImage(build=".")),
    ({"docker-compose.yaml": "services:\n  main:\n    build:\n      context: ctx\n"}, None,
     False, TaskImage(build="ctx")),
    ({"docker-compose.yaml": "services:\n  main:\n    image: reg.example/c:2\n",
      "Dockerfile": "FROM x\n"}, None, False, TaskImage(image="reg.example/c:2")),
    ({"docker-compose.yaml": "services:\n  main:\n    environment: [A=1]\n",
      "Dockerfile": "FROM x\n"}, None, False, TaskImage(build=".")),
])
def test_a_tasks_image_is_picked_as_harbors_docker_picks_it(
        tmp_path: Path, files: dict[str, str], image: str | None, force_build: bool,
        expected: TaskImage | None) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    found = task_image(tmp_path, image, force_build)
    if expected is not None and expected.build is not None:
        expected = TaskImage(build=str((tmp_path / expected.build).resolve()))
    assert found == expected


def test_a_compose_file_of_several_services_is_refused(tmp_path: Path) -> None:
    (tmp_path / "docker-compose.yaml").write_text(
        "services:\n  main:\n    build: .\n  db:\n    image: postgres:16\n")
    with pytest.raises(ComposeRefusedError, match=r"besides 'main' \(db\).*ignore_image"):
        task_image(tmp_path, None, False)


# ------------------------------------------------------------- BaseEnvironment


async def test_exec_with_env_cwd_and_harbors_paths(env: BashfleetEnvironment) -> None:
    result = await env.exec("echo $GREETING; pwd; ls -d /logs/agent /logs/verifier "
                            "/tests /solution; echo oops >&2; exit 3",
                            env={"GREETING": "hi"}, timeout_sec=60)
    assert result.return_code == 3
    assert result.stdout is not None and result.stdout.splitlines() == [
        "hi", env.workspace.path, "/logs/agent", "/logs/verifier", "/solution", "/tests"]
    assert result.stderr == "oops\n"
    await env.exec("mkdir -p sub")
    there = await env.exec("pwd", cwd=f"{env.workspace.path}/sub")
    assert there.stdout == f"{env.workspace.path}/sub\n"
    nowhere = await env.exec("pwd", cwd=f"{env.workspace.path}/missing")
    assert nowhere.return_code == 1
    assert nowhere.stderr == f"Working directory does not exist: {env.workspace.path}/missing"


async def test_exec_timeout_kills_and_raises(env: BashfleetEnvironment) -> None:
    with pytest.raises(RuntimeError, match="Command timed out after 1 seconds"):
        await env.exec("sleep 30", timeout_sec=1)


async def test_root_and_other_users_from_a_root_workspace(
        env: BashfleetEnvironment) -> None:
    assert (await env.exec("id -un", user="root")).stdout == "root\n"
    assert (await env.exec("id -un", user=0)).stdout == "root\n"
    assert (await env.exec("id -un", user="nobody")).stdout == "nobody\n"
    with env.with_default_user("nobody"):
        assert (await env.exec("id -un; echo $X", env={"X": "kept"})).stdout == \
            "nobody\nkept\n"
    unknown = await env.exec("id", user="agent")
    assert unknown.return_code != 0 and "agent" in (unknown.stderr or "")


async def test_an_images_user_runs_commands_and_root_is_had_when_asked(
        host: WorkerProcess, owner: str, tmp_path: Path,
        registry_images: dict[str, str]) -> None:
    made = environment(tmp_path, config=EnvironmentConfig(docker_image=registry_images["user"]))
    await made.start(force_build=False)
    try:
        assert (await made.exec("id -u; pwd; echo $GREETING")).stdout == "1000\n/work\nhello\n"
        assert (await made.exec("id -u; echo $GREETING", user="root")).stdout == "0\nhello\n"
    finally:
        await made.stop(delete=True)
    only = environment(tmp_path, config=EnvironmentConfig(docker_image=registry_images["user"]),
                       user="1000")
    await only.start(force_build=False)
    try:
        with pytest.raises(PermissionError, match="user 'root'"):
            await only.exec("id", user="root")
    finally:
        await only.stop(delete=True)


async def test_output_is_the_commands_own_bytes(env: BashfleetEnvironment) -> None:
    done = await env.exec("printf '\\033[1mbold\\r\\n'; printf 'e\\001' >&2")
    assert (done.stdout, done.stderr) == ("\x1b[1mbold\r\n", "e\x01")


async def test_files_both_ways(env: BashfleetEnvironment, tmp_path: Path) -> None:
    source = tmp_path / "up"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "a.txt").write_text("a\n")
    (source / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (source / "run.sh").chmod(0o755)
    await env.upload_dir(source, "/solution")
    await env.upload_file(source / "pkg" / "a.txt", "/tests/a.txt")
    assert (await env.exec("/solution/run.sh; cat /tests/a.txt")).stdout == "ran\na\n"
    await env.exec("mkdir -p /logs/verifier/deep && echo 1 > /logs/verifier/reward.txt && "
                   "echo d > /logs/verifier/deep/x")
    await env.download_file("/logs/verifier/reward.txt", tmp_path / "back" / "reward.txt")
    assert (tmp_path / "back" / "reward.txt").read_text() == "1\n"
    await env.download_dir("/logs/verifier", tmp_path / "verifier")
    assert (tmp_path / "verifier" / "deep" / "x").read_text() == "d\n"
    with pytest.raises(FileNotFoundError):
        await env.download_file("/logs/nothing.txt", tmp_path / "none")
    assert await env.is_dir("/logs/verifier") and await env.is_file("/tests/a.txt")
    assert not env.is_path_mounted("/logs/verifier", tmp_path)  # Harbor downloads them


async def test_a_task_workdir_is_where_commands_start(host: WorkerProcess, owner: str,
                                                      tmp_path: Path) -> None:
    made = environment(tmp_path, config=EnvironmentConfig(workdir="/app"))
    await made.start(force_build=False)
    try:
        result = await made.exec("pwd; echo x > made.txt")
        assert result.stdout == "/app\n"
        assert (await made.exec("cat /app/made.txt")).stdout == "x\n"
    finally:
        await made.stop(delete=True)


async def test_no_network_is_the_workspaces_own_namespace(host: WorkerProcess, owner: str,
                                                          tmp_path: Path) -> None:
    made = environment(tmp_path,
                       network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
    await made.start(force_build=False)
    try:
        assert made.workspace.view.network.mode == "none"
        links = await made.exec("awk 'NR > 2 {print $1}' /proc/net/dev")
        assert links.stdout == "lo:\n"
    finally:
        await made.stop(delete=True)


async def test_a_docker_image_task_runs_in_its_image_unless_ignored(
        host: WorkerProcess, owner: str, tmp_path: Path,
        registry_images: dict[str, str]) -> None:
    config = EnvironmentConfig(docker_image=registry_images["debian"])
    made = environment(tmp_path, config=config)
    await made.start(force_build=False)
    try:
        assert made.workspace.view.image is not None
        done = await made.exec("grep -o bookworm /etc/os-release | head -1; id -un; "
                               "ls -d /logs/agent /logs/verifier")
        assert done.stdout == "bookworm\nroot\n/logs/agent\n/logs/verifier\n"
    finally:
        await made.stop(delete=True)
    ignored = environment(tmp_path, config=config, ignore_image=True)
    await ignored.start(force_build=False)
    try:
        assert ignored.workspace.view.image is None
        assert (await ignored.exec("echo on the host")).stdout == "on the host\n"
    finally:
        await ignored.stop(delete=True)


async def test_after_a_failed_start_stop_and_downloads_have_nothing_to_do(
        host: WorkerProcess, owner: str, tmp_path: Path) -> None:
    made = environment(tmp_path, host=None, label="no-such-label")
    with pytest.raises(HostUnavailable, match="no-such-label"):
        await made.start(force_build=False)
    await made.stop(delete=True)
    await made.download_dir("/logs/agent", tmp_path / "agent")
    await made.download_file("/logs/verifier/reward.txt", tmp_path / "reward.txt")
    assert not (tmp_path / "agent").exists() and not (tmp_path / "reward.txt").exists()
    with pytest.raises(RuntimeError, match="did not start: no live host with label"):
        await made.exec("true")
    never = environment(tmp_path)
    with pytest.raises(RuntimeError, match="not started"):
        await never.download_dir("/logs/agent", tmp_path / "agent")


async def test_stop_deletes_the_workspace(host: WorkerProcess, owner: str, tmp_path: Path,
                                          redis_server: RedisServer) -> None:
    made = environment(tmp_path)
    await made.start(force_build=False)
    await made.exec("sleep 300 &")
    await made.stop(delete=True)
    with Fleet(redis_server.url, owner=owner) as fleet:
        assert fleet.workspaces() == []


# --------------------------------------------------------------------- end to end


def _task(root: Path) -> Path:
    """A small local task: make a program print 42; its test checks and writes a reward."""
    task = root / "answer-task"
    (task / "environment").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "tests").mkdir()
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n\n[verifier]\ntimeout_sec = 120.0\n\n'
        '[agent]\ntimeout_sec = 120.0\n\n[environment]\nbuild_timeout_sec = 60.0\n')
    (task / "instruction.md").write_text("Write answer.py that prints 42.\n")
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nset -e\nprintf 'print(6 * 7)\\n' > answer.py\necho solved\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nif [ \"$(python3 answer.py)\" = 42 ]; then echo 1 > "
        "/logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n")
    return task


def _image_task(root: Path, base: str) -> Path:
    """A terminal-bench-style task: its Dockerfile starts from the registry's Debian and
    installs a package with apt; the oracle and the verifier use what it installed."""
    task = root / "hello-task"
    for folder in ("environment", "solution", "tests"):
        (task / folder).mkdir(parents=True)
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {base}\nRUN apt-get update -q && apt-get install -y -q --no-install-recommends "
        "hello && rm -rf /var/lib/apt/lists/*\nWORKDIR /app\n")
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n\n[verifier]\ntimeout_sec = 120.0\n\n'
        '[agent]\ntimeout_sec = 120.0\n\n[environment]\nbuild_timeout_sec = 600.0\n')
    (task / "instruction.md").write_text("Save the output of `hello` to /app/greeting.txt.\n")
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nset -e\nhello > /app/greeting.txt\necho solved in \"$PWD\"\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nif [ \"$(cat /app/greeting.txt)\" = 'Hello, world!' ] && "
        "grep -q bookworm /etc/os-release; then echo 1 > /logs/verifier/reward.txt; "
        "else echo 0 > /logs/verifier/reward.txt; fi\n")
    return task


def _harbor_run(task: Path, jobs: Path, owner: str, redis_url: str, *extra: str,
                where: str = f"host={HOST}") -> subprocess.CompletedProcess[str]:
    harbor = Path(sys.executable).with_name("harbor")
    env = {**os.environ, "BASHFLEET_REDIS_URL": redis_url, "BASHFLEET_OWNER": owner}
    return subprocess.run(
        [str(harbor), "run", "-p", str(task), "-a", "oracle", "--env", IMPORT_PATH,
         "--ek", where, "-o", str(jobs), "-y", "-q", *extra],
        env=env, capture_output=True, text=True, timeout=600, check=False)


def _results(jobs: Path) -> Iterator[dict[str, object]]:
    for found in sorted(jobs.glob("*/*/result.json")):
        yield json.loads(found.read_text())


def test_harbor_run_with_the_oracle_agent(host: WorkerProcess, redis_server: RedisServer,
                                          tmp_path: Path) -> None:
    """`harbor run` as a user runs it: the oracle agent solves the task in a bashfleet
    workspace, the verifier grades it there, and the reward comes back."""
    owner = f"harbor-e2e-{uuid.uuid4().hex[:6]}"
    jobs = tmp_path / "jobs"
    done = _harbor_run(_task(tmp_path), jobs, owner, redis_server.url)
    assert done.returncode == 0, done.stdout + done.stderr
    (trial,) = list(_results(jobs))
    assert trial.get("exception_info") is None, trial
    verifier = trial["verifier_result"]
    assert isinstance(verifier, dict) and verifier["rewards"] == {"reward": 1.0}, trial
    oracle_log = next(jobs.glob("*/*/agent/oracle.txt")).read_text()
    assert "solved" in oracle_log
    with Fleet(redis_server.url, owner=owner) as fleet:
        assert fleet.workspaces() == [], "the trial's workspace was deleted at its end"


def test_harbor_run_builds_the_tasks_dockerfile(host: WorkerProcess,
                                                redis_server: RedisServer, tmp_path: Path,
                                                registry_images: dict[str, str]) -> None:
    """`harbor run -a oracle` on a task whose Dockerfile is FROM the registry's Debian and
    runs apt-get: built on the host, the trial runs in what it built."""
    owner = f"harbor-e2e-{uuid.uuid4().hex[:6]}"
    jobs = tmp_path / "jobs"
    done = _harbor_run(_image_task(tmp_path, registry_images["debian"]), jobs, owner,
                       redis_server.url)
    assert done.returncode == 0, done.stdout + done.stderr
    (trial,) = list(_results(jobs))
    assert trial.get("exception_info") is None, trial
    verifier = trial["verifier_result"]
    assert isinstance(verifier, dict) and verifier["rewards"] == {"reward": 1.0}, trial
    oracle_log = next(jobs.glob("*/*/agent/oracle.txt")).read_text()
    assert "solved in /app" in oracle_log
    with Fleet(redis_server.url, owner=owner) as fleet:
        assert fleet.workspaces() == [], "the trial's workspace was deleted at its end"


def test_a_failed_start_is_the_trials_one_error(host: WorkerProcess,
                                                redis_server: RedisServer,
                                                tmp_path: Path) -> None:
    """A start that fails (here: a pool label no live host has) is the trial's error, said
    once: Harbor's cleanup after it (log and artifact downloads, stop) finds nothing to
    do and adds no traceback of its own to the trial's log."""
    owner = f"harbor-e2e-{uuid.uuid4().hex[:6]}"
    label = f"nowhere-{uuid.uuid4().hex[:6]}"
    jobs = tmp_path / "jobs"
    done = _harbor_run(_task(tmp_path), jobs, owner, redis_server.url,
                       where=f"label={label}")
    assert done.returncode == 0, done.stdout + done.stderr
    (trial,) = list(_results(jobs))
    error = trial.get("exception_info")
    assert isinstance(error, dict), trial
    assert label in str(error["exception_message"]), error
    trial_dir = next(jobs.glob("*/*/result.json")).parent
    log = (trial_dir / "trial.log").read_text()
    assert f"no live host with label '{label}'" in log, log
    assert "not started" not in log, log
    assert "Traceback" not in log, log
    traceback = (trial_dir / "exception.txt").read_text()
    assert label in traceback and "not started" not in traceback, traceback
    with Fleet(redis_server.url, owner=owner) as fleet:
        assert fleet.workspaces() == []

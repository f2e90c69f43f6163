"""bashfleet as a mini-swe-agent environment, against mini-swe-agent from PyPI and a real
fleet.

mini-swe-agent has no conformance suite for environments; its own tests of
`LocalEnvironment` (tests/environments/test_local.py in its repository) are the protocol's
cases, ported here one by one with the same names (`local` -> `bashfleet`). Where a case
looks at the agent's machine (its temporary directories, its os.environ, its processes),
the port looks at the workspace instead, where the commands run. Two cases are not
ported: `test_local_environment_existing_env_variables` and `_default_cwd` check that a
command sees the agent process's own environment and cwd, which a remote host does not
(it runs with its own scrubbed environment, in the workspace's directory: both checked
below instead).

The end-to-end run is mini-swe-agent's own `DefaultAgent` with its `DeterministicModel`
and its default config, the environment chosen as a user chooses it
(`environment_class: bashfleet.client.integrations.mini_swe_agent.BashfleetEnvironment`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from importlib.resources import files
from typing import Any

import pytest
import yaml
from integration.conftest import WorkerFactory, WorkerProcess, wait_for
from integration.registry import Registry
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import get_environment
from minisweagent.exceptions import Submitted
from minisweagent.models.test_models import DeterministicModel, make_output

from bashfleet.client import Fleet, UnknownWorkspace
from bashfleet.client.integrations.mini_swe_agent import (
    BashfleetEnvironment,
    BashfleetEnvironmentConfig,
)
from bashfleet.client.redis_server import RedisServer
from frameworks.conftest import registry_env

HOST = "msa"
ENVIRONMENT_CLASS = "bashfleet.client.integrations.mini_swe_agent.BashfleetEnvironment"

Make = Callable[..., BashfleetEnvironment]


@pytest.fixture(name="host", scope="module")
def _host(session_workers: WorkerFactory, image_registry: Registry) -> WorkerProcess:
    """The module's host, pulling from the test registry."""
    return session_workers.start(HOST, env=registry_env(image_registry))


@pytest.fixture(autouse=True)
def _settings(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The usual BASHFLEET_* settings name the fleet and the owner."""
    monkeypatch.setenv("BASHFLEET_REDIS_URL", redis_server.url)
    monkeypatch.setenv("BASHFLEET_OWNER", f"msa-{uuid.uuid4().hex[:8]}")


@pytest.fixture(name="make")
def _make(host: WorkerProcess) -> Iterator[Make]:
    made: list[BashfleetEnvironment] = []

    def make(**kwargs: Any) -> BashfleetEnvironment:
        env = BashfleetEnvironment(host=HOST, **kwargs)
        made.append(env)
        return env

    yield make
    for env in made:
        env.cleanup()


def subdir(env: BashfleetEnvironment, name: str) -> str:
    """A new directory in the workspace (where the ported cases used a temporary one)."""
    path = f"{env.workspace.path}/{name}"
    assert env.execute({"command": f"mkdir -p {path}"})["returncode"] == 0
    return path


# ------------------------------------------- mini-swe-agent's LocalEnvironment cases


def test_bashfleet_environment_config_defaults() -> None:
    config = BashfleetEnvironmentConfig()
    assert (config.cwd, config.env, config.timeout) == ("", {}, 30)


def test_bashfleet_environment_basic_execution(make: Make) -> None:
    result = make().execute({"command": "echo 'hello world'"})
    assert result["returncode"] == 0
    assert "hello world" in result["output"]


def test_bashfleet_environment_set_env_variables(make: Make) -> None:
    env = make(env={"TEST_VAR": "test_value", "ANOTHER_VAR": "another_value"})
    result = env.execute({"command": "echo $TEST_VAR"})
    assert result["returncode"] == 0
    assert "test_value" in result["output"]
    result = env.execute({"command": "echo $TEST_VAR $ANOTHER_VAR"})
    assert result["returncode"] == 0
    assert "test_value another_value" in result["output"]


def test_bashfleet_environment_env_variable_override(make: Make) -> None:
    """Config variables override those the command would otherwise get (here the
    host's hardening default PAGER=cat, in place of the agent's os.environ)."""
    assert make().execute({"command": "echo $PAGER"})["output"] == "cat\n"
    result = make(env={"PAGER": "override_value"}).execute({"command": "echo $PAGER"})
    assert result["returncode"] == 0
    assert "override_value" in result["output"]


def test_bashfleet_environment_custom_cwd(make: Make) -> None:
    env = make()
    where = subdir(env, "custom")
    env.config.cwd = where
    result = env.execute({"command": "pwd"})
    assert result["returncode"] == 0
    assert where in result["output"]


def test_bashfleet_environment_cwd_parameter_override(make: Make) -> None:
    env = make()
    one, two = subdir(env, "one"), subdir(env, "two")
    env.config.cwd = one
    result = env.execute({"command": "pwd"}, cwd=two)
    assert result["returncode"] == 0
    assert two in result["output"]


def test_bashfleet_environment_default_cwd_is_the_workspace(make: Make) -> None:
    env = make()
    assert env.execute({"command": "pwd"})["output"] == f"{env.workspace.path}\n"


def test_bashfleet_environment_command_failure(make: Make) -> None:
    result = make().execute({"command": "exit 1"})
    assert result["returncode"] == 1
    assert result["output"] == ""


def test_bashfleet_environment_nonexistent_command(make: Make) -> None:
    result = make().execute({"command": "nonexistent_command_12345"})
    assert result["returncode"] != 0
    assert "nonexistent_command_12345" in result["output"]


def test_bashfleet_environment_stderr_capture(make: Make) -> None:
    result = make().execute({"command": "echo 'error message' >&2"})
    assert result["returncode"] == 0
    assert "error message" in result["output"]


def test_bashfleet_environment_timeout(make: Make) -> None:
    result = make(timeout=1).execute({"command": "echo started; sleep 5"})
    assert result["returncode"] == -1
    assert "timed out" in result["exception_info"]
    assert result["exception_info"] == ("An error occurred while executing the command: "
                                        "Command 'echo started; sleep 5' timed out after 1 "
                                        "seconds")
    assert result["extra"]["exception_type"] == "TimeoutExpired"
    assert result["output"] == "started\n"


def test_bashfleet_environment_timeout_kills_child_process(make: Make) -> None:
    """The child a timed-out command started is gone (looked at from the workspace,
    whose calls share one PID namespace)."""
    env = make(timeout=1)
    script = "import os, time; open('child.pid', 'w').write(str(os.getpid()))\nwhile True: " \
             "time.sleep(1)"
    env.workspace.write_file("child.py", script)
    assert env.execute({"command": "python3 child.py"})["returncode"] == -1
    pid = env.workspace.read_file("child.pid").decode()
    assert pid.isdigit()
    wait_for(lambda: env.execute({"command": f"kill -0 {pid}"})["returncode"] == 1, 10,
             "the child to be gone")


def test_bashfleet_environment_custom_timeout() -> None:
    config = BashfleetEnvironmentConfig(timeout=5)
    assert config.timeout == 5


@pytest.mark.parametrize(("command", "expected_returncode"),
                         [("echo 'test'", 0), ("exit 1", 1), ("exit 42", 42)])
def test_bashfleet_environment_return_codes(make: Make, command: str,
                                            expected_returncode: int) -> None:
    assert make().execute({"command": command})["returncode"] == expected_returncode


def test_bashfleet_environment_multiline_output(make: Make) -> None:
    result = make().execute({"command": "echo -e 'line1\\nline2\\nline3'"})
    assert result["returncode"] == 0
    assert result["output"].strip().split("\n") == ["line1", "line2", "line3"]


def test_bashfleet_environment_file_operations(make: Make) -> None:
    env = make()
    env.config.cwd = subdir(env, "files")
    assert env.execute({"command": "echo 'test content' > test.txt"})["returncode"] == 0
    result = env.execute({"command": "cat test.txt"})
    assert result["returncode"] == 0
    assert "test content" in result["output"]
    assert env.workspace.read_file("files/test.txt").decode().strip() == "test content"


def test_bashfleet_environment_shell_features(make: Make) -> None:
    env = make()
    result = env.execute({"command": "echo 'hello world' | grep 'world'"})
    assert result["returncode"] == 0
    assert "hello world" in result["output"]
    result = env.execute({"command": "echo $(echo 'nested')"})
    assert result["returncode"] == 0
    assert "nested" in result["output"]


# ------------------------------------------------------------ the rest of the protocol


def test_the_environment_submits_itself(make: Make) -> None:
    env = make()
    with pytest.raises(Submitted) as raised:
        env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo the patch"})
    assert raised.value.messages == ({
        "role": "exit", "content": "the patch\n",
        "extra": {"exit_status": "Submitted", "submission": "the patch\n"}},)
    failed = env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; false"})
    assert failed["returncode"] == 1  # a failed command does not submit


def test_a_signal_is_a_negative_returncode_and_output_is_whole(make: Make) -> None:
    env = make()
    assert env.execute({"command": "kill -9 $$"})["returncode"] == -9
    long = env.execute({"command": "seq 1 100000"})
    assert long["output"].splitlines() == [str(n) for n in range(1, 100001)]


def test_template_vars_and_serialize_describe_the_host(make: Make) -> None:
    env = make(timeout=7)
    found = env.get_template_vars(task="t")
    assert found["system"] == "Linux" and found["machine"]
    assert (found["timeout"], found["task"], found["host"]) == (7, "t", HOST)
    assert found["cwd"] == env.workspace.path
    info = env.serialize()["info"]["config"]
    assert info["environment_type"] == ENVIRONMENT_CLASS
    assert info["environment"]["timeout"] == 7
    assert info["workspace"]["id"] == env.workspace.id


def test_cleanup_deletes_the_workspace(make: Make, redis_server: RedisServer) -> None:
    env = make()
    env.execute({"command": "sleep 300 &"})
    workspace_id = env.workspace.id
    env.cleanup()
    with Fleet(redis_server.url) as fleet, pytest.raises(UnknownWorkspace):
        fleet.open_workspace(workspace_id)


def test_host_and_label_are_one_choice() -> None:
    with pytest.raises(ValueError, match="a host or a label, not both"):
        BashfleetEnvironmentConfig(host="a", label="b")


# -------------------------------------------------------------------- end to end


def test_default_agent_with_a_deterministic_model(host: WorkerProcess) -> None:
    """mini-swe-agent's DefaultAgent, its default config and DeterministicModel: a
    scripted model finds a bug, fixes it, checks, and submits, in a bashfleet workspace."""
    config = yaml.safe_load(
        files("minisweagent.config").joinpath("default.yaml").read_text())["agent"]
    env = get_environment({"environment_class": ENVIRONMENT_CLASS, "host": HOST,
                           "timeout": 20})
    assert isinstance(env, BashfleetEnvironment)
    model = DeterministicModel(outputs=[
        make_output("Write the program.", [{"command": (
            "mkdir -p app && printf 'def add(a, b):\\n    return a - b\\n' > app/calc.py")}]),
        # -B: the fix below keeps calc.py's size, within the second it was written: a
        # bytecode cache would be taken for it (the worker's PYTHONDONTWRITEBYTECODE
        # no longer reaches calls, as nothing of its environment does).
        make_output("Run it.", [{"command": (
            "cd app && python3 -B -c 'import calc; print(calc.add(2, 3))'")}]),
        make_output("Fix the bug.", [{"command": "sed -i 's/a - b/a + b/' app/calc.py"}]),
        make_output("Check.", [{"command": (
            "cd app && python3 -B -c 'import calc; print(calc.add(2, 3))'")}]),
        make_output("Submit.", [{"command": (
            "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat app/calc.py")}]),
    ])
    agent = DefaultAgent(model=model, env=env, **config)
    try:
        info = agent.run("Fix add() in app/calc.py")
        assert info["exit_status"] == "Submitted"
        assert info["submission"] == "def add(a, b):\n    return a + b\n"
        assert agent.n_calls == 5
        observations = [m["content"] for m in agent.messages
                        if m.get("role") == "user" and "<returncode>" in str(m.get("content"))]
        assert "<output>\n-1\n</output>" in observations[1]
        assert "<output>\n5\n</output>" in observations[3]
        assert env.workspace.read_file("app/calc.py") == b"def add(a, b):\n    return a + b\n"
    finally:
        env.cleanup()


def test_default_agent_in_an_image(host: WorkerProcess, registry_images: dict[str, str]
                                   ) -> None:
    """The environment's `image` (as mini-swe-agent's docker environment takes it): the
    agent's commands run in the image, its USER, WORKDIR and ENV."""
    config = yaml.safe_load(
        files("minisweagent.config").joinpath("default.yaml").read_text())["agent"]
    env = get_environment({"environment_class": ENVIRONMENT_CLASS, "host": HOST,
                           "image": registry_images["user"], "timeout": 20})
    assert isinstance(env, BashfleetEnvironment)
    model = DeterministicModel(outputs=[
        make_output("Look around.", [{"command": (
            "grep -o bookworm /etc/os-release | head -1; id -u; pwd")}]),
        make_output("Submit.", [{"command": (
            "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo $GREETING")}]),
    ])
    agent = DefaultAgent(model=model, env=env, **config)
    try:
        assert env.workspace.view.image is not None
        info = agent.run("Which system is this?")
        assert info["exit_status"] == "Submitted"
        assert info["submission"] == "hello\n"
        observations = [m["content"] for m in agent.messages
                        if m.get("role") == "user" and "<returncode>" in str(m.get("content"))]
        assert "<output>\nbookworm\n1000\n/work\n</output>" in observations[0]
    finally:
        env.cleanup()

"""bashfleet.worker.engine.call_env: what a call's environment holds where it runs (who it
is, its image's ENV, what it takes of the worker's), never the worker's own otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from bashfleet.worker.engine import call_env, sandbox
from bashfleet.worker.engine.environment import DEFAULT_PATH, HARDENING, MARKER_VAR
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import Call, ImageInfo, WorkspaceRecord

#: The worker's environment, started from a person's shell in a virtualenv.
WORKER_ENV = {
    "PATH": "/home/u/.venv/bin:/usr/bin:/bin", "LANG": "en_US.UTF-8", "LC_ALL": "en_US.UTF-8",
    "HOME": "/home/u", "USER": "u", "LOGNAME": "u", "SHELL": "/bin/zsh",
    "SSH_AUTH_SOCK": "/tmp/ssh-XXXX/agent.1", "DOCKER_AUTH_CONFIG": '{"auths":{}}',
    "MY_APP_PASS": "s3cr3t-pass", "PYTHONPATH": "/home/u/src", "VIRTUAL_ENV": "/home/u/.venv",
    "PIP_FIND_LINKS": "/home/u/wheels", "TERM": "xterm-256color",
}

#: Host accounts by uid: (name, home, shell).
ACCOUNTS = {0: ("root", "/root", "/bin/bash"), 999: ("runner", "/nonexistent", "/bin/sh"),
            1000: ("u", "/home/u", "/bin/zsh")}

RUNNER = sandbox.User("runner", 999, 999, (999,), "/nonexistent")


def _record(**fields: Any) -> WorkspaceRecord:
    return WorkspaceRecord(id="w" + "0" * 15, host="h", path="/w", fresh=True, out_dir="/o",
                           isolation="process", network=True, ttl_s=60, created_at=0, **fields)


def _image(env: list[str], user: str = "") -> ImageInfo:
    return ImageInfo(ref="r/i:t", digest="sha256:" + "0" * 64, env=env, user=user)


SANDBOXED = {"keeper_pid": 123, "socket_path": "/s"}
IDS = {**SANDBOXED, "ids": (100000, 65536)}

CASES: list[tuple[str, WorkspaceRecord | None, sandbox.User | None, dict[str, str]]] = [
    ("host root, ids of its own: root inside, the host's PATH and LANG",
     _record(**IDS), RUNNER,
     {"HOME": "/root", "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash",
      "PATH": WORKER_ENV["PATH"], "LANG": "en_US.UTF-8"}),
    ("an image: its ENV and PATH, nothing of the worker's",
     _record(**IDS, image=_image(["PATH=/opt/conda/bin:/usr/bin:/bin", "GREETING=hello",
                                  "HOME=/ignored"])), RUNNER,
     {"HOME": "/root", "USER": "root", "LOGNAME": "root", "PATH": "/opt/conda/bin:/usr/bin:/bin",
      "GREETING": "hello"}),
    ("an image with no PATH in its ENV: the usual one",
     _record(**IDS, image=_image(["GREETING=hello"])), RUNNER,
     {"HOME": "/root", "USER": "root", "LOGNAME": "root", "PATH": DEFAULT_PATH,
      "GREETING": "hello"}),
    ("an image whose USER is not root: no USER (as docker exec)",
     _record(**IDS, image=_image([], user="1000"), home="/home/1000"), RUNNER,
     {"HOME": "/home/1000", "PATH": DEFAULT_PATH}),
    ("sandboxed without ids: the run user's account",
     _record(**SANDBOXED), RUNNER,
     {"HOME": "/nonexistent", "USER": "runner", "LOGNAME": "runner", "SHELL": "/bin/sh",
      "PATH": WORKER_ENV["PATH"], "LANG": "en_US.UTF-8"}),
    ("unsandboxed as the run user",
     _record(), RUNNER,
     {"HOME": "/nonexistent", "USER": "runner", "LOGNAME": "runner", "SHELL": "/bin/sh",
      "PATH": WORKER_ENV["PATH"], "LANG": "en_US.UTF-8"}),
    ("unsandboxed as the worker's own user (uid 1000)",
     None, None,
     {"HOME": "/home/u", "USER": "u", "LOGNAME": "u", "SHELL": "/bin/zsh",
      "PATH": WORKER_ENV["PATH"], "LANG": "en_US.UTF-8"}),
]


@pytest.fixture(autouse=True)
def _accounts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(call_env, "_account", ACCOUNTS.get)
    monkeypatch.setattr("os.geteuid", lambda: 1000)


def _taken(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in HARDENING and k != MARKER_VAR}


@pytest.mark.parametrize(("what", "record", "user", "expected"), CASES, ids=[c[0] for c in CASES])
def test_a_calls_environment_where_it_runs(
    what: str, record: WorkspaceRecord | None, user: sandbox.User | None,
    expected: dict[str, str],
) -> None:
    del what
    child = call_env.child_env(Call(call_id="c1", command="env"), Settings(), record, user,
                               marker="c1", worker_env=WORKER_ENV)
    assert _taken(child.env) == expected
    assert child.env[MARKER_VAR] == "c1" and child.env["TERM"] == "dumb"
    # Whatever it takes, the worker's exported password's value is still redacted.
    assert "s3cr3t-pass" in child.scrubbed_values


@pytest.mark.parametrize("on_image", [False, True])
def test_the_operators_names_and_the_callers_variables(on_image: bool) -> None:
    settings = Settings(env_pass=("LC_*", "MY_APP_PASS", "SSH_AUTH_SOCK"))
    record = _record(**IDS, image=_image([]) if on_image else None)
    call = Call(call_id="c1", command="env", env={"FOO": "1", "PAGER": "less"},
                unset_env=["LC_ALL"])
    env = call_env.child_env(call, settings, record, RUNNER, marker="c1",
                             worker_env={**WORKER_ENV, "LC_TIME": "C"}).env
    assert env["LC_TIME"] == "C" and "LC_ALL" not in env  # passed; unset by the session
    assert env["SSH_AUTH_SOCK"] == WORKER_ENV["SSH_AUTH_SOCK"]  # named: passed
    assert "MY_APP_PASS" not in env  # named, but a deny pattern scrubs it
    assert env["FOO"] == "1" and env["PAGER"] == "less"
    assert "PYTHONPATH" not in env and "VIRTUAL_ENV" not in env
    assert ("LANG" in env) != on_image

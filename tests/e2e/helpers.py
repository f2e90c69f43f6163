"""What the end-to-end tests share: the CLI in a private state directory, waits, cleanup."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from bashfleet.worker.engine import sandbox
from bashfleet.worker.settings import Settings

T = TypeVar("T")

#: The TypeScript MCP SDK's clients (`*.mjs`) and the lock file they are installed from.
TS_DIR = Path(__file__).with_name("ts")


def wait_for(check: Callable[[], T | None], what: str, timeout: float = 30.0) -> T:
    """Poll `check` until it returns something truthy; fail with `what` on timeout."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def typescript_client(script: str) -> Path:
    """A client script of TS_DIR, with the TypeScript SDK installed beside it from the
    lock file (once: `npm ci`; node and npm are part of the test environment, as the
    MCP Inspector's users have them)."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.fail("node and npm are needed: the TypeScript SDK client is part of the suite")
    if not (TS_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                              cwd=TS_DIR, capture_output=True, text=True, timeout=600,
                              check=False)
        assert done.returncode == 0, done.stderr[-2000:]
    return TS_DIR / script


def bashfleet_command() -> list[str]:
    """The `bashfleet` console script of this interpreter's environment, as a user runs
    it (CI runs these tests against the wheel installed in a fresh virtualenv)."""
    script = Path(sys.executable).with_name("bashfleet")
    return [str(script)] if script.exists() else [sys.executable, "-m", "bashfleet.client.cli"]


class Cli:
    """Runs `bashfleet` with a private state directory.

    A fleet it brings up makes its workspaces beside that directory (never in the
    machine's default root, which every run on this machine shares), and allows the
    directories under `projects` as workspaces: a call whose `--cwd` is in one runs
    there, where the test reads and writes its files (a test's tmp_path is invisible to
    a sandboxed call: its /tmp is private)."""

    def __init__(self, state_dir: Path) -> None:
        self.env = dict(os.environ)
        self.env["BASHFLEET_STATE_DIR"] = str(state_dir)
        self.env.pop("BASHFLEET_REDIS_URL", None)
        self.state_dir = state_dir
        self.projects = state_dir.parent / f"{state_dir.name}-projects"
        self.env["BASHFLEET_WORKSPACE_ROOT"] = str(state_dir.parent / f"{state_dir.name}-ws")
        self.env["BASHFLEET_WORKSPACE_ALLOW"] = str(self.projects)
        self.up_stdout = ""
        """What `bashfleet up` printed (`local_fleet`)."""

    def project(self) -> Path:
        """A new directory under `projects`, the run user's (as an operator gives a build
        directory to it): a call with it as `--cwd` runs in it."""
        path = self.projects / f"p{uuid.uuid4().hex[:10]}"
        path.mkdir(parents=True)
        user = sandbox.run_user(Settings(host="e2e"))
        if user is not None:  # calls run as the run user when the fleet runs as root
            os.chown(path, user.uid, user.gid)
        return path

    def __call__(
        self, *args: str, timeout: float = 60.0, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        # No stdin unless given: `run` forwards a piped stdin to the command, so an
        # inherited one (a CI runner's pipe) would change what the tests run.
        stdin = subprocess.DEVNULL if input is None else None
        return subprocess.run(
            [*bashfleet_command(), *args], input=input, stdin=stdin,
            env=self.env, capture_output=True, text=True, timeout=timeout, check=False,
        )

    def fleet_state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state_dir / "fleet" / "fleet.json").read_text())
        return data


@contextlib.contextmanager
def local_fleet(state_dir: Path, *up_args: str, env: dict[str, str] | None = None
                ) -> Iterator[Cli]:
    """`bashfleet up --detach UP_ARGS` in a private state directory (`env`: settings the
    fleet starts with); `down` at the end (and whatever it recorded killed by pid, should
    `down` fail)."""
    cli = Cli(state_dir)
    cli.env.update(env or {})
    up = cli("up", *up_args, "--detach", timeout=120)
    cli.up_stdout = up.stdout
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        yield cli
    finally:
        down = cli("down", timeout=120)
        kill_recorded(cli)
        assert down.returncode == 0, down.stderr


def kill_recorded(cli: Cli) -> None:
    """Last resort if `down` failed: end what fleet.json recorded, by pid."""
    try:
        state = cli.fleet_state()
    except FileNotFoundError:
        return
    for proc in state["processes"]:
        try:
            if abs(psutil.Process(proc["pid"]).create_time() - proc["start_time"]) < 0.05:
                os.killpg(proc["pid"], signal.SIGKILL)
        except (psutil.Error, ProcessLookupError):
            continue

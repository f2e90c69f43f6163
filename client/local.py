"""The local fleet of `bashfleet up`: a Redis server, workers and Flower on this machine.

Everything it starts is recorded in `<state_dir>/fleet/fleet.json` (mode 0600: it
holds the Redis password and Flower's credentials) with each process's pid and start
time, so `bashfleet down` ends exactly those processes, by pid, and never a process
that reused a pid. Clients find the fleet's Redis URL in that file with no
configuration.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict

from client.redis_server import RedisServer, free_port, ping
from worker.settings import Settings, get_settings

#: Seconds a stopped process gets to exit before SIGKILL.
STOP_GRACE_S = 10.0


class FleetProcess(BaseModel):
    """One process of the local fleet."""

    model_config = ConfigDict(extra="forbid")

    role: str
    """redis, worker or flower."""
    name: str
    """Host id for workers; the role otherwise."""
    pid: int
    """Process id."""
    start_time: float
    """Kernel start time, to never signal a process that reused the pid."""
    log: str | None = None
    """Where its output goes."""


class FleetState(BaseModel):
    """What `bashfleet up` started, as saved in fleet.json."""

    model_config = ConfigDict(extra="forbid")

    redis_url: str
    """URL of the fleet's Redis (holds the password: the file is 0600)."""
    redis_owned: bool
    """True when `up` started that Redis (and `down` stops it)."""
    processes: list[FleetProcess] = []
    """Everything started, in start order."""
    flower_url: str | None = None
    """Flower's address, when started."""
    flower_user: str | None = None
    """Flower's basic-auth user."""
    flower_password: str | None = None
    """Flower's basic-auth password."""
    hosts: list[str] = []
    """Host ids of the local workers."""
    started_at: float = 0.0
    """When `up` ran."""


def fleet_dir(settings: Settings | None = None) -> Path:
    """Where the local fleet keeps its state, logs and Redis data."""
    return (settings or get_settings()).state_dir / "fleet"


def state_path(settings: Settings | None = None) -> Path:
    """The fleet.json file."""
    return fleet_dir(settings) / "fleet.json"


def load_state(settings: Settings | None = None) -> FleetState | None:
    """The running local fleet's state, or None."""
    try:
        return FleetState.model_validate_json(state_path(settings).read_text("utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def save_state(state: FleetState, settings: Settings | None = None) -> None:
    """Write fleet.json readable by this user only."""
    path = state_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(state.model_dump_json(indent=2))
    os.replace(tmp, path)


def local_redis_url(settings: Settings | None = None) -> str | None:
    """Redis URL of the local fleet started by `bashfleet up`, if one runs."""
    state = load_state(settings)
    return state.redis_url if state else None


def _record(role: str, name: str, proc: subprocess.Popen[bytes], log: Path | None) -> FleetProcess:
    started = psutil.Process(proc.pid).create_time()
    return FleetProcess(
        role=role, name=name, pid=proc.pid, start_time=started, log=str(log) if log else None
    )


def is_alive(process: FleetProcess) -> bool:
    """True when the recorded process still runs (and is the same process)."""
    try:
        proc = psutil.Process(process.pid)
        same = abs(proc.create_time() - process.start_time) < 0.05
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass
class UpOptions:
    """What `bashfleet up` was asked for."""

    hosts: tuple[str, ...] = ("local",)
    concurrency: int = 4
    flower: bool = True
    flower_port: int = 5555
    labels: tuple[str, ...] = ()
    log: Callable[[str], None] = field(default=print)


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            # Own session: the fleet outlives the `up` command (--detach) and a Ctrl-C
            # in the terminal reaches only `up`, which then stops it in order.
            start_new_session=True,
        )


def start(options: UpOptions, settings: Settings | None = None) -> FleetState:
    """Start Redis (unless one is configured), the workers and Flower; save the state."""
    settings = settings or get_settings()
    existing = load_state(settings)
    if existing and any(is_alive(p) for p in existing.processes):
        raise RuntimeError(
            "a local fleet is already running (bashfleet down stops it); "
            f"state: {state_path(settings)}"
        )
    base = fleet_dir(settings)
    processes: list[FleetProcess] = []
    configured = settings.redis_url_value()
    if configured:
        url, owned = configured, False
    else:
        server = RedisServer(base / "redis", password=secrets.token_urlsafe(24))
        processes.append(_record("redis", "redis", server.start(), base / "redis" / "redis.log"))
        url, owned = server.url, True
        options.log(f"redis    127.0.0.1:{server.port} (embedded, password protected)")
    state = FleetState(
        redis_url=url, redis_owned=owned, processes=processes, hosts=list(options.hosts),
        started_at=time.time(),
    )
    save_state(state, settings)  # saved early: `down` can clean up a half-started fleet
    for host in options.hosts:
        state.processes.append(_start_worker(host, options, url, settings))
        save_state(state, settings)
        options.log(f"worker   {host} ({options.concurrency} slots)")
    if options.flower:
        _start_flower(state, options, url, settings)
        save_state(state, settings)
    return state


def _worker_env(url: str, host: str, settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env["BASHFLEET_REDIS_URL"] = url
    env["BASHFLEET_HOST"] = host
    # Each local host keeps its own spill and job files, as separate machines would.
    env["BASHFLEET_STATE_DIR"] = str(settings.state_dir / "hosts" / host)
    return env


def _start_worker(host: str, options: UpOptions, url: str, settings: Settings) -> FleetProcess:
    args = [
        sys.executable, "-m", "client.cli", "worker", "--host", host,
        "--concurrency", str(options.concurrency),
    ]
    for label in options.labels:
        args += ["--label", label]
    log = fleet_dir(settings) / "logs" / f"worker-{host}.log"
    proc = _spawn(args, _worker_env(url, host, settings), log)
    return _record("worker", host, proc, log)


def _start_flower(state: FleetState, options: UpOptions, url: str, settings: Settings) -> None:
    # Port 0, or a taken one: pick a free port rather than fail.
    wanted = options.flower_port
    port = wanted if wanted and _port_free(wanted) else free_port()
    password = secrets.token_urlsafe(12)
    env = dict(os.environ)
    env["BASHFLEET_REDIS_URL"] = url
    # Credentials through the environment, not argv, so `ps` does not show them.
    env["FLOWER_BASIC_AUTH"] = f"admin:{password}"
    args = [
        sys.executable, "-m", "celery", "-A", "worker.app", "flower",
        "--address=127.0.0.1", f"--port={port}",
    ]
    log = fleet_dir(settings) / "logs" / "flower.log"
    proc = _spawn(args, env, log)
    state.processes.append(_record("flower", "flower", proc, log))
    state.flower_url = f"http://127.0.0.1:{port}"
    state.flower_user = "admin"
    state.flower_password = password
    options.log(f"flower   {state.flower_url} (user admin, password in {state_path(settings)})")


def _port_free(port: int) -> bool:
    return not ping(port, timeout=0.1) and _bindable(port)


def _bindable(port: int) -> bool:
    import socket  # noqa: PLC0415

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stop(settings: Settings | None = None, log: Callable[[str], None] = print) -> int:
    """Stop every process of the local fleet (workers first, Redis last); return how many."""
    settings = settings or get_settings()
    state = load_state(settings)
    if state is None:
        log("no local fleet is running")
        return 0
    order = {"worker": 0, "flower": 1, "redis": 2}
    stopped = 0
    for process in sorted(state.processes, key=lambda p: order.get(p.role, 3)):
        if is_alive(process):
            _stop_process(process)
            stopped += 1
            log(f"stopped  {process.role} {process.name} (pid {process.pid})")
    state_path(settings).unlink(missing_ok=True)
    return stopped


def _stop_process(process: FleetProcess) -> None:
    """SIGTERM its process group (it leads one: started with a new session), wait, SIGKILL."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    delay = 0.01
    while is_alive(process) and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    if is_alive(process):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(process.pid, os.WNOHANG)

"""CLI benchmark: how long a `bashfleet` command takes as a process, start to exit,
against `python -c pass` and podman's own CLI, measured in the same run.

    python -m bench.bench_cli [--quick] [--rounds N] [--dir D]

Starts its own Redis, one worker and a registry on 127.0.0.1 (the tests'
`tests/integration/registry.py` and its Debian bookworm image), makes one workspace and
pulls the image onto the host once; puts the same image in a podman storage of its own
(in the temporary directory: rootful, runc, `--network none`, this machine's ulimits)
with one running container. Then, in rounds, each command once a round in an order
that rotates every round (load that comes and goes weighs on every row alike):

| row | peer | target (p50) |
|---|---|---|
| `python -c pass` (the interpreter's own start, the baseline) | - | - |
| `bashfleet --help` | `podman --version` | <= 60 ms |
| `bashfleet run --workspace W true`, W's keeper awake | `podman exec C true` | <= 120 ms |
| the same, W's keeper asleep (the call wakes it) | `podman exec C true` | - |
| `bashfleet run --image REF true` (held) | `podman run --rm --network none REF true` | <= 150 ms |

The package's bytecode is compiled first, as `pip install` compiles it (a checkout
run with PYTHONDONTWRITEBYTECODE would compile each module a command loads at every start).

`over python` is a row's p50 less `python -c pass`'s: what bashfleet adds to starting
Python. Without podman the peers' rows are left out (said under the table); the
bashfleet rows and the baseline are measured all the same.

Not a test: it never fails on a miss. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bashfleet.client import Fleet
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine.workspaces import store
from bashfleet.worker.settings import Settings
from bench import cleanup

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# The tests' registry and images: the one way to serve a registry on this machine.
from integration.registry import Registry, pushed_images, running_registry

HOST = "bench-cli"
#: podman on this machine: runc (crun refuses the hybrid cgroups), cgroupfs, file events.
PODMAN_GLOBAL = ("--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file")
ULIMITS = ("--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")
CONTAINER = "bench-cli-exec"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Row:
    """One command, timed once a round; `peer`: the row it is compared with."""

    name: str
    argv: list[str]
    peer: str | None = None
    target_s: float | None = None
    before: Callable[[], None] | None = None
    """Untimed, right before each timing: what the row's state must be (a keeper awake
    or asleep)."""
    times: list[float] = field(default_factory=list)

    def time_once(self, env: dict[str, str]) -> None:
        if self.before is not None:
            self.before()
        started = time.perf_counter()
        done = subprocess.run(self.argv, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, check=False)
        self.times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise RuntimeError(f"{self.name} exited {done.returncode}: "
                               f"{done.stderr.decode(errors='replace')[-2000:]}")


def _bashfleet() -> list[str]:
    """The `bashfleet` console script of this interpreter's environment, as a user runs it
    (else the module, through the same interpreter)."""
    script = Path(sys.executable).parent / "bashfleet"
    return [str(script)] if script.exists() else [sys.executable, "-m", "bashfleet.client.cli"]


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling a condition with a deadline


# ------------------------------------------------------------------------- the fleet


@contextlib.contextmanager
def running_fleet(root: Path, registry: Registry) -> Iterator[dict[str, str]]:
    """Redis and one worker that pulls from `registry`; the environment a CLI of this
    fleet runs with (its URL and signing key, nothing else of the caller's BASHFLEET_*)."""
    with cleanup.hosts_ended(root), RedisServer(root / "redis") as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
        # This process's clients sign with the same key (workers refuse unsigned calls).
        key = os.environ.setdefault("BASHFLEET_SIGNING_KEY", secrets.token_hex(16))
        env |= {"BASHFLEET_REDIS_URL": server.url, "BASHFLEET_SIGNING_KEY": key}
        worker_env = env | {"BASHFLEET_STATE_DIR": str(root / "host"),
                            "BASHFLEET_WORKSPACE_ROOT": str(cleanup.workspace_root(root / "host")),
                            "BASHFLEET_REGISTRY_AUTH_FILE": str(registry.auth_file),
                            "BASHFLEET_REGISTRY_CERTS_DIR": str(registry.certs_dir)}
        argv = [sys.executable, "-m", "bashfleet.worker.fleet.supervisor", "--host", HOST,
                "--concurrency", "2"]
        with open(root / "worker.log", "wb") as log:
            worker = subprocess.Popen(argv, env=worker_env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield env
        finally:
            # Ours, by its group id (it leads a session of its own).
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()


def _fleet(env: dict[str, str]) -> Fleet:
    return Fleet(env["BASHFLEET_REDIS_URL"])


# ---------------------------------------------------------------------------- podman


class Podman:
    """podman on a storage of its own under `base`, the image pulled from `registry`."""

    def __init__(self, base: Path, registry: Registry) -> None:
        self.base = base
        self.registry = registry
        self.env = {**os.environ, "TMPDIR": str(base / "tmp")}

    def argv(self, *args: str) -> list[str]:
        return ["podman", "--root", str(self.base / "storage"), "--runroot",
                str(self.base / "run"), "--storage-driver", "overlay", *PODMAN_GLOBAL, *args]

    def __call__(self, *args: str, timeout: float = 300.0) -> str:
        done = subprocess.run(self.argv(*args), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args[:2])} failed: {done.stderr[-2000:]}")
        return done.stdout

    def pull(self, ref: str) -> None:
        (self.base / "tmp").mkdir(parents=True, exist_ok=True)
        self("pull", "--quiet", "--cert-dir", str(self.registry.certs_dir), "--creds",
             f"{self.registry.username}:{self.registry.password}", ref)

    def close(self) -> None:
        """Remove what it made (containers, then images), so nothing stays mounted."""
        for args in (("rm", "--force", "--all", "--time", "0"), ("rmi", "--force", "--all")):
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self(*args, timeout=120)


@contextlib.contextmanager
def podman_with(base: Path, registry: Registry, ref: str) -> Iterator[Podman | None]:
    """Podman with `ref` pulled and a container running `sleep` for `exec`; None (and
    why, on stderr) where podman is missing or cannot run it."""
    if shutil.which("podman") is None:
        _say("podman is not installed: its rows are left out")
        yield None
        return
    podman = Podman(base, registry)
    try:
        try:
            podman.pull(ref)
            podman("run", "--detach", "--name", CONTAINER, "--network", "none", *ULIMITS,
                   ref, "sleep", "infinity")
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            _say(f"podman cannot run the image here ({exc}): its rows are left out")
            yield None
            return
        yield podman
    finally:
        podman.close()


# ---------------------------------------------------------------------------- rounds


def _ns_pids(pid: int) -> list[int]:
    """Host pids of the processes in the PID namespace `pid` is in."""
    ns = os.readlink(f"/proc/{pid}/ns/pid")
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{name}/ns/pid") == ns:
                    found.append(int(name))
    return found


@dataclass
class Keeper:
    """A workspace of the bench's host, as its calls find it: awake (its Python keeper
    serving) or asleep (its holder, pid 1, alone)."""

    fleet: Fleet
    workspace: str
    host_state: Path

    def _holder_pid(self) -> int:
        settings = Settings(state_dir=self.host_state)
        return int(store.load(self.workspace, settings).keeper_pid or 0)

    def asleep(self) -> bool:
        return len(_ns_pids(self._holder_pid())) == 1

    def wake(self) -> None:
        self.fleet.run("true", workspace=self.workspace)

    def wait_asleep(self) -> None:
        _wait(self.asleep, "the workspace's keeper to sleep")


def make_rows(env: dict[str, str], ref: str, workspace: str, podman: Podman | None, *,
              awake: Keeper | None = None, asleep: Keeper | None = None) -> list[Row]:
    cli = _bashfleet()
    rows = [Row("python -c pass", [sys.executable, "-c", "pass"])]
    if podman is not None:
        rows.append(Row("podman --version", podman.argv("--version")))
    rows.append(Row("bashfleet --help", [*cli, "--help"], "podman --version", 0.060))
    if podman is not None:
        rows.append(Row("podman exec C true", podman.argv("exec", CONTAINER, "true")))
    rows.append(Row("bashfleet run --workspace W true",
                    [*cli, "run", "--workspace", workspace, "true"], "podman exec C true",
                    0.120, before=awake.wake if awake is not None else None))
    if asleep is not None:
        rows.append(Row("  the same, W's keeper asleep (info)",
                        [*cli, "run", "--workspace", asleep.workspace, "true"],
                        "podman exec C true", before=asleep.wait_asleep))
    if podman is not None:
        rows.append(Row("podman run --rm --network none REF true",
                        podman.argv("run", "--rm", "--network", "none", *ULIMITS, ref, "true")))
    rows.append(Row("bashfleet run --image REF true (image held)",
                    [*cli, "run", "--image", ref, "true"],
                    "podman run --rm --network none REF true", 0.150))
    return rows


def run_rounds(rows: Sequence[Row], rounds: int, env: dict[str, str],
               podman_env: dict[str, str]) -> None:
    """Each row once a round, the order rotated by one every round."""
    for row in rows:  # warm: the page cache, the image on the host
        row.time_once(podman_env if row.argv[0] == "podman" else env)
        row.times.clear()
    for index in range(rounds):
        turn = index % len(rows)
        for row in [*rows[turn:], *rows[:turn]]:
            row.time_once(podman_env if row.argv[0] == "podman" else env)
        if (index + 1) % 10 == 0:
            _say(f"{index + 1}/{rounds} rounds")


def _p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def table(rows: Sequence[Row]) -> list[tuple[str, ...]]:
    by_name = {row.name: row for row in rows}
    python = statistics.median(by_name["python -c pass"].times)
    lines: list[tuple[str, ...]] = []
    for row in rows:
        p50 = statistics.median(row.times)
        peer = by_name.get(row.peer or "")
        ratio = f"{p50 / statistics.median(peer.times):.2f}x" if peer else "-"
        target = f"<= {row.target_s * 1e3:.0f} ms" if row.target_s else "-"
        status = "info" if row.target_s is None else ("ok" if p50 <= row.target_s else "MISS")
        over = "-" if row.name == "python -c pass" else f"{(p50 - python) * 1e3:+.1f} ms"
        lines.append((row.name, f"{p50 * 1e3:.1f} ms", f"{_p(row.times, 0.9) * 1e3:.1f} ms",
                      over, peer.name if peer else "-", ratio, target, status))
    return lines


def _print(lines: Sequence[tuple[str, ...]]) -> None:
    header = ("row", "p50", "p90", "over python", "peer", "ratio to peer", "target", "status")
    widths = [max(len(line[i]) for line in (header, *lines)) for i in range(len(header))]
    for line in (header, tuple("-" * w for w in widths), *lines):
        print(" | ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))


def _compile_package() -> None:
    """The package's bytecode, as `pip install` compiles it into site-packages: a
    checkout run with PYTHONDONTWRITEBYTECODE set would otherwise compile every module a
    command loads at each start (tens of milliseconds a run that no user pays)."""
    import compileall  # noqa: PLC0415 - this one use

    import bashfleet  # noqa: PLC0415
    from bashfleet import client, worker  # noqa: PLC0415

    compileall.compile_file(str(bashfleet.__file__), quiet=1)
    for package in (client, worker):
        for folder in package.__path__:
            compileall.compile_dir(folder, quiet=1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.bench_cli", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 rounds: a smoke run")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 30)")
    parser.add_argument("--dir", type=Path, default=None, help="where its state goes")
    args = parser.parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 30)
    _compile_package()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-cli-") as folder:
        base = Path(folder)
        with running_registry(base / "registry") as registry:
            ref = pushed_images(registry)["debian"]
            with running_fleet(base, registry) as env:
                fleet = _fleet(env)
                _wait(lambda: any(h.host == HOST and h.alive and h.ready
                                  for h in fleet.hosts()), "the worker")
                _say(f"pulling {ref} onto the host")
                fleet.workspace(host=HOST, image=ref).delete()
                workspace = fleet.workspace(host=HOST)
                sleeper = fleet.workspace(host=HOST)
                with podman_with(base / "podman", registry, ref) as podman:
                    rows = make_rows(env, ref, workspace.id, podman,
                                     awake=Keeper(fleet, workspace.id, base / "host"),
                                     asleep=Keeper(fleet, sleeper.id, base / "host"))
                    _say(f"{rounds} rounds of {len(rows)} commands")
                    run_rounds(rows, rounds, env, podman.env if podman else env)
                workspace.delete()
                sleeper.delete()
    print(f"bashfleet CLI benchmark: python {sys.version.split()[0]}, cpus {os.cpu_count()}, "
          f"{rounds} rounds, the order rotated each round")
    _print(table(rows))
    if not any(row.name.startswith("podman") for row in rows):
        print("\n(podman is missing or cannot run the image here: no peer rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Serve one host: hold its id, keep its heartbeat, run its two Celery consumers.

`main()` is the supervisor (what `bashfleet worker` runs). It

1. takes the host lock (`bashfleet:alive:<host>`), refusing to start while another
   live worker holds the same host id; a lock left by a dead worker of this machine
   is taken over at once, one left elsewhere when it expires (seconds);
2. recovers from a previous instance that died: kills the foreground calls it left
   running (their callers were told "worker lost"; the commands must not go on),
   and re-adopts its background jobs, recording the end of those that ended meanwhile;
3. starts two consumer processes in its process group, each a Celery worker with a
   threads pool: `calls@<host>` on the command queues (`--concurrency` slots) and
   `control@<host>` on the control queue, so control calls never wait for a slot
   (`flower.worker_name`);
4. renews the heartbeat every second and keeps Redis (and Flower) in step with its
   jobs, restarts a consumer that crashed (killing the calls it ran), and on SIGTERM /
   SIGINT stops: running calls are killed and answered with a note, the lock released.

`python -m bashfleet.worker.fleet.supervisor --host H --concurrency N [--label L]` runs it too; each
consumer is `python -m bashfleet.worker.fleet.consumer` (`bashfleet.worker.fleet.consumer`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from types import FrameType
from typing import Any

import redis
from pydantic_settings import NoDecode

from bashfleet.worker.engine import procs, running, sandbox
from bashfleet.worker.engine.snapshots import layer_fs
from bashfleet.worker.fleet import flower, logs, recovery, registry, workspace_calls
from bashfleet.worker.fleet.celery_apps import client_celery
from bashfleet.worker.fleet.connect import redis_client, safe_url
from bashfleet.worker.settings import (
    SECRET_FIELDS,
    SECRET_VARIABLES,
    SECRETS_FD_VAR,
    Settings,
    secrets_pipe,
)
from bashfleet.worker.state_dir import check_state_dir
from bashfleet.worker.wire import names
from bashfleet.worker.wire.auth import AuthError, keyring
from bashfleet.worker.wire.names import ROLES, CallState
from bashfleet.worker.wire.records import open_host

log = logging.getLogger("bashfleet.worker")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_HOST_TAKEN = 3

#: Seconds the command consumer gets to answer its (killed) calls when stopping.
STOP_TIMEOUT_S = 15.0
#: Seconds between two passes over the background jobs.
JOB_SYNC_INTERVAL_S = 2.0
#: How long a worker waits for Redis at start before giving up.
REDIS_WAIT_S = 30.0
#: A consumer that crashes more often than this within a minute stops the worker.
MAX_RESTARTS_PER_MINUTE = 5


def version() -> str:
    """bashfleet's version, as installed."""
    try:
        return metadata.version("bashfleet")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def machine_id() -> str:
    """This machine and pid namespace: where a pid in a host record means something."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            boot = handle.read().strip()
    except OSError:
        boot = "?"
    try:
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = 0
    return f"{socket.gethostname()}:{boot}:{pidns}"


def settings_env(settings: Settings) -> dict[str, str]:
    """The settings as BASHFLEET_* variables, for the consumer processes."""
    env: dict[str, str] = {}
    for name in Settings.model_fields:
        value: Any = getattr(settings, name)
        if value is None or name in SECRET_FIELDS:
            continue  # secrets travel on a pipe (`secrets_pipe`), never in an environment
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        if isinstance(value, tuple):
            # As Settings reads it back: comma-separated for the fields that take that
            # (NoDecode), a JSON list for the others (their items may hold commas).
            metadata = Settings.model_fields[name].metadata
            if any(isinstance(item, NoDecode) or item is NoDecode for item in metadata):
                value = ",".join(map(str, value))
            else:
                value = json.dumps(list(value))
        env[f"BASHFLEET_{name.upper()}"] = str(value)
    return env


def _setup_logging(settings: Settings, host: str) -> None:
    logs.setup(settings.log_format, host, "supervisor")


def main(
    host: str, concurrency: int, labels: tuple[str, ...], settings: Settings, *,
    local_fallback: bool = False,
) -> int:
    """Serve `host` until SIGTERM / SIGINT; return the exit status.

    Refuses (status 3, with a message on stderr) while another live worker holds `host`,
    and (status 2) where its calls would run without a sandbox it was not told to do
    without (`unsandboxed_refusal`); `local_fallback` (the local fleet of `bashfleet up`
    only) lets `auto` fall back to no sandbox, loudly.
    """
    _setup_logging(settings, host)
    try:
        names.validate_host(host)
        for label in labels:
            names.validate_label(label)
    except ValueError as exc:
        print(f"bashfleet worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    url = settings.redis_url_value()
    if not url:
        print(
            "bashfleet worker: no Redis URL: set BASHFLEET_REDIS_URL "
            "(or start a local fleet with `bashfleet up`)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    settings = settings.model_copy(
        update={"host": host, "concurrency": concurrency, "labels": tuple(labels)}
    )
    try:
        check_state_dir(settings.state_dir)
    except ValueError as exc:
        print(f"bashfleet worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    errors, warnings = sandbox.startup_problems(settings)
    if settings.accepted_keys() and not settings.fleet_keys():
        errors = [*errors, "BASHFLEET_SIGNING_KEY holds an owner key: a worker needs the "
                  "fleet's key (owner keys are for clients)"]
    refusal = unsandboxed_refusal(settings.isolation, sandbox.probe(settings).problem,
                                  local_fallback=local_fallback)
    for error in [*errors, *([refusal] if refusal else [])]:
        print(f"bashfleet worker: {error}", file=sys.stderr)
    if errors or refusal:
        return EXIT_USAGE
    for warning in warnings:
        log.warning("host %s: %s", host, warning)
        if local_fallback and ("WITHOUT a sandbox" in warning or "no network" in warning):
            print(f"bashfleet worker {host}: {warning}", file=sys.stderr)
    if not settings.accepted_keys():
        if not settings.insecure_unsigned:
            print(UNSIGNED_REFUSAL, file=sys.stderr)
            return EXIT_USAGE
        # JSON logs: the warning line says it; a text banner would break one object a line.
        _warn_unsigned(host, banner=settings.log_format == "text")
    _put_layers(host, settings)
    return HostSupervisor(settings, url).run()


def _put_layers(host: str, settings: Settings) -> None:
    """The layer image in place when asked for, and said either way: what was mounted,
    or why it was not; not asked for, where the layers' file system makes it worth it."""
    layers = layer_fs.prepare(settings)
    if layers is not None:
        (log.info if layers[0] else log.warning)("host %s: %s", host, layers[1])
    elif (hint := _plain_layers_hint(settings)) is not None:
        log.info("host %s: %s", host, hint)


def _plain_layers_hint(settings: Settings) -> str | None:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as handle:
            return layer_fs.plain_layers_hint(settings, handle.read())
    except OSError:
        return None


#: Why a worker without a signing key does not start.
UNSIGNED_REFUSAL = (
    "bashfleet worker: no signing key: refusing to start. Without one, anyone who can "
    "write to Redis runs commands on this machine. Set BASHFLEET_SIGNING_KEY (or "
    "BASHFLEET_SIGNING_KEY_FILE; the same key on every client), or start with "
    "--insecure-unsigned to accept unsigned calls anyway."
)


def unsandboxed_refusal(
    isolation: str, problem: str | None, *, local_fallback: bool
) -> str | None:
    """Why a worker must not start, when its calls would run without a sandbox nobody
    asked to do without: `auto` where bubblewrap does not work. None when it may start:
    the sandbox works, `none` was asked for, a level was configured (startup_problems
    refuses that one itself), or this is the local fleet of `bashfleet up`, which may fall
    back (it says so loudly)."""
    if isolation != "auto" or problem is None or local_fallback:
        return None
    return (
        f"calls would run WITHOUT a sandbox: {problem}. Refusing to start: a command could "
        "read this worker's processes, environment and files. Give the worker what "
        "bubblewrap needs (deploy/OPERATIONS.md, \"The sandbox\"), or start it with "
        "--isolation none (BASHFLEET_ISOLATION=none) to run calls unsandboxed knowingly."
    )


def _own_secret_variable(name: str) -> bool:
    """A variable that holds one of the worker's own secrets, by exact name
    (`SECRET_VARIABLES`): never a pattern, which would also take settings such as
    BASHFLEET_SECRET_FILES and drop them when the worker execs itself."""
    return name in SECRET_VARIABLES


def scrub_own_environment(settings: Settings, argv: Sequence[str]) -> None:
    """Start again without the secrets in this process's environment, if they are there.

    /proc/<pid>/environ shows a process's initial environment for its whole life (and
    `ps e` prints it): deleting a variable from os.environ does not change it. So a
    worker given its key or Redis URL as variables execs itself once, the secrets
    handed over on a pipe (`secrets_pipe`), the variables gone.
    """
    present = [name for name in os.environ if _own_secret_variable(name)]
    if not present:
        return
    env = {k: v for k, v in os.environ.items() if k not in present}
    read_end = secrets_pipe(settings.secrets())
    os.set_inheritable(read_end, True)
    env[SECRETS_FD_VAR] = str(read_end)
    sys.stdout.flush()
    sys.stderr.flush()
    args = [sys.executable, "-m", "bashfleet.worker.fleet.supervisor", *argv]
    os.execve(sys.executable, args, env)  # noqa: S606 - no shell: this very module


def _warn_unsigned(host: str, *, banner: bool = True) -> None:
    """Say loudly that this worker runs whatever anyone with Redis access sends it."""
    if banner:
        rule = "!" * 78
        print(
            f"{rule}\nbashfleet worker {host}: NO SIGNING KEY CONFIGURED.\n"
            "Unsigned calls are accepted: anyone who can write to this Redis can run commands\n"
            "on this machine. Set BASHFLEET_SIGNING_KEY (the same key on every client).\n"
            f"{rule}",
            file=sys.stderr,
        )
    log.warning("host %s: no signing key configured; unsigned calls are accepted", host)


class HostSupervisor:
    """One host's worker: lock, heartbeat, recovery and the two consumers."""

    def __init__(self, settings: Settings, url: str) -> None:
        self.settings = settings
        self.url = url
        self.host = settings.host
        self.token = uuid.uuid4().hex
        self.redis = redis_client(url)
        self.stopping = threading.Event()
        self.exit_code = EXIT_OK
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: list[float] = []
        self.started_at = time.time()
        self.pid_start = procs.start_time(os.getpid()) or self.started_at
        self.sandbox = sandbox.probe(settings)
        self.keys = settings.sealing_keys()
        # Redis lost what this worker published (see `_registry_lost`): what is still
        # to publish again, retried at each beat until it worked (the job records by
        # the main loop, which owns the job watcher).
        self._ready_lost = False
        self._calls_lost = False
        self._jobs_lost = threading.Event()
        self._sync_failing = False
        # When the last heartbeat renewed the TTLs of hours (`registry.heartbeat`): never.
        self._renewed_at = float("-inf")

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> int:
        """Serve until told to stop; the exit status."""
        if not self._wait_redis():
            return EXIT_ERROR
        refusal = self._acquire()
        if refusal is not None:
            print(f"bashfleet worker: {refusal}", file=sys.stderr)
            return EXIT_HOST_TAKEN
        previous = self._install_signals()
        job_events: flower.JobEvents | None = None
        ticker = threading.Thread(
            target=self._heartbeat_loop, name="bashfleet-heartbeat", daemon=True
        )
        try:
            self._heartbeat(reset=True)
            ticker.start()
            recovery.recover_orphans(
                self.settings, self.redis, reason="a previous worker instance that died"
            )
            registry.reset_running(self.redis, self.host)
            job_events = flower.JobEvents(client_celery(self.url), self.host)
            watcher = recovery.JobWatcher(self.settings, self.redis, job_events)
            self._sync(watcher)
            for role in ROLES:
                self._start_child(role)
            log.info(
                "host %s: %d slot(s), labels %s, Redis %s, state in %s", self.host,
                self.settings.concurrency, ",".join(self.settings.labels) or "-",
                safe_url(self.url), self.settings.state_dir,
            )
            self._loop(watcher)
        finally:
            self.stopping.set()
            self._shutdown()
            if job_events is not None:
                job_events.close()
            self._restore_signals(previous)
        return self.exit_code

    def _wait_redis(self) -> bool:
        deadline = time.monotonic() + REDIS_WAIT_S
        warned = False
        while True:
            try:
                self.redis.ping()
                return True
            except redis.RedisError as exc:
                if time.monotonic() > deadline:
                    print(
                        f"bashfleet worker: Redis at {safe_url(self.url)} "
                        f"is unreachable: {exc}",
                        file=sys.stderr,
                    )
                    return False
                if not warned:
                    log.warning("waiting for Redis at %s: %s", safe_url(self.url), exc)
                    warned = True
                time.sleep(0.5)

    def _acquire(self) -> str | None:
        """Take the host lock; a refusal message when a live worker holds it."""
        deadline = time.monotonic() + names.ALIVE_TTL_S + 2
        while True:
            holder = registry.acquire_host(self.redis, self.host, self.token)
            if holder is None:
                return None
            record = registry.host_record(self.redis, self.host)
            if not self._sealed(record):
                record = {}  # forged, or another fleet's: only the lock's expiry is believed
            if record.get("instance") == holder and self._dead_here(record):
                if registry.take_over_host(self.redis, self.host, holder, self.token):
                    log.info(
                        "host %s: took over from a dead worker (pid %s)", self.host,
                        record.get("pid"),
                    )
                    return None
                continue
            age = time.time() - float(record.get("heartbeat_at") or 0)
            if age < 3 * names.HEARTBEAT_INTERVAL_S or time.monotonic() > deadline:
                return (
                    f"host id {self.host!r} is taken: a live worker holds it "
                    f"(pid {record.get('pid', '?')} on {record.get('machine', '?')}, "
                    f"last heartbeat {max(age, 0.0):.1f}s ago). Stop that worker first, "
                    "or give this one another --host."
                )
            time.sleep(0.2)  # a silent holder elsewhere: wait for its lock to expire

    def _sealed(self, record: dict[str, str]) -> bool:
        """True when a host record was sealed by a worker of this fleet."""
        try:
            open_host(keyring(self.keys), self.host, record)
        except AuthError:
            return False
        return True

    @staticmethod
    def _dead_here(record: dict[str, str]) -> bool:
        """True when the record's worker ran on this machine and its process is gone."""
        if record.get("machine_id") != machine_id():
            return False
        try:
            pid, started = int(record["pid"]), float(record["pid_start"])
        except (KeyError, ValueError):
            return False
        return not procs.is_same_process(pid, started)

    def _install_signals(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous  # an embedding caller stops us through `stopping`
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            previous[signum] = signal.signal(signum, self._on_signal)
        return previous

    @staticmethod
    def _restore_signals(previous: dict[int, Any]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if not self.stopping.is_set():
            log.info("host %s: %s received; stopping", self.host, signal.Signals(signum).name)
        self.stopping.set()

    # ----------------------------------------------------------------- heartbeat

    def _record(self) -> dict[str, object]:
        return {
            "host": self.host, "instance": self.token, "pid": os.getpid(),
            "pid_start": self.pid_start, "machine": socket.gethostname(),
            "machine_id": machine_id(), "version": version(),
            "concurrency": self.settings.concurrency, "labels": ",".join(self.settings.labels),
            "started_at": self.started_at, "state_dir": str(self.settings.state_dir),
            "sandbox": self.sandbox.model_dump_json(),
        }

    def _heartbeat(self, *, reset: bool = False) -> None:
        record = self._record()
        if reset:
            record.update(self._readiness({role: "" for role in ROLES}), stopped_at="")
        now = time.monotonic()
        renew = reset or now - self._renewed_at >= names.RENEW_EVERY_S
        outcome = registry.heartbeat(self.redis, self.host, self.token, record, self.keys,
                                     renew=renew)
        if renew:
            self._renewed_at = now
        if outcome == "taken":
            log.error("host %s: another worker instance took this host id; stopping", self.host)
            self.exit_code = EXIT_ERROR
            self.stopping.set()
            return
        if outcome == "missing" and not reset:
            self._registry_lost()
        self._republish()

    def _readiness(self, ready: dict[str, object]) -> dict[str, str]:
        """Consumers' readiness fields (`{role: pid or ""}`), sealed for this instance."""
        return registry.readiness(self.keys, self.host, self.token, ready)

    def _registry_lost(self) -> None:
        """Redis no longer holds our host record: it lost its data (a restart without
        persistence, a flush, a failover to an empty replica). This beat wrote the record
        again; the rest of what we own is published again from the local files, so that
        clients see the host ready, its busy slots, its calls and its jobs as before."""
        log.warning(
            "host %s: Redis lost this host's records; publishing them again from %s",
            self.host, self.settings.state_dir,
        )
        self._ready_lost = True
        self._calls_lost = True
        self._jobs_lost.set()

    def _republish(self) -> None:
        """What `_registry_lost` left to do (a RedisError leaves the rest for next beat)."""
        if self._ready_lost:
            # A consumer publishes its readiness once, when it starts: one still running
            # was ready before, and its Celery connection comes back by itself (as after
            # an outage that kept the data).
            ready: dict[str, object] = {
                role: child.pid for role, child in list(self.children.items())
                if child.poll() is None
            }
            if ready:
                registry.set_host_fields(self.redis, self.host, self._readiness(ready))
            self._ready_lost = False
        if self._calls_lost:
            restored = recovery.republish_calls(self.settings, self.redis, self.token)
            self._calls_lost = False
            if restored:
                log.info("host %s: %d running call(s) published again", self.host, restored)

    def _heartbeat_loop(self) -> None:
        failing = False
        while not self.stopping.wait(names.HEARTBEAT_INTERVAL_S):
            try:
                self._heartbeat()
                if failing:
                    log.info("host %s: Redis reachable again", self.host)
                failing = False
            except redis.RedisError as exc:
                if not failing:
                    log.warning("host %s: heartbeat failed: %s", self.host, exc)
                failing = True

    # ------------------------------------------------------------------ consumers

    def _start_child(self, role: str) -> None:
        args = [sys.executable, "-m", "bashfleet.worker.fleet.consumer", role,
                "--instance", self.token]
        secrets = secrets_pipe(self.settings.secrets())
        env = {**os.environ, **settings_env(self.settings), SECRETS_FD_VAR: str(secrets)}
        # Same process group as the supervisor: stopping (or killing) the worker's
        # group ends its consumers too; the commands run in sessions of their own.
        try:
            self.children[role] = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, env=env, pass_fds=(secrets,)
            )
        finally:
            os.close(secrets)

    def _loop(self, watcher: recovery.JobWatcher) -> None:
        next_sync = time.monotonic() + JOB_SYNC_INTERVAL_S
        reaper = workspace_calls.Reaper(self.settings, self.redis)
        denied = workspace_calls.DeniedPublisher(self.settings, self.redis, self.keys)
        while not self.stopping.wait(0.2):
            reaper.tick()
            denied.tick()
            for role, child in list(self.children.items()):
                if child.poll() is not None:
                    self._child_died(role, child)
            if self._jobs_lost.is_set():
                self._jobs_lost.clear()
                watcher.republish_all()
                next_sync = 0.0  # at once: clients may be checking those jobs now
            if time.monotonic() >= next_sync:
                self._sync(watcher)
                next_sync = time.monotonic() + JOB_SYNC_INTERVAL_S
            else:
                self._sync(watcher, ended_only=True)

    def _sync(self, watcher: recovery.JobWatcher, *, ended_only: bool = False) -> None:
        try:
            if ended_only:
                watcher.sync_ended()
                return
            watcher.sync()
        except (redis.RedisError, OSError) as exc:
            # Once per outage: a pass fails every JOB_SYNC_INTERVAL_S while Redis is down.
            if not self._sync_failing:
                log.warning("host %s: could not sync jobs: %s", self.host, exc)
            self._sync_failing = True
            return
        if self._sync_failing:
            log.info("host %s: jobs in sync with Redis again", self.host)
        self._sync_failing = False

    def _child_died(self, role: str, child: subprocess.Popen[bytes]) -> None:
        log.error(
            "host %s: the %s consumer (pid %d) exited with %s", self.host, role, child.pid,
            child.returncode,
        )
        with contextlib.suppress(redis.RedisError):
            registry.set_host_fields(self.redis, self.host, self._readiness({role: ""}))
        if role == "exec":
            recovery.recover_orphans(
                self.settings, self.redis, worker_pid=child.pid,
                reason="its worker's command consumer died",
            )
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < 60] + [now]
        if len(self.restarts) > MAX_RESTARTS_PER_MINUTE:
            log.error("host %s: consumers keep crashing; stopping", self.host)
            self.exit_code = EXIT_ERROR
            self.stopping.set()
            del self.children[role]
            return
        self._start_child(role)

    # ------------------------------------------------------------------- shutdown

    def _shutdown(self) -> None:
        """Stop taking calls, kill the running ones (they answer), stop consumers."""
        exec_child = self.children.get("exec")
        if exec_child is not None:
            _signal(exec_child, signal.SIGTERM)  # warm shutdown: no new calls
            self._stop_running_calls()
            _wait_or_kill(exec_child, STOP_TIMEOUT_S)
        recovery.recover_orphans(
            self.settings, self.redis, reason="its worker was stopped"
        )
        ctl_child = self.children.get("ctl")
        if ctl_child is not None:
            _signal(ctl_child, signal.SIGTERM)
            _wait_or_kill(ctl_child, 5.0)
        try:
            registry.release_host(self.redis, self.host, self.token)
        except redis.RedisError as exc:
            log.warning("host %s: could not release the host lock: %s", self.host, exc)
        log.info("host %s: stopped", self.host)

    def _stop_running_calls(self) -> None:
        entries = running.all_calls(self.settings)
        # Calls not on disk yet (claimed, or younger than the engine's first wake-up):
        # marked too, their running hook kills them when it records them.
        with contextlib.suppress(redis.RedisError):
            on_disk = {entry.call_id for entry in entries}
            for call_id in registry.busy_calls(self.redis, self.host):
                if call_id not in on_disk:
                    registry.mark_call(
                        self.redis, call_id, CallState.STOPPING, only_from=(CallState.RUNNING,)
                    )
        if not entries:
            return

        def stop(entry: running.RunningCall) -> None:
            with contextlib.suppress(redis.RedisError):
                registry.mark_call(
                    self.redis, entry.call_id, CallState.STOPPING,
                    only_from=(CallState.RUNNING,),
                )
            running.kill(entry)

        with ThreadPoolExecutor(max_workers=min(8, len(entries))) as pool:
            list(pool.map(stop, entries))


def _signal(child: subprocess.Popen[bytes], signum: int) -> None:
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)


def _wait_or_kill(child: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("consumer pid %d did not stop in %.0fs; killing it", child.pid, timeout)
        child.kill()
        child.wait()


# --------------------------------------------------------------------------- entry


def build_parser() -> argparse.ArgumentParser:
    """`python -m bashfleet.worker.fleet.supervisor` arguments."""
    parser = argparse.ArgumentParser(
        prog="bashfleet worker", description="Serve one host of the fleet."
    )
    parser.add_argument("--host", help="host id (default: BASHFLEET_HOST or the hostname)")
    parser.add_argument("--concurrency", type=int, help="command slots")
    parser.add_argument("--label", action="append", default=[], help="pool label (repeatable)")
    parser.add_argument(
        "--insecure-unsigned", action="store_true",
        help="run without a signing key: anyone who can write to Redis runs commands here",
    )
    parser.add_argument(
        "--isolation", choices=("auto", "none", "process", "strict"),
        help="how calls are sandboxed (default: BASHFLEET_ISOLATION, else auto: bubblewrap, "
             "and the worker refuses to start where it does not work); `none` runs calls "
             "unsandboxed",
    )
    parser.add_argument(
        "--local-fallback", action="store_true",
        help="(used by `bashfleet up` for its local fleet) under auto, run calls without "
             "a sandbox where bubblewrap does not work, saying so loudly, instead of "
             "refusing to start",
    )
    return parser


def cli(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m bashfleet.worker.fleet.supervisor`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.host:
        overrides["host"] = args.host
    if args.concurrency:
        overrides["concurrency"] = args.concurrency
    if args.insecure_unsigned:
        overrides["insecure_unsigned"] = True
    if args.isolation:
        overrides["isolation"] = args.isolation
    settings = Settings(**overrides)
    scrub_own_environment(settings, argv)
    labels = tuple(args.label) or settings.labels
    return main(settings.host, settings.concurrency, labels, settings,
                local_fallback=args.local_fallback)


if __name__ == "__main__":
    sys.exit(cli())

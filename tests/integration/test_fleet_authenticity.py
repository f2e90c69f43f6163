"""Attacks on the fleet's authenticity that once worked, each replayed against real
workers as the attacker did it: a Redis writer without the key forges a job's end, events
and host records (`test_5_*`); a message captured for one host runs on another
(`test_7_*`); one owner starts background jobs without end (`test_8_*`); the worker's
secret settings never took effect (`test_9_*`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bashfleet.client import CallNotRun, Fleet
from bashfleet.client.records import last_seq
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.wire import auth, names
from bashfleet.worker.wire.events import JobEvent
from bashfleet.worker.wire.models import CallResult, JobHandle
from bashfleet.worker.wire.names import Task

from .conftest import WorkerFactory, WorkerProcess, raw_exec, raw_task, wait_for

Hosts = tuple[WorkerProcess, WorkerProcess]
KEY = os.environ["BASHFLEET_SIGNING_KEY"]


def _cli(url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    environ = {**os.environ, "BASHFLEET_REDIS_URL": url, **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "bashfleet.client.cli", *args], env=environ, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running after {timeout}s: {out!r} {err!r}") from None
    return proc.returncode, out, err


def _job(fleet: Fleet, command: str, host: str) -> JobHandle:
    job = fleet.run(command, host=host, mode="background").job
    assert job is not None
    return job


# ------------------------------------------------- 5: job records, events, host records


def test_5_a_forged_job_end_is_never_believed(
    two_hosts: Hosts, fleet: Fleet, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    alpha, _ = two_hosts
    job = _job(fleet, "sleep 3; exit 3", alpha.host)
    # The attack as reported: no key, one HSET, while the job still runs; `wait` asked
    # after it (as well as before: a forged record is neither believed nor taken for
    # another owner's job, which `wait` tells as no job).
    redis_client.hset(names.job_key(job.id), mapping={"state": "ended", "exit_code": "0"})
    waiter = _cli(redis_server.url, "wait", job.id)
    assert job.id not in fleet.job_views([job.id])  # left out while forged, not believed
    status, _, err = _finish(waiter)
    assert status == 3, err
    assert "exited with code 3" in err or "exit code 3" in err, err
    view = fleet.wait(job.id, timeout=30)
    assert (view.state, view.exit_code) == ("ended", 3)


def test_5_forged_events_are_never_heard(
    two_hosts: Hosts, fleet: Fleet, redis_client: redis.Redis
) -> None:
    alpha, _ = two_hosts
    since = last_seq(redis_client)
    job = _job(fleet, "sleep 2; exit 3", alpha.host)
    heard: list[JobEvent] = []
    # From before the job: the listener reads what it missed, forged events included.
    stream = fleet.events(kinds=("ended",), since=since)

    def listen() -> None:
        for event in stream:
            if event.job_id == job.id:
                heard.append(event)
                return

    listener = threading.Thread(target=listen)
    listener.start()
    forged = JobEvent(kind="ended", job_id=job.id, host=alpha.host, at=time.time(),
                      command="sleep 2; exit 3", output_path=job.output_path, exit_code=0)
    body = forged.model_dump_json()
    for text in (body, f"-:-\n{body}", auth.seal("attacker-" + "1" * 24, auth.EVENT,
                                                     job.id, body)):
        entry = redis_client.xadd(names.EVENTS_KEY, {"e": text})
        redis_client.publish(names.EVENTS_CHANNEL, names.event_message(str(entry), text))
    listener.join(30)
    stream.close()
    assert [(event.exit_code, event.kind) for event in heard] == [(3, "ended")]


def test_5_a_forged_host_record_is_left_out(
    two_hosts: Hosts, fleet: Fleet, redis_client: redis.Redis
) -> None:
    alpha, _ = two_hosts
    fake = f"ghost{uuid.uuid4().hex[:6]}"
    # A host that does not exist, alive and ready...
    redis_client.hset(names.host_key(fake), mapping={
        "host": fake, "instance": "t", "concurrency": "64", "exec_ready": "1",
        "ctl_ready": "1", "sandbox": '{"isolation": "strict", "configured": "strict"}',
    })
    redis_client.set(names.alive_key(fake), "t", ex=60)
    redis_client.zadd(names.HOSTS_KEY, {fake: time.time()})
    # ... and a real one's record changed to claim more slots.
    redis_client.hset(names.host_key(alpha.host), "concurrency", "512")
    listed = {info.host: info for info in fleet.hosts()}
    assert fake not in listed
    assert alpha.host not in listed or listed[alpha.host].slots != 512
    # The next heartbeat seals the real record again.
    wait_for(lambda: alpha.host in {i.host for i in fleet.hosts()}, 10, "alpha sealed again")
    assert {i.host: i for i in fleet.hosts()}[alpha.host].slots == alpha.concurrency
    redis_client.delete(names.host_key(fake), names.alive_key(fake))
    redis_client.zrem(names.HOSTS_KEY, fake)


def test_5_ps_and_check_never_show_a_forged_state(
    two_hosts: Hosts, fleet: Fleet, redis_client: redis.Redis
) -> None:
    alpha, _ = two_hosts
    job = _job(fleet, "echo first; sleep 30", alpha.host)
    wait_for(lambda: "first" in fleet.read_output(job.id).text, 30, "the job's output")
    assert "first" in fleet.check(job.id).output
    # Forged: the job ended, and the last check read everything already.
    redis_client.hset(names.job_key(job.id), mapping={
        "state": "ended", "exit_code": "0", "offset": "999999", "stderr_offset": "999999",
    })
    listed = {view.id: view for view in fleet.jobs(host=alpha.host)}
    assert listed[job.id].state == "running"  # the worker publishes it again from its disk
    checked = fleet.check(job.id)
    assert checked.running and "first" in checked.output  # forged offsets read from 0
    assert not fleet.kill(job.id).running


# -------------------------------------------------------- 7: a message names its target


def test_7_a_message_captured_for_one_host_does_not_run_on_another(
    two_hosts: Hosts, fleet: Fleet, redis_client: redis.Redis
) -> None:
    alpha, beta = two_hosts
    # A project both hosts allow: the call's workspace, where it would leave its mark
    # whichever host ran it (and where the test reads it).
    project = alpha.project()
    marker = project / "ran"
    call_id = f"ccap{uuid.uuid4().hex[:10]}"
    call = {"call_id": call_id, "command": f"echo $(hostname) >> {marker}", "owner": fleet.owner,
            "cwd": str(project)}
    # What a client sends to alpha, as captured on the way.
    captured = fleet._identity.signed(Task.EXEC, [call], names.exec_queue(alpha.host))
    first = raw_exec(fleet, alpha.host, captured, call_id)
    assert first.exit_code == 0 and first.host == alpha.host
    ran = marker.read_text()

    def forget() -> None:  # what Redis remembers of it, deleted by the attacker
        nonce = captured[0]["auth"]["nonce"]
        redis_client.delete(names.nonce_key(nonce), names.call_key(call_id),
                            names.reply_key(call_id))

    # Pushed again onto beta's queue, the any queue, either host's control queue (whose
    # consumer knows the exec task too): refused each time, nothing runs.
    for queue in (names.exec_queue(beta.host), names.ANY_EXEC_QUEUE, names.ctl_queue(beta.host),
                  names.ctl_queue(alpha.host)):
        forget()
        again = raw_exec(fleet, beta.host, captured, call_id, queue=queue)
        assert again.error is not None and again.error.kind == "unauthorized", (queue, again)
        assert "meant for another host or queue" in again.error.message, again.error.message
    # And on alpha itself, once Redis forgot it: the host's own disk remembers the nonce.
    forget()
    replayed = raw_exec(fleet, alpha.host, captured, call_id)
    assert replayed.error is not None and "replayed" in replayed.error.message
    assert marker.read_text() == ran


def test_7_a_control_message_for_one_host_is_refused_by_another(
    two_hosts: Hosts, fleet: Fleet,
) -> None:
    alpha, beta = two_hosts
    job = _job(fleet, "sleep 30", alpha.host)
    request = {"id": job.id, "owner": fleet.owner}
    captured = fleet._identity.signed(Task.KILL, [request], names.ctl_queue(alpha.host))
    answer = raw_task(fleet, Task.KILL, captured, names.ctl_queue(beta.host),
                      f"t{uuid.uuid4().hex[:12]}")
    reply = json.loads(answer)
    assert reply["error"]["kind"] == "unauthorized", reply
    assert fleet.check(job.id).running  # alpha's job was not touched
    fleet.kill(job.id)


# ------------------------------------------------ 8: background jobs capped per owner

LIMIT = 3


class CappedWorker(WorkerProcess):
    """A worker whose owners may run LIMIT background jobs at once (fleet-wide)."""

    def env(self) -> dict[str, str]:
        return {**super().env(), "BASHFLEET_LIMIT_JOBS": str(LIMIT)}


@pytest.fixture(scope="module")
def capped(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hosts]:
    base = tmp_path_factory.mktemp("capped")
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    factory = WorkerFactory(redis_server.url, client, base)
    started = [CappedWorker(host, redis_server.url, state_dir=base / host, log_dir=base / "logs")
               for host in ("cap1", "cap2")]
    for worker in started:
        worker.start()
        factory.started.append(worker)
    try:
        for worker in started:
            worker.wait_ready(client)
        yield started[0], started[1]
    finally:
        factory.cleanup()
        client.close()


def test_8_one_owner_cannot_pass_its_job_cap_from_many_clients_and_hosts(
    capped: Hosts, redis_server: RedisServer
) -> None:
    owner = f"tenant:{uuid.uuid4().hex[:8]}"
    clients = [Fleet(redis_server.url, owner=owner) for _ in range(3)]
    results: list[CallResult] = []
    lock = threading.Lock()

    def start(index: int) -> None:
        host = capped[index % 2].host
        result = clients[index % 3].run("sleep 300", host=host, mode="background",
                                        check=False)
        with lock:
            results.append(result)

    # The attack as reported, smaller: many `sleep 300` jobs at once, from several
    # orchestrator processes of one owner, on two hosts.
    threads = [threading.Thread(target=start, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    started = [r.job for r in results if r.job is not None]
    refused = [r.error for r in results if r.error is not None]
    assert len(started) == LIMIT and len(refused) == 10 - LIMIT, results
    for error in refused:
        assert error.kind == "limit"  # a call that did not run: CallNotRun unless check=False
        assert f"BASHFLEET_LIMIT_JOBS={LIMIT}" in error.message and "Retry once" in error.message
    # One ends: the next start is taken.
    clients[0].kill(started[0].id)
    wait_for(lambda: clients[0].run("sleep 300", host=capped[1].host, mode="background",
                                    check=False).job,
             30, "a place given back", interval=0.2)
    with pytest.raises(CallNotRun) as refused_again:  # full again: run() says so
        clients[1].run("sleep 300", host=capped[0].host, mode="background")
    assert refused_again.value.kind == "limit"
    # Another owner is not affected by this one's cap.
    with Fleet(redis_server.url, owner=f"other:{uuid.uuid4().hex[:6]}") as other:
        job = other.run("sleep 300", host=capped[0].host, mode="background").job
        assert job is not None
        other.kill(job.id)
    for fleet in clients:
        for view in fleet.jobs():
            if view.running:
                fleet.kill(view.id)
        fleet.close()


# --------------------------------------------- 9: the worker's secret settings apply


class SecretSettingsWorker(WorkerProcess):
    """A worker given the three settings whose names contain SECRET (and its key in its
    environment, so it execs itself without its secrets, as deployed), and told to pass
    its MYCO_* variables on to calls (`BASHFLEET_ENV_PASS`: nothing of its environment
    reaches a call else), which the deny and allow patterns then sift."""

    secret_file: Path

    def env(self) -> dict[str, str]:
        return {
            **super().env(),
            "BASHFLEET_ENV_PASS": "MYCO_*",
            "BASHFLEET_SECRET_DENY": "MYCO_*",
            "BASHFLEET_SECRET_ALLOW": "MYCO_PUBLIC_KEY",
            "BASHFLEET_SECRET_FILES": str(self.secret_file),
            "MYCO_THING": "deny-me-0123456789",
            "MYCO_PUBLIC_KEY": "keep-me-0123456789",
        }


def test_9_secret_settings_reach_the_worker_and_apply(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path, fleet: Fleet
) -> None:
    worker = SecretSettingsWorker("secret9", redis_server.url, state_dir=tmp_path / "host",
                                  log_dir=tmp_path / "logs")
    # The secret file sits in the project a call runs in (an app's env file in its build
    # directory), readable by the run user: only hiding keeps it from the call.
    project = worker.project()
    secret_file, neighbour = project / "app.env", project / "notes.txt"
    value = "s3cr3t-" + uuid.uuid4().hex
    secret_file.write_text(f"APP_PASSWORD={value}\n")
    neighbour.write_text("visible\n")
    for path in (secret_file, neighbour):
        path.chmod(0o644)
    worker.secret_file = secret_file
    factory = WorkerFactory(redis_server.url, redis_client, tmp_path)
    worker.start()
    factory.started.append(worker)
    try:
        worker.wait_ready(redis_client)
        shown = fleet.run('echo "[$MYCO_THING] [$MYCO_PUBLIC_KEY] [${AWS_X-}]"',
                          host=worker.host).stdout
        # The deny pattern scrubs its variable; the allow pattern keeps one a default
        # pattern (*KEY*) would scrub.
        assert shown == "[] [keep-me-0123456789] []\n", shown
        # The secret file's value never shows: read (hidden, or redacted) or printed.
        printed = fleet.run(f"cat {secret_file} 2>&1; echo {value}", host=worker.host,
                            cwd=str(project))
        assert value not in printed.stdout + printed.stderr
        # The file beside it is there for the call: the secret one was hidden, not missed.
        assert fleet.run(f"cat {neighbour}", host=worker.host, cwd=str(project)).stdout \
            == "visible\n"
    finally:
        factory.cleanup()


# ---------------------------------------------------- no silent fallback to no sandbox


class NoBwrapWorker(WorkerProcess):
    """A worker on a machine where bubblewrap is missing (its executable named wrongly),
    started with extra arguments."""

    extra: tuple[str, ...] = ()

    def args(self) -> list[str]:
        plain = [arg for arg in super().args() if arg != "--local-fallback"]
        return [*plain, *self.extra]

    def env(self) -> dict[str, str]:
        return {**super().env(), "BASHFLEET_BWRAP": "/nonexistent/bwrap"}


def test_a_worker_refuses_to_run_calls_unsandboxed_unless_told(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path, fleet: Fleet
) -> None:
    def worker(host: str, *extra: str) -> NoBwrapWorker:
        made = NoBwrapWorker(host, redis_server.url, state_dir=tmp_path / host,
                             log_dir=tmp_path / "logs")
        made.extra = extra
        return made

    refused = worker("nobwrap1").start()
    assert refused.proc is not None and refused.proc.wait(60) == 2
    assert "WITHOUT a sandbox" in refused.log() and "--isolation none" in refused.log()
    factory = WorkerFactory(redis_server.url, redis_client, tmp_path)
    try:
        for host, extra in (("nobwrap2", ("--isolation", "none")),
                            ("nobwrap3", ("--local-fallback",))):
            started = worker(host, *extra).start()
            factory.started.append(started)
            started.wait_ready(redis_client)
            info = {i.host: i for i in fleet.hosts()}[host]
            assert info.sandbox is not None and info.sandbox.isolation == "none"
            assert fleet.run("echo ran", host=host).stdout == "ran\n"
        # The local fleet's fallback is said loudly, with the reason.
        assert "WITHOUT a sandbox" in factory.started[-1].log()
        assert info.sandbox is not None and "not installed" in (info.sandbox.problem or "")
    finally:
        factory.cleanup()

"""The client API through real workers, once per client: every test here runs against
`Fleet` and against `AsyncFleet` (driven through `clients.Blocking`), so the two behave
the same: routing, typed errors, calls that did not run, sessions and their pinned host,
jobs reached from any client (of either kind), cancels, whole output, job events,
interactive sessions, a worker dying mid-call."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bashfleet.client import (
    CallNotRun,
    CallRejected,
    Fleet,
    FleetUnavailable,
    HostUnavailable,
    OutputTooLarge,
    SessionPinned,
    UnknownCall,
    UnknownJob,
    WorkerLost,
    records,
)
from bashfleet.client._core.routing import CallProgress
from bashfleet.client.redis_server import RedisServer, free_port
from bashfleet.worker.engine import procs
from bashfleet.worker.wire.control import Collect
from bashfleet.worker.wire.models import CallResult, CheckResult, Policy, TailLines

from .clients import KINDS, Kind, make_client
from .conftest import WorkerFactory, WorkerProcess, wait_for

Hosts = tuple[WorkerProcess, WorkerProcess]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> Kind:
    """Which client a test runs against."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def client(kind: Kind, redis_server: RedisServer) -> Iterator[Fleet]:
    """A client of the session's Redis, of the kind under test."""
    fleet = make_client(kind, redis_server.url)
    yield fleet
    fleet.close()


def _other(kind: Kind) -> Kind:
    return "async" if kind == "sync" else "sync"


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


# ---------------------------------------------------------------------------- routing


def test_call_runs_on_the_asked_host(two_hosts: Hosts, client: Fleet) -> None:
    # Output longer than the policy shows is spilled on the host that ran it.
    policy = Policy(truncation=TailLines(max_lines=5))
    for worker in two_hosts:
        result = client.run("seq 1000", host=worker.host, policy=policy)
        assert result.host == worker.host
        assert result.exit_code == 0
        assert result.stdout.splitlines() == [str(n) for n in range(996, 1001)]
        assert result.spill is not None and result.spill.stdout_path is not None
        assert result.spill.host == worker.host
        assert result.spill.stdout_path.startswith(str(worker.state_dir))
        # The full output is read back from the host that holds it.
        chunk = client.read_output(result.call_id, limit=20)
        assert chunk.text.startswith("1\n2\n3\n")
        assert chunk.path == result.spill.stdout_path and not chunk.eof


def test_streams_and_exit_status(two_hosts: Hosts, client: Fleet) -> None:
    result = client.run("echo one; echo two >&2; exit 3", host="alpha")
    assert (result.stdout, result.stderr, result.exit_code) == ("one\n", "two\n", 3)
    assert result.error is None  # a command that failed is not an error


def test_call_without_host_runs_on_a_live_host(two_hosts: Hosts, client: Fleet) -> None:
    result = client.run("echo anywhere")
    assert result.stdout == "anywhere\n"
    # Any live host of the session's Redis (other modules' hosts may share it).
    live = {info.host for info in client.hosts() if info.alive}
    assert {w.host for w in two_hosts} <= live
    assert result.host in live


def test_call_to_a_pool_runs_on_a_labelled_host(two_hosts: Hosts, client: Fleet) -> None:
    assert client.run("true", label="gpu").host == "beta"
    with pytest.raises(HostUnavailable):
        client.run("true", label="tpu")


def test_dead_or_unknown_host_raises_before_sending(two_hosts: Hosts, client: Fleet) -> None:
    started = time.monotonic()
    with pytest.raises(HostUnavailable, match="nosuchhost") as caught:
        client.run("touch /tmp/should-never-exist", host="nosuchhost")
    assert "live hosts" in caught.value.message
    assert time.monotonic() - started < 1.0
    with pytest.raises(CallRejected):
        client.run("true", host="bad host!")


def test_invalid_calls_are_rejected(two_hosts: Hosts, client: Fleet) -> None:
    cases: list[dict[str, Any]] = [
        {"command": ""}, {"command": "a\x00b"}, {"command": "true", "timeout": -1},
        {"command": "true", "mode": "weird"}, {"command": "true", "env": {"A=B": "c"}},
        {"command": "true", "output": "everything"}, {"command": "true", "no_such": 1},
    ]
    for kwargs in cases:
        command = str(kwargs.pop("command"))
        with pytest.raises(CallRejected):
            client.run(command, **kwargs)


def test_unreachable_redis_is_fleet_unavailable(kind: Kind) -> None:
    url = f"redis://:s3cretpass@127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    fleet = make_client(kind, url)
    try:
        with pytest.raises(FleetUnavailable) as info:
            fleet.run("true")
    finally:
        fleet.close()
    assert time.monotonic() - started < 3.0
    assert "s3cretpass" not in str(info.value)
    assert "127.0.0.1" in str(info.value)


def test_hosts_lists_the_fleet(two_hosts: Hosts, client: Fleet) -> None:
    infos = {info.host: info for info in client.hosts()}
    for worker in two_hosts:
        info = infos[worker.host]
        assert info.alive and info.ready and info.slots == 2 and info.pid == worker.pid
        assert info.queued == 0
    assert infos["beta"].labels == ("gpu",)
    assert "bashfleet.any.exec" in client.shared_queues()


def test_worker_settings_are_not_redacted_from_output(two_hosts: Hosts, client: Fleet) -> None:
    # The worker's own BASHFLEET_* settings are scrubbed from commands; plain ones (host
    # id, state directory) must not be treated as secrets and redacted from output.
    alpha = two_hosts[0]
    command = f"echo alpha {alpha.state_dir}; env | cut -d= -f1 | grep ^BASHFLEET_"
    result = client.run(command, host="alpha")
    assert result.stdout == f"alpha {alpha.state_dir}\nBASHFLEET_CALL_MARKER\n"


# ------------------------------------------------------------- calls that did not run


def test_a_call_that_did_not_run_raises(two_hosts: Hosts, client: Fleet) -> None:
    """`run(cwd="/nope")` used to return exit_code None silently."""
    with pytest.raises(CallNotRun) as caught:
        client.run("echo never", host="alpha", cwd="/nope")
    assert caught.value.kind == "bad_cwd"
    assert "did not run" in caught.value.message and "/nope" in caught.value.message
    assert caught.value.result.exit_code is None and caught.value.result.stdout == ""
    # Asked not to raise (the dialects and the MCP server render it as text): the result.
    result = client.run("echo never", host="alpha", cwd="/nope", check=False)
    assert result.error is not None and result.error.kind == "bad_cwd"
    assert result.exit_code is None


# --------------------------------------------------------------------------- sessions


def test_a_session_pins_its_host_and_refuses_another(two_hosts: Hosts, client: Fleet) -> None:
    """`--session s2 --host a` once ran on `a` while s2 was pinned to `b`."""
    session = _new_id("s")
    first = client.run("cd /tmp && export PIN_MARK=kept", session=session, host="beta")
    assert first.host == "beta"
    assert all(client.run("true", session=session).host == "beta" for _ in range(2))
    with pytest.raises(SessionPinned) as caught:
        client.run("touch /tmp/never-on-alpha", session=session, host="alpha")
    assert caught.value.pinned == "beta" and "pinned to host beta" in caught.value.message
    again = client.run('echo "$PWD $PIN_MARK"', session=session, host="beta")
    assert again.stdout == "/tmp kept\n"


def test_a_session_keeps_its_shell_across_clients(
    two_hosts: Hosts, kind: Kind, client: Fleet, redis_server: RedisServer
) -> None:
    """A session call's cd and export hold for the next call, made by a client of the
    other kind: the shell lives in Redis, not in a client."""
    session = _new_id("s")
    first = client.run("cd /tmp && export SESSION_MARK=kept", session=session)
    assert first.exit_code == 0
    with make_client(_other(kind), redis_server.url) as other:
        second = other.run('echo "$PWD $SESSION_MARK"', session=session)
    assert (second.host, second.stdout) == (first.host, "/tmp kept\n")


# ------------------------------------------------------------------------------- jobs


def test_background_job_is_reached_from_another_client(
    two_hosts: Hosts, kind: Kind, client: Fleet, redis_server: RedisServer
) -> None:
    other = make_client(_other(kind), redis_server.url)
    starter = client
    tags = {"suite": _new_id("t")}
    try:
        started = starter.run(
            "for i in 1 2 3; do echo line$i; done; sleep 60", host="beta", mode="background",
            tags=tags,
        )
        assert started.backgrounded and started.job is not None
        job = started.job
        assert job.host == "beta" and job.output_path.startswith(str(two_hosts[1].state_dir))

        def all_lines() -> CheckResult | None:
            checked = other.check(job.id, offset=0)
            return checked if "line3" in checked.output else None

        first = wait_for(all_lines, 10, "the job's output")
        assert first.host == "beta" and first.running
        # "Since the last check" is kept in Redis: shared by every client.
        assert starter.check(job.id).output == ""
        # A call id reaches the job it started; a policy cuts what a check shows.
        cut = other.check(started.call_id, offset=0, truncation=TailLines(max_lines=1))
        assert cut.id == job.id and cut.output == "line3\n"
        assert cut.output_truncation is not None and cut.output_truncation.total_lines == 3
        assert client.read_output(job.id).text.startswith("line1\n")

        listed = {view.id: view for view in starter.jobs(host="beta")}
        assert listed[job.id].state == "running" and listed[job.id].running
        assert job.id in {view.id for view in other.jobs()}
        assert [v.id for v in starter.jobs(tags=tags)] == [job.id]
        assert starter.jobs(tags={"suite": "nobody"}) == []
        assert starter.job_views([job.id, "j-unknown"]).keys() == {job.id}

        killed = other.kill(job.id)
        assert killed.host == "beta" and not killed.running
        assert killed.signal is not None or killed.exit_code is not None
        assert starter.wait(job.id, timeout=30).state == "ended"
        assert {view.id: view for view in starter.jobs("beta")}[job.id].state == "ended"
    finally:
        other.close()


def test_another_owner_cannot_reach_a_job(
    two_hosts: Hosts, kind: Kind, redis_server: RedisServer
) -> None:
    with make_client(kind, redis_server.url, owner="agent:a") as mine, \
            make_client(kind, redis_server.url, owner="agent:b") as theirs:
        started = mine.run("sleep 60", host="alpha", mode="background")
        assert started.job is not None
        job = started.job.id
        try:
            assert job in [view.id for view in mine.jobs()]
            assert job not in [view.id for view in theirs.jobs()]
            with pytest.raises(UnknownJob):
                theirs.kill(job)
            assert mine.check(job).running
        finally:
            mine.kill(job)


def test_wait_times_out_and_the_job_runs_on(two_hosts: Hosts, client: Fleet) -> None:
    started = client.run("sleep 60", host="alpha", mode="background")
    assert started.job is not None
    try:
        before = time.monotonic()
        with pytest.raises(TimeoutError):
            client.wait(started.job.id, timeout=0.5)
        assert time.monotonic() - before < 5
        assert client.check(started.job.id).running
    finally:
        client.kill(started.job.id)


def test_events_hear_a_job_start_and_end_once(
    two_hosts: Hosts, client: Fleet, redis_client: redis.Redis
) -> None:
    tag = {"events": _new_id("e")}
    since = records.last_seq(redis_client)
    started = client.run("sleep 0.5", host="beta", mode="background", tags=tag)
    assert started.job is not None
    heard: list[tuple[str, str]] = []
    for event in client.events(tags=tag, since=since):
        heard.append((event.kind, event.job_id))
        if event.kind == "ended":
            break
    assert heard == [("started", started.job.id), ("ended", started.job.id)]


# ---------------------------------------------------------------------------- cancels


def test_unknown_ids_raise_typed_errors(two_hosts: Hosts, client: Fleet) -> None:
    for call in (
        lambda: client.check("jnosuchjob0000"),
        lambda: client.kill("jnosuchjob0000"),
        lambda: client.read_output("cnosuchcall"),
        lambda: client.check("../../etc/passwd"),
    ):
        with pytest.raises(UnknownJob):
            call()
    # Cancelling or detaching a call that does not exist: a call-level error.
    for call_id in ("cnosuchcall", "../x"):
        for action in (client.cancel, client.detach):
            with pytest.raises(UnknownCall) as caught:
                action(call_id)
        assert not isinstance(caught.value, UnknownJob)


def _run_in_thread(client: Fleet, command: str, call_id: str,
                   host: str = "alpha") -> tuple[threading.Thread, list[CallResult]]:
    results: list[CallResult] = []
    thread = threading.Thread(
        target=lambda: results.append(client.run(command, host=host, call_id=call_id)),
        daemon=True,
    )
    thread.start()
    return thread, results


def _state(redis_client: redis.Redis, call_id: str) -> str | None:
    return records.call_record(redis_client, call_id).get("state")


def test_cancel_a_running_call(two_hosts: Hosts, client: Fleet, redis_client: redis.Redis) -> None:
    call_id = _new_id("c")
    thread, results = _run_in_thread(client, "echo begun; sleep 30", call_id)
    wait_for(lambda: records.call_record(redis_client, call_id).get("pgid"), 10, "the spawn")
    started = time.monotonic()
    assert client.cancel(call_id)
    thread.join(10)
    assert not thread.is_alive()
    [result] = results  # a cancel is no error of `run`'s: the result says it
    assert time.monotonic() - started < 5
    assert result.cancelled and result.signal is not None and result.stdout == "begun\n"
    assert result.error is not None and result.error.kind == "cancelled"
    assert _state(redis_client, call_id) == "cancelled"
    assert not client.cancel(call_id)  # ended already


def test_cancel_as_soon_as_a_call_is_claimed(
    two_hosts: Hosts, client: Fleet, redis_client: redis.Redis
) -> None:
    """Cancelled between its claim and its process showing in Redis (a canceller may
    find no process yet): the worker sees the cancel at its first wake-up and kills."""
    for _ in range(3):
        call_id = _new_id("c")
        thread, results = _run_in_thread(client, "sleep 30", call_id)
        wait_for(functools.partial(lambda c: _state(redis_client, c) == "running", call_id),
                 10, "the claim", interval=0.001)
        started = time.monotonic()
        assert client.cancel(call_id)
        thread.join(10)
        assert not thread.is_alive()
        assert time.monotonic() - started < 5
        error = results[0].error
        assert error is not None and error.kind == "cancelled"
        assert _state(redis_client, call_id) == "cancelled"
        assert not procs.find_call_processes(None, call_id)


def test_a_running_call_goes_on_as_a_job(two_hosts: Hosts, client: Fleet,
                                         redis_client: redis.Redis) -> None:
    call_id = _new_id("c")
    thread, results = _run_in_thread(client, "echo begun; sleep 30", call_id)
    wait_for(lambda: records.call_record(redis_client, call_id).get("pgid"), 10, "the spawn")
    # Detachable once its process is on the host's disk (it has run 50 ms): until then
    # detach says False and changes nothing, so asking again is what a user does.
    wait_for(lambda: client.detach(call_id), 10, "the call to be detachable")
    thread.join(10)
    [result] = results
    assert result.job is not None and result.backgrounded
    client.kill(result.job.id)


def test_call_progress_says_queued_until_a_worker_takes_the_call(
    two_hosts: Hosts, client: Fleet, redis_client: redis.Redis
) -> None:
    """What `bashfleet run`'s spinner shows: `queued on alpha` while the call waits
    behind alpha's two busy slots, `running on alpha` once a worker took it."""
    fillers = [_new_id("c") for _ in range(2)]
    threads = [_run_in_thread(client, "sleep 30", call_id)[0] for call_id in fillers]
    waiting = _new_id("c")
    try:
        wait_for(lambda: all(_state(redis_client, c) == "running" for c in fillers), 10,
                 "both slots to be busy")
        threads.append(_run_in_thread(client, "sleep 30", waiting)[0])
        wait_for(lambda: _state(redis_client, waiting) == "queued", 10, "the send")
        assert client.call_progress(waiting) == CallProgress("queued", "alpha")
        assert not client.call_progress(waiting).started
        client.cancel(fillers[0])
        wait_for(lambda: client.call_progress(waiting).started, 10, "the claim")
        assert client.call_progress(waiting) == CallProgress("running", "alpha")
    finally:
        for call_id in (*fillers, waiting):
            client.cancel(call_id)
        for thread in threads:
            thread.join(10)
    assert client.call_progress("not an id!") == CallProgress(None, None)


def test_call_host_names_the_host_once_a_worker_took_the_call(
    two_hosts: Hosts, client: Fleet, redis_client: redis.Redis
) -> None:
    """What `bashfleet run`'s spinner shows: None for an id no call has (or that cannot
    be one), the host once a worker claimed the call."""
    call_id = _new_id("c")
    assert client.call_host(call_id) is None
    assert client.call_host("not an id!") is None
    thread, _ = _run_in_thread(client, "sleep 30", call_id)
    try:
        wait_for(lambda: _state(redis_client, call_id) == "running", 10, "the claim")
        assert client.call_host(call_id) == "alpha"  # where `_run_in_thread` sends it
    finally:
        client.cancel(call_id)
        thread.join(10)


# ------------------------------------------------------------------------ whole output


def test_the_whole_output_on_request(two_hosts: Hosts, client: Fleet) -> None:
    """The Python API shows the native policy's tail; the whole output on request."""
    tail = client.run("seq 1 5000", host="alpha")
    assert tail.stdout_truncation is not None and tail.stdout_truncation.truncated
    assert tail.stdout.splitlines()[-1] == "5000" and len(tail.stdout.splitlines()) < 5000
    whole = client.run("seq 1 5000; seq 1 3000 >&2", host="alpha", output="full")
    assert whole.stdout.splitlines() == [str(n) for n in range(1, 5001)]
    assert whole.stderr.splitlines() == [str(n) for n in range(1, 3001)]
    assert whole.stdout_truncation is not None and not whole.stdout_truncation.truncated
    small = client.run("echo small", host="alpha", output="full")
    assert small.stdout == "small\n"  # nothing cut: nothing read back
    with pytest.raises(OutputTooLarge) as caught:
        client.run("seq 1 5000", host="alpha", output="full", max_output_bytes=1000)
    assert caught.value.size > 1000 and caught.value.result.stdout.endswith("5000\n")


# ------------------------------------------------------------------- interactive, faults


def test_an_interactive_session(two_hosts: Hosts, client: Fleet) -> None:
    started = client.run("cat", host="beta", mode="background", stdin="pipe")
    assert started.job is not None
    job = started.job.id
    out = client.write_stdin(job, "hello\n", collect=Collect(wait_s=5, settle_s=0.2))
    assert "hello" in out.output
    client.close_stdin(job, collect=Collect(wait_s=5))
    assert client.wait(job, timeout=30).exit_code == 0


def test_a_worker_dying_mid_call_is_worker_lost(
    kind: Kind, workers: WorkerFactory, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    host = f"doomed-{kind}"
    worker = workers.start(host)
    with make_client(kind, redis_server.url) as client:
        call_id = _new_id("c")
        results: list[BaseException] = []

        def call() -> None:
            try:
                client.run("sleep 60", host=host, call_id=call_id)
            except WorkerLost as exc:
                results.append(exc)

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        wait_for(lambda: records.call_record(redis_client, call_id).get("pgid"), 15,
                 "the call to run")
        killed = time.monotonic()
        worker.kill_group()
        thread.join(30)
        assert len(results) == 1 and time.monotonic() - killed < 15
        assert "was not run again" in str(results[0])
    # A worker of the same host, starting, kills what the dead one left running.
    workers.start(host)


def test_the_cli_says_which_host_a_session_is_pinned_to(
    two_hosts: Hosts, client: Fleet, redis_server: RedisServer, tmp_path: Path
) -> None:
    session = _new_id("s")
    client.run("true", session=session, host="beta")
    done = subprocess.run(
        [sys.executable, "-m", "bashfleet.client.cli",
         "run", "--session", session, "--host", "alpha",
         "true"],
        env={**os.environ, "BASHFLEET_REDIS_URL": redis_server.url}, capture_output=True,
        text=True, timeout=60, check=False,
    )
    assert done.returncode == 125, done.stderr
    assert "pinned to host beta" in done.stderr


def test_in_flight_limit_is_kept(kind: Kind, two_hosts: Hosts, redis_server: RedisServer) -> None:
    peak = 0
    done = threading.Event()
    with make_client(kind, redis_server.url, max_in_flight=2) as client:

        def sample() -> None:
            nonlocal peak
            while not done.wait(0.005):
                peak = max(peak, client.in_flight)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        callers = [threading.Thread(target=client.run, args=("sleep 0.3",), daemon=True)
                   for _ in range(6)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(30)
        done.set()
        sampler.join(5)
    assert peak == 2

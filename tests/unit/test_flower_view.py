"""What Flower shows (`bashfleet.worker.fleet.flower`): why a call failed, its final arguments, a
job's outcome, and the job watcher telling a listener of jobs' starts and ends."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import ClassVar

import fakeredis
import pytest

from bashfleet.worker.engine import running
from bashfleet.worker.engine.jobs import jobs
from bashfleet.worker.fleet import flower, recovery
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import (
    Call,
    CallResult,
    JobHandle,
    JobRecord,
    JobStatus,
    Policy,
    SystemError_,
)


def result(**fields: object) -> CallResult:
    return CallResult(call_id="c1", host="h1", **fields)


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [
        (result(exit_code=0), None),
        (result(exit_code=42), "exit 42"),
        (result(signal=15), "signal 15 (SIGTERM)"),
        (result(signal=99), "signal 99"),
        (result(timed_out=True, signal=15), "timeout after 2s"),
        (result(cancelled=True, signal=15,
                error=SystemError_(kind="internal", message="call cancelled")), "cancelled"),
        (result(error=SystemError_(kind="bad_cwd", message="Working directory does not exist")),
         "error bad_cwd: Working directory does not exist"),
        (result(error=SystemError_(kind="internal", message="x" * 500)),
         ("error internal: " + "x" * 500)[:200]),
        (result(), "no exit status"),
        # Going on as a job is not a failure (the job's own end is, if it fails).
        (result(timed_out=True, backgrounded=True,
                job=JobHandle(id="j1", host="h1", pid=1, pgid=1, output_path="/j")), None),
    ],
)
def test_failure_reason(outcome: CallResult, reason: str | None) -> None:
    assert flower.failure_reason(outcome, 2.0) == reason


def test_call_args_show_the_command_with_its_secrets_redacted_never_the_env() -> None:
    """The command was once redacted whole on every page (a person could not tell calls
    apart): it shows, with its credentials redacted; the env never shows."""
    call = Call(call_id="c1", command="curl -H 'Authorization: Bearer t0ken-9f8e7d' x",
                cwd=None, env={"SECRET": "s3cret-value"}, session="agent-1",
                policy=Policy(name="claude"))
    sent = flower.call_args(call, secrets=None)
    ended = flower.call_args(call, result(exit_code=0, cwd="/home/w", job=JobHandle(
        id="j9", host="h1", pid=1, pgid=1, output_path="/j")))
    assert sent == ("{'command': \"curl -H 'Authorization: Bearer [REDACTED]' x\", "
                    "'cwd': None, 'background': False, 'dialect': 'claude', "
                    "'session': 'agent-1'}")
    assert ended.endswith("'cwd': '/home/w', 'background': False, 'dialect': 'claude', "
                          "'session': 'agent-1', 'job': 'j9'}")
    for text in (sent, ended):
        assert "t0ken" not in text and "s3cret" not in text


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("make -j8 test", "make -j8 test"),
        ("echo WARNING; ls /etc/ssl/certs", "echo WARNING; ls /etc/ssl/certs"),
        ("git clone https://bob:hunter22@git.example/r.git",
         "git clone https://bob:[REDACTED]@git.example/r.git"),
        ("mysql --password=pa55word -u root", "mysql --password=[REDACTED] -u root"),
        ("login --token abc123def", "login --token [REDACTED]"),
        ("API_TOKEN=abc123 ./deploy.sh", "API_TOKEN=[REDACTED] ./deploy.sh"),
        ("gh auth login ghp_0123456789abcdefghijABCDEFGHIJ",
         "gh auth login [REDACTED]"),
        ("aws s3 ls # AKIAIOSFODNN7EXAMPLE", "aws s3 ls # [REDACTED]"),
        ("echo env-secret-31337", "echo [REDACTED]"),  # a value the worker knows
        ("echo my-own-s3cret", "echo [REDACTED]"),  # a value of the call's own env
        ("x" * 400, "x" * 300 + "… (+100 chars)"),
    ],
)
def test_shown_command(command: str, shown: str) -> None:
    known = re.compile(re.escape("env-secret-31337"))
    assert flower.shown_command(command, known, ["my-own-s3cret", "true"]) == shown


def test_job_args_show_the_command() -> None:
    record = JobRecord(id="j1", host="h1", pid=7, pgid=7, start_time=0.0, command="npm run dev",
                       cwd="/w", output_path="/o", status_path="/s", marker="m", started_at=1.0,
                       call_id="c1")
    assert flower.job_args(record, secrets=None) == (
        "{'command': 'npm run dev', 'cwd': '/w', 'call': 'c1', 'pid': 7}")


@pytest.mark.parametrize(("role", "name"), [("exec", "calls@h1"), ("ctl", "control@h1"),
                                            ("jobs", "jobs@h1")])
def test_workers_are_named_for_what_they_do(role: str, name: str) -> None:
    assert flower.worker_name(role, "h1") == name


def test_final_args_are_bounded() -> None:
    for n in range(flower.MAX_PENDING_ARGS + 10):
        flower.set_final_args(f"t{n}", f"args {n}")
    assert flower._final_args("t0") is None  # the oldest went
    last = flower.MAX_PENDING_ARGS + 9
    assert flower._final_args(f"t{last}") == f"args {last}"
    assert flower._final_args(f"t{last}") is None  # taken once


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (JobStatus(exit_code=0, ended_at=1.0), None),
        (JobStatus(exit_code=3, ended_at=1.0), "exit 3"),
        (JobStatus(signal=9, ended_at=1.0), "signal 9 (SIGKILL)"),
        (JobStatus(ended_at=1.0, note="worker down"), "ended, status unknown (worker down)"),
        (None, "ended, status unknown"),
    ],
)
def test_job_outcome(status: JobStatus | None, reason: str | None) -> None:
    assert flower.job_outcome(status) == reason


# ------------------------------------------------------------------------ job watcher


class Listener:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def started(self, record: JobRecord) -> None:
        self.events.append(("started", record.id))

    def ended(self, record: JobRecord, status: JobStatus | None) -> None:
        code = status.exit_code if status is not None else None
        self.events.append(("ended", f"{record.id}:{code}"))


def _job(settings: Settings, job_id: str, started_at: float) -> JobRecord:
    settings.jobs_dir.mkdir(parents=True, exist_ok=True)
    record = JobRecord(
        id=job_id, host="h1", pid=2**22 + 7, pgid=2**22 + 7, start_time=started_at,
        marker=job_id, command="sleep 1", cwd="/", output_path=str(settings.jobs_dir / "x.log"),
        status_path=str(settings.jobs_dir / f"{job_id}.status.json"), started_at=started_at,
    )
    jobs.save_record(record, settings)
    return record


def test_the_watcher_tells_of_starts_and_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(state_dir=tmp_path, host="h1")
    listener = Listener()
    watcher = recovery.JobWatcher(settings, fakeredis.FakeRedis(decode_responses=True), listener)
    old = _job(settings, "jold", time.time() - 3600)
    jobs.write_status(old, 0)  # ended before this watcher: not told again
    live = _job(settings, "jlive", time.time())
    alive = {"jlive"}
    monkeypatch.setattr(jobs, "is_running", lambda record: record.id in alive)
    watcher.sync()
    watcher.sync()  # told once
    assert listener.events == [("started", "jlive")]
    alive.clear()
    jobs.write_status(live, 3)
    watcher.sync()
    # A job that started and ended between two passes is told of too.
    quick = _job(settings, "jquick", time.time())
    jobs.write_status(quick, 0)
    watcher.sync()
    assert listener.events == [("started", "jlive"), ("ended", "jlive:3"),
                               ("started", "jquick"), ("ended", "jquick:0")]


def test_detach_flags_live_and_go_with_the_call(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, host="h1")
    assert running.detach_requested(settings, "c1") is False
    running.request_detach(settings, "c1")
    assert running.detach_requested(settings, "c1") is True
    running.remove(settings, "c1")
    assert running.detach_requested(settings, "c1") is False


class Recorder:
    """An EventDispatcher that keeps what it is asked to send."""

    sent: ClassVar[list[tuple[str, str, dict[str, object]]]] = []

    def __init__(self, connection: object, hostname: str, enabled: bool) -> None:
        del connection, enabled
        self.hostname = hostname

    def send(self, type_: str, **fields: object) -> None:
        Recorder.sent.append((self.hostname, type_, fields))

    def close(self) -> None:
        pass


class FakeApp:
    def connection_for_write(self) -> object:
        return object()


def test_running_jobs_are_active_on_the_hosts_jobs_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A running background job was once not counted as Active. The host's
    `jobs@` worker's heartbeats count the jobs running."""
    monkeypatch.setattr(flower, "EventDispatcher", Recorder)
    Recorder.sent = []
    events = flower.JobEvents(FakeApp(), "h1", heartbeat_s=0.01)
    record = JobRecord(id="j1", host="h1", pid=7, pgid=7, start_time=0.0, command="sleep 9",
                       cwd="/w", output_path="/o", status_path="/s", marker="m", started_at=1.0)

    def beats(active: int) -> bool:
        return any(t == "worker-heartbeat" and f["active"] == active for _, t, f in Recorder.sent)

    events.started(record)
    assert events.active == 1
    deadline = time.monotonic() + 10
    while not beats(1):
        assert time.monotonic() < deadline, Recorder.sent
        time.sleep(0.01)  # the heartbeat thread's next beat
    events.ended(record, JobStatus(exit_code=0, ended_at=2.0))
    assert events.active == 0
    while not beats(0):
        assert time.monotonic() < deadline, Recorder.sent
        time.sleep(0.01)
    events.close()
    kinds = [t for _, t, _ in Recorder.sent]
    assert kinds[0] == "worker-online" and kinds[-1] == "worker-offline"
    assert {"task-received", "task-started", "task-succeeded"} <= set(kinds)
    assert {h for h, _, _ in Recorder.sent} == {"jobs@h1"}
    received = next(f for _, t, f in Recorder.sent if t == "task-received")
    assert "'command': 'sleep 9'" in str(received["args"])

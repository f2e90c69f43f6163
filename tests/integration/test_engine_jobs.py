"""Background jobs: auto-backgrounded calls and detached jobs, checked and killed by record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bashfleet.worker import (
    CallResult,
    CheckResult,
    JobError,
    JobRecord,
    Policy,
    check_job,
    kill_job,
    load_record,
    local_records,
)
from bashfleet.worker.engine import isolate, workspaces

from .engine_helpers import (
    Engine,
    _engine_fixture,  # noqa: F401 - fixture
    _janitor_fixture,  # noqa: F401 - fixture
    _plain_engine_fixture,  # noqa: F401 - fixture
    alive,
    create_time,
    host_pid,
    marked_pids,
    stat,
    survivors,
    wait_until,
)

AUTO = Policy(on_timeout="background", kill_grace_s=0.5)

# Waits on gate files so the test decides when each part of the output appears.
GATED = (
    "echo first; echo efirst >&2; "
    "until [ -e gate1 ]; do sleep 0.01; done; echo second; echo esecond >&2; "
    "until [ -e gate2 ]; do sleep 0.01; done; echo third"
)


def _open(gate: Path) -> None:
    gate.touch()


def _record(engine: Engine, result: CallResult) -> JobRecord:
    assert result.job is not None, result
    return load_record(result.job.id, engine.settings)


def _sleeps(marker: str) -> int:
    """How many `sleep` processes carry the marker."""
    return sum(1 for pid in marked_pids(marker) if _comm(pid) == "sleep")


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _with_output(record: JobRecord, engine: Engine) -> CheckResult | None:
    """A check of the job, once it shows some output."""
    check = check_job(record, settings=engine.settings)
    return check if check.output else None


def _finished(record: JobRecord, engine: Engine, **kwargs: object) -> CheckResult:
    """Check until the job is no longer running; return that check."""
    def ended() -> CheckResult | None:
        check = check_job(record, settings=engine.settings, **kwargs)  # type: ignore[arg-type]
        return None if check.running else check
    return wait_until(ended, what=f"job {record.id} to end")


# ------------------------------------------------------------------- auto-background


def test_auto_background_keeps_running_and_checks_give_new_output(engine: Engine) -> None:
    started = time.monotonic()
    result = engine.run(GATED, timeout_s=0.5, policy=AUTO)
    assert time.monotonic() - started < 10

    assert result.timed_out
    assert result.backgrounded
    assert result.exit_code is None and result.signal is None
    assert result.error is None
    assert (result.stdout, result.stderr) == ("first\n", "efirst\n")
    assert result.job is not None
    assert result.processes, "the still-running processes are described"
    # The numbers a call shows are those of its workspace's PID namespace, the job's
    # record keeps the host's too (the engine checks and kills by those).
    assert result.job.pid in [p.pid for p in result.processes]
    assert result.spill is not None, "a backgrounded call keeps its files"
    assert alive(host_pid(result.job))

    record = _record(engine, result)
    assert record.marker == result.call_id
    assert (record.pid, record.pgid) == (host_pid(result.job), host_pid(result.job))
    assert (record.ns_pid, record.ns_pgid) == (result.job.pid, result.job.pgid)
    assert result.job.pgid == result.job.pid
    job_started = create_time(record.pid)
    assert job_started is not None
    assert abs(record.start_time - job_started) < 0.05
    assert [r.id for r in local_records(engine.settings)] == [record.id]

    # Nothing new yet past what the call returned.
    offset, err_offset = result.spill.stdout_bytes, result.spill.stderr_bytes
    check = check_job(record, offset=offset, stderr_offset=err_offset, settings=engine.settings)
    assert check.running
    assert (check.output, check.stderr_output) == ("", "")
    assert (check.offset, check.stderr_offset) == (offset, err_offset)

    _open(engine.tmp / "gate1")

    def second() -> CheckResult | None:
        got = check_job(record, offset=offset, stderr_offset=err_offset, settings=engine.settings)
        return got if got.output and got.stderr_output else None

    check = wait_until(second, what="the second line")
    assert check.running
    assert (check.output, check.stderr_output) == ("second\n", "esecond\n")
    assert check.offset == offset + len("second\n")

    _open(engine.tmp / "gate2")
    final = _finished(record, engine, offset=check.offset, stderr_offset=check.stderr_offset)
    assert (final.exit_code, final.signal, final.note) == (0, None, None)
    assert final.output == "third\n\n\n[background process completed]\n"
    assert survivors(result.call_id, record.pgid) == []


def test_kill_auto_backgrounded_job_ends_all_its_processes(engine: Engine) -> None:
    result = engine.run(
        "sleep 300 & setsid sleep 300 & echo up; sleep 300", timeout_s=0.5, policy=AUTO
    )
    assert result.backgrounded and result.job is not None
    record = _record(engine, result)
    assert len(marked_pids(result.call_id)) == 3

    killed = kill_job(record, grace_s=0.5, settings=engine.settings)
    assert not killed.running
    assert (killed.exit_code, killed.signal) == (None, 15)
    assert killed.output == "up\n\n\n[background process failed: signal: 15 (SIGTERM)]\n"
    assert survivors(result.call_id, record.pgid) == []


# ------------------------------------------------------------------- background mode


def _start_gated_job(engine: Engine) -> CallResult:
    started = time.monotonic()
    result = engine.run(
        "echo hello; until [ -e gate ]; do sleep 0.01; done; echo bye; exit 4",
        background=True,
    )
    assert time.monotonic() - started < 10
    assert result.error is None
    assert result.backgrounded and not result.timed_out
    assert result.exit_code is None
    job = result.job
    assert job is not None
    assert job.pgid == job.pid
    return result


def _runs_until_the_gate_then_exits_4(engine: Engine, record: JobRecord) -> None:
    # The pid reuse guard knows the job's leader by its kernel start time.
    job_started = create_time(record.pid)
    assert job_started is not None
    assert abs(record.start_time - job_started) < 0.05
    first = wait_until(lambda: _with_output(record, engine), what="the first line")
    assert first.running
    assert first.output == "hello\n"
    assert first.offset == len("hello\n")

    _open(engine.tmp / "gate")
    final = _finished(record, engine, offset=first.offset)
    assert (final.exit_code, final.signal, final.note) == (4, None, None)
    assert final.output == "bye\n\n\n[background process failed: exit status: 4]\n"


def test_background_job_runs_detached_and_reports_its_exit(engine: Engine) -> None:
    """In a sandbox a job is a child of its workspace's keeper (pid 1 of the workspace),
    in a session of its own, not ours; the keeper records its end, and the throwaway
    workspace's keeper leaves once the job it outlived its call for has ended."""
    result = _start_gated_job(engine)
    job = result.job
    assert job is not None and job.workspace is not None
    assert job.host_pid is not None and job.host_pid != job.pid

    job_stat = stat(job.host_pid)
    assert job_stat is not None
    assert job_stat.sid == job.host_pid != os.getsid(0)
    workspace = workspaces.load(job.workspace, engine.settings)
    assert workspace.keeper_pid is not None
    assert job_stat.ppid == workspace.keeper_pid
    keeper = stat(workspace.keeper_pid)
    assert keeper is not None
    assert keeper.sid == keeper.pid
    assert keeper.sid not in (os.getsid(0), job.host_pid)
    # The record keeps the number the workspace's calls use beside the host's.
    record = _record(engine, result)
    assert record.ns_pid == job.pid

    _runs_until_the_gate_then_exits_4(engine, record)
    wait_until(lambda: not alive(keeper.pid), what="the throwaway workspace's keeper to exit")


def test_background_job_runs_detached_and_reports_its_exit_unsandboxed(
    plain_engine: Engine,
) -> None:
    """Without a sandbox a job has a supervisor of its own, which records its end: both
    live in a session of their own, not ours, and the supervisor leaves after the end."""
    engine = plain_engine
    result = _start_gated_job(engine)
    job = result.job
    assert job is not None
    assert job.host_pid is None, "no PID namespace: the handle's pid is the host's"

    job_stat = stat(job.pid)
    assert job_stat is not None
    assert job_stat.sid == job.pid != os.getsid(0)
    supervisor = stat(job_stat.ppid)
    assert supervisor is not None
    assert supervisor.sid == supervisor.pid
    assert supervisor.sid not in (os.getsid(0), job.pid)

    _runs_until_the_gate_then_exits_4(engine, _record(engine, result))
    # The supervisor leaves once it has recorded the end.
    wait_until(lambda: not alive(supervisor.pid), what="the supervisor to exit")


def test_background_job_outlives_the_process_that_started_it(engine: Engine) -> None:
    # A separate Python process starts the job and exits, as a worker restart would.
    # Its settings are the engine's (the work directory an allowed workspace); its
    # throwaway workspace outlives it, as the job does.
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from bashfleet.worker import Call, Settings, run_call\n"
        "settings = Settings(state_dir=Path(sys.argv[1]), host='test',\n"
        "                    workspace_root=Path(sys.argv[5]), workspace_allow=(sys.argv[4],))\n"
        "call = Call(call_id=sys.argv[2], command=sys.argv[3], cwd=sys.argv[4], background=True)\n"
        "print(run_call(call, settings=settings).model_dump_json())\n"
    )
    call_id = engine.janitor.new_call_id()
    starter = subprocess.run(
        [sys.executable, "-c", script, str(engine.settings.state_dir), call_id,
         "until [ -e gate ]; do sleep 0.01; done; echo done; exit 7", str(engine.tmp),
         str(engine.settings.workspace_root_dir())],
        capture_output=True, check=True, timeout=60,
    )
    result = CallResult.model_validate_json(starter.stdout)
    assert result.job is not None
    engine.janitor.job(result.job)

    record = load_record(result.job.id, engine.settings)
    assert check_job(record, settings=engine.settings).running
    _open(engine.tmp / "gate")
    final = _finished(record, engine)
    assert (final.exit_code, final.note) == (7, None)
    assert final.output == "done\n\n\n[background process failed: exit status: 7]\n"


def test_kill_background_job(engine: Engine) -> None:
    result = engine.run("echo up; sleep 300 & sleep 300", background=True)
    assert result.job is not None
    record = _record(engine, result)
    wait_until(lambda: _sleeps(record.marker) == 2, what="both sleeps")

    killed = kill_job(record, grace_s=1.0, settings=engine.settings)
    assert not killed.running
    assert (killed.exit_code, killed.signal) == (None, 15)
    assert killed.output == "up\n\n\n[background process failed: signal: 15 (SIGTERM)]\n"
    assert survivors(record.marker, record.pgid) == []
    # Checking again reports the same end.
    again = check_job(record, settings=engine.settings)
    assert (again.running, again.signal, again.exit_code) == (False, 15, None)


def test_check_grep_filters_lines(engine: Engine) -> None:
    result = engine.run("printf 'alpha 1\\nbeta 2\\nalpha 3\\n'", background=True)
    record = _record(engine, result)
    final = _finished(record, engine, grep="^alpha")
    assert final.exit_code == 0
    assert final.output == "alpha 1\nalpha 3\n"
    everything = check_job(record, settings=engine.settings)
    assert everything.output.startswith("alpha 1\nbeta 2\nalpha 3\n")

    with pytest.raises(JobError) as caught:
        check_job(record, grep="(unclosed", settings=engine.settings)
    assert caught.value.kind == "invalid"


def _cmdline(proc: psutil.Process) -> list[str]:
    """A child's command line; none for one that ended (a zombie an earlier test of this
    process left for its reaper) or went."""
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def test_job_that_ends_unwatched_reports_unknown_status(plain_engine: Engine) -> None:
    """Unsandboxed, a job's supervisor records its end: killed (as with its worker), the
    job runs on and ends unwatched, and a check says its status is unknown."""
    engine = plain_engine
    result = engine.run("until [ -e gate ]; do sleep 0.01; done; exit 3", background=True)
    assert result.job is not None
    record = _record(engine, result)
    # Its supervisor: our child.
    supervisors = [
        child.pid for child in psutil.Process().children()
        if isolate.runs(_cmdline(child), "job_supervisor")
    ]
    assert len(supervisors) == 1, supervisors
    supervisor = supervisors[0]

    os.kill(supervisor, signal.SIGKILL)
    wait_until(lambda: not alive(supervisor), what="the supervisor to die")
    assert check_job(record, settings=engine.settings).running

    _open(engine.tmp / "gate")
    wait_until(lambda: not alive(record.pid), what="the job to end")
    check = check_job(record, settings=engine.settings)
    assert not check.running
    assert (check.exit_code, check.signal) == (None, None)
    assert check.note is not None and "unknown" in check.note
    assert not Path(record.output_path).read_text().endswith("]\n"), "no completion line"


def test_job_whose_keeper_dies_reports_unknown_status(engine: Engine) -> None:
    """In a sandbox the workspace's keeper (pid 1 of its PID namespace) records a job's
    end; killed from the host (a crash, the OOM killer), it takes every process of the
    workspace with it: the job is no longer running, and a check says its status is
    unknown, with no completion line (nothing recorded one)."""
    result = engine.run("echo up; until [ -e gate ]; do sleep 0.01; done; exit 3",
                        background=True)
    assert result.job is not None and result.job.workspace is not None
    record = _record(engine, result)
    wait_until(lambda: _with_output(record, engine), what="the job's first line")
    keeper = workspaces.load(result.job.workspace, engine.settings).keeper_pid
    assert keeper is not None and stat(record.pid) is not None
    assert stat(record.pid).ppid == keeper  # type: ignore[union-attr]

    os.kill(keeper, signal.SIGKILL)
    wait_until(lambda: not alive(record.pid), what="the job to end with its keeper")
    check = check_job(record, settings=engine.settings)
    assert not check.running
    assert (check.exit_code, check.signal) == (None, None)
    assert check.note is not None and "unknown" in check.note
    assert Path(record.output_path).read_text() == "up\n", "no completion line"


# ------------------------------------------------------------------ pid reuse guard


def test_pid_reuse_guard(engine: Engine, tmp_path: Path) -> None:
    # A real job's record, pointed at an unrelated live process with a start time that
    # is not that process's: exactly what a reused pid looks like.
    result = engine.run("echo real", background=True)
    real = _finished(_record(engine, result), engine)
    assert real.exit_code == 0

    unrelated = engine.janitor.popen(
        subprocess.Popen(["sleep", "300"], start_new_session=True)
    )
    started = create_time(unrelated.pid)
    assert started is not None
    record = load_record(result.job.id if result.job else "", engine.settings)
    reused = record.model_copy(update={
        "pid": unrelated.pid, "pgid": unrelated.pid, "start_time": started + 100,
        "status_path": str(tmp_path / "reused.status.json"),
    })

    check = check_job(reused, settings=engine.settings)
    assert not check.running
    killed = kill_job(reused, grace_s=0.2, settings=engine.settings)
    assert not killed.running
    assert unrelated.poll() is None and alive(unrelated.pid), "the unrelated process lives"

    # Control: with its true start time the same record does see the process.
    genuine = reused.model_copy(update={
        "start_time": started, "status_path": str(tmp_path / "genuine.status.json"),
    })
    assert check_job(genuine, settings=engine.settings).running
    assert json.loads(Path(reused.status_path).read_text())["exit_code"] is None


@pytest.mark.parametrize("mode", ["auto", "background"])
def test_check_racing_the_end_never_records_a_false_unknown(engine: Engine, mode: str) -> None:
    # Checks in a tight loop hit the moment between the job's death and its watcher's
    # record of it; they must wait for the record instead of calling the status unknown.
    for _ in range(10):
        if mode == "auto":
            result = engine.run("sleep 0.2; exit 5", timeout_s=0.05, policy=AUTO)
        else:
            result = engine.run("sleep 0.05; exit 5", background=True)
        record = _record(engine, result)
        deadline = time.monotonic() + 15
        while (final := check_job(record, settings=engine.settings)).running:
            # No pause: the point is to check as often as possible around the end.
            assert time.monotonic() < deadline, "the job did not end"
        assert (final.exit_code, final.signal, final.note) == (5, None, None)
        assert final.output.endswith("[background process failed: exit status: 5]\n")


def test_kill_after_the_end_keeps_the_real_status(engine: Engine) -> None:
    result = engine.run("echo done; exit 6", background=True)
    record = _record(engine, result)
    ended = _finished(record, engine)
    assert ended.exit_code == 6

    killed = kill_job(record, grace_s=0.2, settings=engine.settings)
    assert (killed.running, killed.exit_code, killed.signal, killed.note) == (
        False, 6, None, None,
    )
    assert killed.output == "done\n\n\n[background process failed: exit status: 6]\n"


def test_ended_job_names_the_processes_it_left_running(plain_engine: Engine) -> None:
    # The job's bash exits at once, leaving a sleep behind: the job has ended, the note
    # says what still runs, and kill ends it. Unsandboxed: in a sandbox, what a job
    # leaves behind dies with it (test_engine_sandbox).
    engine = plain_engine
    result = engine.run("sleep 300 & echo left", background=True)
    record = _record(engine, result)
    final = _finished(record, engine)
    assert (final.running, final.exit_code) == (False, 0)

    def noted() -> str | None:
        # A scan can miss a process in the middle of its exec (its environ reads empty
        # for that instant): the next check names it.
        note = check_job(record, settings=engine.settings).note
        return note if note and "still running" in note else None

    note = wait_until(noted, what="the note naming the process left running")
    assert "1 process(es) the job started are still running" in note
    kill_job(record, grace_s=0.5, settings=engine.settings)
    assert survivors(record.marker) == []
    after = check_job(record, settings=engine.settings)
    assert after.note is None or "still running" not in after.note


def test_background_job_is_ended_at_its_policy_timeout(engine: Engine) -> None:
    # The modes dialect gives background jobs 24 hours; the supervisor enforces the
    # policy's limit even when no worker is watching, and the foreground maximum does
    # not apply.
    policy = Policy(background_timeout_s=0.5, kill_grace_s=0.2, max_timeout_s=1.0)
    result = engine.run("echo up; sleep 300", background=True, policy=policy, timeout_s=30.0)
    assert result.error is None, result.error
    record = _record(engine, result)
    final = _finished(record, engine)
    assert (final.exit_code, final.signal) == (None, 15)
    assert final.output.endswith("[background process failed: signal: 15 (SIGTERM)]\n")
    assert survivors(record.marker, record.pgid) == []
